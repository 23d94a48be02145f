"""The link emulator with real namespaces, a real vault behind a shaped veth and the real command.

Needs root (network namespaces, tc); skipped with the reason otherwise. The refusal without privileges is
tested for real, by running the command as an unprivileged user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tierkv.bench.link.netns import namespaces

ROOT = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
needs_root = pytest.mark.skipif(not ROOT, reason="the link emulator needs root and iproute2 (ip, tc)")
pytestmark = pytest.mark.slow


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tierkv", "bench", "synthetic", *args]


def _own(pid: int) -> list[str]:
    return [name for name in namespaces() if name.startswith(f"tkvlink{pid}")]


@needs_root
def test_a_run_over_the_link_reaches_a_vault_behind_the_veth_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    out = tmp_path / "link.json"
    proc = subprocess.Popen(
        _command(
            "--link", "1gbit,1ms", "--tokens", "64", "--repeats", "1", "--batch-mib", "0.5",
            "--overlap", "both", "--json", str(out),
        ),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    doc = json.loads(out.read_text())
    assert doc["ok"] is True
    assert doc["settings"]["link"]["rate_bps"] == 10**9 and doc["settings"]["link"]["rtt_s"] == 0.001
    assert doc["vaults"]["addresses"] == {"kv_cold": [doc["vaults"]["addresses"]["kv_cold"][0]]}
    assert doc["vaults"]["addresses"]["kv_cold"][0].startswith("10.213.0.1:")
    contenders = {(c["codec"], c["overlapped"]) for c in doc["results"]}
    assert contenders == {("raw", False), ("int8", True), ("int8", False)}
    assert all(c["complete"] for c in doc["results"])
    # one repeat of 4 blocks: lookup and one get, each after a round trip of 1 ms
    assert all(c["restore_s"][0] >= 0.002 for c in doc["results"])
    assert "over an emulated link: 1 gbit/s, 1 ms RTT" in output
    assert _own(proc.pid) == []


@needs_root
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_stops_its_vault_and_removes_the_namespaces(
    tmp_path: Path, signum: signal.Signals
) -> None:
    proc = subprocess.Popen(
        _command("--link", "1gbit", "--tokens", "32k", "--repeats", "20", "--max-seconds", "120"),
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # SIGINT as a terminal's Ctrl-C delivers it: a suite started in the background inherits an
        # ignored SIGINT (which Python keeps ignoring), so the run gets the default disposition back
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        vaults: list[int] = []
        while time.monotonic() < deadline and not vaults:  # until the vault serves inside the namespace
            vaults = _vaults_in(f"tkvlink{proc.pid}v")
            time.sleep(0.1)
        assert vaults, "no vault came up in the link's namespace"
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"still running 120 s after {signum.name}: {_diagnose(proc.pid)}\n{exc.stderr!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert _own(proc.pid) == []
    for pid in vaults:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"vault {pid} outlived the run"


def _diagnose(pid: int) -> str:
    """Signal masks and where each thread waits, for a run that did not stop."""
    task = Path(f"/proc/{pid}/task")
    status = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Sig")]
    threads = [
        f"{t.name} {(t / 'comm').read_text().strip()} {(t / 'wchan').read_text()}" for t in task.iterdir()
    ]
    return "; ".join(status + threads)


def _vaults_in(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_without_privileges_the_command_refuses_in_one_line() -> None:
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with tempfile.TemporaryDirectory(dir="/tmp") as home:  # pytest's are not reachable for another user
        Path(home).chmod(0o777)
        done = subprocess.run(
            [*nobody, *_command("--link", "5gbe", "--tokens", "32", "--repeats", "1")],
            cwd=home, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": home},
        )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "--link needs root" in lines[0], lines


def test_a_bad_link_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        _command("--link", "5gigabit", "--tokens", "32"), cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--link: expected RATE[,RTT]" in done.stdout + done.stderr


def test_hf_takes_a_rate_only(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tierkv", "bench", "hf", "--link", "5gbit,1ms", "--tokens", "32"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--link: hf takes a rate only" in done.stdout + done.stderr
