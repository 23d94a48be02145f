"""The ``--tierkv-*`` flags of the engine-server launchers: ours are taken, the engine's passed on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tierkv.connectors.launcher_flags import launcher_parser, parse_launcher_args


def test_our_flags_are_taken_and_the_engines_passed_on(tmp_path: Path) -> None:
    config = tmp_path / "tierkv.toml"
    config.write_text('[cluster]\ntimeout = 3.5\n[cluster.kv_cold]\nhost = "127.0.0.1"\nport = 50051\n')
    argv = [
        "--tierkv-config",
        str(config),
        "--model",
        "m.gguf",
        "--tierkv-block-size",
        "32",
        "--port",
        "8000",
    ]
    ours, rest, loaded = parse_launcher_args(launcher_parser(), argv)
    assert (ours.tierkv_block_size, ours.tierkv_tenant) == (32, "")
    assert rest == ["--model", "m.gguf", "--port", "8000"]
    assert loaded.cluster.timeout == 3.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tierkv-config", "missing.toml"], "config error: "),
        (["--tierkv-block-size", "0"], "--tierkv-block-size must be >= 1, got 0"),
    ],
)
def test_a_bad_file_or_block_size_is_one_line_and_exit_2(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        parse_launcher_args(launcher_parser(), argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
