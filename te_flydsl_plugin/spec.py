"""The contract shared by the host and every GEMM backend.

Everything here is plain data or a typing protocol: the host (``te_flydsl_plugin.host``) and a backend
(``te_flydsl_plugin.flydsl`` or any third-party one) agree on these types and on nothing else. A backend
is registered through the entry-point group :data:`ENTRY_POINT_GROUP`; the object the entry point names
implements the single hook :meth:`Hookspecs.te_gemm_backends`.

Why "ask before you call": the host builds a :class:`GemmProblem` from metadata only, asks the backend's
pure :meth:`GemmBackend.check`, and either calls :meth:`GemmBackend.run` or TE's own GEMM. No exception
is ever the fallback mechanism, so a real bug inside a backend surfaces instead of being swallowed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pluggy

PROJECT = "te_gemm"
ENTRY_POINT_GROUP = "transformer_engine.gemm_backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Hookspecs:
    """The hooks a GEMM backend plugin may implement."""

    @hookspec
    def te_gemm_backends(self) -> list[GemmBackend]:  # type: ignore[empty-body]
        """Return the GEMM backend objects this plugin provides."""


class Layout(str, enum.Enum):
    """TE's GEMM layout: ``transA`` then ``transB`` as letters (row-major math in notes/te-gemm-api.md)."""

    TN = "TN"  # D = B @ A.T   (fprop)
    NN = "NN"  # D = B @ A     (dgrad)
    NT = "NT"  # D = B.T @ A   (wgrad)
    TT = "TT"  # rejected by TE itself

    @classmethod
    def of(cls, trans_a: bool, trans_b: bool) -> Layout:
        return _LAYOUTS[bool(trans_a), bool(trans_b)]


_LAYOUTS = {
    (True, False): Layout.TN,
    (False, False): Layout.NN,
    (False, True): Layout.NT,
    (True, True): Layout.TT,
}


class Format(str, enum.Enum):
    """Element format of an operand or of the output.

    ``OTHER`` stands for anything the host could not name (an unknown tensor class, fp64, ...): such an
    operand always yields a problem every backend rejects with a reason, never an exception.
    """

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    MXFP8_E4M3 = "mxfp8_e4m3"
    MXFP8_E5M2 = "mxfp8_e5m2"
    NVFP4 = "nvfp4"
    FP8_BLOCK = "fp8_block"
    OTHER = "other"

    @property
    def is_fp8(self) -> bool:
        """Per-tensor scaled FP8 (one fp32 scale_inv per tensor)."""
        return self in (Format.FP8_E4M3, Format.FP8_E5M2)

    @property
    def is_mx(self) -> bool:
        return self in (Format.MXFP8_E4M3, Format.MXFP8_E5M2)

    @property
    def is_quantized(self) -> bool:
        return self not in (Format.FP32, Format.FP16, Format.BF16)

    @property
    def itemsize(self) -> int:
        """Bytes per stored element (scales not counted); 0 where unknown."""
        return _ITEMSIZE.get(self, 0)


_ITEMSIZE = {
    Format.FP32: 4,
    Format.FP16: 2,
    Format.BF16: 2,
    Format.FP8_E4M3: 1,
    Format.FP8_E5M2: 1,
    Format.MXFP8_E4M3: 1,
    Format.MXFP8_E5M2: 1,
    Format.FP8_BLOCK: 1,
}


class ReasonCode(str, enum.Enum):
    """Why a backend declines a problem. A closed set, so reports and tests can count by code."""

    UNAVAILABLE = "UNAVAILABLE"  # the backend cannot run here at all (package, device, executor)
    ARCH = "ARCH"  # the target architecture is not one the backend supports
    FORMAT = "FORMAT"  # operand or output element format
    LAYOUT = "LAYOUT"  # layout, or the storage a layout needs is absent
    EPILOGUE = "EPILOGUE"  # bias / gelu / grad / alpha / beta / accumulate combination
    FEATURE = "FEATURE"  # output quantizer, comm overlap, other call features
    ALIGNMENT = "ALIGNMENT"  # K or leading dimensions not a multiple of what vectors need
    SIZE = "SIZE"  # shape limits (empty problems, dims past what the host can split)
    SHAPE = "SHAPE"  # inconsistent operands: TE itself raises for these, so they go to TE
    KERNEL = "KERNEL"  # the matrix has the row, but no compiled kernel backs it for this executor
    POLICY = "POLICY"  # declined by configuration (strict lists, user policy)


@dataclass(frozen=True)
class Reason:
    """One reason a problem is not supported: a stable code, words for people, the offending field."""

    code: ReasonCode
    message: str
    field: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message, "field": self.field}


@dataclass(frozen=True)
class Verdict:
    """``ok`` is True exactly when ``reasons`` is empty."""

    reasons: tuple[Reason, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls) -> Verdict:
        return _YES

    @classmethod
    def no(cls, *reasons: Reason) -> Verdict:
        if not reasons:
            raise ValueError("a negative verdict needs at least one reason")
        return cls(tuple(reasons))

    def to_dict(self) -> dict[str, Any]:
        return {"supported": self.ok, "reasons": [r.to_dict() for r in self.reasons]}


_YES = Verdict()


@dataclass(frozen=True)
class OperandSpec:
    """What the host knows about one GEMM operand, from metadata only (no GPU sync).

    ``shape`` is the logical shape TE passes (for FP8 with only a transpose stored: the shape the data
    would have). ``rowwise``/``columnwise`` say which storages exist: for a plain tensor rowwise only;
    for FP8 ``_data`` and a valid ``_transpose``; for MXFP8 the two quantized copies.
    ``nbytes`` is the size of the largest storage, for the per-launch size rules. ``align``: the
    largest power of two (bytes, up to 256) dividing every storage's start offset within its storage.
    ``devices``: where its storages and scales live (``str(tensor.device)``, sorted, each once).
    """

    format: Format
    shape: tuple[int, ...]
    rowwise: bool = True
    columnwise: bool = False
    contiguous: bool = True
    nbytes: int = 0
    detail: str = ""
    align: int = 256
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuantizerSpec:
    """What a GEMM's output quantizer asks for, as facts (the quantizer itself stays with the call).

    ``scaling``: ``"delayed"`` or ``"current"`` (per-tensor FP8: TE's ``Float8Quantizer`` and
    ``Float8CurrentScalingQuantizer``), ``"mxfp8"``, or the class name of a quantizer the plugin does not
    know. ``format``: the quantized format (``OTHER`` when unknown). ``rowwise`` / ``columnwise``: the
    usages it produces (columnwise is the FP8 transpose).
    """

    scaling: str
    format: Format
    rowwise: bool = True
    columnwise: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"scaling": self.scaling, "format": self.format.value, "rowwise": self.rowwise,
                "columnwise": self.columnwise}  # fmt: skip


@dataclass(frozen=True)
class GemmProblem:
    """One GEMM as data: frozen and hashable, so verdicts are cached per distinct problem.

    ``m``, ``n``, ``k``: output rows (all leading dims flattened), output columns, reduction length,
    derived per layout from the storage TE's layout names. ``out_shape`` is TE's output shape (batched
    B keeps its leading dims). ``beta`` is the effective beta (TE's ``None`` resolved from
    ``accumulate``).
    """

    layout: Layout
    m: int
    n: int
    k: int
    out_shape: tuple[int, ...]
    a: OperandSpec
    b: OperandSpec
    out_dtype: Format
    out_given: bool = False
    out_contiguous: bool = True
    out_align: int = 256  # D (when given): the largest power of two, up to 256, dividing its start in bytes
    out_matches: bool = True  # D (when given) has out_shape's element count and out_dtype
    bias: bool = False
    bias_dtype: Format | None = None
    bias_numel: int = 0
    epilogue_contiguous: bool = True  # bias and gelu_in (when given) are contiguous
    gelu: bool = False
    aux_dtype: Format | None = None  # the GELU pre-activation's dtype (gelu_in's, or TE's for the one returned)
    grad: bool = False
    accumulate: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    use_split_accumulator: bool = False
    output_quantizer: QuantizerSpec | None = None
    comm_overlap: bool = False
    arch: str = ""
    device_type: str = ""  # where the operands live: "cuda", "cpu", "meta"
    # Every device the call's tensors are on (operands, scales, D, bias, gelu_in), as observed; empty
    # for a what-if problem built without tensors (the CLI's check). More than one, or meta, is declined.
    devices: tuple[str, ...] = ()
    shape_error: str = ""  # non-empty when the operands are inconsistent (TE raises for these)

    @property
    def batch(self) -> tuple[int, ...]:
        """The output's leading dims beyond the GEMM's rows (batched B keeps them)."""
        return self.out_shape[:-2] if len(self.out_shape) > 2 else ()

    @property
    def result_dtype(self) -> Format:
        """The format the GEMM itself produces before an output quantizer quantizes it.

        TE's ``generic_gemm`` (gemm.cpp, 2.20) fuses the quantization into cuBLASLt only for a delayed
        scaling ``Float8Quantizer`` with a per-tensor FP8 operand: FP8 from the fp32 accumulators, so the
        result is fp32 here. Every other quantizer (current scaling, MXFP8) quantizes an unquantized
        output of ``out_dtype``, as TE's unfused path does. Without a quantizer: ``out_dtype``.
        """
        return self.result_format(self.output_quantizer, self.a.format, self.b.format, self.out_dtype)

    @staticmethod
    def result_format(quantizer: QuantizerSpec | None, a: Format, b: Format, out_dtype: Format) -> Format:
        """:attr:`result_dtype` from its inputs (the problem builder needs it before the problem exists)."""
        if quantizer is not None and quantizer.scaling == "delayed" and (a.is_fp8 or b.is_fp8):
            return Format.FP32
        return out_dtype

    @property
    def epilogue(self) -> str:
        """The fused epilogue as one name: plain, bias, gelu, bias_gelu, bgrad, dgelu, dgelu_bgrad."""
        if self.grad:
            if self.gelu:
                return "dgelu_bgrad" if self.bias else "dgelu"
            return "bgrad" if self.bias else "plain"
        if self.gelu:
            return "bias_gelu" if self.bias else "gelu"
        return "bias" if self.bias else "plain"

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (for ``check --json`` and reports)."""

        def op(o: OperandSpec) -> dict[str, Any]:
            return {
                "format": o.format.value,
                "shape": list(o.shape),
                "rowwise": o.rowwise,
                "columnwise": o.columnwise,
                "contiguous": o.contiguous,
                "nbytes": o.nbytes,
                "align": o.align,
                **({"detail": o.detail} if o.detail else {}),
            }

        return {
            "layout": self.layout.value,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "out_shape": list(self.out_shape),
            "a": op(self.a),
            "b": op(self.b),
            "out_dtype": self.out_dtype.value,
            "epilogue": self.epilogue,
            "accumulate": self.accumulate,
            "alpha": self.alpha,
            "beta": self.beta,
            "output_quantizer": None if self.output_quantizer is None else self.output_quantizer.to_dict(),
            "comm_overlap": self.comm_overlap,
            "arch": self.arch,
            "device_type": self.device_type,
            "devices": list(self.devices),
        }


@dataclass(frozen=True)
class CapabilityRow:
    """One row of a capability matrix: an operand-format pair (TE's A, TE's B) and what is backed with it.

    The layouts, output dtypes and epilogues a row may be asked for are the matrix's own
    (:class:`Capabilities`): the same for every row. ``k_multiple``: K must be a multiple of it.
    ``kernel`` names the kernel config family that backs the row on its target arch. ``backed`` lists
    the (layout, output format, epilogue) combinations for which a compiled kernel exists and passed
    its compile, ISA and emulator checks. Executors that run compiled code accept only those; the
    reference executor accepts everything the matrix allows.
    """

    a_format: Format
    b_format: Format
    k_multiple: int
    kernel: str
    backed: tuple[tuple[Layout, Format, str], ...] = ()
    notes: str = ""

    def is_backed(self, layout: Layout, out: Format, epilogue: str) -> bool:
        return (layout, out, epilogue) in self.backed

    def to_dict(self) -> dict[str, Any]:
        return {
            "a_format": self.a_format.value,
            "b_format": self.b_format.value,
            "k_multiple": self.k_multiple,
            "kernel": self.kernel,
            "backed": [{"layout": lay.value, "out_dtype": o.value, "epilogue": e} for lay, o, e in self.backed],
            "notes": self.notes,
        }


@dataclass(frozen=True)
class Capabilities:
    """A backend's capability matrix as data: the one source of truth for ``check`` and the docs.

    ``layouts`` and ``out_dtypes``: what any row may be asked for. ``epilogues``: each fused epilogue
    (:attr:`GemmProblem.epilogue`) with the layouts it is defined in. ``rules``: (topic, rule) pairs in
    words, each the text of one rule ``check`` evaluates (or states: a topic nothing is declined for).
    """

    backend: str
    archs: tuple[str, ...]
    rows: tuple[CapabilityRow, ...]
    layouts: tuple[Layout, ...] = ()
    out_dtypes: tuple[Format, ...] = ()
    epilogues: tuple[tuple[str, tuple[Layout, ...]], ...] = ()
    rules: tuple[tuple[str, str], ...] = field(default=())

    def row(self, a: Format, b: Format) -> CapabilityRow | None:
        for r in self.rows:
            if r.a_format is a and r.b_format is b:
                return r
        return None

    def epilogue_layouts(self, epilogue: str) -> tuple[Layout, ...]:
        """The layouts ``epilogue`` is defined in (none for a name the matrix does not have)."""
        return dict(self.epilogues).get(epilogue, ())

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "archs": list(self.archs),
            "layouts": [x.value for x in self.layouts],
            "out_dtypes": [x.value for x in self.out_dtypes],
            "epilogues": {e: [x.value for x in lays] for e, lays in self.epilogues},
            "rows": [r.to_dict() for r in self.rows],
            "rules": [{"topic": t, "rule": r} for t, r in self.rules],
        }


@dataclass(frozen=True)
class GemmCall:
    """The arguments of one ``generic_gemm`` call, unchanged, under TE's names.

    A backend's ``run`` must account for every field: execute it or have rejected the problem in
    ``check``. Nothing is dropped.
    """

    A: Any
    transA: bool
    B: Any
    transB: bool
    D: Any
    quantizer: Any
    output_dtype: Any
    bias: Any
    bias_type: Any
    gelu: bool
    gelu_in: Any
    grad: bool
    workspace: Any
    workspace_size: int
    accumulate: bool
    use_split_accumulator: bool
    comm_overlap: Any = None
    comm_type: Any = None
    extra_output: Any = None
    bulk_overlap: bool = False
    alpha: float = 1.0
    beta: float | None = None


class SettingsError(ValueError):
    """A setting (``NVTE_GEMM_BACKEND``, ``NVTE_FLYDSL_EXECUTOR``, ``NVTE_FLYDSL_TARGET_ARCH``, a CLI
    ``--arch``) names something that does not exist. Raised when the dispatcher is created (at install),
    so a typo fails there, once, with the one-line message, rather than at some later GEMM."""


@runtime_checkable
class GemmBackend(Protocol):
    """What the host needs from a backend. Plain objects satisfy it; no base class is required.

    Two methods are optional:

    - ``settings_errors() -> list[str]``: what is wrong with the settings it reads (its own environment
      variables); the dispatcher raises :class:`SettingsError` with them when it is created.
    - ``with_executor(name: str) -> GemmBackend``: a new backend object like this one that runs (and
      judges) with the executor ``name``, for a backend that has several (the FlyDSL backend: compiled
      kernels, emulator, torch reference). It raises :class:`SettingsError` for a name it does not have
      and leaves ``self`` unchanged: ``configure(executor=...)`` and the CLI's ``check --executor`` use
      it, so choosing an executor for one dispatcher or one question never changes the backend another
      part of the process holds.
    """

    name: str
    version: str

    def capabilities(self) -> Capabilities:
        """The capability matrix (for the CLI, docs, and the backend's own ``check``)."""
        ...

    def availability(self) -> Verdict:
        """Whether the backend can run at all here (package present, device, executor); never raises."""
        ...

    def check(self, problem: GemmProblem) -> Verdict:
        """Pure: whether ``run`` would execute ``problem`` exactly, with reasons when not. Never raises."""
        ...

    def run(self, problem: GemmProblem, call: GemmCall) -> list[Any]:
        """Execute a problem ``check`` accepted; returns ``[D, bias_grad, gelu_input, extra_output]``."""
        ...
