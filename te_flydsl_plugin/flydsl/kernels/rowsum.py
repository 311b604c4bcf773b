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
from flydsl.expr import range_constexpr
from flydsl.expr.typing import Vector

from .config import DMA_BYTES, OOB_BYTES
from .mfma import fence


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


class Tile:
    """One K tile's share of a thread's sums as issuers a schedule can spread among the tile's MFMAs
    (``gemm._Mma.multiply``): :attr:`reads`, the tile's LDS reads, then :attr:`adds`, ``PART`` sums
    each (a whole read's ``vec`` conversions and adds in one gap between two MFMAs would hold the XDL
    pipe's next MFMA back); :attr:`sums` once all have run. Each read's data is waited for where its
    adds use it (LLVM's ``s_waitcnt``), so the adds must only come after their reads."""

    PART = 2

    def __init__(self, p, sums: fx.Vector, lds_stage, layout, elem, tid) -> None:
        vec, chunks, groups = shape(p)
        self._parts = [sums.shuffle(sums, list(range(e, e + self.PART))) for e in range(0, vec, self.PART)]
        self.reads: list[Callable[[], None]] = []
        self.adds: list[Callable[[], None]] = []
        for i in range_constexpr(p.tile_k // groups):
            chunk = fx.make_rmem_tensor(fx.make_layout(vec, 1), elem)
            where = ((tid % chunks) * vec, tid // chunks + i * groups)  # (row, K column) of the chunk
            self.reads.append(functools.partial(self._read, lds_stage, layout, elem, vec, where, chunk))
            self.adds += [functools.partial(self._add, chunk, q) for q in range(len(self._parts))]

    @staticmethod
    def _read(lds_stage, layout, elem, vec: int, where: tuple, chunk: fx.Tensor) -> None:
        idx = fx.get_scalar(fx.crd2idx(where, layout))
        atom = fx.make_copy_atom(fx.UniversalCopy(128), elem)
        fx.copy_atom_call(atom, fx.make_view(lds_stage + idx, fx.make_layout(vec, 1)), chunk)

    def _add(self, chunk: fx.Tensor, q: int) -> None:
        # Between two empty asm statements, which keep their place among the MFMAs' (side-effecting asm):
        # LLVM's scheduler gathered the free-standing conversions and adds into runs of 14 and 81
        # instructions between two MFMAs, the XDL pipe idle behind them.
        v = chunk.load()
        first = q * self.PART
        pair = v.shuffle(v, list(range(first, first + self.PART)))
        pair, part = (Vector(x) for x in fence([fx.as_ir_value(pair), fx.as_ir_value(self._parts[q])], "v", 0))
        (total,) = fence([fx.as_ir_value(part + pair.to(fx.Float32))], "v", 0)
        self._parts[q] = Vector(total)

    @property
    def sums(self) -> fx.Vector:
        whole = self._parts[0]
        for part in self._parts[1:]:
            whole = whole.shuffle(part, list(range(len(whole) + len(part))))
        return whole


def add(p, sums: fx.Vector, lds_stage, layout, elem, tid) -> fx.Vector:
    """``sums`` plus this thread's share of one K tile in LDS (``lds_stage``: lhs's stage pointer), all
    at once (fp32's, after each tile's MFMAs)."""
    tile = Tile(p, sums, lds_stage, layout, elem, tid)
    for issue in tile.reads + tile.adds:
        issue()
    return tile.sums


def store(p, sums: fx.Vector, ws_buf, row0, m, tid) -> None:
    """This thread's sums -> ``ws[t // chunks, row0 + its rows]`` (rows past M dropped)."""
    vec, chunks, _ = shape(p)
    row = row0 + (tid % chunks) * vec
    base = (tid // chunks) * m + row
    atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), fx.Float32)
    block = fx.make_layout(4, 1)
    oob = -(OOB_BYTES // 4)
    for q in range_constexpr(vec // 4):
        off = (row + 4 * q < m).select(base + 4 * q, oob)
        r = fx.make_rmem_tensor(block, fx.Float32)
        r.store(fx.Vector.from_elements([sums[4 * q + e] for e in range(4)], dtype=fx.Float32))
        fx.copy_atom_call(atom, r, fx.make_view(fx.get_iter(ws_buf) + off, block))
