"""The narrow number formats against torch and against their definitions, at the edge values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from te_flydsl_plugin.emulator import numerics as nm

pytestmark = pytest.mark.emulator

_TORCH_FP8 = {"e4m3": (nm.E4M3, torch.float8_e4m3fn), "e5m2": (nm.E5M2, torch.float8_e5m2)}


@pytest.mark.parametrize("name", sorted(_TORCH_FP8))
def test_fp8_decode_matches_torch(name: str) -> None:
    fmt, dt = _TORCH_FP8[name]
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(dt).float().numpy()
    np.testing.assert_array_equal(nm.decode_table(fmt), want)  # NaN == NaN for assert_array_equal


@pytest.mark.parametrize("name", sorted(_TORCH_FP8))
def test_fp8_encode_matches_torch_in_range(name: str) -> None:
    fmt, dt = _TORCH_FP8[name]
    vmax = float(torch.finfo(dt).max)
    tiny = float(torch.finfo(dt).smallest_normal)
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.uniform(-vmax, vmax, 4000),
            rng.uniform(-4 * tiny, 4 * tiny, 4000),  # subnormals and the normal boundary
            nm.decode_table(fmt)[np.isfinite(nm.decode_table(fmt))],  # every finite code, exactly
            [0.0, -0.0, vmax, -vmax, tiny, tiny / 8],
        ]
    ).astype(np.float32)
    want = torch.from_numpy(x).to(dt).view(torch.uint8).numpy()
    np.testing.assert_array_equal(nm.encode(fmt, x, saturate=False), want)


def test_fp8_overflow_and_specials() -> None:
    big = np.array([1e6, -1e6, np.inf, -np.inf, np.nan, 464.0, 480.0], np.float32)
    # E4M3 has no Inf: non-saturating overflow is NaN (0x7F/0xFF), saturating is +-448 (0x7E/0xFE).
    # 464 is the tie between 448 (0x7E, even) and the next step: it rounds to 448.
    assert list(nm.encode(nm.E4M3, big, saturate=False)) == [0x7F, 0xFF, 0x7F, 0xFF, 0x7F, 0x7E, 0x7F]
    assert list(nm.encode(nm.E4M3, big, saturate=True)) == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7E, 0x7E]
    # E5M2: max 57344 (0x7B); overflow -> Inf (0x7C), saturating -> max.
    e5 = np.array([1e6, -1e6, np.inf, np.nan, 57344.0, 61440.0], np.float32)
    assert list(nm.encode(nm.E5M2, e5, saturate=False))[:3] == [0x7C, 0xFC, 0x7C]
    assert nm.decode_table(nm.E5M2)[nm.encode(nm.E5M2, e5, saturate=False)[3]] != nm.decode_table(nm.E5M2)[0]
    assert np.isnan(nm.decode_table(nm.E5M2)[nm.encode(nm.E5M2, e5, saturate=False)[3]])
    assert list(nm.encode(nm.E5M2, e5, saturate=True))[:3] == [0x7B, 0xFB, 0x7B]
    assert nm.encode(nm.E5M2, e5, saturate=False)[4] == 0x7B
    assert nm.encode(nm.E5M2, e5, saturate=False)[5] == 0x7C  # the tie above max rounds to even: Inf


def test_bf16_round_trip_matches_torch_at_edges() -> None:
    f32 = np.finfo(np.float32)
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.standard_normal(5000) * 1e3,
            [0.0, -0.0, np.inf, -np.inf, f32.max, -f32.max, f32.tiny, f32.tiny / 3, 1e-45],
            np.array([0x3F808000, 0x3F818000, 0x3F80FFFF], np.uint32).view(np.float32),  # ties, near-ties
        ]
    ).astype(np.float32)
    want = torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(nm.f32_to_bf16(x).astype(np.uint16), want)
    nan_bits = nm.f32_to_bf16(np.array([np.nan], np.float32))
    assert np.isnan(nm.bf16_to_f32(nan_bits))[0]
    back = nm.bf16_to_f32(nm.f32_to_bf16(x))
    np.testing.assert_array_equal(back, torch.from_numpy(x).bfloat16().float().numpy())


def test_f16_matches_torch_at_edges() -> None:
    x = np.array([65504.0, 65520.0, 1e6, -1e6, 6.1e-5, 5.96e-8, 2.9e-8, np.inf, 0.0, -0.0], np.float32)
    want = torch.from_numpy(x).half().view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(nm.f32_to_f16(x).astype(np.uint16), want)
    assert np.isnan(nm.f16_to_f32(nm.f32_to_f16(np.array([np.nan], np.float32))))[0]


@pytest.mark.parametrize(
    ("fmt", "vmax", "min_sub"),
    [(nm.E2M3, 7.5, 0.125), (nm.E3M2, 28.0, 0.0625), (nm.E2M1, 6.0, 0.5)],
)
def test_fp6_fp4_tables(fmt: nm.MiniFloat, vmax: float, min_sub: float) -> None:
    tab = nm.decode_table(fmt)
    assert len(tab) == 1 << fmt.bits and np.isfinite(tab).all()
    assert tab.max() == vmax and tab[1] == min_sub and tab[1 << (fmt.bits - 1)] == 0.0  # negative zero
    np.testing.assert_array_equal(nm.decode_table(fmt)[nm.encode(fmt, tab, saturate=True)], tab)


def test_e2m1_values() -> None:
    assert list(nm.decode_table(nm.E2M1)[:8]) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e8m0() -> None:
    v = nm.e8m0_to_f32(np.array([127, 128, 126, 0, 254, 255]))
    assert list(v[:3]) == [1.0, 2.0, 0.5]
    assert v[3] == np.float32(2.0**-127) and v[4] == np.float32(2.0**127) and np.isnan(v[5])
