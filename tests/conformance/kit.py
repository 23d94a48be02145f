"""The hook conformance kit: what every engine hook must do with the cold tier, said once.

A hook takes part through a :class:`HookCase`: how to open it over a storage, run one request, and what
the engine computes without any tier. The kit (``test_kit.py``) runs every case on every backend — the
in-process :class:`~tierkv.tiering.MemoryStorage` and a real vault process over loopback — and checks:

- a cold restore gives exactly the reference output, restoring every full block but the last token's;
- a corrupt block is a miss: the output is still exact, the blocks before it are restored, it is deleted;
- a vault that is down is a miss: the output is exact, nothing restored, the request not failed;
- a partial prefix restores the shared blocks only;
- the request's layout tags arrive at the vault with the blocks;
- (hooks whose lookup and load are separate steps) blocks a lookup reported survive a flood of writes
  until they are loaded: the lookup leased them.

A new hook adds one :class:`HookCase` in ``test_kit.py``, or a module of its own here when its engine
needs its own environment (``suite.py``); docs/adding-a-hook.md says how.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from typing import Any

from tests.conftest import VaultFactory
from tierkv.client.cluster import Cluster
from tierkv.client.vault import VaultClient
from tierkv.tiering import Faults, MemoryStorage, Storage
from tierkv.vault.launcher import VaultProcess

LAYOUT_SOURCE = "axioms"


class Driver(abc.ABC):
    """One hook over one storage, as its engine would drive it; ``namespace`` is where its KV goes."""

    namespace: bytes

    @abc.abstractmethod
    def run(self, tokens: Sequence[int], layout: list[dict[str, Any]] | None = None) -> Any:
        """Serve one request (restoring what the tier holds) and store its blocks; the engine's output."""

    @abc.abstractmethod
    def restored_tokens(self) -> int:
        """Tokens the last run took from the cold tier (verified)."""

    @abc.abstractmethod
    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        """The KV block keys of ``tokens`` (full blocks)."""

    def lookup(self, tokens: Sequence[int]) -> int:
        """Blocks a lookup reports (and leases); only for hooks with ``splits_lookup``."""
        raise NotImplementedError

    def finish(self, tokens: Sequence[int], blocks: int) -> Any:
        """Load ``blocks`` looked-up blocks and compute the rest; only for hooks with ``splits_lookup``."""
        raise NotImplementedError

    @abc.abstractmethod
    def close(self) -> None:
        """Stores are acknowledged (or given up) once this returns."""


class HookCase(abc.ABC):
    name: str
    block_tokens: int
    splits_lookup = False
    without_layout: str | None = None
    """Why the hook never gets a request's layout from its engine, if it does not (the check is skipped)."""

    @abc.abstractmethod
    def open(self, storage: Storage) -> Driver: ...

    @abc.abstractmethod
    def reference(self, tokens: Sequence[int]) -> Any:
        """What the engine computes for ``tokens`` with no tier at all."""

    def same(self, a: Any, b: Any) -> bool:
        return bool(a == b)

    def prompt(self, n: int, seed: int = 0) -> list[int]:
        digest = hashlib.sha256(f"{self.name}-{seed}".encode()).digest() * (n // 32 + 1)
        return [b % 100 + 1 for b in digest[:n]]


class Backend(abc.ABC):
    """Where the blocks go: one storage for the test, and what the test may do to it."""

    name: str
    storage: Storage

    @abc.abstractmethod
    def corrupt(self, namespace: bytes, key: bytes) -> None:
        """Replace a stored block's bytes with garbage of the same length."""

    @abc.abstractmethod
    def take_down(self) -> None: ...

    @abc.abstractmethod
    def source_of(self, namespace: bytes, key: bytes) -> str | None:
        """The source class the block was stored with; None if it is not stored."""

    @abc.abstractmethod
    def flood(self, nbytes: int) -> None:
        """Store ``nbytes`` of unrelated blocks, more than the backend holds."""

    def close(self) -> None:
        self.storage.close()


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self, capacity: int | None = None) -> None:
        self.memory = MemoryStorage(faults=Faults(capacity=capacity))
        self.storage = self.memory

    def corrupt(self, namespace: bytes, key: bytes) -> None:
        space = self.memory.blobs[("kv_cold", namespace)]
        space[key] = bytes(len(space[key]))

    def take_down(self) -> None:
        self.memory.faults.down = True

    def source_of(self, namespace: bytes, key: bytes) -> str | None:
        if key not in self.memory.blobs[("kv_cold", namespace)]:
            return None
        meta = self.memory.meta[("kv_cold", namespace)].get(key)
        return "" if meta is None else meta.source

    def flood(self, nbytes: int) -> None:
        for i in range(nbytes // 4096 + 1):
            self.memory.put(b"flood" * 4, {b"%d" % i: bytes(4096)})


class VaultBackend(Backend):
    name = "vault"

    def __init__(self, factory: VaultFactory, max_bytes: str = "64MiB") -> None:
        self.vault: VaultProcess = factory(max_bytes=max_bytes)
        self.cluster = Cluster({"kv_cold": [self.vault.address]}, timeout=2.0)
        self.storage = self.cluster

    def corrupt(self, namespace: bytes, key: bytes) -> None:
        (blob,) = self.cluster.get_buffers(namespace, [key])
        assert blob is not None
        assert self.cluster.put(namespace, {key: bytes(len(blob))}).stored == 1

    def take_down(self) -> None:
        self.vault.stop(timeout=10)

    def source_of(self, namespace: bytes, key: bytes) -> str | None:
        with VaultClient(self.vault.address) as client:
            info = client.inspect(namespace, key)
        return None if info.status.value != "found" else info.source

    def flood(self, nbytes: int) -> None:
        chunk = 256 * 1024
        for i in range(nbytes // chunk + 1):
            self.cluster.put(b"flood" * 4, {b"%d" % i: bytes(chunk)})
