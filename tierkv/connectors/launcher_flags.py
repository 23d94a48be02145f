"""The ``--tierkv-*`` flags every engine-server launcher takes in front of the engine's own flags.

A launcher keeps its engine's command line untouched: it takes these flags, loads tierkv.toml, and hands
the rest to the engine's ``main``. A bad file or flag is one line on stderr and exit 2, before the engine
starts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tierkv.config import Config, load_config
from tierkv.errors import ConfigError


def launcher_parser() -> argparse.ArgumentParser:
    """The flags common to every launcher; a launcher adds its engine's own ``--tierkv-*`` ones."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--tierkv-config", default=None, help="tierkv.toml (default: the usual search)")
    p.add_argument("--tierkv-block-size", type=int, default=16)
    p.add_argument("--tierkv-tenant", default="")
    return p


def parse_launcher_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, list[str], Config]:
    """Our flags, the engine's flags, and the tierkv.toml they name; exit 2 on a bad file or block size."""
    ours, rest = parser.parse_known_args(argv)
    try:
        config = load_config(ours.tierkv_config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if ours.tierkv_block_size < 1:
        print(f"error: --tierkv-block-size must be >= 1, got {ours.tierkv_block_size}", file=sys.stderr)
        raise SystemExit(2)
    return ours, rest, config


__all__ = ["launcher_parser", "parse_launcher_args"]
