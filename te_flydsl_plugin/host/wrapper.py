"""``wrap_generic_gemm(native)``: TE's ``generic_gemm`` with the plugin's dispatch in front.

The wrapper has ``transformer_engine_torch.generic_gemm``'s exact signature and return value. On the
hot path it builds a cheap key from operand metadata, finds the cached decision, and either runs the
backend or forwards the call to ``native`` exactly as it came (same positional and keyword
arguments). The full :class:`GemmProblem` is built only when a key is new. The key holds everything
the problem is derived from, so a cached decision is always the decision for this call.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..device import arch_of
from ..spec import GemmCall, Reason, ReasonCode
from . import dispatch, hotpath, problem, signature, views
from .signature import TAIL_KEYWORDS

_PLAIN = views.PLAIN_TENSORS  # a module global: the hot path reads it without an attribute lookup
_ALIGN = views.MAX_ALIGN


def _storage_tensor(v: Any) -> Any:
    """A tensor of an operand view, to learn its device."""
    if isinstance(v, torch.Tensor):
        return v
    for name in ("data", "transpose", "rowwise_data", "columnwise_data"):
        t = getattr(v, name, None)
        if t is not None:
            return t
    return None


def _device(v: Any) -> tuple[str, int | None]:
    t = _storage_tensor(v)
    return (t.device.type, t.device.index) if t is not None else ("cpu", None)


def wrap_generic_gemm(native: Callable[..., Any], *, compiled: bool | None = None) -> Callable[..., Any]:
    """Return ``generic_gemm`` dispatching through the current dispatcher, falling back to ``native``.

    ``compiled``: None (the default) takes the compiled decision path where this install has it
    (``host/hotpath.py``), else the Python one; True insists on it (RuntimeError naming why it is not
    here); False takes the Python path. Both decide every call the same way: the compiled one hands each
    call it does not recognise, and each key it sees first, to the Python code below.
    """
    python_path = _python_wrapper(native)
    if compiled is False or (compiled is None and hotpath.MODULE is None):
        if compiled is None and hotpath.BROKEN:
            warnings.warn(f"[te-flydsl-plugin] the compiled decision path {hotpath.WHY_NOT}", RuntimeWarning,
                          stacklevel=2)  # fmt: skip
        return python_path
    if hotpath.MODULE is None:
        raise RuntimeError(f"the compiled decision path is {hotpath.WHY_NOT}")
    fast = hotpath.MODULE.Wrapper(
        native, python_path, _decide, _run, vars(dispatch), _PLAIN, views.DTYPE_FORMATS, signature.REQUIRED,
        signature.TAIL, tuple(signature.DEFAULTS.values()), _ALIGN,
    )  # fmt: skip
    functools.update_wrapper(fast, native)
    fast.__te_flydsl_native__ = native
    return fast


def _python_wrapper(native: Callable[..., Any]) -> Callable[..., Any]:
    """The decision path in Python: the definition the compiled one (``_hotpath.cpp``) defers to."""

    @functools.wraps(native)
    def generic_gemm(*args: Any, **kwargs: Any) -> Any:
        d = dispatch._current or dispatch.current()
        if d.passthrough:
            if d.backend is not None:
                d.ran_unavailable()
            return native(*args, **kwargs)
        decision, state = _lookup(d, args, kwargs)
        if decision.ok:
            out = _execute(d, decision, *state)
            decision.tally.hit()
            return out
        decision.tally.hit()
        if decision.loud:
            d.declined(decision)
        return native(*args, **kwargs)

    generic_gemm.__te_flydsl_native__ = native  # type: ignore[attr-defined]
    return generic_gemm


def _lookup(d: dispatch.Dispatcher, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dispatch.Decision, Any]:
    """The call's cached Decision (``d.decide`` runs ``check`` once per new key) and what running it needs."""
    # TE passes sixteen positionals and the tail by keyword; anything else is bound as TE's binding
    # would bind it (TypeError where TE raises one), read only, and forwarded as it came. Arguments
    # TE 2.20 has not are TE's to judge: such a call is declined (host.signature).
    unknown: tuple[str, ...] = ()
    if len(args) == 16 and kwargs.keys() <= TAIL_KEYWORDS:  # a set view: no set is built
        required, get = args, kwargs.get
    else:
        required, tail, unknown = signature.bind(args, kwargs)
        get = tail.get
    A, transA, B, transB, D, quantizer, output_dtype, bias, _, gelu, gelu_in, grad, _, _, accumulate, _ = required
    comm, ctype, extra = get("comm_overlap"), get("comm_type"), get("extra_output")
    bulk, alpha, beta = get("bulk_overlap", False), get("alpha", 1.0), get("beta")
    # The key holds everything a verdict depends on: per operand its view's key (a plain tensor's dtype,
    # shape, contiguity, start modulo _ALIGN and device: _operand), the flags.
    va, ka = _operand(A)
    vb, kb = _operand(B)
    # An output quantizer is keyed by what its descriptor is built from; the descriptor is built only
    # to decide or to run.
    qkey = None if quantizer is None else views.quantizer_key(quantizer)
    # D, bias and gelu_in are keyed only when given (TE passes them rarely): a shorter key hashes and
    # compares faster. One that is not a tensor is keyed by its type; the problem declines it (SHAPE).
    if D is None and bias is None and gelu_in is None:
        rest = None
    else:
        rest = (_extra_key(D, True), _extra_key(bias, False), _extra_key(gelu_in, False))
    key = (
        ka, kb, transA, transB, output_dtype, gelu, grad, accumulate,
        qkey, comm is None and ctype is None and extra is None, bulk, alpha, beta, rest,
    )  # fmt: skip
    if unknown:
        key = (key, unknown)
    tail_values = (comm, ctype, extra, bulk, alpha, beta)
    decision = d.cache.get(key)
    vq = None
    if decision is None:
        vq = views.quantizer_of(quantizer, executable=True)
        dev = _device(vb)
        arch = d.settings.target_arch or arch_of(*dev)
        call = _call(va, vb, vq, required, tail_values)
        p = problem.build(call, views.spec_of(va), views.spec_of(vb), arch, dev[0])
        decision = d.decide(key, p, _unknown_reason(unknown) if unknown else None)
    return decision, (va, vb, quantizer, vq, required, tail_values)


def _operand(x: Any) -> tuple[Any, tuple[Any, ...]]:
    """An operand's view and its key. A plain tensor is its own view, keyed by its metadata; a sparse or
    nested one has no strides to read (RuntimeError) and is viewed (as Unsupported) and keyed like any
    other object, by ``views.key_of``."""
    if type(x) in _PLAIN:
        try:
            return x, (x.dtype, x.shape, x.is_contiguous(), x.storage_offset() % _ALIGN, x.device)
        except RuntimeError:
            pass
    v = views.view(x)
    return v, (views.key_of(v),)


def _execute(d: dispatch.Dispatcher, decision: dispatch.Decision, va: Any, vb: Any, quantizer: Any, vq: Any,
             required: tuple[Any, ...], tail_values: tuple[Any, ...]) -> Any:  # fmt: skip
    """Run a call its Decision accepted on the backend; ``vq``: the quantizer's descriptor where the lookup
    built one (it decided), else None and built here."""
    vq = vq or views.quantizer_of(quantizer, executable=True)
    return d.backend.run(decision.problem, _call(va, vb, vq, required, tail_values))


def _decide(d: dispatch.Dispatcher, *args: Any, **kwargs: Any) -> dispatch.Decision:
    """The compiled path's question for a key it sees first: this call's Decision (nothing runs)."""
    return _lookup(d, args, kwargs)[0]


def _run(d: dispatch.Dispatcher, decision: dispatch.Decision, *args: Any, **kwargs: Any) -> Any:
    """The compiled path's run of an accepted call; it takes only calls of sixteen positionals, the tail
    by keyword, plain tensors and no output quantizer, which are their own views."""
    get = kwargs.get
    tail_values = (get("comm_overlap"), get("comm_type"), get("extra_output"), get("bulk_overlap", False),
                   get("alpha", 1.0), get("beta"))  # fmt: skip
    return _execute(d, decision, args[0], args[2], args[5], None, args, tail_values)


def _extra_key(t: Any, start: bool) -> Any:
    """The key of D (``start``: its storage offset counts), bias or gelu_in: what the problem reads of it.
    None, a non-tensor or a tensor subclass (a quantized D) is keyed by its type; the problem declines it."""
    if type(t) not in _PLAIN:
        return type(t)
    if not views.strided(t):  # sparse, nested: the problem declines it (problem._not_tensors)
        return type(t), t.layout, t.is_nested
    if start:
        return t.dtype, t.shape, t.is_contiguous(), t.storage_offset() % _ALIGN, t.device
    return t.dtype, t.shape, t.is_contiguous(), t.device


def _unknown_reason(unknown: tuple[str, ...]) -> Reason:
    return Reason(
        ReasonCode.FEATURE,
        f"generic_gemm got {', '.join(unknown)}, which TE 2.20's generic_gemm does not have: "
        "the plugin cannot honour what it cannot read, so TE's own generic_gemm takes the call as it came",
        "arguments",
    )


def _call(va: Any, vb: Any, vq: Any, args: tuple[Any, ...], tail: tuple[Any, ...]) -> GemmCall:
    """The call as data; A and B are operand views, the quantizer its descriptor (``host/views.py``)."""
    (
        _,
        transA,
        _,
        transB,
        D,
        _,
        output_dtype,
        bias,
        bias_type,
        gelu,
        gelu_in,
        grad,
        ws,
        ws_size,
        acc,
        split,
    ) = args
    return GemmCall(va, bool(transA), vb, bool(transB), D, vq, output_dtype, bias, bias_type, bool(gelu),
                    gelu_in, bool(grad), ws, ws_size, bool(acc), bool(split), *tail)  # fmt: skip
