"""D[16, 16] = A[16, K] @ B[16, K]^T in FP8 with the MFMA written as LLVM inline asm.

One wave, four ``v_mfma_f32_16x16x128_f8f6f4`` (8 passes on gfx950: FP8 operands) accumulating in
AGPRs through the ``"=a,v,v,0"`` constraint, the way FlyDSL's ``fp8_gemm_4wave`` pins its
accumulators. LLVM's hazard recognizer does not see an inline asm statement as an MFMA, so it puts
no ``s_nop`` between the last MFMA and the stores that read its result: the wait-state hazard the
emulator must report. ``pad`` = 1 puts the ``s_nop``s gfx950 needs into the asm itself (2 after a VALU
write of an operand, 12 after the MFMA for any VALU / memory use of its result).
"""

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import llvm as _llvm
from flydsl._mlir.dialects import rocdl as _rocdl
from flydsl._mlir.dialects import vector as _vector
from flydsl.expr.typing import T
from flydsl.expr.typing import Vector as Vec

K = 512
MFMA = "v_mfma_f32_16x16x128_f8f6f4 $0, $1, $2, $0"


@flyc.kernel
def asm_mfma_kernel(A: fx.Tensor, B: fx.Tensor, D: fx.Tensor, pad: fx.Constexpr[int]):
    lane = fx.Int32(fx.thread_idx.x)
    rsrc = [fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(t, max_size=False))) for t in (A, B, D)]
    zero = fx.as_ir_value(fx.Int32(0))
    v4 = ir.VectorType.get([4], T.i32)

    def load32(rs, off):  # 32 FP8 bytes: two dwordx4 loads joined into the 8-VGPR operand
        lo = _rocdl.raw_ptr_buffer_load(v4, rs, fx.as_ir_value(off), zero)
        hi = _rocdl.raw_ptr_buffer_load(v4, rs, fx.as_ir_value(off + fx.Int32(16)), zero)
        return _vector.shuffle(lo, hi, list(range(8)))

    row, kgrp = lane & fx.Int32(15), lane >> fx.Int32(4)
    acc = fx.as_ir_value(Vec.filled(4, 0.0, fx.Float32))
    asm = f"s_nop 1\n{MFMA}\ns_nop 11" if pad else MFMA
    for t in fx.range_constexpr(K // 128):
        off = row * fx.Int32(K) + fx.Int32(128 * t) + kgrp * fx.Int32(32)
        a, b = load32(rsrc[0], off), load32(rsrc[1], off)
        acc = _llvm.inline_asm(acc.type, [a, b, acc], asm, "=a,v,v,0", has_side_effects=True)
    res = Vec(acc)
    for r in fx.range_constexpr(4):  # the 16x16 result layout: register r of lane l is D[4 * (l // 16) + r, l % 16]
        d_off = ((kgrp * fx.Int32(4) + fx.Int32(r)) * fx.Int32(16) + row) * fx.Int32(4)
        _rocdl.raw_ptr_buffer_store(fx.as_ir_value(res[r]), rsrc[2], fx.as_ir_value(d_off), zero)


@flyc.jit
def asm_mfma(A: fx.Tensor, B: fx.Tensor, D: fx.Tensor, pad: fx.Constexpr[int]):
    asm_mfma_kernel(A, B, D, pad).launch(grid=(1, 1, 1), block=(64, 1, 1))
