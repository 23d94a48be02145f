"""Check a running vLLM server and its tierkv vaults end to end; one PASS/FAIL line per check.

    python -m tierkv.connectors.vllm.smoke_test --base http://127.0.0.1:8000 --model NAME --toml tierkv.toml

Checks, in order: the engine answers ``/health``; it serves ``NAME``; the smoke prompt plus its output fit
the model's context; every vault of the TOML answers over RPC (health and stats, with the token and TLS of
the file); one greedy completion comes back. The exit code is 0 only when every check passed. Nothing
here needs vLLM installed: it speaks HTTP to the server and gRPC to the vaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierkv.client.vault import VaultClient
from tierkv.config import Config, load_config
from tierkv.errors import TierKVError

logger = logging.getLogger(__name__)

PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
MAX_TOKENS = 8


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def _http(method: str, url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            raw = reply.read()
            status = int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode(errors="replace")[:300]


def check_health(base: str, timeout: float) -> Check:
    try:
        status, _ = _http("GET", f"{base}/health", None, timeout)
    except OSError as exc:
        return Check("engine health", False, f"{base}/health unreachable: {exc}")
    return Check("engine health", status == 200, f"HTTP {status}")


def find_model(base: str, model: str, timeout: float) -> tuple[Check, dict[str, Any] | None]:
    try:
        status, body = _http("GET", f"{base}/v1/models", None, timeout)
    except OSError as exc:
        return Check("model", False, f"/v1/models unreachable: {exc}"), None
    if status != 200 or not isinstance(body, dict):
        return Check("model", False, f"/v1/models answered HTTP {status}"), None
    cards = [c for c in body.get("data", []) if isinstance(c, dict)]
    for card in cards:
        if card.get("id") == model:
            return Check("model", True, f"{model} is served"), card
    served = ", ".join(str(c.get("id")) for c in cards) or "none"
    return Check("model", False, f"{model} is not served (served: {served})"), None


def check_context(card: dict[str, Any] | None, prompt_tokens: int) -> Check:
    if card is None:
        return Check("context fit", False, "no model card")
    limit = card.get("max_model_len")
    if not isinstance(limit, int):
        return Check("context fit", False, "the server does not report max_model_len")
    need = prompt_tokens + MAX_TOKENS
    return Check("context fit", need <= limit, f"needs ~{need} tokens, max_model_len {limit}")


def check_vaults(config: Config, timeout: float) -> list[Check]:
    token = config.auth.load_token()
    tls = config.tls if config.tls.enabled else None
    roles = {"kv_cold": config.cluster.kv_cold, "ssm_cold": config.cluster.ssm_cold}
    checks: list[Check] = []
    for role, endpoints in roles.items():
        for endpoint in endpoints:
            name = f"vault {role} {endpoint.address}"
            try:
                with VaultClient(endpoint.address, timeout=timeout, token=token, tls=tls) as client:
                    healthy = client.health()
                    stats = client.stats()
            except TierKVError as exc:
                checks.append(Check(name, False, str(exc)))
                continue
            used = f"{stats.used_bytes}/{stats.max_bytes}"
            detail = f"serving={healthy} role={stats.role} keys={stats.keys} bytes={used}"
            checks.append(Check(name, healthy, detail))
    if not checks:
        checks.append(Check("vaults", False, "the TOML lists no vault"))
    return checks


def check_inference(base: str, model: str, timeout: float) -> Check:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    start = time.perf_counter()
    try:
        status, reply = _http("POST", f"{base}/v1/completions", body, timeout)
    except OSError as exc:
        return Check("inference", False, f"/v1/completions failed: {exc}")
    elapsed = time.perf_counter() - start
    if status != 200 or not isinstance(reply, dict) or not reply.get("choices"):
        return Check("inference", False, f"HTTP {status}: {reply}")
    usage = reply.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    text = str(reply["choices"][0].get("text", ""))
    detail = (
        f"{usage.get('completion_tokens', '?')} tokens in {elapsed:.2f}s, "
        f"cached prompt tokens {details.get('cached_tokens', 'n/a')}: {text!r}"
    )
    return Check("inference", usage.get("completion_tokens", 0) > 0, detail)


def run(base: str, model: str, toml: str | None, timeout: float, out: Callable[[str], None] = print) -> int:
    """Run every check, print one line each, return the exit code."""
    base = base.rstrip("/")
    checks = [check_health(base, timeout)]
    model_check, card = find_model(base, model, timeout)
    checks += [model_check, check_context(card, prompt_tokens=len(PROMPT.split()) * 2)]
    try:
        config = load_config(toml)
    except TierKVError as exc:
        checks.append(Check("config", False, str(exc)))
    else:
        checks += check_vaults(config, timeout)
    if model_check.ok:
        checks.append(check_inference(base, model, max(timeout, 60.0)))
    else:
        checks.append(Check("inference", False, "skipped: the model is not served"))
    for check in checks:
        out(check.line())
    failed = sum(not c.ok for c in checks)
    out(f"{'PASS' if not failed else 'FAIL'}  {len(checks) - failed}/{len(checks)} checks passed")
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tierkv.connectors.vllm.smoke_test", description=__doc__)
    parser.add_argument("--base", required=True, help="vLLM server URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--toml", default=None, help="tierkv.toml listing the vaults (default search order)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP or RPC call")
    args = parser.parse_args(argv)
    return run(args.base, args.model, args.toml, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
