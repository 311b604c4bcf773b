"""TE's BGRADB in the wgrad (NT) GEMM: ``bias_grad[m] = sum_k lhs[m, k]`` (lhs is TE's grad_output).

The sums need the data the K loop already brings into LDS, so they are taken there, from each K
tile right after its MFMAs, by the workgroups of the first tile column only (``bn == 0``: every
output row's sums once, no second pass over B, no cross-tile reduction). Every other workgroup
branches around it (one uniform scalar branch per K tile).

NT reads lhs M-major: its LDS tile is K-outer, rows contiguous in 16-byte chunks of ``vec`` rows
(``gemm._lds_layout``; the swizzle keeps chunks whole). Thread ``t`` owns the chunk of rows
``vec * (t % chunks)`` for the K columns ``t // chunks + groups * i``, so a K tile costs it
``tile_k / groups`` 16-byte LDS reads and ``vec`` fp32 adds per read, into ``vec`` fp32 sums carried
through the loop. After the loop each thread stores its sums as row ``t // chunks`` of a
``[groups, M]`` fp32 workspace, which the host reduces over its rows in a fixed order
(``launch.py``): no atomics, the same bits every run.
"""

from __future__ import annotations

import flydsl.expr as fx
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


def add(p, sums: fx.Vector, lds_stage, layout, elem, tid) -> fx.Vector:
    """``sums`` plus this thread's share of one K tile in LDS (``lds_stage``: lhs's stage pointer)."""
    vec, chunks, groups = shape(p)
    atom = fx.make_copy_atom(fx.UniversalCopy(128), elem)
    r = (tid % chunks) * vec
    c0 = tid // chunks
    for i in range_constexpr(p.tile_k // groups):
        idx = fx.get_scalar(fx.crd2idx((r, c0 + i * groups), layout))
        chunk = fx.make_rmem_tensor(fx.make_layout(vec, 1), elem)
        fx.copy_atom_call(atom, fx.make_view(lds_stage + idx, fx.make_layout(vec, 1)), chunk)
        sums = sums + chunk.load().to(fx.Float32)
    return sums


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
