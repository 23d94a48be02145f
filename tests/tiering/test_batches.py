from __future__ import annotations

from collections.abc import Iterator

from tierkv.tiering.batches import byte_batches


def test_batches_close_at_the_byte_bound_and_keep_order() -> None:
    items = [(bytes([i]), b"x" * n) for i, n in enumerate([3, 3, 5, 1, 1, 4])]
    batches = list(byte_batches(items, 6))
    assert [list(b) for b in batches] == [[b"\x00", b"\x01"], [b"\x02", b"\x03"], [b"\x04", b"\x05"]]
    assert [sum(map(len, b.values())) for b in batches] == [6, 6, 5]
    assert list(byte_batches([], 6)) == []
    large = [(b"k", b"x" * 100)]
    assert list(byte_batches(large, 6)) == [dict(large)], "a blob over the bound is a batch of its own"


def test_items_are_consumed_one_batch_at_a_time() -> None:
    made: list[int] = []

    def blobs() -> Iterator[tuple[bytes, bytes]]:
        for i in range(6):
            made.append(i)
            yield bytes([i]), b"x" * 4

    batches = byte_batches(blobs(), 8)
    assert len(next(batches)) == 2 and made == [0, 1], "nothing past the first batch is encoded yet"
    assert sum(len(b) for b in batches) == 4
