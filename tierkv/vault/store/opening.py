"""What a store reads once when it opens: its totals and clock, the policy it was ranked by, and the
retention figures its index records carry."""

from __future__ import annotations

import contextlib
import logging

from tierkv.vault.policy import EvictionPolicy
from tierkv.vault.store.env import StoreEnv
from tierkv.vault.store.evictor import Ranking
from tierkv.vault.store.format import INDEX_SIZE, POLICY_KEY, IndexRecord
from tierkv.vault.store.ledger import Ledger, load_totals
from tierkv.vault.store.tenants import Tenants

log = logging.getLogger("tierkv.vault.store")


def load_meta(env: StoreEnv, tenants: Tenants, ranking: Ranking, policy: EvictionPolicy) -> int:
    """Read the totals and return the clock; re-rank every tenant if the policy changed since the last open
    (an order index is one policy's ranks)."""
    with env.env.begin(write=True) as txn:
        clock = load_totals(txn, env.meta, tenants, str(env.path))
        raw = txn.get(POLICY_KEY, db=env.meta)
        stored_policy = None if raw is None else raw.decode(errors="replace")  # damaged: re-ranked
        if stored_policy is not None and stored_policy != policy.name:
            log.info("eviction policy changed from %s to %s: re-ranking", stored_policy, policy.name)
            for t in tenants:
                ranking.rerank(txn, t)
        txn.put(POLICY_KEY, policy.name.encode(), db=env.meta)
    return clock


def count_retention(env: StoreEnv, tenants: Tenants, ledger: Ledger) -> None:
    """Protected and per-class bytes of every tenant into ``ledger``, from what each index record's tail
    says (they are not stored as totals: the records are the one source)."""
    with env.env.begin(buffers=True) as txn:
        for t in tenants:
            with txn.cursor(db=t.index) as cur:
                for raw in cur.iternext(keys=False, values=True):
                    if len(raw) <= INDEX_SIZE:
                        continue
                    with contextlib.suppress(ValueError):
                        ledger.count_retention(t.name, IndexRecord.unpack(raw))
