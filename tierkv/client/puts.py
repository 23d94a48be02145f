"""One put over the vaults that own its keys, tallied as their replies come in (:meth:`Cluster.put`),
and what its outcome tells operators.

A key counts as stored once one owner's reply says so; a refusal is kept with its vault; an owner that
failed, answered what does not add up or had not answered when the put returned adds no copy, so a stored
key with fewer copies than owners is *lagging*. Every outcome is counted in the cluster's metrics; refused,
failed and lagging ones are also logged, at most once per interval (:class:`PutReport`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

from tierkv.client._rpc import Metas, put_batches
from tierkv.client.member import REFUSALS, Partial
from tierkv.client.metrics import ClusterMetrics
from tierkv.client.types import PutAck
from tierkv.client.vault import VaultClient
from tierkv.errors import VaultError
from tierkv.logs import Throttle
from tierkv.records import REFUSED, PutResult, Rejection
from tierkv.wire.framing import Buffer

log = logging.getLogger("tierkv.client.cluster")
"""The cluster's logger: its put warnings are the cluster's, whichever module words them."""

PUT_LOG_INTERVAL_S = 10.0
"""Refused, failed and lagging puts are logged at most once per this many seconds (and counted always)."""


class PutTally:
    """One put in progress: each key's owners, the copies acknowledged and the owners that answered."""

    def __init__(self, keys: list[bytes], owners: list[list[int]]) -> None:
        self.keys = keys
        self.owners = owners
        self.copies = [0] * len(keys)
        self.answered = [0] * len(keys)
        self.refusals: list[tuple[int, int, str]] = []
        self.per_vault: dict[int, list[int]] = defaultdict(list)
        for i, mine in enumerate(owners):
            for v in mine:
                self.per_vault[v].append(i)
        self.took: dict[int, list[int]] = {}
        """The key positions each vault's replies answered (stored or refused)."""

    def take(self, vault: int, ack: PutAck | None) -> None:
        """A vault's answer (None: none) for its share of the keys: the vault is done with every one of
        them, whether its replies said stored, refused or nothing."""
        positions = self.per_vault[vault]
        for i in positions:
            self.answered[i] += 1
        if ack is None:
            return
        for j in ack.stored:
            self.copies[positions[j]] += 1
        for j, why in zip(ack.rejected, ack.reasons or [REFUSED] * len(ack.rejected), strict=True):
            self.refusals.append((positions[j], vault, why))
        self.took[vault] = [positions[j] for j in (*ack.stored, *ack.rejected)]

    def settled(self) -> bool:
        """Every key is stored on an owner, or every owner of it answered."""
        return all(c or a == len(o) for c, a, o in zip(self.copies, self.answered, self.owners, strict=True))

    def bytes_out(self, pairs: Sequence[tuple[bytes, Buffer]]) -> dict[int, int]:
        """Blob bytes each vault's replies answered for."""
        return {v: sum(len(pairs[i][1]) for i in answered) for v, answered in self.took.items()}

    def result(self, addresses: Sequence[str]) -> PutResult:
        unstored = {i for i, c in enumerate(self.copies) if not c}
        refused = {i for i, _, _ in self.refusals} & unstored
        return PutResult(
            sent=len(self.keys),
            stored=len(self.keys) - len(unstored),
            rejected=len(refused),
            lagging=sum(0 < c < len(o) for c, o in zip(self.copies, self.owners, strict=True)),
            unstored=tuple(self.keys[i] for i in sorted(unstored)),
            rejections=tuple(Rejection(self.keys[i], addresses[v], why) for i, v, why in self.refusals),
        )


class PutReport:
    """Each put's outcome in the cluster's metrics, and in a log line at most once per interval when a
    vault refused, failed or lagged (the counts of the whole interval, and the first refusal's reason)."""

    def __init__(self, metrics: ClusterMetrics, interval_s: float = PUT_LOG_INTERVAL_S) -> None:
        self.metrics = metrics
        self._throttle = Throttle(interval_s)

    def note(self, role: str, result: PutResult) -> None:
        outcomes = {
            "stored": result.stored,
            "rejected": result.rejected,
            "failed": result.failed,
            "lagging": result.lagging,
        }
        for outcome, n in outcomes.items():
            if n:
                self.metrics.put_keys.labels(role, outcome).inc(n)
        del outcomes["stored"]
        due = self._throttle.add(outcomes)
        if due is None:
            return
        counts, span = due
        first = f" ({result.rejections[0].vault}: {result.rejections[0].reason})" if result.rejections else ""
        log.warning(
            "%s puts in the last %.0f s: %d blobs refused%s, %d unacknowledged (no usable answer), %d stored "
            "with fewer copies than owners",
            role,
            span,
            counts["rejected"],
            first,
            counts["failed"],
            counts["lagging"],
        )


def put_share(
    client: VaultClient,
    timeout: float | None,
    *,
    namespace: bytes,
    items: Sequence[tuple[bytes, Buffer]],
    priority: int,
    meta: Metas | None,
) -> PutAck:
    """One vault's share of a put (a cluster :data:`~tierkv.client.member.Work`), one Put per client
    batch: what their replies said. A share cut short by an error raises
    :class:`~tierkv.client.member.Partial` with what the Puts before it were answered (they count), and
    the blobs of a Put the vault refused as a whole rejected with its reason; the rest were never
    answered."""
    stored: list[int] = []
    rejected: list[int] = []
    reasons: list[str] = []
    for batch in put_batches(items, client.options, priority):
        try:
            chunk = [items[b.index] for b in batch]
            ack = client.put_acks(namespace, chunk, priority=priority, meta=meta)
        except VaultError as exc:
            if isinstance(exc, REFUSALS):
                rejected.extend(b.index for b in batch)
                reasons.extend(str(exc) for _ in batch)
            raise Partial(exc, PutAck(tuple(stored), tuple(rejected), tuple(reasons))) from None
        stored.extend(batch[j].index for j in ack.stored)
        rejected.extend(batch[j].index for j in ack.rejected)
        reasons.extend(REFUSED for _ in ack.rejected)
    return PutAck(tuple(stored), tuple(rejected), tuple(reasons))


__all__ = ["PUT_LOG_INTERVAL_S", "PutReport", "PutTally", "put_share"]
