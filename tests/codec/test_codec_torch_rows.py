"""Many blobs into the rows of one tensor: the same bits as blob by blob, bad blobs skipped, not written."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tierkv.codec import torch_rows  # noqa: E402
from tierkv.codec.expect import Expect  # noqa: E402
from tierkv.codec.torch_codec import decode_tensor, encode_tensor  # noqa: E402
from tierkv.codec.torch_rows import decode_rows, decode_slots  # noqa: E402
from tierkv.errors import CodecError, CorruptBlobError  # noqa: E402

SHAPE = (2, 3, 4, 16)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

KINDS = ["int8", "int8", "int8", "int8-inf", "raw", "corrupt", "wrong-shape"]
"""What each blob of a restore may be: mostly plain int8 (the runs decoded at once), an int8 blob with an
exception table, a raw one, one whose bytes were damaged and one of another shape."""


def make_blob(kind: str, dtype: torch.dtype, seed: int) -> bytes:
    values = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)) * (1 + seed % 5)
    if kind == "int8-inf":
        values[0, 0, 0, 3] = float("inf")
    if kind == "wrong-shape":
        values = values[:1]
    blob = bytearray(encode_tensor(values.to(dtype), codec="raw" if kind == "raw" else "int8", tokens=4))
    if kind == "corrupt":
        blob[-5] ^= 0x40
    return bytes(blob)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32 if tensor.dtype == torch.float32 else torch.int16)


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=9),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
)
def test_rows_hold_what_blob_by_blob_decoding_gives_and_bad_blobs_are_skipped(
    kinds: list[str], dtype: torch.dtype, seed: int
) -> None:
    blobs = [make_blob(kind, dtype, seed + i) for i, kind in enumerate(kinds)]
    into = torch.full((len(blobs), *SHAPE), float("nan"), dtype=dtype)
    verdicts = decode_rows(blobs, into, Expect(shape=SHAPE, tokens=4))

    good = [b for b, k in zip(blobs, kinds, strict=True) if k not in ("corrupt", "wrong-shape")]
    assert [v is None for v in verdicts] == [k not in ("corrupt", "wrong-shape") for k in kinds]
    for v, kind in zip(verdicts, kinds, strict=True):
        if kind == "corrupt":
            assert isinstance(v, CorruptBlobError)
        elif kind == "wrong-shape":
            assert isinstance(v, CodecError) and "shape" in str(v)
    for n, blob in enumerate(good):
        _, expected = decode_tensor(blob, dtype=dtype)
        assert torch.equal(bits(into[n]), bits(expected)), f"row {n}"
    assert torch.isnan(into[len(good) :].float()).all(), "rows past the good blobs are not written"


def test_a_run_of_int8_blobs_is_staged_and_scaled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blob by blob decoding is the exception: a run sharing a layout goes through one scaling."""
    runs: list[int] = []
    scale = torch_rows.scale_groups
    monkeypatch.setattr(
        torch_rows, "scale_groups", lambda q, s, dst, **kw: (runs.append(q.shape[0]), scale(q, s, dst, **kw))
    )
    blobs = [make_blob("int8", torch.float16, i) for i in range(5)]
    into = torch.empty((5, *SHAPE), dtype=torch.float16)
    assert decode_rows(blobs, into) == [None] * 5
    groups_per_blob = 2 * 3 * 4  # the default group is the last dimension
    assert runs == [5 * groups_per_blob]


def test_rows_of_a_strided_tensor_hold_what_blob_by_blob_decoding_gives() -> None:
    blobs = [make_blob("int8", torch.float32, i) for i in range(3)]
    whole = torch.zeros((3, *SHAPE[:-1], 2 * SHAPE[-1]))
    into = whole[..., : SHAPE[-1]]
    assert not into.is_contiguous()
    assert decode_rows(blobs, into) == [None] * 3
    for n, blob in enumerate(blobs):
        assert torch.equal(into[n], decode_tensor(blob)[1])
    assert not whole[..., SHAPE[-1] :].any()


@settings(max_examples=40, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=9),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 1000),
    order=st.randoms(use_true_random=False),
)
def test_slots_hold_what_blob_by_blob_decoding_gives_and_bad_slots_are_left_alone(
    kinds: list[str], dtype: torch.dtype, seed: int, order: random.Random
) -> None:
    """Blob k into slot k wherever the slots lie: strided views of one buffer, in shuffled places."""
    blobs = [make_blob(kind, dtype, seed + i) for i, kind in enumerate(kinds)]
    places = list(range(len(blobs) + 2))
    order.shuffle(places)
    whole = torch.full((*SHAPE[:-1], len(places) * SHAPE[-1]), float("nan"), dtype=dtype)
    slots = [whole[..., p * SHAPE[-1] : (p + 1) * SHAPE[-1]] for p in places[: len(blobs)]]
    verdicts = decode_slots(blobs, slots, Expect(shape=SHAPE, tokens=4))

    for blob, kind, verdict, slot in zip(blobs, kinds, verdicts, slots, strict=True):
        if kind == "corrupt":
            assert isinstance(verdict, CorruptBlobError)
        elif kind == "wrong-shape":
            assert isinstance(verdict, CodecError) and "shape" in str(verdict)
        else:
            assert verdict is None
            assert torch.equal(bits(slot), bits(decode_tensor(blob, dtype=dtype)[1])), kind
            continue
        assert torch.isnan(slot.float()).all(), f"the slot of a {kind} blob was written"
    for p in places[len(blobs) :]:
        assert torch.isnan(whole[..., p * SHAPE[-1] : (p + 1) * SHAPE[-1]].float()).all()


def test_a_run_of_int8_blobs_bound_for_slots_is_scaled_in_steps_of_whole_blobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Slots of a run share one staging and one scaling per step, never one per blob."""
    monkeypatch.setattr(torch_rows, "CPU_DECODE_VALUES", 2 * 2 * 3 * 4 * 16)  # two blobs a step
    widened: list[int] = []
    real = torch_rows.cpu_scratch
    monkeypatch.setattr(torch_rows, "cpu_scratch", lambda n: (widened.append(n), real(n))[1])
    blobs = [make_blob("int8", torch.bfloat16, i) for i in range(5)]
    whole = torch.zeros((*SHAPE[:-1], 5 * SHAPE[-1]), dtype=torch.bfloat16)
    slots = [whole[..., i * SHAPE[-1] : (i + 1) * SHAPE[-1]] for i in range(5)]
    assert decode_slots(blobs, slots) == [None] * 5
    assert widened == [2 * 2 * 3 * 4 * 16], "one scratch for the run, of one step's values"
    for slot, blob in zip(slots, blobs, strict=True):
        assert torch.equal(bits(slot), bits(decode_tensor(blob)[1]))


def test_a_slot_of_another_shape_or_dtype_is_a_verdict_not_an_error() -> None:
    blobs = [make_blob("int8", torch.float32, i) for i in range(3)]
    slots = [torch.zeros(SHAPE), torch.zeros((1, *SHAPE[1:])), torch.zeros(SHAPE, dtype=torch.int32)]
    verdicts = decode_slots(blobs, slots)
    assert verdicts[0] is None and torch.equal(slots[0], decode_tensor(blobs[0])[1])
    assert isinstance(verdicts[1], CodecError) and "decodes to" in str(verdicts[1]) and not slots[1].any()
    assert isinstance(verdicts[2], CodecError) and "dtype" in str(verdicts[2]) and not slots[2].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_on_a_cuda_tensor_hold_what_the_cpu_decodes(dtype: torch.dtype) -> None:
    kinds = ["int8", "int8", "raw", "int8-inf", "corrupt"]
    blobs = [make_blob(kind, dtype, i) for i, kind in enumerate(kinds)]
    into = torch.full((len(blobs), *SHAPE), float("nan"), dtype=dtype, device="cuda")
    verdicts = decode_rows(blobs, into, Expect(shape=SHAPE))
    assert [v is None for v in verdicts] == [True, True, True, True, False]
    for n, blob in enumerate(blobs[:4]):
        assert torch.equal(bits(into[n].cpu()), bits(decode_tensor(blob, dtype=dtype)[1])), f"row {n}"
    assert torch.isnan(into[4].float()).all()
