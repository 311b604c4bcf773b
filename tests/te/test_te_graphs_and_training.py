"""CUDA graph capture of a TE module with the plugin active, and a short training run's loss curve."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from te_real import assert_close, plugin_installed, requires_te, twin_modules

pytestmark = [pytest.mark.te, requires_te]


def test_make_graphed_callables_with_the_plugin() -> None:
    """The plugin's GEMMs are captured; replays (no Python) reproduce eager TE for new inputs."""
    import transformer_engine.pytorch as te

    ref, twin = twin_modules(lambda: te.Linear(512, 640, bias=True, params_dtype=torch.bfloat16))
    sample = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with plugin_installed() as plugin:
        graphed = te.make_graphed_callables(twin, (sample,), num_warmup_iters=2)
        captured = plugin.stats()
        assert captured["by_backend"].get("flydsl", 0) > 0 and captured["by_backend"].get("native", 0) == 0
        for seed in (1, 2):
            torch.manual_seed(seed)
            x = torch.randn(384, 512, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(384, 640, device="cuda", dtype=torch.bfloat16)
            xg = x.clone().requires_grad_(True)
            for p in twin.parameters():
                p.grad = None
            y = graphed(xg)
            y.backward(dy)
            xr = x.clone().requires_grad_(True)
            for p in ref.parameters():
                p.grad = None
            with native_gemm():
                yr = ref(xr)
                yr.backward(dy)
            torch.cuda.synchronize()
            assert_close("graphed output", y, yr, 1.5e-2)
            assert_close("graphed dgrad", xg.grad, xr.grad, 1.5e-2)
            assert_close("graphed wgrad", twin.weight.grad, ref.weight.grad, 1.5e-2)
            assert_close("graphed bgrad", twin.bias.grad, ref.bias.grad, 1.5e-2)
        assert plugin.stats()["total"] == captured["total"]  # replays run no Python, so no new calls


@contextmanager
def native_gemm() -> Iterator[None]:
    """TE's own GEMM inside a plugin-installed block (for the eager reference)."""
    import te_flydsl_plugin

    te_flydsl_plugin.uninstall()
    try:
        yield
    finally:
        te_flydsl_plugin.install()


def _train(model: torch.nn.Module, steps: int, data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    losses = []
    for i in range(steps):
        x, target = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x).float(), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_training_loss_curve_matches_native() -> None:
    import transformer_engine.pytorch as te

    hidden, seq, batch, steps = 256, 64, 4, 30

    def build() -> torch.nn.Module:
        return torch.nn.Sequential(
            *[
                te.TransformerLayer(
                    hidden, 1024, 4, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16
                )
                for _ in range(2)
            ]
        )

    ref, twin = twin_modules(build)
    gen = torch.Generator(device="cuda").manual_seed(11)
    data = [
        (
            torch.randn(seq, batch, hidden, device="cuda", dtype=torch.bfloat16, generator=gen),
            torch.randn(seq, batch, hidden, device="cuda", generator=gen) * 0.5,
        )
        for _ in range(4)
    ]
    native = _train(ref, steps, data)
    with plugin_installed() as plugin:
        plugged = _train(twin, steps, data)
    plugin.assert_routed(on_backend=steps * 2 * 12)
    assert plugged[-1] < plugged[0] * 0.9, plugged  # it learns
    for i, (a, b) in enumerate(zip(plugged, native, strict=True)):
        assert abs(a - b) <= 2e-2 * abs(b), f"step {i}: plugin loss {a:.5f} vs native {b:.5f}"
