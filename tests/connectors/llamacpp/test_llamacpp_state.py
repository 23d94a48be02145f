"""The llama.cpp KV-state codec on synthetic states (no llama.cpp needed): parse, cut, rebuild, refuse.

The states are written by ``synthetic.write`` in llama.cpp's field order; a leading run of blocks must
rebuild to exactly the bytes llama.cpp would write for that many tokens (the oracle's truncated state).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.connectors.llamacpp import synthetic
from tierkv.connectors.llamacpp.state import Envelope, blocks, parse, rebuild
from tierkv.errors import UnsupportedStateError

F16, Q8_0, Q4_0, F32 = 1, 8, 2, 0


def _same_data(parsed: list[np.ndarray], s: synthetic.Synthetic) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(parsed, s.k + s.v, strict=True))


@pytest.mark.parametrize(
    ("k_type", "v_type", "v_trans"),
    [(F16, F16, False), (F16, F16, True), (Q8_0, Q8_0, False), (Q4_0, Q8_0, False), (Q8_0, F32, True)],
)
def test_parse_reads_every_field(k_type: int, v_type: int, v_trans: bool) -> None:
    s = synthetic.make(40, layers=3, k_type=k_type, v_type=v_type, v_trans=v_trans)
    state = parse(synthetic.write(s))
    assert state.cells == 40 and state.envelope == Envelope(0, "", 1)
    assert state.layout is not None and state.layout.v_trans is v_trans and state.layout.n_layer == 3
    assert {x.ggml_type for x in state.layout.k} == {k_type}
    assert {x.ggml_type for x in state.layout.v} == {v_type}
    assert _same_data(state.data, s)
    per_token = sum(a.nbytes for a in s.k + s.v) // 40
    assert state.layout.token_bytes == per_token


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize(("arch", "n_stream", "seq"), [("", 1, 0), ("", 3, 2), ("llama", 1, 0)])
def test_a_leading_run_rebuilds_to_the_bytes_of_that_many_tokens(
    v_trans: bool, arch: str, n_stream: int, seq: int
) -> None:
    block = 8
    s = synthetic.make(45, v_trans=v_trans, k_type=Q8_0, seq_id=seq)
    state = parse(synthetic.write(s, arch=arch, n_stream=n_stream), seq_id=seq)
    assert state.layout is not None
    cut = list(blocks(state, block))
    assert len(cut) == 5 and all(b.shape == (state.layout.block_bytes(block),) for b in cut)
    for m in (0, 1, 3, 5):
        rebuilt = rebuild(state.layout, cut[:m], block, state.envelope)
        assert rebuilt == synthetic.write(synthetic.prefix(s, m * block), arch=arch, n_stream=n_stream)


def test_blocks_from_a_middle_start_are_the_same_blocks() -> None:
    state = parse(synthetic.write(synthetic.make(64, v_trans=True)))
    every = list(blocks(state, 16))
    tail = list(blocks(state, 16, start=2))
    assert all(np.array_equal(a, b) for a, b in zip(every[2:], tail, strict=True))
    with pytest.raises(ValueError, match=r"blocks 3\.\.5"):
        list(blocks(state, 16, 3, 5))


@settings(max_examples=40, deadline=None)
@given(
    cells=st.integers(0, 70),
    block=st.integers(1, 17),
    layers=st.integers(1, 3),
    v_trans=st.booleans(),
    types=st.sampled_from([(F16, F16), (Q8_0, Q8_0), (Q4_0, Q4_0), (F32, F16)]),
    seed=st.integers(0, 2**16),
)
def test_cut_and_rebuild_round_trip(
    cells: int, block: int, layers: int, v_trans: bool, types: tuple[int, int], seed: int
) -> None:
    k_type, v_type = types
    if v_trans and v_type in (Q8_0, Q4_0):
        v_type = F16  # llama.cpp transposes V only without flash attention, which needs a plain type
    s = synthetic.make(cells, layers=layers, k_type=k_type, v_type=v_type, v_trans=v_trans, seed=seed)
    state = parse(synthetic.write(s))
    full = cells // block
    if state.layout is None:
        assert cells == 0
        return
    rebuilt = parse(rebuild(state.layout, list(blocks(state, block)), block, state.envelope))
    assert rebuilt.cells == full * block
    assert rebuilt.layout == (state.layout if full else None)
    assert _same_data(rebuilt.data, synthetic.prefix(s, full * block)) if full else not rebuilt.data


def test_an_empty_state_parses_and_rebuilds() -> None:
    empty = synthetic.make(0)
    state = parse(synthetic.write(empty, n_stream=2))
    assert state.cells == 0 and state.layout is None and state.envelope.n_stream == 2
    layout = parse(synthetic.write(synthetic.make(4))).layout
    assert layout is not None
    assert rebuild(layout, np.empty((0, layout.block_bytes(4)), np.uint8), 4, state.envelope) == (
        synthetic.write(empty, n_stream=2)
    )


def test_rebuild_refuses_blocks_of_another_layout() -> None:
    state = parse(synthetic.write(synthetic.make(16)))
    assert state.layout is not None
    with pytest.raises(ValueError, match="the layout has"):
        rebuild(state.layout, np.zeros((1, 10), np.uint8), 16, state.envelope)


def test_layout_description_pins_types_sizes_and_v_layout() -> None:
    def describe(**kw: object) -> str:
        layout = parse(synthetic.write(synthetic.make(4, **kw))).layout  # type: ignore[arg-type]
        assert layout is not None
        return layout.describe()

    base = describe()
    assert base.startswith("llama.cpp-kv-state/1/L2/vtrans0/k[f16:128,f16:128]")
    assert len({base, describe(v_trans=True), describe(k_type=Q8_0), describe(layers=3)}) == 4
    assert describe(n_embd=64) == base and describe(seed=5) == base  # content never enters it


def _refused(data: bytes, match: str, **kw: int) -> None:
    with pytest.raises(UnsupportedStateError, match=match):
        parse(data, **kw)


def test_unknown_headers_and_sequences_are_refused() -> None:
    s = synthetic.make(8)
    _refused(synthetic.write(s, magic=0x12345678), "unknown state header")
    _refused(synthetic.write(s), "state of sequence 0, expected 1", seq_id=1)
    _refused(struct.pack("<IiI", synthetic.MAGIC, 0, 0), "0 KV streams")
    _refused(b"\x00\x00", "ends inside state header")


def test_sliding_window_recurrent_and_mrope_layouts_are_refused() -> None:
    s = synthetic.make(8)
    one = synthetic.write(s)
    # an iSWA memory writes its sliding-window cache after the base cache; a hybrid its recurrent state
    _refused(one + synthetic.write(s)[8:], "sliding-window, recurrent, hybrid and M-RoPE")
    _refused(synthetic.write(s, cell_ext=b"\x01\x00\x00\x00" * 3), "sequence")


def test_truncated_states_are_refused_at_every_cut() -> None:
    data = synthetic.write(synthetic.make(8, v_trans=True))
    for cut in range(0, len(data) - 1, 97):
        with pytest.raises(UnsupportedStateError):
            parse(data[:cut])


def test_cells_that_cannot_be_cut_into_token_blocks_are_refused() -> None:
    s = synthetic.make(8)
    s.positions = [1, 0, *range(2, 8)]
    _refused(synthetic.write(s), "positions are not 0..n-1")
    s = synthetic.make(8)
    s.seq_ids = [[0, 1]] * 8
    _refused(synthetic.write(s), "several sequences")
    s = synthetic.make(8)
    s.seq_ids = [[3]] * 8
    _refused(synthetic.write(s), "other than 0")


def test_cells_in_two_streams_are_refused() -> None:
    s = synthetic.make(8)
    one = synthetic.write(s, n_stream=2)
    body = synthetic.write(s)[12:]  # the stream after the envelope and stream count
    two = one[:12] + body + body
    _refused(two, "more than one stream")


def test_unknown_types_and_odd_sizes_are_refused() -> None:
    _refused(synthetic.write(synthetic.make(8, k_type=12, n_embd=256)), "ggml type 12")
    _refused(synthetic.write(synthetic.make(8, v_type=Q8_0, v_trans=True)), "q8_0 elements")
    bad = bytearray(synthetic.write(synthetic.make(8, k_type=Q8_0)))
    row_at = 12 + 4 + 8 * 12 + 8 + 4  # envelope, cell count, 8 cells, layer header, K type
    struct.pack_into("<Q", bad, row_at, 35)
    _refused(bytes(bad), "not whole q8_0 blocks")
