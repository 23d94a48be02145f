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

from tierkv.client._rpc import Metas
from tierkv.client.member import FAILED, REFUSALS, Failed
from tierkv.client.metrics import ClusterMetrics
from tierkv.client.types import PutAck
from tierkv.client.vault import VaultClient
from tierkv.errors import ResourceExhausted, VaultError
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
        self.took: set[int] = set()

    def take(self, vault: int, ack: PutAck | None) -> None:
        """A vault's answer (None: none) for its share of the keys."""
        positions = self.per_vault[vault]
        if ack is None:
            for i in positions:
                self.answered[i] += 1
            return
        self.took.add(vault)
        for j in ack.stored:
            self.copies[positions[j]] += 1
            self.answered[positions[j]] += 1
        for j in ack.rejected:
            self.refusals.append((positions[j], vault, ack.reason or REFUSED))
            self.answered[positions[j]] += 1

    def settled(self) -> bool:
        """Every key is stored on an owner, or every owner of it answered."""
        return all(c or a == len(o) for c, a, o in zip(self.copies, self.answered, self.owners, strict=True))

    def bytes_out(self, pairs: Sequence[tuple[bytes, Buffer]]) -> dict[int, int]:
        """Blob bytes sent to each vault that answered."""
        return {v: sum(len(pairs[i][1]) for i in self.per_vault[v]) for v in self.took}

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
    """One vault's share of a put (a cluster :data:`~tierkv.client.member.Work`): its acknowledgement, or,
    when the vault refused it as a whole, :class:`_PutRefused` for :func:`refused_put` to answer."""
    try:
        return client.put_acks(namespace, items, priority=priority, meta=meta)
    except REFUSALS as exc:
        if sum(len(blob) for _, blob in items) > client.options.max_batch_bytes:
            raise  # sent as several Puts: the ones before this refusal may have been stored
        raise _PutRefused(exc, len(items)) from None


class _PutRefused(ResourceExhausted):
    """A share sent as one Put that the vault refused as a whole: none of its ``n`` blobs is stored."""

    def __init__(self, cause: VaultError, n: int) -> None:
        super().__init__(str(cause), code=cause.code)
        self.n = n


def refused_put(exc: VaultError) -> PutAck | Failed:
    """A refused share's answer: each of its blobs rejected, with the vault's reason, when it was one Put;
    FAILED (unknown which were stored) when it was several."""
    if isinstance(exc, _PutRefused):
        return PutAck((), tuple(range(exc.n)), reason=str(exc))
    return FAILED


__all__ = ["PUT_LOG_INTERVAL_S", "PutReport", "PutTally", "put_share", "refused_put"]
