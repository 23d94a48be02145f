"""The store and restore steps on the in-memory storage: batching, the codec rule, verify, reject, delete."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Mapping

import numpy as np
import pytest
import torch

from tierkv.codec import LayerGroup, read_header
from tierkv.records import PutResult
from tierkv.roles import Role
from tierkv.tiering import ColdTier, Expect, MemoryStorage, NumpyArrays, StreamSpec, codec_for
from tierkv.tiering.arrays import Arrays
from tierkv.tiering.tensors import TorchArrays

NS = hashlib.sha256(b"pipeline").digest()
KV = StreamSpec(NS, LayerGroup.ATTENTION, kv_codec="int8")
SSM = StreamSpec(NS, LayerGroup.SSM, kv_codec="int8")
SHAPE = (2, 2, 4, 8)  # layers, K/V, tokens, dim
TOKENS = 4


def keys(n: int, tag: bytes = b"kv") -> list[bytes]:
    return [hashlib.sha256(tag + bytes([i])).digest() for i in range(n)]


def blocks(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(n)]


def store(tier: ColdTier[np.ndarray], spec: StreamSpec, ks: list[bytes], arrays: list[np.ndarray]) -> None:
    tally = tier.store(spec, ((k, a, TOKENS) for k, a in zip(ks, arrays, strict=True)))
    assert tally.sent == tally.stored == len(ks) and tally.failed == 0


def test_codec_rule_states_are_raw_whatever_the_kv_codec() -> None:
    assert codec_for(LayerGroup.ATTENTION, "int8") == "int8"
    assert codec_for(LayerGroup.SLIDING, "int8") == "int8"
    assert codec_for(LayerGroup.SSM, "int8") == "raw" and codec_for(LayerGroup.CONV, "int8") == "raw"
    assert KV.role is Role.KV_COLD and SSM.role is Role.SSM_COLD
    assert SSM.sibling(LayerGroup.CONV).codec == "raw" and SSM.sibling(LayerGroup.CONV).role is Role.SSM_COLD


def test_store_encodes_each_stream_in_its_codec_and_routes_it_by_role() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, NumpyArrays())
    store(tier, KV, keys(2), blocks(2))
    store(tier, SSM, keys(1, b"ssm"), blocks(1))
    kv_blobs = storage.blobs[("kv_cold", NS)]
    ssm_blobs = storage.blobs[("ssm_cold", NS)]
    assert [read_header(b).codec for b in kv_blobs.values()] == ["int8", "int8"]
    assert [read_header(b).codec for b in ssm_blobs.values()] == ["raw"]
    header = read_header(next(iter(ssm_blobs.values())))
    assert header.layer_group == LayerGroup.SSM and header.tokens == TOKENS and header.shape == SHAPE


def test_store_puts_byte_bounded_batches_lazily() -> None:
    storage = MemoryStorage()
    one_blob = len(NumpyArrays().encode(blocks(1)[0], "raw", TOKENS, LayerGroup.ATTENTION))
    tier = ColdTier(storage, NumpyArrays(), max_put_bytes=2 * one_blob)
    consumed: list[int] = []

    def produce() -> Iterator[tuple[bytes, np.ndarray, int]]:
        for i, (k, a) in enumerate(zip(keys(5), blocks(5), strict=True)):
            consumed.append(i)
            yield k, a, TOKENS

    tally = tier.store(StreamSpec(NS, LayerGroup.ATTENTION), produce())
    assert storage.calls["put"] == 3, "5 blobs in batches of at most 2 blobs' bytes"
    assert tally.stored == 5 and tally.stored_bytes == 5 * one_blob and consumed == [0, 1, 2, 3, 4]


class Refusing(MemoryStorage):
    """A storage whose vaults acknowledge only the first key of each put (a vault that is full or down)."""

    def put(self, namespace: bytes, items: Mapping[bytes, bytes], role: str = Role.KV_COLD) -> PutResult:
        first = dict(list(items.items())[:1])
        super().put(namespace, first, role)
        return PutResult(sent=len(items), stored=len(first), unstored=tuple(list(items)[1:]))


def test_store_counts_what_was_not_acknowledged() -> None:
    tier = ColdTier(Refusing(), NumpyArrays())
    tally = tier.store(KV, ((k, a, TOKENS) for k, a in zip(keys(3), blocks(3), strict=True)))
    assert (tally.sent, tally.stored, tally.failed) == (3, 1, 2)
    assert 0 < tally.stored_bytes < 3 * len(tier.arrays.encode(blocks(1)[0], "int8", TOKENS, KV.layer_group))


RAW = StreamSpec(NS, LayerGroup.ATTENTION)


def stored(n: int, spec: StreamSpec = RAW) -> tuple[MemoryStorage, ColdTier[np.ndarray], list[np.ndarray]]:
    """A storage holding ``n`` blocks of ``spec`` and the pipeline over it."""
    storage = MemoryStorage()
    tier = ColdTier(storage, NumpyArrays())
    data = blocks(n)
    store(tier, spec, keys(n), data)
    return storage, tier, data


def test_restore_decodes_into_the_callers_slots() -> None:
    _, tier, data = stored(3)
    assert tier.lookup(RAW, keys(3)) == 3 and tier.lookup(RAW, []) == 0
    out = np.zeros((3, *SHAPE), dtype=np.float32)
    got = tier.restore(RAW, keys(3), RAW.expect(SHAPE, TOKENS, "float32"), out.__getitem__)
    assert got.decoded == [0, 1, 2] and got.leading == 3 and got.failed == [] and got.rejected == 0
    assert got.decoded_bytes == got.fetched_bytes > 0
    np.testing.assert_array_equal(out, np.stack(data))


def test_lookup_all_is_the_run_every_stream_holds_and_stops_at_a_miss() -> None:
    storage, tier, _ = stored(4)
    rank1 = StreamSpec(hashlib.sha256(b"rank 1").digest(), LayerGroup.ATTENTION)
    rank2 = StreamSpec(hashlib.sha256(b"rank 2").digest(), LayerGroup.ATTENTION)
    store(tier, rank1, keys(2), blocks(2))
    assert tier.lookup_all([RAW, rank1], keys(4), lease_ms=1000) == 2
    assert tier.lookup_all([rank1, RAW], keys(4)) == 2
    asked = storage.calls["lookup"]
    assert tier.lookup_all([rank2, RAW, rank1], keys(4)) == 0
    assert storage.calls["lookup"] == asked + 1, "a miss on the first stream asks no other"
    assert tier.lookup_all([RAW], []) == 0 and tier.lookup_all([], keys(4)) == 4


def test_missing_blocks_are_reported_and_leading_only_stops_at_the_first() -> None:
    storage, tier, data = stored(4)
    del storage.blobs[("kv_cold", NS)][keys(4)[1]]
    out = np.zeros((4, *SHAPE), dtype=np.float32)
    got = tier.restore(RAW, keys(4), RAW.expect(SHAPE, TOKENS), out.__getitem__)
    assert got.decoded == [0, 2, 3] and got.leading == 1 and got.failed == [1]
    # packed: the n-th decoded block is in slot n
    np.testing.assert_array_equal(out[:3], np.stack([data[0], data[2], data[3]]))
    got = tier.restore(RAW, keys(4), RAW.expect(SHAPE, TOKENS), out.__getitem__, leading_only=True)
    assert got.decoded == [0] and got.failed == [1, 2, 3] and got.rejected == 0


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), id="payload-bit-flip"),
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b"not a blob", id="garbage"),
    ],
)
def test_a_corrupt_blob_is_rejected_counted_and_deleted(damage) -> None:  # type: ignore[no-untyped-def]
    storage, tier, _ = stored(3, KV)
    space = storage.blobs[("kv_cold", NS)]
    bad = keys(3)[1]
    space[bad] = damage(space[bad])
    out = np.zeros((3, *SHAPE), dtype=np.float32)
    got = tier.restore(KV, keys(3), KV.expect(SHAPE, TOKENS), out.__getitem__)
    assert got.decoded == [0, 2] and got.rejected == 1 and got.failed == [1]
    assert bad not in space and keys(3)[0] in space and storage.calls["delete"] == 1
    got = tier.restore(KV, keys(3), KV.expect(SHAPE, TOKENS), out.__getitem__)
    assert got.rejected == 0 and got.failed == [1], "once deleted it is a plain miss"


def test_many_corrupt_blobs_in_one_restore_log_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    storage, tier, _ = stored(6, KV)
    space = storage.blobs[("kv_cold", NS)]
    for key in keys(6)[1:]:
        space[key] = b"not a blob"
    out = np.zeros((6, *SHAPE), dtype=np.float32)
    with caplog.at_level("WARNING", logger="tierkv.tiering.pipeline"):
        got = tier.restore(KV, keys(6), KV.expect(SHAPE, TOKENS), out.__getitem__)
    assert got.rejected == 5 and storage.calls["delete"] == 1
    (record,) = caplog.records
    assert "5 of 6 blobs rejected" in record.getMessage() and "block 1:" in record.getMessage()


def test_a_blob_with_an_unexpected_header_is_corrupt() -> None:
    storage, tier, _ = stored(2, KV)
    out = np.zeros((2, *SHAPE), dtype=np.float32)
    wrong = [
        KV.expect(SHAPE, TOKENS + 1),
        Expect(LayerGroup.SSM, "int8", SHAPE, TOKENS),
        Expect(LayerGroup.ATTENTION, "raw", SHAPE, TOKENS),
        KV.expect((2, 2, 4, 4), TOKENS),
    ]
    for expect in wrong:
        store(tier, KV, keys(2), blocks(2))
        got = tier.restore(KV, keys(2), expect, out.__getitem__, leading_only=True)
        assert got.decoded == [] and got.rejected == 1, expect
        assert storage.prefix_lookup(NS, keys(2)) == 0, "the rejected first block was deleted"


def test_one_expectation_per_key_for_streams_sharing_a_role() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, TorchArrays())
    conv = SSM.sibling(LayerGroup.CONV)
    ssm_state, conv_state = torch.randn(24), torch.randn(6)
    tier.store(SSM, [(b"s" * 32, ssm_state, 48)])
    tier.store(conv, [(b"c" * 32, conv_state, 48)])
    flat = [torch.empty(24), torch.empty(6)]
    expects = [SSM.expect((24,), 48, "float32"), conv.expect((6,), 48, "float32")]
    got = tier.restore(SSM, [b"s" * 32, b"c" * 32], expects, flat.__getitem__)
    assert got.decoded == [0, 1] and storage.calls["get"] == 1, "one get for both groups"
    assert torch.equal(flat[0], ssm_state) and torch.equal(flat[1], conv_state)


def test_torch_blocks_decode_into_strided_views() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, TorchArrays())
    spec = StreamSpec(NS, LayerGroup.ATTENTION)
    data = [torch.randn(SHAPE, dtype=torch.bfloat16) for _ in range(2)]
    tier.store(spec, [(k, d, TOKENS) for k, d in zip(keys(2), data, strict=True)])
    joined = torch.zeros((2, 2, 2 * TOKENS, 8), dtype=torch.bfloat16)  # blocks side by side on tokens
    got = tier.restore(
        spec,
        keys(2),
        spec.expect(SHAPE, TOKENS, "bfloat16"),
        lambda n: joined[:, :, n * TOKENS : (n + 1) * TOKENS],
    )
    assert got.leading == 2
    assert torch.equal(joined, torch.cat(data, dim=2))


class Streaming(MemoryStorage):
    """A storage that records, for each blob it hands to ``on_blob``, what the hook had placed by then:
    proof that blobs are placed while the get is still running, not after it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_at_hand_over: list[int] = []
        self.placed: list[int] = []

    def get_each(self, namespace, keys, on_blob, role=Role.KV_COLD):  # type: ignore[no-untyped-def]
        def sink(i: int, blob: bytes) -> None:
            self.seen_at_hand_over.append(len(self.placed))
            on_blob(i, blob)

        return super().get_each(namespace, keys, sink, role)


RAW_TORCH = StreamSpec(NS, LayerGroup.ATTENTION)


def streaming(n: int) -> tuple[Streaming, ColdTier[torch.Tensor], dict[bytes, bytes], list[torch.Tensor]]:
    """A :class:`Streaming` storage holding ``n`` raw torch blocks, the pipeline over it, its blobs."""
    storage = Streaming()
    tier = ColdTier(storage, TorchArrays())
    data = [torch.randn(SHAPE) for _ in range(n)]
    tier.store(RAW_TORCH, [(k, d, TOKENS) for k, d in zip(keys(n), data, strict=True)])
    return storage, tier, storage.blobs[("kv_cold", NS)], data


def test_place_takes_raw_blobs_as_views_while_they_arrive() -> None:
    storage, tier, space, data = streaming(4)
    spec = RAW_TORCH
    del space[keys(4)[2]]
    cache = torch.zeros((9, *SHAPE))
    slots = [7, 0, 4, 2]

    def place(i: int, values: torch.Tensor) -> None:
        blob = space[keys(4)[i]]
        start = np.frombuffer(blob, np.uint8).ctypes.data
        assert start < values.data_ptr() < start + len(blob), "a view of the received bytes, not a copy"
        cache[slots[i]].copy_(values)
        storage.placed.append(i)

    got = tier.restore(spec, keys(4), spec.expect(SHAPE, TOKENS, "float32"), place=place)
    assert got.decoded == [0, 1, 3] and got.failed == [2] and got.gone == [keys(4)[2]]
    assert storage.placed == [0, 1, 3] and storage.seen_at_hand_over == [0, 1, 2], "placed on arrival"
    assert got.place_s > 0 and got.verify_s > 0
    for i in (0, 1, 3):
        assert torch.equal(cache[slots[i]], data[i])
    assert torch.count_nonzero(cache[slots[2]]) == 0


def test_a_corrupt_blob_met_on_arrival_is_rejected_and_deleted_too() -> None:
    storage, tier, space, _ = streaming(3)
    spec = RAW_TORCH
    space[keys(3)[1]] = space[keys(3)[1]][:-1] + bytes([space[keys(3)[1]][-1] ^ 1])
    placed: dict[int, torch.Tensor] = {}
    got = tier.restore(
        spec, keys(3), spec.expect(SHAPE, TOKENS), place=lambda i, v: placed.__setitem__(i, v.clone())
    )
    assert got.decoded == [0, 2] and got.rejected == 1 and sorted(placed) == [0, 2]
    assert keys(3)[1] not in space and storage.calls["delete"] == 1


def test_place_is_for_raw_streams_only_and_a_failing_hook_fails_the_restore() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, TorchArrays())
    tier.store(KV, [(keys(1)[0], torch.randn(SHAPE), TOKENS)])
    with pytest.raises(ValueError, match="raw"):
        tier.restore(KV, keys(1), KV.expect(SHAPE, TOKENS), place=lambda i, v: None)
    assert storage.calls["get"] == 0 and storage.calls["delete"] == 0, "nothing fetched, nothing deleted"

    tier.store(RAW, [(keys(1)[0], torch.randn(SHAPE), TOKENS)])

    def broken(i: int, values: torch.Tensor) -> None:
        raise RuntimeError("the cache is gone")

    with pytest.raises(RuntimeError, match="the cache is gone"):
        tier.restore(RAW, keys(1), RAW.expect(SHAPE, TOKENS), place=broken)
    with pytest.raises(ValueError, match="exactly one of out and place"):
        tier.restore(RAW, keys(1), RAW.expect(SHAPE, TOKENS))


def test_leading_only_places_nothing_past_the_first_gap() -> None:
    _, tier, space, _ = streaming(3)
    spec = RAW_TORCH
    del space[keys(3)[1]]
    placed: list[int] = []
    got = tier.restore(
        spec, keys(3), spec.expect(SHAPE, TOKENS), place=lambda i, v: placed.append(i), leading_only=True
    )
    assert got.decoded == [0] and placed == [0], "block 2 arrived but lies past the gap"


def test_numpy_blocks_are_placed_from_views_too_and_arrays_that_cannot_view_are_refused() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, NumpyArrays("bfloat16"))
    bits = [np.random.default_rng(i).integers(0, 1 << 15, SHAPE, dtype=np.uint16) for i in range(2)]
    tier.store(RAW, [(k, b, TOKENS) for k, b in zip(keys(2), bits, strict=True)])
    placed: dict[int, np.ndarray] = {}
    got = tier.restore(RAW, keys(2), RAW.expect(SHAPE, TOKENS, "bfloat16"), place=placed.__setitem__)
    assert got.decoded == [0, 1] and all(placed[i].dtype == np.uint16 for i in placed)
    assert all(np.array_equal(placed[i], bits[i]) for i in range(2)) and not placed[0].flags.writeable

    class DecodeOnly:
        """Arrays that can decode but not view (an engine hook's own, say)."""

        encode = NumpyArrays().encode
        decode_into = NumpyArrays().decode_into

    with pytest.raises(ValueError, match="cannot view"):
        ColdTier(storage, DecodeOnly()).restore(
            RAW, keys(2), RAW.expect(SHAPE, TOKENS), place=lambda i, v: None
        )
    assert storage.calls["get"] == 1, "refused before anything was fetched"


def test_into_decodes_every_good_block_into_the_next_row_and_deletes_the_corrupt_ones() -> None:
    storage = MemoryStorage()
    tier = ColdTier(storage, TorchArrays())
    data = [torch.randn(SHAPE, dtype=torch.float16) for _ in range(5)]
    tier.store(KV, [(k, d, TOKENS) for k, d in zip(keys(5), data, strict=True)])
    space = storage.blobs[("kv_cold", NS)]
    del space[keys(5)[1]]
    bad = space[keys(5)[3]]
    space[keys(5)[3]] = bad[:-1] + bytes([bad[-1] ^ 0xFF])
    into = torch.full((5, *SHAPE), float("nan"), dtype=torch.float16)
    got = tier.restore(KV, keys(5), KV.expect(SHAPE, TOKENS, "float16"), into=into)
    assert got.decoded == [0, 2, 4] and got.failed == [1, 3] and got.rejected == 1
    assert got.gone == [keys(5)[1], keys(5)[3]] and keys(5)[3] not in space and storage.calls["delete"] == 1
    assert got.decoded_bytes < got.fetched_bytes and got.verify_s > 0
    for n, i in enumerate(got.decoded):  # the int8 round trip, row by row
        torch.testing.assert_close(into[n], data[i], atol=0.05, rtol=0.05)
    assert torch.isnan(into[3:]).all()


def test_into_needs_arrays_that_decode_rows_and_takes_every_block() -> None:
    _, tier, _ = stored(2)
    with pytest.raises(ValueError, match="arrays that decode rows"):
        tier.restore(RAW, keys(2), RAW.expect(SHAPE, TOKENS), into=np.zeros((2, *SHAPE), np.float32))
    torch_tier = ColdTier(MemoryStorage(), TorchArrays())
    into = torch.zeros((2, *SHAPE))
    with pytest.raises(ValueError, match="without out, place and leading_only"):
        torch_tier.restore(RAW, keys(2), RAW.expect(SHAPE, TOKENS), into=into, leading_only=True)
    with pytest.raises(ValueError, match="one expect"):
        torch_tier.restore(RAW, keys(2), [RAW.expect(SHAPE, TOKENS)] * 2, into=into)


class Recording(TorchArrays):
    """TorchArrays that say when a decode ran (and on which thread)."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.decoded = threading.Event()
        self.threads: set[str] = set()
        self.runs: list[list[int]] = []
        """Slots of each ``decode_slots`` call, by row of the test's buffer."""
        self.hold = hold

    def decode_rows(self, blobs, into, expect):  # type: ignore[no-untyped-def]
        self.threads.add(threading.current_thread().name)
        verdicts = super().decode_rows(blobs, into, expect)
        self.decoded.set()
        return verdicts

    def decode_slots(self, blobs, slots, expect):  # type: ignore[no-untyped-def]
        self.threads.add(threading.current_thread().name)
        self.runs.append([row_of(slot) for slot in slots])
        if self.hold is not None:  # the first run waits until the rest has arrived
            assert self.hold.wait(10)
        verdicts = super().decode_slots(blobs, slots, expect)
        self.decoded.set()
        return verdicts

    def decode_into(self, blob, out, expect):  # type: ignore[no-untyped-def]
        self.threads.add(threading.current_thread().name)
        try:
            super().decode_into(blob, out, expect)
        finally:
            self.decoded.set()


class Backwards(MemoryStorage):
    """Hands blobs over last key first (as two vaults' replies interleave), and before the last one waits
    until something was decoded: proof that decoding runs while the get is still receiving."""

    def __init__(self, arrays: Recording) -> None:
        super().__init__()
        self.arrays = arrays
        self.decoded_before_the_end = False

    def get_each(self, namespace, keys, on_blob, role=Role.KV_COLD):  # type: ignore[no-untyped-def]
        found = self.get_buffers(namespace, keys, role)
        order = [i for i in reversed(range(len(keys))) if found[i] is not None]
        for n, i in enumerate(order):
            if n == len(order) - 1:
                self.decoded_before_the_end = self.arrays.decoded.wait(10)
            on_blob(i, found[i])
        return [None if b is None else len(b) for b in found]


def test_decoding_behind_the_receive_fills_the_same_rows_while_the_get_still_runs() -> None:
    arrays = Recording()
    storage = Backwards(arrays)
    tier = ColdTier(storage, arrays, decode_behind=True)
    data = [torch.randn(SHAPE, dtype=torch.float16) for _ in range(7)]
    tier.store(KV, [(k, d, TOKENS) for k, d in zip(keys(7), data, strict=True)])
    space = storage.blobs[("kv_cold", NS)]
    del space[keys(7)[1]]
    bad = space[keys(7)[4]]
    space[keys(7)[4]] = bad[:-1] + bytes([bad[-1] ^ 0xFF])
    into = torch.full((7, *SHAPE), float("nan"), dtype=torch.float16)
    got = tier.restore(KV, keys(7), KV.expect(SHAPE, TOKENS, "float16"), into=into)
    assert storage.decoded_before_the_end, "nothing was decoded until every blob had arrived"
    assert "tierkv-decode-behind" in arrays.threads
    assert got.decoded == [0, 2, 3, 5, 6] and got.failed == [1, 4] and got.rejected == 1
    assert got.gone == [keys(7)[1], keys(7)[4]] and keys(7)[4] not in space and storage.calls["delete"] == 1
    assert got.decoded_bytes < got.fetched_bytes and got.verify_s > 0
    for n, i in enumerate(got.decoded):  # the n-th good block in row n, as without decoding behind
        torch.testing.assert_close(into[n], data[i], atol=0.05, rtol=0.05)


@pytest.mark.parametrize("codec", ["raw", "int8"])
@pytest.mark.parametrize("gap", ["missing", "corrupt"])
def test_a_leading_restore_decodes_behind_the_receive_into_the_same_slots(codec: str, gap: str) -> None:
    """With ``decode_behind`` a leading-only restore into ``out`` decodes while the get still receives and
    ends as it would without: the leading run in its slots, a corrupt block deleted, nothing after the gap
    reported."""
    results = {}
    spec = KV if codec == "int8" else RAW
    data = [torch.randn(SHAPE, dtype=torch.float16) for _ in range(6)]
    for behind in (False, True):
        arrays = Recording()
        storage = Backwards(arrays)
        tier = ColdTier(storage, arrays, decode_behind=behind)
        tier.store(spec, [(k, d, TOKENS) for k, d in zip(keys(6), data, strict=True)])
        space = storage.blobs[(spec.role, NS)]
        if gap == "missing":
            del space[keys(6)[3]]
        else:
            bad = space[keys(6)[3]]
            space[keys(6)[3]] = bad[:-1] + bytes([bad[-1] ^ 0xFF])
        slots = torch.full((6, *SHAPE), float("nan"), dtype=torch.float16)
        expect = spec.expect(SHAPE, TOKENS, "float16")
        got = tier.restore(spec, keys(6), expect, slots.__getitem__, leading_only=True)
        assert got.decoded == [0, 1, 2] and got.leading == 3
        assert got.rejected == (gap == "corrupt") and keys(6)[3] not in space  # a corrupt one deleted
        for n in range(3):
            torch.testing.assert_close(slots[n], data[n], atol=0.05, rtol=0.05)
        assert ("tierkv-decode-behind" in arrays.threads) == behind
        assert storage.decoded_before_the_end == behind, "decoded only once every blob had arrived"
        results[behind] = slots[:3]
    assert torch.equal(results[False], results[True])


BLOCK_TOKENS = SHAPE[2]


def row_of(slot: torch.Tensor) -> int:
    """Which block of a :func:`strided_slots` buffer ``slot`` is (its first token over the block size)."""
    return slot.storage_offset() // (slot.stride(2) * BLOCK_TOKENS)


def strided_slots(n: int) -> torch.Tensor:
    """Room for ``n`` blocks laid as an engine's cache lies (every layer's tokens side by side, as the
    transformers hook's buffer): block i is ``[:, :, i*T:(i+1)*T]``, a strided view; NaN until written."""
    layers, kv, tokens, dim = SHAPE
    return torch.full((layers, kv, n * tokens, dim), float("nan"), dtype=torch.bfloat16)


class OneByOne:
    """Arrays that decode blob by blob (no ``decode_slots``): how a run decoded behind the receive was
    decoded before runs were batched."""

    def __init__(self) -> None:
        self.torch = TorchArrays()

    def encode(self, block: torch.Tensor, codec: str, tokens: int, layer_group: LayerGroup) -> bytes:
        return self.torch.encode(block, codec, tokens, layer_group)

    def decode_into(self, blob: bytes, out: torch.Tensor, expect: Expect) -> None:
        self.torch.decode_into(blob, out, expect)


class Burst(MemoryStorage):
    """Hands every blob over in key order, then lets the first decode finish: the run after it holds
    every other blob, gaps and all."""

    def __init__(self, arrived: threading.Event) -> None:
        super().__init__()
        self.arrived = arrived

    def get_each(self, namespace, keys, on_blob, role=Role.KV_COLD):  # type: ignore[no-untyped-def]
        sizes = super().get_each(namespace, keys, on_blob, role)
        self.arrived.set()
        return sizes


@pytest.mark.parametrize("codec", ["raw", "int8"])
@pytest.mark.parametrize("gaps", [("corrupt", "missing"), ("missing", "corrupt")])
def test_a_batched_run_behind_the_receive_fills_every_slot_as_blob_by_blob(
    codec: str, gaps: tuple[str, str]
) -> None:
    """A leading-only restore decoded behind the receive in runs (int8 blobs go to ``decode_slots`` a run
    at once) leaves every slot as decoding blob by blob does, bit for bit: the leading run, the blobs past
    the gaps in their own slots, the gaps unwritten; and the same verdicts (the first gap ends the run, a
    corrupt blob there is reported and deleted)."""
    n = 10
    spec = KV if codec == "int8" else RAW
    data = [torch.randn(SHAPE).to(torch.bfloat16) for _ in range(n)]
    template = MemoryStorage()
    ColdTier(template, TorchArrays()).store(
        spec, [(k, d, TOKENS) for k, d in zip(keys(n), data, strict=True)]
    )
    blobs = dict(template.blobs[(spec.role, NS)])
    for kind, i in zip(gaps, (3, 6), strict=True):
        if kind == "missing":
            del blobs[keys(n)[i]]
        else:
            bad = blobs[keys(n)[i]]
            blobs[keys(n)[i]] = bad[:-1] + bytes([bad[-1] ^ 0xFF])
    arrived = threading.Event()
    batched = Recording(hold=arrived)
    contenders: dict[str, Arrays[torch.Tensor]] = {"batched": batched, "one by one": OneByOne()}
    filled = {}
    for name, arrays in contenders.items():
        storage = Burst(arrived)
        storage.blobs[(spec.role, NS)] = dict(blobs)
        tier = ColdTier(storage, arrays, decode_behind=True)
        buffer = strided_slots(n)
        out = lambda i, b=buffer: b[:, :, i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]
        got = tier.restore(spec, keys(n), spec.expect(SHAPE, TOKENS, "bfloat16"), out, leading_only=True)
        corrupt = 3 if gaps[0] == "corrupt" else None
        assert got.decoded == [0, 1, 2] and got.leading == 3 and got.rejected == (corrupt is not None)
        space = storage.blobs[(spec.role, NS)]
        assert got.gone == [keys(n)[3]] and keys(n)[3] not in space  # missing, or corrupt and deleted
        assert (keys(n)[6] in space) == (gaps[1] == "corrupt"), "past the first gap nothing is settled"
        assert storage.calls["delete"] == (corrupt is not None)
        filled[name] = buffer
    present = [i for i in range(n) if i not in (3, 6)] + [
        i for i, g in zip((3, 6), gaps, strict=True) if g == "corrupt"
    ]
    if codec == "int8":
        assert max(len(run) for run in batched.runs) > 1, "no run decoded more than one blob at once"
        assert sorted(row for run in batched.runs for row in run) == sorted(present)
    else:
        assert batched.runs == [], "raw blobs are copied one by one, as before"
    assert torch.equal(filled["batched"].view(torch.int16), filled["one by one"].view(torch.int16))
    for i in range(n):
        block = filled["batched"][:, :, i * BLOCK_TOKENS : (i + 1) * BLOCK_TOKENS]
        if i in (3, 6):
            assert torch.isnan(block.float()).all(), f"gap {i} written"
        else:
            torch.testing.assert_close(block, data[i], atol=0.05, rtol=0.05)
