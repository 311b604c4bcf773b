"""The FlyDSL backend's capability matrix: the one source of truth.

Two parts, both data: the rows (one per operand-format pair, each naming the gfx950 kernel config that
backs it and which combinations are backed: compiled, ISA-checked and run in the emulator, from
``family.py``'s ``BACKED``), and :data:`RULES`. Each rule is one :class:`Rule`: its topic and words
(what ``capabilities`` and ``docs/capabilities.md`` print) beside the predicate ``check``
(``flydsl/check.py``) evaluates, and both read the same constants here, so words and verdicts cannot
drift apart. Every support constant of the backend is here: stated here, or, where it is a fact of the
kernels (vector widths, alignment, size limits), imported from ``kernels/config.py``, which the kernels'
own guards read too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import product

from ..operands import MX_BLOCK
from ..spec import Capabilities, CapabilityRow, Format, GemmProblem, Layout, Reason, ReasonCode
from .kernels.config import K_MULTIPLE, MAX_DIM, MAX_LAUNCH_BYTES, OPERAND_ALIGN, OUT_VEC, vector_elems

# ---------------------------------------------------------------- what a rule is


@dataclass
class Case:
    """What a rule reads: the problem, the executor it is judged for, the matrix, the problem's row (None
    for a format pair without one), and the reasons the rules before it gave."""

    problem: GemmProblem
    executor: str
    caps: Capabilities
    row: CapabilityRow | None
    found: list[Reason] = field(default_factory=list)

    @property
    def judged(self) -> bool:
        """Whether the row-dependent rules apply: the formats have a row and the layout is one the matrix has."""
        return self.row is not None and self.problem.layout in self.caps.layouts


Declines = Callable[[Case], Iterator[Reason]]


@dataclass(frozen=True)
class Rule:
    """One rule of the matrix: ``topic`` and ``text`` in words, ``declines`` the reasons it gives a case.

    A rule without ``declines`` states what is always accepted (nothing is declined for it).
    """

    topic: str
    text: str
    declines: Declines | None = None

    def reasons(self, case: Case) -> list[Reason]:
        return list(self.declines(case)) if self.declines is not None else []


def rule(topic: str, text: str) -> Callable[[Declines], Rule]:
    """Decorator: the function below becomes the predicate of a :class:`Rule` with these words."""
    return lambda declines: Rule(topic, text, declines)


def _words(xs: Iterable[Format | Layout | str], sep: str = ", ") -> str:
    """Names joined for a rule's words or a reason (enums by their value)."""
    return sep.join(x.value if isinstance(x, (Format, Layout)) else x for x in xs)


# ---------------------------------------------------------------- the data

ARCHS = ("gfx950",)
LAYOUTS = (Layout.TN, Layout.NN, Layout.NT)  # TT: TE itself rejects it
OUT_FORMATS = (Format.FP32, Format.BF16, Format.FP16)
BIAS_FORMATS = (Format.FP32, Format.BF16, Format.FP16)
# Executors that run compiled gfx950 code: they accept only what a row's backed list names.
COMPILED_EXECUTORS = ("flydsl", "emulator")

# Which layouts each fused epilogue is defined for: where TE requests it.
EPILOGUE_LAYOUTS: dict[str, tuple[Layout, ...]] = {
    "plain": LAYOUTS,
    "bias": (Layout.TN,),
    "gelu": (Layout.TN,),
    "bias_gelu": (Layout.TN,),
    "bgrad": (Layout.NT,),
    "dgelu": (Layout.NN,),
    "dgelu_bgrad": (Layout.NN,),
}
# The TE pass each layout is (notes/te-gemm-api.md), for the epilogue rule's words.
PASS_OF = {Layout.TN: "fprop", Layout.NN: "dgrad", Layout.NT: "wgrad"}

# K must be a multiple of K_MULTIPLE (16-byte vectors along K) and, for MX, of one E8M0 scale block.
MX_K_MULTIPLE = MX_BLOCK
# An MXFP8 copy read along M or N (columnwise storage) moves 16-byte vectors of 1-byte elements.
MX_MN_VECTOR = vector_elems(Format.MXFP8_E4M3)

# Which storage each TE layout reads of TE's A and B: True the rowwise one (the data, K-major for A in TN
# and B in TN/NN), False the other (an FP8 operand's stored transpose, which is K-major; an MXFP8
# operand's columnwise copy). An unquantized operand has only its rowwise storage: False means the
# kernel reads it along M or N (not K-major). plan.py picks the storage from this table too.
READS_ROWWISE: dict[Layout, tuple[bool, bool]] = {
    Layout.TN: (True, True),
    Layout.NN: (False, True),
    Layout.NT: (False, False),
}

# Output quantizers executed (GemmProblem.output_quantizer.scaling): per-tensor FP8, applied by TE's own
# quantizer to the GEMM's unquantized result (GemmProblem.result_dtype).
OUTPUT_QUANTIZERS = ("delayed", "current")
MXFP8_OUTPUT_DECLINED = (
    "MXFP8 output quantization is declined: NVIDIA TE quantizes MXFP8 only on compute capability 10.0 and "
    "newer, so the H200 where the plugin meets TE cannot check that path"
)
# Operand formats no row has: NVFP4, blockwise FP8, and what the host could not name.
DECLINED_FORMATS = (Format.NVFP4, Format.FP8_BLOCK, Format.OTHER)

_FP8 = (Format.FP8_E4M3, Format.FP8_E5M2)
_MX = (Format.MXFP8_E4M3, Format.MXFP8_E5M2)


# ---------------------------------------------------------------- the rows


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
            K_MULTIPLE[a],
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
            k_multiple=k,
            kernel=_kernel_name(a, b),
            backed=backed.get((a, b), ()),
            notes=notes,
        )
        for a, b, k, notes in pairs
    )


def layouts_of(lhs_k_major: bool, rhs_k_major: bool, fmt: Format) -> tuple[Layout, ...]:
    """The TE layouts a kernel majorness serves: per-tensor FP8 reads every layout K-major (transposes)."""
    if fmt.is_fp8:
        return LAYOUTS if (lhs_k_major and rhs_k_major) else ()
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


# ---------------------------------------------------------------- the rules, in the order check applies them


@rule("operands", "operands whose shapes disagree (TE itself raises for these) are left to TE")
def _consistent(c: Case) -> Iterator[Reason]:
    if c.problem.shape_error:
        yield Reason(ReasonCode.SHAPE, f"inconsistent operands, left to TE: {c.problem.shape_error}", "shape")


@rule(
    "arch",
    f"compiled kernels target {_words(ARCHS)} (MI355X); the reference executor evaluates the same rules anywhere",
)
def _arch(c: Case) -> Iterator[Reason]:
    p = c.problem
    if c.executor == "flydsl" and p.arch not in c.caps.archs:
        yield Reason(
            ReasonCode.ARCH,
            f"compiled FlyDSL kernels target {', '.join(c.caps.archs)}; this device is {p.arch}",
            "arch",
        )


@rule(
    "devices",
    "every tensor of a call (operands, scales, D, bias, gelu_in) on one device, not meta; others are left "
    "to TE; the emulator executor runs CPU tensors",
)
def _devices(c: Case) -> Iterator[Reason]:
    p = c.problem
    if c.executor == "emulator" and p.device_type not in ("cpu", ""):  # "": a what-if, on no device
        yield Reason(
            ReasonCode.FEATURE,
            f"the emulator executor runs CPU tensors; these are on {p.device_type}",
            "device",
        )
    if len(p.devices) > 1:
        yield Reason(ReasonCode.SHAPE, f"operands on different devices ({', '.join(p.devices)}), left to TE", "device")
    if "meta" in p.devices:
        yield Reason(ReasonCode.FEATURE, "meta tensors hold no data, left to TE", "device")


@rule(
    "formats",
    "A and B of one row's pair: bf16, fp16 or fp32 alike; per-tensor FP8 E4M3 / E5M2 in any mix; MXFP8 "
    f"E4M3 / E5M2 in any mix; other pairs and {_words(DECLINED_FORMATS)} operands are declined",
)
def _formats(c: Case) -> Iterator[Reason]:
    p = c.problem
    named = True
    for name, op in (("a", p.a), ("b", p.b)):
        if op.format in DECLINED_FORMATS:
            named = False
            detail = f" ({op.detail})" if op.detail else ""
            yield Reason(
                ReasonCode.FORMAT,
                f"operand {name.upper()} is {op.format.value}{detail}: not supported",
                f"{name}_format",
            )
    if c.row is None and named:
        yield Reason(
            ReasonCode.FORMAT,
            f"no kernel for A={p.a.format.value} with B={p.b.format.value} (mixed families unsupported)",
            "formats",
        )


@rule("layouts", f"{_words(LAYOUTS)} (TT is rejected by TE itself)")
def _layouts(c: Case) -> Iterator[Reason]:
    if c.problem.layout not in c.caps.layouts:
        yield Reason(
            ReasonCode.LAYOUT, f"layout {c.problem.layout.value} is not supported (TE rejects it too)", "layout"
        )


@rule("output", f"{_words(OUT_FORMATS)}; D given or allocated")
def _output(c: Case) -> Iterator[Reason]:
    if c.problem.out_dtype not in c.caps.out_dtypes:
        yield Reason(
            ReasonCode.FORMAT,
            f"output dtype {c.problem.out_dtype.value} not supported ({_words(c.caps.out_dtypes)})",
            "out_dtype",
        )


ALPHA_BETA = Rule("alpha, beta, accumulate", "any alpha; beta and accumulate read and update D in place")


def _epilogue_words() -> str:
    """Where each fused epilogue is defined, from EPILOGUE_LAYOUTS: ``bgrad in NT (wgrad)``."""
    by_layouts: dict[tuple[Layout, ...], list[str]] = {}
    for epi, lays in EPILOGUE_LAYOUTS.items():
        by_layouts.setdefault(lays, []).append(epi)
    parts = []
    for lays, epis in by_layouts.items():
        where = "every layout" if lays == LAYOUTS else " ".join(x.value for x in lays)
        role = f" ({'/'.join(PASS_OF[x] for x in lays)})" if lays != LAYOUTS else ""
        parts.append(f"{' / '.join(epis)} in {where}{role}")
    return "; ".join(parts)


@rule(
    "epilogues",
    f"{_epilogue_words()}; bgrad returns the bias gradient, dgelu / dgelu_bgrad read gelu_in; GELU is the tanh "
    f"approximation; a bias is {_words(BIAS_FORMATS, ' / ')} with N elements (M for bgrad)",
)
def _epilogues(c: Case) -> Iterator[Reason]:
    p = c.problem
    epi = p.epilogue
    where = c.caps.epilogue_layouts(epi)
    if p.layout in c.caps.layouts and p.layout not in where:
        yield Reason(
            ReasonCode.EPILOGUE,
            f"fused epilogue {epi} is supported in {_words(where)}, not {p.layout.value}",
            "epilogue",
        )
    if p.bias:
        if p.bias_dtype not in BIAS_FORMATS:
            yield Reason(ReasonCode.EPILOGUE, f"bias dtype {p.bias_dtype} not supported", "bias")
        wanted = p.m if epi == "bgrad" else p.n
        if not p.shape_error and p.bias_numel != wanted:
            yield Reason(ReasonCode.SHAPE, f"bias has {p.bias_numel} elements, {epi} needs {wanted}", "bias")


@rule(
    "output quantizer",
    f"per-tensor FP8 ({', '.join(OUTPUT_QUANTIZERS)} scaling): the GEMM writes the unquantized result "
    "(fp32 for delayed scaling with an FP8 operand, where TE fuses the cast into cuBLASLt; else the output "
    "dtype, TE's unfused path) and TE's own quantizer (tex.quantize) quantizes it on the same stream: amax, "
    "scale, transpose as the quantizer asks; not with a given D or a bias gradient. MXFP8: declined",
)
def _output_quantizer(c: Case) -> Iterator[Reason]:
    p = c.problem
    q = p.output_quantizer
    if q is None:
        return
    if q.scaling == "mxfp8":
        yield Reason(ReasonCode.FEATURE, MXFP8_OUTPUT_DECLINED, "quantizer")
    elif q.scaling not in OUTPUT_QUANTIZERS or not q.format.is_fp8:
        yield Reason(
            ReasonCode.FEATURE,
            f"output quantizer {q.scaling} ({q.format.value}) is not supported; per-tensor FP8 "
            f"{' and '.join(OUTPUT_QUANTIZERS)} scaling are",
            "quantizer",
        )
    if p.out_given:
        yield Reason(
            ReasonCode.FEATURE, "a given D with an output quantizer (quantized in place) is unsupported", "quantizer"
        )
    if p.grad and p.bias:
        yield Reason(
            ReasonCode.FEATURE,
            "a bias gradient with an output quantizer is not supported (TE gives it the dtype of a quantized output)",
            "quantizer",
        )


@rule("comm overlap", "not supported: declined (comm_overlap, comm_type, extra_output, bulk_overlap)")
def _comm_overlap(c: Case) -> Iterator[Reason]:
    if c.problem.comm_overlap:
        yield Reason(
            ReasonCode.FEATURE,
            "comm+GEMM overlap (comm_overlap/comm_type/extra_output/bulk_overlap) is not supported",
            "comm_overlap",
        )


def _empty(p: GemmProblem) -> bool:
    return min(p.m, p.n, p.k) <= 0


@rule(
    "size",
    f"buffer offsets are 32-bit: the host splits a launch so no buffer spans more than {MAX_LAUNCH_BYTES} "
    "bytes (64-bit base per piece); operands over 2 GiB run, never declined for their size; an empty GEMM "
    f"(M, N or K zero) is left to TE, and no dimension may exceed {MAX_DIM}",
)
def _size(c: Case) -> Iterator[Reason]:
    p = c.problem
    if not c.judged:
        return
    if _empty(p):
        yield Reason(ReasonCode.SIZE, f"empty GEMM (m={p.m}, n={p.n}, k={p.k}) is left to TE", "shape")
    elif max(p.m, p.n, p.k) > MAX_DIM:
        yield Reason(ReasonCode.SIZE, f"a dimension exceeds {MAX_DIM}", "shape")


@rule(
    "shapes",
    f"M any size, N a multiple of {OUT_VEC} (edge tiles through buffer bounds; the epilogue stores "
    f"{OUT_VEC} adjacent output columns as one vector); K a multiple of the row's k_multiple",
)
def _shapes(c: Case) -> Iterator[Reason]:
    p = c.problem
    if not c.judged or _empty(p):
        return
    assert c.row is not None  # judged
    if p.k % c.row.k_multiple:
        yield Reason(
            ReasonCode.ALIGNMENT, f"K={p.k} is not a multiple of {c.row.k_multiple} for {p.a.format.value}", "k"
        )
    if p.n % OUT_VEC:
        yield Reason(
            ReasonCode.ALIGNMENT,
            f"N={p.n} is not a multiple of {OUT_VEC} (the kernels store {OUT_VEC} adjacent output columns as one "
            "vector)",
            "n",
        )


def _along_mn_words() -> str:
    """The operands a layout reads along M or N (READS_ROWWISE False): ``NN's A, NT's A and B``."""
    parts = []
    for lay, (a, b) in READS_ROWWISE.items():
        names = [name for name, rowwise in (("A", a), ("B", b)) if not rowwise]
        if names:
            parts.append(f"{lay.value}'s {' and '.join(names)}")
    return ", ".join(parts)


@rule(
    "non-K-major operands",
    f"bf16/fp16/fp32 operands that are not K-major ({_along_mn_words()}) need their contiguous dim to be a "
    "multiple of the K multiple too (16-byte vectors); MXFP8 operands read from columnwise storage "
    f"({_along_mn_words()}) need it a multiple of {MX_MN_VECTOR}",
)
def _non_k_major(c: Case) -> Iterator[Reason]:
    """Operands read along M or N (READS_ROWWISE False; FP8 reads its K-major transpose) need full vectors there."""
    p = c.problem
    if not c.judged or _empty(p):
        return
    assert c.row is not None  # judged
    a_rowwise, b_rowwise = READS_ROWWISE[p.layout]
    if not p.a.format.is_fp8 and not a_rowwise:
        vec = MX_MN_VECTOR if p.a.format.is_mx else c.row.k_multiple
        if p.n % vec:
            yield Reason(
                ReasonCode.ALIGNMENT, f"N={p.n} is not a multiple of {vec} (A is read N-major in {p.layout.value})", "n"
            )
    if not p.b.format.is_fp8 and not b_rowwise:
        vec = MX_MN_VECTOR if p.b.format.is_mx else c.row.k_multiple
        if p.m % vec:
            yield Reason(
                ReasonCode.ALIGNMENT, f"M={p.m} is not a multiple of {vec} (B is read M-major in {p.layout.value})", "m"
            )


def _storage_words(rowwise: str, other: str, possessive: str) -> str:
    """Which storage each layout reads, from READS_ROWWISE: ``NN reads A's transpose and B's data``."""
    pick = {True: rowwise, False: other}
    return "; ".join(
        f"{lay.value} reads A{possessive} {pick[a]} and B{possessive} {pick[b]}"
        for lay, (a, b) in READS_ROWWISE.items()
    )


def _storage(c: Case, is_kind: Callable[[Format], bool], rowwise: str, other: str) -> Iterator[Reason]:
    """An operand of this kind that lacks the storage its layout reads (READS_ROWWISE)."""
    p = c.problem
    if not c.judged:
        return
    for name, op, reads_rowwise in zip(("A", "B"), (p.a, p.b), READS_ROWWISE[p.layout], strict=True):
        if is_kind(op.format) and not (op.rowwise if reads_rowwise else op.columnwise):
            yield Reason(
                ReasonCode.LAYOUT,
                f"{p.layout.value} reads {name}'s {rowwise if reads_rowwise else other} storage, which this operand "
                "lacks",
                f"{name.lower()}_storage",
            )


@rule(
    "fp8 storage",
    "FP8 operands are read K-major (the data or TE's stored transpose): " + _storage_words("data", "transpose", "'s"),
)
def _fp8_storage(c: Case) -> Iterator[Reason]:
    yield from _storage(c, lambda f: f.is_fp8, "data", "transpose")


@rule("mxfp8 storage", _storage_words("rowwise", "columnwise", ""))
def _mx_storage(c: Case) -> Iterator[Reason]:
    yield from _storage(c, lambda f: f.is_mx, "rowwise", "columnwise")


@rule(
    "compiled kernels",
    f"the {' and '.join(COMPILED_EXECUTORS)} executors run a GEMM only where its row's backed list names its "
    "layout, result dtype and epilogue (a compiled gfx950 kernel backs it); the reference executor runs every "
    "row",
)
def _compiled(c: Case) -> Iterator[Reason]:
    p = c.problem
    # Claimed only when nothing else declined: KERNEL means "allowed, but not compiled yet".
    if not c.judged or c.executor not in COMPILED_EXECUTORS or c.found:
        return
    assert c.row is not None  # judged
    res = p.result_dtype  # with an output quantizer the kernel writes the unquantized result
    if not c.row.is_backed(p.layout, res, p.epilogue):
        yield Reason(
            ReasonCode.KERNEL,
            f"no compiled gfx950 kernel backs {c.row.kernel} {p.layout.value} -> {res.value} with epilogue "
            f"{p.epilogue} yet",
            "kernel",
        )


@rule(
    "fused epilogues on gfx950",
    "compiled where TE issues them (a row's backed list): bias / gelu / bias_gelu with the output in the "
    "operands' dtype (bf16, fp16, fp32), dgelu / dgelu_bgrad likewise for bf16 / fp16, and for FP8 (E4M3 "
    "fprop; E4M3 or E5M2 gradients) and MXFP8 into bf16 / fp16; bgrad for bf16 / fp16 / fp32 into the same "
    "dtype or fp32; the GELU pre-activation in the output dtype; bias gradients deterministic (fixed-order "
    "reductions)",
)
def _fused_gelu(c: Case) -> Iterator[Reason]:
    p = c.problem
    res = p.result_dtype
    if c.judged and c.executor in COMPILED_EXECUTORS and p.gelu and p.aux_dtype not in (None, res):
        assert p.aux_dtype is not None
        yield Reason(
            ReasonCode.KERNEL,
            f"the compiled kernels keep the GELU pre-activation in the output dtype ({res.value}); "
            f"this one is {p.aux_dtype.value}",
            "gelu_in",
        )


SPLIT_ACCUMULATOR = Rule("use_split_accumulator", "honoured: kernels always accumulate in fp32 across the whole K")
WORKSPACE = Rule("workspace", "not needed: FlyDSL kernels use no cuBLAS workspace")


@rule(
    "contiguity",
    f"operands must be contiguous (TE's storages are) and every storage must start on a {OPERAND_ALIGN}-byte "
    f"boundary of its storage (storage offset); a given D must be contiguous and start on a multiple of {OUT_VEC} "
    "elements; bias and gelu_in must be contiguous; others are declined",
)
def _contiguity(c: Case) -> Iterator[Reason]:
    p = c.problem
    if not p.a.contiguous or not p.b.contiguous:
        yield Reason(ReasonCode.ALIGNMENT, "operands must be contiguous", "contiguous")
    for name, op in (("A", p.a), ("B", p.b)):
        if op.align < OPERAND_ALIGN:
            yield Reason(
                ReasonCode.ALIGNMENT,
                f"operand {name} starts on a {op.align}-byte boundary (its storage offset); the kernels' "
                f"vector loads need {OPERAND_ALIGN}",
                f"{name.lower()}_align",
            )
    if p.out_given and not p.out_contiguous:
        yield Reason(ReasonCode.ALIGNMENT, "a given D must be contiguous", "out")
    if p.out_given and p.out_align < OUT_VEC * max(p.out_dtype.itemsize, 1):
        yield Reason(ReasonCode.ALIGNMENT, f"a given D must start on a multiple of {OUT_VEC} elements", "out")
    if not p.epilogue_contiguous:
        yield Reason(ReasonCode.ALIGNMENT, "bias and gelu_in must be contiguous", "epilogue")


# The order check applies them in (and the docs list them in): KERNEL is given only when no rule before
# it declined, so the rules it follows come first.
RULES: tuple[Rule, ...] = (
    _consistent,
    _arch,
    _devices,
    _formats,
    _layouts,
    _output,
    ALPHA_BETA,
    _epilogues,
    _output_quantizer,
    _comm_overlap,
    _size,
    _shapes,
    _non_k_major,
    _fp8_storage,
    _mx_storage,
    _compiled,
    _fused_gelu,
    SPLIT_ACCUMULATOR,
    WORKSPACE,
    _contiguity,
)


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    return Capabilities(
        backend="flydsl",
        archs=ARCHS,
        rows=_rows(_backed()),
        layouts=LAYOUTS,
        out_dtypes=OUT_FORMATS,
        epilogues=tuple(EPILOGUE_LAYOUTS.items()),
        rules=tuple((r.topic, r.text) for r in RULES),
    )
