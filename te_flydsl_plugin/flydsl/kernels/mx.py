"""MXFP8 in the GEMM family: E8M0 block scales fed from the packed layout into MFMA registers.

The family's FP8 path multiplies with gfx950's f8f6f4 MFMA; MXFP8 uses its block-scaled form,
``v_mfma_scale_f32_16x16x128_f8f6f4``, whose ``scale_a`` / ``scale_b`` VGPRs carry one E8M0 byte per
lane: lane ``16 g + i`` scales row ``i``'s logical K block ``g`` of the step (K ``32 g`` .. +31), while
its data registers hold K ``16 g`` .. +15 and ``64 + 16 g`` .. +15 (AMD's FP8 operand layout,
docs/mxfp8-layout.md; :func:`k_of_lds_column` puts the data there). The packed layout (``mx_layout``)
gives lane ``l`` of a wave ONE dword per 16-row tile and 512 K elements, ``word[R, T, l]``, whose byte
``b`` is the scale lane ``l`` supplies in K-step ``4 T + b``. So per 512 K a wave needs one dword per
16-row MFMA repetition of each operand (8 + 8 with the 256 x 256 tile and 2 x 2 waves), used as it is:
no conversion. The waves sharing rows share those words: each DMAs its share of them into LDS once
(:func:`word_dmas`, 8 KiB a group for the workgroup) and every wave reads its own into VGPRs
(:func:`word_reads`).

With ``tile_k == 128`` one K tile is one K-step, and a group of four K tiles shares the words. The K
loop runs whole groups, unrolled (``gemm.gemm_kernel``): tile ``j`` of a group reads byte ``j`` of the
words through the MFMA's ``op_sel``, so no shifts; the next group's words go into LDS during tile 2 and
into registers during tile 3, each word once the MFMAs reading the one it replaces have issued. The
tiles after the last whole group run one at a time, the words moving down a byte a tile
(:func:`next_byte`, 16 ``v_lshrrev``).

The scale tensors reach the kernel as int32 views ``[row_tiles, groups * 64]`` of the packed bytes
whose leading stride (words per 16-row tile of the whole operand) is a runtime layout value, so a
host-split piece passes a slice ``packed[R0:R1, T0:T1]`` without copying.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import flydsl.expr as fx
from flydsl.expr import range_constexpr, rocdl

from .. import mx_layout
from . import mfma
from .config import IMM_OFFSET_LIMIT

if TYPE_CHECKING:
    import torch

STEPS_PER_WORD = mx_layout.STEPS_PER_WORD  # K tiles per scale word (tile_k == 128)
WORDS_PER_GROUP = 64  # dwords per (16-row tile, word group): one per lane
TILE_K = mx_layout.MFMA_K  # one K-step per K tile: one scale byte per tile
# A wave's word DMAs of one operand share one M0 and step through LDS by the instruction's 12-bit
# immediate offset (config.IMM_OFFSET_LIMIT), 256 bytes a 16-row tile: at most 16 tiles.
MAX_SHARE = IMM_OFFSET_LIMIT // (WORDS_PER_GROUP * 4)


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
    """One operand's packed-scale buffer, where its words of a K group sit in LDS, and which of them this
    wave brings there.

    A workgroup needs each word of a K group once, but the waves of a wave-grid row (or column) share
    their rows of the operand: loaded by each wave for its own repetitions, every word crossed the
    memory port twice (2 x 2 waves), 4 KiB a K tile where 2 KiB carry it, and the timing model's MXFP8
    tile was bound by those bytes at 24 B/clock (docs/kernels.md). So the ``partners`` waves that share
    ``rep_tiles`` (the 16-row tile of each repetition, :func:`rep_row_tiles`) split them: wave
    ``partner`` DMAs its share straight into LDS (:func:`word_dmas`), and every wave reads its
    repetitions' words from there (:func:`word_reads`). In LDS an operand's words sit by wave-grid row
    (or column) ``group``, from tile ``group * reps`` on, in repetition order, a tile's 64 words (one a
    lane) together, so a wave reads its words at one address register and constant offsets.

    A tile's word offset is wave-uniform and goes in the DMA's scalar offset; the one per-lane part, the
    lane's word, is shared by every DMA. Tiles past the operand's last 16-row tile (edge workgroups) are
    clamped to it: they serve only rows past M / N, whose outputs are never stored, and every load stays
    inside the tensor without relying on how the scalar offset enters the buffer's range check.
    """

    def __init__(
        self,
        scales: fx.Tensor,
        first_row: fx.Int32,
        rows: fx.Int32,
        tile_rows: int,
        rep_tiles: list[fx.Int32],
        group: fx.Int32,
        partner: fx.Int32,
        partners: int,
        groups: fx.Int32,
    ):
        reps = len(rep_tiles)
        share = reps // partners
        # The buffer starts ``bias`` words before the scales: a DMA's immediate offset (up to the bias) is
        # taken back off its scalar offset, which must not go below zero (it is unsigned: a tile clamped
        # to tile 0 of group 0 would read 4 GiB away). Every address stays the word's own. ``groups`` is
        # 0 only for K = 0, whose packed tensor is empty: the buffer is then empty too, every DMA is out
        # of range (the hardware writes 0) and the K loop multiplies the zero-filled stages.
        self.bias = (share - 1) * WORDS_PER_GROUP
        self.layout = fx.get_layout(scales)
        span = (fx.get_scalar(fx.cosize(self.layout)) + self.bias) * 4
        based = fx.make_view(fx.get_iter(scales) + fx.Int32(-self.bias), self.layout)
        self.buffer = fx.rocdl.make_buffer_tensor(based, num_records_bytes=(groups > 0).select(span, 0))
        self.dma = fx.make_copy_atom(fx.rocdl.cdna4.BufferLoadAsyncLDS32b(), fx.Int32)
        self.lane = fx.Int32(fx.thread_idx.x) % WORDS_PER_GROUP  # the lane's word of a 16-row tile
        self.words = lds_words(tile_rows)  # the operand's words of a K group
        self.first_rep = group * reps  # LDS tile of repetition 0 (wave-uniform)
        self.first_share = self.first_rep + partner * share
        last_tile = (rows + mx_layout.MFMA_ROWS - 1) // mx_layout.MFMA_ROWS - 1
        first_tile = first_row // mx_layout.MFMA_ROWS
        self.reps = reps
        self.tiles = []
        for i in range(share):
            tile = rep_tiles[i]
            for q in range(1, partners):
                tile = (partner == q).select(rep_tiles[q * share + i], tile)
            tile = first_tile + tile
            self.tiles.append(rocdl.readfirstlane(fx.Int32.ir_type, (tile > last_tile).select(last_tile, tile)))


def lds_words(*tile_rows: int) -> int:
    """Int32 words of one K group in LDS of operands of ``tile_rows`` rows: a word a lane a 16-row tile."""
    return sum(rows // mx_layout.MFMA_ROWS * WORDS_PER_GROUP for rows in tile_rows)


def word_dmas(sws: tuple[ScaleWords, ...], lds: fx.Pointer, group: fx.Int32) -> list[Callable[[], None]]:
    """Issuers of this wave's DMAs of K group ``group``'s words into LDS at ``lds`` (the
    operands in ``sws``'s order, :class:`ScaleWords`), one a tile of its share. An operand's DMAs share
    one LDS base (M0) and step by the instruction's immediate offset, which moves the LDS address and
    the global one alike (the scalar offset takes it back off the global one, :class:`ScaleWords`'s bias):
    one M0 an operand instead of one a DMA, each of which LLVM held in a scalar register of its own."""
    issuers = []
    base = 0
    for sw in sws:
        dst = lds + (base + sw.first_share * WORDS_PER_GROUP)
        for i, tile in enumerate(sw.tiles):
            issuers.append(functools.partial(_dma_word, sw, tile, group, dst, i * WORDS_PER_GROUP))
        base += sw.words
    return issuers


def _dma_word(sw: ScaleWords, tile: fx.Int32, group: fx.Int32, dst: fx.Pointer, past: int) -> None:
    """The wave's DMA of the 16-row tile ``tile``'s words of K group ``group`` to ``dst + past`` (lane ``l``'s
    word lands at ``dst + past + l``; ``past`` words through the immediate offset). A function, not a
    method: FlyDSL's loop rewriter would carry any local whose method is called in a runtime loop body as
    loop state, and a ScaleWords is not an IR value."""
    first = fx.Int32(fx.get_scalar(fx.crd2idx((fx.Int32(tile), group * WORDS_PER_GROUP), sw.layout)))
    atom = fx.atom_set_value(sw.dma, "soffset", first + sw.bias - past)
    atom = fx.atom_set_value(atom, "imm_offset", past * 4)  # bytes, where soffset and the VGPR are elements
    src = fx.make_view(fx.get_iter(sw.buffer) + sw.lane, fx.make_layout(1, 1))
    fx.copy_atom_call(atom, src, fx.make_view(dst, fx.make_layout(1, 1)))


def word_reads(
    sws: tuple[ScaleWords, ...], lds: fx.Pointer
) -> tuple[tuple[list[Callable[[], None]], ...], tuple[list[fx.Int32], ...]]:
    """Issuers of the reads of this lane's word of every repetition from LDS at ``lds`` (:func:`word_dmas`),
    one a word, and the lists they fill as they run: both one an operand, in repetition order.

    A wave's words sit in repetition order, at one address register and constant offsets. One word a read
    and issuer, so the K loop can read each into the register of the word it replaces, once that word's
    last MFMA has issued (``gemm._Mma.multiply``)."""
    atom = fx.make_copy_atom(fx.UniversalCopy(32), fx.Int32)
    out: tuple[list[fx.Int32], ...] = tuple([] for _ in sws)

    def read(at: fx.Int32, into: list[fx.Int32]) -> None:
        word = fx.make_rmem_tensor(fx.make_layout(1, 1), fx.Int32)
        fx.copy_atom_call(atom, fx.make_view(lds + at, fx.make_layout(1, 1)), word)
        into.append(fx.Int32(word.load()[0]))

    issuers = []
    base = 0
    for sw, into in zip(sws, out, strict=True):
        first = base + sw.first_rep * WORDS_PER_GROUP + sw.lane
        issuers.append([functools.partial(read, first + r * WORDS_PER_GROUP, into) for r in range(sw.reps)])
        base += sw.words
    return tuple(issuers), out


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
