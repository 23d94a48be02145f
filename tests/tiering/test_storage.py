"""The storage seam: the in-memory storage, the lazily opened one, and open_cluster against a real vault."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tierkv.config import Config, load_config
from tierkv.roles import Role
from tierkv.tiering.memory import MemoryStorage
from tierkv.tiering.storage import LazyStorage, Storage, open_cluster
from tierkv.vault.launcher import VaultProcess

NAMESPACE = hashlib.sha256(b"lazy-cluster").digest()
KEYS = [hashlib.sha256(b"block-%d" % i).digest() for i in range(3)]


def test_memory_storage_keeps_roles_and_namespaces_apart() -> None:
    s = MemoryStorage()
    assert s.put(NAMESPACE, {KEYS[0]: b"a", KEYS[1]: b"b"}, role=Role.KV_COLD).stored == 2
    assert s.put(NAMESPACE, {KEYS[0]: b"state"}, role="ssm_cold").stored == 1
    assert s.get_buffers(NAMESPACE, KEYS, role="kv_cold") == [b"a", b"b", None]
    assert s.get_buffers(NAMESPACE, KEYS[:1], role=Role.SSM_COLD) == [b"state"]
    assert s.get_buffers(b"other", KEYS[:1]) == [None]
    assert s.prefix_lookup(NAMESPACE, KEYS) == 2
    assert s.prefix_lookup(NAMESPACE, KEYS[1:]) == 1
    assert s.delete(NAMESPACE, KEYS) == 2
    assert s.prefix_lookup(NAMESPACE, KEYS) == 0
    assert s.get_buffers(NAMESPACE, KEYS[:1], role="ssm_cold") == [b"state"]
    assert dict(s.calls) == {"put": 2, "get": 4, "lookup": 3, "delete": 1}


def test_open_cluster_reads_the_config_and_is_a_storage(vault: VaultProcess, tmp_path: Path) -> None:
    path = tmp_path / "tierkv.toml"
    host, port = vault.address.rsplit(":", 1)
    path.write_text(f'[cluster]\ntimeout = 3.0\n[cluster.kv_cold]\nhost = "{host}"\nport = {port}\n')
    storage: Storage = open_cluster(load_config(path), timeout=1.5)
    try:
        assert getattr(storage, "timeout", None) == 1.5, "overrides replace the file's options"
        assert storage.put(NAMESPACE, {KEYS[0]: b"x"}, role=Role.KV_COLD).stored == 1
        assert storage.prefix_lookup(NAMESPACE, KEYS, role=Role.KV_COLD) == 1
        assert storage.delete(NAMESPACE, KEYS[:1], role=Role.KV_COLD) == 1
    finally:
        storage.close()


def test_concurrent_first_uses_share_one_storage_and_close_reopens(vault: VaultProcess) -> None:
    made: list[Storage] = []

    def factory() -> Storage:
        roles = {"kv_cold": [vault.address]}
        storage = open_cluster(Config(), roles=roles, timeout=2.0)
        made.append(storage)
        return storage

    lazy = LazyStorage(factory)
    assert made == [], "nothing is opened before the first use"
    start = threading.Barrier(8)

    def first_use(_: int) -> Storage:
        start.wait()
        return lazy.get()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(first_use, range(8)))
    assert len(made) == 1 and all(c is made[0] for c in got)
    assert lazy.put(NAMESPACE, {KEYS[0]: b"payload"}).stored == 1

    lazy.close()
    lazy.close()  # a second close is a no-op
    assert lazy.prefix_lookup(NAMESPACE, KEYS) == 1, "a call after close reopens"
    assert len(made) == 2 and lazy.get() is made[1]
    got_back = lazy.get_buffers(NAMESPACE, KEYS[:1])
    assert [bytes(b) for b in got_back if b is not None] == [b"payload"]
    assert lazy.delete(NAMESPACE, KEYS[:1]) == 1
    lazy.close()
