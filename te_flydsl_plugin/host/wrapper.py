"""``wrap_generic_gemm(native)``: TE's ``generic_gemm`` with the plugin's dispatch in front.

The wrapper has ``transformer_engine_torch.generic_gemm``'s exact signature and return value. On the
hot path it builds a cheap key from operand metadata, finds the cached decision, and either runs the
backend or forwards the call to ``native`` exactly as it came (same positional and keyword
arguments). The full :class:`GemmProblem` is built only when a key is new.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..spec import GemmCall
from . import dispatch, operands, problem
from .device import arch_of

_KW_DEFAULTS = {
    "comm_overlap": None,
    "comm_type": None,
    "extra_output": None,
    "bulk_overlap": False,
    "alpha": 1.0,
    "beta": None,
}
_TAIL = tuple(_KW_DEFAULTS)


def _tensor_key(t: Any) -> Any:
    return None if t is None else (t.dtype, t.shape, t.is_contiguous())


def _device_of(v: Any) -> tuple[str, int | None]:
    t = v
    if not hasattr(t, "device"):
        t = getattr(v, "data", None) if getattr(v, "data", None) is not None else None
        for name in ("transpose", "rowwise_data", "columnwise_data"):
            if t is None:
                t = getattr(v, name, None)
    dev = getattr(t, "device", None)
    return (dev.type, dev.index) if dev is not None else ("cpu", None)


def wrap_generic_gemm(native: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``generic_gemm`` dispatching through the current dispatcher, falling back to ``native``."""

    @functools.wraps(native)
    def generic_gemm(
        A: Any,
        transA: bool,
        B: Any,
        transB: bool,
        D: Any,
        quantizer: Any,
        output_dtype: Any,
        bias: Any,
        bias_type: Any,
        gelu: bool,
        gelu_in: Any,
        grad: bool,
        workspace: Any,
        workspace_size: int,
        accumulate: bool,
        use_split_accumulator: bool,
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        d = dispatch._current or dispatch.current()
        if d.backend is None:
            return native(
                A,
                transA,
                B,
                transB,
                D,
                quantizer,
                output_dtype,
                bias,
                bias_type,
                gelu,
                gelu_in,
                grad,
                workspace,
                workspace_size,
                accumulate,
                use_split_accumulator,
                *rest,
                **kwargs,
            )
        tail = dict(_KW_DEFAULTS)
        if rest:
            tail.update(zip(_TAIL, rest, strict=False))
        if kwargs:
            tail.update(kwargs)
        va, vb = operands.view(A), operands.view(B)
        dev = _device_of(vb)
        key = (
            transA,
            transB,
            operands.key_of(va),
            operands.key_of(vb),
            _tensor_key(D),
            output_dtype,
            _tensor_key(bias),
            gelu,
            gelu_in is None,
            grad,
            accumulate,
            quantizer is None,
            tail["comm_overlap"] is None and tail["comm_type"] is None and tail["extra_output"] is None,
            tail["bulk_overlap"],
            tail["alpha"],
            tail["beta"],
            dev,
        )
        decision = d.cache.get(key)
        call = None
        if decision is None:
            call = _call(
                va,
                transA,
                vb,
                transB,
                D,
                quantizer,
                output_dtype,
                bias,
                bias_type,
                gelu,
                gelu_in,
                grad,
                workspace,
                workspace_size,
                accumulate,
                use_split_accumulator,
                tail,
            )
            arch = d.settings.target_arch or arch_of(*dev)
            decision = d.decide(
                key, problem.build(call, operands.spec_of(va), operands.spec_of(vb), arch, dev[0])
            )
        if decision.verdict.ok:
            if call is None:
                call = _call(
                    va,
                    transA,
                    vb,
                    transB,
                    D,
                    quantizer,
                    output_dtype,
                    bias,
                    bias_type,
                    gelu,
                    gelu_in,
                    grad,
                    workspace,
                    workspace_size,
                    accumulate,
                    use_split_accumulator,
                    tail,
                )
            out = d.backend.run(decision.problem, call)
            d.ran_backend()
            return out
        d.ran_native(decision)
        return native(
            A,
            transA,
            B,
            transB,
            D,
            quantizer,
            output_dtype,
            bias,
            bias_type,
            gelu,
            gelu_in,
            grad,
            workspace,
            workspace_size,
            accumulate,
            use_split_accumulator,
            *rest,
            **kwargs,
        )

    generic_gemm.__te_flydsl_native__ = native  # type: ignore[attr-defined]
    return generic_gemm


def _call(
    va: Any,
    transA: bool,
    vb: Any,
    transB: bool,
    D: Any,
    quantizer: Any,
    output_dtype: Any,
    bias: Any,
    bias_type: Any,
    gelu: bool,
    gelu_in: Any,
    grad: bool,
    workspace: Any,
    workspace_size: int,
    accumulate: bool,
    use_split_accumulator: bool,
    tail: dict[str, Any],
) -> GemmCall:
    """The call as data; A and B are already operand views (``host/operands.py``)."""
    return GemmCall(
        va,
        bool(transA),
        vb,
        bool(transB),
        D,
        quantizer,
        output_dtype,
        bias,
        bias_type,
        bool(gelu),
        gelu_in,
        bool(grad),
        workspace,
        workspace_size,
        bool(accumulate),
        bool(use_split_accumulator),
        **tail,
    )
