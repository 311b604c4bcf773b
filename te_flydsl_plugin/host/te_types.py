"""TE's tensor, quantizer and dtype classes as the plugin's own descriptors (registered by ``te.install``).

The adapters turn TE's storages into :class:`~te_flydsl_plugin.operands.Fp8Operand` /
:class:`~te_flydsl_plugin.operands.MXFP8Operand` by reference (no copy, no GPU sync, no environment read
per call) and TE's quantizers into :class:`~te_flydsl_plugin.operands.OutputQuantizer`. Anything the
plugin does not model (NVFP4, blockwise FP8, hybrid/debug wrappers, grouped tensors, future classes)
becomes :class:`~te_flydsl_plugin.host.views.Unsupported` with the class named in the reason, never an
exception. ``docs/te-seam.md`` holds the argument-by-argument table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..operands import Fp8Operand, MXFP8Operand, OutputQuantizer
from ..spec import Format, QuantizerSpec
from . import views

# TE's DType member names -> the plugin's formats (values differ between TE's pybind enum and the
# Python IntEnum mirror in transformer_engine.pytorch.constants, so both are registered by name).
DTYPE_FORMATS: dict[str, Format] = {
    "kFloat32": Format.FP32,
    "kFloat16": Format.FP16,
    "kBFloat16": Format.BF16,
    "kFloat8E4M3": Format.FP8_E4M3,
    "kFloat8E5M2": Format.FP8_E5M2,
}
_FP8_TO_MX = {Format.FP8_E4M3: Format.MXFP8_E4M3, Format.FP8_E5M2: Format.MXFP8_E5M2}

# TE tensor classes the plugin does not model: (module, class name, format, why). Registered so that
# each is declined with its own reason; QuantizedTensorStorage / QuantizedTensor come last as the
# catch-all for classes TE adds later (lookup is by MRO, so specific entries win).
_UNSUPPORTED_CLASSES: tuple[tuple[str, str, Format, str], ...] = (
    (
        "transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage",
        "NVFP4TensorStorage",
        Format.NVFP4,
        "NVFP4 (FP4 E2M1 with FP8 block scales) has no FlyDSL kernel",
    ),
    (
        "transformer_engine.pytorch.tensor.storage.float8_blockwise_tensor_storage",
        "Float8BlockwiseQTensorStorage",
        Format.FP8_BLOCK,
        "blockwise-scaled FP8 (1x128 / 128x128 scales) has no FlyDSL kernel",
    ),
    (
        "transformer_engine.pytorch.tensor.storage.hybrid_tensor_storage",
        "HybridQuantizedTensorStorage",
        Format.OTHER,
        "hybrid quantized wrapper (general_gemm normally unwraps it before generic_gemm)",
    ),
    (
        "transformer_engine.debug.pytorch.debug_quantization",
        "DebugQuantizedTensor",
        Format.OTHER,
        "debug quantized wrapper (general_gemm normally unwraps it before generic_gemm)",
    ),
    (
        "transformer_engine.pytorch.tensor.storage.identity_tensor_storage",
        "IdentityTensorStorage",
        Format.OTHER,
        "identity (pass-through) quantized storage",
    ),
    (
        "transformer_engine.pytorch.tensor.storage.grouped_tensor_storage",
        "GroupedTensorStorage",
        Format.OTHER,
        "grouped tensor (grouped GEMMs do not go through generic_gemm)",
    ),
    (
        "transformer_engine.pytorch.quantized_tensor",
        "QuantizedTensorStorage",
        Format.OTHER,
        "quantized storage class the plugin does not know",
    ),
    (
        "transformer_engine.pytorch.quantized_tensor",
        "QuantizedTensor",
        Format.OTHER,
        "quantized tensor class the plugin does not know",
    ),
)


# TE's quantizer classes -> what they do; the base class last, as the catch-all for quantizers the plugin
# does not model (block scaling, NVFP4, later ones), which become descriptors naming the class.
_QUANTIZER_CLASSES: tuple[tuple[str, str, str | None], ...] = (
    ("transformer_engine.pytorch.tensor.float8_tensor", "Float8Quantizer", "delayed"),
    ("transformer_engine.pytorch.tensor.float8_tensor", "Float8CurrentScalingQuantizer", "current"),
    ("transformer_engine.pytorch.tensor.mxfp8_tensor", "MXFP8Quantizer", "mxfp8"),
    ("transformer_engine.pytorch.quantized_tensor", "Quantizer", None),
)


def _quantizer_key(q: Any) -> tuple[Any, bool, bool]:
    """What ``make_quantizer_view``'s adapter reads of a quantizer (its FP8 dtype and usages)."""
    return int(q.dtype), bool(q.rowwise_usage), bool(q.columnwise_usage)


def _shape_of(obj: Any) -> tuple[int, ...]:
    """Logical shape of a TE storage for a rejection message; () when it cannot say."""
    try:
        return tuple(int(s) for s in obj.size())
    except Exception:  # a storage without data cannot size itself; the reason still names the class
        return ()


def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def make_fp8_view(fp8_formats: dict[int, Format]) -> Callable[[Any], views.View]:
    """The adapter for ``Float8TensorStorage`` / ``Float8Tensor`` (per-tensor scaled FP8).

    ``_data`` may be None (TE's wgrad input keeps only the transpose), ``_transpose`` counts only
    when ``_transpose_invalid`` is False: a stale transpose is never offered to a kernel.
    ``fp8_formats`` maps the integer value of TE's FP8 DType members to formats.
    """

    def fp8_view(t: Any) -> views.View:
        fmt = fp8_formats.get(int(t._fp8_dtype))
        if fmt is None:
            return views.Unsupported(Format.OTHER, _shape_of(t), f"{_class_name(t)} with fp8 dtype {t._fp8_dtype!r}")
        data = t._data
        transpose = t._transpose
        transpose_valid = transpose is not None and not t._transpose_invalid
        if data is None and not transpose_valid:
            return views.Unsupported(fmt, (), f"{_class_name(t)} holds neither _data nor a valid _transpose")
        if t._scale_inv is None:
            return views.Unsupported(fmt, _shape_of(t), f"{_class_name(t)} has no _scale_inv")
        return Fp8Operand(
            data=data,
            transpose=transpose if transpose_valid else None,
            scale_inv=t._scale_inv,
            format=fmt,
            transpose_valid=transpose_valid,
        )

    return fp8_view


def make_mxfp8_view(fp8_formats: dict[int, Format]) -> Callable[[Any], views.View]:
    """The adapter for ``MXFP8TensorStorage`` / ``MXFP8Tensor`` (E8M0 scales, block 32).

    A direction counts only when both its data and its scales are present. Scales already swizzled
    for cuBLAS (``_with_gemm_swizzled_scales``) are not the compact, padded layout the plan reads,
    so such a storage is declined rather than misread.
    """

    def mxfp8_view(t: Any) -> views.View:
        fp8 = fp8_formats.get(int(t._fp8_dtype))
        if fp8 is None:
            return views.Unsupported(Format.OTHER, _shape_of(t), f"{_class_name(t)} with fp8 dtype {t._fp8_dtype!r}")
        fmt = _FP8_TO_MX[fp8]
        if getattr(t, "_with_gemm_swizzled_scales", False):
            return views.Unsupported(
                fmt,
                _shape_of(t),
                f"{_class_name(t)} holds scales swizzled for cuBLAS, not the compact layout",
            )
        rd, rs = t._rowwise_data, t._rowwise_scale_inv
        cd, cs = t._columnwise_data, t._columnwise_scale_inv
        if (rd is not None and rs is None) or (cd is not None and cs is None):
            return views.Unsupported(fmt, _shape_of(t), f"{_class_name(t)} has data without its scales")
        if rd is None and cd is None:
            return views.Unsupported(fmt, (), f"{_class_name(t)} holds no rowwise or columnwise data")
        return MXFP8Operand(
            rowwise_data=rd,
            rowwise_scale_inv=rs if rd is not None else None,
            columnwise_data=cd,
            columnwise_scale_inv=cs if cd is not None else None,
            format=fmt,
        )

    return mxfp8_view


def make_unsupported_view(fmt: Format, why: str) -> Callable[[Any], views.View]:
    """An adapter that declines every instance of a class, with ``why`` and the class named."""

    def unsupported_view(t: Any) -> views.View:
        return views.Unsupported(fmt, _shape_of(t), f"{_class_name(t)}: {why}")

    return unsupported_view


def make_quantizer_view(
    tex: ModuleType, fp8_formats: dict[int, Format], scaling: str | None
) -> Callable[[Any], OutputQuantizer]:
    """The adapter for one of TE's quantizer classes: ``scaling`` names what it does ("delayed",
    "current", "mxfp8"; None for a class the plugin does not know, named in the descriptor).

    The descriptor's ``quantize(result, dtype)`` does what TE's ``generic_gemm`` does on its unfused path
    (gemm.cpp, 2.20): the output made by the quantizer with the nominal ``dtype``
    (``Quantizer.make_empty``, i.e. ``create_tensor``), then ``tex.quantize(result, quantizer, out)``,
    which computes amax and scale as the quantizer's recipe says and writes the transpose it asks for.
    """

    def quantizer_view(q: Any) -> OutputQuantizer:
        fp8 = fp8_formats.get(int(q.dtype)) if scaling is not None else None
        if fp8 is None:
            what = scaling or "unrecognised"
            return OutputQuantizer(QuantizerSpec(f"{what} {_class_name(q)}", Format.OTHER))
        spec = QuantizerSpec(
            scaling,  # type: ignore[arg-type]
            _FP8_TO_MX[fp8] if scaling == "mxfp8" else fp8,
            rowwise=bool(q.rowwise_usage),
            columnwise=bool(q.columnwise_usage),
        )

        def quantize(result: Any, dtype: Any) -> Any:
            out = q.make_empty(result.shape, dtype=dtype, device=result.device)
            return tex.quantize(result, q, out)

        return OutputQuantizer(spec, quantize)

    return quantizer_view


def register_dtypes(*enums: Any) -> dict[int, Format]:
    """Register every member of TE's DType enums; return the FP8 members' integer values -> format.

    Members with no GEMM meaning for the plugin (kByte, kInt32, kFloat8E8M0, kFloat4E2M1, ...) are
    registered as ``OTHER`` so an output or bias of that type is declined with a reason.
    """
    fp8: dict[int, Format] = {}
    for enum in enums:
        for name, member in _members(enum).items():
            fmt = DTYPE_FORMATS.get(name, Format.OTHER)
            views.register_dtype(member, fmt)
            if fmt.is_fp8:
                fp8[int(member)] = fmt
    return fp8


def _members(enum: Any) -> dict[str, Any]:
    """Name -> member for a pybind11 enum (``__members__``) or a Python ``enum.Enum``."""
    return dict(getattr(enum, "__members__", {}))


def _optional(module: str, name: str) -> Any:
    """``module.name`` when that TE module imports, else None (older or newer TE lacks some classes)."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def register_te_types(tex: ModuleType) -> list[str]:
    """Register TE's dtypes and tensor classes with the host; returns the class names registered."""
    constants = _optional("transformer_engine.pytorch.constants", "DType")
    fp8_formats = register_dtypes(*(e for e in (tex.DType, constants) if e is not None))
    done: list[str] = []
    # (module, class, adapter, verdict-cache key of what the adapter reads; None: the class alone)
    for module, name, view, key in (
        (
            "transformer_engine.pytorch.tensor.storage.float8_tensor_storage",
            "Float8TensorStorage",
            make_fp8_view(fp8_formats),
            None,
        ),
        (
            "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage",
            "MXFP8TensorStorage",
            make_mxfp8_view(fp8_formats),
            None,
        ),
        *((m, n, make_unsupported_view(f, why), None) for m, n, f, why in _UNSUPPORTED_CLASSES),
        *(
            (m, n, make_quantizer_view(tex, fp8_formats, scaling), _quantizer_key if scaling else None)
            for m, n, scaling in _QUANTIZER_CLASSES
        ),
    ):
        cls = _optional(module, name)
        if cls is not None:
            views.register(cls, view, key)
            done.append(name)
    return done
