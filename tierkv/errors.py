"""The one exception tree of tierkv.

Everything tierkv raises on purpose derives from :class:`TierKVError`. gRPC status codes are mapped to
these classes once, at the client boundary (``tierkv.client``); nothing above that layer ever sees a
``grpc.RpcError``. The engine hooks catch :class:`VaultUnavailable` (and its parent
:class:`VaultError`) and turn it into a cache miss, so a vault failure never reaches the serving path.

::

    TierKVError
    ├── ConfigError            malformed tierkv.toml / flags: names file, key and what was expected
    │   └── TokenFileError     a token file the vault cannot use: names file and line
    ├── BenchError             a benchmark cannot start or go on (no vaults, engine silent, bad setting)
    ├── CodecError             a blob cannot be encoded or decoded
    │   └── CorruptBlobError   header or checksum does not verify: never restore, recompute instead
    ├── UnsupportedStateError  an engine's saved state is in a layout tierkv does not know: refused
    └── VaultError             a vault call failed
        ├── VaultUnavailable   unreachable, deadline exceeded, shutting down, circuit open: a miss
        ├── AuthError          the vault refused our token (UNAUTHENTICATED / PERMISSION_DENIED)
        ├── ResourceExhausted  a message or batch over a limit, or the vault's disk full (RESOURCE_EXHAUSTED)
        └── InvalidRequest     the vault rejected the request as malformed (INVALID_ARGUMENT)
"""

from __future__ import annotations


class TierKVError(Exception):
    """Base class of every error tierkv raises on purpose."""


class ConfigError(TierKVError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(f"{source}: {key}: {problem}")


class TokenFileError(ConfigError):
    """A token file the vault refuses: ``file:line: problem`` (line 0: the file as a whole)."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        where = f"{path}:{line}" if line else path
        TierKVError.__init__(self, f"{where}: {problem}")
        self.source, self.key, self.problem = path, f"line {line}" if line else "", problem


class BenchError(TierKVError):
    """A bench run cannot start or go on: no vaults, an engine that does not answer, a bad setting."""


class CodecError(TierKVError):
    """A blob could not be encoded or decoded."""


class CorruptBlobError(CodecError):
    """A blob's header or payload checksum does not verify; the block must be recomputed."""


class UnsupportedStateError(TierKVError):
    """An engine's saved state (llama.cpp's sequence state) is in a version or layout tierkv does not
    read: it is refused, never guessed at."""


class VaultError(TierKVError):
    """A call to a vault failed. ``address`` names the vault, ``code`` the gRPC status name if any."""

    def __init__(self, message: str, *, address: str = "", code: str = "") -> None:
        self.address = address
        self.code = code
        prefix = f"vault {address}: " if address else ""
        super().__init__(f"{prefix}{message}")


class VaultUnavailable(VaultError):
    """The vault could not answer in time (down, unreachable, deadline, draining, breaker open)."""


class AuthError(VaultError):
    """The vault refused the call's credentials."""


class ResourceExhausted(VaultError):
    """A message or batch exceeds a configured size limit, or the vault cannot make room on disk."""


class InvalidRequest(VaultError):
    """The vault rejected the request as malformed."""


__all__ = [
    "AuthError",
    "BenchError",
    "CodecError",
    "ConfigError",
    "CorruptBlobError",
    "InvalidRequest",
    "ResourceExhausted",
    "TierKVError",
    "UnsupportedStateError",
    "VaultError",
    "VaultUnavailable",
]
