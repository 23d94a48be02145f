"""Retention metadata through the client: Cluster.put(meta=...) sends each key's metadata to every owner
of that key (and nothing for keys it does not name), in batches of any size."""

from __future__ import annotations

from tests.conftest import VaultFactory
from tierkv.client._rpc import ClientOptions, put_batches
from tierkv.client.cluster import Cluster
from tierkv.client.vault import VaultClient
from tierkv.retention import BlockMeta


def test_put_batches_attach_metadata_by_key() -> None:
    meta = {b"b": BlockMeta("tools", 0.7)}
    batches = list(
        put_batches({b"a": b"x" * 10, b"b": b"y" * 10}, ClientOptions(max_batch_bytes=10), 3, meta)
    )
    assert [[(blob.key, blob.meta, blob.priority) for blob in b] for b in batches] == [
        [(b"a", None, 3)],
        [(b"b", meta[b"b"], 3)],
    ]


def test_cluster_put_tags_every_replica(vault_factory: VaultFactory) -> None:
    vaults = [vault_factory(f"v{i}") for i in range(3)]
    keys = [b"key%d" % i for i in range(30)]
    meta = {k: BlockMeta("rules", 0.9, protected=True) for k in keys[:20]}
    # the put waits for every replica (no hedge cut-off): a copy still out would be missing below
    cluster = Cluster({"kv_cold": [v.address for v in vaults]}, replication=2, timeout=10, hedge_after_s=10)
    with cluster:
        assert cluster.put(b"ns", {k: b"v" * 100 for k in keys}, meta=meta).stored == 30
        assert cluster.get(b"ns", keys) == [b"v" * 100] * 30
    per_class: dict[str, int] = {}
    for v in vaults:
        with VaultClient(v.address) as c:
            for cl in c.stats().classes:
                per_class[cl.source] = per_class.get(cl.source, 0) + cl.keys
    assert per_class == {"rules": 40, "": 20}  # two copies of each key, tagged where asked


def test_status_shows_each_class_with_its_five_minute_hit_rate(vault_factory: VaultFactory) -> None:
    from rich.console import Console

    from tierkv.config import Config
    from tierkv.roles import Role
    from tierkv.status import probe, status_table

    v = vault_factory()
    with VaultClient(v.address) as c:
        c.put(b"ns", {b"a": b"x" * 2048, b"b": b"y"}, meta={b"a": BlockMeta("axioms", 1.0, protected=True)})
        c.get(b"ns", [b"a", b"a", b"a", b"b"])
    node = probe(Role.KV_COLD, v.address, Config(), 5.0, None)
    by_source = {cl["source"]: cl for cl in node.classes}
    assert by_source["axioms"]["hit_rate_5m"] == 1.0 and node.protected_bytes == 2051
    console = Console(width=200, record=True)
    console.print(status_table([node], "t"))
    text = console.export_text()
    assert "default/axioms" in text and "100.0% (5m)" in text and "protected" in text
    assert "default/(untagged)" in text
