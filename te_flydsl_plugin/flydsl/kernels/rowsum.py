"""TE's BGRADB in the wgrad (NT) GEMM: ``bias_grad[m] = sum_k lhs[m, k]`` (lhs is TE's grad_output).

The sums need the data the K loop already brings into LDS, so they are taken there, no second pass
over B. On the pinned (16-bit) kernels every workgroup adds each K tile up among the tile's MFMAs
(:class:`Tile`, placed by ``gemm._Mma.multiply``: read in chunk 0, before the hand-over's release lets
the refill overwrite the stage), so bgrad runs the plain twin's hand-over loop; only the workgroups of
the first tile column (``bn == 0``: every output row's sums once, no cross-tile reduction) store them.
Branching around the sums in the other columns would split the MFMAs' straight-line schedule, or hold
the loop twice. fp32 (LLVM's own MFMAs, sync at the loop's top) adds a tile after its MFMAs in the first
tile column only (:func:`add`, behind one uniform branch, which LLVM unswitches into two loops).

NT reads lhs M-major: its LDS tile is K-outer, rows contiguous in 16-byte chunks of ``vec`` rows
(``gemm._lds_layout``; the swizzle keeps chunks whole). Thread ``t`` owns the chunk of rows
``vec * (t % chunks)`` for the K columns ``t // chunks + groups * i``, so a K tile costs it
``tile_k / groups`` 16-byte LDS reads and ``vec`` fp32 adds per read, into ``vec`` fp32 sums carried
through the loop. After the loop each thread stores its sums as row ``t // chunks`` of a
``[groups, M]`` fp32 workspace, which the host reduces over its rows in a fixed order
(``launch.py``): no atomics, the same bits every run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flydsl.expr as fx
from flydsl._mlir.dialects import llvm
from flydsl.expr import range_constexpr

from .config import DMA_BYTES, OOB_BYTES


def shape(p) -> tuple[int, int, int]:
    """``(vec, chunks, groups)``: rows per 16-byte chunk, chunks per K column, thread groups along K."""
    vec = DMA_BYTES // p.elem_bytes
    chunks = p.tile_m // vec
    return vec, chunks, p.threads // chunks


def groups_of(tile_m: int, elem_bytes: int, threads: int) -> int:
    """Workspace rows of one launch (host side: the same arithmetic as :func:`shape`)."""
    return threads // (tile_m // (DMA_BYTES // elem_bytes))


def start(p) -> fx.Vector:
    """Zero sums (one per row of the thread's chunk)."""
    vec = shape(p)[0]
    return fx.Vector.filled((vec,), 0.0, fx.Float32)


# One 16-bit element of a 32-bit word (its low or high half) into its fp32 sum: one asm statement each,
# ``(text, constraints)`` by half. An asm statement keeps its place among the MFMAs' (side-effecting asm);
# free-standing arithmetic between two empty asm fences did too, but LLVM's hazard recognizer, which
# assumes an asm statement's every def is a forwarding hazard for the next instruction, put an
# ``s_nop 0`` at most fences (83 a pair of bf16 tiles). So no statement here defines what a later one
# reads or writes but the sums, which the next statement to touch comes many MFMAs later: bf16's low
# half goes to its fp32 bits through a scratch ($1), the high half masks the word itself (tied, the
# word's last use), each added by ``v_add_f32``. fp16: one ``v_fma_mix_f32`` of the half (``op_sel`` 1:
# the high one) times 1.0 plus the sum: an exact product and one rounding, the bits of
# ``v_cvt_f32_f16`` and ``v_add_f32`` (AMD's CDNA3 ISA guide, VOP3P V_FMA_MIX_F32: each source f32, or
# f16 from the half ``op_sel`` names where ``op_sel_hi`` is set).
_ADD = {
    "BFloat16": (
        ("v_lshlrev_b32 $1, 16, $3\nv_add_f32 $0, $0, $1", "=v,=&v,0,v"),
        ("v_and_b32 $1, 0xffff0000, $1\nv_add_f32 $0, $0, $1", "=v,=v,0,1"),
    ),
    "Float16": (
        ("v_fma_mix_f32 $0, $2, 1.0, $0 op_sel_hi:[1,0,0]", "=v,0,v"),
        ("v_fma_mix_f32 $0, $2, 1.0, $0 op_sel:[1,0,0] op_sel_hi:[1,0,0]", "=v,0,v"),
    ),
}


def _reads(p, lds_stage, layout, elem, tid) -> tuple[list[fx.Tensor], list[Callable[[], None]]]:
    """This thread's chunks of one K tile in LDS (register tensors of ``vec`` elements) and the issuers of
    their 16-byte reads (``lds_stage``: lhs's stage pointer)."""
    vec, chunks, groups = shape(p)
    tensors, issuers = [], []
    for i in range_constexpr(p.tile_k // groups):
        chunk = fx.make_rmem_tensor(fx.make_layout(vec, 1), elem)
        where = ((tid % chunks) * vec, tid // chunks + i * groups)  # (row, K column) of the chunk
        tensors.append(chunk)
        issuers.append(functools.partial(_read, lds_stage, layout, elem, vec, where, chunk))
    return tensors, issuers


def _read(lds_stage, layout, elem, vec: int, where: tuple, chunk: fx.Tensor) -> None:
    idx = fx.get_scalar(fx.crd2idx(where, layout))
    atom = fx.make_copy_atom(fx.UniversalCopy(128), elem)
    fx.copy_atom_call(atom, fx.make_view(lds_stage + idx, fx.make_layout(vec, 1)), chunk)


class Tile:
    """One K tile's share of a thread's sums as issuers a schedule can spread among the tile's MFMAs
    (``gemm._Mma.multiply``, 16-bit elements): :attr:`reads`, the tile's LDS reads, then :attr:`adds`,
    one element each (a whole read's ``vec`` conversions and adds in one gap between two MFMAs would
    hold the XDL pipe's next MFMA back); :attr:`sums` once all have run. Each read's data is waited
    for where its adds use it (LLVM's ``s_waitcnt``), so the adds must only come after their reads."""

    def __init__(self, p, sums: fx.Vector, lds_stage, layout, elem, tid) -> None:
        vec = shape(p)[0]
        self._elem = elem
        self._sums = [fx.as_ir_value(sums[e]) for e in range(vec)]
        chunks, self.reads = _reads(p, lds_stage, layout, elem, tid)
        self.adds = [functools.partial(self._add, chunk, e) for chunk in chunks for e in range(vec)]

    def _add(self, chunk: fx.Tensor, e: int) -> None:
        text, constraints = _ADD[self._elem.__name__][e % 2]
        word = fx.as_ir_value(chunk.load().bitcast(fx.Int32)[e // 2])
        f32 = self._sums[e].type
        alone = constraints.count("=") == 1  # else the word's scratch or its tied copy is a second result
        result = llvm.inline_asm(
            f32 if alone else llvm.StructType.get_literal([f32, word.type]),
            [self._sums[e], word],
            text,
            constraints,
            has_side_effects=True,
        )
        self._sums[e] = result if alone else llvm.extractvalue(f32, result, [0])

    @property
    def sums(self) -> fx.Vector:
        return fx.Vector.from_elements(self._sums, dtype=fx.Float32)


def add(p, sums: fx.Vector, lds_stage, layout, elem, tid) -> fx.Vector:
    """``sums`` plus this thread's share of one K tile in LDS (``lds_stage``: lhs's stage pointer), all
    at once, in plain arithmetic for LLVM to schedule (fp32's, after each tile's MFMAs)."""
    chunks, reads = _reads(p, lds_stage, layout, elem, tid)
    for issue in reads:
        issue()
    for chunk in chunks:
        sums = sums + chunk.load().to(fx.Float32)
    return sums


def store(p, sums: fx.Vector, ws_buf, row0, m, tid, rows) -> None:
    """This thread's sums -> ``ws[t // chunks, row0 + its rows]`` (the workspace ``m`` wide; rows past
    ``rows`` dropped through the buffer's range check: M in the first tile column, 0 elsewhere, so the
    other columns need no branch around the store, which LLVM laid out behind a backward jump)."""
    vec, chunks, _ = shape(p)
    row = row0 + (tid % chunks) * vec
    base = (tid // chunks) * m + row
    atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), fx.Float32)
    block = fx.make_layout(4, 1)
    oob = -(OOB_BYTES // 4)
    for q in range_constexpr(vec // 4):
        off = (row + 4 * q < rows).select(base + 4 * q, oob)
        r = fx.make_rmem_tensor(block, fx.Float32)
        r.store(fx.Vector.from_elements([sums[4 * q + e] for e in range(4)], dtype=fx.Float32))
        fx.copy_atom_call(atom, r, fx.make_view(fx.get_iter(ws_buf) + off, block))
