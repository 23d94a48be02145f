"""tierkv 0.1 files: the keys that are gone are accepted with one warning each, or carried over."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tierkv.config.coerce import describe
from tierkv.errors import ConfigError

log = logging.getLogger("tierkv.config")


OBSOLETE = {
    "cluster.recompute": "tierkv 0.2 has no recompute node: the engine recomputes what the vaults miss; "
    "remove the table",
    "inference.exo_path": "the EXO hook runs inside EXO's own environment (pip install tierkv there); "
    "remove the key",
    "inference.log_file": "replaced by [log] file (honoured)",
    "inference.memory_threshold": "replaced by [vault] max_bytes on each vault (a byte budget) and the "
    "engine's own KV memory setting",
    "inference.kv_dim": "blobs are self-describing (each header carries its shape); remove the key",
}


def migrate(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Drop the 0.1 keys with one warning each, carrying ``inference.log_file`` over to ``[log] file``."""
    out = dict(data)
    cluster = out.get("cluster")
    if isinstance(cluster, Mapping) and "recompute" in cluster:
        out["cluster"] = {k: v for k, v in cluster.items() if k != "recompute"}
        log.warning("%s: cluster.recompute: obsolete, ignored: %s", source, OBSOLETE["cluster.recompute"])
    inference = out.pop("inference", None)
    if inference is None:
        return out
    if not isinstance(inference, Mapping):
        raise ConfigError(source, "inference", f"expected a table, got {describe(inference)}")
    known = sorted(k.split(".")[1] for k in OBSOLETE if k.startswith("inference."))
    for key, value in inference.items():
        dotted = f"inference.{key}"
        if dotted not in OBSOLETE:
            raise ConfigError(
                source, dotted, f"unknown key (tierkv 0.1's [inference] had: {', '.join(known)})"
            )
        log.warning("%s: %s: obsolete, ignored: %s", source, dotted, OBSOLETE[dotted])
        if key == "log_file":
            section = dict(out.get("log") or {})
            section.setdefault("file", value)
            out["log"] = section
    return out


__all__ = ["OBSOLETE", "migrate"]
