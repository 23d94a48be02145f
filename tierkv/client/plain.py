"""gRPC's transport errors in a sentence an operator can act on.

gRPC's C core reports a failed connection as ``failed to connect to all addresses; last error: UNKNOWN:
ipv4:127.0.0.1:50051: Failed to connect to remote host: Connection refused``, and a plaintext client that
meets a TLS vault sees nothing but ``Socket closed``. The one-line errors of the command line and the
client's exceptions carry what such a message means instead; a message this module does not recognise is
kept, only without the C core's address prefix.
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^failed to connect to all addresses; last error: \w+: (?:ipv[46]:|unix:)?\S+?: ")
_KNOWN = (
    (re.compile(r"Connection refused", re.I), "connection refused: no vault listens there"),
    (
        re.compile(r"^Socket closed$|Connection reset by peer", re.I),
        "the vault closed the connection during the handshake: a vault with TLS on needs [tls] on this "
        "side too (ca_file)",
    ),
    (
        re.compile(r"SSL_ERROR|handshake failed|WRONG_VERSION_NUMBER", re.I),
        "the TLS handshake failed: check [tls] on both sides (a vault without TLS, an unknown CA, a "
        "certificate without this address, or an expired one)",
    ),
    (
        re.compile(r"timed out before receiving SETTINGS frame|Deadline Exceeded", re.I),
        "no answer within the deadline (a vault starting, stalled or overloaded, or TLS on this side only)",
    ),
    (re.compile(r"DNS resolution failed|name resolution", re.I), "the host name does not resolve"),
)


def plain_details(details: str) -> str:
    """``details`` of a gRPC status, said plainly (unchanged when it is not a transport message)."""
    stripped = _PREFIX.sub("", details.strip())
    for pattern, sentence in _KNOWN:
        if pattern.search(stripped):
            return sentence
    return stripped


__all__ = ["plain_details"]
