"""The packed MXFP8 scale layout: reference packing, MFMA-model decoding, padding, views, E8M0, cache."""

from __future__ import annotations

import pytest
import torch

from te_flydsl_plugin.flydsl import mx_layout as mx

from .helpers import te_scales

SHAPES = [(1, 32), (16, 128), (200, 32 * 37), (128, 512), (130, 544), (257, 2048), (64, 96)]


@pytest.mark.parametrize("dim", [1, 0])
@pytest.mark.parametrize(("rows", "k"), SHAPES)
def test_round_trip_with_poisoned_padding(rows: int, k: int, dim: int) -> None:
    scales, truth = te_scales(rows, k, dim)
    packed = mx.pack_scales(scales, rows, k, dim)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == mx.packed_shape(rows, k)
    assert packed.is_contiguous()
    assert torch.equal(mx.unpack_scales(packed, rows, k), truth)


@pytest.mark.parametrize("dim", [1, 0])
def test_padding_never_read(dim: int) -> None:
    """Two tensors differing only in their padding pack to identical bytes, and every packed
    position outside the real scales holds 127."""
    rows, k = 130, 32 * 7
    a, _ = te_scales(rows, k, dim, poison=255)
    b, _ = te_scales(rows, k, dim, poison=None)
    pa, pb = mx.pack_scales(a, rows, k, dim), mx.pack_scales(b, rows, k, dim)
    assert torch.equal(pa, pb)
    r_t, t_n = pa.shape[:2]
    row = torch.arange(r_t * 16).view(-1, 1)
    kblock = torch.arange(t_n * 16).view(1, -1)
    grid = mx.mfma_scale_byte(pa, rows, k, row, kblock)
    real = (row < rows) & (kblock < k // 32)
    assert bool((grid[~real] == mx.PAD_BYTE).all())


def test_layout_formula_and_lane_model() -> None:
    """packed[R, T, g, i, b] = s[16R + i, 16T + 4b + g]; as int32, lane 16g + i, byte b = K-step 4T + b."""
    rows, k = 48, 32 * 40
    scales, truth = te_scales(rows, k, 1)
    packed = mx.pack_scales(scales, rows, k, 1)
    words = packed.view(torch.int32)
    for r, j in [(0, 0), (5, 3), (17, 4), (47, 39), (33, 21), (20, 16)]:
        R, i, t, g = r // 16, r % 16, j // 4, j % 4
        T, b = t // 4, t % 4
        assert packed[R, T, g, i, b] == truth[r, j]
        lane = 16 * g + i
        word = int(words.view(-1)[(R * packed.shape[1] + T) * 64 + lane]) & 0xFFFFFFFF
        assert (word >> (8 * b)) & 0xFF == int(truth[r, j])  # what op_sel byte b hands the MFMA


def _views(rows: int, k: int, dim: int) -> list[torch.Tensor]:
    base, _ = te_scales(rows, k, dim)
    p0, p1 = base.shape
    wide = torch.full((p0 + 3, p1 + 5), 255, dtype=torch.uint8)
    wide[2 : 2 + p0, 3 : 3 + p1] = base
    sliced = wide[2 : 2 + p0, 3 : 3 + p1]  # storage offset, row stride != width
    col_major = base.t().contiguous().t()  # unit stride on dim 0
    stepped_store = torch.full((2 * p0, 3 * p1), 255, dtype=torch.uint8)
    stepped_store[::2, ::3] = base
    stepped = stepped_store[::2, ::3]  # no unit stride at all
    return [base, sliced, col_major, stepped]


@pytest.mark.parametrize("dim", [1, 0])
def test_non_contiguous_views(dim: int) -> None:
    rows, k = 70, 32 * 9
    views = _views(rows, k, dim)
    want = mx.pack_scales(views[0], rows, k, dim)
    for v in views[1:]:
        assert not v.is_contiguous()
        assert torch.equal(mx.pack_scales(v, rows, k, dim), want)


def test_out_written_in_place_and_checked() -> None:
    rows, k = 40, 32 * 6
    scales, truth = te_scales(rows, k, 1)
    out = torch.zeros(mx.packed_shape(rows, k), dtype=torch.uint8)
    assert mx.pack_scales(scales, rows, k, 1, out=out) is out
    assert torch.equal(mx.unpack_scales(out, rows, k), truth)
    bad = torch.zeros((*mx.packed_shape(rows, k)[:-1], 8), dtype=torch.uint8)[..., ::2]
    with pytest.raises(ValueError, match="contiguous"):
        mx.pack_scales(scales, rows, k, 1, out=bad)
    with pytest.raises(ValueError, match="out must be"):
        mx.pack_scales(scales, rows, k, 1, out=torch.zeros(3, dtype=torch.uint8))


def test_declines_are_pure_and_match_raises() -> None:
    assert mx.unsupported_reason(128, 4096) is None
    reason = mx.unsupported_reason(128, 100)
    assert reason and "multiple of 32" in reason
    with pytest.raises(ValueError, match="multiple of 32"):
        mx.pack_scales(torch.zeros((128, 4), dtype=torch.uint8), 128, 100, 1)
    with pytest.raises(ValueError, match="do not cover"):
        mx.pack_scales(torch.zeros((128, 4), dtype=torch.uint8), 129, 128, 1)
    with pytest.raises(ValueError, match="uint8"):
        mx.pack_scales(torch.zeros((128, 4), dtype=torch.int32), 128, 128, 1)


def test_packed_shape_and_empty() -> None:
    assert mx.packed_shape(256, 4096) == (16, 8, 4, 16, 4)
    assert mx.packed_bytes(256, 4096) == 256 * 4096 // 32
    assert mx.packed_shape(17, 544) == (2, 2, 4, 16, 4)
    empty = mx.pack_scales(torch.zeros((0, 4), dtype=torch.uint8), 0, 128, 1)
    assert empty.numel() == 0


def test_e8m0_to_float() -> None:
    u8 = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    f = mx.e8m0_to_float(u8)
    assert f.dtype == torch.float32
    assert f[127] == 1.0 and f[128] == 2.0 and f[126] == 0.5 and f[254] == 2.0**127
    assert f[0] == 2.0**-127 and f[1] == 2.0**-126
    assert torch.isnan(f[255]) and not torch.isnan(f[:255]).any()
    exact = torch.exp2(torch.arange(255, dtype=torch.float64) - 127).to(torch.float32)
    assert torch.equal(f[:255], exact)
