"""A shaped link between two network namespaces, made and unmade by the bench run that needs it.

The vault side and the engine side each get a network namespace of their own, joined by one veth pair
(``10.213.0.1`` vault, ``10.213.0.2`` engine, a /30 that exists only inside those namespaces, so it can
clash with nothing on the machine). Each end's egress is shaped by an ``htb`` class to the link's rate,
so both directions (Puts and restores) see it. Vaults are started inside the vault namespace (``ip netns
exec``, which execs, so the PID signalled is the vault's); the bench process moves its *main thread* into
the engine namespace, so every socket it and the threads it starts afterwards open (gRPC's and the bulk
port's) crosses the veth. A socket opened from a thread started before that stays in the original
namespace and cannot reach the vault's address at all: such a mistake fails loudly, never silently.

What the emulation models: a line rate in each direction with a shallow queue (as a switch port does),
and, given a round trip, that round trip once per request (:meth:`LinkSpec.round_trip`, which the bench calls
before each request it sends: a wait in the requesting thread, so it overlaps whatever else runs). What
it does not: propagation delay of individual packets (``netem`` is not available; ``tbf``/``htb``
only queue), so TCP's congestion window never waits on ACKs from a distant peer (slow start after idle,
a window below the bandwidth-delay product); loss, reordering, jitter; a NIC's offloads and interrupts
(veth copies in the kernel, on the same two cores as everything else); and another machine's CPU: the
vault still shares this machine's cores with the engine side.

Cleanup is guaranteed for anything short of SIGKILL: the namespaces go in ``finally`` (Ctrl-C, SIGTERM
and SIGHUP become exceptions while a link is up, so they unwind through it), with signals blocked while
they go. Namespaces named after a process that no longer runs (one SIGKILLed mid-run) are removed by
the next run that sets up a link.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from tierkv.bench.link.spec import LinkSpec
from tierkv.errors import BenchError

logger = logging.getLogger(__name__)

VAULT_HOST = "10.213.0.1"
ENGINE_HOST = "10.213.0.2"
_PREFIX_LEN = 30
_NS_DIR = Path("/run/netns")
_NAME = re.compile(r"^tkvlink(\d+)([ve])$")
_CLONE_NEWNET = 0x40000000
_COMMAND_TIMEOUT_S = 10.0
_BURST_S = 0.001
_MIN_BURST = 256 * 1024
"""A class may send up to 1 ms of its rate (at least 256 KiB: four of veth's 64 KiB GSO packets) at once:
what a switch port's buffer lets through, and enough that the kernel's timer granularity does not hold
the rate below the one asked for."""
_HTB_QUANTUM = 200_000
"""Bytes a class may send per round: large enough for veth's 64 KiB GSO packets at 25 Gbit/s."""


def _names(pid: int) -> tuple[str, str]:
    return f"tkvlink{pid}v", f"tkvlink{pid}e"


def check_privileges() -> None:
    """Raise :class:`BenchError` (one line) unless this process can make namespaces and shape links."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise BenchError(f"--link needs the {' and '.join(missing)} command (iproute2); install it")
    if os.geteuid() != 0:
        raise BenchError(
            "--link needs root (it creates network namespaces and shapes a veth pair with tc); "
            "run the bench as root, or without --link"
        )


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise BenchError(f"--link: `ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def _tc(ns: str, *args: str) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", *args],
        capture_output=True,
        text=True,
        timeout=_COMMAND_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"--link: `tc {' '.join(args)}` failed: {done.stderr.strip()}")


def namespaces() -> list[str]:
    """The names ``ip netns`` knows (first word of each line)."""
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Remove the namespaces of link runs whose process is gone; the names removed."""
    stale = [name for name in namespaces() if (m := _NAME.match(name)) and not _alive(int(m.group(1)))]
    for name in stale:
        _ip("netns", "del", name, check=False)
    return stale


class Link:
    """A link that is up: where vaults go, how to start them there, and the engine side to enter."""

    def __init__(self, spec: LinkSpec, pid: int) -> None:
        self.spec = spec
        self.vault_ns, self.engine_ns = _names(pid)
        self.vault_host = VAULT_HOST
        self.engine_host = ENGINE_HOST

    @property
    def vault_prefix(self) -> tuple[str, ...]:
        """Put before a command to run it on the vault side (``ip netns exec`` execs: same PID)."""
        return ("ip", "netns", "exec", self.vault_ns)

    @property
    def engine_prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.engine_ns)

    @contextlib.contextmanager
    def engine_side(self) -> Iterator[None]:
        """Run the calling thread (and the threads it starts meanwhile) in the engine namespace."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(_NS_DIR / self.engine_ns)
            try:
                yield
            finally:
                _setns_fd(own)
        finally:
            os.close(own)

    def describe(self) -> dict[str, object]:
        return {
            **self.spec.as_dict(),
            "vault": self.vault_host,
            "engine": self.engine_host,
            "shaping": f"htb {self.spec.tc_rate} on each veth end's egress",
            "round_trip": "waited once per request by the bench" if self.spec.rtt_s else "none",
        }


def _setns(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns_fd(fd)
    finally:
        os.close(fd)


def _setns_fd(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise BenchError(f"--link: cannot enter the network namespace: {os.strerror(err)}")


def _build(link: Link) -> None:
    """Namespaces, the veth pair (created inside them: it never appears in the host's), addresses and
    the shaping of both ends."""
    v, e = link.vault_ns, link.engine_ns
    _ip("netns", "add", v)
    _ip("netns", "add", e)
    _ip("link", "add", "tkv0", "netns", v, "type", "veth", "peer", "name", "tkv0", "netns", e)
    for ns, host in ((v, link.vault_host), (e, link.engine_host)):
        _ip("-n", ns, "addr", "add", f"{host}/{_PREFIX_LEN}", "dev", "tkv0")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", "tkv0", "up")
        _shape(ns, link.spec)


def _shape(ns: str, spec: LinkSpec) -> None:
    rate = spec.tc_rate
    burst = max(_MIN_BURST, round(spec.bytes_per_s * _BURST_S))
    _tc(ns, "qdisc", "add", "dev", "tkv0", "root", "handle", "1:", "htb", "default", "1")
    _tc(
        ns, "class", "add", "dev", "tkv0", "parent", "1:", "classid", "1:1", "htb",
        "rate", rate, "ceil", rate, "quantum", str(_HTB_QUANTUM),
        "burst", str(burst), "cburst", str(burst),
    )  # fmt: skip


def _teardown(link: Link) -> list[str]:
    """Remove the veth and both namespaces, best effort: what could not be removed, in words."""
    problems = []
    _ip("-n", link.vault_ns, "link", "del", "tkv0", check=False)  # takes its peer with it
    for ns in (link.vault_ns, link.engine_ns):
        done = _ip("netns", "del", ns, check=False)
        if done.returncode != 0 and ns in namespaces():
            problems.append(f"{ns}: {done.stderr.strip()}")
    return problems


class _Interrupted(BaseException):
    """SIGTERM or SIGHUP while a link is up: unwinds like Ctrl-C does, through the teardown."""


def _raise_on_signal(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def _signals_unwind(signums: Sequence[signal.Signals]) -> Iterator[None]:
    old = {s: signal.signal(s, _raise_on_signal) for s in signums}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def link_emulator(spec: LinkSpec) -> Iterator[Link]:
    """Set up the link, yield it, tear it down whatever happened (and say so if something stayed).

    Call from the main thread (signal handlers are installed for the link's lifetime)."""
    check_privileges()
    for name in remove_stale():
        logger.warning("removed a namespace left by a link run that no longer runs: %s", name)
    link = Link(spec, os.getpid())
    unwind = (signal.SIGTERM, signal.SIGHUP)
    with _signals_unwind(unwind):
        try:
            _build(link)
            logger.info("link up: %s between %s and %s", spec.label(), link.vault_ns, link.engine_ns)
            yield link
        except _Interrupted as exc:
            raise KeyboardInterrupt(str(exc)) from None
        finally:
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, *unwind})
            try:
                problems = _teardown(link)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            for problem in problems:
                logger.warning("link teardown left a namespace behind: %s", problem)


__all__ = [
    "ENGINE_HOST",
    "VAULT_HOST",
    "Link",
    "check_privileges",
    "link_emulator",
    "namespaces",
    "remove_stale",
]
