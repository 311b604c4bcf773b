"""Compile-time parameters of the one FlyDSL GEMM family.

A config fixes everything the compiled code depends on; M, N and K are runtime arguments, so one
compile serves every shape (the compile cache is keyed by config, never by M/N/K).

The kernel computes ``out[M, N] = alpha * sum_k lhs[m, k] * rhs[n, k] (+ beta * out)`` where ``lhs``
supplies the output rows and ``rhs`` the output columns. Each operand is either K-major (stored
``[rows, K]``, K contiguous) or row-major in the other sense (stored ``[K, rows]``): the majorness
flags give TE's TN / NN / NT layouts without copies. Note ``lhs`` is TE's B and ``rhs`` TE's A.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...spec import Format

# Output columns per accumulator block, stored as one vector (gemm.store_tile): N, a given D's leading
# stride and start must be multiples of it (the matrix declines the rest).
OUT_VEC = 4
# A raw buffer byte offset past any buffer a launch addresses (the plan keeps spans below 2**31 - 1):
# a buffer load from it returns 0 and touches no memory, a store is dropped (buffer range checking).
OOB_OFFSET = 0x7FFFFFFF


@dataclass(frozen=True)
class KernelConfig:
    lhs_format: Format
    rhs_format: Format
    lhs_k_major: bool
    rhs_k_major: bool
    out_format: Format
    epilogue: str = "plain"
    tile_m: int = 256
    tile_n: int = 256
    tile_k: int = 64
    waves: int = 4  # 2 x 2 waves; 8 (2 x 4) for fp32 and the 128 x 128 tiles (family.FAMILY)

    @property
    def scaling(self) -> str:
        """``none`` (bf16/fp16/fp32), ``tensor`` (per-tensor FP8 scales) or ``mx`` (E8M0 block-32)."""
        if self.lhs_format.is_mx:
            return "mx"
        return "tensor" if self.lhs_format.is_fp8 else "none"

    @property
    def agpr_accumulators(self) -> bool:
        """Whether the kernel pins its accumulators in AGPRs (kernels/mfma.py): every format but fp32.

        fp32's 16x16x4 MFMA takes eight K-chunks per 32-element K tile; pinned, its fragments and
        addresses overflow the arch VGPRs (36 - 57 spills at 4 and 8 waves), so fp32 keeps LLVM's
        own MFMA selection at 8 waves, where all 128 accumulators fit the arch VGPRs with no moves.
        """
        return self.lhs_format is not Format.FP32

    @property
    def name(self) -> str:
        maj = ("k" if self.lhs_k_major else "m") + ("k" if self.rhs_k_major else "n")
        return (
            f"gemm_{self.lhs_format.value}_{self.rhs_format.value}_{maj}_{self.out_format.value}"
            f"_{self.epilogue}_{self.tile_m}x{self.tile_n}x{self.tile_k}_w{self.waves}"
        )
