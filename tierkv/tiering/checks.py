"""The settings an engine hook is given, checked like tierkv.toml: every hook refuses bad values alike.

:class:`SessionSettings` is the schema of the transformers hook's ``TieredSession(...)`` keyword
arguments: each default and bound is written once, here, and :meth:`SessionSettings.from_options` checks
them with :func:`tierkv.config.settings_from_dict` (errors read ``TieredSession: key: problem``).
:func:`one_of` and :func:`at_least` check single values with the same wording.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from tierkv.codec import CODECS
from tierkv.config import ByteSize, check_value, setting, settings_from_dict

N = TypeVar("N", int, float)


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    """What ``TieredSession`` takes besides the model and the storage.

    ``codec`` encodes KV blocks (recurrent states are always raw); ``hot_bytes`` bounds the in-process
    tier; ``state_stride_blocks`` sets how often a hybrid model's recurrent state is snapshotted during
    prefill; ``max_inflight_stores`` bounds background store work; ``put_batch_bytes`` bounds one put;
    ``min_text_fraction`` is the shortest text match (as a fraction of the prompt) worth restoring;
    ``model_id`` (``None``: a fingerprint of the weights) and ``tenant`` go into the namespace;
    ``prefetch_bytes`` (0: off) is the buffer for blocks prefetched after a restore (:mod:`.prefetch`);
    ``decode_behind`` decodes a restore's blocks while the rest still arrive: on by default here, as
    the transformers hook's restores ran 2x sooner with it on an H200 (4k-32k tokens of Llama-3-8B over
    loopback) and 1.3-2.9x on a 2-core CPU (docs/performance/gpu.md, the performance log).
    """

    codec: str = setting("raw", choices=CODECS)
    block_size: int = setting(16, minimum=1)
    hot_bytes: ByteSize = setting(ByteSize(1 << 30), minimum=0)
    state_stride_blocks: int = setting(8, minimum=1)
    max_inflight_stores: int = setting(4, minimum=1)
    put_batch_bytes: ByteSize = setting(ByteSize(16 << 20), minimum=1)
    min_text_fraction: float = setting(0.8, positive=True, maximum=1.0)
    model_id: str | None = None
    tenant: str = ""
    prefetch_bytes: ByteSize = setting(ByteSize(0), minimum=0)
    decode_behind: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, Any], source: str = "TieredSession") -> SessionSettings:
        """The settings for these keyword arguments (defaults for the rest); ConfigError if one is bad."""
        return settings_from_dict(cls, options, source)


def one_of(source: str, key: str, value: str, choices: Iterable[str]) -> str:
    """``value`` if it is one of ``choices``."""
    return check_value(source, key, value, choices=choices)


def at_least(source: str, key: str, value: N, minimum: N) -> N:
    """``value`` if it is ``minimum`` or more."""
    return check_value(source, key, value, minimum=minimum)


__all__ = ["SessionSettings", "at_least", "one_of"]
