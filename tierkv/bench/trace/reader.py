"""Reading a trace file as users bring them: tierkv's format or the public hash-id traces.

The file may be gzip-compressed (told by its first bytes, not its name), start with a UTF-8 byte-order
mark, end its lines in CRLF and hold blank lines. Lines are read one at a time, so ``max_requests`` bounds
what is held: the requests read, each a tuple of its ids. Hash-id lines give their block size away
(:mod:`.blocksize`), their timestamp unit by their fields (:func:`~.hashids.time_unit`), and may carry
fields tierkv has no use for: all of that is said in the trace's ``notes``, so a replay never rests on
a silent assumption. Requests that all have timestamps are replayed in timestamp order (a trace merged
from several machines is rarely sorted), unless ``keep_order``.

Anything that cannot be replayed is one :class:`~.model.TraceError` naming the file, the line and the
field: a CSV of token counts (Azure's, BurstGPT's) or a Parquet file is refused with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import itertools
import json
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from tierkv.bench.trace import hashids
from tierkv.bench.trace.blocksize import BlockSize
from tierkv.bench.trace.model import Request, Trace, TraceError, header, parse_request
from tierkv.errors import BenchError

FORMATS: Final = ("auto", "tierkv", "hash-ids")
TIME_UNITS: Final = ("auto", "ms", "s")
_GZIP_MAGIC: Final = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"
MAX_LINE_BYTES: Final = 64 << 20
"""A request's line is at most this long: a million-token prompt in 16-token blocks is about 1 MB of ids,
so a longer line is not a trace (a file with no line breaks, a decompression bomb) and is refused before
it is read into memory whole."""
_REFUSED_MAGIC: Final = {
    b"PAR1": "a Parquet file: convert it to JSONL first (pandas: read_parquet(...).to_json(..., "
    "orient='records', lines=True))",
    b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it first (zstd -d), or recompress it with gzip",
    b"PK\x03\x04": "a zip archive: unpack it first",
}


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How to read a trace file (the command's ``--format``, ``--trace-block-tokens``, ...)."""

    block_tokens: int | None = None
    """Tokens per id of the hash-id lines; None: found from the lines."""
    fmt: str = "auto"
    """auto (each line by its fields), tierkv or hash-ids (every line must be one)."""
    time_unit: str = "auto"
    """Of the hash-id lines' ``timestamp``: auto (seconds for Bailian's fields, else ms), ms or s."""
    max_requests: int | None = None
    """Stop after this many requests (the file's first ones)."""
    keep_order: bool = False
    """Replay in the file's order even where the timestamps disagree with it."""

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise BenchError(f"--format: expected one of {', '.join(FORMATS)}, got {self.fmt!r}")
        if self.time_unit not in TIME_UNITS:
            raise BenchError(f"--timestamp-unit: expected {', '.join(TIME_UNITS)}, got {self.time_unit!r}")
        if self.max_requests is not None and self.max_requests < 1:
            raise BenchError(f"--max-requests: expected a positive count, got {self.max_requests}")


def _not_json(line: str, where: str, first: bool, exc: Exception) -> TraceError:
    """The error for a line that is not JSON; a first line that is a CSV header of token counts is
    refused for what it is."""
    columns = [c.strip().strip('"') for c in line.split(",")]
    if first and len(columns) > 1 and any("token" in c.lower() for c in columns):
        return TraceError(
            f"{where}: a CSV of token counts (columns {', '.join(columns[:6])}): it says how long each "
            "prompt was, not what it shares with earlier ones (no hash_ids, no token ids), so a cache's "
            "reuse cannot be replayed from it; bring a hash-id JSONL trace (Mooncake, Bailian, aiperf)"
        )
    return TraceError(f"{where}: not a JSON value ({exc}); a trace has one JSON object per line")


class _Reading:
    """The state of one read: requests so far, the block size narrowing, what was seen and assumed."""

    def __init__(self, source: str, options: ReadOptions) -> None:
        self.source, self.options = source, options
        self.requests: list[Request] = []
        self.generator: Mapping[str, Any] = {}
        self.blocks = BlockSize(options.block_tokens)
        self.unit: str | None = None if options.time_unit == "auto" else options.time_unit
        self.unit_from = "given" if self.unit else ""
        self.ignored: set[str] = set()
        self.hash_lines = 0
        self.more = False
        self.seen_json = False

    @property
    def full(self) -> bool:
        cap = self.options.max_requests
        return cap is not None and len(self.requests) >= cap

    def line(self, number: int, text: str) -> None:
        where = f"{self.source} line {number}"
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise _not_json(text, where, not self.seen_json, exc) from None
        self.seen_json = True
        found = header(doc, where)
        if found is not None:
            if self.requests or self.generator:
                raise TraceError(f"{where}: a header may only be the first line")
            self.generator = found
        elif hashids.is_hash_request(doc) if self.options.fmt == "auto" else self.options.fmt == "hash-ids":
            self.requests.append(self._hash_request(doc, where))
        else:
            self._refuse_counts(doc, where)
            self.requests.append(parse_request(doc, where))

    def _refuse_counts(self, doc: object, where: str) -> None:
        """A line of token counts or text among tierkv lines is refused with the reason, not named as a
        tierkv line with unknown fields."""
        if isinstance(doc, dict) and not {"segments", "tokens"} & set(doc):
            refusal = hashids.without_prefix_identity(doc, where)
            if refusal is not None:
                raise refusal

    def _hash_request(self, doc: object, where: str) -> Request:
        if not isinstance(doc, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if "hash_ids" not in doc:
            raise hashids.without_prefix_identity(doc, where) or TraceError(
                f"{where}: not a hash-id request (no 'hash_ids'; --format hash-ids)"
            )
        if self.unit is None:
            self.unit, self.unit_from = hashids.time_unit(doc), "fields"
        self.ignored.update(k for k in doc if k not in hashids.KNOWN_FIELDS)
        request = hashids.parse_hash_request(doc, where, hashids.TIME_UNITS[self.unit])
        self.blocks.see(request.length, len(request.hash_ids or ()), where)
        self.hash_lines += 1
        return request

    def trace(self) -> Trace:
        if not self.requests:
            raise TraceError(f"{self.source}: no requests")
        reading: dict[str, Any] = {"requests": len(self.requests), "capped": self.more}
        notes: list[str] = []
        block_tokens = self._hash_notes(reading, notes) if self.hash_lines else None
        requests = self._ordered(reading, notes)
        if self.more:
            notes.append(f"read the file's first {len(requests):,} requests (--max-requests); more follow")
        return Trace(tuple(requests), self.generator, self.source, block_tokens, reading, tuple(notes))

    def _hash_notes(self, reading: dict[str, Any], notes: list[str]) -> int:
        size, doubt = self.blocks.resolve(self.source)
        given = self.options.block_tokens is not None
        reading |= {
            "hash_id_requests": self.hash_lines,
            "block_tokens": size,
            "block_tokens_from": "given" if given else "assumed" if doubt else "lines",
            "timestamp_unit": self.unit,
            "timestamp_unit_from": self.unit_from,
            "ignored_fields": sorted(self.ignored),
        }
        if doubt:
            notes.append(doubt)
        elif not given:
            notes.append(f"hash ids of {size}-token blocks (found from the prompts' lengths and id counts)")
        if self.unit == "s" and self.unit_from == "fields":
            notes.append("timestamps read as seconds (Bailian's fields chat_id, parent_chat_id)")
        if self.ignored:
            notes.append(f"fields tierkv has no use for, ignored: {', '.join(sorted(self.ignored)[:12])}")
        return size

    def _ordered(self, reading: dict[str, Any], notes: list[str]) -> list[Request]:
        """The requests in timestamp order where they all have one (stable: ties keep the file's order)."""
        times = [r.timestamp for r in self.requests]
        untimed = times.count(None)
        late = sum(1 for a, b in itertools.pairwise(times) if a is not None and b is not None and b < a)
        reading |= {"untimed": untimed, "out_of_order": late, "order": "file"}
        if untimed and untimed < len(times):
            notes.append(f"{untimed:,} of {len(times):,} requests lack a timestamp: replayed in file order")
        if not late or untimed:
            return self.requests
        if self.options.keep_order:
            notes.append(f"{late:,} requests are earlier than the line before them; replayed in file order")
            return self.requests
        reading["order"] = "timestamp"
        notes.append(f"{late:,} requests are earlier than the line before them; replayed in timestamp order")
        return sorted(self.requests, key=lambda r: r.timestamp or 0.0)


def parse_lines(lines: Iterable[str], source: str = "<trace>", options: ReadOptions | None = None) -> Trace:
    """A :class:`~.model.Trace` from JSONL text lines; the first line may be a tierkv header."""
    state = _Reading(source, options or ReadOptions())
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if state.full:
            state.more = True
            break
        state.line(number, line)
    return state.trace()


class _ByteLines(Protocol):
    """A binary file (plain or gzip): all the reader needs of one."""

    def readline(self, size: int | None = -1, /) -> bytes: ...


def _numbered(fh: _ByteLines, source: str) -> Iterator[str]:
    """The file's lines, each decoded on its own (a byte-order mark dropped from the first), so that bytes
    that are not UTF-8 or a read that fails midway (a truncated gzip stream) name the line they are on."""
    number = 0
    while True:
        try:
            raw = fh.readline(MAX_LINE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(
                f"{source} line {number + 1}: unreadable ({exc or type(exc).__name__})"
            ) from None
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(
                f"{source} line {number}: longer than {MAX_LINE_BYTES >> 20} MiB, which no request's line is "
                "(one JSON object per line expected)"
            )
        try:
            yield (raw[3:] if number == 1 and raw.startswith(_BOM) else raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(f"{source} line {number}: not UTF-8 text ({exc.reason})") from None


@contextlib.contextmanager
def open_lines(path: Path) -> Iterator[tuple[Iterator[str], str | None]]:
    """The file's lines (gzip undone where its first bytes say so) and the compression found."""
    try:
        with path.open("rb") as raw:
            magic = raw.read(4)
            refused = next((why for m, why in _REFUSED_MAGIC.items() if magic.startswith(m)), None)
            if refused:
                raise TraceError(f"{path}: {refused}")
            raw.seek(0)
            packed = magic.startswith(_GZIP_MAGIC)
            with gzip.GzipFile(fileobj=raw) if packed else contextlib.nullcontext(raw) as fh:
                yield _numbered(fh, str(path)), "gzip" if packed else None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_trace(path: str | Path, options: ReadOptions | None = None) -> Trace:
    """Read a trace file; a missing, unreadable or unreplayable file is a :class:`TraceError` too."""
    target = Path(path).expanduser()
    with open_lines(target) as (lines, compression):
        trace = parse_lines(lines, str(target), options)
    return dataclasses.replace(trace, reading={**trace.reading, "compression": compression})


__all__ = ["FORMATS", "TIME_UNITS", "ReadOptions", "open_lines", "parse_lines", "read_trace"]
