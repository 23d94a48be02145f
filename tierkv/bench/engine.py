"""``tierkv bench engine URL``: cold vs restored time to first token on an OpenAI-compatible server.

Protocol, per prompt length and repeat, with a fresh prompt (:mod:`.prompts`) each time:

1. **cold** — the prompt is new to the engine and to the vaults: a full prefill. The engine's tierkv
   connector stores its KV when the request finishes;
2. **hot** — the same prompt again, served by the engine's own prefix cache (the best case);
3. *settle* — a pause for the asynchronous store to land in the vaults;
4. *evict* — the engine forgets the prompt: ``POST /reset_prefix_cache`` (vLLM, when started with
   ``VLLM_SERVER_DEV_MODE=1``; the connector's own cache is left alone), or a flood of unrelated prompts
   that pushes it out of the engine's KV memory;
5. **restored** — the same prompt again: its KV must come back from the cold tier.

Requests stream (``"stream": true``); TTFT runs from sending the request on an open connection to the
first server-sent event carrying a generated token, not to the end of the response. Only the standard
library speaks HTTP here. A restored TTFT close to the cold one means the cold tier was not hit, and
the run says so.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from rich.console import Console

from tierkv.bench import BenchError
from tierkv.bench.breakeven import ttft_break_even
from tierkv.bench.common import BenchRun, Deadline, check_sweep, progress_bar, ratio, settings_document
from tierkv.bench.prompts import PromptMaker
from tierkv.bench.record import RunMeta, median

logger = logging.getLogger(__name__)

APIS = ("auto", "completions", "chat")
EVICTIONS = ("auto", "reset", "flood", "none")
NOT_HIT_RATIO = 1.25


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    url: str
    model: str | None = None
    lengths: tuple[int, ...] = (1024, 4096)
    repeats: int = 3
    max_tokens: int = 4
    api: str = "auto"
    evict: str = "auto"
    flood_tokens: int = 65536
    flood_prompt_tokens: int = 2048
    settle_s: float = 1.0
    request_timeout_s: float = 600.0
    max_seconds: float = 900.0
    min_speedup: float | None = None
    api_key_env: str = "OPENAI_API_KEY"
    seed: int = 0

    def validate(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise BenchError(f"the engine URL must be http(s)://HOST[:PORT][/v1], got {self.url!r}")
        if self.api not in APIS:
            raise BenchError(f"--api must be one of {', '.join(APIS)}")
        if self.evict not in EVICTIONS:
            raise BenchError(f"--evict must be one of {', '.join(EVICTIONS)}")
        check_sweep(
            self,
            positive={
                "--max-new-tokens": self.max_tokens,
                "--flood-tokens": self.flood_tokens,
                "flood prompt tokens": self.flood_prompt_tokens,
            },
        )
        if self.settle_s < 0:
            raise BenchError("--settle must not be negative")

    def as_dict(self) -> dict[str, Any]:
        return settings_document(self)


@dataclasses.dataclass
class Streamed:
    """One streamed request: when its first token came, when it ended, what usage the server reported."""

    ttft_s: float
    total_s: float
    events: int
    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


class OpenAIHTTP:
    """The few calls the bench makes to an OpenAI-compatible server, over ``http.client``."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        parsed = urllib.parse.urlsplit(url.rstrip("/"))
        self.https = parsed.scheme == "https"
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or (443 if self.https else 80)
        path = parsed.path
        self.root = path[: -len("/v1")] if path.endswith("/v1") else path
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.connect()
        except OSError as exc:
            raise BenchError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A plain request; returns the status and the parsed JSON body (None when it is not JSON)."""
        conn = self._connect()
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, self.root + path, body=data, headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise BenchError(f"{method} {path} on {self.host}:{self.port} failed: {exc}") from exc
        finally:
            conn.close()
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, None

    def stream(self, path: str, body: dict[str, Any], chat: bool) -> Streamed:
        """POST with ``stream: true`` and read the server-sent events to the end."""
        conn = self._connect()
        try:
            data = json.dumps(body).encode()
            start = time.perf_counter()
            conn.request("POST", self.root + path, body=data, headers=self.headers)
            resp = conn.getresponse()
            if resp.status != 200:
                detail = resp.read()[:500].decode(errors="replace")
                raise BenchError(f"POST {path} answered {resp.status}: {detail}")
            return read_events(resp, start, chat)
        except (OSError, http.client.HTTPException) as exc:
            raise BenchError(f"POST {path} on {self.host}:{self.port} failed: {exc}") from exc
        finally:
            conn.close()


def read_events(resp: Any, start: float, chat: bool) -> Streamed:
    """Read ``data:`` lines until ``[DONE]`` or the end; the clock stops at the first token-bearing event."""
    first: float | None = None
    events = 0
    text: list[str] = []
    usage: dict[str, Any] = {}
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if "error" in event:
            raise BenchError(f"the stream reported an error: {event['error']}")
        events += 1
        if event.get("usage"):
            usage = event["usage"]
        piece = token_text(event, chat)
        if piece is not None:
            if first is None:
                first = time.perf_counter()
            text.append(piece)
    end = time.perf_counter()
    if first is None:
        raise BenchError("the stream ended without a single token")
    details = usage.get("prompt_tokens_details") or {}
    return Streamed(
        ttft_s=first - start,
        total_s=end - start,
        events=events,
        text="".join(text),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
    )


def token_text(event: dict[str, Any], chat: bool) -> str | None:
    """The generated text an event carries, "" for a token without text, None for no token.

    A completions chunk with a choice is a token (its text may be empty: special tokens). A chat chunk
    that only announces the role is not; one with content, reasoning or a finish reason is.
    """
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if not chat:
            if "text" in choice:
                return str(choice.get("text") or "")
            continue
        delta = choice.get("delta") or {}
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if content or reasoning:
            return str(content or reasoning)
        if ("role" not in delta and content is not None) or choice.get("finish_reason"):
            return ""
    return None


@dataclasses.dataclass
class EngineRow:
    target_tokens: int
    prompt_tokens: int | None = None
    cold: list[Streamed] = dataclasses.field(default_factory=list)
    hot: list[Streamed] = dataclasses.field(default_factory=list)
    restored: list[Streamed] = dataclasses.field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens or self.target_tokens

    @property
    def cached_tokens_restored(self) -> int | None:
        values = [m.cached_tokens for m in self.restored if m.cached_tokens is not None]
        return min(values) if values else None

    def figures(self) -> dict[str, Any]:
        cold = median([m.ttft_s for m in self.cold])
        hot = median([m.ttft_s for m in self.hot])
        restored = median([m.ttft_s for m in self.restored])
        return {
            "cold_ttft_s": cold,
            "hot_ttft_s": hot,
            "restored_ttft_s": restored,
            "speedup": ratio(cold, restored),
            "hot_speedup": ratio(cold, hot),
            "prefill_tokens_per_s": ratio(self.tokens, cold),
            "cold_total_s": median([m.total_s for m in self.cold]),
            "restored_total_s": median([m.total_s for m in self.restored]),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "tokens": self.tokens,
            "cached_tokens_restored": self.cached_tokens_restored,
            **self.figures(),
        }


@dataclasses.dataclass
class EngineResult(BenchRun):
    settings: EngineSettings
    model: str = ""
    api: str = ""
    evict_method: str = ""
    tokenizer: str = ""
    rows: list[EngineRow] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and any(r.restored for r in self.rows)

    def figures_document(self) -> dict[str, Any]:
        return {
            "engine": {
                "url": self.settings.url,
                "model": self.model,
                "api": self.api,
                "eviction": self.evict_method,
                "token_counts": self.tokenizer,
            },
            "results": [r.as_dict() for r in self.rows],
        }


class _Engine:
    """The protocol's moves against one server: detect, count, stream, evict."""

    def __init__(self, settings: EngineSettings, result: EngineResult) -> None:
        self.s = settings
        self.result = result
        self.http = OpenAIHTTP(
            settings.url,
            api_key=os.environ.get(settings.api_key_env) or None,
            timeout_s=settings.request_timeout_s,
        )
        self.model = ""
        self.chat = settings.api == "chat"
        self.reset_works: bool | None = None if settings.evict in ("auto", "reset") else False
        self.flood_maker = PromptMaker(seed=settings.seed + 1)

    def detect_model(self) -> str:
        status, body = self.http.request("GET", "/v1/models")
        if status != 200 or not isinstance(body, dict):
            raise BenchError(
                f"GET /v1/models answered {status}: is {self.s.url} an OpenAI-compatible server?"
            )
        ids = [str(m["id"]) for m in body.get("data", []) if isinstance(m, dict) and m.get("id")]
        if self.s.model:
            if ids and self.s.model not in ids:
                self.result.warnings.append(f"--model {self.s.model} is not among the served models {ids}")
            self.model = self.s.model
        elif not ids:
            raise BenchError("GET /v1/models lists no model; pass --model")
        else:
            self.model = ids[0]
            if len(ids) > 1:
                self.result.warnings.append(f"several models served ({', '.join(ids)}); using {self.model}")
        return self.model

    def token_counter(self) -> Callable[[str], int] | None:
        """vLLM's ``POST /tokenize`` counts with the engine's own tokenizer; None where it is absent."""
        status, body = self.http.request("POST", "/tokenize", {"model": self.model, "prompt": "count me"})
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("count"), int):
            return None

        def count(text: str) -> int:
            st, answer = self.http.request("POST", "/tokenize", {"model": self.model, "prompt": text})
            if st != 200 or not isinstance(answer, dict):
                raise BenchError(f"POST /tokenize answered {st}")
            return int(answer["count"])

        return count

    def send(self, text: str, max_tokens: int | None = None) -> Streamed:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens or self.s.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": text}]
            return self.http.stream("/v1/chat/completions", body, chat=True)
        body["prompt"] = text
        return self.http.stream("/v1/completions", body, chat=False)

    def choose_api(self) -> None:
        """``auto``: completions where the server has them, else chat (EXO serves only chat)."""
        if self.s.api != "auto":
            self.result.api = self.s.api
            return
        try:
            self.chat = False
            self.send("Warm-up: the weather report for the harbour.", max_tokens=1)
            self.result.api = "completions"
        except BenchError as exc:
            logger.info("completions API unusable (%s); trying chat", exc)
            self.chat = True
            self.result.api = "chat"

    def evict(self) -> None:
        if self.s.evict == "none":
            return
        if self.reset_works is not False and self._reset():
            self.result.evict_method = "POST /reset_prefix_cache"
            return
        if self.s.evict == "reset":
            raise BenchError(
                "POST /reset_prefix_cache is not available (vLLM serves it with VLLM_SERVER_DEV_MODE=1); "
                "use --evict flood"
            )
        self.result.evict_method = f"flood of {self.s.flood_tokens:,} tokens"
        self.flood()

    def _reset(self) -> bool:
        """True once the engine's prefix cache was reset; it refuses while blocks are in flight, so retry."""
        for _ in range(40):
            status, body = self.http.request("POST", "/reset_prefix_cache")
            if status in (404, 405):
                self.reset_works = False
                return False
            if status == 200 and not (isinstance(body, dict) and body.get("success") is False):
                self.reset_works = True
                return True
            time.sleep(0.25)
        raise BenchError("POST /reset_prefix_cache kept failing (blocks still held by requests in flight)")

    def flood(self) -> None:
        left = self.s.flood_tokens
        while left > 0:
            n = min(left, self.s.flood_prompt_tokens)
            self.send(self.flood_maker.prompt(n), max_tokens=1)
            left -= n


def run_engine(settings: EngineSettings, console: Console) -> EngineResult:
    settings.validate()
    deadline = Deadline(settings.max_seconds)
    meta = RunMeta("engine", settings.as_dict())
    result = EngineResult(meta, settings)
    engine = _Engine(settings, result)
    try:
        result.model = engine.detect_model()
        engine.choose_api()
        counter = engine.token_counter()
        result.tokenizer = "engine /tokenize" if counter else "estimated from words, corrected by usage"
        maker = PromptMaker(seed=settings.seed, count=counter)
        if counter is not None:
            engine.flood_maker = PromptMaker(seed=settings.seed + 1, count=counter)
        _measure(engine, maker, settings, result, deadline, console)
    except BenchError as exc:
        result.errors.append(str(exc))
    _conclude(result)
    result.finish(deadline)
    return result


def _measure(
    engine: _Engine,
    maker: PromptMaker,
    s: EngineSettings,
    result: EngineResult,
    deadline: Deadline,
    console: Console,
) -> None:
    lengths = sorted(set(s.lengths))
    with progress_bar(console, len(lengths) * s.repeats) as bar:
        for n in lengths:
            row = EngineRow(n)
            result.rows.append(row)
            for rep in range(s.repeats):
                if result.out_of_time(deadline):
                    result.warnings.append(deadline.note())
                    return
                label = f"{n:,} tokens ({rep + 1}/{s.repeats})"
                text = maker.prompt(n)
                bar.label(f"{label}: cold")
                cold = engine.send(text)
                row.cold.append(cold)
                if cold.prompt_tokens:
                    row.prompt_tokens = cold.prompt_tokens
                    maker.observe(len(text.split()), cold.prompt_tokens)
                bar.label(f"{label}: hot")
                row.hot.append(engine.send(text))
                time.sleep(s.settle_s)
                bar.label(f"{label}: evict")
                engine.evict()
                bar.label(f"{label}: restored")
                row.restored.append(engine.send(text))
                bar.advance()


def _conclude(result: EngineResult) -> None:
    rows = [r for r in result.rows if r.restored]
    result.rows = rows
    if rows and result.settings.evict == "none":
        result.warnings.append("--evict none: 'restored' is just another hot hit")
    for row in rows:
        f = row.figures()
        result.warnings.extend(_row_warnings(row, f, flooded=result.evict_method.startswith("flood")))
        result.check_speedup(row.tokens, f["speedup"], result.settings.min_speedup)
    result.warnings = list(dict.fromkeys(result.warnings))
    if rows:
        result.breakeven["restored via engine"] = ttft_break_even(
            [(r.tokens, m.ttft_s) for r in rows for m in r.cold],
            [(r.tokens, m.ttft_s) for r in rows for m in r.restored],
            median([m.ttft_s for r in rows for m in r.hot]) or 0.0,
        )
    result.verdict = engine_verdict(result)


def _row_warnings(row: EngineRow, f: dict[str, Any], *, flooded: bool) -> list[str]:
    """What one prompt length's figures say about the run itself (cold tier hit? eviction worked?)."""
    at = f"{row.tokens:,} tokens"
    found: list[str] = []
    if f["hot_speedup"] is not None and f["hot_speedup"] < NOT_HIT_RATIO:
        found.append(
            f"{at}: even the engine's own prefix cache barely helps (hot {f['hot_ttft_s']:.3f} s vs cold "
            f"{f['cold_ttft_s']:.3f} s): TTFT is not prefill-bound here; try longer prompts"
        )
    elif f["speedup"] is not None and f["speedup"] < NOT_HIT_RATIO:
        found.append(
            f"{at}: restored TTFT {f['restored_ttft_s']:.3f} s is close to cold "
            f"{f['cold_ttft_s']:.3f} s: the cold tier was probably not hit (connector loaded? "
            "vaults reachable? give the store time with --settle)"
        )
    if row.cached_tokens_restored == 0:
        found.append(f"{at}: the engine reports 0 cached prompt tokens for the restored request")
    hot = f["hot_ttft_s"]
    if flooded and hot and f["restored_ttft_s"] <= 1.1 * hot:
        found.append(
            f"{at}: restored is as fast as a hot hit: the flood may not have evicted the prompt "
            "(raise --flood-tokens)"
        )
    return found


def engine_verdict(result: EngineResult) -> str:
    if not result.ok:
        return result.failure("no request completed")
    top = result.rows[-1]
    f = top.figures()
    be = next(iter(result.breakeven.values()))
    where = "never pays" if be.tokens is None else f"pays above {be.tokens:,} tokens"
    line = (
        f"At {top.tokens:,} tokens the first token comes {f['speedup']:.1f}× sooner restored "
        f"({f['restored_ttft_s']:.3f} s) than cold ({f['cold_ttft_s']:.3f} s); restoring {where}."
    )
    if f["speedup"] < NOT_HIT_RATIO:
        line = "The cold tier was probably not hit. " + line
    return line


__all__ = [
    "APIS",
    "EVICTIONS",
    "EngineResult",
    "EngineRow",
    "EngineSettings",
    "OpenAIHTTP",
    "Streamed",
    "read_events",
    "run_engine",
    "token_text",
]
