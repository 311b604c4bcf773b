"""What the two compiled executors launch: a plan's GEMM launches and the scale-pack launch of one
operand, independent of where they run (``executors/gpu.py`` on gfx950, ``executors/emulator.py``).

:func:`execute` walks ``plan.pieces`` and passes one piece's views to the kernel: each view's data
pointer (storage offset included) is the 64-bit base of that launch, and the plan sized the pieces so
no buffer a launch addresses spans more than ``config.MAX_LAUNCH_BYTES`` (the kernel's buffer offsets
are 32-bit). A piece with ``k0 > 0`` accumulates onto what the earlier K pieces wrote (beta 1). Both
executors run the same :class:`Launch` objects, so they run the same thing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..operands import MX_BLOCK
from . import mx_layout
from .kernels import epilogue, gemm, mx
from .kernels.config import KernelConfig
from .plan_types import GemmPlan, KernelOperand, Piece


def _window(op: KernelOperand, r0: int, r1: int, k0: int, k1: int) -> torch.Tensor:
    """Rows ``[r0, r1)`` and K ``[k0, k1)`` of an operand, as a view in its own majorness."""
    return op.data[r0:r1, k0:k1] if op.k_major else op.data[k0:k1, r0:r1]


def _scales(op: KernelOperand, r0: int, r1: int, k0: int, k1: int) -> torch.Tensor | None:
    """What the kernel's scale argument of one piece is: the per-tensor scale_inv (FP8), or the int32
    words of the packed E8M0 scales covering the piece's rows and K (MXFP8; a slice, never a copy)."""
    if op.mx_scales is None:
        return op.scale_inv
    return mx.piece_words(op.mx_scales, r0, r1, k0, k1)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the config it runs, a piece's kernel-facing views and scalars.

    ``extras`` are the epilogue's ``(bias, aux, partials)`` views (``gemm.epilogue_views``), None
    where the config's epilogue takes none.
    """

    config: KernelConfig
    out: torch.Tensor
    lhs: torch.Tensor
    rhs: torch.Tensor
    lhs_scale: torch.Tensor | None
    rhs_scale: torch.Tensor | None
    alpha: float
    beta: float
    extras: tuple = (None, None, None)

    def jit_args(self) -> tuple:
        views = (self.out, self.lhs, self.rhs, self.lhs_scale, self.rhs_scale)
        return gemm.jit_args(self.config, *views, self.alpha, self.beta, self.extras)


def piece_launch(plan: GemmPlan, pc: Piece, bias: torch.Tensor | None = None) -> Launch:
    """The launch of one piece (shared by both modes, so they run the same thing).

    A fused epilogue runs in the launch that completes its output block, the piece with the last K
    range; earlier K pieces of the block run the plain config of the same tiles (their sums are not
    final yet). ``bias`` is the plan's bias widened to fp32 (:func:`execute`).
    """
    cfg = plan.config
    last_k = pc.k1 == plan.lhs.k
    # bgrad sums lhs over every K piece, once per output row: in the pieces of the first column range.
    fused = pc.n0 == 0 if epilogue.FLAGS[cfg.epilogue].rowsum else last_k
    if not fused:
        cfg = dataclasses.replace(cfg, epilogue="plain")
    bias_v, aux = None, None
    if fused and bias is not None:
        bias_v = bias[pc.n0 : pc.n1]
    if fused and plan.gelu_aux is not None:
        aux = plan.gelu_aux[pc.m0 : pc.m1, pc.n0 : pc.n1]
    ws = gemm.partials_shape(cfg, pc.m1 - pc.m0, pc.n1 - pc.n0)
    partials = None if ws is None else torch.empty(ws, dtype=torch.float32, device=plan.out.device)
    return Launch(
        config=cfg,
        out=plan.out[pc.m0 : pc.m1, pc.n0 : pc.n1],
        lhs=_window(plan.lhs, pc.m0, pc.m1, pc.k0, pc.k1),
        rhs=_window(plan.rhs, pc.n0, pc.n1, pc.k0, pc.k1),
        lhs_scale=_scales(plan.lhs, pc.m0, pc.m1, pc.k0, pc.k1),
        rhs_scale=_scales(plan.rhs, pc.n0, pc.n1, pc.k0, pc.k1),
        alpha=plan.alpha,
        beta=plan.beta if pc.k0 == 0 else 1.0,
        extras=(bias_v, aux, partials),
    )


def _check(plan: GemmPlan) -> None:
    """Raise ValueError unless the plan's config can run it (epilogue buffers, output, operands)."""
    cfg = plan.config
    if cfg.epilogue not in epilogue.FLAGS:
        raise ValueError(f"{cfg.name}: compiled kernels implement the epilogues {sorted(epilogue.FLAGS)}")
    parts = epilogue.FLAGS[cfg.epilogue]
    for name, t, wanted in (
        ("bias", plan.bias, parts.bias),
        ("gelu_aux", plan.gelu_aux, parts.gelu or parts.dgelu),
        ("bias_grad", plan.bias_grad, parts.colsum or parts.rowsum),
    ):
        if (t is not None) != wanted:
            raise ValueError(f"{cfg.name}: the {cfg.epilogue} epilogue {'needs' if wanted else 'takes no'} {name}")
    if plan.out.dim() != 2 or (plan.out.stride(1) != 1 and plan.out.shape[1] > 1):
        raise ValueError(f"out must be a 2-D view with unit column stride, got stride {plan.out.stride()}")
    if (plan.lhs.format, plan.rhs.format, plan.lhs.k_major, plan.rhs.k_major) != (
        cfg.lhs_format,
        cfg.rhs_format,
        cfg.lhs_k_major,
        cfg.rhs_k_major,
    ):
        raise ValueError(f"{cfg.name}: config does not match the plan's operands")


def execute(plan: GemmPlan, run: Callable[[Launch], None]) -> None:
    """Run one kernel launch per piece of ``plan`` with ``run`` (an executor's), writing into
    ``plan.out`` (its leading stride honoured).

    Besides the GEMM launches: a fused bias is widened to fp32 first (exact; one N-element op, none
    when it is fp32 already), and ``dgelu_bgrad``'s per-tile column-sum partials and ``bgrad``'s
    per-thread row-sum partials are summed afterwards, in a fixed order (``torch.sum`` over the
    workspaces' rows: no atomics, the same bits every run), into ``plan.bias_grad``. On the GPU all
    of it is enqueued on the current stream.
    """
    _check(plan)
    bias = None if plan.bias is None else plan.bias.to(torch.float32).contiguous()
    launches = [piece_launch(plan, pc, bias) for pc in plan.pieces if pc.m1 > pc.m0 and pc.n1 > pc.n0]
    for ln in launches:
        run(ln)
    if plan.bias_grad is not None:
        _reduce_partials(plan, launches)


def _reduce_partials(plan: GemmPlan, launches: list[Launch]) -> None:
    """``bias_grad`` from the launches' partial rows, pieces in plan order, rows in order.

    ``dgelu_bgrad``: column sums (``bias_grad[n]``, per column range of the pieces); ``bgrad``: row
    sums (``bias_grad[m]``, per row range, K pieces included).
    """
    rowsum = epilogue.FLAGS[plan.config.epilogue].rowsum
    by_range: dict[tuple[int, int], list[torch.Tensor]] = {}
    for pc, ln in zip((pc for pc in plan.pieces if pc.m1 > pc.m0 and pc.n1 > pc.n0), launches, strict=True):
        if ln.extras[2] is not None:
            by_range.setdefault((pc.m0, pc.m1) if rowsum else (pc.n0, pc.n1), []).append(ln.extras[2])
    for (r0, r1), parts in by_range.items():
        plan.bias_grad[r0:r1].copy_(torch.cat(parts).sum(dim=0))


def kernarg_values(ln: Launch) -> list[Any]:
    """The kernel's launch values in signature order (``kernels/args.py`` KernelArgs): the tensors (views),
    then the runtime scalars; the same values and validation as a GPU launch (``gemm.kernel_args``)."""
    views = (ln.out, ln.lhs, ln.rhs, ln.lhs_scale, ln.rhs_scale)
    return list(gemm.kernel_args(ln.config, *views, ln.alpha, ln.beta, ln.extras))


@dataclass(frozen=True)
class ScalePackLaunch:
    """One scale-pack launch: TE's E8M0 scales (any view), the packed output's int32 words, and the
    kernel's runtime values (``kernels/scale_pack.py``)."""

    scales: torch.Tensor
    words: torch.Tensor
    rows: int
    kb: int  # K blocks of 32
    n_t: int  # word groups (512 K each)
    n_tiles: int  # 16-row tiles
    blocks_along_dim: int


def scale_pack_launch(
    scales: torch.Tensor, rows: int, k: int, blocks_along_dim: int, out: torch.Tensor | None
) -> tuple[torch.Tensor, ScalePackLaunch | None]:
    """The packed output (``out``, or allocated on the scales' device) and the launch that fills it;
    None when there is nothing to pack. Raises ValueError for what ``mx_layout`` declines.

    ``out`` (contiguous uint8 of ``mx_layout.packed_shape(rows, k)``) is written in place by the
    launch; no torch op touches the data.
    """
    mx_layout.logical_view(scales, rows, k, blocks_along_dim)  # validates, raises ValueError
    shape = mx_layout.packed_shape(rows, k)
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=scales.device)
    else:
        mx_layout.check_out(out, rows, k, scales.device)
    if out.numel() == 0:
        return out, None
    words = out.view(-1).view(torch.int32)
    return out, ScalePackLaunch(scales, words, rows, k // MX_BLOCK, shape[1], shape[0], blocks_along_dim)
