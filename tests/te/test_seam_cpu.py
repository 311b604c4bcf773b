"""host/te.py and host/autoload.py against a fake TE (CPU): install, adapters, in-tree path, autoload."""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
import textwrap
import threading
from enum import Enum
from pathlib import Path

import pytest
import torch

from te_flydsl_plugin.host import autoload, te, te_in_tree, te_probe, views
from te_flydsl_plugin.host.views import Unsupported
from te_flydsl_plugin.operands import Fp8Operand, MXFP8Operand
from te_flydsl_plugin.spec import Format


def _tex():
    return importlib.import_module("transformer_engine_torch")


def test_install_is_idempotent_reversible_and_looked_up_at_call_time(fake_te: Path) -> None:
    tex = _tex()
    native = tex.generic_gemm
    assert not te.is_installed()
    assert te.install() is True
    wrapper = tex.generic_gemm
    assert te.is_installed() and wrapper is not native
    assert wrapper.__te_flydsl_native__ is native  # type: ignore[attr-defined]
    assert te.install() is False and tex.generic_gemm is wrapper  # no nesting
    gemm = importlib.import_module("transformer_engine.pytorch.cpp_extensions.gemm")
    a, b = torch.randn(5, 3), torch.randn(4, 3)
    torch.testing.assert_close(gemm.general_gemm(a, b, "TN"), b @ a.T)
    assert te.uninstall() is True
    assert tex.generic_gemm is native and not te.is_installed()
    assert te.uninstall() is False


def test_install_before_te_is_imported_loads_it(fake_te: Path) -> None:
    assert "transformer_engine_torch" not in sys.modules
    assert te.install() is True
    assert "transformer_engine.pytorch" in sys.modules and te.is_installed()


def test_install_from_many_threads_wraps_once(fake_te: Path) -> None:
    tex = _tex()
    native = tex.generic_gemm
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def go() -> None:
        barrier.wait()
        results.append(te.install())

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert tex.generic_gemm.__te_flydsl_native__ is native  # type: ignore[attr-defined]


def test_uninstall_leaves_a_later_patch_in_place(fake_te: Path) -> None:
    tex = _tex()
    te.install()

    def someone_else(*args: object, **kwargs: object) -> object:
        raise AssertionError("not called")

    tex.generic_gemm = someone_else
    assert not te.is_installed()
    with pytest.warns(RuntimeWarning, match="replaced by someone else"):
        assert te.uninstall() is True
    assert tex.generic_gemm is someone_else


def test_dtypes_of_both_te_enums_are_registered(fake_te: Path) -> None:
    te.install()
    tex = _tex()
    constants = importlib.import_module("transformer_engine.pytorch.constants")
    for enum in (tex.DType, constants.DType):
        assert views.format_of_dtype(enum.kBFloat16) is Format.BF16
        assert views.format_of_dtype(enum.kFloat16) is Format.FP16
        assert views.format_of_dtype(enum.kFloat32) is Format.FP32
        assert views.format_of_dtype(enum.kFloat8E4M3) is Format.FP8_E4M3
        assert views.format_of_dtype(enum.kFloat8E5M2) is Format.FP8_E5M2
        for other in ("kByte", "kInt32", "kFloat8E8M0", "kFloat4E2M1"):
            assert views.format_of_dtype(enum[other]) is Format.OTHER


def _storages():
    tex = _tex()
    fp8 = importlib.import_module("transformer_engine.pytorch.tensor.storage.float8_tensor_storage")
    mx = importlib.import_module("transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage")
    nv = importlib.import_module("transformer_engine.pytorch.tensor.storage.nvfp4_tensor_storage")
    return tex, fp8.Float8TensorStorage, mx.MXFP8TensorStorage, nv.NVFP4TensorStorage


def test_float8_storage_views(fake_te: Path) -> None:
    te.install()
    tex, Fp8, _, _ = _storages()
    data = torch.zeros(6, 4, dtype=torch.uint8)
    transpose = torch.zeros(4, 6, dtype=torch.uint8)
    scale = torch.ones(1)

    both = views.view(Fp8(data, transpose, scale, tex.DType.kFloat8E4M3, False))
    assert isinstance(both, Fp8Operand) and both.format is Format.FP8_E4M3
    assert both.data is data and both.transpose is transpose and both.scale_inv is scale  # no copies

    wgrad = views.view(Fp8(None, transpose, scale, tex.DType.kFloat8E5M2, False))
    assert isinstance(wgrad, Fp8Operand) and wgrad.data is None and wgrad.shape == (6, 4)
    assert wgrad.format is Format.FP8_E5M2

    stale = views.view(Fp8(data, transpose, scale, tex.DType.kFloat8E4M3, True))
    assert isinstance(stale, Fp8Operand) and stale.transpose is None and not stale.has_transpose

    empty = views.view(Fp8(None, transpose, scale, tex.DType.kFloat8E4M3, True))
    assert isinstance(empty, Unsupported) and "neither _data nor a valid _transpose" in empty.detail

    odd = views.view(Fp8(data, None, scale, tex.DType.kBFloat16, True))
    assert isinstance(odd, Unsupported) and odd.format is Format.OTHER


def test_mxfp8_storage_views(fake_te: Path) -> None:
    te.install()
    tex, _, Mx, _ = _storages()
    data = torch.zeros(160, 96, dtype=torch.uint8)
    rs = torch.zeros(256, 4, dtype=torch.uint8)
    cs = torch.zeros(8, 128, dtype=torch.uint8)
    row = views.view(Mx(data, rs, None, None, tex.DType.kFloat8E4M3))
    assert isinstance(row, MXFP8Operand) and row.format is Format.MXFP8_E4M3
    assert row.rowwise_data is data and row.rowwise_scale_inv is rs and row.columnwise_data is None
    col = views.view(Mx(None, rs, data, cs, tex.DType.kFloat8E5M2))  # stale rowwise scales ignored
    assert isinstance(col, MXFP8Operand) and col.rowwise_scale_inv is None and col.format is Format.MXFP8_E5M2
    swizzled = views.view(Mx(data, rs, None, None, tex.DType.kFloat8E4M3, with_gemm_swizzled_scales=True))
    assert isinstance(swizzled, Unsupported) and "swizzled" in swizzled.detail
    assert swizzled.shape == (160, 96)
    no_scale = views.view(Mx(data, None, None, None, tex.DType.kFloat8E4M3))
    assert isinstance(no_scale, Unsupported) and "without its scales" in no_scale.detail
    nothing = views.view(Mx(None, None, None, None, tex.DType.kFloat8E4M3))
    assert isinstance(nothing, Unsupported)


def test_other_te_classes_are_declined_with_a_reason(fake_te: Path) -> None:
    te.install()
    _, _, _, Nv = _storages()
    quantized = importlib.import_module("transformer_engine.pytorch.quantized_tensor")

    nv = views.view(Nv((8, 16)))
    assert isinstance(nv, Unsupported) and nv.format is Format.NVFP4 and nv.shape == (8, 16)
    assert "NVFP4TensorStorage" in nv.detail

    class FutureStorage(quantized.QuantizedTensorStorage):
        pass

    future = views.view(FutureStorage())
    assert isinstance(future, Unsupported) and future.format is Format.OTHER
    assert "FutureStorage" in future.detail and future.shape == ()


def test_rocm_in_tree_path_stands_aside_while_installed(fake_rocm_te: Path, monkeypatch) -> None:
    monkeypatch.setenv("NVTE_GEMM_BACKEND", "flydsl")
    gemm = importlib.import_module("transformer_engine.pytorch.cpp_extensions.gemm")
    a, b = torch.randn(5, 3), torch.randn(4, 3)
    assert gemm.general_gemm(a, b) == "in-tree"  # the in-tree path takes the call first
    assert te_probe.active_path()["path"] == "te-in-tree"
    original = gemm.get_gemm_backend

    writes: list[str] = []
    monkeypatch.setattr(os, "putenv", lambda key, value: writes.append(key))
    monkeypatch.setattr(os, "unsetenv", lambda key: writes.append(key))
    te.install()
    assert not writes  # the "default" answer was computed without writing the process environment
    torch.testing.assert_close(gemm.general_gemm(a, b), b @ a.T)
    assert gemm.IN_TREE_CALLS == ["TN"]
    info = te_probe.active_path()
    assert info["path"] == "plugin" and info["in_tree"] == {
        "getter_present": True,
        "neutralised": True,
        "flydsl_kernels_module": False,
    }
    assert os.environ["NVTE_GEMM_BACKEND"] == "flydsl"  # computing the "default" answer restored it

    te.uninstall()
    assert gemm.get_gemm_backend is original
    assert gemm.general_gemm(a, b) == "in-tree"


def test_default_answer_is_the_getters_own_without_the_environment(monkeypatch) -> None:
    """TE's getter runs against a private environment: its own answer (type included) for ``default``."""
    monkeypatch.setenv("NVTE_GEMM_BACKEND", "FlyDSL")
    backend = Enum("Backend", {"DEFAULT": "default", "FLYDSL": "flydsl"})

    @functools.cache
    def getter():
        return backend(os.getenv("NVTE_GEMM_BACKEND", "default").strip().lower())

    environ = os.environ

    def unseen():  # reads the real environment through a closure: the private copy never sees it
        return environ["NVTE_GEMM_BACKEND"].lower()

    assert te_in_tree.default_answer(getter) is backend.DEFAULT and getter() is backend.FLYDSL
    assert te_in_tree.default_answer(unseen) == "default"  # TE's documented default, not the live "flydsl"
    assert os.environ["NVTE_GEMM_BACKEND"] == "FlyDSL"


def test_active_path_on_plain_te(fake_te: Path) -> None:
    assert te_probe.active_path()["path"] == "te-not-loaded"
    importlib.import_module("transformer_engine.pytorch")
    assert te_probe.active_path()["path"] == "te"
    te.install()
    info = te_probe.active_path()
    assert info["path"] == "plugin" and info["transformer_engine"] == "2.20.2+fake"
    assert info["in_tree"]["getter_present"] is False


@pytest.mark.parametrize("value", ["", "default", "NATIVE"])
def test_autoload_does_nothing_without_a_plugin_backend(value: str) -> None:
    before = list(sys.meta_path)
    modules = set(sys.modules)
    assert autoload.arm({"NVTE_GEMM_BACKEND": value}) is False
    assert sys.meta_path == before
    assert set(sys.modules) == modules  # not even the entry points are read


def test_autoload_leaves_te_in_tree_names_alone(recwarn: pytest.WarningsRecorder) -> None:
    before = list(sys.meta_path)
    assert autoload.arm({"NVTE_GEMM_BACKEND": "triton"}) is False
    assert sys.meta_path == before and not recwarn.list


def test_autoload_switch_off() -> None:
    before = list(sys.meta_path)
    assert autoload.arm({"NVTE_GEMM_BACKEND": "flydsl", "NVTE_FLYDSL_AUTOLOAD": "0"}) is False
    assert sys.meta_path == before


def _run(code: str, root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path]), **env}
    full.pop("NVTE_FLYDSL_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, "-W", "always", "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


AUTOLOAD_THEN_TE = """
    from te_flydsl_plugin.host import autoload
    autoload.autoload()  # what torch runs at `import torch` through the torch.backends entry point
    import transformer_engine.pytorch
    import transformer_engine_torch as tex
    import te_flydsl_plugin
    print("installed", te_flydsl_plugin.is_installed(), hasattr(tex.generic_gemm, "__te_flydsl_native__"))
    print("hooks", sum(type(f).__name__ == "_PostImportFinder" for f in __import__("sys").meta_path))
"""


def test_autoload_installs_when_te_is_imported(fake_te: Path) -> None:
    r = _run(AUTOLOAD_THEN_TE, fake_te, {"NVTE_GEMM_BACKEND": "FlyDSL"})
    assert r.returncode == 0, r.stderr
    assert "installed True True" in r.stdout and "hooks 0" in r.stdout, r.stdout + r.stderr


def test_autoload_with_the_variable_unset_patches_nothing(fake_te: Path) -> None:
    r = _run(AUTOLOAD_THEN_TE, fake_te, {"NVTE_GEMM_BACKEND": ""})
    assert r.returncode == 0, r.stderr
    assert "installed False False" in r.stdout and "hooks 0" in r.stdout, r.stdout + r.stderr


def test_autoload_typo_warns_once_and_leaves_te_alone(fake_te: Path) -> None:
    r = _run(AUTOLOAD_THEN_TE + "    autoload.autoload()\n", fake_te, {"NVTE_GEMM_BACKEND": "flydls"})
    assert r.returncode == 0, r.stderr
    assert "installed False False" in r.stdout
    assert r.stderr.count("names no installed GEMM backend (installed: flydsl") == 1, r.stderr


def test_autoload_failure_warns_and_te_still_imports(fake_te: Path) -> None:
    code = """
        from te_flydsl_plugin.host import autoload, te
        def broken():
            raise RuntimeError("boom")
        te.install = broken
        autoload.autoload()
        import transformer_engine.pytorch
        import transformer_engine_torch as tex
        print("te ok", hasattr(tex.generic_gemm, "__te_flydsl_native__"))
    """
    r = _run(code, fake_te, {"NVTE_GEMM_BACKEND": "flydsl"})
    assert r.returncode == 0, r.stderr
    assert "te ok False" in r.stdout
    assert r.stderr.count("auto-registration failed (RuntimeError: boom)") == 1, r.stderr


def test_entry_point_with_the_variable_unset_imports_nothing_heavy() -> None:
    """torch imports the entry point on every `import torch`: unset, it must not pull in the plugin's core."""
    code = """
        import sys, time
        t = time.perf_counter()
        from te_flydsl_plugin.host import autoload
        autoload.autoload()
        ms = (time.perf_counter() - t) * 1e3
        heavy = sorted(m for m in ("torch", "pluggy", "importlib.metadata", "te_flydsl_plugin.host.dispatch",
                                   "te_flydsl_plugin.host.te") if m in sys.modules)
        print("HEAVY", heavy, "MS", ms)
    """
    r = _run(code, Path("."), {"NVTE_GEMM_BACKEND": ""})
    assert r.returncode == 0, r.stderr
    assert "HEAVY [] " in r.stdout, r.stdout
    assert float(r.stdout.split("MS")[1]) < 50, r.stdout


def test_autoload_arms_for_backend_names_not_entry_point_names(monkeypatch, recwarn) -> None:
    """The registry selects by backend name; an entry point may provide backends of other names, so
    auto-registration must not judge NVTE_GEMM_BACKEND by entry-point names (it leaves that to install)."""
    import importlib.metadata

    class EntryPoint:
        name = "acme-plugin"  # provides a backend called "acme": only the registry knows that

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: [EntryPoint()])
    before = list(sys.meta_path)
    try:
        assert autoload.arm({"NVTE_GEMM_BACKEND": "acme"}) is True
        assert not recwarn.list
    finally:
        sys.meta_path[:] = before


AUTOLOAD_THEN_INSTALL = """
    from te_flydsl_plugin.host import autoload
    autoload.autoload()
    import transformer_engine.pytorch
    import transformer_engine_torch as tex
    import te_flydsl_plugin
    print("patched", hasattr(tex.generic_gemm, "__te_flydsl_native__"))
    try:
        print("install returned", te_flydsl_plugin.install())
    except Exception as exc:
        print("install raised", type(exc).__name__, exc)
    print("patched", hasattr(tex.generic_gemm, "__te_flydsl_native__"))
"""


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {"NVTE_GEMM_BACKEND": "bogus"},
            "NVTE_GEMM_BACKEND='bogus' names no installed GEMM backend (installed: flydsl",
        ),
        (
            {"NVTE_GEMM_BACKEND": "flydsl", "NVTE_FLYDSL_EXECUTOR": "bogus"},
            "NVTE_FLYDSL_EXECUTOR='bogus' is not one of",
        ),
        (
            {"NVTE_GEMM_BACKEND": "flydsl", "NVTE_FLYDSL_TARGET_ARCH": "bogus"},
            "unknown NVTE_FLYDSL_TARGET_ARCH 'bogus'",
        ),
    ],
)
def test_a_bad_setting_warns_once_at_import_and_install_refuses(fake_te: Path, env, named) -> None:
    """Loud, for a training script: one warning line when TE loads (no source line under it), TE keeps
    its own GEMM; an explicit install() raises the same one-line SettingsError instead of patching."""
    r = _run(AUTOLOAD_THEN_INSTALL, fake_te, {"NVTE_FLYDSL_EXECUTOR": "", "NVTE_FLYDSL_TARGET_ARCH": "", **env})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and named in lines[0] and "AutoloadWarning" in lines[0], r.stderr
    assert r.stdout.splitlines()[0] == "patched False", r.stdout
    assert f"install raised SettingsError {named}" in r.stdout or "install raised BackendSelectionError" in r.stdout
    assert named in r.stdout.splitlines()[1] and r.stdout.splitlines()[2] == "patched False", r.stdout


@pytest.mark.parametrize("missing", ["transformer_engine", "transformer_engine.pytorch"])
def test_install_without_te_is_one_clear_line(monkeypatch, missing: str) -> None:
    monkeypatch.delitem(sys.modules, "transformer_engine_torch", raising=False)
    monkeypatch.setitem(sys.modules, missing, None)  # the import fails as if TE were not installed
    with pytest.raises(ImportError) as info:
        te.install()
    message = str(info.value)
    assert "\n" not in message and "Transformer Engine" in message and "install()" in message, message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained traceback
    assert not te.is_installed()
