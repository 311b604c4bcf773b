"""MXFP8 in the GEMM family: E8M0 block scales fed from the packed layout straight into MFMA registers.

The family's FP8 path already multiplies with ``v_mfma_scale_f32_16x16x128_f8f6f4``; MXFP8 only
changes what its ``scale_a`` / ``scale_b`` VGPRs hold. The packed layout (``mx_layout``,
docs/mxfp8-layout.md) gives lane ``l`` of a wave ONE dword per 16-row tile and 512 K elements,
``word[R, T, l]``, whose byte ``b`` is the scale that lane's 32 K elements need in K-step ``4 T + b``.
So per 512 K a wave loads one dword per 16-row MFMA repetition of each operand (8 for the lhs, 4 for
the rhs with the 256 x 256 tile and 2 x 4 waves), keeps them in VGPRs, and the four K-steps pick their
byte with the instruction's ``op_sel`` immediate: four atom types (one per byte), no shifts, no LDS.

With ``tile_k == 128`` one K tile is one K-step and a group of four K tiles shares the words. When
both operands are K-major the kernel unrolls the group, so step ``j``'s byte is ``op_sel`` ``j``; the
N/M-major configs (transposed 8-bit LDS reads, more address VGPRs) would spill unrolled, so they keep
the one-tile runtime loop and shift the step's byte down (:func:`byte_down`, ``op_sel`` 0). Either
way a group's 12 words are issued with the DMA of its first tile and waited for with it. In the
runtime loop they are issued before the MFMAs of the previous tile, which hide their latency; the
unrolled form issues them just before the wait, because keeping both groups' words live there
needs 12 more VGPRs than the 256 a wave owns at 8 waves (2 per SIMD) and spills. In the unrolled
form the K tail is padded to the group: tiles past K load zeros
(buffer bounds) and the packed layout pads their scale bytes with 127 (2^0), so the result is exact
and the cost is at most three K tiles of MFMAs on the last group only.

The scale tensors reach the kernel as int32 views ``[row_tiles, groups * 64]`` of the packed bytes
whose leading stride (words per 16-row tile of the whole operand) is a runtime layout value, so a
host-split piece passes a slice ``packed[R0:R1, T0:T1]`` without copying.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import flydsl.expr as fx
from flydsl._mlir.dialects import rocdl as _rocdl
from flydsl.expr import range_constexpr, rocdl
from flydsl.expr.typing import T

from .. import mx_layout

if TYPE_CHECKING:
    import torch

STEPS_PER_WORD = mx_layout.STEPS_PER_WORD  # K tiles per scale word (tile_k == 128)
WORDS_PER_GROUP = 64  # dwords per (16-row tile, word group): one per lane
TILE_K = mx_layout.MFMA_K  # one K-step per K tile, so the op_sel byte is static per unrolled step
_OOB = 0x7FFFFFFF  # a byte offset past any buffer: the load returns 0 and touches no memory


def mfma_atoms(elem_a: type, elem_b: type) -> tuple[fx.MmaAtom, ...]:
    """The scaled MFMA with ``op_sel`` byte ``b`` for both operands, for ``b`` = 0..3.

    The byte is part of the instruction (an immediate), hence of the atom's type: four atoms, chosen
    per unrolled K-step.
    """
    return tuple(
        fx.make_mma_atom(fx.rocdl.cdna4.MFMA_Scale(16, 16, TILE_K, elem_a, elem_b, opsel_a=b, opsel_b=b))
        for b in range(STEPS_PER_WORD)
    )


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
    """This lane's scale word of every repetition of ``sw`` for K group ``group`` of ``groups``.

    ``groups`` is 0 only for K = 0, whose packed tensor is empty: the loads then go past any buffer
    (the hardware returns 0) and multiply the zero-filled stages. A function, not a method: FlyDSL's
    loop rewriter would carry any local whose method is called in a runtime loop body as loop state,
    and a ScaleWords is not an IR value.
    """
    voff = fx.as_ir_value((groups > 0).select(sw.lane_bytes, _OOB))
    words = []
    for tile in sw.tiles:
        soff = fx.Int32(fx.get_scalar(fx.crd2idx((fx.Int32(tile), group * WORDS_PER_GROUP), sw.layout))) * 4
        words.append(fx.Int32(_rocdl.raw_ptr_buffer_load(T.i32, sw.rsrc, voff, fx.as_ir_value(soff))))
    return words


def byte_down(words: tuple[list[fx.Int32], ...], t: fx.Int32) -> tuple[list[fx.Int32], ...]:
    """The words with byte ``t % 4`` (K tile ``t``'s scale) moved to byte 0, for ``op_sel`` 0.

    Only for loops whose K-step is a runtime value (the N/M-major configs): the MFMA reads the low
    byte, so the higher bytes left in place are ignored.
    """
    shift = (t % STEPS_PER_WORD) * 8
    return tuple([w >> shift for w in ws] for ws in words)


def scaled_gemm(
    tiled_mma: fx.TiledMma,
    atoms: tuple[fx.MmaAtom, ...],
    step: int,
    acc: fx.Tensor,
    frag_a: fx.Tensor,
    frag_b: fx.Tensor,
    words_a: list[fx.Int32],
    words_b: list[fx.Int32],
) -> None:
    """One K-step of the wave's MFMAs: repetition ``(m, n)`` uses words ``a[m]``, ``b[n]``, byte ``step % 4``."""
    atom = atoms[step % STEPS_PER_WORD]

    def per_call(_atom: fx.MmaAtom, mnk: tuple[int, int, int]) -> fx.MmaAtom:
        return atom.set_value({"scale_a": words_a[mnk[0]], "scale_b": words_b[mnk[1]]})

    fx.gemm(tiled_mma, acc, frag_a, frag_b, acc, atom_callback=per_call)


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
