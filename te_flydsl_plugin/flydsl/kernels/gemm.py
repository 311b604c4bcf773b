"""The one FlyDSL GEMM family for gfx950: every element format, majorness and output dtype.

``out[M, N] = alpha * sum_k lhs[m, k] * rhs[n, k] (* lhs_scale * rhs_scale) + beta * out``.

A :class:`~.config.KernelConfig` becomes a :class:`GemmParams` (compile-time constants only); M, N,
K, the leading strides, alpha and beta are runtime arguments, so one compile serves every shape.

Design (docs/kernels.md has the reasons at length):

* 256x256 output tile per workgroup of 4 waves (2 x 2, each wave a 128 x 128 block of 16x16 MFMAs,
  256 fp32 accumulators per lane pinned in AGPRs by ``kernels/mfma.py``, which issues the MFMAs),
  or for fp32 8 waves (2 x 4, 128 x 64 per wave, LLVM's own MFMAs, accumulators in arch VGPRs); the
  accumulators stay in place for the whole K loop. 128 x 128 tiles: 4 waves of 64 x 64. The MFMAs compute
  the tile transposed (A = rhs, B = lhs), so a lane's 4 accumulators of a block are 4 adjacent
  output columns, stored as one vector.
* LDS ping-pong: two stages, each holding one ``[tile, tile_k]`` slice of both operands, filled by
  direct global->LDS DMA (``buffer_load ... lds``); the load of K tile ``t + 1`` runs while tile ``t``
  is multiplied, issued right after the barrier that frees its stage (per-lane offsets computed once,
  the tile's K in the scalar offset). A runtime loop, so K is not unrolled into the code; bf16, fp16
  and FP8 hand each tile over to the next among its last MFMAs (the release barrier, the DMA of the
  tile after next, then the publish barrier of the next tile and, with two K chunks, its first
  fragment reads).
* K-major operands are stored row-major in LDS with an XOR swizzle on 16-byte chunks; the others
  K-outer, with their K rows' bits reordered and XOR-ed into the row's blocks, and read with gfx950's
  transposing ``ds_read_b64_tr_b16`` (``_b8`` for MXFP8), which gives TE's NN / NT layouts without
  any copy. Every fragment read is free of bank conflicts under gfx950's 64-bank model.
* Edges through buffer bounds: every element the tile does not own (rows past M/N, K past K) is
  loaded through an offset past the buffer resource's size, which the hardware answers with zero,
  and the matching stores are dropped the same way. So M and N need not be tile multiples (N is a
  multiple of 4, the output vector) and K only a multiple of one 16-byte vector.
* XCD-aware tile order: the dispatcher deals workgroups round-robin to 8 XCDs; we renumber them so
  each XCD works on a contiguous range of tiles, grouped ``GROUP_M`` tile rows deep, so neighbouring
  tiles that share operand rows/columns hit the same XCD's L2.
* MXFP8 is a scaling mode, not another kernel: the same pipeline with the E8M0 block scales of the
  packed layout fed to the scaled MFMA from registers (``kernels/mx.py``).
"""

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import llvm
from flydsl.expr import const_expr, range_constexpr, rocdl

from ...spec import Format
from . import epilogue, mfma, mx, rowsum
from .args import TENSORS, KernelArgs, LaunchShape, check_signature
from .config import DMA_BYTES, IMM_OFFSET_LIMIT, MAX_LAUNCH_BYTES, OOB_BYTES, OUT_VEC, KernelConfig, vector_elems

WAVE_SIZE = 64
NUM_XCDS = 8
GROUP_M = 8
# Bytes one DMA of a wave moves (64 lanes x 16 bytes, contiguous in LDS); a run of M0_SHARE of them
# shares one M0, the next of a run reached by the 12-bit immediate offset (config.IMM_OFFSET_LIMIT).
WAVE_DMA_BYTES = WAVE_SIZE * DMA_BYTES
M0_SHARE = IMM_OFFSET_LIMIT // WAVE_DMA_BYTES

# Format -> (FlyDSL element type name, MFMA shape K). The MFMA per format is the widest gfx950 has.
_ELEM = {
    Format.BF16: ("BFloat16", 32),
    Format.FP16: ("Float16", 32),
    Format.FP32: ("Float32", 4),
    Format.FP8_E4M3: ("Float8E4M3FN", 128),
    Format.FP8_E5M2: ("Float8E5M2", 128),
    Format.MXFP8_E4M3: ("Float8E4M3FN", 128),
    Format.MXFP8_E5M2: ("Float8E5M2", 128),
}
_DEFAULT_STREAM = fx.Stream(None)  # the launch's stream when none is given (the executor always gives one)
_OUT = {Format.FP32: "Float32", Format.BF16: "BFloat16", Format.FP16: "Float16"}


@fx.struct
class GemmParams:
    """The compile-time constants of one kernel (part of FlyDSL's cache key; never M, N, K)."""

    name: fx.Constexpr[str]
    lhs_elem: fx.Constexpr[str]
    rhs_elem: fx.Constexpr[str]
    out_elem: fx.Constexpr[str]
    lhs_k_major: fx.Constexpr[bool]
    rhs_k_major: fx.Constexpr[bool]
    scaled: fx.Constexpr[bool]  # the MFMA is the scaled f8f6f4 one (FP8 and MXFP8)
    mx: fx.Constexpr[bool]  # its scales are E8M0 block scales from registers (kernels/mx.py)
    pinned: fx.Constexpr[bool]  # accumulators pinned in AGPRs (kernels/mfma.py), else LLVM's MFMAs
    elem_bytes: fx.Constexpr[int]
    out_bytes: fx.Constexpr[int]
    tile_m: fx.Constexpr[int]
    tile_n: fx.Constexpr[int]
    tile_k: fx.Constexpr[int]
    m_waves: fx.Constexpr[int]
    n_waves: fx.Constexpr[int]
    mma_k: fx.Constexpr[int]
    threads: fx.Constexpr[int]
    epi_bias: fx.Constexpr[bool]  # the fused epilogue's parts (kernels/epilogue.py FLAGS)
    epi_gelu: fx.Constexpr[bool]
    epi_dgelu: fx.Constexpr[bool]
    epi_colsum: fx.Constexpr[bool]
    epi_rowsum: fx.Constexpr[bool]


@dataclass(frozen=True)
class Geometry:
    """Derived sizes of a config, checked once on the host so the kernel body can rely on them."""

    vec: int  # elements per 16-byte vector
    lhs_loads: int  # DMA transfers per thread per K tile
    rhs_loads: int
    lds_bytes: int


def params_for(cfg: KernelConfig) -> GemmParams:
    """Translate a config into kernel constants; raises ValueError for configs the family cannot build."""
    if cfg.lhs_format not in _ELEM or cfg.rhs_format not in _ELEM:
        raise ValueError(f"{cfg.name}: operand formats must be one of {[f.value for f in _ELEM]}")
    kinds = [(f.itemsize, f.is_fp8, f.is_mx) for f in (cfg.lhs_format, cfg.rhs_format)]
    if kinds[0] != kinds[1]:
        raise ValueError(f"{cfg.name}: lhs and rhs must share a format family (fp8 kinds may differ)")
    if cfg.scaling == "none" and cfg.lhs_format != cfg.rhs_format:
        raise ValueError(f"{cfg.name}: mixed formats exist only between FP8 kinds")
    if cfg.scaling == "mx" and cfg.tile_k != mx.TILE_K:
        raise ValueError(f"{cfg.name}: MXFP8 needs tile_k == {mx.TILE_K} (one K-step, one scale byte, per tile)")
    if cfg.out_format not in _OUT:
        raise ValueError(f"{cfg.name}: output must be fp32, bf16 or fp16")
    if cfg.epilogue not in epilogue.FLAGS:
        raise ValueError(f"{cfg.name}: the kernels implement the epilogues {sorted(epilogue.FLAGS)}")
    itemsize = cfg.lhs_format.itemsize
    if cfg.scaling == "tensor" and not (cfg.lhs_k_major and cfg.rhs_k_major):
        raise ValueError(f"{cfg.name}: FP8 operands must be K-major (the plan uses TE's stored transposes)")
    m_waves, n_waves = _wave_grid(cfg)
    mma_k = _ELEM[cfg.lhs_format][1]
    p = GemmParams(
        name=cfg.name,
        lhs_elem=_ELEM[cfg.lhs_format][0],
        rhs_elem=_ELEM[cfg.rhs_format][0],
        out_elem=_OUT[cfg.out_format],
        lhs_k_major=cfg.lhs_k_major,
        rhs_k_major=cfg.rhs_k_major,
        scaled=cfg.scaling != "none",
        mx=cfg.scaling == "mx",
        pinned=cfg.agpr_accumulators,
        elem_bytes=itemsize,
        out_bytes=cfg.out_format.itemsize,
        tile_m=cfg.tile_m,
        tile_n=cfg.tile_n,
        tile_k=cfg.tile_k,
        m_waves=m_waves,
        n_waves=n_waves,
        mma_k=mma_k,
        threads=cfg.waves * WAVE_SIZE,
        **{f"epi_{name}": on for name, on in epilogue.FLAGS[cfg.epilogue]._asdict().items()},
    )
    geometry(cfg)  # validates divisibility
    return p


def geometry(cfg: KernelConfig) -> Geometry:
    """Vector and transfer counts of a config; raises ValueError when the tile does not divide evenly."""
    itemsize = cfg.lhs_format.itemsize
    vec = DMA_BYTES // itemsize
    threads = cfg.waves * WAVE_SIZE
    mma_k = _ELEM[cfg.lhs_format][1]
    if cfg.tile_k % mma_k or cfg.tile_k % vec:
        raise ValueError(f"{cfg.name}: tile_k must be a multiple of {max(mma_k, vec)}")
    m_waves, n_waves = _wave_grid(cfg)
    if cfg.tile_m % (m_waves * 16) or cfg.tile_n % (n_waves * 16):
        raise ValueError(f"{cfg.name}: tiles must be multiples of the wave grid times 16")
    loads = []
    for rows in (cfg.tile_m, cfg.tile_n):
        vectors = rows * cfg.tile_k // vec
        if vectors % threads:
            raise ValueError(f"{cfg.name}: a {rows}x{cfg.tile_k} tile is not a whole number of DMA rounds")
        loads.append(vectors // threads)
    step = WAVE_DMA_BYTES // itemsize  # elements of one wave's DMA
    if step % cfg.tile_k or any(n * step % (cfg.tile_k * _K_MAJOR_SWIZZLE_ROWS) for n in loads):
        raise ValueError(f"{cfg.name}: a wave's DMAs must cover whole K-major rows and whole swizzle periods")
    if any(n % min(n, M0_SHARE) for n in loads):
        raise ValueError(f"{cfg.name}: a wave's DMAs must make whole runs of {M0_SHARE} sharing one M0")
    lds = 2 * (cfg.tile_m + cfg.tile_n) * cfg.tile_k * itemsize
    if cfg.scaling == "mx":
        m_reps, n_reps = cfg.tile_m // (m_waves * 16), cfg.tile_n // (n_waves * 16)
        if m_reps % n_waves or n_reps % m_waves:
            raise ValueError(f"{cfg.name}: MXFP8's waves sharing rows must split their repetitions evenly")
        if max(m_reps // n_waves, n_reps // m_waves) > mx.MAX_SHARE:
            raise ValueError(f"{cfg.name}: a wave's MXFP8 scale-word DMAs must fit one M0 (mx.MAX_SHARE)")
        lds += mx.lds_words(cfg.tile_m, cfg.tile_n) * 4
    return Geometry(vec=vec, lhs_loads=loads[0], rhs_loads=loads[1], lds_bytes=lds)


def _wave_grid(cfg: KernelConfig) -> tuple[int, int]:
    """Waves along M and N: 8 waves as 2 x 4, 4 waves as 2 x 2."""
    grids = {8: (2, 4), 4: (2, 2)}
    if cfg.waves not in grids:
        raise ValueError(f"{cfg.name}: waves must be one of {sorted(grids)}")
    return grids[cfg.waves]


def _log2(x: int) -> int:
    return x.bit_length() - 1


# The K-major swizzle's period in rows: the chunk of a 128-byte row (8 chunks) is XOR-ed by (row mod 16) / 2.
_K_MAJOR_SWIZZLE_ROWS = 16


def _lds_layout(rows: int, tile_k: int, vec: int, k_major: bool) -> fx.Layout:
    """LDS layout of one operand's ``[rows, tile_k]`` slice, swizzled against bank conflicts of its fragment reads.

    Both are XOR swizzles on whole 16-byte chunks (the DMA granule), so every chunk stays contiguous
    and the fill can place it by the same involution. The bank model is gfx950's (64 banks of 4 bytes,
    256 bytes a clock: ``emulator/lds_banks.py``): one clock serves 16 lanes of a ``ds_read_b128``, which
    must touch 64 distinct banks.

    K-major: row-major, 128-byte rows (two a bank period), the chunk index XOR-ed by ``(row mod 16) / 2``:
    the 16 rows that one clock of a fragment read serves land on 16 distinct 16-byte bank groups (the
    swizzle of PR 676's and FlyDSL's gfx950 kernels; ``row mod 8`` leaves rows r and r + 8 on the same
    banks, tests/emulator/test_lds_banks.py).

    Otherwise K-outer (rows contiguous: the order the data arrives in and the transposing reads read),
    each K row a whole number of bank periods. One clock serves K rows that differ in K bits no single
    XOR window covers (``_KOUTER``), so the K rows are stored in LDS with their bits reordered, those
    bits first, and the LDS row's low bits are XOR-ed into the block index of the row. A tile of 384 rows
    is stored as three blocks of 128, each a whole K tile (``_kouter_width``).
    """
    if k_major:
        chunks = tile_k // vec
        if chunks != _K_MAJOR_SWIZZLE_ROWS // 2:
            raise ValueError(f"K-major LDS rows must be {_K_MAJOR_SWIZZLE_ROWS // 2} chunks, got {chunks}")
        swz = fx.SwizzleType.get(_log2(chunks), _log2(vec), _log2(chunks) + 1)
        return fx.make_composed_layout(fx.static(swz), fx.make_ordered_layout((rows, tile_k), (1, 0)))
    block_bytes, xor_bits, order = _KOUTER[DMA_BYTES // vec]
    block = _log2(block_bytes * vec // DMA_BYTES)  # offset bit of block 0, in elements
    width = _kouter_width(rows)
    # K's bit ``order[j]`` is the LDS row's bit ``j``; K's bits past ``order`` keep their place.
    swz = fx.SwizzleType.get(xor_bits, block, _log2(width) - block)
    if width == rows and order == tuple(range(len(order))):
        return fx.make_composed_layout(fx.static(swz), fx.make_ordered_layout((rows, tile_k), (0, 1)))
    lds_bit = {k_bit: j for j, k_bit in enumerate(order)}
    k_shape = (2,) * len(order) + (tile_k >> len(order),)
    k_stride = (*(width << lds_bit[b] for b in range(len(order))), width << len(order))
    row_shape, row_stride = (rows, 1) if width == rows else ((width, rows // width), (1, width * tile_k))
    return fx.make_composed_layout(fx.static(swz), fx.make_layout((row_shape, k_shape), (row_stride, k_stride)))


def _kouter_width(rows: int) -> int:
    """The tile rows a K-outer LDS row holds: all of them where ``rows`` is a power of two; else (384) its
    largest power-of-two part, 128, the other rows in blocks of whole K tiles after the first, so the
    swizzle's source bits, from ``log2(width)`` up, are the K row's in every block. With 384-element
    LDS rows, bits 8 to 10 of an offset mix the K row and the row's third (LLVM divided by 384 in the
    fill, and the fragment reads' repetition offsets did not commute with the swizzle)."""
    return rows & -rows


def _kouter_k_of_lds_row(rho: fx.Int32, itemsize: int) -> fx.Int32:
    """The tile's K row that K-outer LDS row ``rho`` holds (``_lds_layout``'s bit order, undone)."""
    order = _KOUTER[itemsize][2]
    if order == tuple(range(len(order))):
        return rho
    k = (rho >> len(order)) << len(order)
    for j, k_bit in enumerate(order):
        k = k + (((rho >> j) & 1) << k_bit)
    return k


# K-outer LDS per element size: (block bytes, XOR bits, K bits in LDS-row order). One clock of the
# fragment read (64 banks x 4 bytes, ``emulator/lds_banks.py``; K rows read as the emulator's
# ``lds_conflicts`` probe shows them) serves, for 16-bit ``ds_read_b64_tr_b16``, the 8 K rows ``8 g + 4 j +
# r`` (``g`` the phase's two lane groups, ``r < 4``) of 32 bytes: K bits 0, 1, 3 vary, onto 8 blocks of 32
# bytes; for 8-bit ``_tr_b8`` the 16 K rows ``32 g + 8 j + r`` (``r < 8``) of 16 bytes: K bits 0, 1, 2, 5, onto
# 16 blocks of 16; for fp32 ``ds_read_b32`` the 4 K rows ``4 j + r`` of 64 bytes: K bits 0, 1, onto 4
# blocks of 64. (The single ``32-byte block ^= K mod 4`` before left them 2-, 4- and 2-way conflicted.)
_KOUTER = {
    2: (32, 3, (0, 1, 3, 2)),
    1: (16, 4, (0, 1, 2, 5, 3, 4)),
    4: (64, 2, (0, 1)),
}


def _s2r_atom(p: GemmParams, elem: type, k_major: bool) -> fx.CopyAtom:
    """LDS -> register copy of one MFMA operand fragment.

    A lane's fragment is ``mma_k / 4`` consecutive LDS K columns of one row (16x16 MFMAs: 4 lane
    groups along K; for MXFP8 the fill has put in them the two K runs the MFMA expects, see
    ``fill``). K-major LDS holds them contiguously (one ``ds_read_b64``/``b128``). K-outer LDS holds
    them one row apart: 16-bit formats use gfx950's transposing ``ds_read_b64_tr_b16``, 8-bit ones
    (MXFP8 from TE's columnwise storage) ``ds_read_b64_tr_b8``; fp32 (one element per lane) reads
    single words.
    """
    frag_bits = p.mma_k // 4 * p.elem_bytes * 8
    if const_expr(k_major or p.elem_bytes == 4):
        return fx.make_copy_atom(fx.UniversalCopy(min(frag_bits, 128)), elem)
    if const_expr(p.elem_bytes == 1):
        return fx.make_copy_atom(fx.rocdl.cdna4.LDSReadTrans8_64b(), elem)
    return fx.make_copy_atom(fx.rocdl.cdna4.LDSReadTrans16_64b(), elem)


def _rep_sources(src: fx.Tensor, kc: int, reps: int, in_row: bool) -> list[fx.Tensor]:
    """The LDS sources of chunk ``kc``'s fragment repetitions, from a thread's partition ``src``
    (values, repetitions, chunks) of a swizzled stage.

    The swizzle acts on a source's whole offset, the lane's and the repetition's parts together, and
    LLVM does not see where a repetition's or chunk's offset commutes with it: it computed every
    source's address apart (16 VALU instructions a bf16 TN iteration, the loop's top; 16 address VGPRs
    for bf16 NN's rhs, which left its 384 x 256 tile 9 spills). Where an offset commutes, the source is
    an earlier one moved outside the swizzle: the same address, the difference in the read's immediate
    offset. Swizzle<B, M, S> XORs offset bits [M + S, M + S + B) into [M, M + B); a difference commutes
    - when it is a multiple of 2^(M + S + B), above every bit the swizzle reads or writes (the K-major
      layouts' repetitions, whole swizzle periods of rows apart; the K-outer layouts' chunks, 32 K rows
      apart, and their blocks of rows, ``_kouter_width``; MXFP8's repetitions);
    - ``in_row``, the repetitions stepping along a K-outer LDS row that holds all the tile's rows (its
      index is then the bits from M + S up, which a step inside the row never reaches), when it is a
      multiple of 2^(M + B), above the bits the XOR writes: the 16-bit K-outer repetitions r and r + 4
      (32 elements apart, a 128-element window), so 4 addresses a chunk instead of 8.
    """
    layout = fx.get_layout(src)
    swizzle = fx.composed_get_inner(layout)
    outer = fx.composed_get_outer(layout)
    shape, (_, rep_stride, chunk_stride) = fx.get_shape(outer).to_py_value(), fx.get_stride(outer).to_py_value()
    period = 1 << (swizzle.base + swizzle.shift + swizzle.mask)
    window = 1 << (swizzle.base + swizzle.mask) if in_row else period
    if kc and isinstance(chunk_stride, int) and chunk_stride % period == 0:
        # Chunk 0's sources, kc chunks on: for every repetition the same offset.
        return [_moved(s, kc * chunk_stride) for s in _rep_sources(src, 0, reps, in_row)]
    offsets = _offsets(shape[1], rep_stride)
    if offsets is None:
        return [src[None, r, kc] for r in range(reps)]
    out: list[fx.Tensor] = []
    for r, offset in enumerate(offsets):
        # The first repetition whose offset differs from r's by a multiple of the window.
        first = next(q for q in range(r + 1) if (offset - offsets[q]) % window == 0)
        out.append(src[None, r, kc] if first == r else _moved(out[first], offset - offsets[first]))
    return out


def _offsets(shape: object, stride: object) -> list[int] | None:
    """The offsets of a static (possibly nested) layout mode's coordinates, in index order (the first
    sub-mode fastest); None where a stride is not static."""
    if isinstance(shape, int):
        return [i * stride for i in range(shape)] if isinstance(stride, int) else None
    offsets = [0]
    for sub_shape, sub_stride in zip(shape, stride, strict=True):
        sub = _offsets(sub_shape, sub_stride)
        if sub is None:
            return None
        offsets = [o + s for s in sub for o in offsets]
    return offsets


def _moved(view: fx.Tensor, elements: int) -> fx.Tensor:
    """``view`` moved ``elements`` on, outside its layout's swizzle."""
    return fx.make_view(fx.add_offset(fx.get_iter(view), elements), fx.get_layout(view))


def _tile_coords(num_m: fx.Int32, num_n: fx.Int32, pid: fx.Int32) -> tuple[fx.Int32, fx.Int32]:
    """Output tile (row, column) of workgroup ``pid``: XCD-contiguous, then grouped ``GROUP_M`` rows deep.

    Workgroup ``p`` runs on XCD ``p % 8``; XCD ``x`` receives ``q + (x < r)`` workgroups (``q, r`` =
    total // 8, total % 8), so ``x * q + min(x, r) + p // 8`` numbers each XCD's share contiguously.
    It is a bijection for every grid size, so no shape needs a fallback order.
    """
    total = num_m * num_n
    q = total // NUM_XCDS
    r = total % NUM_XCDS
    xcd = pid % NUM_XCDS
    lin = xcd * q + (xcd < r).select(xcd, r) + pid // NUM_XCDS
    per_group = GROUP_M * num_n
    first_m = (lin // per_group) * GROUP_M
    left = num_m - first_m
    group_rows = (left < GROUP_M).select(left, GROUP_M)
    within = lin % per_group
    return first_m + within % group_rows, within // group_rows


class _Workgroup(NamedTuple):
    """Stage 1, where one workgroup works: its thread, its output tile (``_tile_coords``), the tile's first
    row and column, the K tiles the loop runs, and of them those wholly inside K (no K tail: the tiles the
    loops refill unmasked, ``_Fill.stage``'s ``whole``)."""

    tid: fx.Int32
    bm: fx.Int32
    bn: fx.Int32
    row0: fx.Int32
    col0: fx.Int32
    k_tiles: fx.Int32
    whole_tiles: fx.Int32


def _workgroup(p: GemmParams, m: fx.Int32, n: fx.Int32, k: fx.Int32) -> _Workgroup:
    tid = fx.thread_idx.x
    num_m = (m + p.tile_m - 1) // p.tile_m
    num_n = (n + p.tile_n - 1) // p.tile_n
    bm, bn = _tile_coords(num_m, num_n, fx.block_idx.x)
    return _Workgroup(tid, bm, bn, bm * p.tile_m, bn * p.tile_n, (k + p.tile_k - 1) // p.tile_k, k // p.tile_k)


class _Lds:
    """Stage 2, the LDS ping-pong: two stages, each one ``[tile, tile_k]`` slice of both operands, laid out
    by :func:`_lds_layout` (``a`` is lhs, ``b`` rhs)."""

    def __init__(self, p: GemmParams, elem_a: type, elem_b: type) -> None:
        @fx.struct
        class Stages:
            a: fx.Array[elem_a, 2 * p.tile_m * p.tile_k, 16]
            b: fx.Array[elem_b, 2 * p.tile_n * p.tile_k, 16]

        @fx.struct
        class StagesAndWords:  # MXFP8: and one K group's scale words (mx.word_dmas)
            a: fx.Array[elem_a, 2 * p.tile_m * p.tile_k, 16]
            b: fx.Array[elem_b, 2 * p.tile_n * p.tile_k, 16]
            w: fx.Array[fx.Int32, mx.lds_words(p.tile_m, p.tile_n), 16]

        lds = fx.SharedAllocator().allocate(StagesAndWords if p.mx else Stages)
        self.a = lds.a.peek().ptr
        self.b = lds.b.peek().ptr
        self.words = lds.w.peek().ptr if p.mx else None
        self.a_size = p.tile_m * p.tile_k  # elements per stage
        self.b_size = p.tile_n * p.tile_k
        self.a_layout = _lds_layout(p.tile_m, p.tile_k, DMA_BYTES // p.elem_bytes, p.lhs_k_major)
        self.b_layout = _lds_layout(p.tile_n, p.tile_k, DMA_BYTES // p.elem_bytes, p.rhs_k_major)

    def a_stage(self, stage: fx.Int32 | int) -> fx.Pointer:
        return self.a + stage * self.a_size

    def b_stage(self, stage: fx.Int32 | int) -> fx.Pointer:
        return self.b + stage * self.b_size


class _Plan(NamedTuple):
    """One operand's DMA fill, planned once before the K loop (:meth:`_Fill._plan`)."""

    src: fx.Tensor  # its buffer, over the whole operand from ``bias`` elements before it
    view: fx.Tensor | None  # pinned K-outer: the biased view a K-tail tile's buffer is made from
    loads: list  # per transfer of a lane: (offset at K tile 0, global row, K column); bytes where pinned
    rows: fx.Int32  # the operand's rows (M or N)
    ld: fx.Int32
    k_major: bool
    wave_base: fx.Int32  # the wave's first LDS element of a stage
    share: int  # transfers a run sharing one M0
    bias: int  # elements the buffer starts before the operand
    # K-major with ``_a_in_place``: each transfer's swizzle row and the lane's K column of it, made again
    # for each K-tail tile (:meth:`_Fill._issuers`) instead of held across the K loop
    column: tuple[list[int], Callable[[int, fx.Int32], fx.Int32]] | None = None


class Transfers(list):
    """One K tile's DMA issuers (:meth:`_Fill.stage`), and in ``prepare`` the issuers of the scalar work they
    share (a K-outer operand's tile buffer: about 10 scalar instructions; in MXFP8's loop also the tile and
    the wave's LDS base through :meth:`_Fill._here`), which the hand-over issues on their own, before its
    release (a transfer does it itself where nothing has). Made by a tile's first
    transfer, that work shared one gap between two MFMAs with two transfers and held MXFP8's XDL pipe
    back about 7 cycles a tile (llvm-mca, NN and NT)."""

    def __init__(
        self,
        issuers: Sequence[Callable[[], None]],
        prepare: Sequence[Callable[[], None]] = (),
        parts: tuple["Transfers", "Transfers"] | tuple = (),
    ) -> None:
        super().__init__(issuers)
        self.prepare = list(prepare)
        self.parts = parts  # (lhs, rhs), each with its own prepare, where made of both operands'


class _Fill:
    """Stage 3, the direct global->LDS DMA of both operands: what each lane loads is planned once, before
    the K loop (:meth:`_plan`); :meth:`stage` gives the issuers of one K tile's transfers."""

    def __init__(
        self,
        p: GemmParams,
        wg: _Workgroup,
        lds: _Lds,
        lhs: fx.Tensor,
        rhs: fx.Tensor,
        m: fx.Int32,
        n: fx.Int32,
        k: fx.Int32,
        ld_lhs: fx.Int32,
        ld_rhs: fx.Int32,
    ) -> None:
        self.p = p
        self.lds = lds
        self.k = k
        self.k_tiles = wg.k_tiles
        self.vec = DMA_BYTES // p.elem_bytes
        self.step = WAVE_DMA_BYTES // p.elem_bytes  # elements a wave's DMA moves
        self.oob = -(OOB_BYTES // p.elem_bytes)  # wraps to byte offset 2**31 once scaled (config.OOB_BYTES)
        self.dma = fx.make_copy_atom(fx.rocdl.cdna4.BufferLoadAsyncLDS128b(), 128)
        tid = wg.tid
        loads_a = p.tile_m * p.tile_k // self.vec // p.threads
        loads_b = p.tile_n * p.tile_k // self.vec // p.threads
        self.a = self._plan(lhs, lds.a_layout, p.tile_m, m, wg.row0, ld_lhs, p.lhs_k_major, loads_a, tid)
        self.b = self._plan(rhs, lds.b_layout, p.tile_n, n, wg.col0, ld_rhs, p.rhs_k_major, loads_b, tid)

    def _share(self, k_major: bool, loads: int) -> int:
        """How many of a wave's transfers of one operand share an M0 (:meth:`_issue`): runs of ``M0_SHARE``
        where pinned. fp32's own MFMAs (unpinned) moved 22 of NT's accumulators between registers with
        shared M0s."""
        return min(loads, M0_SHARE) if self.p.pinned else 1

    def _plan(
        self,
        operand: fx.Tensor,
        layout: fx.Layout,
        rows_tile: int,
        rows: fx.Int32,
        first_row: fx.Int32,
        ld: fx.Int32,
        k_major: bool,
        loads: int,
        tid: fx.Int32,
    ) -> _Plan:
        """What one operand's DMA fill needs beyond the K tile, computed once, before the K loop.

        A wave's loads fill LDS contiguously: its ``loads`` DMAs of 1 KiB (64 lanes x 16 bytes) from
        ``wave_base`` on, so that runs of ``share`` of them can share one M0 and step by the immediate
        offset (:meth:`_issue`). Load ``i`` of this lane lands on LDS element ``pos`` and holds logical
        ``(row r, K column c)`` of the tile. LDS K column ``c`` of a tile holds global K ``k0 + c``,
        except for MXFP8, where it holds the K that the block-scaled MFMA expects in that register
        (``mx.k_of_lds_column``): the fragment reads stay 32 consecutive bytes and the permutation
        costs nothing in the K loop (``c`` does not depend on the tile). Everything but the K tile's
        own term is tile-invariant: the element offset of ``(r, c)`` at ``k0 = 0`` (a row past the
        operand's rows already the out-of-bounds offset) stays in a VGPR. K-major, the tile's ``k0``
        goes into the load's scalar offset (``soffset``) and per tile only the K tail is masked,
        ``c < k - k0``: a DMA covers 8 rows, half a swizzle period, so a lane's loads hold one of two
        K columns and share two compares a tile. K-outer, the tile's buffer starts at its first K
        row and ends with the operand (:meth:`_k_outer_tile`): the hardware's range check masks the
        K tail, and the VGPR offsets go out as they are. A tile wholly inside K masks nothing
        (:meth:`stage`): K-outer, its first K row goes into the scalar offset of ``src``.
        """
        p, vec, tile_k = self.p, self.vec, self.p.tile_k
        share = self._share(k_major, loads)
        step = self.step
        bias = (share - 1) * step  # the buffer starts this far before the operand (:meth:`_issue`)
        wave, lane = tid // WAVE_SIZE, tid % WAVE_SIZE
        wave_base = rocdl.readfirstlane(fx.Int32.ir_type, fx.Int32(wave * (loads * step)))
        # K-major: a wave's loads cover whole swizzle periods of rows (checked in ``geometry``), so load
        # ``i``'s row within the period, and with it the lane's K column, depends on ``i`` alone.
        period = _K_MAJOR_SWIZZLE_ROWS

        def column(at: int, lane: fx.Int32) -> fx.Int32:
            """The lane's K column in a load at row ``at`` of the swizzle period."""
            lane_row = (lane * vec // tile_k + at) % period
            return fx.get_scalar(fx.crd2idx((lane_row, lane * vec % tile_k), layout)) % tile_k

        columns: dict[int, fx.Int32] = {}
        ats: list[int] = []
        plan = []
        for i in range_constexpr(loads):
            pos = ((wave * loads + i) * WAVE_SIZE + lane) * vec  # LDS element this lane's 16 bytes land on
            if const_expr(k_major):
                # The swizzle permutes chunks within a row and is its own inverse: the logical K
                # column stored at ``pos`` is where ``(r, pos % tile_k)`` maps to.
                r = pos // tile_k
                at = i * step // tile_k % period
                ats.append(at)
                if at not in columns:
                    columns[at] = column(at, lane)
                c = columns[at]
            elif const_expr(_kouter_width(rows_tile) == rows_tile):
                c = _kouter_k_of_lds_row(pos // rows_tile, p.elem_bytes)
                r = fx.get_scalar(fx.crd2idx((pos % rows_tile, c), layout)) % rows_tile
            else:
                # Blocks of ``width`` rows, each a whole K tile (``_kouter_width``): only shifts and masks.
                width = _kouter_width(rows_tile)
                first = pos // (width * tile_k) * width  # the block's first row
                c = _kouter_k_of_lds_row(pos // width % tile_k, p.elem_bytes)
                r = fx.get_scalar(fx.crd2idx((pos % width + first, c), layout)) % width + first
            g_row = first_row + r
            g_k = mx.k_of_lds_column(c) if const_expr(p.mx) else c
            offset = g_row * ld + g_k if const_expr(k_major) else g_k * ld + g_row
            offset = offset + (bias - i % share * step)
            offset = (g_row < rows).select(offset, self.oob)
            # Pinned, in bytes (_issue): below 2**31 with the bias (config.MAX_LAUNCH_BYTES).
            plan.append((offset * p.elem_bytes if const_expr(p.pinned) else offset, g_row, g_k))
        based = fx.make_view(fx.get_iter(operand) + fx.Int32(-bias), fx.get_layout(operand))
        view = None
        if const_expr(p.pinned and not k_major):
            view = based
            if const_expr(bias > 0):
                # A K-tail tile's buffer (_k_outer_tile), from the biased start through an empty asm
                # statement: LLVM otherwise added the tile's offset first and took the bias back off every
                # tile (two scalar instructions a tile among the MFMAs).
                start = fx.get_iter(based)
                address = mfma.fence([fx.as_ir_value(fx.ptrtoint(start))], "s", 0)[0]
                view = fx.make_view(fx.inttoptr(start.type, address), fx.get_layout(operand))
        span = fx.get_scalar(fx.cosize(fx.get_layout(operand)))
        records = fx.Int64(span) * p.elem_bytes + bias * p.elem_bytes
        src = fx.rocdl.make_buffer_tensor(based, num_records_bytes=records)
        again = (ats, column) if const_expr(k_major and _a_in_place(p)) else None
        return _Plan(src, view, plan, rows, ld, k_major, wave_base, share, bias, again)

    def _k_outer_tile(self, operand: fx.Tensor, ld: fx.Int32, k_tile: fx.Int32 | int, bias: int) -> fx.Tensor:
        """A K-outer operand's buffer for K tile ``k_tile``: based at the tile's first K row and holding the
        rest of the operand (nothing from K on), so that the buffer's range check masks the K tail.

        ``operand`` starts ``bias`` elements before the operand (:meth:`_plan`; the VGPR offsets are that
        much larger), and the buffer holds them too. The view ``[K, rows]`` with leading stride ``ld``
        spans ``(K - 1) * ld + rows`` elements. Load ``(row r, K column c)`` of the tile sits at ``c * ld
        + r`` past the tile's first K row; ``rows`` and ``r`` are multiples of the 16-byte vector and
        ``rows <= ld``, so its 16 bytes end within the rest, ``(K - k0 - 1) * ld + rows``, exactly when
        ``c < K - k0``; a row past ``rows`` already has the out-of-bounds offset (:meth:`_plan`). The
        base moves, not the scalar offset: the range check is of the VGPR offset (LLVM's AMDGPUUsage,
        "Relaxed Buffer OOB Mode"). Past K the buffer is empty, based at the operand's start, so every
        load returns zeros and the base stays in range. A handful of scalar instructions a tile replace
        each load's K-tail compare and select.
        """
        p = self.p
        inside = k_tile < self.k_tiles
        skip = k_tile * (ld * p.tile_k)  # elements; inside the view where the tile is (past K: unused)
        span = fx.get_scalar(fx.cosize(fx.get_layout(operand)))
        first = inside.select(skip, 0)
        # At most 2**31 - 1 bytes and the bias: as an int32 it may wrap, and the descriptor's 32-bit
        # field takes the bits as they are.
        left = inside.select((span - skip + bias) * p.elem_bytes, 0)
        tile = fx.make_view(fx.get_iter(operand) + fx.Uint64(fx.Uint32(first)), fx.get_layout(operand))
        return fx.rocdl.make_buffer_tensor(tile, num_records_bytes=fx.Uint32(left))

    def _here(self, k_tile: fx.Int32 | int, values: list) -> list:
        """``values`` of K tile ``k_tile`` (the wave's LDS base, the tile's scalar offset, with a K tail the
        tile itself), for the work done where the hand-over issues the tile: in MXFP8's loop of four tiles
        they pass through one empty asm statement, which stays in order among the MFMAs' asm, so LLVM
        cannot compute that work ahead and hold it in registers. Otherwise it made all four tiles' K-outer
        buffers at the loop's top (NT's scalar registers spilled), moved a K-major tile's K-tail selects
        into the MFMAs before the hand-over (with rhs's refill early, MXFP8 NN's fused epilogues spilled
        VGPRs), and held every M0 value in a scalar register of its own (NN's fused dgelu_bgrad spilled 2
        SGPRs); now each is one ``s_add`` where its DMAs go. The scalar offset, a multiple of the tile,
        comes in made: made from the fenced tile it took a multiply and a shift a tile, where LLVM's
        induction variable takes an add."""
        if const_expr(self._in_loop(k_tile)):
            values = [fx.Int32(v) for v in mfma.fence([fx.as_ir_value(fx.Int32(v)) for v in values], "s", 0)]
        return values

    def _in_loop(self, k_tile: fx.Int32 | int) -> bool:
        """Whether ``k_tile``'s transfers go through :meth:`_here`: MXFP8's, in its runtime K loop."""
        return self.p.mx and not isinstance(k_tile, int)

    def _issuers(self, lds_stage: fx.Pointer, plan: _Plan, k_tile: fx.Int32 | int, whole: bool) -> Transfers:
        """Issuers of one operand's DMA transfers of K tile ``k_tile`` into ``lds_stage`` (:meth:`_plan`);
        ``whole``: the tile lies wholly inside K (:meth:`stage`).

        A pinned K-major transfer's K-tail select (:func:`_k_tail_select`) goes out with an earlier
        transfer, ahead of it: LLVM takes an asm statement's result for one whose reader needs a wait
        state and counts no asm (the MFMAs) as one, so it put an ``s_nop`` between each select and its
        transfer (18 a bf16 TN iteration); the transfer between is one. A run's first transfer has its
        M0 write and LLVM's own select (:meth:`_offset`), and the next select goes out a transfer
        earlier: each gap between two MFMAs holds a transfer and one asm select or a run's M0 and
        select (the tile's first both)."""
        src, view, loads, rows, ld, k_major, wave_base, share, bias, again = plan
        p = self.p
        made: list[tuple] = []
        k_outer = p.pinned and not k_major and not whole
        ahead = p.pinned and k_major and not whole
        offsets: dict[int, fx.Int32] = {}

        def prepare() -> None:
            """Make the tile's source buffer (K-outer with a K tail: :meth:`_k_outer_tile`), first K, scalar
            offset (pinned: the tile's first byte in ``src``, where the buffer does not start there) and the
            wave's LDS base (:meth:`_here`), once."""
            if not made:
                first = k_tile * (p.tile_k * p.elem_bytes)
                if const_expr(k_outer):
                    first = 0
                elif const_expr(p.pinned and not k_major):
                    first = k_tile * (ld * (p.tile_k * p.elem_bytes))  # inside the launch's span: an int32
                # A whole tile's K is in its scalar offset alone: only a K tail's masks need the tile.
                base, first, *tail = self._here(k_tile, [wave_base, first] + ([] if whole else [k_tile]))
                here = tail[0] if tail else k_tile
                buffer = self._k_outer_tile(view, ld, here, bias) if const_expr(k_outer) else src
                columns = {}
                if const_expr(again is not None and ahead):
                    ats, column = again
                    lane = _lane_again()
                    columns = {at: column(at, lane) for at in dict.fromkeys(ats)}
                made.append((buffer, here * p.tile_k, first, base, columns))

        def tile() -> tuple:
            """The tile's (source buffer, first K, scalar offset, wave's LDS base, K columns made again by
            K-tail column, ``_Plan.column``), made by its first transfer unless prepared."""
            prepare()
            return made[0]

        def load(i: int) -> tuple:
            """Transfer ``i``'s (offset at K tile 0, global row, K column), the column made again if so planned."""
            columns = tile()[4]
            return (*loads[i][:2], columns[again[0][i]]) if const_expr(bool(columns)) else loads[i]

        def issue(i: int) -> None:
            buffer, k0, first, base, _ = tile()
            if const_expr(i in offsets):
                offset = offsets.pop(i)
            else:
                offset = self._offset(k0, rows, ld, k_major, whole, i % share == 0, *load(i))
            later = i + 1 if (i + 1) % share else i + 2  # the next transfer whose select goes ahead
            if const_expr(ahead and later < len(loads) and later not in offsets):
                offsets[later] = self._offset(k0, rows, ld, k_major, whole, False, *load(later))
            self._issue(lds_stage, buffer, first, base, i, share, offset)

        shared = k_outer or self._in_loop(k_tile)
        return Transfers([functools.partial(issue, i) for i in range(len(loads))], [prepare] if shared else [])

    def _offset(self, k0, rows, ld, k_major: bool, whole: bool, first: bool, base, g_row, g_k) -> fx.Int32:
        """The lane's offset of a transfer of the K tile at ``k0`` (``base``, ``g_row``, ``g_k``: its entry
        of :meth:`_plan`; ``whole``: the tile lies inside K; ``first``: the first of its run), in the units
        of :meth:`_issue`'s source: bytes where pinned, else elements."""
        p = self.p
        if const_expr(p.pinned and (whole or not k_major)):
            # Nothing to mask (whole), or the tile's buffer holds its offset and K tail (_k_outer_tile).
            return base
        if const_expr(p.pinned):
            # Only the K tail is per tile (the tile's offset is the scalar one). A run's first select is
            # LLVM's: it fills the wait state between the run's M0 write and its transfer (checkReadM0Hazards).
            inside = g_k < self.k - k0
            if const_expr(first):
                return inside.select(base, self.oob * p.elem_bytes)
            return _k_tail_select(inside, base, self.oob * p.elem_bytes)
        # LLVM's own MFMAs (fp32) keep their accumulators in place only with the whole offset in the VGPR,
        # computed per tile (the scalar form moved 22 of fp32 NT's between registers).
        g_k = k0 + g_k
        offset = g_row * ld + g_k if const_expr(k_major) else g_k * ld + g_row
        return ((g_row < rows) & (g_k < self.k)).select(offset, self.oob)

    def _issue(self, lds_stage, src, first, wave_base, i: int, share: int, offset: fx.Int32) -> None:
        """One lane's transfer ``i`` of a K tile, from buffer ``src`` at scalar offset ``first`` (pinned:
        bytes, :meth:`_issuers`) and ``offset`` (:meth:`_offset`).

        Transfer ``i`` is ``i % share`` KiB past the first of its run of ``share`` (:meth:`_plan`), which
        gives the M0 of them all; the immediate offset moves the LDS address and the global one alike
        (LLVM's AMDGPU DMA docs: the offset is "applied to both global and LDS address"; the emulator,
        ops_mem.py), so the lane's offset takes it back off the global one. That can reach below the
        operand's start (small K), so the buffer begins the run's reach before it (``bias``, :meth:`_plan`)
        and every offset is that much larger: the VGPR offset stays non-negative and its range check
        (VGPR offset plus immediate) sees the same address as before. One M0 a run instead of one a DMA."""
        p = self.p
        past = i % share
        src, dst = fx.get_iter(src), lds_stage + (wave_base + (i - past) * self.step)
        atom = self.dma
        if const_expr(p.pinned):
            # The tile's offset in the scalar offset; bytes, like the VGPR one (FlyDSL scales neither of u8).
            src, dst = fx.recast_iter(fx.Uint8, src), fx.recast_iter(fx.Uint8, dst)
            atom = fx.atom_set_value(atom, "soffset", first)
        atom = fx.atom_set_value(atom, "imm_offset", past * WAVE_DMA_BYTES)
        one = fx.make_layout(1, 1)
        fx.copy_atom_call(atom, fx.make_view(src + offset, one), fx.make_view(dst, one))

    def stage(self, stage: fx.Int32 | int, k_tile: fx.Int32 | int, whole: bool = False) -> Transfers:
        """Issuers of both operands' DMA transfers of K tile ``k_tile`` into LDS stage ``stage``. ``whole``
        (pinned: the caller knows the tile lies wholly inside K, ``(k_tile + 1) * tile_k <= K``): no K
        tail to mask, so a K-major transfer has no select and a K-outer operand no buffer of the tile's
        own, its tile's first K row in the scalar offset of the whole operand's buffer instead.

        The scalar offset in a buffer's range check or not (AMD documents no raw buffer's check in a
        way we can test here), a whole tile's loads are the same: a lane's in-range bytes lie inside the
        operand, and an out-of-bounds one's VGPR offset (2**31) with or without the scalar offset is past
        the records and short of wrapping (config.MAX_LAUNCH_BYTES)."""
        a = self._issuers(self.lds.a_stage(stage), self.a, k_tile, whole)
        b = self._issuers(self.lds.b_stage(stage), self.b, k_tile, whole)
        return Transfers(a + b, a.prepare + b.prepare, (a, b))

    def issue(self, stage: int, k_tile: int) -> None:
        """Issue K tile ``k_tile``'s transfers into LDS stage ``stage`` now."""
        for issue in self.stage(stage, k_tile):
            issue()


def _k_tail_select(inside: fx.Boolean, offset: fx.Int32, oob: int) -> fx.Int32:
    """``inside ? offset : oob``, one ``v_cndmask_b32`` in an asm statement of its own where the transfer
    goes out. A select LLVM schedules by itself went out four at a time, one gap between two MFMAs
    holding a run's four (:meth:`_Fill._issue`) and its M0 (llvm-mca: TN 1.008x -> 1.033x the XDL
    floor); the asm stays in order among the MFMAs' asm, so each goes with its transfer. The lane mask
    (the compare, shared by a tile's transfers of one K column) is the ballot LLVM folds into ``v_cmp``."""
    i32 = fx.Int32.ir_type
    mask = rocdl.ballot(ir.IntegerType.get_signless(WAVE_SIZE), inside)
    values = [fx.as_ir_value(fx.Int32(oob)), fx.as_ir_value(fx.Int32(offset)), mask]
    return fx.Int32(llvm.inline_asm(i32, values, "v_cndmask_b32 $0, $1, $2, $3", "=v,v,v,s", has_side_effects=True))


def _lane_again() -> fx.Int32:
    """The lane's index in its wave, made where it is used (``_a_in_place``): ``v_mbcnt`` of all lanes below
    it, in an asm statement that LLVM neither merges with the kernel's thread index nor moves."""
    text = "v_mbcnt_lo_u32_b32 $0, -1, 0\nv_mbcnt_hi_u32_b32 $0, -1, $0"
    return fx.Int32(llvm.inline_asm(fx.Int32.ir_type, [], text, "=v", has_side_effects=True))


def _thread_again(wave_first: fx.Int32, threads: int) -> fx.Int32:
    """The thread's index made again after the K loop (``_a_in_place``): its wave's first thread
    (``wave_first``, uniform, in a scalar register) plus :func:`_lane_again`. The mask changes no value
    (``threads`` is a power of two); it tells LLVM the index is small and not negative, without which the
    epilogue's divisions by the tile's shape took signed 16-bit arithmetic."""
    return (wave_first + _lane_again()) & (threads - 1)


def _sync() -> None:
    """Publish the DMA'd tile to every wave, and prove every wave has finished reading the stage the next
    fill overwrites (fp32's loop, and the first tile of the others)."""
    rocdl.s_waitcnt(vmcnt=0)
    rocdl.s_barrier()


def _release() -> None:
    """Prove every wave has finished reading the tile being multiplied (its own reads first: the barrier
    does not wait for them), so the refill of its stage may go out (the hand-over, :class:`_Mma`)."""
    rocdl.s_waitcnt(lgkmcnt=0)
    rocdl.s_barrier()


def _publish(in_flight: int) -> None:
    """Publish the next tile to every wave while the ``in_flight`` transfers issued after it (the refill of
    the tile after it) keep going: ``vmcnt`` counts down in issue order."""
    rocdl.s_waitcnt(vmcnt=in_flight)
    rocdl.s_barrier()


# MFMAs an LDS fragment read issued among them needs to land: about 64 clocks (the LDS latency of the timing
# model, docs/perf-model.md) over the family's shortest MFMA, 4 passes of 4 clocks (kernels/mfma.py).
_LAND_MFMAS = 4


class _Mma:
    """Stage 4, the tile's MFMAs: the accumulators (zeroed once, in place for the whole K loop), the
    fragments read from LDS, and :meth:`multiply`, one K tile.

    The MMA computes the tile transposed: its A operand is rhs (output columns), its B operand lhs
    (output rows), so each lane's 4 accumulators of one MFMA are 4 adjacent output columns.

    The hand-over inside the loop (every pinned config; LLVM's own MFMAs, fp32, sync at the loop's top
    instead: ``gemm_kernel``), in tile t's last K chunk: as soon as every wave is done reading tile t
    (with two K chunks, bf16 / fp16: the chunk's start, its fragments were read during chunk 0; with one,
    FP8 and MXFP8: the start of B repetition ``b_reps - b_ahead``, B's reads running ``b_ahead``
    repetitions ahead) the release barrier and at once the DMA of tile t + 2 into tile t's stage; then
    the publish (tile t + 1 has landed, tile t + 2 still in flight) and tile t + 1's first fragments
    (:meth:`first_reads`), which then have the rest of the tile to land. The refill goes out
    before the wait for the tile before it, so the memory stream never drains: waiting for tile t + 1 first
    left the port idle a whole memory latency every tile (docs/kernels.md, "Why PR 676's bf16 is predicted
    faster"). bgrad's row sums read the tile among its first MFMAs, before the release (:meth:`multiply`).
    """

    def __init__(
        self,
        p: GemmParams,
        tiled_mma: fx.TiledMma,
        tid: fx.Int32,
        lds: _Lds,
        o_buf: fx.Tensor,
        elem_a: type,
        elem_b: type,
    ) -> None:
        self.p = p
        self.lds = lds
        self.tiled_mma = tiled_mma
        self.k_chunks = p.tile_k // p.mma_k
        self.tid, self.elem_a = tid, elem_a  # bgrad's row sums (rowsum.Tile)
        self.thr_mma = tiled_mma.thr_slice(tid)
        self.s2r_rhs = _s2r_atom(p, elem_b, p.rhs_k_major)
        self.s2r_lhs = _s2r_atom(p, elem_a, p.lhs_k_major)
        self.thr_copy_rhs = fx.make_tiled_copy_A(self.s2r_rhs, tiled_mma).get_slice(tid)
        self.thr_copy_lhs = fx.make_tiled_copy_B(self.s2r_lhs, tiled_mma).get_slice(tid)
        self.frag_rhs = self.thr_mma.make_fragment_A(fx.make_view(lds.b, lds.b_layout))
        self.frag_lhs = self.thr_mma.make_fragment_B(fx.make_view(lds.a, lds.a_layout))
        # With B rotating (``_rotates_b``: one K chunk, FP8 and MXFP8; or each of the 384 x 256 tile's two)
        # B fragment j + b_ahead is read at B repetition j's start, and the hand-over starts b_ahead
        # repetitions before the tile's end. Two ahead gives the next tile's first
        # reads, issued after the publish, a whole repetition (8 MFMAs) to land; one ahead left them the
        # last 3 MFMAs, and each tile's first MFMA waited about 200 clocks for them (docs/kernels.md). With A
        # read in place (``_a_in_place``) the next tile's A fragments have their own slots, 6 MFMAs and more
        # before their first use, and one ahead is what fits: two ahead, 8 VGPRs more, spilled 31 registers.
        b_reps = fx.size(self.frag_lhs.shape[1]).get_static_leaf_int
        self.rotate_b = _rotates_b(p)
        self.vgpr_acc, self.a_in_place = _vgpr_acc(p), _a_in_place(p)
        self.b_ahead = 2 if self.rotate_b and b_reps > 2 and not self.a_in_place else 1
        out_tile = fx.make_view(fx.get_iter(o_buf), fx.make_layout((p.tile_n, p.tile_m), (1, p.tile_n)))
        self.acc = self.thr_mma.make_fragment_C(out_tile)
        self.frag_rhs_copy = self.thr_copy_rhs.retile(self.frag_rhs)
        self.frag_lhs_copy = self.thr_copy_lhs.retile(self.frag_lhs)

    def zero(self) -> None:
        """Zero the accumulators, once per tile: 256 ``v_accvgpr_write``s a wave (256 x 256), so the kernel
        calls it after its first DMA has gone out, where they hide in the wait for tile 0."""
        self.acc.fill(0.0)
        if const_expr(self.p.pinned):
            # The zeros are VALU writes the first MFMAs read: the wait states between them (kernels/mfma.py).
            mfma.fence_accumulators(self.acc, mfma.OPERAND_WAIT_STATES)

    def _sources(self, stage: fx.Int32 | int) -> tuple:
        """This thread's (rhs, lhs) fragment sources in LDS stage ``stage``."""
        lds = self.lds
        src_rhs = self.thr_copy_rhs.partition_S(fx.make_view(lds.b_stage(stage), lds.b_layout))
        src_lhs = self.thr_copy_lhs.partition_S(fx.make_view(lds.a_stage(stage), lds.a_layout))
        return src_rhs, src_lhs

    def reads(self, stage: fx.Int32 | int, kc: int) -> tuple[list, list]:
        """Issuers of chunk ``kc``'s fragment reads from LDS stage ``stage``, one per repetition:
        (MMA A = rhs, MMA B = lhs)."""
        p = self.p
        src_rhs, src_lhs = self._sources(stage)
        # _rep_sources' in_row: K-outer, one LDS row holding all the tile's rows
        rhs_row, lhs_row = (
            not k and _kouter_width(rows) == rows for k, rows in ((p.rhs_k_major, p.tile_n), (p.lhs_k_major, p.tile_m))
        )
        return tuple(
            [
                functools.partial(fx.copy, s2r, rs, dst[None, r, kc])
                for r, rs in enumerate(_rep_sources(src, kc, fx.size(frag.shape[1]).get_static_leaf_int, in_row))
            ]
            for s2r, src, dst, frag, in_row in (
                (self.s2r_rhs, src_rhs, self.frag_rhs_copy, self.frag_rhs, rhs_row),
                (self.s2r_lhs, src_lhs, self.frag_lhs_copy, self.frag_lhs, lhs_row),
            )
        )

    def first_reads(self, stage: fx.Int32 | int) -> list[Callable[[], None]]:
        """Issuers of the fragments a tile's first MFMAs need from LDS stage ``stage``: chunk 0's, both
        operands; with B rotating A's and B's first ``b_ahead`` repetitions (its other B repetitions are
        read during the MFMAs, ``b_ahead`` ahead)."""
        a_reads, b_reads = self.reads(stage, 0)
        return a_reads + (b_reads[: self.b_ahead] if self.rotate_b else b_reads)

    def issue_first_reads(self, stage: fx.Int32 | int) -> None:
        """Issue :meth:`first_reads` of LDS stage ``stage`` now."""
        for issue in self.first_reads(stage):
            issue()

    def multiply(
        self,
        stage: fx.Int32,
        words: tuple | None = None,
        fills: Transfers | tuple = (),
        next_stage=None,
        byte: int = 0,
        epilogue: Sequence[Callable[[int], list]] = (),
        dmas: Sequence[Callable[[], None]] = (),
        reads: tuple[list[Callable[[], None]], list[Callable[[], None]]] | tuple = (),
        sums: fx.Vector | None = None,
    ) -> fx.Vector | None:
        """One K tile from LDS stage ``stage``. Unpinned (fp32), ``fills`` (the DMA issuers of the next
        tile) go out first, before the tile's fragment reads; pinned, they are tile t + 2's, issued with the
        hand-over of ``next_stage`` (None for the last tile), and the tile's first fragments are already
        read (by the tile before's hand-over, or the prologue). MXFP8 passes its (rhs, lhs) scale ``words``
        and the ``byte`` of them that scales this tile. ``epilogue`` (the last tile: the groups' issuers,
        ``epilogue.store_groups``) stores each group as its MFMAs finish: group g's head with the first
        MFMA of group g + 1, its blocks one an MFMA after it (B rotating: row groups, B repetition by B
        repetition; otherwise column groups, the last chunk A repetition by A repetition). MXFP8's next scale
        words: ``dmas`` (into LDS, ``mx.word_dmas``) go out one an MFMA before the early release, older
        than the whole refill, so the publish's ``vmcnt`` waits for them too and its count stays the
        refill's; ``reads`` (into registers, ``mx.word_reads``), in a tile after that publish, each where
        the word it replaces is dead (:meth:`_in_place`). bgrad passes its row ``sums`` (pinned only) and gets
        them back with this tile's added: the tile's LDS reads of them (``rowsum.Tile``) among the first
        half of chunk 0's MFMAs, their adds over the rest, so all are read before the hand-over's release
        lets the refill overwrite the stage."""
        p, k_chunks = self.p, self.k_chunks
        if const_expr(not p.pinned):
            # LLVM's own MFMA selection (fp32: KernelConfig.agpr_accumulators): its scheduler
            # interleaves the reads and the DMA with the MFMAs itself.
            for issue in fills:
                issue()
            src_rhs, src_lhs = self._sources(stage)
            for kc in range_constexpr(k_chunks):
                fx.copy(self.s2r_lhs, src_lhs[None, None, kc], self.frag_lhs_copy[None, None, kc])
                fx.copy(self.s2r_rhs, src_rhs[None, None, kc], self.frag_rhs_copy[None, None, kc])
                a, b = self.frag_rhs[None, None, kc], self.frag_lhs[None, None, kc]
                fx.gemm(self.tiled_mma, self.acc, a, b, self.acc)
            return sums

        # The MFMAs run B-repetition by B-repetition (kernels/mfma.py), and what they read is issued
        # among them: with several K chunks, chunk kc + 1's fragments during chunk kc; with B rotating, each
        # B fragment b_ahead repetitions before its own (so A's and b_ahead + 1 of B's are live), and
        # during chunk kc only chunk kc + 1's A and first b_ahead B fragments.
        rot = self.rotate_b
        reads_of = [self.reads(stage, kc) for kc in range(k_chunks)]  # (A, B) issuers by chunk
        b_reps = fx.size(self.frag_lhs.shape[1]).get_static_leaf_int
        a_reps = fx.size(self.frag_rhs.shape[1]).get_static_leaf_int
        tile_sums = None
        if const_expr(p.epi_rowsum):
            if const_expr(k_chunks == 1):
                raise ValueError(f"{p.name}: bgrad's row sums are read in a tile's first K chunk, before its last")
            tile_sums = rowsum.Tile(p, sums, self.lds.a_stage(stage), self.lds.a_layout, self.elem_a, self.tid)
        # The last tile's last-chunk B fragments are all read at that chunk's start (none is read for a next
        # tile), and their operands taken at once: held as fragments across the epilogue's beta branches,
        # 8-bit ones went to one register a byte, put back together by VALU before each MFMA.
        taken = {} if const_expr(bool(epilogue) and rot) else None
        hand_over, early, a_first, publish_head = [], [], [], []
        if const_expr(next_stage is not None):
            if const_expr(bool(fills) and rot):
                # B rotating: the last chunk's A (rhs) fragments were all read before it started, so
                # its rhs stage is released early, once the first B repetition is under way, and rhs's refill
                # goes out then; only lhs's waits for the hand-over. Both at the hand-over, tile t + 2's DMA
                # had a tile's time to cross the port behind tile t + 1's: FP8 TN took 2322 clocks a tile at
                # 32 B/clock in the replay, PR 676 2104 (docs/kernels.md). Each operand's shared scalar work
                # (Transfers) goes first, an issuer of its own. The publish's count is unchanged: both
                # operands of tile t + 2 are issued after tile t + 1's.
                lhs, rhs = fills.parts
                early = [_release, *rhs.prepare, *rhs]
                hand_over = [*lhs.prepare, _release, *lhs]
            elif const_expr(bool(fills)):
                # Two chunks: the hand-over spreads over a whole chunk and the first transfer does the shared
                # scalar work (bf16 NN as an issuer of its own: 1.017 -> 1.020 the floor).
                hand_over = [_release, *fills]
            # The peel refills nothing: no release either.
            first = self.first_reads(next_stage)
            if const_expr(self.a_in_place):
                # A in place (``_a_in_place``): the publish goes before lhs's refill (its count: rhs's refill,
                # issued early), at the hand-over's head, so the next tile's A fragments can be read in the
                # last B repetition, each after the last MFMA that reads the one it replaces (``a_first``,
                # placed in the last chunk below); its first B fragment goes among the refill.
                a_first, first = first[:a_reps], first[a_reps:]
                refill = list(lhs) if fills else []
                publish_head = hand_over[: len(hand_over) - len(refill)]
                publish_head.append(functools.partial(_publish, len(fills) - len(refill)))
                hand_over = [*publish_head, *self._interleave(refill, first)]
            else:
                hand_over += [functools.partial(_publish, len(fills)), *first]
        # Where the hand-over starts in the last K chunk. With a refill: as soon as this tile's stage is
        # read (two chunks: the chunk's start; B rotating: B repetition b_reps - b_ahead). The peel has none to
        # hurry, and its publish waits for the last tile to land: as late as leaves the last tile's first
        # reads, one an MFMA after it, _LAND_MFMAS MFMAs to land (the publish at the chunk's start left
        # its whole last chunk behind that wait, 270 clocks a tile at 22 B/clock).
        if const_expr(fills or next_stage is None):
            at = (b_reps - self.b_ahead) * a_reps if rot else 0
        else:
            at = max(0, a_reps * b_reps - len(hand_over) - _LAND_MFMAS)
        # A in place: the next tile's A fragment i right after MFMA last_rep + i, the last that reads the one
        # it replaces, with one MFMA between (as MXFP8's words: :meth:`_in_place`); the last two go after the
        # tile. The publish, one gap a head issuer from ``at``, must come first.
        last_rep = (b_reps - 1) * a_reps
        if const_expr(bool(a_first)):
            at = min(at, last_rep + 2 - len(publish_head))
        # The epilogue's groups (the last tile): group g's head (its loads and fence) with the first MFMA of
        # group g + 1, then its blocks one an MFMA, so the VALU work of the stores fills the MFMAs' shadow
        # (a whole group at once left the XDL idle while it issued, and the next group's MFMAs back to
        # back: slower than after the loop wherever a CU's bandwidth share exceeds 24 B/clock).
        per_group = a_reps if rot else b_reps
        pending: dict[int, list] = {}
        epilogue_at = []
        for g in range(len(epilogue) - 1):
            first = (g + 1) * per_group
            epilogue_at.append((first, [functools.partial(self._group, pending, taken, g, epilogue[g])]))
            parts = [functools.partial(self._part, pending, g, t, per_group) for t in range(per_group)]
            epilogue_at += [(first + t, [part]) for t, part in enumerate(parts)]
        # bgrad's row sums (two K chunks): read in chunk 0, before the last chunk's release, and added over
        # the rest of the tile. Each chunk's own issuers (the next chunk's fragment reads; the hand-over) and
        # the sums' go out as one list, spread one a gap: spread on their own, two lists put two issuers in
        # some gaps and none in others (bf16 1.09 -> x the floor). The adds are split so both chunks hold
        # about as many. A hand-over that starts late in the chunk (the peel's: ``at``) keeps its place,
        # and the sums spread over the whole chunk beside it.
        sums_at: list[list[Callable[[], None]]] = [[] for _ in range(k_chunks)]
        # A hand-over longer than the last chunk has gaps (128 x 128: the release, 8 transfers, the publish
        # and 8 first reads in 16) starts in the chunk before, once that chunk's reads of the last one
        # have gone out, one a gap from its start, and had _LAND_MFMAS MFMAs to land: the release's wait
        # holds no MFMA back, and no gap of the last chunk gets two issuers.
        total = a_reps * b_reps
        head = []
        if const_expr(not rot and bool(fills) and tile_sums is None and len(hand_over) >= total):
            head, hand_over = hand_over[: len(hand_over) - total + 1], hand_over[len(hand_over) - total + 1 :]
        merged = hand_over if at == 0 else []  # the hand-over the last chunk's sums go out with
        if const_expr(tile_sums is not None):
            reads_0, adds = tile_sums.reads, tile_sums.adds
            first = (len(merged) + len(adds) - a_reps - b_reps - len(reads_0)) // 2
            first = min(max(first, 0), len(adds))
            sums_at = [reads_0 + adds[:first], adds[first:]]
        for kc in range_constexpr(k_chunks):
            later = []
            if const_expr(kc + 1 < k_chunks):
                a_next, b_next = reads_of[kc + 1]
                later = a_next + (b_next[: self.b_ahead] if rot else b_next)
                later = self._interleave(later, sums_at[kc])
            # B rotating with two chunks (384 x 256): the next chunk's reads half a repetition after this
            # chunk's B reads, so no gap gets two issuers (with both K-outer, 4 ``ds_read_b64_tr_b16``).
            upcoming = [(0, reads_of[kc][1][self.b_ahead :]), (a_reps // 2, later)] if rot else [(0, later)]
            if const_expr(bool(head) and kc == k_chunks - 2):
                start = total - len(head)
                if const_expr(start < len(later) + _LAND_MFMAS):
                    raise ValueError(f"{p.name}: the hand-over's head does not fit after the chunk's reads")
                upcoming = [(0, later, len(later) + 1), (start, head, total + 1)]
            a_outer = const_expr(bool(epilogue) and not rot and kc == k_chunks - 1)
            if const_expr(bool(epilogue) and rot and kc == k_chunks - 1):
                for j in range(b_reps):
                    if const_expr(j >= self.b_ahead):
                        reads_of[kc][1][j]()
                    taken[j] = mfma.operand(self.frag_lhs[None, j, kc], p.lhs_elem)
            if const_expr(bool(epilogue) and ((rot and kc == k_chunks - 1) or a_outer)):
                # B rotating: row groups, the last chunk's B fragments read at its start (above). Two chunks
                # otherwise: the last one runs column group by column group (A repetition outer; its
                # fragments were all read during chunk 0).
                upcoming = [*epilogue_at, (0, sums_at[kc])]
            elif const_expr(kc == k_chunks - 1):
                # With one K chunk the tile's own B reads run to the start of repetition b_reps - 1 -
                # b_ahead: the hand-over, which lets the next DMA overwrite this stage, starts one after.
                # MXFP8's word DMAs: one a gap from the tile's first MFMA, all before the early release.
                if const_expr(bool(merged)):
                    hand_over = self._interleave(hand_over, sums_at[kc])
                else:
                    upcoming.append((0, sums_at[kc]))
                placed = [(at, hand_over)]
                if const_expr(bool(a_first)):
                    head = len(publish_head)
                    placed = [(at, publish_head, at + head), (at + head, hand_over[head:])]
                    placed += [(last_rep + i + 2, [issue], last_rep + i + 3) for i, issue in enumerate(a_first)]
                upcoming += [(0, dmas, len(dmas) + 1), (a_reps, early, at), *placed, *self._in_place(reads)]
            mfma.gemm(
                self.acc,
                self.frag_rhs[None, None, kc],
                self.frag_lhs[None, None, kc],
                p.rhs_elem,
                p.lhs_elem,
                p.mx,
                words,
                upcoming,
                byte,
                a_outer,
                taken if kc == k_chunks - 1 else None,
                p.mx and not p.rhs_k_major,  # A (rhs) from transposing 8-bit reads: VALU-assembled
            )
        if const_expr(bool(epilogue)):
            last = len(epilogue) - 1
            self._group(pending, taken, last, epilogue[last])
            self._part(pending, last, 0, 1)
        return sums if tile_sums is None else tile_sums.sums

    @staticmethod
    def _interleave(a: list, b: list) -> list:
        """``a`` and ``b`` as one list, each in its order, evenly mixed (``b`` empty: ``a``)."""
        out, i, j = [], 0, 0
        while i < len(a) or j < len(b):
            if j == len(b) or (i < len(a) and i * len(b) <= j * len(a)):
                out.append(a[i])
                i += 1
            else:
                out.append(b[j])
                j += 1
        return out

    @staticmethod
    def _in_place(reads: tuple) -> list[tuple[int, list[Callable[[], None]], int]]:
        """Where MXFP8's next words are read (``reads``: the (A, B) operands' issuers by repetition, in the
        group's last tile): each with one MFMA between it and the last MFMA that reads the word it
        replaces (B word j: B repetition j's last; A word i: the last repetition's i-th; the last two after
        the tile's last MFMA), so the two never live at once and the loop carries the new word in the old
        one's register. Read while the old ones were live, LLVM gave the new ones registers of their own
        and copied them back for the next group with VALU moves, one of which an MFMA read a wait state
        too early (2 needed; LLVM does not see an asm MFMA's operands)."""
        if not reads:
            return []
        a_reads, b_reads = reads
        a_reps, b_reps = len(a_reads), len(b_reads)
        last_rep = (b_reps - 1) * a_reps  # the MFMAs run B repetition by B repetition: A word i is last read
        spots = [((j + 1) * a_reps + 1, issue) for j, issue in enumerate(b_reads)]
        spots += [(last_rep + i + 2, issue) for i, issue in enumerate(a_reads)]  # at MFMA last_rep + i
        return [(at, [issue], at + 1) for at, issue in spots]

    @staticmethod
    def _group(pending: dict, taken: dict | None, g: int, head: Callable[[int], list]) -> None:
        """Group ``g``'s head (``epilogue.store_groups``), its block issuers kept in ``pending``. Before the
        first, the B operands the MFMAs still need pass through an empty asm: they cross the epilogue's
        beta branches as the MFMA's 32-bit words (``_Mma.multiply``)."""
        if const_expr(taken is not None and g == 0):
            live = [r for r in sorted(taken) if r > 0]
            taken.update(zip(live, mfma.fence([taken[r] for r in live], "v", 0), strict=True))
        pending[g] = head(mfma.RESULT_WAIT_STATES)

    @staticmethod
    def _part(pending: dict, g: int, t: int, slots: int) -> None:
        """Group ``g``'s block ``t`` out of ``pending``; the last of ``slots`` also every one after it."""
        for issue in pending[g][t : None if t == slots - 1 else t + 1]:
            issue()

    def scale_words(
        self, lhs_scale: fx.Tensor, rhs_scale: fx.Tensor, wg: _Workgroup, m: fx.Int32, n: fx.Int32, groups: fx.Int32
    ) -> tuple[mx.ScaleWords, mx.ScaleWords]:
        """MXFP8's (rhs, lhs) scale words (kernels/mx.py), in MMA operand order (A = rhs, B = lhs): the rows
        each of this lane's repetitions scales, shared with the waves of its wave-grid column (rhs) or row
        (lhs) (wave ``w`` owns row block ``w // n_waves`` and column block ``w % n_waves``,
        :func:`make_tiled_mma`). ``groups``: the K groups, 0 for K = 0 (``mx.ScaleWords``)."""
        p = self.p
        wave = fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, fx.Int32(wg.tid // WAVE_SIZE)))
        row_block, col_block = wave // p.n_waves, wave % p.n_waves
        rhs_reps = p.tile_n // (p.n_waves * 16)
        lhs_reps = p.tile_m // (p.m_waves * 16)
        rows_rhs = self.thr_mma.partition_A(fx.make_view(0, fx.make_layout((p.tile_n, p.tile_k), (1, 0))))
        rows_lhs = self.thr_mma.partition_B(fx.make_view(0, fx.make_layout((p.tile_m, p.tile_k), (1, 0))))
        rhs = mx.rep_row_tiles(rows_rhs, rhs_reps)
        lhs = mx.rep_row_tiles(rows_lhs, lhs_reps)
        sw_rhs = mx.ScaleWords(rhs_scale, wg.col0, n, p.tile_n, rhs, col_block, row_block, p.m_waves, groups)
        sw_lhs = mx.ScaleWords(lhs_scale, wg.row0, m, p.tile_m, lhs, row_block, col_block, p.n_waves, groups)
        return sw_rhs, sw_lhs


def _scale_invs(p: GemmParams, lhs_scale: fx.Tensor, rhs_scale: fx.Tensor) -> tuple[fx.Float32, fx.Float32] | None:
    """FP8's two per-tensor scale_inv, loaded before tile 0's DMA (None for the other formats: MXFP8's
    block scales are applied by the MFMAs). Loaded after the K loop, as they were, vmcnt's issue order made
    their wait a wait for the DMA issued past K as well: 375 clocks before the first output store. Scalar
    loads (they are uniform): as VGPRs they were held across the K loop, where FP8's 384 x 256 has none to
    spare, and ``gemm_kernel`` takes them where the first two tiles' DMAs are in flight."""
    if const_expr(p.scaled and not p.mx):
        sa = fx.rocdl.make_buffer_tensor(lhs_scale, max_size=False)
        sb = fx.rocdl.make_buffer_tensor(rhs_scale, max_size=False)
        return tuple(rocdl.s_buffer_load(fx.get_iter(t), 0).bitcast(fx.Float32) for t in (sa, sb))
    return None


def _output_scale(alpha: fx.Float32, scale_invs: tuple[fx.Float32, fx.Float32] | None) -> fx.Float32:
    """Stage 6, the accumulators' factor: alpha, times both per-tensor scale_inv for FP8."""
    if const_expr(scale_invs is not None):
        return alpha * scale_invs[0] * scale_invs[1]
    return alpha


def _buffer_now(t: fx.Tensor) -> fx.Tensor:
    """``t`` as a range-checked buffer (``make_buffer_tensor``) whose base and size are read from the kernel
    arguments here, before the K loop.

    The epilogue's buffers are used only after the loop, and LLVM sank their scalar loads there: into the
    peel, whose first MFMA then waited the load's 200 clocks. Base and size pass through an empty asm
    statement (kernels/mfma.py), which must come after the loads and stays before the loop.
    """
    ptr = fx.get_iter(t)
    span = fx.as_ir_value(fx.Int32(fx.get_scalar(fx.cosize(fx.get_layout(t)))))  # elements; < 2**31 bytes
    addr, span = mfma.fence([fx.as_ir_value(fx.ptrtoint(ptr)), span], "s", 0)
    size = fx.Int64(fx.Int32(span) * (t.element_type.width // 8))
    view = fx.make_view(fx.inttoptr(ptr.type, addr), fx.get_layout(t))
    return fx.rocdl.make_buffer_tensor(view, num_records_bytes=size)


def _epilogue_buffers(p: GemmParams, bias: fx.Tensor, aux: fx.Tensor, partials: fx.Tensor) -> tuple:
    """The epilogue's (bias, aux, partials) buffers, None where the config's epilogue reads none (bgrad's
    partials were written where the K loop ends: rowsum.store)."""
    return tuple(
        _buffer_now(t) if used else None
        for t, used in ((bias, p.epi_bias), (aux, p.epi_gelu or p.epi_dgelu), (partials, p.epi_colsum))
    )


@flyc.kernel
def gemm_kernel(
    out: fx.Tensor,
    lhs: fx.Tensor,
    rhs: fx.Tensor,
    lhs_scale: fx.Tensor,
    rhs_scale: fx.Tensor,
    bias: fx.Tensor,
    aux: fx.Tensor,
    partials: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    ld_lhs: fx.Int32,
    ld_rhs: fx.Int32,
    ld_out: fx.Int32,
    alpha: fx.Float32,
    beta: fx.Float32,
    p: GemmParams,
):
    """One workgroup's output tile, in stages: where it works (:func:`_workgroup`), the LDS stages
    (:class:`_Lds`), the DMA fills (:class:`_Fill`), the MFMAs (:class:`_Mma`), the K loop (here: its
    runtime loop and branches must be in the kernel's own body, which FlyDSL rewrites into ``scf``
    control flow; inside them only plain names are called, so no stage object becomes loop state), and
    the epilogue (:func:`_output_scale`, ``epilogue.store_tile``). The kernel calls each stage where its
    instructions belong (the accumulators' zeros after the first DMA: :meth:`_Mma.zero`)."""
    elem_a = getattr(fx, p.lhs_elem)
    elem_b = getattr(fx, p.rhs_elem)
    # Built here, not passed in: a TiledMma argument would carry the MFMA's state as kernel arguments.
    tiled_mma = make_tiled_mma(p)
    wg = _workgroup(p, m, n, k)
    tid, bm, bn, row0, col0, k_tiles, whole_tiles = wg
    lds = _Lds(p, elem_a, elem_b)
    o_buf = _buffer_now(out)
    extras = _epilogue_buffers(p, bias, aux, partials)
    fill = _Fill(p, wg, lds, lhs, rhs, m, n, k, ld_lhs, ld_rhs)
    mma = _Mma(p, tiled_mma, tid, lds, o_buf, elem_a, elem_b)
    wave_first = None  # A in place: the wave's first thread, in a scalar register (``_thread_again``)
    if const_expr(mma.a_in_place):
        wave_first = fx.Int32(rocdl.readfirstlane(fx.Int32.ir_type, fx.Int32(tid // WAVE_SIZE * WAVE_SIZE)))
    # Stage 5, the K loop. Ping-pong, two tiles ahead: tile t + 2 refills tile t's stage once every wave is
    # done reading it (the release), before the wait for tile t + 1 (the publish). Inside the runtime loops
    # and branches only these plain names are called: FlyDSL carries every local whose method is called
    # there as loop state (``fill.stage(...)`` would make ``fill`` an scf iter_arg).
    sync, publish = _sync, _publish
    fill_stage, multiply, a_stage = fill.stage, mma.multiply, lds.a_stage
    scale_invs = _scale_invs(p, lhs_scale, rhs_scale)
    sums = rowsum.start(p)  # bgrad's row sums (kernels/rowsum.py); a local of the kernel body for every config
    if const_expr(p.mx):
        # Groups of four K tiles share one scale word per repetition (kernels/mx.py): tile t's scales are
        # byte t % 4 of its group's words. Every tile hands over inside its MFMAs (_Mma), TN, NN and NT.
        steps = mx.STEPS_PER_WORD
        groups = (k_tiles + steps - 1) // steps
        sws = mma.scale_words(lhs_scale, rhs_scale, wg, m, n, groups)
        words_lds = lds.words
        fill.issue(0, 0)
        for issue in mx.word_dmas(sws, words_lds, 0):
            issue()
        mma.zero()
        sync()
        fill.issue(1, 1)
        first_words, words = mx.word_reads(sws, words_lds)  # a name of its own: not the loop's ``reads``
        for issue in first_words[0] + first_words[1]:
            issue()
        mma.issue_first_reads(0)  # tile 0's first fragments; each tile's hand-over reads the next one's
        # Whole groups, unrolled (_mx_group; a group's words were read out of LDS a tile before the next
        # group's land there, and the releases since have waited for every wave's reads). The groups whose
        # refills lie wholly inside K go first (_Fill.stage's ``whole``: no K tail to mask), then the last
        # group loop's one, if any, whose refills reach the K tail (or past K: zeros).
        grouped = (k_tiles - 1) // steps
        whole_groups = (whole_tiles < 2).select(0, (whole_tiles - 2) // steps)
        whole_groups = (whole_groups < grouped).select(whole_groups, grouped)
        mx_group = _mx_group
        for g in range(0, whole_groups, 1):
            words = mx_group(multiply, fill_stage, sws, words_lds, words, g, True)
        for g in range(whole_groups, grouped, 1):
            words = mx_group(multiply, fill_stage, sws, words_lds, words, g, False)  # past K: 0s
        rest = (k_tiles < 1).select(0, (k_tiles - 1) // steps * steps)  # // floors: K = 0 starts at 0
        # NT (both operands K-outer) keeps its past-K refill: with the peel below it spilled 408 registers.
        peels = p.lhs_k_major or p.rhs_k_major
        for t in range(rest, k_tiles - 2 if peels else k_tiles - 1, 1):
            # The last group but its last tile, one at a time (it crosses no group boundary), but for the
            # peel: the words shift down a byte a tile.
            multiply(t % 2, words, fill_stage(t % 2, t + 2), (t + 1) % 2)
            words = mx.next_byte(words)
        if const_expr(peels) and rest <= k_tiles - 2:
            # The peel, tile k_tiles - 2, refills nothing (no DMA past K) where it shares the last group with
            # the last tile, which then needs no words of its own. Where the last tile starts a group, the
            # group loop's last tile is tile k_tiles - 2 and refills past K (zeros): loading the last
            # tile's words before a peel spilled scalar registers (NN 7, fused 5).
            peel_stage = k_tiles % 2
            multiply(peel_stage, words, (), 1 - peel_stage)
            words = mx.next_byte(words)
    else:
        # LLVM's own MFMAs (fp32) keep the sync at the top of the loop with tile t + 1's DMA right after it;
        # their bgrad's first tile column adds lhs's rows up in LDS after each tile's MFMAs (kernels/rowsum.py;
        # the pinned ones' row sums run among the MFMAs, every tile column: _Mma.multiply).
        fill.issue(0, 0)
        if const_expr(p.pinned):
            # Tile 1's DMA right behind tile 0's, so the port never waits for tile 0 to land; then the
            # zeros, while tile 0 is in flight, and tile 0's chunk-0 reads (bf16 / fp16).
            tile_1 = fill.stage(1, 1)
            for issue in tile_1:
                issue()
            mma.zero()
            if const_expr(scale_invs is not None):
                # Landed here, behind the first two tiles' DMAs and inside their wait: LLVM otherwise sank
                # the scalar loads to their use after the K loop, and the epilogue waited for them.
                scale_invs = tuple(fx.Float32(v) for v in mfma.fence([fx.as_ir_value(v) for v in scale_invs], "s", 0))
            publish(len(tile_1))
            mma.issue_first_reads(0)  # each tile's hand-over reads the next tile's first fragments
        else:
            mma.zero()
        # With the hand-over the loop runs pairs of tiles, unrolled: the stages are constants in each (their
        # bases fold into the fragment reads' and the DMAs' offsets), and each tile's first fragments, read
        # by the tile before, have registers of their own. The loop holds the tiles that refill, 0 ..
        # k_tiles - 3; tile k_tiles - 2 is the peel, below. The pairs refill only tiles wholly inside K
        # (_Fill.stage's ``whole``: no K tail to mask, so no per-tile selects or buffers), and the one or
        # two tiles left after them run alone, the last K tile's refill among them.
        # Without the hand-over (fp32) every tile but the last is looped.
        paired = 0
        looped = k_tiles - 1
        if const_expr(p.pinned):
            looped = k_tiles - 2
            paired = (whole_tiles < 2).select(0, (whole_tiles - 2) & -2)
            for g in range(0, paired, 2):
                # Tiles g + 2 and g + 3 go into tile g's and g + 1's stages.
                sums = multiply(0, None, fill_stage(0, g + 2, True), 1, sums=sums)
                sums = multiply(1, None, fill_stage(1, g + 3, True), 0, sums=sums)
        for t in range(paired, looped, 1):
            if const_expr(p.pinned):
                # Tile t + 2 goes into tile t's stage.
                sums = multiply(t % 2, None, fill_stage(t % 2, t + 2), (t + 1) % 2, sums=sums)
            else:
                sync()
                multiply(t % 2, None, fill_stage((t + 1) % 2, t + 1))
                if const_expr(p.epi_rowsum) and bn == 0:
                    sums = rowsum.add(p, sums, a_stage(t % 2), lds.a_layout, elem_a, tid)
        if const_expr(not p.pinned):
            sync()
        words = None
    if const_expr(p.pinned and not p.mx):
        # The peel: tile k_tiles - 2, which hands over to the last tile and refills nothing, so no DMA goes
        # past K (its zeros cost a whole tile's transfers, 64 KiB a workgroup). With K <= 1 tile (none
        # to peel) it multiplies stage 0, tile 0 or K = 0's all-out-of-bounds zeros, and the last tile
        # the zeros of tile 1's fill, past K: the sum is the same.
        peel = (k_tiles < 2).select(0, k_tiles & 1)
        sums = multiply(peel, None, (), 1 - peel, sums=sums)
        last_stage = 1 - peel
    else:
        # The last tile sits in stage (k_tiles - 1) % 2; K = 0 has none, and multiplies the zeros that the
        # all-out-of-bounds fill of tile 0 left in stage 0, giving beta * out.
        last_stage = ((k_tiles < 1).select(1, k_tiles) + 1) % 2
    # Stage 6, the epilogue. With the hand-over it runs among the last tile's MFMAs, group by group as they
    # finish (``_Mma.multiply``), so the output stream overlaps the tile's compute: column groups of the
    # last chunk with two K chunks (bf16, fp16), row groups (B repetitions) with one (FP8, MXFP8, whose
    # column order would hold all 8 B fragments at once: LLVM then moved 64 accumulators in FP8's loop).
    # fp32 and the one-chunk dgelu_bgrad (its column sums span the row groups) store after the last tile,
    # and so do the other fused epilogues on 384 x 256 (two chunks, B rotating, accumulators past the
    # AGPRs): among the last tile's MFMAs they go by row groups, whose bias (a block for every column
    # group: 32 VGPRs), aux loads and GELU temporaries sat beside the rotating B fragments and the 128
    # VGPR accumulators and spilled 20 - 28 registers; after it, by column groups, they fit. FP8 on 384 x
    # 256 (``_a_in_place``) stores after it too: its row groups would hold all 12 B fragments, 96 VGPRs.
    # bgrad's row sums run among the last tile's MFMAs as among every tile's, and are stored after them.
    scale = _output_scale(alpha, scale_invs)
    thr_mma = tiled_mma.thr_slice(_thread_again(wave_first, p.threads)) if const_expr(mma.a_in_place) else mma.thr_mma
    tile = (p, mma.acc, thr_mma, o_buf, extras, row0, col0, bm, m, n, ld_out, scale, beta)
    fused = p.epi_bias or p.epi_gelu or p.epi_dgelu
    overlap = p.pinned and (mma.k_chunks > 1 or not p.epi_colsum) and not (mma.vgpr_acc and (fused or mma.a_in_place))
    if const_expr(not overlap):
        multiply(last_stage, words)
        if const_expr(p.epi_rowsum) and bn == 0:
            sums = rowsum.add(p, sums, a_stage(last_stage), lds.a_layout, elem_a, tid)
    # beta == 0 never reads D (it may hold NaN or be uninitialised): the plain store has two bodies
    # behind a uniform branch (with the overlap, branches inside each group: epilogue.BETA); the fused
    # epilogues one, whose loads of D sit behind a branch on beta (two bodies spill).
    if const_expr(fused):
        _finish(multiply, overlap, last_stage, words, tile, None)
    elif const_expr(overlap):
        sums = _finish(multiply, overlap, last_stage, words, tile, epilogue.BETA, sums)
    elif beta == 0.0:
        _finish(multiply, overlap, last_stage, words, tile, False)
    else:
        _finish(multiply, overlap, last_stage, words, tile, True)
    if const_expr(p.epi_rowsum):
        ws = fx.rocdl.make_buffer_tensor(partials, max_size=False)
        rowsum.store(p, sums, ws, row0, m, tid, (bn == 0).select(m, 0))  # the first tile column's


def _mx_group(
    multiply: Callable, fill_stage: Callable, sws: tuple, words_lds: fx.Pointer, words: tuple, g: fx.Int32, whole: bool
) -> tuple:
    """MXFP8's loop body, group ``g`` of four K tiles (``gemm_kernel``), each refilling the tile two ahead
    (``whole``: every one of them inside K, ``_Fill.stage``), and the next group's words, which it
    returns: tile j reads byte j of its words (op_sel, no shifts); the next group's words go into LDS
    among tile 2's MFMAs and from there into registers among tile 3's (``mx.word_dmas``,
    ``mx.word_reads``, ``_Mma._in_place``)."""
    steps = mx.STEPS_PER_WORD
    ahead = words
    for j in range_constexpr(steps):
        t = g * steps + j  # t % 2 == j % 2: the stages are constants here
        dmas, reads = (), ()
        if const_expr(j == steps - 2):
            dmas = mx.word_dmas(sws, words_lds, g + 1)
        if const_expr(j == steps - 1):
            reads, ahead = mx.word_reads(sws, words_lds)
        multiply(j % 2, words, fill_stage(j % 2, t + 2, whole), (j + 1) % 2, j, dmas=dmas, reads=reads)
    return ahead


def _finish(
    multiply: Callable,
    overlap: bool,
    stage: fx.Int32,
    words: tuple | None,
    tile: tuple,
    reads_out: bool | str | None,
    sums: fx.Vector | None = None,
) -> fx.Vector | None:
    """The epilogue (``epilogue.store_tile``'s arguments in ``tile``): with ``overlap``, the last tile's
    MFMAs with the groups among them (row groups with B rotating: ``_rotates_b``) and bgrad's ``sums``, returned with
    the tile's added; else after the last tile (multiplied already)."""
    if const_expr(overlap):
        p = tile[0]
        groups = epilogue.store_groups(*tile, reads_out, rows=_rotates_b(p))
        return multiply(stage, words, epilogue=groups, sums=sums)
    epilogue.store_tile(*tile, reads_out)
    return sums


def _rotates_b(p: GemmParams) -> bool:
    """Whether a tile's B fragments are read b_ahead repetitions ahead of their MFMAs, chunk by chunk
    (one K chunk; or accumulators past the AGPRs, whose arch VGPRs leave no room for two chunks' fragments),
    and its epilogue among the last tile's MFMAs runs by row groups (the fused ones on 384 x 256 store
    after it: ``gemm_kernel``)."""
    return p.tile_k == p.mma_k or _vgpr_acc(p)


def _vgpr_acc(p: GemmParams) -> bool:
    """Whether the tile's accumulators pass the AGPRs (384 x 256: 128 of them in arch VGPRs)."""
    a_reps, b_reps = p.tile_n // (p.n_waves * 16), p.tile_m // (p.m_waves * 16)
    return mfma.acc_file(a_reps - 1, b_reps - 1, a_reps) == "v"  # its last block


def _a_in_place(p: GemmParams) -> bool:
    """One K chunk with accumulators past the AGPRs (FP8 on 384 x 256). Its 32-byte fragments are 8 VGPRs
    each, and the loop's arch VGPRs hold 128 accumulators beside them: compiled like 256 x 256, it spilled
    624 registers. What makes it fit, each a step the spills asked for (docs/kernels.md):

    * the next tile's A fragments read each where the one it replaces is dead, after the publish, which
      moves to the hand-over's head (``_Mma.multiply``), and B read one repetition ahead (``b_ahead``);
    * the epilogue after the last tile (``gemm_kernel``; among the MFMAs it needs all 12 B fragments);
    * what the epilogue and the K-tail refills need of the thread index made again after the loop
      (``_thread_again``, ``_Plan.column``) and the scale_inv in scalar registers (``_scale_invs``), not
      held across the loop."""
    return p.tile_k == p.mma_k and _vgpr_acc(p)


def make_tiled_mma(p: GemmParams) -> fx.TiledMma:
    """The wave grid of 16x16 MFMAs, over the tile transposed: A is rhs (N), B is lhs (M).

    The layout algebra (fragments, which rows a lane reads, where each accumulator belongs) is
    FlyDSL's; the instructions are issued by ``kernels/mfma.py`` with the same operand registers, so
    the atom only has to describe the same register layout: the f8f6f4 one for FP8 and MXFP8 (E4M3
    and E5M2 chosen per operand by cbsz / blgp, so mixed FP8 needs no conversion; per-tensor scales
    are applied in the epilogue). Wave ``w`` owns row block ``w // n_waves`` and column block
    ``w % n_waves``.
    """
    elem_a = getattr(fx, p.rhs_elem)
    elem_b = getattr(fx, p.lhs_elem)
    if const_expr(p.scaled):
        atom = fx.make_mma_atom(fx.rocdl.cdna4.MFMA_Scale(16, 16, p.mma_k, elem_a, elem_b))
    else:
        atom = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, p.mma_k, elem_a))
    return fx.make_tiled_mma(atom, fx.make_layout((p.n_waves, p.m_waves, 1), (1, p.n_waves, 0)))


@flyc.jit
def gemm_launch(
    out: fx.Tensor,
    lhs: fx.Tensor,
    rhs: fx.Tensor,
    lhs_scale: fx.Tensor,
    rhs_scale: fx.Tensor,
    bias: fx.Tensor,
    aux: fx.Tensor,
    partials: fx.Tensor,
    m: fx.Int32,
    n: fx.Int32,
    k: fx.Int32,
    ld_lhs: fx.Int32,
    ld_rhs: fx.Int32,
    ld_out: fx.Int32,
    alpha: fx.Float32,
    beta: fx.Float32,
    p: GemmParams,
    stream: fx.Stream = _DEFAULT_STREAM,
):
    """Host side: one workgroup per output tile (:func:`grid_size`), on ``stream``."""
    params = locals()  # the parameters by name: forwarded to the kernel in KernelArgs' order
    tiles = ((m + p.tile_m - 1) // p.tile_m) * ((n + p.tile_n - 1) // p.tile_n)
    # The code object's kernel symbol is the config name, so reports and the emulator can find it.
    gemm_kernel._known_block_size = [p.threads, 1, 1]
    gemm_kernel._func.__name__ = p.name
    args = [params[name] for name in KernelArgs._fields]
    gemm_kernel(*args, p).launch(grid=(tiles, 1, 1), block=(p.threads, 1, 1), stream=stream)


# FlyDSL binds both signatures by name and order: they must be KernelArgs' (kernels/args.py).
check_signature(gemm_kernel._func, fx, ("p",))
check_signature(gemm_launch.func, fx, ("p", "stream"))


def launch_geometry(
    cfg: KernelConfig,
    out: "torch.Tensor",  # noqa: F821 - torch is imported lazily
    lhs: "torch.Tensor",  # noqa: F821
    rhs: "torch.Tensor",  # noqa: F821
) -> LaunchShape:
    """The runtime geometry of one launch; ValueError for views the kernel cannot address.

    ``lhs`` is ``[M, K]`` if ``cfg.lhs_k_major`` else ``[K, M]``, ``rhs`` likewise with N, ``out``
    ``[M, N]``; each with unit stride on its last dim and any leading stride. Every value is a 32-bit
    kernel argument and each view spans at most ``config.MAX_LAUNCH_BYTES`` (buffer offsets are 32-bit):
    the plan's pieces guarantee both, and this check makes a violation a clear error, never a
    ``struct.error`` or a wrapped offset. The limits are the ones the capability matrix states
    (``kernels/config.py`` holds them for both), so what raises here is what the matrix declines. Works
    on meta tensors (no data is touched).
    """
    m, n = out.shape
    k = lhs.shape[1] if cfg.lhs_k_major else lhs.shape[0]
    fmts = {"out": cfg.out_format, "lhs": cfg.lhs_format, "rhs": cfg.rhs_format}
    views = {"out": out, "lhs": lhs, "rhs": rhs}
    for name, t in views.items():
        if t.dim() != 2 or (t.stride(1) != 1 and t.shape[1] > 1):
            raise ValueError(f"{name} must be a 2-D view with unit stride on its last dim, got {t.stride()}")
        span = ((t.shape[0] - 1) * t.stride(0) + t.shape[1]) * fmts[name].itemsize if t.numel() else 0
        if span > MAX_LAUNCH_BYTES:
            raise ValueError(f"{name} spans {span} bytes (> {MAX_LAUNCH_BYTES}): the plan must split the launch")
    for name, t, fmt, k_major in (
        ("lhs", lhs, cfg.lhs_format, cfg.lhs_k_major),
        ("rhs", rhs, cfg.rhs_format, cfg.rhs_k_major),
    ):
        # 16-byte DMA vectors run along the contiguous dim: every row must start on a vector
        # boundary and hold whole vectors (a partial one would read the next row's elements).
        vec = vector_elems(fmt)
        what = "K" if k_major else "rows"
        misaligned = t.shape[1] % vec or (t.shape[0] > 1 and t.stride(0) % vec) or t.storage_offset() % vec
        if t.numel() and misaligned:
            raise ValueError(
                f"{name}: its contiguous dim ({what}), leading stride and start must be multiples of {vec} "
                f"elements ({DMA_BYTES} bytes), got shape {tuple(t.shape)}, stride {t.stride()}, "
                f"offset {t.storage_offset()}: the matrix's alignment rules must decline this"
            )
    # The epilogue stores 4 adjacent columns as one 8- or 16-byte vector (store_tile).
    if out.numel() and (n % OUT_VEC or (m > 1 and out.stride(0) % OUT_VEC) or out.storage_offset() % OUT_VEC):
        raise ValueError(
            f"out: its columns, leading stride and start must be multiples of {OUT_VEC} elements, got shape "
            f"{tuple(out.shape)}, stride {out.stride()}, offset {out.storage_offset()}: the matrix must decline this"
        )
    if (lhs.shape[0] if cfg.lhs_k_major else lhs.shape[1]) != m:
        raise ValueError("lhs rows do not match out rows")
    rhs_rows, rhs_k = (rhs.shape[0], rhs.shape[1]) if cfg.rhs_k_major else (rhs.shape[1], rhs.shape[0])
    if rhs_rows != n or rhs_k != k:
        raise ValueError("rhs does not match out columns / lhs K")
    ld_lhs, ld_rhs, ld_out = (max(t.stride(0), 1) for t in (lhs, rhs, out))
    return LaunchShape(m=m, n=n, k=k, ld_lhs=ld_lhs, ld_rhs=ld_rhs, ld_out=ld_out)


def partials_shape(cfg: KernelConfig, m: int, n: int) -> tuple[int, int] | None:
    """The fp32 bias-gradient workspace of one ``m x n`` launch, or None when the epilogue takes none.

    ``dgelu_bgrad``: ``[tile rows * MMA wave rows, n]`` column-sum partials (kernels/epilogue.py);
    ``bgrad``: ``[thread groups, m]`` row-sum partials (kernels/rowsum.py).
    """
    parts = epilogue.FLAGS[cfg.epilogue]
    if parts.colsum:
        return (-(-m // cfg.tile_m) * _wave_grid(cfg)[0], n)
    if parts.rowsum:
        return (rowsum.groups_of(cfg.tile_m, cfg.lhs_format.itemsize, cfg.waves * WAVE_SIZE), m)
    return None


def epilogue_views(
    cfg: KernelConfig,
    out: "torch.Tensor",  # noqa: F821
    bias: "torch.Tensor | None",  # noqa: F821
    aux: "torch.Tensor | None",  # noqa: F821
    partials: "torch.Tensor | None",  # noqa: F821
) -> tuple:
    """``(bias, aux, partials)`` as the kernel takes them, ValueError for views it cannot address.

    ``bias``: fp32 ``[N]`` contiguous (``epilogue.py``: the host widens TE's bias). ``aux``: the GELU
    pre-activation, ``out``'s shape, dtype and leading stride (the epilogue addresses both with one
    offset). ``partials``: the contiguous fp32 :func:`partials_shape` workspace. Each is required
    exactly when the config's epilogue uses it; unused slots get ``out`` as an unread placeholder.
    """
    import torch

    parts = epilogue.FLAGS[cfg.epilogue]
    m, n = out.shape
    wants = {"bias": parts.bias, "aux": parts.gelu or parts.dgelu, "partials": parts.colsum or parts.rowsum}
    for name, t in {"bias": bias, "aux": aux, "partials": partials}.items():
        if (t is not None) != wants[name]:
            raise ValueError(f"{cfg.name}: the {cfg.epilogue} epilogue {'needs' if wants[name] else 'takes no'} {name}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (n,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous fp32 [{n}] vector, got {bias.dtype} {tuple(bias.shape)}")
    if aux is not None and (
        aux.dtype != out.dtype or aux.shape != out.shape or (m > 1 and aux.stride() != out.stride())
    ):
        raise ValueError(
            f"gelu aux must match out (dtype {out.dtype}, shape {tuple(out.shape)}, stride {out.stride()}), "
            f"got {aux.dtype} {tuple(aux.shape)} {aux.stride()}"
        )
    if aux is not None and aux.numel() and aux.storage_offset() % OUT_VEC:
        raise ValueError(f"gelu aux must start on a multiple of {OUT_VEC} elements")
    want = partials_shape(cfg, m, n)
    if partials is not None and (
        partials.dtype != torch.float32 or tuple(partials.shape) != want or not partials.is_contiguous()
    ):
        raise ValueError(f"partials must be a contiguous fp32 {want} workspace, got {tuple(partials.shape)}")
    return tuple(out if t is None else t for t in (bias, aux, partials))


def kernel_args(
    cfg: KernelConfig,
    out: "torch.Tensor",  # noqa: F821
    lhs: "torch.Tensor",  # noqa: F821
    rhs: "torch.Tensor",  # noqa: F821
    lhs_scale: "torch.Tensor | None",  # noqa: F821
    rhs_scale: "torch.Tensor | None",  # noqa: F821
    alpha: float,
    beta: float,
    extras: tuple = (None, None, None),
) -> KernelArgs:
    """The kernel's runtime arguments for one launch's kernel-facing views, as torch tensors and numbers:
    what the GPU launch (:func:`jit_args`) and the emulator (``launch.kernarg_values``) both pass.

    Validated as the kernel needs (:func:`launch_geometry`, :func:`epilogue_views`; ``extras`` are the
    epilogue's ``(bias, aux, partials)``). FP8 payloads may arrive as uint8: they are re-viewed, never
    copied. A config without scales gets the viewed lhs as its unread scale placeholders.
    """
    from ...dtypes import payload_dtype

    shape = launch_geometry(cfg, out, lhs, rhs)
    lhs = lhs.view(payload_dtype(cfg.lhs_format))
    rhs = rhs.view(payload_dtype(cfg.rhs_format))
    if cfg.scaling != "none":
        if lhs_scale is None or rhs_scale is None:
            raise ValueError("FP8 operands need their scale_inv tensors, MXFP8 their packed scale words")
    else:
        lhs_scale = rhs_scale = lhs  # unread placeholders: the kernel reads scales only for FP8
    bias, aux, partials = epilogue_views(cfg, out, *extras)
    tensors = {"out": out, "lhs": lhs, "rhs": rhs, "lhs_scale": lhs_scale, "rhs_scale": rhs_scale}
    tensors |= {"bias": bias, "aux": aux, "partials": partials}
    return KernelArgs(**tensors, **shape._asdict(), alpha=float(alpha), beta=float(beta))


def jit_args(
    cfg: KernelConfig,
    out: "torch.Tensor",  # noqa: F821
    lhs: "torch.Tensor",  # noqa: F821
    rhs: "torch.Tensor",  # noqa: F821
    lhs_scale: "torch.Tensor | None",  # noqa: F821
    rhs_scale: "torch.Tensor | None",  # noqa: F821
    alpha: float,
    beta: float,
    extras: tuple = (None, None, None),
) -> tuple:
    """The arguments of :func:`gemm_launch` (stream excluded): :func:`kernel_args`, each tensor wrapped
    for FlyDSL, then the config's :class:`GemmParams`.

    Each tensor's data pointer, storage offset included, is passed as a 64-bit base, so a plan
    piece's views need no offset arithmetic in the kernel. Only host objects are created (graph
    capture safe).
    """
    import flydsl.compiler as flyc

    values = kernel_args(cfg, out, lhs, rhs, lhs_scale, rhs_scale, alpha, beta, extras)

    def dyn(t: "torch.Tensor") -> object:  # noqa: F821
        return flyc.from_dlpack(t).mark_layout_dynamic(leading_dim=t.dim() - 1)

    wrapped = values._replace(**{name: dyn(getattr(values, name)) for name in TENSORS})
    return (*wrapped, params_for(cfg))


def placeholder_args(cfg: KernelConfig) -> tuple:
    """CPU placeholders for compiling ``cfg`` (shapes are runtime values: any size compiles the same)."""
    import torch

    from ...dtypes import payload_dtype

    size = 256
    lhs = torch.empty(size, size, dtype=payload_dtype(cfg.lhs_format))
    rhs = torch.empty(size, size, dtype=payload_dtype(cfg.rhs_format))
    out = torch.empty(size, size, dtype=payload_dtype(cfg.out_format))
    scale = torch.ones(1, dtype=torch.float32)
    if cfg.scaling == "mx":
        scale = torch.zeros(size // 16, 64, dtype=torch.int32)  # a piece's packed words (mx.piece_words)
    parts = epilogue.FLAGS[cfg.epilogue]
    ws = partials_shape(cfg, size, size)
    extras = (
        torch.empty(size, dtype=torch.float32) if parts.bias else None,
        torch.empty_like(out) if parts.gelu or parts.dgelu else None,
        None if ws is None else torch.empty(ws, dtype=torch.float32),
    )
    return jit_args(cfg, out, lhs, rhs, scale, scale, 1.0, 0.0, extras)


def grid_size(cfg: KernelConfig, m: int, n: int) -> int:
    """Workgroups of one launch: one per output tile (the same count :func:`gemm_launch` launches)."""
    return -(-m // cfg.tile_m) * -(-n // cfg.tile_n)


def block_size(cfg: KernelConfig) -> int:
    return cfg.waves * WAVE_SIZE
