"""Memory of ``adaptive``'s learning state for one tenant, by the number of blocks its budget holds.

The state is two ghost lists (keys evicted, bounded by four budgets and MAX_GHOSTS keys each) and two
shadow caches (bounded by MAX_SHADOW_KEYS keys each: past it they sample fewer keys), the ARC shadow with
ghost lists of its own. This drives one state as a vault in steady-state eviction does (every stored
block new, each evicting one, a quarter of each batch read back and a quarter of the victims proven) through ``--budgets-through`` budgets'
worth of blocks, then reports the keys it holds and the bytes Python allocated for them (tracemalloc).
Run:

    python -m benchmarks.learning_memory [--blocks 1000,32768,1000000,16000000] [--block-kib 64]
"""

from __future__ import annotations

import argparse
import random
import tracemalloc

from tierkv.vault.policy import AdaptivePolicy
from tierkv.vault.policy.learning import GHOST_BUDGETS, MAX_GHOSTS, MAX_SHADOW_KEYS

BATCH = 64


def measure(blocks: int, block: int, through: float, seed: int = 0) -> tuple[int, int]:
    """(keys held, bytes allocated) after ``through`` × min(blocks, what fills every bound) blocks."""
    rng = random.Random(seed)
    enough = min(blocks, 2 * MAX_GHOSTS)  # past this, more blocks only cycle through full lists
    total = int(through * (enough + GHOST_BUDGETS * min(blocks, MAX_GHOSTS)))
    tracemalloc.start()
    policy = AdaptivePolicy()
    learner = policy.state("t", blocks * block)
    for _ in range(0, total, BATCH):
        fkeys = [b"\x02ns" + rng.getrandbits(64).to_bytes(8, "big") for _ in range(BATCH)]
        policy.observe("t", blocks * block, fkeys, block, read=False)
        policy.observe("t", blocks * block, fkeys[: BATCH // 4], block, read=True)
        for i, fkey in enumerate(fkeys):
            learner.evicted((fkey, block, i % 4 == 0))  # a quarter had been read: main's ghost list
        learner.settle()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return policy.learning_keys(), held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="1000,32768,1000000,16000000")
    ap.add_argument("--block-kib", type=int, default=64)
    ap.add_argument("--budgets-through", type=float, default=1.5)
    args = ap.parse_args()
    bound = 2 * MAX_GHOSTS + 2 * MAX_SHADOW_KEYS + 2 * GHOST_BUDGETS * MAX_SHADOW_KEYS
    print(f"bound: {bound:,} keys per tenant")
    for blocks in (int(b) for b in args.blocks.split(",") if b):
        keys, held = measure(blocks, args.block_kib << 10, args.budgets_through)
        print(
            f"{blocks:>12,} blocks: {keys:>9,} keys, {held / 1e6:7.1f} MB ({held / max(1, keys):.0f} B/key)"
        )


if __name__ == "__main__":
    main()
