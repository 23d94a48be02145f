"""Mooncake Store as a contender of ``benchmarks/links.py``, in a process of its own.

Runs under ``.venv-mooncake`` (``benchmarks/setup-mooncake.sh``), never imports tierkv. Two roles:

- ``server HOST METADATA MASTER SEGMENT_MIB``: a store process that mounts a RAM segment on the vault side
  of the link (where Mooncake keeps data), prints ``ready``, and lives until its stdin closes;
- ``client HOST METADATA MASTER``: the engine side. It reads one command a line and answers one line, so
  the parent times each call interleaved with tierkv's and Redis's:
  ``load SIZE N`` stores N random blobs under fixed keys (untimed set-up for reads);
  ``get SIZE N`` reads them with ``batch_get_into`` into a registered buffer;
  ``put SIZE N`` stores N fresh keys with ``put_batch`` (the same bytes, new names each call);
  ``check SIZE N`` answers whether what ``get`` read equals what ``load`` stored;
  ``clear`` removes every key. A call that fails answers ``error ...``.
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np
from mooncake.store import MooncakeDistributedStore

BUFFER = 256 << 20
"""The client's registered buffer: the largest read round it can take."""


def serve(host: str, metadata: str, master: str, segment_mib: int) -> None:
    store = MooncakeDistributedStore()
    rc = store.setup(host, metadata, segment_mib << 20, 16 << 20, "tcp", "", master)
    print("ready" if rc == 0 else f"error setup {rc}", flush=True)
    sys.stdin.read()
    store.close()


class Client:
    def __init__(self, host: str, metadata: str, master: str) -> None:
        self.store = MooncakeDistributedStore()
        rc = self.store.setup(host, metadata, 0, BUFFER, "tcp", "", master)
        if rc != 0:
            raise RuntimeError(f"setup {rc}")
        self.buf = np.zeros(BUFFER, dtype=np.uint8)
        self.ptr = self.buf.ctypes.data
        if self.store.register_buffer(self.ptr, BUFFER) != 0:
            raise RuntimeError("register_buffer failed")
        self.blobs: dict[int, list[bytes]] = {}
        self.fresh = itertools.count()

    def load(self, size: int, n: int) -> str:
        self.blobs[size] = [os.urandom(size) for _ in range(n)]
        rc = self.store.put_batch([f"g{size}-{i}" for i in range(n)], self.blobs[size])
        return "ok" if rc == 0 else f"error put_batch {rc}"

    def get(self, size: int, n: int) -> str:
        keys = [f"g{size}-{i}" for i in range(n)]
        got = self.store.batch_get_into(keys, [self.ptr + i * size for i in range(n)], [size] * n)
        bad = [r for r in got if r != size]
        return "ok" if not bad else f"error batch_get_into {bad[0]} ({len(bad)} of {n})"

    def put(self, size: int, n: int) -> str:
        call = next(self.fresh)
        rc = self.store.put_batch([f"p{call}-{size}-{i}" for i in range(n)], self.blobs[size][:n])
        return "ok" if rc == 0 else f"error put_batch {rc}"

    def check(self, size: int, n: int) -> str:
        same = all(self.buf[i * size : (i + 1) * size].tobytes() == self.blobs[size][i] for i in range(n))
        return "ok" if same else "error the bytes read differ from those stored"

    def clear(self) -> str:
        self.store.remove_all(True)
        return "ok"

    def answer(self, line: str) -> str:
        verb, *rest = line.split()
        if verb == "clear":
            return self.clear()
        size, n = (int(x) for x in rest)
        if size * n > BUFFER:
            return f"error {size * n} bytes exceed the client's {BUFFER}-byte buffer"
        return {"load": self.load, "get": self.get, "put": self.put, "check": self.check}[verb](size, n)


def main() -> None:
    role, host, metadata, master, *rest = sys.argv[1:]
    if role == "server":
        serve(host, metadata, master, int(rest[0]))
        return
    client = Client(host, metadata, master)
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            reply = client.answer(line)
        except Exception as e:  # the parent reports it; this process keeps answering
            reply = f"error {type(e).__name__}: {e}"
        print(reply, flush=True)
    client.store.close()


if __name__ == "__main__":
    main()
