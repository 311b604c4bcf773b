"""The FlyDSL backend's capability matrix: the one source of truth.

``check`` (``flydsl/check.py``), the CLI's ``capabilities`` table and ``docs/capabilities.md`` are all
derived from :data:`MATRIX`. Each row names the gfx950 kernel config that backs it and whether that
config is backed (compiled, ISA-checked and run in the emulator: ``flydsl/compiled.py``'s ``BACKED``);
compiled executors accept only backed rows and backed epilogues, the reference executor every row.
"""

from __future__ import annotations

import functools
from itertools import product

from ..spec import Capabilities, CapabilityRow, Format, Layout
from .kernels.config import OUT_VEC

ARCHS = ("gfx950",)
MAX_LAUNCH_BYTES = 2**31 - 1
MAX_DIM = 2**31 - 1
OUT_FORMATS = (Format.FP32, Format.BF16, Format.FP16)
BIAS_FORMATS = (Format.FP32, Format.BF16, Format.FP16)
# Output quantizers executed (GemmProblem.output_quantizer.scaling): per-tensor FP8, applied by TE's own
# quantizer to the GEMM's unquantized result (GemmProblem.result_dtype).
OUTPUT_QUANTIZERS = ("delayed", "current")
MXFP8_OUTPUT_DECLINED = (
    "MXFP8 output quantization is declined: NVIDIA TE quantizes MXFP8 only on compute capability 10.0 and "
    "newer, so the H200 where the plugin meets TE cannot check that path"
)

# Which layouts each fused epilogue is defined for: where TE requests it.
EPILOGUE_LAYOUTS: dict[str, tuple[Layout, ...]] = {
    "plain": (Layout.TN, Layout.NN, Layout.NT),
    "bias": (Layout.TN,),
    "gelu": (Layout.TN,),
    "bias_gelu": (Layout.TN,),
    "bgrad": (Layout.NT,),
    "dgelu": (Layout.NN,),
    "dgelu_bgrad": (Layout.NN,),
}
EPILOGUES = tuple(EPILOGUE_LAYOUTS)

# K must be a multiple of this: 16-byte vectors along K, and one E8M0 scale per 32 elements for MX.
K_MULTIPLE = {Format.FP32: 4, Format.FP16: 8, Format.BF16: 8, Format.FP8_E4M3: 16, Format.FP8_E5M2: 16}
MX_K_MULTIPLE = 32
# Every operand storage must start on this many bytes: the kernels' direct global->LDS loads move 16
# bytes per lane (kernels/gemm.py DMA_BYTES; launch_geometry refuses other starts).
OPERAND_ALIGN = 16

_FP8 = (Format.FP8_E4M3, Format.FP8_E5M2)
_MX = (Format.MXFP8_E4M3, Format.MXFP8_E5M2)
_ALL_LAYOUTS = (Layout.TN, Layout.NN, Layout.NT)


def _kernel_name(a: Format, b: Format) -> str:
    """The kernel config family a row maps to (the concrete config also fixes majorness and tiles)."""
    return f"gemm_{b.value}_{a.value}"


Backed = dict[tuple[Format, Format], tuple[tuple[Layout, Format, str], ...]]


def _rows(backed: Backed) -> tuple[CapabilityRow, ...]:
    pairs: list[tuple[Format, Format, int, str]] = [
        (f, f, K_MULTIPLE[f], "") for f in (Format.BF16, Format.FP16, Format.FP32)
    ]
    pairs += [
        (
            a,
            b,
            16,
            "per-tensor fp32 scale_inv per operand; both operands read K-major (TE's stored transpose)",
        )
        for a, b in product(_FP8, _FP8)
    ]
    pairs += [
        (
            a,
            b,
            MX_K_MULTIPLE,
            "E8M0 scales per 32 K-elements; K-blocked storage per layout (rowwise/columnwise)",
        )
        for a, b in product(_MX, _MX)
    ]
    return tuple(
        CapabilityRow(
            a_format=a,
            b_format=b,
            layouts=_ALL_LAYOUTS,
            out_dtypes=OUT_FORMATS,
            epilogues=EPILOGUES,
            k_multiple=k,
            kernel=_kernel_name(a, b),
            backed=backed.get((a, b), ()),
            notes=notes,
        )
        for a, b, k, notes in pairs
    )


RULES: tuple[tuple[str, str], ...] = (
    (
        "arch",
        "compiled kernels target gfx950 (MI355X); the reference executor evaluates the same rules anywhere",
    ),
    ("layouts", "TN, NN, NT (TT is rejected by TE itself)"),
    (
        "shapes",
        f"M any size, N a multiple of {OUT_VEC} (edge tiles through buffer bounds; the epilogue stores "
        f"{OUT_VEC} adjacent output columns as one vector); K a multiple of the row's k_multiple",
    ),
    (
        "non-K-major operands",
        "bf16/fp16/fp32 operands that are not K-major (NN's A, NT's A and B) need their contiguous dim to "
        "be a multiple of the K multiple too (16-byte vectors); MXFP8 operands read from columnwise storage "
        "(NN's A, NT's A and B) need it a multiple of 16",
    ),
    ("fp8 storage", "FP8 operands are read K-major: NN needs A's transpose, NT needs both transposes"),
    ("mxfp8 storage", "NN reads A columnwise; NT reads A and B columnwise; TN reads both rowwise"),
    (
        "epilogues",
        "plain in every layout; bias / gelu / bias_gelu in TN (fprop); bgrad in NT (wgrad, bias gradient "
        "returned); dgelu / dgelu_bgrad in NN (dgrad, needs gelu_in); GELU is the tanh approximation",
    ),
    (
        "fused epilogues on gfx950",
        "compiled where TE issues them (a row's backed list): bias / gelu / bias_gelu with the output in the "
        "operands' dtype (bf16, fp16, fp32), dgelu / dgelu_bgrad likewise for bf16 / fp16, and for FP8 (E4M3 "
        "fprop; E4M3 or E5M2 gradients) and MXFP8 into bf16 / fp16; bgrad for bf16 / fp16 / fp32 into the same "
        "dtype or fp32; the GELU pre-activation in the output dtype; bias gradients deterministic (fixed-order "
        "reductions)",
    ),
    ("alpha, beta, accumulate", "any alpha; beta and accumulate read and update D in place"),
    (
        "output",
        f"fp32, bf16, fp16; D given or allocated; a given D must be contiguous and start on a multiple of "
        f"{OUT_VEC} elements",
    ),
    (
        "output quantizer",
        f"per-tensor FP8 ({', '.join(OUTPUT_QUANTIZERS)} scaling): the GEMM writes the unquantized result "
        "(fp32 for delayed scaling with an FP8 operand, where TE fuses the cast into cuBLASLt; else the output "
        "dtype, TE's unfused path) and TE's own quantizer (tex.quantize) quantizes it on the same stream: amax, "
        "scale, transpose as the quantizer asks; not with a given D or a bias gradient. MXFP8: declined",
    ),
    ("comm overlap", "not supported: declined (comm_overlap, comm_type, extra_output, bulk_overlap)"),
    ("use_split_accumulator", "honoured: kernels always accumulate in fp32 across the whole K"),
    ("workspace", "not needed: FlyDSL kernels use no cuBLAS workspace"),
    (
        "size",
        f"buffer offsets are 32-bit: the host splits a launch so no buffer spans more than "
        f"{MAX_LAUNCH_BYTES} bytes (64-bit base per piece); operands over 2 GiB run, never declined for size",
    ),
    (
        "contiguity",
        f"operands must be contiguous (TE's storages are) and every storage must start on a {OPERAND_ALIGN}-byte "
        "boundary of its storage (storage offset); others are declined",
    ),
    (
        "devices",
        "every tensor of a call (operands, scales, D, bias, gelu_in) on one device, not meta; others are left "
        "to TE; the emulator executor runs CPU tensors",
    ),
)


def layouts_of(lhs_k_major: bool, rhs_k_major: bool, fmt: Format) -> tuple[Layout, ...]:
    """The TE layouts a kernel majorness serves: per-tensor FP8 reads every layout K-major (transposes)."""
    if fmt.is_fp8:
        return _ALL_LAYOUTS if (lhs_k_major and rhs_k_major) else ()
    return {(True, True): (Layout.TN,), (True, False): (Layout.NN,), (False, False): (Layout.NT,)}.get(
        (lhs_k_major, rhs_k_major), ()
    )


def _backed() -> Backed:
    """Which combinations compiled kernels back, from the kernel family's BACKED list (``family.py``).

    An ImportError is a bug in the package and propagates (it must never read as "nothing backed").
    """
    from .family import BACKED

    found: dict[tuple[Format, Format], set[tuple[Layout, Format, str]]] = {}
    for cfg in BACKED:
        pair = (cfg.rhs_format, cfg.lhs_format)  # lhs is TE's B and rhs TE's A (kernels/config.py)
        for layout in layouts_of(cfg.lhs_k_major, cfg.rhs_k_major, cfg.lhs_format):
            if layout in EPILOGUE_LAYOUTS[cfg.epilogue]:  # FP8's K-major kernels serve every layout
                found.setdefault(pair, set()).add((layout, cfg.out_format, cfg.epilogue))
    return {k: tuple(sorted(v, key=lambda c: (c[0].value, c[1].value, c[2]))) for k, v in found.items()}


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    return Capabilities(backend="flydsl", archs=ARCHS, rows=_rows(_backed()), rules=RULES)
