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


@pytest.mark.parametrize("codec", [False, True])
def test_help_lists_our_flags_and_leaves_the_help_flag_for_the_engine(
    codec: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tierkv llama-serve --help`` / ``mlx-serve --help`` show tierkv's flags, then the engine's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tierkv.toml").write_text("[cluster\n")  # a broken file does not hide the help
    argv = ["--model", "m", "--help"]
    ours, rest, _ = parse_launcher_args(launcher_parser(codec=codec), argv, "mlx_lm.server")
    assert rest == ["--model", "m", "--help"]
    out = capsys.readouterr().out
    assert "every other flag is mlx_lm.server's" in out
    for flag in ("--tierkv-config PATH", "--tierkv-block-size N", "--tierkv-tenant NAME"):
        assert flag in out
    assert ("--tierkv-codec {raw,int8}" in out) is codec
    assert ours.tierkv_block_size == 16
