"""C[M, N] = A[M, K] @ B[N, K]^T for one tile, through FlyDSL's tiled MMA and buffer copies.

One workgroup of four waves (2 x 2 MFMA atoms) computes a ``TILE_M x TILE_N`` output with one
K step; the MFMA kind is a compile-time parameter so the same kernel exercises
``v_mfma_f32_16x16x4_f32`` (f32 operands) and ``v_mfma_f32_16x16x32_bf16`` / ``_f16``.
Operands are read register-direct from global memory through buffer resources.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

TILE_M, TILE_N = 32, 32
_COPY_BITS = {4: 32, 2: 16}


@flyc.kernel
def mma_tile_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, tile_k: fx.Constexpr[int], elem: fx.Constexpr[int]):
    tid = fx.thread_idx.x
    dtype = {0: fx.Float32, 1: fx.BFloat16, 2: fx.Float16}[elem]
    mma_k = {0: 4, 1: 32, 2: 32}[elem]
    A = fx.rocdl.make_buffer_tensor(A)
    B = fx.rocdl.make_buffer_tensor(B)
    C = fx.rocdl.make_buffer_tensor(C)
    tA = fx.slice(fx.zipped_divide(A, (TILE_M, tile_k)), (None, 0))
    tB = fx.slice(fx.zipped_divide(B, (TILE_N, tile_k)), (None, 0))
    tC = fx.slice(fx.zipped_divide(C, (TILE_M, TILE_N)), (None, 0))
    atom = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, mma_k, dtype))
    mma = fx.make_tiled_mma(atom, fx.make_layout((2, 2, 1), (1, 2, 0)))
    thr = mma.thr_slice(tid)
    in_copy = fx.make_copy_atom(fx.rocdl.BufferCopy16b() if elem else fx.rocdl.BufferCopy32b(), dtype)
    out_copy = fx.make_copy_atom(fx.rocdl.BufferCopy32b(), fx.Float32)
    cA = fx.make_tiled_copy_A(in_copy, mma).get_slice(tid)
    cB = fx.make_tiled_copy_B(in_copy, mma).get_slice(tid)
    cC = fx.make_tiled_copy_C(out_copy, mma).get_slice(tid)
    fA = thr.make_fragment_A(tA)
    fB = thr.make_fragment_B(tB)
    fC = thr.make_fragment_C(tC)
    fx.copy(in_copy, cA.partition_S(tA), cA.retile(fA), pred=None)
    fx.copy(in_copy, cB.partition_S(tB), cB.retile(fB), pred=None)
    fC.fill(0)
    fx.gemm(atom, fC, fA, fB, fC)
    fx.copy(out_copy, cC.retile(fC), cC.partition_S(tC), pred=None)


@flyc.jit
def mma_tile(
    A: fx.Tensor,
    B: fx.Tensor,
    C: fx.Tensor,
    tile_k: fx.Constexpr[int],
    elem: fx.Constexpr[int],
    stream: fx.Stream = None,
):
    mma_tile_kernel(A, B, C, tile_k, elem).launch(grid=(1, 1, 1), block=(256, 1, 1), stream=stream)
