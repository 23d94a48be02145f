"""Shared fixtures: real vault processes on 127.0.0.1 with random free ports and real LMDB directories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tierkv.vault.launcher import VaultProcess

VaultFactory = Callable[..., VaultProcess]


@pytest.fixture
def vault_factory(tmp_path: Path) -> Iterator[VaultFactory]:
    """Start real ``tierkv vault`` processes; every one still running is stopped (by PID) at teardown."""
    started: list[VaultProcess] = []

    def make(name: str = "vault", start: bool = True, **kwargs: Any) -> VaultProcess:
        kwargs.setdefault("max_bytes", "64MiB")
        proc = VaultProcess(tmp_path / name, **kwargs)
        started.append(proc)
        return proc.start() if start else proc

    yield make
    for proc in started:
        proc.stop(timeout=10)


@pytest.fixture
def vault(vault_factory: VaultFactory) -> VaultProcess:
    return vault_factory()
