"""Store.namespaces and Store.inspect on real LMDB: the listing adds up to an independent model however the
index is sliced into read transactions, stops at its limit, and inspection reports damage."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierkv.retention import BlockMeta
from tierkv.vault import store as store_module
from tierkv.vault.store import Lookup, Store

TENANTS = {"alpha": 0, "beta": 0}
entries = st.lists(
    st.tuples(
        st.sampled_from(["default", "alpha", "beta"]),
        st.binary(min_size=0, max_size=3),
        st.binary(min_size=1, max_size=4),
        st.integers(min_value=0, max_value=300),
        st.booleans(),
    ),
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(rows=entries, slice_size=st.integers(min_value=1, max_value=7))
def test_the_listing_adds_up_to_a_model(
    rows: list[tuple[str, bytes, bytes, int, bool]], slice_size: int
) -> None:
    model: dict[tuple[str, bytes], dict[bytes, tuple[int, bool]]] = {}
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_module, "SCAN_SLICE", slice_size)
        with Store(Path(tmp) / "s", 64 << 20, sync_mode="fast", tenants=TENANTS) as s:
            for tenant, ns, key, size, protected in rows:
                meta = BlockMeta("axioms", protected=True) if protected else None
                s.put_many(ns, [(key, b"v" * size, 0)], tenant=tenant, metas=[meta])
                model.setdefault((tenant, ns), {})[key] = (len(ns) + len(key) + size, protected)
            listed, truncated = s.namespaces()
            assert not truncated
            got = {(n.tenant, n.namespace): (n.keys, n.used_bytes, n.protected_bytes) for n in listed}
            want = {
                k: (len(v), sum(c for c, _ in v.values()), sum(c for c, p in v.values() if p))
                for k, v in model.items()
            }
            assert got == want
            assert len(listed) == len(got)  # each namespace once, however the slices fell
            for n in listed:
                assert n.sample_key == min(model[(n.tenant, n.namespace)])
            only = Counter(n.tenant for n in s.namespaces("beta")[0])
            assert set(only) <= {"beta"} and only["beta"] == sum(1 for t, _ in model if t == "beta")
            if len(model) > 1:
                some, truncated = s.namespaces(limit=len(model) - 1)
                assert truncated and some == listed[: len(model) - 1]


def test_inspect_reports_a_damaged_blob_as_corrupt_and_leaves_it(tmp_path: Path) -> None:
    with Store(tmp_path / "s", 64 << 20) as s:
        s.put_many(b"ns", [(b"k", b"original bytes", 0)], metas=[BlockMeta("tools")])
        s.debug.overwrite_blob(b"ns", b"k", b"tampered bytes")
        report = s.inspect(b"ns", b"k")
        assert report.status is Lookup.CORRUPT and report.meta is not None and report.meta.source == "tools"
        assert s.inspect(b"ns", b"k").status is Lookup.CORRUPT  # inspection dropped nothing
        assert s.inspect(b"ns", b"other").status is Lookup.MISSING
