"""Build the plan: per layout and format, which storage the kernel reads, M/N/K, scales, output, pieces.

Only views are made here (no copies): TE's stored FP8 transposes are used instead of transposing,
MXFP8 picks rowwise or columnwise storage so the blocked dim is K, and the output is D itself (or a
fresh tensor in TE's output shape). Launches are split into pieces so no buffer a launch addresses
spans more than ``config.MAX_LAUNCH_BYTES``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..dtypes import format_of_torch, torch_dtype_of
from ..operands import Fp8Operand, MXFP8Operand
from ..spec import GemmCall, GemmProblem, Layout
from . import matrix
from .kernels.config import KernelConfig
from .kernels.select import select
from .plan_types import GemmPlan, KernelOperand, Piece

# Rows per piece are kept multiples of the output tile, so pieces never split a tile.
_PIECE_ALIGN = 256


def _plain(t: torch.Tensor, k_major: bool, rows: int, k: int) -> KernelOperand:
    shape = (rows, k) if k_major else (k, rows)
    fmt = format_of_torch(t.dtype)
    return KernelOperand(t.view(shape), fmt, k_major, "tensor")


def _fp8(op: Fp8Operand, use_data: bool, rows: int, k: int) -> KernelOperand:
    # K-major either way: ``data`` is [rows, K] where the layout reads it so, else the transpose is.
    t = op.data if use_data else op.transpose
    return KernelOperand(t.view(rows, k), op.format, True, "data" if use_data else "transpose", scale_inv=op.scale_inv)


def _mx(op: MXFP8Operand, rowwise: bool, rows: int, k: int, pack: Any) -> KernelOperand:
    if rowwise:
        data, scales = op.rowwise_data.view(rows, k), op.rowwise_scale_inv
    else:
        data, scales = op.columnwise_data.view(k, rows), op.columnwise_scale_inv
    packed = pack(scales, rows, k, 1 if rowwise else 0)
    return KernelOperand(data, op.format, rowwise, "rowwise" if rowwise else "columnwise", mx_scales=packed)


def operand(v: Any, layout: Layout, is_a: bool, rows: int, k: int, pack: Any = None) -> KernelOperand:
    """The kernel-facing form of TE's A (``is_a``: the output-column side) or B (the row side)."""
    a_rowwise, b_rowwise = matrix.READS_ROWWISE[layout]
    rowwise = a_rowwise if is_a else b_rowwise
    if isinstance(v, Fp8Operand):
        return _fp8(v, rowwise, rows, k)
    if isinstance(v, MXFP8Operand):
        return _mx(v, rowwise, rows, k, pack or _default_pack())
    # Plain tensors have only their rowwise storage: K-major exactly where the layout reads it rowwise
    # (A in TN, B in TN and NN).
    return _plain(v, rowwise, rows, k)


def _default_pack() -> Any:
    from .mx_layout import pack_scales

    return pack_scales


def _span(rows: int, cols: int, pitch: int, itemsize: int) -> int:
    """Bytes a ``rows x cols`` window of a row-major array with ``pitch`` spans."""
    return 0 if rows == 0 or cols == 0 else ((rows - 1) * pitch + cols) * itemsize


def _shrink(n: int, align: int) -> int:
    """About half of ``n`` as a multiple of ``align`` and below ``n``; ``n`` itself when there is none.

    Pieces start on multiples of ``align`` so that every piece's view of an operand starts on a whole
    vector (and, along M/N, on a whole output tile and a whole 16-row group of packed MX scales).
    """
    half = -(-((n + 1) // 2) // align) * align
    return half if half < n else n


def split(
    m: int, n: int, k: int, lhs: KernelOperand, rhs: KernelOperand, out_itemsize: int, k_align: int, limit: int
) -> tuple[Piece, ...]:
    """Pieces covering the ``m x n`` output (and K) so every window a piece addresses fits ``limit`` bytes.

    Each step shrinks the dimension that shrinks the offending window (rows of a K-major operand or
    of the output, else K), falling back to the next one when a dimension cannot shrink further.
    """
    pm, pn, pk = m, n, k
    ls, rs = max(lhs.format.itemsize, 1), max(rhs.format.itemsize, 1)
    while True:
        spans = {
            "lhs": _span(pm, pk, k, ls) if lhs.k_major else _span(pk, pm, m, ls),
            "rhs": _span(pn, pk, k, rs) if rhs.k_major else _span(pk, pn, n, rs),
            "out": _span(pm, pn, n, out_itemsize),
        }
        over = [name for name, s in spans.items() if s > limit]
        if not over:
            break
        name = over[0]
        order = {
            "out": ("m", "n"),
            "lhs": ("m", "k") if lhs.k_major else ("k", "m"),
            "rhs": ("n", "k") if rhs.k_major else ("k", "n"),
        }[name]
        for dim in order:
            before = (pm, pn, pk)
            if dim == "m":
                pm = _shrink(pm, _PIECE_ALIGN)
            elif dim == "n":
                pn = _shrink(pn, _PIECE_ALIGN)
            else:
                pk = _shrink(pk, k_align)
            if (pm, pn, pk) != before:
                break
        else:
            raise ValueError(f"no split of {m}x{n}x{k} keeps the {name} window under {limit} bytes")
    return tuple(
        Piece(m0, min(m0 + pm, m), n0, min(n0 + pn, n), k0, min(k0 + pk, k))
        for m0 in range(0, m, pm)
        for n0 in range(0, n, pn)
        for k0 in range(0, k, pk)
    )


def config_for(problem: GemmProblem, lhs: KernelOperand, rhs: KernelOperand) -> KernelConfig:
    """The kernel config a plan uses: tiles by the kernel family's heuristic (kernels/select.py)."""
    cfg = KernelConfig(lhs.format, rhs.format, lhs.k_major, rhs.k_major, problem.result_dtype, problem.epilogue)
    return select(cfg, problem.m, problem.n, problem.k)


def build(
    problem: GemmProblem,
    call: GemmCall,
    limit: int = matrix.MAX_LAUNCH_BYTES,
    pack: Any = None,
) -> GemmPlan:
    """The plan for a problem ``check`` accepted; ``call.A``/``call.B`` are operand views.

    ``pack(scales, rows, k, blocks_along_dim)`` packs MXFP8 scales (default: the torch reference),
    for both operands on every call: see ``FlydslBackend._packer`` for why nothing is reused.
    """
    p = problem
    rhs = operand(call.A, p.layout, True, p.n, p.k, pack)
    lhs = operand(call.B, p.layout, False, p.m, p.k, pack)
    out_dtype = torch_dtype_of(p.result_dtype)  # the unquantized result when an output quantizer is given
    device = lhs.data.device
    d = call.D if call.D is not None else torch.empty(p.out_shape, dtype=out_dtype, device=device)
    out = d.view(p.m, p.n)
    gelu_aux = None
    if p.gelu:
        aux = call.gelu_in if p.grad else None
        if aux is None:  # fprop: a fresh pre-activation comes back as gelu_input, in TE's dtype for it
            aux = torch.empty(p.out_shape, dtype=torch_dtype_of(p.aux_dtype) or out_dtype, device=device)
        gelu_aux = aux.view(p.m, p.n)
    bias = call.bias.view(-1) if p.bias and not p.grad else None
    # TE returns the bias gradient in the output dtype (fp32 when accumulating into main_grad).
    bias_grad = torch.empty(call.bias.numel(), dtype=out_dtype, device=device) if p.bias and p.grad else None
    k_align = matrix.MX_K_MULTIPLE * 16 if lhs.format.is_mx else max(matrix.K_MULTIPLE.get(lhs.format, 1), 1)
    pieces = split(p.m, p.n, p.k, lhs, rhs, out.element_size(), k_align, limit)
    return GemmPlan(
        problem=p,
        config=config_for(p, lhs, rhs),
        lhs=lhs,
        rhs=rhs,
        out=out,
        alpha=p.alpha,
        beta=p.beta,
        pieces=pieces,
        bias=bias,
        gelu_aux=gelu_aux,
        bias_grad=bias_grad,
    )


def results(plan: GemmPlan, call: GemmCall) -> list[Any]:
    """What ``generic_gemm`` returns: ``[D, bias_grad, gelu_input, extra_output]``."""
    p = plan.problem
    d = call.D if call.D is not None else plan.out.view(p.out_shape)
    if call.quantizer is not None:  # check() accepted it: no given D, a descriptor that can quantize
        d = call.quantizer.quantize(d, torch_dtype_of(p.out_dtype))
    # TE returns the pre-activation for fprop GELU only; dGELU reads gelu_in and returns None there.
    gelu_input = plan.gelu_aux.view(p.out_shape) if p.gelu and not p.grad else None
    return [d, plan.bias_grad, gelu_input, None]


def launch_spans(plan: GemmPlan) -> list[dict[str, int]]:
    """Bytes each piece's windows span (for the size tests and ``check --json``)."""
    m, n, k = plan.problem.m, plan.problem.n, plan.problem.k
    ls, rs = max(plan.lhs.format.itemsize, 1), max(plan.rhs.format.itemsize, 1)
    out_es = plan.out.element_size()
    spans = []
    for pc in plan.pieces:
        pm, pn, pk = pc.m1 - pc.m0, pc.n1 - pc.n0, pc.k1 - pc.k0
        spans.append(
            {
                "lhs": _span(pm, pk, k, ls) if plan.lhs.k_major else _span(pk, pm, m, ls),
                "rhs": _span(pn, pk, k, rs) if plan.rhs.k_major else _span(pk, pn, n, rs),
                "out": _span(pm, pn, n, out_es),
            }
        )
    return spans
