"""Number formats of the matrix and conversion instructions: bf16, f16, OCP FP8/FP6/FP4 and E8M0.

Decoding is by 256-entry (or smaller) lookup tables built from the format definitions; encoding
f32 -> narrow format rounds to nearest even over the format's finite values, with the overflow
rule chosen by the caller (saturate to max normal, or Inf/NaN as the OCP spec prescribes for
non-saturating conversion).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np


@dataclass(frozen=True)
class MiniFloat:
    """A sign + exponent + mantissa format with subnormals (OCP FP8/FP6/FP4 family)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    has_inf: bool  # E5M2: IEEE-style Inf and NaN at the top exponent
    nan_all_ones: bool  # E4M3FN: only S.1111.111 is NaN, no Inf

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    def value(self, code: int) -> float:
        """The real value of one code."""
        sign = -1.0 if code >> (self.ebits + self.mbits) & 1 else 1.0
        e = (code >> self.mbits) & ((1 << self.ebits) - 1)
        m = code & ((1 << self.mbits) - 1)
        top = (1 << self.ebits) - 1
        if self.has_inf and e == top:
            return sign * np.inf if m == 0 else np.nan
        if self.nan_all_ones and e == top and m == (1 << self.mbits) - 1:
            return np.nan
        if e == 0:
            return sign * m / (1 << self.mbits) * 2.0 ** (1 - self.bias)
        return sign * (1 + m / (1 << self.mbits)) * 2.0 ** (e - self.bias)


E4M3 = MiniFloat("e4m3", 4, 3, 7, has_inf=False, nan_all_ones=True)
E5M2 = MiniFloat("e5m2", 5, 2, 15, has_inf=True, nan_all_ones=False)
E2M3 = MiniFloat("e2m3", 2, 3, 1, has_inf=False, nan_all_ones=False)
E3M2 = MiniFloat("e3m2", 3, 2, 3, has_inf=False, nan_all_ones=False)
E2M1 = MiniFloat("e2m1", 2, 1, 1, has_inf=False, nan_all_ones=False)


@cache
def decode_table(fmt: MiniFloat) -> np.ndarray:
    """float32[2**bits]: the value of every code."""
    return np.array([fmt.value(c) for c in range(1 << fmt.bits)], np.float32)


@cache
def _positive_finite(fmt: MiniFloat) -> tuple[np.ndarray, np.ndarray]:
    tab = decode_table(fmt)
    half = 1 << (fmt.bits - 1)
    codes = np.arange(half)
    ok = np.isfinite(tab[:half])
    return tab[:half][ok].astype(np.float64), codes[ok]


def encode(fmt: MiniFloat, x: np.ndarray, saturate: bool) -> np.ndarray:
    """Round f32 values to ``fmt`` codes (uint8), nearest even; NaN -> NaN (or max for formats without)."""
    x = np.asarray(x, np.float32).astype(np.float64)
    vals, codes = _positive_finite(fmt)
    sign = (np.signbit(x)).astype(np.uint8) << np.uint8(fmt.bits - 1)
    ax = np.abs(x)
    nan = np.isnan(x)
    ax_safe = np.where(nan, 0.0, ax)
    hi = np.clip(np.searchsorted(vals, ax_safe), 0, len(vals) - 1)
    lo = np.clip(hi - 1, 0, len(vals) - 1)
    d_lo, d_hi = ax_safe - vals[lo], vals[hi] - ax_safe
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    out = np.where(pick_hi, codes[hi], codes[lo]).astype(np.int64)
    vmax, vprev = vals[-1], vals[-2]
    over = ax_safe > vmax + (vmax - vprev) / 2
    tie = ax_safe == vmax + (vmax - vprev) / 2
    if codes[-1] % 2 == 1:  # the next code up is even: a tie rounds up, out of range
        over = over | tie
    max_code = int(codes[-1])
    top = (1 << (fmt.bits - 1)) - 1
    if saturate or not (fmt.has_inf or fmt.nan_all_ones):
        of_code = max_code
    elif fmt.has_inf:
        of_code = max_code + 1  # Inf
    else:
        of_code = top  # NaN
    out = np.where(over, of_code, out)
    if fmt.has_inf or fmt.nan_all_ones:
        inf = np.isinf(ax)
        if fmt.has_inf and not saturate:
            out = np.where(inf, max_code + 1, out)
        out = np.where(nan, top, out)
    else:
        out = np.where(nan, max_code, out)
    return (out.astype(np.uint8) | sign).astype(np.uint8)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (any unsigned integer array) -> float32."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint32, low 16 bits), round to nearest even, NaN kept quiet."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)) & np.uint64(0xFFFF)
    nan = np.isnan(np.asarray(x, np.float32))
    quiet = ((u >> np.uint64(16)) | np.uint64(0x40)) & np.uint64(0xFFFF)
    return np.where(nan, quiet, rounded).astype(np.uint32)


def f16_to_f32(bits: np.ndarray) -> np.ndarray:
    """f16 bit patterns -> float32."""
    return np.asarray(bits).astype(np.uint16).view(np.float16).astype(np.float32)


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> f16 bit patterns (uint32, low 16 bits), round to nearest even."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)


def e8m0_to_f32(bits: np.ndarray) -> np.ndarray:
    """E8M0 scale codes -> float32 powers of two (0xFF is NaN)."""
    b = np.asarray(bits).astype(np.int32)
    with np.errstate(over="ignore"):
        v = np.ldexp(np.float32(1.0), b - 127).astype(np.float32)
    return np.where(b == 0xFF, np.float32(np.nan), v)
