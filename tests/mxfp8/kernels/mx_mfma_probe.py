"""A one-wave probe that consumes packed MXFP8 scales exactly as a GEMM is meant to.

D[16,16] = A[16,K] @ B[16,K]^T over K = 512 (four 128-wide K-steps) with one
``v_mfma_scale_f32_16x16x128_f8f6f4`` per step. Each lane loads ONE 32-bit word of each operand's packed
scales (dword ``lane`` of the 16-row tile, word group 0) before the K loop; step ``t`` selects byte ``t``
with op_sel. Lane ``l`` feeds row ``l % 16`` and, as AMD documents the FP8 operand layout (docs/mxfp8-layout.md),
K bytes ``16 * (l // 16)`` .. +15 then ``64 + 16 * (l // 16)`` .. +15 of each step. The test
compares D with the dequantise-then-matmul reference: if the layout, the byte select or the lane mapping
disagreed with the MFMA (as the emulator models it), D would differ.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import rocdl as _rocdl
from flydsl._mlir.dialects import vector as _vector
from flydsl.expr.typing import T
from flydsl.expr.typing import Vector as Vec

K = 512
STEPS = K // 128


@flyc.kernel
def probe_kernel(A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, D: fx.Tensor, FMT_B: fx.Constexpr[int]):
    lane = fx.Int32(fx.thread_idx.x)
    rsrc = [
        fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(t, max_size=False))) for t in (A, B, SA, SB, D)
    ]
    zero = fx.as_ir_value(fx.Int32(0))
    v4 = ir.VectorType.get([4], T.i32)

    def load32(rs, off):  # two 16-byte runs 64 K apart, joined into the 8-VGPR operand
        lo = _rocdl.raw_ptr_buffer_load(v4, rs, fx.as_ir_value(off), zero)
        hi = _rocdl.raw_ptr_buffer_load(v4, rs, fx.as_ir_value(off + fx.Int32(64)), zero)
        return _vector.shuffle(lo, hi, list(range(8)))

    row, kgrp = lane & fx.Int32(15), lane >> fx.Int32(4)
    sa = _rocdl.raw_ptr_buffer_load(T.i32, rsrc[2], fx.as_ir_value(lane * fx.Int32(4)), zero)
    sb = _rocdl.raw_ptr_buffer_load(T.i32, rsrc[3], fx.as_ir_value(lane * fx.Int32(4)), zero)
    acc = fx.as_ir_value(Vec.filled(4, 0.0, fx.Float32))
    for t in fx.range_constexpr(STEPS):
        off = row * fx.Int32(K) + fx.Int32(128 * t) + kgrp * fx.Int32(16)
        a, b = load32(rsrc[0], off), load32(rsrc[1], off)
        acc = fx.rocdl.mfma_scale_f32_16x16x128_f8f6f4(acc.type, [a, b, acc, 0, FMT_B, t, sa, t, sb])
    res = Vec(acc)
    for r in fx.range_constexpr(4):
        d_off = ((kgrp * fx.Int32(4) + fx.Int32(r)) * fx.Int32(16) + row) * fx.Int32(4)
        _rocdl.raw_ptr_buffer_store(fx.as_ir_value(res[r]), rsrc[4], fx.as_ir_value(d_off), zero)


@flyc.jit
def probe(A: fx.Tensor, B: fx.Tensor, SA: fx.Tensor, SB: fx.Tensor, D: fx.Tensor, FMT_B: fx.Constexpr[int]):
    probe_kernel(A, B, SA, SB, D, FMT_B).launch(grid=(1, 1, 1), block=(64, 1, 1))
