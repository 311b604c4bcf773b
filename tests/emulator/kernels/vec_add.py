"""A predicated elementwise add (C = A + B) over a 2D f32 tensor, 128-bit copies per thread.

Exercises: plain global loads/stores (no buffer resource) through FlyDSL's universal copy, per-thread predicates
at the tensor border (edge tiles), workgroup ids in two dimensions.
"""

import flydsl.compiler as flyc
import flydsl.expr as fx

THREADS_M, THREADS_N, VEC = 4, 32, 4
_NULL_STREAM = fx.Stream(None)


@flyc.kernel
def add_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, tiled_copy: fx.TiledCopy):
    tid = fx.thread_idx.x
    bx, by = fx.block_idx.x, fx.block_idx.y
    M, N = A.shape.unpack()
    coords = fx.make_view((0, 0), fx.make_identity_layout((M, N)))
    tile = tiled_copy.tile_mn
    thr = tiled_copy.get_slice(tid)
    src_a = thr.partition_S(fx.flat_divide(A, tile)[None, None, bx, by])
    src_b = thr.partition_S(fx.flat_divide(B, tile)[None, None, bx, by])
    dst_c = thr.partition_D(fx.flat_divide(C, tile)[None, None, bx, by])
    crd = thr.partition_S(fx.flat_divide(coords, tile)[None, None, bx, by])[(0, None), None, None]
    ra = fx.make_fragment_like(src_a)
    rb = fx.make_fragment_like(src_b)
    rc = fx.make_fragment_like(dst_c)
    pred = fx.make_fragment_like(crd, dtype=fx.Boolean)
    for i in fx.range_constexpr(fx.size(pred.shape).unpack()):
        pred[i] = fx.elem_less(crd[i], (M, N))
    atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.Float32)
    fx.copy(atom, src_a, ra, pred=pred)
    fx.copy(atom, src_b, rb, pred=pred)
    rc.store(ra.load() + rb.load())
    fx.copy(atom, rc, dst_c, pred=pred)


@flyc.jit
def add(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, stream: fx.Stream = _NULL_STREAM):
    atom = fx.make_copy_atom(fx.UniversalCopy128b(), fx.Float32)
    tiled_copy = fx.make_tiled_copy_tv(
        atom,
        fx.make_ordered_layout((THREADS_M, THREADS_N), order=(1, 0)),
        fx.make_ordered_layout((1, VEC), order=(0, 1)),
    )
    tm, tn = tiled_copy.tile_mn.unpack()
    M, N = A.shape.unpack()
    add_kernel(A, B, C, tiled_copy).launch(
        grid=((M + tm - 1) // tm, (N + tn - 1) // tn, 1), block=(THREADS_M * THREADS_N, 1, 1), stream=stream
    )
