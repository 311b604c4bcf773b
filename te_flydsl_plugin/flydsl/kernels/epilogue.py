"""The GEMM family's epilogue: what happens to a tile's fp32 accumulators after the K loop.

One compile-time choice per config (``KernelConfig.epilogue``, the matrix's names), all sharing one
store path (:func:`store_groups`: the accumulators by groups, each stored block by block, among the
last tile's MFMAs or after them by :func:`store_tile`): for each accumulator block (4 adjacent output
columns of one row)
``res = scale * acc (+ beta * out)``, then

* ``bias``: ``res += bias[col]`` (the bias reaches the kernel as fp32: the host widens TE's bf16 /
  fp16 bias exactly, so one config serves every bias dtype);
* ``gelu`` / ``bias_gelu``: the pre-activation ``res`` (after the bias) is stored to ``aux`` in the
  output dtype, and ``out = gelu(res)``;
* ``dgelu`` / ``dgelu_bgrad``: ``out = res * gelu'(aux)``, ``aux`` being TE's saved pre-activation;
  ``dgelu_bgrad`` also writes the tile's column sums of that fp32 ``out`` (the bias gradient) as
  per-wave partial rows of a workspace, which the host reduces in a fixed order (no atomics: the
  same bits every run).

The semantics are the reference executor's (``flydsl/executors/reference.py``). GELU is the tanh
approximation TE and cuBLASLt fuse, ``0.5 x (1 + tanh(u))``, ``u = sqrt(2/pi) (x + 0.044715 x^3)``,
evaluated as ``x * sigmoid(2u)`` (the same function: ``(1 + tanh u) / 2 = sigmoid(2u)``), which
needs one ``exp`` and one division per element and no ``tanh`` expansion; its derivative is
``sigmoid(2u) + 2 x sigmoid(2u) (1 - sigmoid(2u)) u'`` with ``u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)``.

The K loop is not touched by any of this: every epilogue runs in or after the last tile, so each
config's loop is the plain config's, instruction for instruction (``isa.isa_report``'s ``loop_insts``).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import rocdl, scf
from flydsl.expr import const_expr, range_constexpr

from . import mfma
from .config import OOB_BYTES

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_LOG2E = 1.0 / math.log(2.0)
# MFMA 16x16 C layout (AMD CDNA4 ISA, "matrix fused multiply add" operand layouts): lane l holds C rows
# 4 * (l // 16) + [0, 4) at C column l % 16. C is out^T here, so the 16 lanes of one l // 16 group hold
# the same 4 output columns at 16 different output rows: XOR shuffles over the low 4 lane bits sum them.
_ROW_LANES = 16
# ``reads_out`` of :func:`store_groups`: D read or not by beta at run time, behind branches in each group
BETA = "beta"


class Parts(NamedTuple):
    """What one epilogue does (the kernel's compile-time switches, ``GemmParams.epi_*``)."""

    bias: bool  # adds a bias per output column
    gelu: bool  # stores the pre-activation to aux, applies GELU
    dgelu: bool  # multiplies by gelu'(aux)
    colsum: bool  # column sums of the result -> per-tile partials (dgelu_bgrad)
    rowsum: bool  # sums of lhs over K -> per-thread partials, in the K loop (bgrad: kernels/rowsum.py)


FLAGS: dict[str, Parts] = {
    "plain": Parts(False, False, False, False, False),
    "bias": Parts(True, False, False, False, False),
    "gelu": Parts(False, True, False, False, False),
    "bias_gelu": Parts(True, True, False, False, False),
    "dgelu": Parts(False, False, True, False, False),
    "dgelu_bgrad": Parts(False, False, True, True, False),
    "bgrad": Parts(False, False, False, False, True),
}


def _hw(op, x: fx.Vector) -> fx.Vector:
    """A gfx950 transcendental (``v_exp_f32`` / ``v_rcp_f32``, 1 ulp) elementwise on a vector.

    The ROCDL ops, not ``math.exp2`` / a division: those lower to ROCm device-library calls (which
    compile-only machines lack) or to a many-instruction IEEE division sequence.
    """
    f32 = fx.Float32.ir_type
    elems = [fx.Float32(op(f32, fx.as_ir_value(x[e]))) for e in range(4)]
    return fx.Vector.from_elements(elems, dtype=fx.Float32)


def _sigmoid_2u(x: fx.Vector) -> fx.Vector:
    """``sigmoid(2u(x))`` of the tanh GELU, elementwise: ``1 / (1 + 2^(-2 u log2 e))``."""
    u = (x + x * x * x * _GELU_C) * _SQRT_2_OVER_PI
    return _hw(rocdl.rcp, _hw(rocdl.exp2, u * (-2.0 * _LOG2E)) + 1.0)


def gelu(x: fx.Vector) -> fx.Vector:
    """tanh-approximated GELU (TE's and cuBLASLt's fused epilogue)."""
    return x * _sigmoid_2u(x)


def dgelu(x: fx.Vector) -> fx.Vector:
    """Derivative of :func:`gelu`."""
    s = _sigmoid_2u(x)
    du = (x * x * (3.0 * _GELU_C) + 1.0) * _SQRT_2_OVER_PI
    return s + x * s * (1.0 - s) * du * 2.0


def store_tile(p, acc, thr_mma, o_buf, extras, row0, col0, bm, m, n, ld_out, scale, beta, reads_out):
    """The epilogue of this thread's accumulators after the K loop: every column group of
    :func:`store_groups` in turn (fp32, on LLVM's own MFMAs, bgrad, whose row sums read the last tile after
    its MFMAs, the one-chunk dgelu_bgrad, whose column sums span the row groups, and on 384 x 256 the fused
    epilogues and FP8's, which spilled among the MFMAs). The others run the groups among their last tile's MFMAs
    (``gemm._Mma.multiply``)."""
    if const_expr(p.pinned):
        # MFMA results -> the reads: the wait states the compiler cannot see (kernels/mfma.py), for all
        # accumulators at once, in each epilogue's own block (fenced per group, LLVM copied some to VGPRs
        # before the fence). The groups' own fences need no wait states but keep each group's AGPR reads
        # after the stores of the group before it (memory operations do not cross one): with the one
        # fence alone, LLVM read all 256 accumulators before the first store.
        mfma.fence_accumulators(acc)
    for group in store_groups(p, acc, thr_mma, o_buf, extras, row0, col0, bm, m, n, ld_out, scale, beta, reads_out):
        for issue in group(0):
            issue()


def store_groups(p, acc, thr_mma, o_buf, extras, row0, col0, bm, m, n, ld_out, scale, beta, reads_out, rows=False):
    """The epilogue for this thread's accumulators by groups: column groups (A repetition ``i``: the blocks
    ``(i, j)``, 4 adjacent output columns of each of the lane's rows), or with ``rows`` row groups (B
    repetition ``j``: the blocks ``(i, j)`` of all columns; the order one-chunk MFMAs finish them in);
    ``extras`` = (bias, aux, partials) buffers. Issuer ``g(wait_states)`` is group ``g``'s head: its bias
    and D / aux loads and the fence of its accumulators (kernels/mfma.py) go out at once, and it returns
    the issuers of its blocks' stores, for the caller to spread over the MFMAs (``gemm._Mma.multiply``).
    What each lane computes before the first group (its offsets) is emitted here.

    Accumulator block ``(i, j)`` holds 4 adjacent columns of one output row (the tiled MMA computes
    the tile transposed); where it maps to comes from the tiled MMA's own C partition. Each block is
    one 8-byte (16-bit outputs) or 16-byte (fp32) buffer access: the block starts on a multiple of 4
    columns and N, ``ld_out`` and the base are multiples of 4 elements (``launch_geometry``; the
    matrix declines other outputs), so a block is whole and aligned, all inside N or all outside. Rows
    past M and columns past N go through the out-of-bounds offset: the hardware drops those stores
    and answers those loads with zeros. ``aux`` shares ``out``'s offsets (same dtype, same leading
    stride: ``gemm.epilogue_views``). ``reads_out``: False (beta == 0: D is never read), True (beta !=
    0), or None (one body for both: D's loads behind a branch on beta that gives zeros when beta == 0,
    so NaN in D stays out; the fused epilogues use it, because two bodies let LLVM hoist both bodies'
    accumulator reads above the branch and spill), or ``BETA`` (branches in each group: beta != 0 stores
    the whole group behind one, beta == 0 each block behind its own, so those can go out one an MFMA;
    the plain epilogue among the MFMAs). Each group of blocks issues all its loads (old ``out``,
    ``aux``) before its stores, because a load after a store to the same buffer cannot be moved above
    it (the compiler must assume they alias) and would otherwise wait a full memory round trip per
    block.
    """
    add_bias, fwd_gelu, bwd_gelu, col_sums = p.epi_bias, p.epi_gelu, p.epi_dgelu, p.epi_colsum
    bias_buf, aux_buf, part_buf = extras
    elem_out = getattr(fx, p.out_elem)
    oob_out = -(OOB_BYTES // p.out_bytes)
    oob_f32 = -(OOB_BYTES // 4)
    a_reps = fx.size(acc.shape[1]).get_static_leaf_int
    b_reps = fx.size(acc.shape[2]).get_static_leaf_int
    n_of = thr_mma.partition_C(fx.make_view(0, fx.make_layout((p.tile_n, p.tile_m), (1, 0))))
    m_of = thr_mma.partition_C(fx.make_view(0, fx.make_layout((p.tile_n, p.tile_m), (0, 1))))
    out_it = fx.get_iter(o_buf)
    atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b() if p.out_bytes == 4 else fx.rocdl.BufferCopy64b(), elem_out)
    atom_f32 = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), fx.Float32)
    block = fx.make_layout(4, 1)

    # The lane's first block, and each block relative to it: the differences are the layout's constants,
    # which the compiler folds, so a block costs an add and two compares on three live VGPRs instead of
    # a precomputed row and column per block (which, kept across the K loop, spill MXFP8's kernels).
    m0 = fx.get_scalar(m_of[0])
    n0 = fx.get_scalar(n_of[0])
    lane_row = row0 + m0
    lane_col = col0 + n0
    lane_off = lane_row * ld_out + lane_col

    def delta(i, j):
        first = 4 * (i + a_reps * j)  # a block's first element: the C partition's shape is ((4, 1), a_reps, b_reps)
        return fx.get_scalar(m_of[first]) - m0, fx.get_scalar(n_of[first]) - n0

    def where(i, j):
        """Linear offset of block ``(i, j)`` in ``out`` (and ``aux``), or the dropped offset past M / N."""
        dm, dn = delta(i, j)
        inside = (lane_row + dm < m) & (lane_col + dn < n)
        return inside.select(lane_off + dm * ld_out + dn, oob_out)

    def load(buf_atom, it, offset, elem):
        r = fx.make_rmem_tensor(block, elem)
        fx.copy_atom_call(buf_atom, fx.make_view(it + offset, block), r)
        return r

    biases: dict[int, fx.Vector] = {}  # by A repetition (the 4 output columns): loaded once, at first use

    def bias_of(i: int) -> fx.Vector:
        if i not in biases:
            dn = delta(i, 0)[1]
            b_off = (lane_col + dn < n).select(lane_col + dn, oob_f32)
            biases[i] = load(atom_f32, fx.get_iter(bias_buf), b_off, fx.Float32).load()
        return biases[i]

    def parts(blocks: list, offs: list, reads: bool | None, fence_group: tuple, wait_states: int | None) -> list:
        """A group's loads (old ``out``, ``aux``) and its fence now; the issuers of its blocks (one each, and
        the column sums' after them) returned, to go out one by one."""
        olds = []
        auxs = []
        if const_expr(reads is None):
            # beta == 0 must not read D (it may hold NaN): its loads stay behind a branch, zeros without.
            loads = [functools.partial(load, atom, out_it, off, elem_out) for off in offs]
            olds = _loaded_if(beta != 0.0, loads, elem_out)
        elif const_expr(reads):
            olds = [load(atom, out_it, off, elem_out) for off in offs]
        if const_expr(bwd_gelu):
            auxs = [load(atom, fx.get_iter(aux_buf), off, elem_out) for off in offs]
        if const_expr(p.pinned and wait_states is not None):
            mfma.fence_accumulators(acc, wait_states, fence_group)
        part = None  # col_sums (column groups only): this lane's sums over its rows of the column group

        def store(nth: int) -> None:
            nonlocal part
            i, j = blocks[nth]
            off = offs[nth]
            vals = fx.Vector(acc[None, i, j].load(), (4,), fx.Float32) * scale  # shape (4, 1) -> (4,)
            if const_expr(reads is not False):
                old = olds[nth] if reads is None else olds[nth].load()
                vals = vals + old.to(fx.Float32) * beta
            if const_expr(add_bias):
                vals = vals + bias_of(i)
            if const_expr(fwd_gelu):
                pre = fx.make_rmem_tensor(block, elem_out)
                pre.store(vals.to(elem_out))
                fx.copy_atom_call(atom, pre, fx.make_view(fx.get_iter(aux_buf) + off, block))
                vals = gelu(vals)
            if const_expr(bwd_gelu):
                vals = vals * dgelu(auxs[nth].load().to(fx.Float32))
            if const_expr(col_sums):
                part = vals if part is None else part + vals
            r = fx.make_rmem_tensor(block, elem_out)
            r.store(vals.to(elem_out))
            fx.copy_atom_call(atom, r, fx.make_view(out_it + off, block))

        def column_sums() -> None:
            col = lane_col + delta(blocks[0][0], 0)[1]
            _store_column_sums(p, part, part_buf, atom_f32, block, bm, col, n, oob_f32)

        return [functools.partial(store, nth) for nth in range(len(blocks))] + ([column_sums] if col_sums else [])

    def group(g: int, wait_states: int) -> list:
        fence_group = (None, g) if rows else (g, None)
        blocks = [(i, g) for i in range_constexpr(a_reps)] if rows else [(g, j) for j in range_constexpr(b_reps)]
        offs = [where(i, j) for i, j in blocks]
        if const_expr(add_bias):  # issued first, and in the group's own block, which every group after reads
            for i in sorted({i for i, _ in blocks}):
                bias_of(i)
        if const_expr(reads_out is not BETA):
            return parts(blocks, offs, reads_out, fence_group, wait_states)
        # On beta (uniform): beta != 0 stores the whole group here, behind one branch (its loads of D go
        # out first); beta == 0 each block behind its own, so the blocks can go out one an MFMA.
        if const_expr(p.pinned):
            mfma.fence_accumulators(acc, wait_states, fence_group)
        _when(beta != 0.0, parts(blocks, offs, True, fence_group, None))
        return [functools.partial(_when_beta_is_zero, beta, [f]) for f in parts(blocks, offs, False, fence_group, None)]

    return [functools.partial(group, g) for g in range_constexpr(b_reps if rows else a_reps)]


def _loaded_if(cond: fx.Boolean, loads: list, elem: type) -> list[fx.Vector]:
    """The values of ``loads`` (issuers, each returning a 4-element register tensor) behind one uniform
    branch on ``cond``, zeros without it.

    The fused epilogues' D: their loads took the dropped offset when beta == 0, so they still went out
    (64 a wave), and vmcnt, which counts in issue order, made each group's wait for them a wait for every
    store before them too."""
    vec_ty = fx.Vector.make_type(4, elem)
    branch = scf.IfOp(fx.as_ir_value(cond), [vec_ty] * len(loads), has_else=True)
    with ir.InsertionPoint(branch.regions[0].blocks[0]):
        scf.YieldOp([fx.as_ir_value(issue().load()) for issue in loads])
    with ir.InsertionPoint(branch.regions[1].blocks[0]):
        zero = fx.as_ir_value(fx.Vector.filled((4,), 0.0, elem))
        scf.YieldOp([zero] * len(loads))
    return [fx.Vector(r, (4,), elem) for r in branch.results]


def _when(cond: fx.Boolean, issuers: list) -> None:
    """``issuers`` behind one uniform branch on ``cond``."""
    branch = scf.IfOp(fx.as_ir_value(cond), [], has_else=False)
    with ir.InsertionPoint(branch.regions[0].blocks[0]):
        for issue in issuers:
            issue()
        scf.YieldOp([])


def _when_beta_is_zero(beta: fx.Float32, issuers: list) -> None:
    """``issuers`` behind one uniform branch on beta == 0, tested on beta's bits without the sign (zero
    for either zero, as the float compare) passed through an empty asm at each branch.

    A compare the branches share stays live as a lane mask, and LLVM branched on it in four scalar
    instructions (``s_and_b64`` with exec, ``s_cselect``, ``s_cmp``, ``s_cbranch``); with the asm each
    branch compares its own copy (``s_mov``, ``s_cmp``, ``s_cbranch``). Not for beta != 0's branch:
    on the integer compare LLVM hoisted its loads of D above it, reading D whatever beta.
    """
    bits = fx.Int32(mfma.fence([fx.as_ir_value(beta.bitcast(fx.Int32) & 0x7FFFFFFF)], "s", 0)[0])
    _when(bits == 0, issuers)


def _lane_xor(v: fx.Vector, lane: fx.Int32, step: int) -> fx.Vector:
    """Lane ``lane ^ step``'s copy of ``v``, through ``ds_bpermute_b32`` (byte address = 4 x source lane).

    Not ``gpu.shuffle``: LLVM lowers its XOR form to ``ds_swizzle_b32``, which the project's emulator
    does not model; the permute is the same data movement in one instruction per word.
    """
    words = v.bitcast(fx.Int32)
    index = fx.as_ir_value((lane ^ step) * 4)
    i32 = fx.Int32.ir_type
    moved = [fx.Int32(rocdl.ds_bpermute(i32, index, fx.as_ir_value(words[e]))) for e in range(4)]
    return fx.Vector.from_elements(moved, dtype=fx.Int32).bitcast(fx.Float32)


def _store_column_sums(p, part, part_buf, atom_f32, block, bm, col, n, oob_f32):
    """One column group's sums over this wave's rows of the tile -> its row of the partials workspace.

    ``part`` holds the sums over this lane's rows; the XOR shuffles add the 16 lanes that share its
    columns, in the same order every run. The workspace is ``[tiles_m * m_waves, n]`` fp32: row
    ``bm * m_waves + (the wave's MMA row)``, written by the group's first lane; the host sums the rows
    in order (``launch.py``).
    """
    lane = fx.thread_idx.x % 64
    total = part
    for step in (1, 2, 4, 8):
        total = total + _lane_xor(total, lane, step)
    # Wave w's MMA coordinate along M is w // n_waves (the wave layout of gemm.make_tiled_mma).
    ws_row = bm * p.m_waves + fx.thread_idx.x // 64 // p.n_waves
    first = (lane % _ROW_LANES == 0) & (col < n)
    off = first.select(ws_row * n + col, oob_f32)
    r = fx.make_rmem_tensor(block, fx.Float32)
    r.store(total)
    fx.copy_atom_call(atom_f32, r, fx.make_view(fx.get_iter(part_buf) + off, block))
