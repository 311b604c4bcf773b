"""The plan: one GEMM's operands exactly as the kernel will see them.

Every executor consumes the same plan (compiled kernels, the emulator, the torch reference), so the
host logic that builds it (storage choice, M/N/K, scale packing, splitting, output allocation) is
verified wherever any executor runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import Format, GemmProblem
from .kernels.config import KernelConfig


@dataclass(frozen=True)
class KernelOperand:
    """One kernel input.

    ``data`` is 2-D: ``[rows, K]`` when ``k_major`` else ``[K, rows]``, with unit stride on its last
    dim and any leading stride (FP8 payloads as uint8). ``scale_inv`` is the fp32 ``(1,)`` per-tensor
    dequantisation scale (FP8 only). ``mx_scales`` holds E8M0 scales packed into the MFMA-ready layout
    (docs/mxfp8-layout.md; MXFP8 only). ``source`` names the storage used, for reports:
    ``tensor``, ``data``, ``transpose``, ``rowwise`` or ``columnwise``.
    """

    data: torch.Tensor
    format: Format
    k_major: bool
    source: str
    scale_inv: torch.Tensor | None = None
    mx_scales: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.data.shape[0] if self.k_major else self.data.shape[1]

    @property
    def k(self) -> int:
        return self.data.shape[1] if self.k_major else self.data.shape[0]


@dataclass(frozen=True)
class Piece:
    """A sub-GEMM of a host-split launch: output rows ``[m0, m1)``, columns ``[n0, n1)``, K ``[k0, k1)``.

    Pieces exist so that no buffer a single launch addresses spans more than ``config.MAX_LAUNCH_BYTES``
    (buffer offsets are 32-bit). A piece with ``k0 > 0`` accumulates onto what earlier pieces wrote.
    """

    m0: int
    m1: int
    n0: int
    n1: int
    k0: int
    k1: int


@dataclass(frozen=True)
class GemmPlan:
    """Everything an executor needs; ``out`` is the 2-D ``[M, N]`` view of D that results land in.

    Epilogue tensors (see ``GemmProblem.epilogue``): ``bias`` is ``[N]``, added per output column
    (fprop). ``gelu_aux`` is ``[M, N]``: for ``gelu`` it receives the pre-activation; for ``dgelu`` it
    is the saved pre-activation that is read, and the output is ``acc * gelu'(aux)``. ``bias_grad``
    receives the bias gradient: for ``bgrad`` (wgrad) the sums over K of ``lhs`` (TE's
    ``grad_output.sum(0)``, length M); for ``dgelu_bgrad`` the column sums of the output (length N).
    ``beta`` is the effective beta (1.0 with accumulate).
    """

    problem: GemmProblem
    config: KernelConfig
    lhs: KernelOperand
    rhs: KernelOperand
    out: torch.Tensor
    alpha: float
    beta: float
    pieces: tuple[Piece, ...]
    bias: torch.Tensor | None = None
    gelu_aux: torch.Tensor | None = None
    bias_grad: torch.Tensor | None = None
