"""Two vault builds side by side: one vault from each source tree (``--old``, ``--new``), same settings,
sittings alternated between them, for the benchmarks that compare a change with what it replaces.

Both vaults read one token file: ``tok-admin`` (tenant ``ops``, admin), ``tok-a`` (``alpha``) and
``tok-b`` (``beta``), plain users.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tierkv.vault.launcher import VaultProcess

TOKENS = "tok-admin ops admin\ntok-a alpha user\ntok-b beta user\n"


@contextlib.contextmanager
def two_builds(
    old: str, new: str, *, max_bytes: str, vault_toml: str = ""
) -> Iterator[dict[str, VaultProcess]]:
    """Vaults ``old`` and ``new``, each running its own tree's code, stopped on the way out.

    ``vault_toml`` is prepended to their shared config file (whose ``[auth]`` names the token file).
    """
    with tempfile.TemporaryDirectory(prefix="tierkv-builds-") as tmp:
        (Path(tmp) / "tokens").write_text(TOKENS)
        (Path(tmp) / "vault.toml").write_text(f'{vault_toml}[auth]\ntoken_file = "{Path(tmp) / "tokens"}"\n')
        vaults = {
            name: VaultProcess(
                Path(tmp) / name,
                max_bytes=max_bytes,
                sync="fast",
                extra_args=["--config", str(Path(tmp) / "vault.toml")],
                env={"PYTHONPATH": str(Path(tree).resolve())},
            ).start()
            for name, tree in (("old", old), ("new", new))
        }
        try:
            yield vaults
        finally:
            for v in vaults.values():
                v.stop()


def alternated(repeats: int) -> Iterator[tuple[int, str]]:
    """``(repetition, build)`` in the order the sittings run: the first build alternates."""
    names = ["old", "new"]
    for rep in range(repeats):
        for name in names[rep % 2 :] + names[: rep % 2]:
            yield rep, name
