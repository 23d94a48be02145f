"""Logical block views over every KV registration layout vLLM has used, on real torch tensors."""

from __future__ import annotations

import pytest
import torch

from tierkv.connectors.vllm.layout import (
    AttentionGeometry,
    KVGroupView,
    StateGroupView,
    attention_view,
    state_tensors,
)
from tierkv.errors import ConfigError

B, H, N, D = 7, 2, 4, 3
GEOM = AttentionGeometry(num_blocks=B, num_kv_heads=H, block_size=N, head_size=D)


def logical_reference(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, 2D]`` from K and V given as ``[B, N, H, D]``."""
    return torch.cat([k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)], dim=-1)


def registrations(k: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same K/V in each layout, as vLLM would register it."""
    kv_nhd = torch.stack([k, v])  # [2, B, N, H, D]
    return {
        "logical": logical_reference(k, v).contiguous(),
        "logical-strided": logical_reference(k, v).permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3),
        "2BNHD": kv_nhd,
        "2BHND": kv_nhd.permute(0, 1, 3, 2, 4).contiguous(),
        "B2NHD": kv_nhd.permute(1, 0, 2, 3, 4).contiguous(),
        "B2HND": kv_nhd.permute(1, 0, 3, 2, 4).contiguous(),
    }


@pytest.fixture
def kv() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn((B, N, H, D), generator=gen), torch.randn((B, N, H, D), generator=gen)


@pytest.mark.parametrize("layout", ["logical", "logical-strided", "2BNHD", "2BHND", "B2NHD", "B2HND"])
def test_gather_gives_the_logical_blocks(kv: tuple[torch.Tensor, torch.Tensor], layout: str) -> None:
    k, v = kv
    tensor = registrations(k, v)[layout]
    hint = "LBHNC" if "HN" in layout else "LBNHC"
    view = attention_view("layer", tensor, GEOM, hint)
    ids = torch.tensor([5, 1, 3])
    assert torch.equal(view.gather(ids), logical_reference(k, v)[ids])


@pytest.mark.parametrize("layout", ["logical", "logical-strided", "2BNHD", "2BHND", "B2NHD", "B2HND"])
def test_scatter_writes_only_the_target_blocks(kv: tuple[torch.Tensor, torch.Tensor], layout: str) -> None:
    k, v = kv
    tensor = registrations(k, v)[layout]
    original = tensor.clone()
    view = attention_view("layer", tensor, GEOM, "LBHNC" if "HN" in layout else "LBNHC")
    blocks = torch.arange(2 * H * N * 2 * D, dtype=torch.float32).reshape(2, H, N, 2 * D)
    view.scatter(torch.tensor([6, 0]), blocks)
    assert torch.equal(view.gather(torch.tensor([6, 0])), blocks)
    untouched = torch.tensor([1, 2, 3, 4, 5])
    assert torch.equal(view.gather(untouched), attention_view("x", original, GEOM, "LBHNC").gather(untouched))


@pytest.mark.parametrize("layout", ["logical", "logical-strided", "2BNHD", "2BHND", "B2NHD", "B2HND"])
def test_write_of_one_block_is_scatter_of_one(kv: tuple[torch.Tensor, torch.Tensor], layout: str) -> None:
    """The restore path writes blocks one at a time as they arrive; the result must be the scatter's."""
    k, v = kv
    hint = "LBHNC" if "HN" in layout else "LBNHC"
    by_write, by_scatter = registrations(k, v)[layout], registrations(k, v)[layout].clone()
    written, scattered = (
        attention_view("a", by_write, GEOM, hint),
        attention_view("b", by_scatter, GEOM, hint),
    )
    blocks = torch.randn(2, H, N, 2 * D)
    written.write(6, blocks[0])
    written.write(2, blocks[1])
    scattered.scatter(torch.tensor([6, 2]), blocks)
    assert torch.equal(by_write, by_scatter)
    assert torch.equal(written.gather(torch.tensor([6, 2])), blocks)


def test_write_regroups_kernel_blocks_and_mla_latents() -> None:
    geom = AttentionGeometry(num_blocks=3, num_kv_heads=H, block_size=8, head_size=D)
    tensor = torch.randn(6, H, 4, 2 * D)
    view = attention_view("layer", tensor, geom)
    block = torch.randn(H, 8, 2 * D)
    view.write(1, block)
    assert torch.equal(view.gather(torch.tensor([1]))[0], block) and torch.equal(tensor[2], block[:, :4])
    mla = AttentionGeometry(num_blocks=B, num_kv_heads=1, block_size=N, head_size=9, mla=True)
    latents = torch.randn(B, N, 9)
    view = attention_view("mla", latents, mla)
    block = torch.randn(1, N, 9)
    view.write(3, block)
    assert torch.equal(latents[3], block[0])


def test_group_write_goes_layer_by_layer_and_state_write_is_bit_exact() -> None:
    layers = [torch.zeros(B, H, N, 2 * D) for _ in range(3)]
    group = KVGroupView([attention_view(f"l{i}", t, GEOM) for i, t in enumerate(layers)])
    block = torch.randn(3, H, N, 2 * D)
    group.write(5, block)
    assert all(torch.equal(layers[i][5], block[i]) for i in range(3))
    assert all(torch.count_nonzero(layers[i][:5]) == 0 for i in range(3))
    pages = [torch.zeros(B, 1, 1, 16, dtype=torch.int8) for _ in range(2)]
    states = StateGroupView(["s0", "s1"], [state_tensors(f"s{i}", p) for i, p in enumerate(pages)])
    raw = torch.randint(-128, 127, (2, 16), dtype=torch.int8)
    states.write(4, raw.view(torch.float16))
    assert all(torch.equal(pages[i][4].reshape(-1), raw[i]) for i in range(2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dense_blocks_are_written_as_bytes_into_their_own_memory(dtype: torch.dtype) -> None:
    """A dense CPU cache takes a block's bytes by numpy copy; the values land exactly where torch's
    indexing puts them, and nothing else changes."""
    k, v = torch.randn((B, N, H, D)), torch.randn((B, N, H, D))
    tensor = logical_reference(k, v).to(dtype).contiguous()
    before = tensor.clone()
    view = attention_view("layer", tensor, GEOM)
    assert view.takes_bytes
    block = torch.randn(H, N, 2 * D).to(dtype)
    view.write(4, block)
    assert torch.equal(tensor[4], block)
    assert torch.equal(tensor[:4], before[:4]) and torch.equal(tensor[5:], before[5:])


def test_strided_and_legacy_layouts_never_take_bytes(kv: tuple[torch.Tensor, torch.Tensor]) -> None:
    for layout, tensor in registrations(*kv).items():
        view = attention_view("layer", tensor, GEOM, "LBHNC" if "HN" in layout else "LBNHC")
        assert view.takes_bytes is (layout == "logical"), layout


def test_byte_writes_refuse_a_wrong_block_or_size() -> None:
    tensor = torch.zeros(B, H, N, 2 * D)
    view = attention_view("layer", tensor, GEOM)
    row = torch.ones(H, N, 2 * D).view(torch.uint8).numpy().reshape(-1)
    with pytest.raises(IndexError):
        view.write_bytes(B, row)
    with pytest.raises(IndexError):
        view.write_bytes(-1, row)
    with pytest.raises(ValueError, match="bytes for a block"):
        view.write_bytes(0, row[:1])
    assert torch.count_nonzero(tensor) == 0
    legacy = attention_view("legacy", torch.zeros(2, B, N, H, D), GEOM)
    with pytest.raises(ValueError, match="no dense block rows"):
        legacy.write_bytes(0, row)


def test_byte_rows_are_each_layers_block_memory_in_payload_order() -> None:
    """What a restore receives straight into: a group's rows of one block, layer by layer, are the
    cache's own memory (bytes written there are the block's values); none unless every layer is dense."""
    layers = [torch.zeros(B, H, N, 2 * D) for _ in range(3)]
    group = KVGroupView([attention_view(f"l{i}", t, GEOM) for i, t in enumerate(layers)])
    block = torch.randn(3, H, N, 2 * D)
    rows = group.byte_rows(5)
    assert rows is not None and [len(r) for r in rows] == [block[0].numel() * 4] * 3
    payload = block.view(torch.uint8).numpy().reshape(-1)
    for i, row in enumerate(rows):
        row[:] = payload[i * len(row) : (i + 1) * len(row)]
    assert all(torch.equal(layers[i][5], block[i]) for i in range(3))
    assert all(torch.count_nonzero(layers[i][:5]) == 0 for i in range(3))
    with pytest.raises(IndexError):
        group.byte_rows(B)
    legacy = KVGroupView([attention_view("legacy", torch.zeros(2, B, N, H, D), GEOM)])
    assert legacy.byte_rows(0) is None


def test_kernel_blocks_smaller_than_manager_blocks_are_regrouped() -> None:
    geom = AttentionGeometry(num_blocks=3, num_kv_heads=H, block_size=8, head_size=D)
    tensor = torch.randn(6, H, 4, 2 * D)  # two kernel blocks of 4 tokens per manager block of 8
    view = attention_view("layer", tensor, geom)
    assert view.split == 2
    got = view.gather(torch.tensor([1]))
    assert torch.equal(got[0], torch.cat([tensor[2], tensor[3]], dim=1))
    view.scatter(torch.tensor([2]), got)
    assert torch.equal(tensor[4:6], tensor[2:4])


def test_mla_latent_is_one_head_wide() -> None:
    geom = AttentionGeometry(num_blocks=B, num_kv_heads=1, block_size=N, head_size=9, mla=True)
    tensor = torch.randn(B, N, 9)
    view = attention_view("mla", tensor, geom)
    assert torch.equal(view.gather(torch.tensor([2]))[0, 0], tensor[2])


def test_unknown_or_ambiguous_layouts_are_refused() -> None:
    with pytest.raises(ConfigError, match="unrecognised KV cache shape"):
        attention_view("layer", torch.zeros(B, N, H, 5), GEOM)
    square = AttentionGeometry(num_blocks=B, num_kv_heads=4, block_size=4, head_size=D)
    legacy = torch.zeros(2, B, 4, 4, D)  # NHD and HND look alike when heads == block_size
    with pytest.raises(ConfigError):
        attention_view("layer", legacy, square)
    assert attention_view("layer", legacy, square, "LBHNC").layout.name == "2BHND"
    assert attention_view("layer", legacy, square, "NHD").layout.name == "2BNHD"


def test_group_view_stacks_layers_and_keeps_dtype() -> None:
    layers = [torch.randn(B, H, N, 2 * D, dtype=torch.float16) for _ in range(3)]
    group = KVGroupView([attention_view(f"l{i}", t, GEOM) for i, t in enumerate(layers)])
    assert group.block_shape == (3, H, N, 2 * D)
    got = group.gather([4])
    assert got.dtype == torch.float16
    assert all(torch.equal(got[0, i], layers[i][4]) for i in range(3))
    group.scatter([0], got.to(torch.float32))
    assert all(torch.equal(layers[i][0], layers[i][4]) for i in range(3))


def test_state_pages_round_trip_bit_exact_from_typed_tensors() -> None:
    conv = [torch.randn(B, 3, 5, dtype=torch.bfloat16) for _ in range(2)]
    ssm = [torch.randn(B, 2, 4, 4) for _ in range(2)]
    ssm[1][3, 0, 0, 0] = float("nan")
    view = StateGroupView(["m0", "m1"], [state_tensors(f"m{i}", [conv[i], ssm[i]]) for i in range(2)])
    page = 3 * 5 * 2 + 2 * 4 * 4 * 4
    assert view.block_shape == (2, page // 2)
    got = view.gather([3, 6])
    assert got.dtype == torch.float16
    raw = got[0, 1].view(torch.uint8)
    assert torch.equal(
        raw, torch.cat([conv[1][3].reshape(-1).view(torch.uint8), ssm[1][3].reshape(-1).view(torch.uint8)])
    )
    view.scatter([0, 1], got)
    for i in range(2):
        assert torch.equal(conv[i][0].view(torch.int16), conv[i][3].view(torch.int16))
        assert torch.equal(ssm[i][1].view(torch.int32), ssm[i][6].view(torch.int32))


def test_state_pages_from_a_registered_byte_page() -> None:
    pool = torch.zeros(B * 64, dtype=torch.int8)
    page = pool.view(B, 64)[:, :40].view(B, 1, 1, 40)  # vLLM CPU: int8 [blocks, 1, 1, bytes], strided
    page.copy_(torch.randint(-128, 127, (B, 1, 1, 40), dtype=torch.int8))
    view = StateGroupView(["m"], [state_tensors("m", page)])
    got = view.gather([2])
    view.scatter([5], got)
    assert torch.equal(page[5], page[2])
    assert torch.count_nonzero(pool.view(B, 64)[:, 40:]) == 0, "bytes outside the page stay untouched"


def test_state_views_refuse_what_they_cannot_copy_exactly() -> None:
    with pytest.raises(ConfigError, match="differ across layers"):
        StateGroupView(["a", "b"], [[torch.zeros(B, 4)], [torch.zeros(B, 8)]])
    with pytest.raises(ConfigError, match="not even"):
        StateGroupView(["a"], [[torch.zeros(B, 3, dtype=torch.int8)]])
    with pytest.raises(ConfigError, match="not dense"):
        StateGroupView(["a"], [[torch.zeros(B, 4, 2).transpose(1, 2)]])
    with pytest.raises(ConfigError, match="unsupported state cache"):
        state_tensors("m", {"not": "a tensor"})
