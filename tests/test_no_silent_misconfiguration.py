"""Mistakes in the project's own wiring fail loudly instead of reading as "nothing backed", default tiles,
or a plugin with zero backends; discovery uses one metadata library (the standard library's)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from te_flydsl_plugin.flydsl import matrix, plan
from te_flydsl_plugin.flydsl.kernels.select import select
from te_flydsl_plugin.host import registry
from te_flydsl_plugin.spec import Format, hookimpl

ROOT = Path(__file__).resolve().parents[1]


def test_a_broken_kernel_family_is_an_import_error_not_an_empty_matrix(monkeypatch):
    monkeypatch.setitem(sys.modules, "te_flydsl_plugin.flydsl.family", None)
    with pytest.raises(ImportError):
        matrix._backed()


def test_a_broken_tile_heuristic_is_an_import_error_not_default_tiles(monkeypatch):
    problem = SimpleNamespace(m=300, n=200, k=96, out_dtype=Format.BF16, result_dtype=Format.BF16, epilogue="plain")
    operand = SimpleNamespace(format=Format.BF16, k_major=True)
    assert plan.config_for(problem, operand, operand) == select(plan.KernelConfig(
        Format.BF16, Format.BF16, True, True, Format.BF16, "plain"), 300, 200, 96)  # fmt: skip
    monkeypatch.setitem(sys.modules, "te_flydsl_plugin.flydsl.kernels.select", None)
    monkeypatch.delitem(sys.modules, "te_flydsl_plugin.flydsl.plan")
    with pytest.raises(ImportError):
        importlib.import_module("te_flydsl_plugin.flydsl.plan")


class _EntryPoint:
    def __init__(self, module: str):
        self.name, self.value, self.dist = module, module, None

    def load(self):
        return sys.modules[self.value]


def test_a_misspelt_hookimpl_is_a_plugin_error(monkeypatch):
    misspelt = types.ModuleType("fake_misspelt")

    @hookimpl
    def te_gemm_backend():  # the hook is te_gemm_backends
        raise AssertionError("never called")

    misspelt.te_gemm_backend = te_gemm_backend
    monkeypatch.setitem(sys.modules, "fake_misspelt", misspelt)
    unmarked = types.ModuleType("fake_unmarked")
    unmarked.te_gemm_backends = lambda: []  # no @hookimpl: pluggy would never call it
    monkeypatch.setitem(sys.modules, "fake_unmarked", unmarked)
    reg = registry.load([_EntryPoint("fake_misspelt"), _EntryPoint("fake_unmarked")])
    misspelt_rec, unmarked_rec = reg.plugins
    assert misspelt_rec.status == "error" and "te_gemm_backend" in misspelt_rec.error, misspelt_rec
    assert unmarked_rec.status == "error" and "implements no te_gemm_backends hook" in unmarked_rec.error


def test_discovery_uses_the_standard_library_metadata_only():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "importlib-metadata" not in pyproject and "importlib_metadata" not in pyproject
    code = (
        "import sys; from te_flydsl_plugin.host import registry; from te_flydsl_plugin import cli; "
        "registry.load(); cli._version('torch'); print('importlib_metadata' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr
