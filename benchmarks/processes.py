"""Server processes a benchmark starts for itself and stops by their PID on the way out."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence


@contextlib.contextmanager
def started(
    args: Sequence[str], *, stdin: bool = False, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``args`` running with its stdout piped (and its stdin, when it is driven a line at a time; ``env``
    its whole environment, where given); on the way out its stdin is closed, then SIGTERM, then SIGKILL
    after 10 s."""
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=None if env is None else dict(env),
    )
    try:
        yield proc
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port(host: str) -> int:
    """A port free on ``host`` now, for a server on loopback that must be told its port (beside other
    runs on the machine); in a network namespace of the run's own, a fixed port is free."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
