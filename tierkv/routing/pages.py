"""``tierkv pages``: a page table of context — which prefixes sit on which replica's GPU, which in the vaults.

The replicas' side comes from their KV event streams, replayed from the start of each publisher's
buffer (vLLM's ``replay_endpoint``, bound on loopback by the documented launch line): ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared`` per medium, ``GPU`` for the replica's own cache and ``STORAGE``
for what its connector announced in the vaults. The vaults' side comes from the vaults themselves
(``ListNamespaces`` for tenants, ``Hottest`` for chains with their retention class and token ids), so it
also shows what no replica announced (stored before the replicas started, or by another cluster).

A prefix is a chain of blocks from a root block; each row is a maximal chain (one no longer chain
contains) and the tokens it would save a request that starts with it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

END_SEQ = -1
PREVIEW = 8
"""Token ids shown per prefix."""


@dataclasses.dataclass
class Block:
    parent: int | None
    tokens: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Page:
    """One maximal prefix in one place: ``where`` is ``gpu`` or ``vault``, ``holder`` the replica (GPU, or
    the replica that announced the vault copy) or the vault address. A vault's own rows name their
    ``namespace``; the one without a preview is the namespace's total."""

    where: str
    holder: str
    blocks: int
    tokens: int
    preview: tuple[int, ...]
    tenant: str = ""
    source: str = ""
    namespace: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"preview": list(self.preview)}


class Residency:
    """The blocks one replica's events say it holds, per medium (``GPU`` when the event names none)."""

    def __init__(self) -> None:
        self.media: dict[str, dict[int, Block]] = {}
        self.gone: dict[str, set[int]] = {}

    def apply(self, event: Any) -> bool:
        """One decoded event (a map tagged ``type``, as vLLM's msgspec encoding writes it); False when
        it is malformed (skipped, nothing applied)."""
        if not isinstance(event, Mapping):
            return False
        try:
            self._apply(event)
        except (TypeError, ValueError, AttributeError):
            return False
        return True

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        medium = str(event.get("medium") or "GPU")
        if kind == "BlockStored":
            self._stored(medium, event)
        elif kind == "BlockRemoved":
            held = self.media.get(medium, {})
            gone = self.gone.setdefault(medium, set())
            for h in event.get("block_hashes") or ():
                held.pop(_hash_id(h), None)
                gone.add(_hash_id(h))
        elif kind == "AllBlocksCleared":
            self.media.pop("GPU", None)

    def _stored(self, medium: str, event: Mapping[str, Any]) -> None:
        held = self.media.setdefault(medium, {})
        hashes = [_hash_id(h) for h in event.get("block_hashes") or ()]
        tokens = list(event.get("token_ids") or ())
        size = int(event.get("block_size") or 0) or (len(tokens) // max(len(hashes), 1))
        parent = event.get("parent_block_hash")
        prev = None if parent is None else _hash_id(parent)
        gone = self.gone.get(medium, set())
        for i, h in enumerate(hashes):
            held[h] = Block(prev, tuple(tokens[i * size : (i + 1) * size]))
            gone.discard(h)
            prev = h

    def chains(self, medium: str) -> list[list[Block]]:
        """Maximal chains root first. A chain whose parent was removed is left out (no prefix reaches
        it); one whose parent is unknown starts at its first known block (stored before the replay
        buffer began)."""
        held = self.media.get(medium, {})
        gone = self.gone.get(medium, set())
        parents = {b.parent for b in held.values()}
        chains = []
        for h, block in held.items():
            if h in parents:
                continue
            chain = [block]
            seen = {h}
            while chain[-1].parent in held and chain[-1].parent not in seen:
                seen.add(chain[-1].parent)  # type: ignore[arg-type]
                chain.append(held[chain[-1].parent])  # type: ignore[index]
            if chain[-1].parent not in gone:
                chains.append(chain[::-1])
        return chains


def _hash_id(value: Any) -> int:
    """vLLM sends a block hash as an int (or bytes for some hash functions): one comparable id."""
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(bytes(value)[-8:], "big")
    return hash(repr(value))


def replay(endpoint: str, timeout: float = 5.0) -> list[Any]:
    """Every event a vLLM publisher still buffers, oldest first, from its replay endpoint (ROUTER)."""
    import msgspec
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    events: list[Any] = []
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000)):
                raise TimeoutError(f"{endpoint}: no end of replay within {timeout:.0f} s")
            frames = sock.recv_multipart()
            if len(frames) != 4:
                log.warning("%s: unexpected replay frame of %d parts", endpoint, len(frames))
                continue
            if int.from_bytes(frames[2], "big", signed=True) == END_SEQ:
                return events
            try:
                batch = msgspec.msgpack.decode(frames[3])
            except msgspec.DecodeError:
                log.warning("%s: undecodable event batch skipped", endpoint)
                continue
            if isinstance(batch, list) and len(batch) >= 2 and isinstance(batch[1], list):
                events.extend(batch[1])
    finally:
        sock.close()


def replica_pages(name: str, events: Iterable[Any]) -> list[Page]:
    """The GPU and announced-vault prefixes of one replica from its events."""
    residency = Residency()
    bad = sum(not residency.apply(event) for event in events)
    if bad:
        log.warning("%s: %d malformed KV event(s) skipped", name, bad)
    pages = []
    for medium, where in (("GPU", "gpu"), ("STORAGE", "vault")):
        for chain in residency.chains(medium):
            tokens = tuple(t for b in chain for t in b.tokens)
            pages.append(Page(where, name, len(chain), len(tokens), tokens[:PREVIEW]))
    return pages


def vault_pages(client: Any, block_tokens: int, limit: int = 32) -> list[Page]:
    """A vault's hottest chains per tenant namespace (``Hottest``), with their class and token ids;
    ``block_tokens`` counts the tokens of a chain stored without its ids. The holder is filled in by
    the caller."""
    namespaces, _ = client.list_namespaces()
    pages = []
    for ns in namespaces:
        block_tokens = _tokens_per_block(ns.head) or block_tokens
        # The namespace's total first (every block, chains or not), then its hottest chains.
        total = Page("vault", "", ns.keys, ns.keys * block_tokens, (), ns.tenant, "", ns.namespace.hex())
        pages.append(total)
        for chain in client.hottest(ns.namespace, limit=limit, tenant=ns.tenant):
            tokens = len(chain.tokens) or len(chain.keys) * block_tokens
            pages.append(
                Page(
                    "vault",
                    "",
                    len(chain.keys),
                    tokens,
                    tuple(chain.tokens[:PREVIEW]),
                    ns.tenant,
                    chain.source,
                    ns.namespace.hex(),
                )
            )
    return pages


def _tokens_per_block(head: bytes) -> int:
    """The token count a namespace's sample blob header carries (0 when it says none or is unreadable)."""
    from tierkv.codec.header import read_header
    from tierkv.errors import CorruptBlobError

    try:
        return read_header(head, partial=True).tokens if head else 0
    except CorruptBlobError:
        return 0


def label(pages: Sequence[Page]) -> list[Page]:
    """Give GPU and announced-vault rows the tenant and class of the vault chain whose tokens they start."""
    known = [p for p in pages if p.tenant or p.source]
    labelled = []
    for page in pages:
        match = None
        if not (page.tenant or page.source) and page.preview:
            match = next((k for k in known if k.preview[: len(page.preview)] == page.preview), None)
        labelled.append(
            page if match is None else dataclasses.replace(page, tenant=match.tenant, source=match.source)
        )
    return labelled


def table(pages: Sequence[Page]) -> list[str]:
    """Rows grouped by tenant and class, longest prefix first."""
    lines = [f"  {'where':<5} {'held by':<26} {'blocks':>6} {'tokens':>7}  prefix (first token ids)"]
    ordered = sorted(pages, key=lambda p: (p.tenant, p.source, p.preview, p.where, -p.tokens, p.holder))
    group: tuple[str, str] | None = None
    for page in ordered:
        if (page.tenant, page.source) != group:
            group = (page.tenant, page.source)
            lines.append(f"tenant {page.tenant or '-'}  class {page.source or '-'}")
        preview = " ".join(str(t) for t in page.preview) or f"namespace {page.namespace[:16]}, all blocks"
        lines.append(
            f"  {page.where:<5} {page.holder:<26} {page.blocks:>6} {page.tokens:>7}  [{preview} ...]"
        )
    return lines


def parse_replica(value: str) -> tuple[str, str]:
    """``NAME=ENDPOINT`` (or a bare ``ENDPOINT``, named by itself) of a replica's replay endpoint."""
    name, sep, endpoint = value.partition("=")
    if not sep:
        name, endpoint = value, value
    if not endpoint.startswith(("tcp://", "ipc://")) or not name:
        raise ValueError(f"--replica {value!r}: expected NAME=tcp://HOST:PORT (the replay endpoint)")
    return name, endpoint


def collect(
    config: Any, targets: Sequence[Any], replicas: Sequence[str], block_tokens: int, timeout: float
) -> tuple[list[Page], list[str]]:
    """Pages from every replica's replayed events and every vault's chains; and one error line per
    replica or vault that did not answer (the others still count)."""
    from tierkv.client.fanout import ask

    parsed = [parse_replica(r) for r in replicas]
    pages: list[Page] = []
    errors: list[str] = []
    for name, endpoint in parsed:
        try:
            pages += replica_pages(name, replay(endpoint, timeout))
        except TimeoutError as exc:
            errors.append(str(exc))
    for answer in ask(config, targets, lambda c: vault_pages(c, block_tokens), timeout):
        if answer.error is not None:
            errors.append(f"{answer.target.address}: {answer.error}")
        else:
            pages += [dataclasses.replace(p, holder=answer.target.address) for p in answer.value or ()]
    return label(pages), errors


def document(pages: Sequence[Page], errors: Sequence[str]) -> dict[str, Any]:
    """``--json``: every page and the errors."""
    return {"pages": [p.as_dict() for p in pages], "errors": list(errors)}
