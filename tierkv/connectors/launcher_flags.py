"""The ``--tierkv-*`` flags every engine-server launcher takes in front of the engine's own flags.

A launcher keeps its engine's command line untouched: it takes these flags, loads tierkv.toml, and hands
the rest to the engine's ``main``. A bad file or flag is one line on stderr and exit 2, before the engine
starts. ``--help`` goes on to the engine too, which lists its own flags and exits; tierkv's are printed
first, so one ``--help`` shows every flag the command takes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tierkv.config import Config, load_config
from tierkv.errors import ConfigError

HELP_FLAGS = frozenset({"-h", "--help"})


def launcher_parser(*, codec: bool = False) -> argparse.ArgumentParser:
    """The flags common to every launcher, and ``--tierkv-codec`` for engines whose blocks may be int8."""
    p = argparse.ArgumentParser(prog="tierkv", usage=argparse.SUPPRESS, add_help=False)
    p.add_argument(
        "--tierkv-config",
        default=None,
        metavar="PATH",
        help="tierkv.toml: the vaults ([cluster]), auth, TLS (default: $TIERKV_CONFIG, ./tierkv.toml, "
        "~/.config/tierkv/tierkv.toml)",
    )
    p.add_argument(
        "--tierkv-block-size", type=int, default=16, metavar="N", help="tokens per stored block (default: 16)"
    )
    p.add_argument(
        "--tierkv-tenant", default="", metavar="NAME", help="keeps a tenant's blocks apart (default: none)"
    )
    if codec:
        p.add_argument(
            "--tierkv-codec", choices=("raw", "int8"), default="raw", help="raw (lossless, default) or int8"
        )
    return p


def parse_launcher_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, engine: str = "the engine"
) -> tuple[argparse.Namespace, list[str], Config]:
    """Our flags, the engine's flags, and the tierkv.toml they name; exit 2 on a bad file or block size.

    With ``-h`` / ``--help`` among the engine's flags, tierkv's are printed first (to stdout) and the
    help flag is left for ``engine``, which prints its own and exits (tierkv.toml is not read then, so a
    broken file does not hide the help).
    """
    ours, rest = parser.parse_known_args(argv)
    if HELP_FLAGS.intersection(rest):
        print(f"tierkv's flags (every other flag is {engine}'s, listed below):")
        print(parser.format_help().partition("\n")[2].rstrip(), end="\n\n", flush=True)
        return ours, rest, Config()  # the engine prints its help and exits: nothing reads the file
    try:
        config = load_config(ours.tierkv_config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if ours.tierkv_block_size < 1:
        print(f"error: --tierkv-block-size must be >= 1, got {ours.tierkv_block_size}", file=sys.stderr)
        raise SystemExit(2)
    return ours, rest, config


__all__ = ["HELP_FLAGS", "launcher_parser", "parse_launcher_args"]
