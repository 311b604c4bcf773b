"""One ``generic_gemm`` call's metadata as a :class:`GemmProblem` (no data read, no GPU sync).

M, N and K follow TE's own output-shape rule (``getGemmOutputShape`` in TE's gemm.cpp), per layout
and from the logical shapes of the operands TE's layout names:

=======  =========================  =======================  ====================
layout   A (weight side)            B (input side)           D
=======  =========================  =======================  ====================
TN       ``[N, K]`` (lead flat)     ``[*lead, K]``           ``[*lead, N]``
NN       ``[K, N]`` (lead flat)     ``[*lead, K]``           ``[*lead, N]``
NT       ``[K, N]`` (lead flat)     ``[K, M]`` (lead flat)   ``[M, N]``
=======  =========================  =======================  ====================
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..dtypes import torch_dtype_of
from ..spec import Format, GemmCall, GemmProblem, Layout, OperandSpec
from . import views


def _split(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of an operand flattened to 2-D: all leading dims form the rows."""
    if not shape:
        return 0, 0
    return math.prod(shape[:-1]), shape[-1]


def gemm_dims(layout: Layout, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int, tuple[int, ...]]:
    """(m, n, k_from_a, k_from_b, out_shape) for TE's layout rule."""
    a_rows, a_cols = _split(a)
    b_rows, b_cols = _split(b)
    trans_a = layout in (Layout.TN, Layout.TT)
    trans_b = layout in (Layout.NT, Layout.TT)
    n, ka = (a_rows, a_cols) if trans_a else (a_cols, a_rows)
    if trans_b:
        m, kb = b_cols, b_rows
        out_shape: tuple[int, ...] = (m, n)
    else:
        m, kb = b_rows, b_cols
        out_shape = (*b[:-1], n) if b else (n,)
    return m, n, ka, kb, out_shape


def operand_shapes(layout: Layout, m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """TE's (A, B) shapes that give output rows ``m``, columns ``n`` and reduction ``k`` in ``layout``
    (the inverse of :func:`gemm_dims` for 2-D operands)."""
    a = (n, k) if layout in (Layout.TN, Layout.TT) else (k, n)
    b = (k, m) if layout in (Layout.NT, Layout.TT) else (m, k)
    return a, b


def _beta(call: GemmCall) -> float:
    if call.beta is not None:
        return float(call.beta)
    return 1.0 if call.accumulate else 0.0


def _present(t: Any) -> bool:
    """TE passes ``None`` or an empty tensor for "no bias"."""
    return t is not None and t.numel() != 0


def _not_tensors(call: GemmCall) -> dict[str, Any]:
    """D, bias, gelu_in given as something other than a strided tensor (sparse, nested); alpha, beta that
    are not numbers; a D that is a tensor subclass (TE's quantized ``Float8Tensor`` D): its bytes are not
    its values, so the backend never writes into it."""
    odd = {k: v for k, v in (("D", call.D), ("bias", call.bias), ("gelu_in", call.gelu_in))
           if v is not None and not (isinstance(v, torch.Tensor) and views.strided(v))}  # fmt: skip
    if call.D is not None and isinstance(call.D, torch.Tensor) and type(call.D) not in views.PLAIN_TENSORS:
        odd["D"] = call.D
    for k, v in (("alpha", call.alpha), ("beta", call.beta)):
        if v is not None and not isinstance(v, (int, float)):
            odd[k] = v
    return odd


def _kind(v: Any) -> str:
    """What an odd argument is, in words: its class, and for a tensor without strides its layout."""
    if isinstance(v, torch.Tensor) and not views.strided(v):
        return "nested tensor" if v.is_nested else f"{v.layout} tensor"
    return type(v).__qualname__


def _aux_format(call: GemmCall, low_precision: bool, result: Format) -> Format | None:
    """The GELU pre-activation's format: ``gelu_in``'s when given (dGELU reads it), else the one the
    backend allocates, as TE's gemm.cpp (2.20) does: ``bias_type`` when an operand is FP8 or MXFP8
    (``low_precision``), else the unquantized output's (``result``). A ``bias_type`` that is no
    float type falls back to the output's."""
    if not call.gelu:
        return None
    if call.grad and isinstance(call.gelu_in, torch.Tensor):  # forward GELU ignores a given gelu_in
        return views.format_of_dtype(call.gelu_in.dtype)
    fmt = views.format_of_dtype(call.bias_type) if low_precision else result
    return fmt if torch_dtype_of(fmt) is not None else result


def build(call: GemmCall, a_spec: OperandSpec, b_spec: OperandSpec, arch: str, device_type: str = "") -> GemmProblem:
    """The problem for ``call`` whose operands have the given specs, evaluated for ``arch``.

    An argument of a type TE's binding does not take (a D that is no tensor, an alpha that is no number)
    yields a problem with a shape error: TE gets the call, and its binding answers for it.
    """
    odd = _not_tensors(call)
    if odd:
        plain = dataclasses.replace(call, **{k: (1.0 if k == "alpha" else None) for k in odd})
        p = build(plain, a_spec, b_spec, arch, device_type)
        why = "; ".join(f"{k} is a {_kind(v)}" for k, v in odd.items())
        return dataclasses.replace(p, shape_error="; ".join(e for e in (p.shape_error, why) if e))
    layout = Layout.of(call.transA, call.transB)
    m, n, ka, kb, out_shape = gemm_dims(layout, a_spec.shape, b_spec.shape)
    errors = []
    if ka != kb:
        errors.append(f"reduction lengths differ: A gives K={ka}, B gives K={kb} for {layout.value}")
    out_dtype = views.format_of_dtype(call.output_dtype) if call.output_dtype is not None else Format.OTHER
    d = call.D
    out_given = d is not None
    out_contig, out_align, out_matches = True, views.MAX_ALIGN, True
    if out_given:
        d_fmt = views.format_of_dtype(d.dtype)
        if call.output_dtype is None:
            out_dtype = d_fmt
        out_contig = d.is_contiguous()
        out_align = views.start_align(d)
        out_matches = tuple(d.shape) == out_shape and d_fmt is out_dtype
        if not out_matches:
            errors.append(f"D {tuple(d.shape)} {d.dtype} does not hold the {out_shape} {out_dtype.value} output")
    beta = _beta(call)
    if (call.accumulate or beta != 0.0) and not out_given:
        errors.append("accumulate / beta != 0 needs D")
    has_bias = _present(call.bias)
    if call.gelu and call.grad and call.gelu_in is None:
        errors.append("gelu with grad needs gelu_in (the saved pre-activation)")
    # dGELU reads gelu_in; forward GELU ignores it and returns a fresh pre-activation, as TE does.
    aux = call.gelu_in if call.gelu and call.grad else None
    if aux is not None and tuple(aux.shape) != out_shape:
        errors.append(f"gelu_in {tuple(aux.shape)} is not the {out_shape} pre-activation")
    devices = {*a_spec.devices, *b_spec.devices, *views.devices_of(d, call.bias, aux)}
    quant = None if call.quantizer is None else views.quantizer_of(call.quantizer).spec
    result = GemmProblem.result_format(quant, a_spec.format, b_spec.format, out_dtype)
    return GemmProblem(
        layout=layout,
        m=m,
        n=n,
        k=ka,
        out_shape=tuple(out_shape),
        a=a_spec,
        b=b_spec,
        out_dtype=out_dtype,
        out_given=out_given,
        out_contiguous=out_contig,
        out_align=out_align,
        out_matches=out_matches,
        bias=has_bias,
        bias_dtype=views.format_of_dtype(call.bias.dtype) if has_bias else None,
        bias_numel=call.bias.numel() if has_bias else 0,
        epilogue_contiguous=all(t.is_contiguous() for t in (call.bias if has_bias else None, aux) if t is not None),
        gelu=bool(call.gelu),
        aux_dtype=_aux_format(call, any(f.is_fp8 or f.is_mx for f in (a_spec.format, b_spec.format)), result),
        grad=bool(call.grad),
        accumulate=bool(call.accumulate),
        alpha=float(call.alpha),
        beta=beta,
        use_split_accumulator=bool(call.use_split_accumulator),
        output_quantizer=quant,
        comm_overlap=(
            call.comm_overlap is not None
            or call.comm_type is not None
            or call.extra_output is not None
            or bool(call.bulk_overlap)
        ),
        arch=arch,
        device_type=device_type,
        devices=tuple(sorted(devices)),
        shape_error="; ".join(errors),
    )
