"""Real TE modules through the plugin (reference executor) against the same modules on TE's own GEMM.

Shapes keep M != N != K (tokens 4*96=384, in 512, out 640 / ffn 1536) so a swapped operand or a
mis-derived dimension cannot pass. Forward outputs and every gradient are compared; the counters
must show each GEMM on the FlyDSL backend, and the recorded epilogues show that the fused bias,
bias-gradient, GELU and dGELU paths were the ones exercised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from te_real import assert_same_step, plugin_installed, requires_te, step, twin_modules

pytestmark = [pytest.mark.te, requires_te]

TOKENS = (4, 96)
IN, OUT, FFN = 512, 640, 1536
TOL = {torch.bfloat16: 1.5e-2, torch.float16: 3e-3}
FP8_TOL = 3e-2


def _recipes() -> dict[str, Callable[[], Any]]:
    from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format

    return {
        "delayed": lambda: DelayedScaling(fp8_format=Format.HYBRID),
        "current": lambda: Float8CurrentScaling(fp8_format=Format.HYBRID),
    }


def _compare(
    build: Callable[[], torch.nn.Module],
    out_features: int,
    dtype: torch.dtype,
    tol: float,
    recipe: Callable[[], Any] | None = None,
    prepare: Callable[[torch.nn.Module], None] = lambda m: None,
):
    ref, twin = twin_modules(build)
    prepare(ref)
    prepare(twin)
    x = torch.randn(*TOKENS, IN, device="cuda", dtype=dtype)
    dy = torch.randn(*TOKENS, out_features, device="cuda", dtype=dtype)
    want = step(ref, x, dy, recipe() if recipe else None)
    with plugin_installed() as plugin:
        got = step(twin, x, dy, recipe() if recipe else None)
    assert_same_step(got, want, tol)
    return plugin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_linear(dtype: torch.dtype, bias: bool) -> None:
    import transformer_engine.pytorch as te

    plugin = _compare(lambda: te.Linear(IN, OUT, bias=bias, params_dtype=dtype), OUT, dtype, TOL[dtype])
    plugin.assert_routed(on_backend=3)
    assert [p.layout.value for p in plugin.ran] == ["TN", "NN", "NT"]
    assert plugin.epilogues() == (["bias", "plain", "bgrad"] if bias else ["plain"] * 3)
    fprop = plugin.ran[0]
    assert (fprop.m, fprop.n, fprop.k, fprop.out_shape) == (384, OUT, IN, (*TOKENS, OUT))


def test_linear_fuse_wgrad_accumulation() -> None:
    import transformer_engine.pytorch as te

    def prepare(m: torch.nn.Module) -> None:
        torch.manual_seed(7)  # the same earlier gradient in both twins
        m.weight.main_grad = torch.randn(OUT, IN, device="cuda", dtype=torch.float32)

    plugin = _compare(
        lambda: te.Linear(IN, OUT, bias=True, params_dtype=torch.bfloat16, fuse_wgrad_accumulation=True),
        OUT,
        torch.bfloat16,
        TOL[torch.bfloat16],
        prepare=prepare,
    )
    plugin.assert_routed(on_backend=3)
    wgrad = plugin.ran[2]
    assert wgrad.accumulate and wgrad.out_given and wgrad.out_dtype.value == "fp32"


def test_layernorm_linear() -> None:
    import transformer_engine.pytorch as te

    plugin = _compare(
        lambda: te.LayerNormLinear(IN, OUT, bias=True, params_dtype=torch.bfloat16),
        OUT,
        torch.bfloat16,
        TOL[torch.bfloat16],
    )
    plugin.assert_routed(on_backend=3)


@pytest.mark.parametrize("gemm_gelu", [False, True], ids=["bias_gelu_nvfusion", "gemm_gelu_fusion"])
def test_layernorm_mlp_gelu_paths(gemm_gelu: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """TE fuses GELU into the GEMM (bias_gelu forward, dgelu backward) only without its nvfuser path."""
    import transformer_engine.pytorch as te

    monkeypatch.setenv("NVTE_BIAS_GELU_NVFUSION", "0" if gemm_gelu else "1")  # read at construction
    plugin = _compare(
        lambda: te.LayerNormMLP(IN, FFN, bias=True, params_dtype=torch.bfloat16, activation="gelu"),
        IN,
        torch.bfloat16,
        TOL[torch.bfloat16],
    )
    plugin.assert_routed(on_backend=6)
    epilogues = plugin.epilogues()
    if gemm_gelu:
        assert epilogues[0] == "bias_gelu" and "dgelu" in epilogues, epilogues
    else:
        assert "gelu" not in "".join(epilogues), epilogues


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_linear_fp8(recipe: str) -> None:
    import transformer_engine.pytorch as te

    plugin = _compare(
        lambda: te.Linear(IN, OUT, bias=True, params_dtype=torch.bfloat16),
        OUT,
        torch.bfloat16,
        FP8_TOL,
        recipe=_recipes()[recipe],
    )
    plugin.assert_routed(on_backend=3)
    fprop, dgrad, wgrad = plugin.ran
    assert (fprop.a.format.value, fprop.b.format.value) == ("fp8_e4m3", "fp8_e4m3")
    assert (dgrad.a.format.value, dgrad.b.format.value) == ("fp8_e4m3", "fp8_e5m2")  # HYBRID
    assert not wgrad.a.rowwise and wgrad.a.columnwise  # TE's wgrad input: _data=None, transpose only


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_layernorm_mlp_fp8(recipe: str) -> None:
    import transformer_engine.pytorch as te

    plugin = _compare(
        lambda: te.LayerNormMLP(IN, FFN, bias=True, params_dtype=torch.bfloat16, activation="gelu"),
        IN,
        torch.bfloat16,
        FP8_TOL,
        recipe=_recipes()[recipe],
    )
    plugin.assert_routed(on_backend=6)


@pytest.mark.parametrize("recipe", [None, "current"], ids=["bf16", "fp8_current"])
def test_transformer_layer(recipe: str | None) -> None:
    import transformer_engine.pytorch as te

    hidden, heads, seq, batch = 256, 4, 128, 2

    def build() -> torch.nn.Module:
        return te.TransformerLayer(
            hidden,
            1024,
            heads,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            params_dtype=torch.bfloat16,
        )

    ref, twin = twin_modules(build)
    x = torch.randn(seq, batch, hidden, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(seq, batch, hidden, device="cuda", dtype=torch.bfloat16)
    make = _recipes()[recipe] if recipe else None
    want = step(ref, x, dy, make() if make else None)
    with plugin_installed() as plugin:
        got = step(twin, x, dy, make() if make else None)
    # FP8: two requantisations of slightly different activations per layer flip some E5M2 codes.
    assert_same_step(got, want, 5e-2 if recipe else 2e-2, zero_by_math={"key_bias": "query_bias"})
    plugin.assert_routed(on_backend=12)  # QKV, proj, fc1, fc2: fprop + dgrad + wgrad each
