"""``make demo`` end to end: real vault processes, store, restore, status, clean stop — checked from the
outside: what the vaults hold on disk afterwards is read back with the store and verified, blob by blob,
instead of trusting the demo's own verdict."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from tierkv.codec import LayerGroup, read_header, verify
from tierkv.vault.store import Store, split_full_key


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "tierkv", "demo", "--tokens", "1024", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("exited with 0") == 2, "both vaults stopped cleanly"
    assert held(state / "kv_cold") == {(LayerGroup.ATTENTION, 16): 64}
    assert held(state / "ssm_cold") == {(LayerGroup.SSM, 1024): 1}


def held(path: Path) -> dict[tuple[LayerGroup, int], int]:
    """(layer group, tokens) → how many stored blobs verify, over every namespace of the store."""
    found: Counter[tuple[LayerGroup, int]] = Counter()
    with Store(path, 1 << 30) as store:
        for namespace, key in map(split_full_key, store.debug.index_keys()):
            (blob,) = store.get_many(namespace, [key])
            assert blob is not None
            verify(blob)
            header = read_header(blob)
            found[(header.layer_group, header.tokens)] += 1
    return dict(found)
