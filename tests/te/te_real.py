"""Shared pieces of the real-TE tests: the skip gate, the plugin fixture, and comparisons.

The plugin runs with the FlyDSL backend's ``reference`` executor, which executes every accepted GEMM
with torch (on the H200's CUDA) from exactly the operands the gfx950 kernel would be handed. Each test
compares against the same model run by TE's own GEMM, and asserts from the plugin's counters where
every GEMM ran: a test that passes because its GEMMs fell back to TE tests nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch


def skip_reason() -> str:
    """Why the real-TE tests cannot run here ("" when they can)."""
    if not torch.cuda.is_available():
        return "needs a CUDA device (real Transformer Engine runs only there)"
    if importlib.util.find_spec("transformer_engine") is None:
        return "needs Transformer Engine for PyTorch (../shared/tools/te-on-device/ installs 2.20.2)"
    return ""


requires_te = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "runs")


@dataclass
class Plugin:
    """The installed plugin in a test: what ran on the backend, and the dispatcher's counters."""

    ran: list[Any] = field(default_factory=list)  # GemmProblem of every GEMM the backend executed
    final: dict[str, Any] | None = None  # the counters as they were when the plugin was uninstalled

    def stats(self) -> dict[str, Any]:
        import te_flydsl_plugin

        return self.final if self.final is not None else te_flydsl_plugin.stats()

    def epilogues(self) -> list[str]:
        return [p.epilogue for p in self.ran]

    def assert_routed(self, on_backend: int, native: int = 0) -> dict[str, Any]:
        """Exactly ``on_backend`` GEMMs ran on FlyDSL and ``native`` on TE; every decline has reasons."""
        s = self.stats()
        assert s["by_backend"].get("flydsl", 0) == on_backend == len(self.ran), s
        assert s["by_backend"].get("native", 0) == native, s
        for f in s["fallbacks"]:
            assert f["reasons"], f"a GEMM fell back without a reason: {f}"
        return s


@contextmanager
def plugin_installed(executor: str = "reference") -> Iterator[Plugin]:
    """Install the seam with the FlyDSL backend and ``executor``; record the problems it executes."""
    import te_flydsl_plugin
    from te_flydsl_plugin.host import dispatch

    d = dispatch.configure(backend="flydsl", executor=executor, strict=False)
    record = Plugin()
    backend = d.backend
    assert backend is not None
    run = backend.run

    def recording_run(problem: Any, call: Any) -> list[Any]:
        record.ran.append(problem)
        return run(problem, call)

    backend.run = recording_run  # type: ignore[method-assign]
    te_flydsl_plugin.install()
    te_flydsl_plugin.reset_stats()
    try:
        yield record
    finally:
        record.final = te_flydsl_plugin.stats()
        te_flydsl_plugin.uninstall()
        del backend.run
        dispatch.configure(backend="native")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative error in the Frobenius norm (robust to a few bf16 rounding flips)."""
    got, want = got.detach().float(), want.detach().float()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.isfinite(got).all(), "non-finite values"
    return float((got - want).norm() / want.norm().clamp_min(1e-12))


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = rel_err(got, want)
    assert err < tol, f"{name}: relative error {err:.3e} >= {tol:.1e}"


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gradient, including ``main_grad`` where fused wgrad accumulation wrote it."""
    out = {}
    for name, p in module.named_parameters():
        if getattr(p, "main_grad", None) is not None:
            out[name + ".main_grad"] = p.main_grad.clone()
        if p.grad is not None:
            out[name + ".grad"] = p.grad.clone()
    return out


@dataclass
class StepResult:
    out: torch.Tensor
    dx: torch.Tensor
    grads: dict[str, torch.Tensor]


def twin_modules(build: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two modules with identical weights: one for TE's own GEMM, one for the plugin."""
    torch.manual_seed(1234)
    ref = build()
    torch.manual_seed(1234)
    twin = build()
    twin.load_state_dict(ref.state_dict())
    return ref, twin


def step(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, recipe: Any = None) -> StepResult:
    """One forward + backward of ``module`` on a fresh leaf copy of ``x`` with output gradient ``dy``."""
    import transformer_engine.pytorch as te

    x = x.detach().clone().requires_grad_(True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = module(x)
    y.backward(dy)
    torch.cuda.synchronize()
    return StepResult(y.detach(), x.grad.detach(), grads(module))


def assert_same_step(got: StepResult, want: StepResult, tol: float, zero_by_math: dict[str, str] | None = None) -> None:
    """Outputs and every gradient agree within ``tol`` (relative, Frobenius).

    ``zero_by_math`` maps a gradient that is zero in exact arithmetic (e.g. attention's key bias:
    softmax ignores a per-query constant) to a sibling gradient of the same scale; its error is
    measured against that sibling's norm, since relative to its own rounding noise it means nothing.
    """
    assert_close("forward output", got.out, want.out, tol)
    assert_close("input gradient", got.dx, want.dx, tol)
    assert got.grads.keys() == want.grads.keys()
    zero_by_math = zero_by_math or {}
    for name in want.grads:
        sibling = next((v for k, v in zero_by_math.items() if k in name), None)
        if sibling is None:
            assert_close(f"gradient {name}", got.grads[name], want.grads[name], tol)
            continue
        scale = want.grads[name.replace(next(k for k in zero_by_math if k in name), sibling)].float().norm()
        diff = (got.grads[name].float() - want.grads[name].float()).norm()
        assert diff < tol * scale, f"gradient {name}: error {diff:.3e} >= {tol:.1e} x {sibling} norm {scale:.3e}"
