"""Whether a PEM certificate file is valid now: an expired certificate is refused before anything starts.

A vault that starts with an expired certificate serves nothing a verifying client accepts, and each
client's error ("handshake failed") points away from the cause, so ``tierkv vault`` and ``tierkv config
check`` read the validity dates of the configured certificates first. The dates are read with the standard
library's own certificate decoder (the one ``ssl`` uses for peer certificates), so no crypto package is
needed; where the running Python lacks it, the check is skipped rather than guessed.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_decode: Callable[[str], dict[str, Any]] | None = getattr(
    getattr(ssl, "_ssl", None), "_test_decode_cert", None
)


def certificate_problem(path: str | Path, now: float | None = None) -> str | None:
    """Why the first certificate in ``path`` is not valid at ``now`` (default: now), else None."""
    if _decode is None:
        return None
    try:
        fields = _decode(str(path))
        not_before = ssl.cert_time_to_seconds(fields["notBefore"])
        not_after = ssl.cert_time_to_seconds(fields["notAfter"])
    except (ssl.SSLError, KeyError, ValueError, OSError) as exc:
        return f"not a readable PEM certificate ({exc})"
    t = time.time() if now is None else now
    if t > not_after:
        return f"the certificate expired on {fields['notAfter']}"
    if t < not_before:
        return f"the certificate is not valid before {fields['notBefore']}"
    return None


__all__ = ["certificate_problem"]
