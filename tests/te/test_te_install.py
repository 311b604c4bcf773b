"""The seam on real TE: the patch point, reversibility, the adapters on TE's real classes, autoload."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from te_real import plugin_installed, requires_te

pytestmark = [pytest.mark.te, requires_te]


def test_generic_gemm_is_replaced_and_restored() -> None:
    import transformer_engine_torch as tex

    import te_flydsl_plugin
    from te_flydsl_plugin.host import te_probe

    native = tex.generic_gemm
    with plugin_installed():
        assert te_flydsl_plugin.is_installed()
        assert tex.generic_gemm is not native and tex.generic_gemm.__te_flydsl_native__ is native
        assert te_flydsl_plugin.install() is False  # idempotent, no nesting
        assert te_probe.active_path()["path"] == "plugin"
    assert tex.generic_gemm is native and not te_flydsl_plugin.is_installed()
    assert te_probe.active_path()["path"] == "te"  # NVIDIA TE has no in-tree GEMM backend getter


def test_general_gemm_reaches_the_plugin_at_call_time() -> None:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    w = torch.randn(640, 512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(3, 128, 512, device="cuda", dtype=torch.bfloat16)
    with plugin_installed() as plugin:
        out, bias_grad, gelu_input, extra = general_gemm(w, x, out_dtype=torch.bfloat16)
    plugin.assert_routed(on_backend=1)
    assert out.shape == (3, 128, 640) and bias_grad is None and gelu_input is None and extra is None
    torch.testing.assert_close(out.float(), (x.float() @ w.float().T), rtol=2e-2, atol=2e-1)


def test_real_te_classes_become_views() -> None:
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.constants import DType
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer

    from te_flydsl_plugin.host import views
    from te_flydsl_plugin.operands import Fp8Operand
    from te_flydsl_plugin.spec import Format

    with plugin_installed():
        q = Float8CurrentScalingQuantizer(tex.DType.kFloat8E5M2, device=torch.device("cuda"))
        t = q(torch.randn(256, 128, device="cuda", dtype=torch.bfloat16))  # a Float8Tensor (torch subclass)
        v = views.view(t)
        assert isinstance(v, Fp8Operand) and v.format is Format.FP8_E5M2 and v.data is t._data
        assert v.scale_inv is t._scale_inv
        for enum in (tex.DType, DType):
            assert views.format_of_dtype(enum.kBFloat16) is Format.BF16
            assert views.format_of_dtype(enum.kFloat8E4M3) is Format.FP8_E4M3
            assert views.format_of_dtype(enum.kFloat4E2M1) is Format.OTHER


def _has_torch_entry_point() -> bool:
    return any(
        ep.value.startswith("te_flydsl_plugin") for ep in importlib.metadata.entry_points(group="torch.backends")
    )


@pytest.mark.skipif(
    not _has_torch_entry_point(), reason="te-flydsl-plugin's torch.backends entry point is not installed"
)
@pytest.mark.parametrize("backend", ["flydsl", ""], ids=["selected", "unset"])
def test_unmodified_script_is_routed_by_autoload(backend: str) -> None:
    script = textwrap.dedent(
        """
        import torch
        import transformer_engine.pytorch as te
        import te_flydsl_plugin
        m = te.Linear(512, 640, params_dtype=torch.bfloat16)
        x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        m(x).sum().backward()
        s = te_flydsl_plugin.stats()
        print("ROUTED", te_flydsl_plugin.is_installed(), s["total"], s["by_backend"].get("flydsl", 0))
        """
    )
    env = {**os.environ, "NVTE_GEMM_BACKEND": backend, "NVTE_FLYDSL_EXECUTOR": "reference"}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("ROUTED True 3 3" if backend else "ROUTED False 0 0") in r.stdout, r.stdout + r.stderr[-3000:]
