"""MXFP8 in the GEMM family: E8M0 block scales fed from the packed layout straight into MFMA registers.

The family's FP8 path multiplies with gfx950's f8f6f4 MFMA; MXFP8 uses its block-scaled form,
``v_mfma_scale_f32_16x16x128_f8f6f4``, whose ``scale_a`` / ``scale_b`` VGPRs carry one E8M0 byte per
lane: lane ``16 g + i`` scales row ``i``'s logical K block ``g`` of the step (K ``32 g`` .. +31), while
its data registers hold K ``16 g`` .. +15 and ``64 + 16 g`` .. +15 (AMD's FP8 operand layout,
docs/mxfp8-layout.md; :func:`k_of_lds_column` puts the data there). The packed layout (``mx_layout``)
gives lane ``l`` of a wave ONE dword per 16-row tile and 512 K elements, ``word[R, T, l]``, whose byte
``b`` is the scale lane ``l`` supplies in K-step ``4 T + b``. So per 512 K a wave loads one dword per 16-row
MFMA repetition of each operand (8 + 8 with the 256 x 256 tile and 2 x 2 waves) and keeps them in
VGPRs: no LDS, no conversion.

With ``tile_k == 128`` one K tile is one K-step, and a group of four K tiles shares the words. The K
loop runs whole groups, unrolled (``gemm.gemm_kernel``): tile ``j`` of a group reads byte ``j`` of the
words through the MFMA's ``op_sel``, so no shifts, and the next group's words are loaded during the
group's last tile (:func:`word_loads`, one load between two MFMAs, before the tile's refill), so two
groups' words (2 x 16 VGPRs) are live during that tile only. The tiles after the last whole group run
one at a time, the words moving down a byte a tile (:func:`next_byte`, 16 ``v_lshrrev``).

The scale tensors reach the kernel as int32 views ``[row_tiles, groups * 64]`` of the packed bytes
whose leading stride (words per 16-row tile of the whole operand) is a runtime layout value, so a
host-split piece passes a slice ``packed[R0:R1, T0:T1]`` without copying.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import flydsl.expr as fx
from flydsl._mlir.dialects import rocdl as _rocdl
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from .. import mx_layout
from . import mfma
from .config import OOB_OFFSET

if TYPE_CHECKING:
    import torch

STEPS_PER_WORD = mx_layout.STEPS_PER_WORD  # K tiles per scale word (tile_k == 128)
WORDS_PER_GROUP = 64  # dwords per (16-row tile, word group): one per lane
TILE_K = mx_layout.MFMA_K  # one K-step per K tile: one scale byte per tile


def k_of_lds_column(c: fx.Int32) -> fx.Int32:
    """The K (within the 128-wide K-step) that LDS column ``c`` of an MXFP8 tile holds.

    ``v_mfma_scale_f32_16x16x128_f8f6f4`` with FP8 operands reads lane group ``g = lane // 16``'s
    32 bytes as two 16-element runs, K ``16 g + [0, 16)`` then ``64 + 16 g + [0, 16)``, and applies
    the E8M0 byte of lane ``16 b + row`` to the logical K block ``b`` (docs/mxfp8-layout.md, with the
    sources). The fragment reads give lane group ``g`` the LDS columns ``32 g + [0, 32)``, so LDS
    16-column chunk ``q = 2 g + h`` must hold K chunk ``g + 4 h``: the K column's bits are the LDS
    column's with bit 4 (``h``) moved above bits 5-6 (``g``). The fill applies it to the global
    address (once, outside the K loop), so the data arrive where the MFMA expects them.
    """
    return (c & 15) | ((c >> 1) & 48) | ((c & 16) << 2)


def rep_row_tiles(partitioned: fx.Tensor, reps: int) -> list[fx.Int32]:
    """The 16-row tile (within the workgroup tile) of each MFMA repetition of this thread.

    ``partitioned`` is the MMA partition (``partition_A`` / ``partition_B``) of a ``[rows, tile_k]``
    view whose value is the row index, so the mapping comes from the tiled MMA itself, not from a
    copy of its wave arrangement.
    """
    return [fx.Int32(fx.get_scalar(partitioned[0, r, 0])) // mx_layout.MFMA_ROWS for r in range_constexpr(reps)]


class ScaleWords:
    """One operand's packed-scale buffer and where this wave's words start.

    A repetition's 16-row tile is the same for every lane of the wave, so its word offset is made
    wave-uniform (``readfirstlane``) and goes in the buffer load's scalar offset; the one per-lane
    part, ``4 * lane``, is shared by every load. That keeps the 12 loads per group at one VGPR of
    addressing. Repetitions past the operand's last 16-row tile (edge workgroups) are clamped to it:
    they serve only rows past M / N, whose outputs are never stored, and every load stays inside the
    tensor without relying on how the scalar offset enters the buffer's range check.
    """

    def __init__(self, scales: fx.Tensor, first_row: fx.Int32, rows: fx.Int32, rep_tiles: list[fx.Int32]):
        self.rsrc = fx.rocdl.get_buffer_rsrc(fx.get_iter(fx.rocdl.make_buffer_tensor(scales, max_size=False)))
        self.layout = fx.get_layout(scales)
        self.lane_bytes = fx.Int32(fx.thread_idx.x) % 64 * 4
        last_tile = (rows + mx_layout.MFMA_ROWS - 1) // mx_layout.MFMA_ROWS - 1
        first_tile = first_row // mx_layout.MFMA_ROWS
        tiles = [first_tile + t for t in rep_tiles]
        self.tiles = [rocdl.readfirstlane(fx.Int32.ir_type, (t > last_tile).select(last_tile, t)) for t in tiles]


def load_words(sw: ScaleWords, group: fx.Int32, groups: fx.Int32) -> list[fx.Int32]:
    """This lane's scale word of every repetition of ``sw`` for K group ``group`` of ``groups``, loaded now."""
    return [_load_word(sw, tile, group, groups) for tile in sw.tiles]


def word_loads(
    sws: tuple[ScaleWords, ...], group: fx.Int32, groups: fx.Int32
) -> tuple[list[Callable[[], None]], tuple[list[fx.Int32], ...]]:
    """Issuers of the loads of :func:`load_words` for each of ``sws``, one a word, and the lists (one per
    ``sws``, in repetition order) that the issuers fill as they run.

    The K loop spreads them among a tile's MFMAs, one a gap: loaded at once, before the tile, the 16 loads
    and their 16 scalar offsets held the XDL pipe back about 27 cycles of llvm-mca's model a group of four
    tiles (MXFP8 NN), a third of its loop's distance from the MFMA floor.
    """
    words: tuple[list[fx.Int32], ...] = tuple([] for _ in sws)

    def load(sw: ScaleWords, tile: fx.Int32, into: list[fx.Int32]) -> None:
        into.append(_load_word(sw, tile, group, groups))

    issuers = [
        functools.partial(load, sw, tile, into) for sw, into in zip(sws, words, strict=True) for tile in sw.tiles
    ]
    return issuers, words


def _load_word(sw: ScaleWords, tile: fx.Int32, group: fx.Int32, groups: fx.Int32) -> fx.Int32:
    """This lane's word of the 16-row tile ``tile`` for K group ``group`` of ``groups``.

    ``groups`` is 0 only for K = 0, whose packed tensor is empty: the loads then go past any buffer
    (the hardware returns 0) and multiply the zero-filled stages. A function, not a method: FlyDSL's
    loop rewriter would carry any local whose method is called in a runtime loop body as loop state,
    and a ScaleWords is not an IR value.
    """
    voff = fx.as_ir_value((groups > 0).select(sw.lane_bytes, OOB_OFFSET))
    soff = fx.Int32(fx.get_scalar(fx.crd2idx((fx.Int32(tile), group * WORDS_PER_GROUP), sw.layout))) * 4
    return fx.Int32(_rocdl.raw_ptr_buffer_load(T.i32, sw.rsrc, voff, fx.as_ir_value(soff)))


def next_byte(words: tuple[list[fx.Int32], ...]) -> tuple[list[fx.Int32], ...]:
    """The words one K tile on: shifted down a byte, so the next tile's scale is byte 0 (``op_sel`` 0).

    The MFMA reads only the low byte, so the bytes already used (shifted out) and the ones still to
    come (above) do not matter. Shifting in place keeps one copy of the words live (16 VGPRs) instead
    of the group's raw words plus a shifted copy. The shifts are VALU writes that the next MFMAs read,
    so the words pass through a wait-state fence (kernels/mfma.py).
    """
    flat = mfma.fence_words([w >> 8 for ws in words for w in ws])
    cut = len(words[0])
    return flat[:cut], flat[cut:]


def piece_words(packed: torch.Tensor, r0: int, r1: int, k0: int, k1: int) -> torch.Tensor:
    """The int32 ``[row_tiles, groups * 64]`` view of packed scales that one launch of rows ``[r0, r1)``
    and K ``[k0, k1)`` reads: a slice, never a copy (its leading stride stays the whole operand's).

    Pieces start on whole 16-row tiles and 512-element K groups (the plan aligns them), which is what
    makes the slice exact; anything else is a programming error.
    """
    if r0 % mx_layout.MFMA_ROWS or k0 % mx_layout.K_PER_WORD:
        raise ValueError(f"a piece must start on a 16-row tile and a 512 K group, got rows {r0}, K {k0}")
    import torch

    tiles, groups = packed.shape[0], packed.shape[1]
    words = packed.view(torch.int32).view(tiles, groups * WORDS_PER_GROUP)
    g0, g1 = k0 // mx_layout.K_PER_WORD, -(-k1 // mx_layout.K_PER_WORD)
    t0, t1 = r0 // mx_layout.MFMA_ROWS, -(-r1 // mx_layout.MFMA_ROWS)
    return words[t0:t1, g0 * WORDS_PER_GROUP : g1 * WORDS_PER_GROUP]
