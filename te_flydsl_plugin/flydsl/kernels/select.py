"""The tile heuristic: which config of the family runs a problem.

The plan asks with the problem's formats, majorness, output and epilogue (a ``KernelConfig`` with
default tiles) and its M, N, K. The answer is always a config of the family:

1. ``tile_k`` follows the element size so one LDS row of a K tile is 128 bytes (eight 16-byte DMA
   chunks, the swizzle's period): 64 for bf16/fp16, 32 for fp32, 128 for FP8.
2. The output tile is 256 x 256 (the reviewed design's choice: it keeps the MFMA pipe busy with
   every LDS byte reused 256 times) unless a grid of 256 x 256 tiles would leave at least half of
   the 256 CUs idle (fewer than ``SMALL_GRID`` = 128 tiles) and a 128 x 128 config of the same kind
   is backed: then the smaller tile (4x the workgroups, half the reuse, 64 KiB of LDS so two fit a
   CU) trades reuse for parallelism. The threshold is an estimate from that arithmetic, to be tuned
   with ``te-flydsl-plugin bench`` on gfx950 (flydsl/bench.py). K does not influence the tile (the K
   loop is a runtime loop; split-K is not in the family).
3. The 256 x 256 tile runs on 4 waves (2 x 2 waves of 128 x 128, 256 accumulators per lane pinned
   in AGPRs, kernels/mfma.py) where that config is backed (bf16, fp16, FP8, MXFP8), else on 8 waves
   (fp32, whose accumulators stay in arch VGPRs: KernelConfig.agpr_accumulators). 4 waves is the
   reviewed (HipKittens-style) design's choice: one wave per SIMD with the whole 512-entry register
   file, and each wave's 128 x 128 block reading 16 fragments from LDS per 64 MFMAs instead of 12 per
   32 (two thirds of the LDS read traffic per MFMA); with no second wave on the SIMD to hide LDS
   latency, the kernel issues each K chunk's fragment reads among the previous chunk's MFMAs.
   Nothing was measured on gfx950: ``te-flydsl-plugin bench`` on hardware decides. 128 x 128 tiles
   run on 4 waves too (2 x 2 waves of 64 x 64; two workgroups a CU, so two waves a SIMD: family.py).
4. Where a 384 x 256 config of the kind is backed (bf16 and fp16, TN, NN and NT, into the activation
   dtype, also with TE's fprop and dgrad fused epilogues; FP8's recipe pairs into bf16 / fp16: 384
   accumulators a lane, 128 of them in arch VGPRs, kernels/mfma.py), it replaces 256 x 256
   when its rounds of ``CUS`` workgroups times its bytes a K step, ``tile_m + tile_n`` rows, come out
   smaller: the tiles are fabric-bound in the timing model (docs/perf-model.md), so a round takes about
   its bytes, and 384 x 256 moves 1.25x the bytes for 1.5x the FLOPs, but more of its last round can
   stand idle (8192 x 4096 x 4096: 352 tiles, 2 rounds, against 512 tiles in 2). Ties keep 256 x 256.
   Predicted, not measured (docs/kernels.md).

Only configs in ``family.BACKED`` are chosen beyond the default, so the heuristic never picks a
kernel that was not compiled, ISA-checked and run in the emulator.
"""

from __future__ import annotations

import dataclasses

from ...spec import Format
from .config import KernelConfig

CUS = 256  # MI355X
SMALL_GRID = CUS // 2
TILE_K = {
    Format.BF16: 64,
    Format.FP16: 64,
    Format.FP32: 32,
    Format.FP8_E4M3: 128,
    Format.FP8_E5M2: 128,
    Format.MXFP8_E4M3: 128,  # MX: one 128-wide K-step per tile, so its op_sel byte is static (kernels/mx.py)
    Format.MXFP8_E5M2: 128,
}


def _tiles(m: int, n: int, tile_m: int, tile_n: int) -> int:
    return -(-m // tile_m) * -(-n // tile_n)


def _rounds_bytes(m: int, n: int, tile_m: int, tile_n: int) -> int:
    """Rounds of ``CUS`` workgroups times the rows a workgroup loads a K step (rule 4)."""
    return -(-_tiles(m, n, tile_m, tile_n) // CUS) * (tile_m + tile_n)


def select(cfg: KernelConfig, m: int, n: int, k: int) -> KernelConfig:
    """The family config for an ``m x n x k`` problem of ``cfg``'s kind (see the module docstring)."""
    del k  # the runtime K loop makes the tile independent of K
    tile_k = TILE_K.get(cfg.lhs_format, cfg.tile_k)
    from ..family import BACKED

    big = dataclasses.replace(cfg, tile_m=256, tile_n=256, tile_k=tile_k, waves=4)
    if big not in BACKED:
        big = dataclasses.replace(big, waves=8)
    if _tiles(m, n, 256, 256) >= SMALL_GRID:
        wide = dataclasses.replace(big, tile_m=384)
        if wide in BACKED and _rounds_bytes(m, n, 384, 256) < _rounds_bytes(m, n, 256, 256):
            return wide
        return big
    small = dataclasses.replace(big, tile_m=128, tile_n=128, waves=4)
    return small if small in BACKED else big
