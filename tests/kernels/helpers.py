"""Shared pieces of the kernel tests: skip reasons, random kernel-facing operands, a torch reference."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import executors
from te_flydsl_plugin.flydsl.executors.reference import run as run_reference
from te_flydsl_plugin.flydsl.kernels import epilogue
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.flydsl.launch_log import LaunchLog
from te_flydsl_plugin.flydsl.plan_types import GemmPlan, KernelOperand, Piece
from te_flydsl_plugin.spec import Format

needs_toolchain = pytest.mark.skipif(
    llvm.find_ld_lld() is None,
    reason="no ld.lld >= 18 on this machine: install lld-22 (or ROCm) to compile for gfx950",
)

_TORCH = {
    Format.BF16: torch.bfloat16,
    Format.FP16: torch.float16,
    Format.FP32: torch.float32,
    Format.FP8_E4M3: torch.float8_e4m3fn,
    Format.FP8_E5M2: torch.float8_e5m2,
}


def operand(fmt: Format, rows: int, k: int, k_major: bool, device: str, gen: torch.Generator) -> KernelOperand:
    """A random operand in kernel-facing form (FP8 as a uint8 payload with a per-tensor scale_inv)."""
    vals = torch.randn(rows, k, generator=gen) * (0.5 if fmt.is_fp8 else 1.0)
    data = vals.to(_TORCH[fmt])
    data = data if k_major else data.t().contiguous()
    scale = None
    if fmt.is_fp8:
        data = data.view(torch.uint8)
        scale = torch.rand(1, generator=gen) + 0.5
        scale = scale.to(device)
    return KernelOperand(data.to(device), fmt, k_major, "tensor", scale_inv=scale)


def decoded(op: KernelOperand) -> torch.Tensor:
    """``[rows, K]`` fp32 values of an operand, scale applied: what the kernel multiplies."""
    t = op.data.view(_TORCH[op.format]) if op.format.is_fp8 else op.data
    t = t.float() if op.k_major else t.float().t()
    return t * op.scale_inv.float() if op.scale_inv is not None else t


def plan_for(
    cfg: KernelConfig,
    m: int,
    n: int,
    k: int,
    alpha: float = 1.0,
    beta: float = 0.0,
    device: str = "cpu",
    seed: int = 0,
    pieces: tuple[Piece, ...] | None = None,
) -> GemmPlan:
    """A plan with random operands for ``cfg`` and an output pre-filled with random values."""
    gen = torch.Generator().manual_seed(seed)
    lhs = operand(cfg.lhs_format, m, k, cfg.lhs_k_major, device, gen)
    rhs = operand(cfg.rhs_format, n, k, cfg.rhs_k_major, device, gen)
    out = torch.randn(m, n, generator=gen).to(_TORCH[cfg.out_format]).to(device)
    return plan_of(cfg, lhs, rhs, out, alpha, beta, pieces)


def plan_of(
    cfg: KernelConfig,
    lhs: KernelOperand,
    rhs: KernelOperand,
    out: torch.Tensor,
    alpha: float,
    beta: float,
    pieces: tuple[Piece, ...] | None = None,
) -> GemmPlan:
    """A plain-epilogue plan over given kernel operands (one piece unless ``pieces`` says otherwise)."""
    m, n, k = out.shape[0], out.shape[1], lhs.k
    return GemmPlan(
        problem=types.SimpleNamespace(epilogue="plain"),  # type: ignore[arg-type] - only the epilogue is read
        config=cfg,
        lhs=lhs,
        rhs=rhs,
        out=out,
        alpha=alpha,
        beta=beta,
        pieces=pieces or (Piece(0, m, 0, n, 0, k),),
    )


def piece_grid(m: int, n: int, k: int, kc: int) -> tuple[Piece, ...]:
    """Host-split pieces in M (at 256), N (at 128) and K (every ``kc``): the plan's split on a small GEMM."""
    return tuple(
        Piece(m0, m1, n0, n1, k0, min(k0 + kc, k))
        for m0, m1 in ((0, 256), (256, m))
        for n0, n1 in ((0, 128), (128, n))
        for k0 in range(0, k, kc)
    )


def reference(plan: GemmPlan, out_before: torch.Tensor) -> torch.Tensor:
    """``alpha * lhs @ rhs.T + beta * out`` in fp64 from the decoded operands."""
    acc = decoded(plan.lhs).double() @ decoded(plan.rhs).double().t()
    return plan.alpha * acc + plan.beta * out_before.double()


def tolerance(cfg: KernelConfig, k: int) -> tuple[float, float]:
    """(atol, rtol) for comparing to the fp64 reference: the output rounding plus fp32 accumulation."""
    rel = {Format.FP32: 2e-6, Format.BF16: 8e-3, Format.FP16: 1e-3}[cfg.out_format]
    return rel * max(k, 1) ** 0.5 * 4, rel * 2


def with_epilogue(plan: GemmPlan, seed: int) -> GemmPlan:
    """``plan`` with the tensors its config's epilogue needs: a bias (bf16: the host widens it), the
    saved pre-activation (dGELU reads it; GELU overwrites a poisoned one) and a bias-grad output."""
    cfg = plan.config
    gen = torch.Generator().manual_seed(seed)
    m, n = plan.out.shape
    parts = epilogue.FLAGS[cfg.epilogue]
    dev = plan.out.device
    bias = (torch.randn(n, generator=gen) * 2).to(torch.bfloat16).to(dev) if parts.bias else None
    aux = None
    if parts.gelu:
        aux = torch.full((m, n), float("nan"), dtype=plan.out.dtype, device=dev)
    if parts.dgelu:
        aux = (torch.randn(m, n, generator=gen) * 2).to(plan.out.dtype).to(dev)
    grad = None
    if parts.colsum or parts.rowsum:
        grad = torch.full((m if parts.rowsum else n,), float("nan"), dtype=plan.out.dtype, device=dev)
    problem = types.SimpleNamespace(epilogue=cfg.epilogue)
    return dataclasses.replace(plan, problem=problem, bias=bias, gelu_aux=aux, bias_grad=grad)


def outputs(plan: GemmPlan) -> GemmPlan:
    """The same plan with private copies of everything an executor writes."""
    return dataclasses.replace(
        plan,
        out=plan.out.clone(),
        gelu_aux=None if plan.gelu_aux is None else plan.gelu_aux.clone(),
        bias_grad=None if plan.bias_grad is None else plan.bias_grad.clone(),
    )


def run_and_compare(plan: GemmPlan, mode: str = "emulator") -> GemmPlan:
    """The compiled kernels (the emulator, or ``flydsl`` on gfx950) against the reference executor on
    copies of ``plan``; returns the executed plan."""
    cfg = plan.config
    want, got = outputs(plan), outputs(plan)
    run_reference(want)
    with LaunchLog() as log:
        executors.run(got, mode)
    if mode == "flydsl":
        torch.cuda.synchronize()
    assert log.count("gemm", mode) == len(plan.pieces), "the compiled kernel did not run"
    k = plan.lhs.k
    atol, rtol = tolerance(cfg, k)

    def close(a: torch.Tensor, b: torch.Tensor, atol: float) -> None:
        # relative to the output's magnitude (MXFP8 operands span 2^-6 .. 2^6 per row), never below 1
        scale = max(float(b.double().abs().max()), 1.0)
        torch.testing.assert_close(a.double().cpu() / scale, b.double().cpu() / scale, atol=atol, rtol=rtol)

    close(got.out, want.out, atol)
    if epilogue.FLAGS[cfg.epilogue].gelu:
        close(got.gelu_aux, want.gelu_aux, atol)
    if got.bias_grad is not None:
        # a sum over M (dgelu_bgrad) or K (bgrad) values: its rounding grows with the count
        close(got.bias_grad, want.bias_grad, atol * max(plan.out.shape[0], k) ** 0.5)
    return got
