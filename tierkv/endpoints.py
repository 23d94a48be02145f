"""Host and port, parsed and printed in one place (IPv6 literals included).

``HostPort.parse("[::1]:50051")`` and ``HostPort("::1", 50051).address == "[::1]:50051"``; the bare host
(no brackets) is what sockets bind and connect to.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket


@dataclasses.dataclass(frozen=True)
class HostPort:
    """A TCP endpoint. ``host`` is stored bare: ``::1``, never ``[::1]``."""

    host: str
    port: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "host", bare_host(self.host))

    @classmethod
    def parse(cls, text: str, *, allow_zero: bool = False) -> HostPort:
        """``host:port`` or ``[v6]:port``; ValueError saying what was expected otherwise."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected host:port (IPv6 as [addr]:port), got {text!r}")
        if host.count(":") and not (host.startswith("[") and host.endswith("]")):
            raise ValueError(f"an IPv6 host needs brackets, as in [{host}]:{port}; got {text!r}")
        number = int(port)
        check_port(number, allow_zero=allow_zero)
        return cls(host, number)

    @property
    def address(self) -> str:
        """``host:port`` as gRPC and people write it (``[::1]:50051`` for IPv6)."""
        return join_host_port(self.host, self.port)

    def __str__(self) -> str:
        return self.address


def bare_host(host: str) -> str:
    """``[::1]`` → ``::1``; other hosts unchanged."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def join_host_port(host: str, port: int) -> str:
    """``host:port``, bracketing an IPv6 literal."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_port(port: int, *, allow_zero: bool = False) -> int:
    """``port`` if it is a TCP port (0 = "pick a free one" only when ``allow_zero``)."""
    low = 0 if allow_zero else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        raise ValueError(f"expected a port in {low}..65535, got {port!r}")
    return port


def host_problem(host: str) -> str:
    """What is wrong with ``host`` as a bare host name or address ('' if nothing). A port, a scheme or a
    path in it would otherwise pass every check and fail only at the first call, as a name lookup error."""
    bare = bare_host(host)
    if not bare.strip():
        return "expected a host name or address, got ''"
    if "/" in bare or any(c.isspace() for c in bare):
        return f"expected a host name or address (no scheme, path or spaces), got {host!r}"
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            port = bare.rpartition(":")[2]
            return (
                f"expected a host name or address without a port, got {host!r} (port = {port} is its own key)"
            )
    return ""


def bind_problem(host: str, port: int) -> str:
    """Why binding ``host:port`` fails right now ('' if it would not), as the OS says it ("Address already
    in use"). The probe socket is closed at once; ``socket.gaierror`` when ``host`` does not resolve."""
    infos = socket.getaddrinfo(bare_host(host), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no matter
        try:
            probe.bind(address)
        except OSError as exc:
            return str(exc.strerror or exc)
    return ""


__all__ = ["HostPort", "bare_host", "bind_problem", "check_port", "host_problem", "join_host_port"]
