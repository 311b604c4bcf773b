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

# The kernels' limits, stated once: the capability matrix (``flydsl/matrix.py``) and ``flydsl/mx_layout.py``
# import them, and ``gemm.launch_geometry`` raises on a launch that breaks them, so the rules the matrix
# declines by and the guards the kernel raises by cannot disagree.

# Bytes one lane moves per direct global->LDS transfer (``buffer_load ... lds``, 16 bytes on gfx950): every
# operand's contiguous dim, leading stride and start must be whole 16-byte vectors (matrix.OPERAND_ALIGN).
DMA_BYTES = 16
OPERAND_ALIGN = DMA_BYTES
# Bytes a buffer instruction's immediate offset reaches: 12 bits (AMD CDNA3 ISA, MUBUF: offset[11:0]).
IMM_OFFSET_LIMIT = 4096
# Output columns per accumulator block, stored as one vector (gemm.store_tile): N, a given D's leading
# stride and start must be multiples of it (the matrix declines the rest).
OUT_VEC = 4
# The kernels' runtime scalars (M, N, K, leading strides) and buffer offsets are signed 32-bit values.
INT32_MAX = 2**31 - 1
MAX_DIM = INT32_MAX
# The most bytes one buffer of a launch may span (the plan splits larger operands into pieces with 64-bit
# bases; launch_geometry refuses a longer span). Its byte offsets are int32 values, and a DMA buffer may
# start up to an immediate offset's reach before its operand (the bias of gemm.py's M0 runs and of mx.py's
# word buffer): 2**31 - 1 let such a buffer's records pass 2**31, so that a load at the out-of-bounds offset
# (OOB_BYTES) plus an immediate offset passed the range check and read memory where the K tail needs zeros.
MAX_LAUNCH_BYTES = 2**31 - IMM_OFFSET_LIMIT
# A raw (unscaled) buffer byte offset past any buffer a launch addresses (spans are at most
# MAX_LAUNCH_BYTES): a buffer load from it returns 0 and touches no memory, a store is dropped (buffer
# range checking).
OOB_OFFSET = INT32_MAX
# The same for offsets given in elements (the GEMM's DMA and epilogue addresses), which FlyDSL's buffer
# copies scale to bytes by the element size in 32 bits: ``-(OOB_BYTES // itemsize)`` elements is byte
# offset 2**31 (mod 2**32) for every power-of-two item size, an int32 even for 1-byte elements (the
# positive 2**31 is none), one past OOB_OFFSET and, with any immediate offset, past every buffer's
# records (at most MAX_LAUNCH_BYTES and a bias under IMM_OFFSET_LIMIT) as well.
OOB_BYTES = OOB_OFFSET + 1


def vector_elems(fmt: Format) -> int:
    """Elements of ``fmt`` per 16-byte DMA vector: an operand's contiguous dim, leading stride and start
    are multiples of it (``gemm.launch_geometry``), so it is also a per-tensor format's K multiple."""
    return DMA_BYTES // fmt.itemsize


# K must be a multiple of this for the per-tensor formats (the matrix's rows): K-major operands load
# whole 16-byte vectors along K. (MXFP8's K multiple is its scale block, matrix.MX_K_MULTIPLE.)
K_MULTIPLE = {f: vector_elems(f) for f in (Format.FP32, Format.FP16, Format.BF16, Format.FP8_E4M3, Format.FP8_E5M2)}


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
    waves: int = 4  # 2 x 2 waves; 8 (2 x 4) for fp32 (family.FAMILY)

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
    def wave_macs(self) -> int:
        """One wave's multiply-accumulates of one K tile: what the K-loop report divides a loop's MFMA
        work by to count the tiles an iteration multiplies (flydsl/kloop.py)."""
        return self.tile_m * self.tile_n * self.tile_k // self.waves

    @property
    def name(self) -> str:
        maj = ("k" if self.lhs_k_major else "m") + ("k" if self.rhs_k_major else "n")
        return (
            f"gemm_{self.lhs_format.value}_{self.rhs_format.value}_{maj}_{self.out_format.value}"
            f"_{self.epilogue}_{self.tile_m}x{self.tile_n}x{self.tile_k}_w{self.waves}"
        )
