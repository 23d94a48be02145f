"""The connector's settings: ``kv_connector_extra_config`` on top of tierkv.toml.

``config_path`` names a tierkv.toml (vault addresses, timeout, auth, TLS); without it the usual search
order of :func:`tierkv.config.load_config` applies. Inline keys override the file, so a TOML file is
optional::

    "kv_connector_extra_config": {"kv_cold": "127.0.0.1:50051", "ssm_cold": "127.0.0.1:50052",
                                  "codec": "raw", "namespace": "tenant-a"}

The keys, their defaults and bounds are the fields of :class:`ConnectorSettings`, checked by the same
validator as tierkv.toml (:func:`tierkv.config.settings_from_dict`), so a bad value reads
``kv_connector_extra_config: key: problem``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from tierkv.config import setting
from tierkv.connectors.vault_settings import VaultSettings
from tierkv.connectors.vllm.legacy import migrate_extra

SOURCE = "kv_connector_extra_config"
HashMode = Literal["auto", "engine", "tierkv"]
LoadMode = Literal["async", "sync"]
LoadFailure = Literal["recompute", "engine"]
StoreMode = Literal["finish", "eviction"]


@dataclasses.dataclass(frozen=True)
class ConnectorSettings(VaultSettings):
    """Everything the connector reads from its extra config, validated once at start-up: the vaults,
    codec and identity every engine plugin has (:class:`~tierkv.connectors.vault_settings.VaultSettings`),
    then vLLM's own keys.

    ``kv_cold``, ``ssm_cold`` and ``timeout`` come from tierkv.toml unless given inline; ``config`` is
    that file (token from ``[auth]``, TLS from ``[tls]``). ``gpu_protect_fraction`` caps the GPU blocks
    held for protected prefixes (0 = off) and ``gpu_protect_watermark`` is the fraction of free blocks
    below which they are released (:mod:`tierkv.connectors.vllm.protect`). ``load_failure``:
    ``recompute`` (default) makes a block that fails to load from the vaults a cache miss whatever
    vLLM's ``kv_load_failure_policy`` says (see :func:`load_failure_policy`); ``engine`` leaves vLLM's.
    ``store``: ``finish`` ships every finished request's full blocks; ``eviction`` ships cached blocks
    within ``evict_lookahead`` blocks of the GPU free queue's eviction end (0: twice the blocks one
    step computes, ``max_num_batched_tokens`` / block size, as vLLM's lazy offload, plus the blocks of
    one restored ``max_model_len`` prompt, which a single step allocates at once), remembering up to
    ``evict_remember`` block keys (:mod:`tierkv.connectors.vllm.eviction`). ``lookup_lease_ms``: a
    lookup asks the vaults to keep the blocks it found this long, or until they are loaded (0 = off;
    the vault caps it at 10 s), so that a block reported is still there when the load asks for it.
    ``lookup_wait_ms``: how long one scheduler step may wait, in all, for new requests' lookups, so a
    lookup the vaults answer quickly is used in the step that asked (0: never wait; every lookup then
    costs at least one more engine step). ``lookup_on_arrival``: look a request's prompt up as it
    arrives, before vLLM schedules it, so a request that waited in the queue finds its answer ready (one
    vault lookup per arriving request, also for prompts vLLM's own cache holds; models without recurrent
    state only).
    """

    hash: HashMode = "auto"
    load_mode: LoadMode = "async"
    max_inflight_stores: int = setting(2, minimum=1)
    max_queued_stores: int = setting(64, minimum=0)
    max_state_probes: int = setting(4, minimum=1)
    load_threads: int = setting(2, minimum=1)
    lookup_threads: int = setting(2, minimum=1)
    kv_events: bool = False
    max_queued_events: int = setting(10000, minimum=1)
    gpu_protect_fraction: float = setting(0.1, minimum=0.0, maximum=0.5)
    gpu_protect_watermark: float = setting(0.1, minimum=0.0, maximum=0.5)
    load_failure: LoadFailure = "recompute"
    store: StoreMode = "finish"
    evict_lookahead: int = setting(0, minimum=0)
    evict_remember: int = setting(1 << 16, minimum=1)
    lookup_wait_ms: float = setting(10.0, minimum=0.0, maximum=1000.0)
    lookup_on_arrival: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], source: str = SOURCE) -> ConnectorSettings:
        """``extra`` with tierkv 0.1's keys mapped to today's, then read as any engine plugin's."""
        return super().from_extra(migrate_extra(extra, source), source)


def load_failure_policy(load_failure: LoadFailure, configured: str) -> str:
    """The ``kv_load_failure_policy`` the scheduler should run with.

    vLLM's default, ``fail``, ends a request with an error when one of its blocks does not arrive. For a
    cold tier that is the wrong contract: a vault that evicted, lost or corrupted a block between lookup
    and load has a cache miss, not an error, and the block can be computed again. vLLM 0.32 offers no
    per-connector say in this except the policy itself, which the scheduler reads from the shared
    ``KVTransferConfig`` right after it builds the connector, so the scheduler-side connector sets it
    to ``recompute`` there (logged), unless ``load_failure = "engine"`` keeps the user's choice.
    """
    return "recompute" if load_failure == "recompute" else configured


KNOWN_KEYS = frozenset(
    f.name for f in dataclasses.fields(ConnectorSettings) if not f.metadata.get("internal")
)

__all__ = [
    "KNOWN_KEYS",
    "SOURCE",
    "ConnectorSettings",
    "HashMode",
    "LoadFailure",
    "LoadMode",
    "StoreMode",
    "load_failure_policy",
]
