"""Run a vault as a child process (for the demo, the self-hosting bench and the tests).

The child is a real ``tierkv vault`` process; readiness is the ready file it writes once it serves, so no
port is guessed and no sleep is needed. Only the process started here is ever signalled, by its PID.

The child imports tierkv without the working directory on ``sys.path`` (``python -m tierkv`` would put
it first, and a folder named ``tierkv`` there, such as a state directory, would shadow the package).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tierkv.vault.auth import ALLOW_OPEN_ENV

TIERKV_COMMAND = (
    sys.executable,
    "-c",
    "import sys\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "from tierkv.cli import run\n"
    "run(prog_name='tierkv')",
)
"""``tierkv`` as a child process: the installed command's entry point in this interpreter, the working
directory (``-c`` puts ``''`` first on ``sys.path``) taken off the import path before tierkv is imported."""


def terminate(proc: subprocess.Popen[bytes], timeout: float, sig: int = signal.SIGTERM) -> int:
    """``sig`` (SIGTERM) to a child started here and wait; SIGKILL after ``timeout``. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class VaultProcess:
    def __init__(
        self,
        path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_bytes: str | int = "1GiB",
        role: str = "kv_cold",
        sync: str = "durable",
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_file: str | Path | None = None,
        prefix: Sequence[str] = (),
        allow_open: bool = False,
    ) -> None:
        """``prefix`` goes before the command (``ip netns exec NS`` runs the vault in a network namespace;
        it must exec the vault, so that the PID signalled is the vault's). ``allow_open``: the vault may
        run without a token on a ``host`` beyond loopback (a namespace nothing else reaches)."""
        self.path = Path(path)
        self.host = host
        self.port = port
        self.args = [
            *prefix,
            *TIERKV_COMMAND,
            "vault",
            "--host",
            host,
            "--port",
            str(port),
            "--path",
            str(self.path),
            "--max-bytes",
            str(max_bytes),
            "--role",
            role,
            "--sync",
            sync,
            *extra_args,
        ]
        self.env = {**os.environ, **({ALLOW_OPEN_ENV: "1"} if allow_open else {}), **(env or {})}
        self.log_file = Path(log_file) if log_file else self.path.parent / f"{self.path.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> VaultProcess:
        self.path.mkdir(parents=True, exist_ok=True)
        ready = self.path.parent / f"{self.path.name}.ready"
        ready.unlink(missing_ok=True)
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.args, "--ready-file", str(ready)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready.exists():
                self.port = int(ready.read_text().strip())
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vault exited with {self.proc.returncode} at start-up:\n{self.log_tail()}"
                )
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"vault not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit status (SIGKILL after ``timeout``)."""
        return 0 if self.proc is None else terminate(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL: the crash case (nothing is flushed by the vault)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> VaultProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
