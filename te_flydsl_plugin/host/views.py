"""From whatever object a GEMM call passes to an operand view the host and backends understand.

A view is a ``torch.Tensor``, an :class:`~te_flydsl_plugin.operands.Fp8Operand`, an
:class:`~te_flydsl_plugin.operands.MXFP8Operand`, or :class:`Unsupported` (an operand no backend
handles: NVFP4, blockwise FP8, an unknown wrapper). Framework seams register converters for their
tensor classes (TE's are registered by ``host/te.py``); lookups are by exact type first, then by MRO,
and cached, so the per-call cost is one dict lookup plus the converter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..dtypes import FORMAT_OF_TORCH
from ..operands import Fp8Operand, InvalidOperand, MXFP8Operand, OutputQuantizer
from ..spec import Format, OperandSpec, QuantizerSpec


class Unsupported(NamedTuple):
    """An operand no backend can take; ``detail`` says what it was."""

    format: Format
    shape: tuple[int, ...]
    detail: str


View = torch.Tensor | Fp8Operand | MXFP8Operand | Unsupported
Converter = Callable[[Any], View]

# torch's dtypes (dtypes.py), framework dtypes the seams register, and Formats, which name themselves so
# callers without torch or TE dtypes (the CLI) can pass them directly.
DTYPE_FORMATS: dict[Any, Format] = {**FORMAT_OF_TORCH, **{f: f for f in Format}}
_converters: dict[type, Converter] = {}
_lock = threading.Lock()


def _identity(x: Any) -> View:
    return x


# The tensor classes whose metadata the host reads as is (a subclass, e.g. TE's quantized Float8Tensor,
# may hold bytes that are not its values).
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def strided(t: torch.Tensor) -> bool:
    """Whether ``t`` has the sizes, strides and start a GEMM operand is read by (not sparse, not nested)."""
    return t.layout is torch.strided and not t.is_nested


def _plain(t: torch.Tensor) -> View:
    if strided(t):
        return t
    kind = "a nested" if t.is_nested else f"a {t.layout}"
    return Unsupported(Format.OTHER, (), f"{kind} tensor: no GEMM backend reads its layout")


for _cls in PLAIN_TENSORS:
    _converters[_cls] = _plain
for _cls in (Fp8Operand, MXFP8Operand, OutputQuantizer, Unsupported):
    _converters[_cls] = _identity


def register(cls: type, to_view: Converter, key: Callable[[Any], Any] | None = None) -> None:
    """Teach the host a tensor (or quantizer) class: ``to_view(obj)`` must be cheap (no sync, no copy,
    no env). ``key(obj)``, for a quantizer class: a cheap hashable of every attribute ``to_view`` reads
    (the verdict cache keys a call by it instead of building the descriptor per call)."""
    with _lock:
        _converters[cls] = to_view
        if key is not None:
            _quantizer_keys[cls] = key
        # Forget MRO-derived entries: a new registration may be more specific for some subclass.
        for k in [k for k, v in _converters.items() if getattr(v, "_derived", False)]:
            del _converters[k]


def register_dtype(value: Any, fmt: Format) -> None:
    """Name a framework dtype value (e.g. TE's ``tex.DType.kBFloat16``) as a Format."""
    DTYPE_FORMATS[value] = fmt


def format_of_dtype(value: Any) -> Format:
    """The Format of a torch dtype or a registered framework dtype; ``OTHER`` when unknown."""
    try:
        return DTYPE_FORMATS.get(value, Format.OTHER)
    except TypeError:  # unhashable
        return Format.OTHER


def _shape_of(x: Any) -> tuple[int, ...]:
    """``x.shape`` as ints where it has one that reads as such, else ``()``."""
    try:
        return tuple(int(s) for s in getattr(x, "shape", ()))
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a nested tensor has no sizes
        return ()


def _unknown(x: Any) -> View:
    return Unsupported(
        Format.OTHER, _shape_of(x), f"unrecognised operand type {type(x).__module__}.{type(x).__qualname__}"
    )


def view(x: Any) -> View:
    """The view of one operand; never raises for an unknown class or contradicting fields (Unsupported).

    A converter builds a descriptor, which validates itself at construction: a framework tensor whose
    fields contradict each other (bf16 bytes in an FP8 tensor, too few MXFP8 scales) is declined with
    the descriptor's own words instead of computing with them.
    """
    conv = _converters.get(type(x))
    if conv is None:
        conv = _resolve(type(x))
    try:
        return conv(x)
    except InvalidOperand as exc:
        return Unsupported(Format.OTHER, _shape_of(x), f"{type(x).__qualname__}: {exc}")


def _resolve(cls: type) -> Converter:
    found: Converter = _unknown
    for base in cls.__mro__[1:]:
        if base in _converters and not getattr(_converters[base], "_derived", False):
            found = _converters[base]
            break

    def derived(x: Any, _f: Converter = found) -> View:
        return _f(x)

    derived._derived = True  # type: ignore[attr-defined]
    with _lock:
        _converters[cls] = derived
    return derived


def spec_of(v: View) -> OperandSpec:
    """Metadata of a view, for the GemmProblem (shapes, formats, storages, starts, devices; no data read)."""
    if isinstance(v, torch.Tensor):
        fmt = FORMAT_OF_TORCH.get(v.dtype)
        if fmt is None or fmt.is_quantized:  # a bare FP8 tensor: its scale is not with it
            detail = f"torch dtype {v.dtype}" + (" without a scale" if v.dtype.itemsize == 1 else "")
            return OperandSpec(Format.OTHER, tuple(v.shape), detail=detail, devices=(str(v.device),))
        return OperandSpec(
            fmt,
            tuple(v.shape),
            True,
            False,
            _dense(v),
            v.numel() * v.element_size(),
            align=start_align(v),
            devices=(str(v.device),),
        )
    if isinstance(v, Fp8Operand):
        stores = [t for t in (v.data, v.transpose if v.has_transpose else None) if t is not None]
        return OperandSpec(
            v.format,
            v.shape,
            rowwise=v.data is not None,
            columnwise=v.has_transpose,
            contiguous=all(_dense(t) for t in stores),
            nbytes=max(t.numel() for t in stores),
            align=start_align(*stores),
            devices=devices_of(*stores, v.scale_inv),
        )
    if isinstance(v, MXFP8Operand):
        stores = [t for t in (v.rowwise_data, v.columnwise_data) if t is not None]
        return OperandSpec(
            v.format,
            v.shape,
            rowwise=v.rowwise_data is not None,
            columnwise=v.columnwise_data is not None,
            contiguous=all(_dense(t) for t in stores),
            nbytes=max(t.numel() for t in stores),
            align=start_align(*stores),
            devices=devices_of(*stores, v.rowwise_scale_inv, v.columnwise_scale_inv),
        )
    return OperandSpec(v.format, tuple(v.shape), rowwise=False, detail=v.detail)


def _descriptor_key(q: OutputQuantizer) -> Any:
    return q.spec, q.quantize is None


_quantizer_keys: dict[type, Callable[[Any], Any]] = {OutputQuantizer: _descriptor_key}


def quantizer_key(q: Any) -> Any:
    """A cheap hashable with everything :func:`quantizer_of` depends on, for the verdict cache: the class,
    and what its registered key reads (by MRO, as converters are found); the class alone for a class no
    seam registered a key for (its descriptor depends on nothing else)."""
    cls = type(q)
    key = _quantizer_keys.get(cls)
    if key is None:
        key = next((_quantizer_keys[b] for b in cls.__mro__[1:] if b in _quantizer_keys), None)
    return (cls, key(q)) if key is not None else cls


def quantizer_of(q: Any, executable: bool = False) -> OutputQuantizer | None:
    """The descriptor of an output quantizer (None for none), through the same converters as operands:
    a class no seam registered becomes a descriptor naming it, which backends decline. ``executable``
    (a real call, not a what-if): a descriptor without a ``quantize`` function is declined the same way."""
    if q is None:
        return None
    v = view(q)
    if isinstance(v, OutputQuantizer):
        if executable and v.quantize is None:
            return OutputQuantizer(QuantizerSpec(f"{v.spec.scaling} without a quantize function", Format.OTHER))
        return v
    return OutputQuantizer(QuantizerSpec(f"unrecognised {type(q).__module__}.{type(q).__qualname__}", Format.OTHER))


def _tensor_key(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    """What a verdict may depend on of one storage: shape, contiguity, start (modulo MAX_ALIGN), device."""
    if t is None:
        return None
    return (t.shape, t.is_contiguous(), t.storage_offset() % MAX_ALIGN, t.device)


def key_of(v: View) -> tuple[Any, ...]:
    """A cheap hashable key with everything ``spec_of`` depends on (for the verdict cache)."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, *_tensor_key(v))  # type: ignore[misc]
    if isinstance(v, Fp8Operand):
        return (
            v.format,
            _tensor_key(v.data),
            _tensor_key(v.transpose) if v.has_transpose else None,
            v.scale_inv.device,
        )
    if isinstance(v, MXFP8Operand):
        return (
            v.format,
            _tensor_key(v.rowwise_data),
            _tensor_key(v.columnwise_data),
            None if v.rowwise_scale_inv is None else v.rowwise_scale_inv.device,
            None if v.columnwise_scale_inv is None else v.columnwise_scale_inv.device,
        )
    return (Unsupported, v.format, v.shape, v.detail)


# Starts are reported up to this alignment; the key holds storage offsets modulo it (in elements, which
# fixes the byte offset modulo it for every element size), so the verdict cache can tell them apart.
MAX_ALIGN = 256


def start_align(*tensors: torch.Tensor) -> int:
    """The largest power of two, up to MAX_ALIGN, dividing every tensor's start within its storage, in bytes."""
    align = MAX_ALIGN
    for t in tensors:
        start = t.storage_offset() * t.element_size() % MAX_ALIGN
        if start:
            align = min(align, start & -start)
    return align


def devices_of(*tensors: Any) -> tuple[str, ...]:
    """The distinct devices of the given tensors (None skipped), sorted."""
    return tuple(sorted({str(t.device) for t in tensors if t is not None}))


def _dense(t: torch.Tensor) -> bool:
    """Whether the plan can flatten ``t`` to 2-D without a copy (torch caches this flag)."""
    return t.is_contiguous()
