"""``tierkv bench MODE``: each subcommand takes only its own options; the old flag spelling still runs
(one release) and says the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer.main

from tests.bench.fake_engine import Behaviour, serve
from tests.bench.test_synthetic import bench
from tierkv.bench.cli import bench_app, legacy_args

COMMANDS = typer.main.get_group(bench_app).commands
NOTE = "note: modes as flags are deprecated"


@pytest.mark.parametrize(
    ("old", "new", "dropped"),
    [
        (["--tokens", "64"], ["synthetic", "--tokens", "64"], []),
        (
            ["--hf", "--shape", "llama3-8b", "--device=cuda"],
            ["hf", "--shape", "llama3-8b", "--device=cuda"],
            [],
        ),
        (
            ["--engine-api", "http://e:8000", "-vv", "--tokens", "1k", "--settle", "0"],
            ["engine", "http://e:8000", "-vv", "--tokens", "1k", "--settle", "0"],
            [],
        ),
        (["--engine-api=http://e", "--json", "-"], ["engine", "http://e", "--json", "-"], []),
        (
            ["--exo-api", "http://exo:52415", "--tokens", "1k"],
            ["engine", "http://exo:52415", "--tokens", "1k"],
            [],
        ),
        (
            ["--codec", "raw", "--hf", "--batch-mib", "4", "--prefill-tps=900", "--tokens", "64"],
            ["hf", "--codec", "raw", "--tokens", "64"],
            ["--batch-mib", "4", "--prefill-tps=900"],
        ),
        (
            ["--engine-api", "http://e", "--vaults", "local", "--state-dir", "/x", "--evict", "none"],
            ["engine", "http://e", "--evict", "none"],
            ["--vaults", "local", "--state-dir", "/x"],
        ),
        (
            ["--vaults", "config", "--nonsense", "1"],
            ["synthetic", "--vaults", "config", "--nonsense", "1"],
            [],
        ),
    ],
)
def test_old_flags_map_onto_the_subcommands(old: list[str], new: list[str], dropped: list[str]) -> None:
    assert legacy_args(old, COMMANDS) == (new, dropped)


@pytest.mark.parametrize(
    ("old", "error"),
    [
        (["--hf", "--engine-api", "http://e"], "separate modes"),
        (["--tokens", "64", "--engine-api"], "needs a URL"),
        (["--exo-api"], "--exo-api needs a URL"),
    ],
)
def test_contradictory_old_flags_are_refused(old: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        legacy_args(old, COMMANDS)


def test_bench_help_lists_the_modes_not_26_options(tmp_path: Path) -> None:
    result = bench("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert all(mode in result.stdout for mode in ("synthetic", "hf", "engine"))
    assert "--batch-mib" not in result.stdout and "--engine-api" not in result.stdout
    engine = bench("engine", "--help", cwd=tmp_path)
    assert "--flood-tokens" in engine.stdout and "--batch-mib" not in engine.stdout
    assert "--use-config-vaults" not in engine.stdout  # the engine's own connector picks its vaults


def test_bare_bench_is_synthetic(tmp_path: Path) -> None:
    # a broken config is read by the mode, not the group: bare `tierkv bench` reached `synthetic`
    toml = tmp_path / "tierkv.toml"
    toml.write_text('[log]\nlevel = "loud"\n')
    bare, new = bench(cwd=tmp_path), bench("synthetic", cwd=tmp_path)
    assert bare.returncode == new.returncode == 2
    assert "config error" in bare.stderr and "log.level" in bare.stderr
    assert bare.stderr == new.stderr  # no deprecation note for the bare command


def test_old_synthetic_spelling_runs_and_names_the_new_one(tmp_path: Path) -> None:
    result = bench("--tokens", "32", "--repeats", "1", "--codec", "raw", "--json", "-", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # the note goes to stderr: stdout stays JSON
    assert doc["mode"] == "synthetic" and doc["ok"] and doc["settings"]["lengths"] == [32]
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith(NOTE)]
    assert line.endswith("use: tierkv bench synthetic --tokens 32 --repeats 1 --codec raw --json -")


def test_engine_mode_old_and_new_spelling(tmp_path: Path) -> None:
    common = ["--tokens", "100", "--repeats", "1", "--settle", "0", "--json", "-"]
    with serve(Behaviour(cold_s=0.2, hot_s=0.01, restore_s=0.05, tail_s=0.0)) as (url, _):
        new = bench("engine", url + "/v1", *common, cwd=tmp_path)
        old = bench("--engine-api", url + "/v1", *common, "--codec", "int8", cwd=tmp_path)
    for result in (new, old):
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["mode"] == "engine" and doc["ok"] and [r["tokens"] for r in doc["results"]] == [100]
    assert NOTE not in new.stderr
    (line,) = [ln for ln in old.stderr.splitlines() if ln.startswith(NOTE)]
    assert f"use: tierkv bench engine {url}/v1 --tokens 100" in line
    assert line.endswith("(dropped --codec int8: not used by engine)")


def test_old_hf_spelling_reaches_the_hf_mode(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    result = bench("--hf", "--shape", "qwen3.6-35b-a3b", cwd=tmp_path)
    assert result.returncode == 2 and "hybrid" in result.stderr  # hf's own check, before any model
    assert "use: tierkv bench hf --shape qwen3.6-35b-a3b" in result.stderr


def test_options_of_another_mode_are_refused_by_the_subcommands(tmp_path: Path) -> None:
    result = bench("engine", "http://127.0.0.1:9", "--codec", "raw", cwd=tmp_path)
    assert result.returncode == 2 and "--codec" in result.stderr
    assert bench("synthetic", "--device", "cpu", cwd=tmp_path).returncode == 2
    assert bench("hf", "--hf", cwd=tmp_path).returncode == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--vaults", "kv_cold=nohost"], "expected host:port (IPv6 as [addr]:port), got 'nohost'"),
        (["--tokens", "4k,abc"], "--tokens: expected lengths like 512,4k,16k (k = 1024), got 'abc'"),
    ],
)
def test_a_bad_option_is_one_line_that_says_what_was_expected(
    tmp_path: Path, args: list[str], says: str
) -> None:
    result = bench("synthetic", *args, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert says in result.stderr, result.stderr
