from __future__ import annotations

import pytest

from tierkv.tiering.positions import full_blocks, restore_limit, snapshot_boundaries, snapshot_candidates


def test_snapshot_boundaries() -> None:
    assert snapshot_boundaries(0, 70, 16, 2) == [32, 64]
    assert snapshot_boundaries(0, 90, 16, 2) == [32, 64, 80]
    assert snapshot_boundaries(32, 47, 16, 1) == []
    assert snapshot_boundaries(30, 48, 16, 1) == [32, 48]
    with pytest.raises(ValueError):
        snapshot_boundaries(0, 10, 16, 0)


def test_snapshot_candidates() -> None:
    assert snapshot_candidates(5, 2) == [5, 4]
    assert snapshot_candidates(4, 2) == [4, 2]
    assert snapshot_candidates(1, 4) == [1]
    assert snapshot_candidates(0, 1) == []
    assert snapshot_candidates(9, 1, limit=3) == [9, 8, 7]


def test_restore_limit_and_full_blocks() -> None:
    assert restore_limit(1) == 0 and restore_limit(0) == 0 and restore_limit(33) == 32
    assert full_blocks(47, 16) == 2 and full_blocks(48, 16) == 3 and full_blocks(-1, 16) == 0
    with pytest.raises(ValueError):
        full_blocks(10, 0)
