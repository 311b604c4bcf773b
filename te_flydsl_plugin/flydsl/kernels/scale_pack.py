"""The fused MXFP8 scale-pack kernel: TE's padded E8M0 scales -> the MFMA-ready packed layout.

One launch per GEMM operand replaces the seed's eager torch chain (arange, gathers, shifts, ORs,
transposes, ``.contiguous()``: dozens of small kernels per GEMM). Each thread builds ONE 32-bit word
of the packed layout (``mx_layout``: word ``[R, T, lane]``, byte ``b`` = K-step ``4T + b``) from four
scale bytes read straight out of TE's tensor through its real strides, and stores it once. Positions
outside the real ``rows x K/32`` get 127 without reading memory (their load offset is pushed past
the buffer, which the hardware answers with 0 and no access): TE's padding bytes are never read.

Grid: ``x`` covers the ``T * 64`` words of one 16-row tile (256 threads = 4 word groups), ``y`` the
16-row tiles, so no runtime division is needed. ``BLOCKS_ALONG_DIM`` (compile time) says which of
the scale tensor's two dims the 32-blocks run along: 1 for rowwise ``[rows_pad, kb_pad]``, 0 for
columnwise ``[kb_pad, rows_pad]``; the tensor's own (dynamic) layout supplies the strides.
"""

from __future__ import annotations

from typing import Any

import flydsl.compiler as flyc
import flydsl.expr as fx
import torch
from flydsl._mlir.dialects import rocdl as _rocdl
from flydsl.expr.typing import T

from .. import mx_layout
from .config import OOB_OFFSET

THREADS = 256
_WORDS_PER_TILE_STEP = 64  # words per (16-row tile, word group T): lane = 16 g + i
_DEFAULT_STREAM = fx.Stream(None)  # the launcher's default: the null stream


@flyc.kernel
def scale_pack_kernel(
    S: fx.Tensor,
    P: fx.Tensor,
    rows: fx.Int32,
    kb: fx.Int32,
    n_t: fx.Int32,
    BLOCKS_ALONG_DIM: fx.Constexpr[int],
):
    """``P`` (int32 words of the packed layout) from ``S`` (E8M0 bytes, any strides)."""
    s_buf = fx.rocdl.make_buffer_tensor(S, max_size=False)
    s_rsrc = fx.rocdl.get_buffer_rsrc(fx.get_iter(s_buf))
    p_buf = fx.rocdl.make_buffer_tensor(P, max_size=False)
    p_rsrc = fx.rocdl.get_buffer_rsrc(fx.get_iter(p_buf))
    s_layout = fx.get_layout(S)

    w = fx.Int32(fx.block_idx.x) * fx.Int32(THREADS) + fx.Int32(fx.thread_idx.x)
    tile = fx.Int32(fx.block_idx.y)
    # w >= 0: shifts and masks instead of signed division.
    i = w & fx.Int32(15)
    g = (w >> fx.Int32(4)) & fx.Int32(3)
    t = w >> fx.Int32(6)
    r = tile * fx.Int32(16) + i
    word_ok = t < n_t
    row_ok = word_ok & (r < rows)
    word = fx.Int32(0)
    for b in fx.range_constexpr(4):
        j = t * fx.Int32(16) + fx.Int32(4 * b) + g
        ok = row_ok & (j < kb)
        if fx.const_expr(BLOCKS_ALONG_DIM == 1):
            off = fx.Int32(fx.get_scalar(fx.crd2idx((r, j), s_layout)))
        else:
            off = fx.Int32(fx.get_scalar(fx.crd2idx((j, r), s_layout)))
        off = fx.arith.select(ok, off, fx.Int32(OOB_OFFSET))
        byte = _rocdl.raw_ptr_buffer_load(T.i8, s_rsrc, fx.as_ir_value(off), fx.as_ir_value(fx.Int32(0)))
        val = fx.arith.select(ok, fx.Int32(fx.arith.extui(T.i32, byte)), fx.Int32(mx_layout.PAD_BYTE))
        word = word | (val << fx.Int32(8 * b))
    word_off = (tile * n_t * fx.Int32(_WORDS_PER_TILE_STEP) + w) * fx.Int32(4)
    out_off = fx.arith.select(word_ok, word_off, fx.Int32(OOB_OFFSET))
    _rocdl.raw_ptr_buffer_store(fx.as_ir_value(word), p_rsrc, fx.as_ir_value(out_off), fx.as_ir_value(fx.Int32(0)))


@flyc.jit
def scale_pack(
    S: fx.Tensor,
    P: fx.Tensor,
    rows: fx.Int32,
    kb: fx.Int32,
    n_t: fx.Int32,
    n_tiles: fx.Int32,
    BLOCKS_ALONG_DIM: fx.Constexpr[int],
    stream: fx.Stream = _DEFAULT_STREAM,
):
    """Host launcher: one thread per packed word, grid ``(ceil(n_t * 64 / 256), n_tiles)``."""
    scale_pack_kernel(S, P, rows, kb, n_t, BLOCKS_ALONG_DIM).launch(
        grid=grid(n_t, n_tiles), block=(THREADS, 1, 1), stream=stream
    )


# ── what a launch passes (the compile cache, flydsl/compiled.py, and the executors use these) ────────

KERNEL_NAME = "scale_pack_kernel_0"  # the kernel symbol in the code object


def variant_name(blocks_along_dim: int) -> str:
    """The compile cache's name of one variant (one compile per variant, never per shape)."""
    if blocks_along_dim not in (0, 1):
        raise ValueError(f"blocks_along_dim must be 0 or 1, got {blocks_along_dim}")
    return f"scale_pack_blocks_along_{blocks_along_dim}"


def jit_args(scales: torch.Tensor, words: torch.Tensor) -> tuple[Any, Any]:
    """FlyDSL arguments with every extent and stride dynamic, so one compile serves every shape
    and any view (the scale tensor's real strides travel in the kernel argument)."""
    s = flyc.from_dlpack(scales).mark_shape_dynamic([0, 1]).mark_stride_dynamic([0, 1])
    p = flyc.from_dlpack(words).mark_shape_dynamic(0)
    return s, p


def placeholder_args(blocks_along_dim: int) -> tuple:
    """Compile-time arguments of one variant: CPU placeholders (no GPU touched), scalars 1."""
    s, p = jit_args(torch.empty((128, 4), dtype=torch.uint8), torch.empty((64,), dtype=torch.int32))
    return s, p, 1, 1, 1, 1, blocks_along_dim


def grid(n_t: Any, n_tiles: Any) -> tuple[Any, Any, int]:
    """The launch grid for ``n_t`` word groups and ``n_tiles`` 16-row tiles: Python ints for the
    emulator, the launcher's traced ``fx.Int32`` values in :func:`scale_pack`."""
    return ((n_t * _WORDS_PER_TILE_STEP + THREADS - 1) // THREADS, n_tiles, 1)
