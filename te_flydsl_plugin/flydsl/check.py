"""``check(problem, executor)``: the FlyDSL backend's verdict, derived from the capability matrix.

Pure and total: it reads only the problem and the matrix, never raises, and lists every reason that
applies (not just the first), each with the field it is about.
"""

from __future__ import annotations

from collections.abc import Callable

from ..spec import Capabilities, Format, GemmProblem, Layout, Reason, ReasonCode, Verdict
from . import matrix

# Which storage each TE operand is read from, per layout, for FP8 and MXFP8 (matrix RULES say it in words).
# True: rowwise data (K-major for TE's A in TN, for B in TN/NN); False: the transpose / columnwise copy.
QUANT_STORAGE: dict[Layout, tuple[bool, bool]] = {
    Layout.TN: (True, True),
    Layout.NN: (False, True),
    Layout.NT: (False, False),
}
COMPILED_EXECUTORS = ("flydsl", "emulator")
Decline = Callable[[ReasonCode, str, str], None]


def _expected_bias_numel(p: GemmProblem) -> int:
    return p.m if p.epilogue == "bgrad" else p.n


def check(problem: GemmProblem, executor: str, caps: Capabilities | None = None) -> Verdict:
    caps = caps or matrix.capabilities()
    p = problem
    why: list[Reason] = []

    def no(code: ReasonCode, message: str, field: str) -> None:
        why.append(Reason(code, message, field))

    if p.shape_error:
        no(ReasonCode.SHAPE, f"inconsistent operands, left to TE: {p.shape_error}", "shape")
    if executor == "flydsl" and p.arch not in caps.archs:
        no(
            ReasonCode.ARCH,
            f"compiled FlyDSL kernels target {', '.join(caps.archs)}; this device is {p.arch}",
            "arch",
        )
    if executor == "emulator" and p.device_type not in ("cpu", ""):
        no(
            ReasonCode.FEATURE,
            f"the emulator executor runs CPU tensors; these are on {p.device_type}",
            "device",
        )

    if len(p.devices) > 1:
        no(ReasonCode.SHAPE, f"operands on different devices ({', '.join(p.devices)}), left to TE", "device")
    if "meta" in p.devices:
        no(ReasonCode.FEATURE, "meta tensors hold no data, left to TE", "device")
    for name, op in (("a", p.a), ("b", p.b)):
        if op.format in (Format.OTHER, Format.NVFP4, Format.FP8_BLOCK):
            detail = f" ({op.detail})" if op.detail else ""
            no(
                ReasonCode.FORMAT,
                f"operand {name.upper()} is {op.format.value}{detail}: not supported",
                f"{name}_format",
            )
    row = caps.row(p.a.format, p.b.format)
    formats_known = not any(r.field in ("a_format", "b_format") for r in why)
    if row is None and formats_known:
        no(
            ReasonCode.FORMAT,
            f"no kernel for A={p.a.format.value} with B={p.b.format.value} (mixed families unsupported)",
            "formats",
        )
    if p.layout is Layout.TT:
        no(ReasonCode.LAYOUT, "layout TT is not supported (TE rejects it too)", "layout")
    if p.out_dtype not in matrix.OUT_FORMATS:
        no(
            ReasonCode.FORMAT,
            f"output dtype {p.out_dtype.value} not supported (fp32, bf16, fp16)",
            "out_dtype",
        )

    epi = p.epilogue
    if p.layout is not Layout.TT and p.layout not in matrix.EPILOGUE_LAYOUTS[epi]:
        where = ", ".join(x.value for x in matrix.EPILOGUE_LAYOUTS[epi])
        no(
            ReasonCode.EPILOGUE,
            f"fused epilogue {epi} is supported in {where}, not {p.layout.value}",
            "epilogue",
        )
    if p.bias:
        if p.bias_dtype not in matrix.BIAS_FORMATS:
            no(ReasonCode.EPILOGUE, f"bias dtype {p.bias_dtype} not supported", "bias")
        if not p.shape_error and p.bias_numel != _expected_bias_numel(p):
            no(
                ReasonCode.SHAPE,
                f"bias has {p.bias_numel} elements, {epi} needs {_expected_bias_numel(p)}",
                "bias",
            )
    q = p.output_quantizer
    if q is not None:
        if q.scaling == "mxfp8":
            no(ReasonCode.FEATURE, matrix.MXFP8_OUTPUT_DECLINED, "quantizer")
        elif q.scaling not in matrix.OUTPUT_QUANTIZERS or not q.format.is_fp8:
            no(
                ReasonCode.FEATURE,
                f"output quantizer {q.scaling} ({q.format.value}) is not supported; per-tensor FP8 "
                f"{' and '.join(matrix.OUTPUT_QUANTIZERS)} scaling are",
                "quantizer",
            )
        if p.out_given:
            no(
                ReasonCode.FEATURE,
                "a given D with an output quantizer (quantized in place) is unsupported",
                "quantizer",
            )
        if p.grad and p.bias:
            no(
                ReasonCode.FEATURE,
                "a bias gradient with an output quantizer is not supported (TE gives it the dtype of a "
                "quantized output)",
                "quantizer",
            )
    if p.comm_overlap:
        no(
            ReasonCode.FEATURE,
            "comm+GEMM overlap (comm_overlap/comm_type/extra_output/bulk_overlap) is not supported",
            "comm_overlap",
        )

    if row is not None and p.layout is not Layout.TT:
        _check_shape(p, row.k_multiple, no)
        _check_storage(p, no)
        # With an output quantizer the kernel writes the unquantized result (GemmProblem.result_dtype).
        res = p.result_dtype
        if executor in COMPILED_EXECUTORS and not why and not row.is_backed(p.layout, res, epi):
            no(
                ReasonCode.KERNEL,
                f"no compiled gfx950 kernel backs {row.kernel} {p.layout.value} -> {res.value} with epilogue {epi} yet",
                "kernel",
            )
        if executor in COMPILED_EXECUTORS and p.gelu and p.aux_dtype not in (None, res):
            no(
                ReasonCode.KERNEL,
                f"the compiled kernels keep the GELU pre-activation in the output dtype ({res.value}); "
                f"this one is {p.aux_dtype.value}",
                "gelu_in",
            )
    if not p.a.contiguous or not p.b.contiguous:
        no(ReasonCode.ALIGNMENT, "operands must be contiguous", "contiguous")
    for name, op in (("A", p.a), ("B", p.b)):
        if op.align < matrix.OPERAND_ALIGN:
            no(
                ReasonCode.ALIGNMENT,
                f"operand {name} starts on a {op.align}-byte boundary (its storage offset); the kernels' "
                f"vector loads need {matrix.OPERAND_ALIGN}",
                f"{name.lower()}_align",
            )
    if p.out_given and not p.out_contiguous:
        no(ReasonCode.ALIGNMENT, "a given D must be contiguous", "out")
    if p.out_given and p.out_align < matrix.OUT_VEC * max(p.out_dtype.itemsize, 1):
        no(ReasonCode.ALIGNMENT, f"a given D must start on a multiple of {matrix.OUT_VEC} elements", "out")
    if not p.epilogue_contiguous:
        no(ReasonCode.ALIGNMENT, "bias and gelu_in must be contiguous", "epilogue")
    return Verdict(tuple(why))


def _check_shape(p: GemmProblem, k_multiple: int, no) -> None:
    if min(p.m, p.n, p.k) <= 0:
        no(ReasonCode.SIZE, f"empty GEMM (m={p.m}, n={p.n}, k={p.k}) is left to TE", "shape")
        return
    if max(p.m, p.n, p.k) > matrix.MAX_DIM:
        no(ReasonCode.SIZE, f"a dimension exceeds {matrix.MAX_DIM}", "shape")
    if p.k % k_multiple:
        no(ReasonCode.ALIGNMENT, f"K={p.k} is not a multiple of {k_multiple} for {p.a.format.value}", "k")
    if p.n % matrix.OUT_VEC:
        no(
            ReasonCode.ALIGNMENT,
            f"N={p.n} is not a multiple of {matrix.OUT_VEC} (the kernels store {matrix.OUT_VEC} adjacent output "
            "columns as one vector)",
            "n",
        )
    # Operands that are not K-major are read along their other dim: it needs full vectors too.
    if not p.a.format.is_fp8 and p.layout in (Layout.NN, Layout.NT):
        vec = 16 if p.a.format.is_mx else k_multiple
        if p.n % vec:
            no(
                ReasonCode.ALIGNMENT,
                f"N={p.n} is not a multiple of {vec} (A is read N-major in {p.layout.value})",
                "n",
            )
    if not p.b.format.is_fp8 and p.layout is Layout.NT:
        vec = 16 if p.b.format.is_mx else k_multiple
        if p.m % vec:
            no(ReasonCode.ALIGNMENT, f"M={p.m} is not a multiple of {vec} (B is read M-major in NT)", "m")


def _check_storage(p: GemmProblem, no) -> None:
    a_rowwise, b_rowwise = QUANT_STORAGE[p.layout]
    for name, op, rowwise in (("A", p.a, a_rowwise), ("B", p.b, b_rowwise)):
        if not op.format.is_quantized:
            continue
        have = op.rowwise if rowwise else op.columnwise
        if not have:
            what = (
                ("data" if rowwise else "transpose") if op.format.is_fp8 else ("rowwise" if rowwise else "columnwise")
            )
            no(
                ReasonCode.LAYOUT,
                f"{p.layout.value} reads {name}'s {what} storage, which this operand lacks",
                f"{name.lower()}_storage",
            )
