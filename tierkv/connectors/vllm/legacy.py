"""tierkv 0.1's inline ``kv_connector_extra_config`` keys, mapped onto today's, so a 0.1 launch line starts.

0.1 named each vault by two keys and compression by a flag; the TOML loader already maps 0.1's file
(:data:`tierkv.config.OBSOLETE`). Here, as there: what has a successor is translated
(``kv_cold_host`` + ``kv_cold_port`` → ``kv_cold``, ``turbo_quant`` → ``codec``), what has none is dropped,
each with one warning saying why. Mixing a 0.1 key with the key that replaced it is an error, never a guess.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tierkv.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_PORT = 50051
"""0.1's vault port when a launch line named only the host (as today's vault default)."""

DROPPED = {
    "kv_dim": "blobs are self-describing (each header carries its shape); remove the key",
    "block_size": "the block size is vLLM's own (--block-size); remove the key",
    "max_inflight_promotes": "restores run on load_threads (default 2) and are bounded by vLLM's own "
    "scheduling; remove the key",
}
ADDRESSES = ("kv_cold", "ssm_cold")


def migrate_extra(extra: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``extra`` with 0.1's keys replaced by today's (one warning each); other keys untouched."""
    out = dict(extra)
    for role in ADDRESSES:
        host, port = out.pop(f"{role}_host", None), out.pop(f"{role}_port", None)
        if host is None and port is None:
            continue
        if role in out:
            raise ConfigError(source, f"{role}_host", f"give {role} or 0.1's {role}_host/_port, not both")
        if host is None:
            raise ConfigError(source, f"{role}_port", f"{role}_port without {role}_host")
        bracketed = f"[{host}]" if ":" in str(host) else str(host)
        out[role] = address = f"{bracketed}:{DEFAULT_PORT if port is None else port}"
        logger.warning('%s: %s_host/_port are tierkv 0.1 keys: using "%s": "%s"', source, role, role, address)
    if "turbo_quant" in out:
        out.update(_codec(out.pop("turbo_quant"), out, source))
    for key, why in DROPPED.items():
        if key in out:
            del out[key]
            logger.warning("%s: %s: tierkv 0.1 key, ignored: %s", source, key, why)
    return out


def _codec(flag: Any, extra: Mapping[str, Any], source: str) -> dict[str, str]:
    """``turbo_quant`` (0.1's int8 switch) as ``codec``."""
    if not isinstance(flag, bool):
        raise ConfigError(source, "turbo_quant", f"expected true or false, got {flag!r}")
    if "codec" in extra:
        raise ConfigError(source, "turbo_quant", "give codec or 0.1's turbo_quant, not both")
    codec = "int8" if flag else "raw"
    logger.warning('%s: turbo_quant is a tierkv 0.1 key: using "codec": "%s"', source, codec)
    return {"codec": codec}


__all__ = ["DROPPED", "migrate_extra"]
