"""The Transformer Engine seam: TE's tensor classes as operand views, and the ``generic_gemm`` patch.

Every TE module's GEMM ends in one call, ``transformer_engine_torch.generic_gemm(...)``, looked up as a
module attribute at call time (``general_gemm`` in ``transformer_engine/pytorch/cpp_extensions/gemm.py``).
Replacing that one attribute with :func:`te_flydsl_plugin.wrap_generic_gemm` routes every GEMM of an
unmodified TE script through the plugin, and restoring it undoes everything. Nothing else in TE is
touched, with one exception: a ROCm TE build with its own in-tree FlyDSL path reads the same
``NVTE_GEMM_BACKEND`` variable through ``get_gemm_backend()`` and would take the call before it
reaches ``generic_gemm``; while the plugin is installed that getter answers what it answers for
``NVTE_GEMM_BACKEND=default`` (see :func:`active_path`).

The adapters registered here turn TE's storages into the plugin's own descriptors by reference:
no copy, no GPU sync, no environment read per call. Anything the plugin does not model (NVFP4,
blockwise FP8, hybrid/debug wrappers, grouped tensors, future classes) becomes
:class:`~te_flydsl_plugin.host.operands.Unsupported` with the class named in the reason, never an
exception. ``docs/te-seam.md`` holds the argument-by-argument table.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ..operands import Fp8Operand, MXFP8Operand, OutputQuantizer
from ..spec import Format, QuantizerSpec
from . import operands

TEX_MODULE = "transformer_engine_torch"
GEMM_MODULE = "transformer_engine.pytorch.cpp_extensions.gemm"
IN_TREE_FLYDSL_MODULE = "transformer_engine.pytorch.flydsl_kernels"
IN_TREE_GETTER = "get_gemm_backend"
NATIVE_ATTR = "__te_flydsl_native__"  # set by wrap_generic_gemm on its wrapper: the wrapped callable

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


def make_fp8_view(fp8_formats: dict[int, Format]) -> Callable[[Any], operands.View]:
    """The adapter for ``Float8TensorStorage`` / ``Float8Tensor`` (per-tensor scaled FP8).

    ``_data`` may be None (TE's wgrad input keeps only the transpose), ``_transpose`` counts only
    when ``_transpose_invalid`` is False: a stale transpose is never offered to a kernel.
    ``fp8_formats`` maps the integer value of TE's FP8 DType members to formats.
    """

    def fp8_view(t: Any) -> operands.View:
        fmt = fp8_formats.get(int(t._fp8_dtype))
        if fmt is None:
            return operands.Unsupported(Format.OTHER, _shape_of(t), f"{_class_name(t)} with fp8 dtype {t._fp8_dtype!r}")
        data = t._data
        transpose = t._transpose
        transpose_valid = transpose is not None and not t._transpose_invalid
        if data is None and not transpose_valid:
            return operands.Unsupported(fmt, (), f"{_class_name(t)} holds neither _data nor a valid _transpose")
        if t._scale_inv is None:
            return operands.Unsupported(fmt, _shape_of(t), f"{_class_name(t)} has no _scale_inv")
        return Fp8Operand(
            data=data,
            transpose=transpose if transpose_valid else None,
            scale_inv=t._scale_inv,
            format=fmt,
            transpose_valid=transpose_valid,
        )

    return fp8_view


def make_mxfp8_view(fp8_formats: dict[int, Format]) -> Callable[[Any], operands.View]:
    """The adapter for ``MXFP8TensorStorage`` / ``MXFP8Tensor`` (E8M0 scales, block 32).

    A direction counts only when both its data and its scales are present. Scales already swizzled
    for cuBLAS (``_with_gemm_swizzled_scales``) are not the compact, padded layout the plan reads,
    so such a storage is declined rather than misread.
    """

    def mxfp8_view(t: Any) -> operands.View:
        fp8 = fp8_formats.get(int(t._fp8_dtype))
        if fp8 is None:
            return operands.Unsupported(Format.OTHER, _shape_of(t), f"{_class_name(t)} with fp8 dtype {t._fp8_dtype!r}")
        fmt = _FP8_TO_MX[fp8]
        if getattr(t, "_with_gemm_swizzled_scales", False):
            return operands.Unsupported(
                fmt,
                _shape_of(t),
                f"{_class_name(t)} holds scales swizzled for cuBLAS, not the compact layout",
            )
        rd, rs = t._rowwise_data, t._rowwise_scale_inv
        cd, cs = t._columnwise_data, t._columnwise_scale_inv
        if (rd is not None and rs is None) or (cd is not None and cs is None):
            return operands.Unsupported(fmt, _shape_of(t), f"{_class_name(t)} has data without its scales")
        if rd is None and cd is None:
            return operands.Unsupported(fmt, (), f"{_class_name(t)} holds no rowwise or columnwise data")
        return MXFP8Operand(
            rowwise_data=rd,
            rowwise_scale_inv=rs if rd is not None else None,
            columnwise_data=cd,
            columnwise_scale_inv=cs if cd is not None else None,
            format=fmt,
        )

    return mxfp8_view


def make_unsupported_view(fmt: Format, why: str) -> Callable[[Any], operands.View]:
    """An adapter that declines every instance of a class, with ``why`` and the class named."""

    def unsupported_view(t: Any) -> operands.View:
        return operands.Unsupported(fmt, _shape_of(t), f"{_class_name(t)}: {why}")

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
            operands.register_dtype(member, fmt)
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
    for module, name, view in (
        (
            "transformer_engine.pytorch.tensor.storage.float8_tensor_storage",
            "Float8TensorStorage",
            make_fp8_view(fp8_formats),
        ),
        (
            "transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage",
            "MXFP8TensorStorage",
            make_mxfp8_view(fp8_formats),
        ),
        *((m, n, make_unsupported_view(f, why)) for m, n, f, why in _UNSUPPORTED_CLASSES),
        *((m, n, make_quantizer_view(tex, fp8_formats, scaling)) for m, n, scaling in _QUANTIZER_CLASSES),
    ):
        cls = _optional(module, name)
        if cls is not None:
            key = _quantizer_key if any(name == q for _, q, scaling in _QUANTIZER_CLASSES if scaling) else None
            operands.register(cls, view, key)
            done.append(name)
    return done


@dataclass
class _State:
    """What install() changed, so uninstall() can put exactly that back."""

    tex: ModuleType
    native: Callable[..., Any]
    wrapper: Callable[..., Any]
    getters: list[tuple[dict[str, Any], Any]] = field(default_factory=list)  # (namespace, original)


_lock = threading.RLock()
_state: _State | None = None
_types_registered = False


def install() -> bool:
    """Route ``transformer_engine_torch.generic_gemm`` through the plugin; True if this call did it.

    Idempotent (a second call is a no-op returning False), thread-safe, and reversible with
    :func:`uninstall`. Imports ``transformer_engine.pytorch`` if TE is not loaded yet. Raises
    ImportError when TE is not installed. Creates the process's dispatcher unless one exists, so the
    settings are read and checked here: a setting naming something nonexistent raises
    :class:`~te_flydsl_plugin.spec.SettingsError` and nothing is patched.
    """
    global _state, _types_registered
    from . import dispatch
    from .wrapper import wrap_generic_gemm

    with _lock:
        tex = _load_tex()
        dispatch.current()
        current = tex.generic_gemm
        if _state is not None and current is _state.wrapper:
            return False
        if hasattr(current, NATIVE_ATTR):
            # Our wrapper from an earlier import of this module (reload): adopt it instead of nesting.
            _state = _State(tex, getattr(current, NATIVE_ATTR), current)
            _state.getters = _neutralise_in_tree_getter()
            return False
        if not _types_registered:
            register_te_types(tex)
            _types_registered = True
        wrapper = wrap_generic_gemm(current)
        state = _State(tex, current, wrapper)
        tex.generic_gemm = wrapper
        state.getters = _neutralise_in_tree_getter()
        _state = state
        return True


def _load_tex() -> ModuleType:
    """TE's extension module. TE loads it by file location (not through ``sys.path``), so when it is
    not loaded yet, importing ``transformer_engine.pytorch`` is what loads it."""
    tex = sys.modules.get(TEX_MODULE)
    if tex is None:
        try:
            importlib.import_module("transformer_engine.pytorch")
            tex = sys.modules.get(TEX_MODULE) or importlib.import_module(TEX_MODULE)
        except ImportError as exc:  # the one line a user needs, not TE's import chain
            raise ImportError(_missing_te(exc)) from None
    return tex


def _missing_te(exc: ImportError) -> str:
    """Why TE cannot be loaded, in one line: not installed, or installed but failing to import."""
    head = "te_flydsl_plugin.install(): Transformer Engine for PyTorch"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "transformer_engine":
        return f"{head} is not installed (no module {exc.name!r}); install transformer_engine[pytorch] first"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{head} is installed but does not import ({type(exc).__name__}: {first})"


def uninstall() -> bool:
    """Put TE's ``generic_gemm`` (and any in-tree backend getter) back; True if this call did it.

    If something else replaced ``generic_gemm`` after the plugin did, that replacement is left in
    place (with a warning): restoring over it would silently drop someone else's patch.
    """
    global _state
    with _lock:
        state = _state
        if state is None:
            return False
        for namespace, original in state.getters:
            namespace[IN_TREE_GETTER] = original
        if state.tex.generic_gemm is state.wrapper:
            state.tex.generic_gemm = state.native
        else:
            warnings.warn(
                "[te-flydsl-plugin] transformer_engine_torch.generic_gemm was replaced by someone else "
                "after the plugin installed; leaving that replacement in place",
                RuntimeWarning,
                stacklevel=2,
            )
        _state = None
        return True


def is_installed() -> bool:
    """Whether TE's ``generic_gemm`` currently is the plugin's wrapper (never imports TE)."""
    state = _state
    tex = sys.modules.get(TEX_MODULE)
    return state is not None and tex is not None and getattr(tex, "generic_gemm", None) is state.wrapper


@contextmanager
def installed() -> Iterator[None]:
    """Context manager: the plugin installed inside, the previous state restored after (tests, tools)."""
    did = install()
    try:
        yield
    finally:
        if did:
            uninstall()


def _neutralise_in_tree_getter() -> list[tuple[dict[str, Any], Any]]:
    """Make a ROCm TE's ``get_gemm_backend()`` answer as for ``NVTE_GEMM_BACKEND=default``.

    Patched wherever a loaded ``transformer_engine`` module holds the same getter object (general_gemm
    resolves it from its module's globals at call time). The answer is computed once, from the
    unwrapped getter with the variable set to ``default``, so its type (string or enum) is TE's own.
    Returns (namespace, original) pairs for uninstall; empty on TE builds without the getter.
    """
    gemm = sys.modules.get(GEMM_MODULE)
    if gemm is None:
        try:
            gemm = importlib.import_module(GEMM_MODULE)
        except ImportError:
            return []
    getter = getattr(gemm, IN_TREE_GETTER, None)
    if not callable(getter):
        return []
    answer = _default_answer(getter)

    def get_gemm_backend(*_args: Any, **_kwargs: Any) -> Any:
        """te-flydsl-plugin is installed: TE's in-tree GEMM backends stand aside for it."""
        return answer

    patched: list[tuple[dict[str, Any], Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformer_engine") or module is None:
            continue
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and namespace.get(IN_TREE_GETTER) is getter:
            patched.append((namespace, getter))
            namespace[IN_TREE_GETTER] = get_gemm_backend
    return patched


def _default_answer(getter: Callable[..., Any]) -> Any:
    """What ``getter`` returns with ``NVTE_GEMM_BACKEND=default`` (bypassing an lru_cache)."""
    raw = getattr(getter, "__wrapped__", getter)
    saved = os.environ.get("NVTE_GEMM_BACKEND")
    os.environ["NVTE_GEMM_BACKEND"] = "default"
    try:
        return raw()
    finally:
        if saved is None:
            del os.environ["NVTE_GEMM_BACKEND"]
        else:
            os.environ["NVTE_GEMM_BACKEND"] = saved


def active_path() -> dict[str, Any]:
    """Which code path TE's GEMMs take right now, for ``doctor`` (never imports TE).

    ``path`` is ``"plugin"`` (generic_gemm is the plugin's wrapper), ``"te-in-tree"`` (a ROCm TE's
    in-tree ``get_gemm_backend()`` is live and answers something other than ``default``, so its own
    FlyDSL/Triton path takes GEMMs before generic_gemm), ``"te"`` (TE's own generic_gemm), or
    ``"te-not-loaded"``.
    """
    tex = sys.modules.get(TEX_MODULE)
    gemm = sys.modules.get(GEMM_MODULE)
    te = sys.modules.get("transformer_engine")
    getter = getattr(gemm, IN_TREE_GETTER, None) if gemm is not None else None
    neutralised = _state is not None and bool(_state.getters)
    in_tree: dict[str, Any] = {
        "getter_present": getter is not None,
        "neutralised": neutralised,
        "flydsl_kernels_module": _module_exists(IN_TREE_FLYDSL_MODULE) if te is not None else False,
    }
    routes_in_tree = False
    if getter is not None and not neutralised:
        try:
            answer, default = getter(), _default_answer(getter)
        except Exception as exc:  # doctor reports; it never fails because TE's getter did
            in_tree["answer"] = f"get_gemm_backend() raised {type(exc).__name__}: {exc}"
        else:
            in_tree["answer"] = repr(answer)
            routes_in_tree = answer != default
    if tex is None:
        path = "te-not-loaded"
    elif is_installed():
        path = "plugin"
    elif routes_in_tree:
        path = "te-in-tree"
    else:
        path = "te"
    return {
        "path": path,
        "transformer_engine": getattr(te, "__version__", None) if te is not None else None,
        "plugin_installed": is_installed(),
        "in_tree": in_tree,
    }


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
