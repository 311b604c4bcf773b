"""Test operands in every format, built the way TE stores them, and an independent torch reference.

The reference never looks at the plan: it dequantizes the operands in TE's logical orientation and
applies TE's layout math (notes/te-gemm-api.md), in float64. A plan that picked the wrong storage,
swapped M and N, or mis-packed scales therefore disagrees with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from te_flydsl_plugin import Fp8Operand, MXFP8Operand
from te_flydsl_plugin.spec import Format, Layout

FP8_MAX = {
    Format.FP8_E4M3: 448.0,
    Format.FP8_E5M2: 57344.0,
    Format.MXFP8_E4M3: 448.0,
    Format.MXFP8_E5M2: 57344.0,
}
TORCH_FP8 = {
    Format.FP8_E4M3: torch.float8_e4m3fn,
    Format.FP8_E5M2: torch.float8_e5m2,
    Format.MXFP8_E4M3: torch.float8_e4m3fn,
    Format.MXFP8_E5M2: torch.float8_e5m2,
}
TORCH_DTYPE = {Format.FP32: torch.float32, Format.FP16: torch.float16, Format.BF16: torch.bfloat16}
POISON = 0xFE  # E8M0 2**127: any padding byte that leaks into a result blows it up


def roundup(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def make_fp8(
    x: torch.Tensor, fmt: Format, data: bool = True, transpose: bool = True
) -> tuple[Fp8Operand, torch.Tensor]:
    """Per-tensor FP8 as TE stores it; returns the operand and its exact dequantized value."""
    scale = FP8_MAX[fmt] / max(float(x.abs().max()), 1e-6)
    q = (x.float() * scale).to(TORCH_FP8[fmt])
    scale_inv = torch.tensor([1.0 / scale], dtype=torch.float32)
    u8 = q.view(torch.uint8)
    t = u8.reshape(-1, x.shape[-1]).t().contiguous().view(x.shape[-1], *x.shape[:-1]) if transpose else None
    op = Fp8Operand(u8 if data else None, t, scale_inv, fmt)
    return op, q.double() * scale_inv.double()


def _mx_quantize(x2: torch.Tensor, fmt: Format) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocks of 32 along dim 1 of a 2-D tensor: (fp8 values, E8M0 bytes [rows, cols/32], dequantized)."""
    rows, cols = x2.shape
    blocks = x2.float().view(rows, cols // 32, 32)
    amax = blocks.abs().amax(dim=2).clamp_min(1e-30)
    exp = torch.floor(torch.log2(amax / FP8_MAX[fmt])).clamp(-127, 127) + 1
    e8 = (exp + 127).clamp(0, 254).to(torch.uint8)
    scale = torch.exp2(exp)
    q = (blocks / scale[..., None]).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(TORCH_FP8[fmt])
    deq = q.double() * scale[..., None].double()
    return q.view(rows, cols).view(torch.uint8), e8, deq.view(rows, cols)


def make_mxfp8(x: torch.Tensor, fmt: Format, rowwise: bool = True, columnwise: bool = True) -> tuple[MXFP8Operand, Any]:
    """MXFP8 as TE stores it (padded scales full of poison); returns the operand and both dequantized copies.

    ``x`` is ``[*lead, last]``; rowwise blocks run along ``last``, columnwise along the flattened lead.
    """
    lead = math.prod(x.shape[:-1])
    last = x.shape[-1]
    x2 = x.reshape(lead, last)
    r_data = r_scale = c_data = c_scale = None
    deq_rows = deq_cols = None
    if rowwise:
        q, e8, deq_rows = _mx_quantize(x2, fmt)
        r_data = q.view(x.shape)
        r_scale = torch.full((roundup(lead, 128), roundup(last // 32, 4)), POISON, dtype=torch.uint8)
        r_scale[:lead, : last // 32] = e8
    if columnwise:
        q, e8, deq = _mx_quantize(x2.t().contiguous(), fmt)  # blocks along the lead dim
        c_data = q.t().contiguous().view(x.shape)
        deq_cols = deq.t()
        c_scale = torch.full((roundup(lead // 32, 4), roundup(last, 128)), POISON, dtype=torch.uint8)
        c_scale[: lead // 32, :last] = e8.t()
    return MXFP8Operand(r_data, r_scale, c_data, c_scale, fmt), (deq_rows, deq_cols)


@dataclass
class Operand:
    """A test operand: what is passed to generic_gemm and the float64 values TE's math should use."""

    passed: Any
    value: torch.Tensor  # float64, logical shape; for MXFP8 the copy the layout must read


def make_operand(shape: tuple[int, ...], fmt: Format, gen: torch.Generator, *, quant_rowwise: bool) -> Operand:
    """Random operand of ``shape``; for MXFP8 ``quant_rowwise`` says which copy TE's layout reads."""
    x = torch.randn(shape, generator=gen)
    if fmt in TORCH_DTYPE:
        t = x.to(TORCH_DTYPE[fmt])
        return Operand(t, t.double())
    if fmt.is_fp8:
        op, deq = make_fp8(x, fmt)
        return Operand(op, deq.view(shape))
    lead = math.prod(shape[:-1])
    op, (rows, cols) = make_mxfp8(x, fmt, rowwise=shape[-1] % 32 == 0, columnwise=lead % 32 == 0)
    value = rows if quant_rowwise else cols
    return Operand(op, (value if value is not None else torch.full(shape, float("nan"))).reshape(shape))


def shapes(layout: Layout, m: int, n: int, k: int, batch: tuple[int, ...] = ()) -> tuple[tuple, tuple]:
    """(A shape, B shape) for output rows m (times batch), columns n, reduction k."""
    if layout is Layout.TN:
        return (n, k), (*batch, m, k)
    if layout is Layout.NN:
        return (k, n), (*batch, m, k)
    return (k, n), (k, m)


def layout_operands(
    layout: Layout,
    a_fmt: Format,
    b_fmt: Format,
    m: int,
    n: int,
    k: int,
    gen: torch.Generator,
    batch: tuple[int, ...] = (),
) -> tuple[Operand, Operand]:
    """TE's A and B for ``layout`` (output rows m times batch, columns n, reduction k), each with the MXFP8
    copy TE's layout reads as its value: A rowwise in TN, B rowwise except in NT."""
    a_shape, b_shape = shapes(layout, m, n, k, batch)
    a = make_operand(a_shape, a_fmt, gen, quant_rowwise=layout is Layout.TN)
    b = make_operand(b_shape, b_fmt, gen, quant_rowwise=layout is not Layout.NT)
    return a, b


def te_math(layout: Layout, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TE's layout math in float64 on logical shapes (batched B keeps its leading dims)."""
    if layout is Layout.TN:
        return b @ a.reshape(-1, a.shape[-1]).t()
    if layout is Layout.NN:
        return b @ a.reshape(-1, a.shape[-1])
    return b.reshape(-1, b.shape[-1]).t() @ a.reshape(-1, a.shape[-1])


def gelu64(x: torch.Tensor) -> torch.Tensor:
    c = math.sqrt(2 / math.pi)
    return 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x**3)))


def dgelu64(x: torch.Tensor) -> torch.Tensor:
    c = math.sqrt(2 / math.pi)
    t = torch.tanh(c * (x + 0.044715 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)


TOL = {Format.FP32: 2e-5, Format.BF16: 1.6e-2, Format.FP16: 2e-3}


def assert_close(got: torch.Tensor, want: torch.Tensor, out: Format, what: str = "D") -> None:
    """Relative Frobenius error within what the output dtype's rounding allows."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got.double()).all(), f"{what}: non-finite values"
    err = (got.double() - want).norm() / max(float(want.norm()), 1e-12)
    assert err < TOL[out], f"{what}: relative error {err:.3g} >= {TOL[out]}"
