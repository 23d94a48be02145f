"""A small OpenAI-compatible streaming server (stdlib ``http.server`` in a thread) with known delays.

It behaves like an engine with a prefix cache and, optionally, a cold tier behind it: a prompt it has
never seen waits ``cold_s`` before its first token, one in its prefix cache ``hot_s``, one the cold tier
holds (after ``POST /reset_prefix_cache`` or after being pushed out by other prompts) ``restore_s``.
After the first token it waits ``tail_s`` before the rest, so a client that timed the whole response
instead of the first token would be caught. Tokens are whitespace-separated words.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclasses.dataclass
class Behaviour:
    cold_s: float = 0.3
    hot_s: float = 0.02
    restore_s: float = 0.1
    tail_s: float = 0.4
    cold_tier: bool = True
    reset_endpoint: bool = True
    completions: bool = True
    hot_capacity_tokens: int = 10_000
    model: str = "fake-model"


class FakeEngine:
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour
        self.hot: OrderedDict[str, int] = OrderedDict()
        self.cold: set[str] = set()
        self.log: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def first_token_delay(self, prompt: str) -> tuple[float, str, int]:
        """Delay before the first token, which path served it, and the cached prompt tokens."""
        tokens = len(prompt.split())
        with self.lock:
            if prompt in self.hot:
                self.hot.move_to_end(prompt)
                return self.b.hot_s, "hot", tokens
            path = "restore" if prompt in self.cold else "cold"
            self.hot[prompt] = tokens
            while sum(self.hot.values()) > self.b.hot_capacity_tokens and len(self.hot) > 1:
                old, _ = self.hot.popitem(last=False)
                if self.b.cold_tier:
                    self.cold.add(old)
            if self.b.cold_tier:
                self.cold.add(prompt)
        return (self.b.restore_s, path, tokens) if path == "restore" else (self.b.cold_s, path, 0)

    def reset(self) -> None:
        with self.lock:
            if self.b.cold_tier:
                self.cold.update(self.hot)
            self.hot.clear()


def _handler(engine: FakeEngine) -> type[BaseHTTPRequestHandler]:
    b = engine.b

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n)) if n else {}

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": b.model, "object": "model"}]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self._body()
            if self.path == "/tokenize":
                self._json(200, {"count": len(str(body.get("prompt", "")).split())})
            elif self.path == "/reset_prefix_cache" and b.reset_endpoint:
                engine.reset()
                engine.log.append(("reset", ""))
                self._json(200, {"success": True})
            elif self.path == "/v1/completions" and b.completions:
                self._stream(str(body["prompt"]), int(body.get("max_tokens", 4)), chat=False)
            elif self.path == "/v1/chat/completions":
                self._stream(str(body["messages"][-1]["content"]), int(body.get("max_tokens", 4)), chat=True)
            else:
                self._json(404, {"error": "not found"})

        def _event(self, payload: Any) -> None:
            data = (
                b"data: "
                + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
                + b"\n\n"
            )
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, prompt: str, max_tokens: int, chat: bool) -> None:
            delay, path, cached = engine.first_token_delay(prompt)
            engine.log.append((path, prompt))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if chat:  # a role-only chunk right away, as some servers send before any token exists
                self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            time.sleep(delay)
            for i in range(max_tokens):
                if i == 1:
                    time.sleep(b.tail_s)
                piece = f" w{i}"
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                self._event({"choices": [choice]})
            usage = {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": max_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            self._event({"choices": [], "usage": usage})
            self._event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def serve(behaviour: Behaviour) -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(behaviour)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fake-engine", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", engine
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
