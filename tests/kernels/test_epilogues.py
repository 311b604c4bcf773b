"""The fused epilogues of the GEMM family, compiled for gfx950 and run in the emulator.

Each epilogue config (``compiled.EPILOGUE_FAMILY``) must compile within the ISA budgets (``test_compile.py``
covers that for the whole family) with a K loop identical to its plain config's, and match the
reference executor (``executors.run_reference``, the semantics TE's epilogues define) on shapes with
M != N != K, edge tiles in M and N, a K tail, a given D (beta), host-split pieces (the epilogue runs
in the last K piece only) and K = 0. ``dgelu_bgrad``'s bias gradient must be the same bits on every
run (the partials are reduced in a fixed order, no atomics).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from te_flydsl_plugin.flydsl import compiled, launch
from te_flydsl_plugin.flydsl.executors import run_reference
from te_flydsl_plugin.flydsl.kernels import epilogue
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.flydsl.plan_types import GemmPlan, Piece
from te_flydsl_plugin.spec import Format

from .helpers import needs_toolchain, plan_for, tolerance

pytestmark = [pytest.mark.emulator, needs_toolchain]
F = Format
EPI = [c for c in compiled.BACKED if c.epilogue != "plain" and c.scaling != "mx"]
MX_EPI = [c for c in compiled.BACKED if c.epilogue != "plain" and c.scaling == "mx"]


def _k_unit(cfg: KernelConfig) -> int:
    return 16 // cfg.lhs_format.itemsize


def with_epilogue(plan: GemmPlan, seed: int) -> GemmPlan:
    """``plan`` with the tensors its config's epilogue needs: a bias (bf16: the host widens it), the
    saved pre-activation (dGELU reads it; GELU overwrites a poisoned one) and a bias-grad output."""
    cfg = plan.config
    gen = torch.Generator().manual_seed(seed)
    m, n = plan.out.shape
    add_bias, fwd_gelu, bwd_gelu, colsum = epilogue.FLAGS[cfg.epilogue]
    bias = (torch.randn(n, generator=gen) * 2).to(torch.bfloat16) if add_bias else None
    aux = None
    if fwd_gelu:
        aux = torch.full((m, n), float("nan")).to(plan.out.dtype)
    if bwd_gelu:
        aux = (torch.randn(m, n, generator=gen) * 2).to(plan.out.dtype)
    grad = torch.full((n,), float("nan")).to(plan.out.dtype) if colsum else None
    problem = types.SimpleNamespace(epilogue=cfg.epilogue)
    return dataclasses.replace(plan, problem=problem, bias=bias, gelu_aux=aux, bias_grad=grad)


def _outputs(plan: GemmPlan) -> GemmPlan:
    """The same plan with private copies of everything an executor writes."""
    return dataclasses.replace(
        plan,
        out=plan.out.clone(),
        gelu_aux=None if plan.gelu_aux is None else plan.gelu_aux.clone(),
        bias_grad=None if plan.bias_grad is None else plan.bias_grad.clone(),
    )


def run_and_compare(plan: GemmPlan) -> GemmPlan:
    """The emulator against the reference executor on copies of ``plan``; returns the emulated plan."""
    cfg = plan.config
    want, got = _outputs(plan), _outputs(plan)
    run_reference(want)
    n_before = launch.launch_counts["emulator"]
    launch.execute(got, "emulator")
    assert launch.launch_counts["emulator"] == n_before + len(plan.pieces)
    k = plan.lhs.k
    atol, rtol = tolerance(cfg, k)
    torch.testing.assert_close(got.out.double(), want.out.double(), atol=atol, rtol=rtol)
    if epilogue.FLAGS[cfg.epilogue][1]:
        torch.testing.assert_close(got.gelu_aux.double(), want.gelu_aux.double(), atol=atol, rtol=rtol)
    if got.bias_grad is not None:
        m = plan.out.shape[0]
        torch.testing.assert_close(got.bias_grad.double(), want.bias_grad.double(), atol=atol * m**0.5, rtol=rtol)
    return got


def _plan(cfg: KernelConfig, m: int, n: int, k: int, alpha: float, beta: float, pieces=None) -> GemmPlan:
    m = m if cfg.lhs_k_major else m // _k_unit(cfg) * _k_unit(cfg)
    n = n if cfg.rhs_k_major else n // _k_unit(cfg) * _k_unit(cfg)
    plan = plan_for(cfg, m, n, k, alpha=alpha, beta=beta, seed=m * 7 + n + k, pieces=pieces)
    return with_epilogue(plan, m + n)


def test_epilogue_family_is_the_plain_family_plus_epilogues() -> None:
    """Every epilogue config's plain twin is backed (K pieces before the last run it), and each
    epilogue appears where TE issues it: bias / GELU in TN, dGELU in NN."""
    for cfg in EPI + MX_EPI:
        assert dataclasses.replace(cfg, epilogue="plain") in compiled.BACKED, cfg.name
        layout = {(True, True): "TN", (True, False): "NN"}[(cfg.lhs_k_major, cfg.rhs_k_major)]
        want = "NN" if cfg.epilogue.startswith("dgelu") else "TN"
        assert layout == want or (cfg.scaling == "tensor" and cfg.epilogue.startswith("dgelu")), cfg.name
    assert {c.epilogue for c in EPI} == set(epilogue.FLAGS) - {"plain"}


@pytest.mark.parametrize("cfg", EPI, ids=lambda c: c.name)
def test_epilogue_matches_reference(cfg: KernelConfig) -> None:
    """Two tile columns with an edge in M and N, a K tail, alpha and a given D (beta)."""
    run_and_compare(_plan(cfg, 301, 140, 9 * _k_unit(cfg), 0.5, 0.75))


@pytest.mark.parametrize(
    "cfg",
    [c for c in EPI if c.lhs_format is F.BF16 and c.out_format is F.BF16],
    ids=lambda c: c.name,
)
def test_epilogue_beta_zero_ignores_nan_d(cfg: KernelConfig) -> None:
    """beta 0 never reads D: a D full of NaN leaves no trace (one epilogue body serves both betas)."""
    plan = _plan(cfg, 37, 76, 3 * _k_unit(cfg), 1.0, 0.0)
    plan.out.fill_(float("nan"))
    got = run_and_compare(plan)
    assert not got.out.isnan().any()


@pytest.mark.parametrize(
    "cfg",
    [c for c in EPI if c.lhs_format is F.BF16 and c.out_format is F.BF16],
    ids=lambda c: c.name,
)
def test_epilogue_in_host_split_pieces(cfg: KernelConfig) -> None:
    """Pieces in M, N and K: earlier K pieces run the plain twin, the last one the epilogue, once."""
    m, n, k = 300, 264, 24 * _k_unit(cfg)
    kc = 8 * _k_unit(cfg)
    pieces = tuple(
        Piece(m0, m1, n0, n1, k0, min(k0 + kc, k))
        for m0, m1 in ((0, 256), (256, 300))
        for n0, n1 in ((0, 128), (128, 264))
        for k0 in range(0, k, kc)
    )
    run_and_compare(_plan(cfg, m, n, k, 0.5, 0.25, pieces=pieces))


@pytest.mark.parametrize("epi", ["bias_gelu", "dgelu_bgrad"])
def test_epilogue_empty_k(epi: str) -> None:
    """K = 0: the epilogue applies to beta * out."""
    cfg = next(c for c in EPI if c.epilogue == epi and c.lhs_format is F.BF16 and c.out_format is F.BF16)
    run_and_compare(_plan(cfg, 40, 72, 0, 1.0, 0.5))


def test_bias_grad_is_deterministic() -> None:
    """Several tile rows feed the same columns: two runs give the same bits."""
    cfg = next(c for c in EPI if c.epilogue == "dgelu_bgrad" and c.lhs_format is F.BF16 and c.out_format is F.FP32)
    plan = _plan(cfg, 520, 72, 2 * _k_unit(cfg), 1.0, 0.0)
    first = run_and_compare(plan).bias_grad
    again = _outputs(plan)
    launch.execute(again, "emulator")
    assert torch.equal(first, again.bias_grad)
