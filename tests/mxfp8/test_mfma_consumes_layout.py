"""The packed layout, consumed by a real ``v_mfma_scale_f32_16x16x128_f8f6f4`` (gfx950 code in the emulator).

A one-wave probe (kernels/mx_mfma_probe.py) loads one packed scale word per lane and operand for four
K-steps and picks the byte with op_sel, as the GEMM does; its D must equal dequantise-then-matmul with
the TE scales. This ties docs/mxfp8-layout.md, ``pack_scales`` and ``unpack_scales`` to the MFMA's
lane / byte semantics as the emulator models them (and, on gfx950, as the hardware does).
"""

from __future__ import annotations

import pytest
import torch

from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import mx_layout as mx
from te_flydsl_plugin.flydsl import toolchain

from .helpers import te_scales

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(
        llvm.find_ld_lld() is None,
        reason="no ld.lld >= 18 on this machine: install lld-22 (or ROCm) to compile for gfx950",
    ),
]

ROWS, K = 16, 512
FP8 = {0: torch.float8_e4m3fn, 1: torch.float8_e5m2}


def _operand(fmt: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    vals = torch.randn((ROWS, K), generator=gen).to(FP8[fmt])
    return vals.view(torch.uint8), vals.float()


def _compiled(fmt_b: int) -> tuple[bytes, str]:
    import flydsl.compiler as flyc

    from .kernels import mx_mfma_probe

    with toolchain.compile_for("gfx950"):
        placeholders = [torch.empty((ROWS, K), dtype=torch.uint8)] * 2 + [torch.empty(64, dtype=torch.int32)] * 2
        placeholders.append(torch.empty((16, 16), dtype=torch.float32))
        fn = flyc.compile(mx_mfma_probe.probe, *[flyc.from_dlpack(t) for t in placeholders], fmt_b)
    (blob,) = toolchain.code_objects(fn).values()
    (res,) = toolchain.kernel_resources(blob)
    assert res.scratch_bytes == 0 and res.vgpr_spill_count == 0
    return blob, res.name


@pytest.mark.parametrize(("fmt_b", "b_dim"), [(0, 1), (1, 0)])
def test_mfma_reads_packed_scales_as_documented(fmt_b: int, b_dim: int) -> None:
    from te_flydsl_plugin.emulator import launch, pack_flydsl_kernarg

    blob, name = _compiled(fmt_b)
    asm = llvm.disassemble(blob)
    assert asm.count("v_mfma_scale_f32_16x16x128_f8f6f4") == 4
    a_u8, a_val = _operand(0, 1)
    b_u8, b_val = _operand(fmt_b, 2)
    # Scales near 2^0 keep the products finite; the padding is poisoned with NaN (255).
    sa_te, sa = te_scales(ROWS, K, 1, seed=3)
    sb_te, sb = te_scales(ROWS, K, b_dim, seed=4)
    sa_te[:ROWS, : K // 32] = sa = sa % 16 + 120
    if b_dim == 1:
        sb_te[:ROWS, : K // 32] = sb = sb % 16 + 120
    else:
        sb_te[: K // 32, :ROWS] = (sb := sb % 16 + 120).t()
    pa = mx.pack_scales(sa_te, ROWS, K, 1)
    pb = mx.pack_scales(sb_te, ROWS, K, b_dim)
    d = torch.full((16, 16), float("nan"))
    kernarg = pack_flydsl_kernarg(
        blob, name, [a_u8, b_u8, pa.view(-1).view(torch.int32), pb.view(-1).view(torch.int32), d]
    )
    report = launch(blob, name, kernarg, (1, 1, 1), (64, 1, 1))
    assert not report.hazards
    a_deq = a_val * mx.e8m0_to_float(sa).repeat_interleave(32, dim=1)
    b_deq = b_val * mx.e8m0_to_float(sb).repeat_interleave(32, dim=1)
    want = (a_deq.double() @ b_deq.double().t()).float()
    torch.testing.assert_close(d, want, rtol=1e-5, atol=1e-6)
    # The reference executor's decode sees the same scales.
    assert torch.equal(mx.unpack_scales(pa, ROWS, K), sa) and torch.equal(mx.unpack_scales(pb, ROWS, K), sb)
