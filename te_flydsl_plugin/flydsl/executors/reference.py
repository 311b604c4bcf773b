"""The ``reference`` executor: a plan run with torch in fp32, on any device.

It decodes the kernel-facing operands exactly as the kernel reads them (chosen storage, FP8 bytes
with their scale_inv, packed E8M0 scales through ``mx_layout.unpack_scales``) and walks the plan's
pieces, so host logic (storage choice, M/N/K, packing, splitting) is verified here; its epilogues
are the semantics TE's fused epilogues define, which the compiled kernels match.
"""

from __future__ import annotations

import math

import torch

from ...dtypes import FP8_TORCH_DTYPES
from .. import mx_layout
from ..plan_types import GemmPlan, KernelOperand, Piece

pack_scales = mx_layout.pack_scales  # this executor's MXFP8 scale packing: the torch reference

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def decode(op: KernelOperand, r0: int, r1: int, k0: int, k1: int) -> torch.Tensor:
    """fp32 ``[r1 - r0, k1 - k0]`` values of an operand window, as the kernel computes with them."""
    window = op.data[r0:r1, k0:k1] if op.k_major else op.data[k0:k1, r0:r1].t()
    fmt = op.format
    if not fmt.is_quantized:
        return window.float()
    vals = window.view(FP8_TORCH_DTYPES[fmt]).float()
    if fmt.is_fp8:
        return vals * op.scale_inv.float()
    scales = mx_layout.unpack_scales(op.mx_scales, op.rows, op.k)[r0:r1, k0 // 32 : (k1 + 31) // 32]
    return vals * mx_layout.e8m0_to_float(scales).repeat_interleave(32, dim=1)[:, : k1 - k0]


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh-approximated GELU (cuBLASLt's and TE's fused GEMM epilogue)."""
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3))))


def dgelu(x: torch.Tensor) -> torch.Tensor:
    """Derivative of :func:`gelu`."""
    t = torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x.pow(3)))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x)


def run(plan: GemmPlan) -> None:
    """Execute ``plan`` with torch in fp32, piece by piece, writing ``plan.out`` and epilogue outputs."""
    epi = plan.problem.epilogue
    blocks: dict[tuple[int, int, int, int], list[Piece]] = {}
    for pc in plan.pieces:
        blocks.setdefault((pc.m0, pc.m1, pc.n0, pc.n1), []).append(pc)
    if plan.bias_grad is not None:
        bias_grad = torch.zeros(plan.bias_grad.shape, dtype=torch.float32, device=plan.out.device)
    for (m0, m1, n0, n1), ks in blocks.items():
        acc = torch.zeros(m1 - m0, n1 - n0, dtype=torch.float32, device=plan.out.device)
        for pc in ks:
            lhs = decode(plan.lhs, m0, m1, pc.k0, pc.k1)
            acc += lhs @ decode(plan.rhs, n0, n1, pc.k0, pc.k1).t()
            if epi == "bgrad" and n0 == 0:
                bias_grad[m0:m1] += lhs.sum(dim=1)
        out = plan.out[m0:m1, n0:n1]
        res = plan.alpha * acc
        if plan.beta != 0.0:
            res = res + plan.beta * out.float()
        if plan.bias is not None:
            res = res + plan.bias[n0:n1].float()
        if epi in ("gelu", "bias_gelu"):
            plan.gelu_aux[m0:m1, n0:n1].copy_(res)
            res = gelu(res)
        elif epi in ("dgelu", "dgelu_bgrad"):
            res = res * dgelu(plan.gelu_aux[m0:m1, n0:n1].float())
            if epi == "dgelu_bgrad":
                bias_grad[n0:n1] += res.sum(dim=0)
        out.copy_(res)
    if plan.bias_grad is not None:
        plan.bias_grad.copy_(bias_grad)
