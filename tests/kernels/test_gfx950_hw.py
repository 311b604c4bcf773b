"""The backed configs on real gfx950 hardware (MI355X): numerics against the reference executor,
edge shapes, an operand over 2 GiB, and proof that the compiled kernel (not a fallback) ran.

Skipped, with the reason, on every machine without a gfx950 GPU (CI, NVIDIA hosts, laptops).
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from te_flydsl_plugin.flydsl import executors, family
from te_flydsl_plugin.flydsl.executors.reference import run as run_reference
from te_flydsl_plugin.flydsl.kernels.config import MAX_LAUNCH_BYTES, KernelConfig
from te_flydsl_plugin.flydsl.launch_log import LaunchLog
from te_flydsl_plugin.flydsl.plan import split
from te_flydsl_plugin.flydsl.plan_types import GemmPlan
from te_flydsl_plugin.spec import Format

from .helpers import outputs, plan_for, run_and_compare, tolerance, with_epilogue


def _gfx950_reason() -> str | None:
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        return "needs a ROCm GPU (torch.cuda with HIP): none here"
    arch = torch.cuda.get_device_properties(0).gcnArchName
    if not arch.startswith("gfx950"):
        return f"needs gfx950 (MI355X), found {arch}"
    return None


_REASON = _gfx950_reason()
pytestmark = [pytest.mark.gfx950, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


def _reference_out(plan: GemmPlan, out_before: torch.Tensor) -> torch.Tensor:
    """What the reference executor writes for the same plan (run on a copy of the output)."""
    ref = dataclasses.replace(plan, problem=types.SimpleNamespace(epilogue="plain"), out=out_before.clone())
    run_reference(ref)
    return ref.out


def _run(plan: GemmPlan) -> None:
    cfg = plan.config
    before = plan.out.clone()
    with LaunchLog() as log:
        executors.run(plan, "flydsl")
    torch.cuda.synchronize()
    assert log.count("gemm", "flydsl") == len(plan.pieces), "the compiled kernel did not run"
    want = _reference_out(plan, before)
    atol, rtol = tolerance(cfg, plan.lhs.k)
    torch.testing.assert_close(plan.out.float(), want.float(), atol=atol, rtol=rtol)


def _fit(x: int, cfg: KernelConfig, k_major: bool) -> int:
    unit = 16 // cfg.lhs_format.itemsize
    return x if k_major else x // unit * unit


@pytest.mark.parametrize("shape", [(256, 256, 64), (1000, 1500, 8 * 53), (37, 4100, 512), (4096, 4096, 4096)])
# MXFP8 configs need packed block scales: test_mx_gemm.py runs them; fused epilogues below.
@pytest.mark.parametrize(
    "cfg", [c for c in family.BACKED if c.scaling != "mx" and c.epilogue == "plain"], ids=lambda c: c.name
)
def test_backed_matches_reference(cfg: KernelConfig, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    k = k // (16 // cfg.lhs_format.itemsize) * (16 // cfg.lhs_format.itemsize)
    plan = plan_for(cfg, _fit(m, cfg, cfg.lhs_k_major), _fit(n, cfg, cfg.rhs_k_major), k, 0.5, 0.25, "cuda")
    _run(plan)


@pytest.mark.parametrize("shape", [(1000, 1504, 8 * 53), (4096, 4096, 4096)])
@pytest.mark.parametrize(
    "cfg", [c for c in family.BACKED if c.scaling != "mx" and c.epilogue != "plain"], ids=lambda c: c.name
)
def test_fused_epilogue_matches_reference(cfg: KernelConfig, shape: tuple[int, int, int]) -> None:
    """bias / GELU / dGELU / bias-gradient epilogues on hardware, and their bias gradients the same bits
    on a second run (fixed-order reductions)."""
    m, n, k = shape
    plan = plan_for(cfg, _fit(m, cfg, cfg.lhs_k_major), _fit(n, cfg, cfg.rhs_k_major), k, 0.5, 0.25, "cuda")
    got = run_and_compare(with_epilogue(plan, m + n), "flydsl")
    if got.bias_grad is not None:
        again = outputs(with_epilogue(plan, m + n))
        executors.run(again, "flydsl")
        torch.cuda.synchronize()
        assert torch.equal(got.bias_grad, again.bias_grad)


def test_operand_over_2gib() -> None:
    """Llama-3.1-405B fprop at micro-batch 4 (B is 3.5 GB): the plan's pieces, 64-bit bases."""
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4)
    m, n, k = 32768, 1024, 53248
    plan = plan_for(cfg, m, n, k, device="cuda")
    pieces = split(m, n, k, plan.lhs, plan.rhs, plan.out.element_size(), 8, MAX_LAUNCH_BYTES)
    assert len(pieces) > 1
    _run(dataclasses.replace(plan, pieces=pieces))


def test_launch_is_graph_capturable() -> None:
    """No host sync and no allocation outside torch's caching allocator: a CUDA/HIP graph replays it."""
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32, waves=4)
    plan = plan_for(cfg, 512, 512, 512, device="cuda")
    executors.run(plan, "flydsl")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        executors.run(plan, "flydsl")
    plan.out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    want = _reference_out(plan, torch.zeros_like(plan.out))
    torch.testing.assert_close(plan.out, want, atol=1e-2, rtol=1e-3)


@pytest.mark.parametrize("epi", ["bias_gelu", "dgelu_bgrad", "bgrad"])
def test_fused_epilogue_is_graph_capturable(epi: str) -> None:
    """The epilogue's extra work (fp32 bias, partial workspaces and their reduction) replays in a graph."""
    cfg = next(c for c in family.BACKED if c.epilogue == epi and c.lhs_format is Format.BF16)
    plan = with_epilogue(plan_for(cfg, 512, 512, 512, device="cuda"), 7)
    executors.run(outputs(plan), "flydsl")  # compile outside the capture
    got = outputs(plan)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        executors.run(got, "flydsl")
    graph.replay()
    torch.cuda.synchronize()
    want = outputs(plan)
    run_reference(want)
    atol, rtol = tolerance(cfg, 512)
    torch.testing.assert_close(got.out.float(), want.out.float(), atol=atol, rtol=rtol)
    if want.bias_grad is not None:
        torch.testing.assert_close(got.bias_grad.float(), want.bias_grad.float(), atol=atol * 512**0.5, rtol=rtol)
