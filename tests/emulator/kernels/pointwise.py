"""Elementwise f32 math of the kind GEMM epilogues use: tanh-GELU through exp and division, exp,
log, sqrt, rsqrt (erf/tanh themselves need ROCm's device libraries, which a CPU machine lacks).

Exercises the instruction sequences LLVM expands these into natively (exp2/log2 with range
reduction, ``v_div_scale`` / ``v_div_fmas`` / ``v_div_fixup`` division, class tests), over a 2-D
tensor with predicated edges.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

THREADS_M, THREADS_N, VEC = 4, 32, 4
_NULL_STREAM = fx.Stream(None)


@flyc.kernel
def pointwise_kernel(X: fx.Tensor, Z: fx.Tensor, Y: fx.Tensor, tiled_copy: fx.TiledCopy, op: fx.Constexpr[int]):
    tid = fx.thread_idx.x
    bx, by = fx.block_idx.x, fx.block_idx.y
    M, N = X.shape.unpack()
    coords = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled_copy.tile_mn
    thr = tiled_copy.get_slice(tid)
    src_x = thr.partition_S(fx.flat_divide(X, tile)[None, None, bx, by])
    src_z = thr.partition_S(fx.flat_divide(Z, tile)[None, None, bx, by])
    dst_y = thr.partition_D(fx.flat_divide(Y, tile)[None, None, bx, by])
    crd = thr.partition_S(fx.flat_divide(coords, tile)[None, None, bx, by])[(0, None), None, None]
    rx, rz, ry = fx.make_fragment_like(src_x), fx.make_fragment_like(src_z), fx.make_fragment_like(dst_y)
    pred = fx.make_fragment_like(crd, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(crd[i], (M, N))
    atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.Float32)
    fx.copy(atom, src_x, rx, pred=pred)
    fx.copy(atom, src_z, rz, pred=pred)
    x, z = rx.load(), rz.load()
    if fx.const_expr(op == 0):  # 0.5 x (1 + tanh(u)), tanh(u) = 1 - 2 / (exp(2u) + 1)
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = x * (1.0 - 1.0 / (fx.math.exp(2.0 * u) + 1.0))
    elif fx.const_expr(op == 1):
        y = fx.math.exp(x) + fx.math.log(fx.math.absf(x) + 1.0)
    else:
        y = x / z + fx.math.rsqrt(fx.math.absf(z)) + fx.math.sqrt(fx.math.absf(x))
    ry.store(y)
    fx.copy(atom, ry, dst_y, pred=pred)


@flyc.jit
def pointwise(X: fx.Tensor, Z: fx.Tensor, Y: fx.Tensor, op: fx.Constexpr[int], stream: fx.Stream = _NULL_STREAM):
    atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.Float32)
    tiled_copy = fx.make_tiled_copy_tv(
        atom,
        fx.make_ordered_layout((THREADS_M, THREADS_N), order=(1, 0)),
        fx.make_ordered_layout((1, VEC), order=(0, 1)),
    )
    tm, tn = tiled_copy.tile_mn.unpack()
    M, N = X.shape.unpack()
    pointwise_kernel(X, Z, Y, tiled_copy, op).launch(
        grid=((M + tm - 1) // tm, (N + tn - 1) // tn, 1), block=(THREADS_M * THREADS_N, 1, 1), stream=stream
    )
