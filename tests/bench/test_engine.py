"""``tierkv bench engine`` against a streaming server whose first-token delays are known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from tests.bench.fake_engine import Behaviour, serve
from tierkv.bench.engine import EngineSettings, run_engine, token_text
from tierkv.bench.prompts import PromptMaker

QUIET = Console(quiet=True)


def settings(url: str, **kw: object) -> EngineSettings:
    base: dict[str, object] = {"lengths": (200,), "repeats": 1, "settle_s": 0.0, "max_tokens": 3}
    base.update(kw)
    return EngineSettings(url=url, **base)  # type: ignore[arg-type]


def test_ttft_is_time_to_first_streamed_token_not_to_the_end() -> None:
    b = Behaviour(cold_s=0.3, hot_s=0.02, restore_s=0.1, tail_s=0.5)
    with serve(b) as (url, engine):
        result = run_engine(settings(url), QUIET)
    assert result.ok, result.errors
    assert result.model == "fake-model" and result.api == "completions"
    assert result.evict_method == "POST /reset_prefix_cache"
    assert result.tokenizer == "engine /tokenize"
    (row,) = result.rows
    (cold,), (hot,), (restored,) = row.cold, row.hot, row.restored
    # the server sleeps cold_s before the first token and tail_s after it: TTFT sits in between
    assert b.cold_s <= cold.ttft_s < b.cold_s + b.tail_s
    assert cold.total_s >= b.cold_s + b.tail_s
    assert b.hot_s <= hot.ttft_s < b.hot_s + b.tail_s
    assert b.restore_s <= restored.ttft_s < b.restore_s + b.tail_s
    assert restored.ttft_s < cold.ttft_s
    assert cold.text == " w0 w1 w2" and cold.completion_tokens == 3
    # the prompt was counted with the engine's tokenizer, and served cold, hot, then from the cold tier
    assert row.prompt_tokens == 200
    paths = [p for p, _ in engine.log if p != "reset"]
    assert paths[-3:] == ["cold", "hot", "restore"]
    assert row.cached_tokens_restored == 200
    f = row.figures()
    assert f["speedup"] == pytest.approx(cold.ttft_s / restored.ttft_s)
    assert not any("not hit" in w for w in result.warnings)
    assert "sooner restored" in result.verdict and result.breakeven


def test_warns_when_the_cold_tier_is_not_hit() -> None:
    b = Behaviour(cold_s=0.25, hot_s=0.02, restore_s=0.1, tail_s=0.0, cold_tier=False)
    with serve(b) as (url, engine):
        result = run_engine(settings(url), QUIET)
    assert result.ok
    assert [p for p, _ in engine.log if p != "reset"][-1] == "cold"
    assert any("cold tier was probably not hit" in w for w in result.warnings)
    assert any("0 cached prompt tokens" in w for w in result.warnings)
    assert result.verdict.startswith("The cold tier was probably not hit")


def test_min_speedup_turns_the_warning_into_a_failure() -> None:
    b = Behaviour(cold_s=0.2, hot_s=0.02, tail_s=0.0, cold_tier=False)
    with serve(b) as (url, _):
        result = run_engine(settings(url, min_speedup=2.0), QUIET)
    assert not result.ok
    assert "below --min-speedup 2" in result.errors[0]


def test_without_a_reset_endpoint_a_flood_evicts_the_prompt() -> None:
    b = Behaviour(
        cold_s=0.2, hot_s=0.02, restore_s=0.05, tail_s=0.0, reset_endpoint=False, hot_capacity_tokens=500
    )
    with serve(b) as (url, engine):
        result = run_engine(settings(url, flood_tokens=1000, flood_prompt_tokens=200), QUIET)
    assert result.ok, result.errors
    assert result.evict_method == "flood of 1,000 tokens"
    paths = [p for p, _ in engine.log]
    assert "reset" not in paths
    assert paths.count("cold") >= 1 + 5  # the prompt, then five unrelated 200-token prompts
    assert paths[-1] == "restore"
    flood_prompts = [t for p, t in engine.log if p == "cold"][1:]
    assert len({t.split()[0] for t in flood_prompts}) == len(flood_prompts)  # all distinct


def test_chat_only_servers_are_detected_and_the_role_chunk_is_not_a_token() -> None:
    b = Behaviour(cold_s=0.3, hot_s=0.02, restore_s=0.05, tail_s=0.3, completions=False)
    with serve(b) as (url, _):
        result = run_engine(settings(url), QUIET)
    assert result.ok, result.errors
    assert result.api == "chat"
    (row,) = result.rows
    # the role-only chunk arrives at once; TTFT must wait for the first content
    assert row.cold[0].ttft_s >= b.cold_s
    assert row.cold[0].text == " w0 w1 w2"


def test_unreachable_engine_fails_cleanly() -> None:
    result = run_engine(settings("http://127.0.0.1:9"), QUIET)
    assert not result.ok
    assert "cannot connect to 127.0.0.1:9" in result.errors[0]
    assert result.verdict.startswith("FAIL")


def test_cli_engine_mode_writes_json_and_exits_zero(tmp_path: Path) -> None:
    with serve(Behaviour(cold_s=0.2, hot_s=0.01, restore_s=0.05, tail_s=0.0)) as (url, _):
        result = subprocess.run(
            [
                sys.executable, "-m", "tierkv", "bench", "engine", url + "/v1", "--tokens", "100,300",
                "--repeats", "1", "--settle", "0", "--json", "-",
            ],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["mode"] == "engine" and doc["ok"]
    assert doc["engine"]["model"] == "fake-model" and doc["engine"]["eviction"] == "POST /reset_prefix_cache"
    assert [r["tokens"] for r in doc["results"]] == [100, 300]
    for r in doc["results"]:
        assert r["cold_ttft_s"] > r["restored_ttft_s"] > 0 and r["speedup"] > 1
    be = doc["breakeven"]["restored via engine"]
    assert be["common_s"] > 0 and be["prefill_model"]["basis"].startswith(("a·n", "linear"))
    assert "streamed time to first token" in result.stderr


@pytest.mark.parametrize(
    ("event", "chat", "expected"),
    [
        ({"choices": [{"index": 0, "text": "Hi"}]}, False, "Hi"),
        ({"choices": [{"index": 0, "text": ""}]}, False, ""),
        ({"choices": [], "usage": {"prompt_tokens": 3}}, False, None),
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, True, None),
        ({"choices": [{"delta": {"role": "assistant", "content": "Hi"}}]}, True, "Hi"),
        ({"choices": [{"delta": {"content": ""}}]}, True, ""),
        ({"choices": [{"delta": {"reasoning_content": "hmm"}}]}, True, "hmm"),
        ({"choices": [{"delta": {}, "finish_reason": "length"}]}, True, ""),
        ({"choices": [{"delta": {}}]}, True, None),
    ],
)
def test_which_events_carry_a_token(event: dict[str, object], chat: bool, expected: str | None) -> None:
    assert token_text(event, chat) == expected


def test_prompts_are_varied_unique_and_sized_by_the_counter() -> None:
    maker = PromptMaker(seed=3, count=lambda text: len(text.split()))
    first, second = maker.prompt(500), maker.prompt(500)
    assert len(first.split()) == 500 and len(second.split()) == 500
    assert first.split()[0] != second.split()[0]  # no shared prefix
    sentences = [s.strip() for s in first.split(".") if s.strip()]
    assert len(set(sentences)) > 0.9 * len(sentences)  # not one sentence repeated
    estimated = PromptMaker(seed=3)
    estimated.observe(words=100, tokens=150)
    assert len(estimated.prompt(300).split()) == 200


def test_evict_none_says_once_that_restored_is_a_hot_hit() -> None:
    b = Behaviour(cold_s=0.05, hot_s=0.01, restore_s=0.02, tail_s=0.0)
    with serve(b) as (url, engine):
        result = run_engine(settings(url, lengths=(100, 200), evict="none"), QUIET)
    assert result.ok, result.errors
    assert "reset" not in [p for p, _ in engine.log] and result.evict_method == ""
    assert [r.tokens for r in result.rows] == [100, 200]
    assert result.warnings.count("--evict none: 'restored' is just another hot hit") == 1
