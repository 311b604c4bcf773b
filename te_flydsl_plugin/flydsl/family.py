"""The one GEMM family's configs: every kernel that is compiled, ISA-checked and run in the emulator.

``BACKED`` is what the capability matrix (``matrix._backed``), the tile heuristic (``kernels/select.py``)
and ``precompile`` read: a config that fails a gate (tests/kernels) leaves it, and its matrix row with it.
"""

from __future__ import annotations

import dataclasses

from ..spec import Format
from .kernels.config import KernelConfig


def _family() -> tuple[KernelConfig, ...]:
    """Every per-tensor config of the family: 256 x 256 tiles for every kind, 128 x 128 for 16-bit and
    FP8 TN, 384 x 256 for bf16 and fp16 (TN, NN, NT) into the activation dtype and FP8's recipe pairs
    into bf16 / fp16 (:func:`_wide`).

    256 x 256 runs on 4 waves (2 x 2 waves of 128 x 128: 256 accumulators per lane, pinned in AGPRs,
    kernels/mfma.py) for bf16, fp16 and FP8, and on 8 waves (2 x 4, 128 accumulators per lane) for
    fp32, whose MFMAs are LLVM's own (``KernelConfig.agpr_accumulators``). The 128 x 128 tiles run on 4
    waves too (2 x 2 waves of 64 x 64: 64 accumulators per lane, pinned; two workgroups a CU by their 64
    KiB of LDS, so two waves a SIMD): their K loops come within 1.004x (bf16) and 1.000x (FP8) of the
    MFMA floor under llvm-mca, against 1.203x and 1.117x for one wave of the 8-wave tiles before, and the
    timing model predicts them as fast or faster on every shape tried (docs/kernels.md).

    384 x 256 (16-bit fprop, dgrad and wgrad into TE's activation dtype) moves 1.25x a 256 x 256 tile's
    bytes for 1.5x its FLOPs: 384 accumulators a lane, 256 in AGPRs and 128 in arch VGPRs
    (``mfma.acc_file``), with B fragments read two repetitions ahead inside each K chunk to make room
    (``gemm._rotates_b``), the K-outer fragment reads four repetitions apart sharing an address
    (``gemm._rep_sources``), and all 160 KiB of LDS. FP8's (one K chunk of 8-VGPR fragments) reads the
    next tile's A in place (``gemm._a_in_place``). An fp32 output (wgrad into main_grad) spilled 12
    registers in its epilogue; MXFP8's wide tile is not built. Each config costs about 7 - 10 s of the
    cold ``precompile`` (docs/kernels.md, "384 x 256: fewer bytes a FLOP", "FP8 on 384 x 256").
    """
    F = Format
    out = [F.FP32, F.BF16, F.FP16]
    cfgs: list[KernelConfig] = []
    for fmt in (F.BF16, F.FP16):
        for lk, rk in ((True, True), (True, False), (False, False)):  # TN, NN, NT
            cfgs += [KernelConfig(fmt, fmt, lk, rk, o, waves=4) for o in out]
    for lk, rk in ((True, True), (True, False), (False, False)):
        cfgs += [KernelConfig(F.FP32, F.FP32, lk, rk, o, tile_k=32, waves=8) for o in out]
    for a in (F.FP8_E4M3, F.FP8_E5M2):
        for b in (F.FP8_E4M3, F.FP8_E5M2):
            cfgs += [KernelConfig(a, b, True, True, o, tile_k=128, waves=4) for o in out]
    # 128 x 128 tiles for TN (fprop) problems whose 256 x 256 grid would leave CUs idle (select.py).
    small = [
        dataclasses.replace(c, tile_m=128, tile_n=128, waves=4)
        for c in cfgs
        if c.lhs_k_major and c.rhs_k_major and c.lhs_format is not F.FP32
    ]
    return (*cfgs, *small, *_wide(cfgs))


def _mx_family() -> tuple[KernelConfig, ...]:
    """MXFP8 (kernels/mx.py): every E4M3/E5M2 pair in TN, NN and NT (K-major rowwise storages, N/M-major
    columnwise ones read with ``ds_read_b64_tr_b8``), 256 x 256 x 128 tiles on 4 waves: one K-step per
    K tile, accumulators pinned in AGPRs."""
    F = Format
    kinds = (F.MXFP8_E4M3, F.MXFP8_E5M2)
    outs = (F.FP32, F.BF16, F.FP16)
    majors = ((True, True), (True, False), (False, False))  # TN, NN, NT
    return tuple(
        KernelConfig(a, b, lk, rk, o, tile_k=128, waves=4)
        for lk, rk in majors
        for a in kinds
        for b in kinds
        for o in outs
    )


def _epilogue_family() -> tuple[KernelConfig, ...]:
    """The fused epilogues (kernels/epilogue.py) in the combinations TE issues, on the 256 x 256 tiles
    (the 16-bit fprop and dgrad ones on 384 x 256 too: :func:`_wide`; FP8's are not).

    TE's fprop (TN) takes ``bias`` / ``gelu`` / ``bias_gelu`` and its dgrad (NN) ``dgelu`` /
    ``dgelu_bgrad``, always with the output in the activation dtype: bf16 -> bf16, fp16 -> fp16,
    fp32 -> fp32 (fprop only), and FP8 / MXFP8 -> bf16 or fp16. Its wgrad (NT) takes ``bgrad``, backed for 16-bit /
    fp32 operands into the activation dtype or the fp32 main_grad (kernels/rowsum.py); FP8 / MXFP8
    ``bgrad`` would need FP8 decoding in the row sums and is declined. FP8 fprop multiplies E4M3 by
    E4M3 (every recipe); dgrad E4M3 weights by E4M3 (E4M3 recipe) or E5M2 (HYBRID) gradients. The full
    cross product with every output dtype and FP8 kind pair would be about 7x the compile time, for
    combinations TE does not issue; they stay declined (KERNEL). Small grids use the 256 x 256 tile too
    (``select`` picks a 128 x 128 config only where it is backed).
    """
    F = Format
    same = [(F.BF16, F.BF16), (F.FP16, F.FP16), (F.FP32, F.FP32)]
    lows = (F.BF16, F.FP16)
    # (lhs = TE's B, rhs = TE's A, lhs K-major, rhs K-major, outs, epilogues)
    kinds: list[tuple[Format, Format, bool, bool, tuple[Format, ...], tuple[str, ...]]] = []
    fwd, bwd = ("bias", "gelu", "bias_gelu"), ("dgelu", "dgelu_bgrad")
    for f, _ in same:
        # fp32's dGELU: 8 waves keep LLVM's own MFMAs and 256 registers; dgelu spilled 2 of them and
        # dgelu_bgrad's loop came out 5 instructions shorter than plain's: not backed (declined KERNEL).
        kinds += [(f, f, True, True, (f,), fwd)] + ([(f, f, True, False, (f,), bwd)] if f is not F.FP32 else [])
        # wgrad's BGRADB, into the activation dtype or (fuse_wgrad_accumulation) the fp32 main_grad
        kinds += [(f, f, False, False, tuple(dict.fromkeys((f, F.FP32))), ("bgrad",))]
    kinds += [(F.FP8_E4M3, F.FP8_E4M3, True, True, lows, fwd + bwd), (F.FP8_E5M2, F.FP8_E4M3, True, True, lows, bwd)]
    kinds += [(F.MXFP8_E4M3, F.MXFP8_E4M3, True, True, lows, fwd)]
    kinds += [(g, F.MXFP8_E4M3, True, False, lows, bwd) for g in (F.MXFP8_E4M3, F.MXFP8_E5M2)]
    tiles = {F.FP32: (32, 8), F.BF16: (64, 4), F.FP16: (64, 4)}
    return tuple(
        KernelConfig(lf, rf, lk, rk, o, e, tile_k=tiles.get(lf, (128, 4))[0], waves=tiles.get(lf, (128, 4))[1])
        for lf, rf, lk, rk, outs, epis in kinds
        for o in outs
        for e in epis
    )


def _wide(cfgs: tuple[KernelConfig, ...] | list[KernelConfig]) -> tuple[KernelConfig, ...]:
    """The 384 x 256 twins of ``cfgs`` that are built, where its rounds of workgroups move fewer bytes
    (select.py):

    * 16-bit operands into their own dtype, plain and with the fprop and dgrad fused epilogues (``bias``,
      ``gelu``, ``bias_gelu``; ``dgelu``, ``dgelu_bgrad``), each of those storing after its last tile
      (``gemm_kernel``: among the last tile's MFMAs they spilled 20 - 28 registers). wgrad's ``bgrad`` is
      not: its row sums' reads and adds in the K loop, beside the wide tile's 128 VGPR accumulators,
      spilled 426 registers.
    * FP8 (per-tensor scales), plain, the pairs TE's recipes multiply (lhs, TE's B, E4M3 or HYBRID's E5M2
      gradient; rhs E4M3) into bf16 or fp16, storing after the last tile (``gemm._a_in_place``). An fp32
      output spilled 4 registers; the fused epilogues and the other kind pairs are not built.

    Each config costs about 7 - 10 s of the cold ``precompile``."""

    def built(c: KernelConfig) -> bool:
        if c.lhs_format in (Format.BF16, Format.FP16):
            return c.out_format is c.lhs_format and c.epilogue != "bgrad"
        return (
            c.scaling == "tensor"
            and c.rhs_format is Format.FP8_E4M3
            and c.out_format in (Format.BF16, Format.FP16)
            and c.epilogue == "plain"
        )

    return tuple(dataclasses.replace(c, tile_m=384) for c in cfgs if built(c))


_EPILOGUES = _epilogue_family()
PLAIN_FAMILY: tuple[KernelConfig, ...] = _family() + _mx_family()
EPILOGUE_FAMILY: tuple[KernelConfig, ...] = _EPILOGUES + _wide(_EPILOGUES)
FAMILY: tuple[KernelConfig, ...] = PLAIN_FAMILY + EPILOGUE_FAMILY
# Every family config passed all three gates (tests/kernels: test_compile.py, test_emulator.py); a
# config that fails any of them must leave this tuple, and the matrix loses its row with it.
BACKED: tuple[KernelConfig, ...] = FAMILY
