"""Registry: entry-point discovery with fake distributions, error isolation, name clashes, selection."""

from __future__ import annotations

import sys
import types

import pytest

from te_flydsl_plugin.host import dispatch, registry
from te_flydsl_plugin.spec import Verdict, hookimpl


class FakeBackend:
    def __init__(self, name: str):
        self.name, self.version = name, "9.9"

    def capabilities(self):
        raise NotImplementedError

    def availability(self) -> Verdict:
        return Verdict.yes()

    def check(self, problem) -> Verdict:
        return Verdict.yes()

    def run(self, problem, call):
        return ["fake", None, None, None]


class FakeDist:
    def __init__(self, name: str):
        self.metadata = {"Name": name}
        self.version = "1.2.3"


class FakeEntryPoint:
    def __init__(self, name: str, module: str, dist: str):
        self.name, self.value, self.dist = name, module, FakeDist(dist)

    def load(self):
        __import__(self.value)
        return sys.modules[self.value]


@pytest.fixture
def plugin_modules(monkeypatch):
    def make(modname: str, *backend_names: str, broken: str = ""):
        mod = types.ModuleType(modname)
        if broken == "hook":

            @hookimpl
            def te_gemm_backends():
                raise RuntimeError("hook exploded")

        else:

            @hookimpl
            def te_gemm_backends():
                return [FakeBackend(n) for n in backend_names]

        mod.te_gemm_backends = te_gemm_backends
        monkeypatch.setitem(sys.modules, modname, mod)

    make("fake_good", "Alpha")
    make("fake_other", "beta")
    make("fake_clash", "ALPHA")
    make("fake_hook_broken", broken="hook")
    return make


def test_discovery_isolates_broken_plugins(plugin_modules):
    plugin_modules("fake_nameless", "")
    plugin_modules("fake_none_name", None)
    eps = [
        FakeEntryPoint("nameless", "fake_nameless", "nameless-dist"),
        FakeEntryPoint("none_name", "fake_none_name", "none-dist"),
        FakeEntryPoint("good", "fake_good", "good-dist"),
        FakeEntryPoint("missing", "fake_module_that_does_not_exist", "missing-dist"),
        FakeEntryPoint("hookfail", "fake_hook_broken", "hook-dist"),
        FakeEntryPoint("other", "fake_other", "other-dist"),
    ]
    reg = registry.load(eps)
    assert sorted(reg.backends) == ["alpha", "beta"]
    status = {p.name: (p.status, p.error) for p in reg.plugins}
    assert status["good"] == ("loaded", "")
    assert status["missing"][0] == "error" and "ModuleNotFoundError" in status["missing"][1]
    assert status["hookfail"][0] == "error" and "hook exploded" in status["hookfail"][1]
    assert status["nameless"][0] == status["none_name"][0] == "error" and "no name" in status["none_name"][1]
    assert reg.plugins[2].distribution == "good-dist" and reg.plugins[2].version == "1.2.3"


@pytest.mark.parametrize("order", [1, -1])
def test_two_backends_with_one_name_is_an_error_naming_both(plugin_modules, order):
    """Neither provider wins (whichever site-packages lists first must not take the dispatch)."""
    eps = [FakeEntryPoint("good", "fake_good", "good-dist"), FakeEntryPoint("clash", "fake_clash", "clash-dist"),
           FakeEntryPoint("other", "fake_other", "other-dist")][::order]  # fmt: skip
    reg = registry.load(eps)
    assert sorted(reg.backends) == ["beta"]
    status = {p.name: p for p in reg.plugins}
    for name in ("good", "clash"):
        err = status[name].error
        assert status[name].status == "error" and "good-dist" in err and "clash-dist" in err and "'alpha'" in err
    assert status["other"].status == "loaded"
    with pytest.raises(registry.BackendSelectionError, match=r"good-dist.*clash-dist|clash-dist.*good-dist"):
        reg.get("Alpha")


def test_selection_is_case_insensitive_and_unknown_names_list_installed(plugin_modules):
    reg = registry.load([FakeEntryPoint("good", "fake_good", "g"), FakeEntryPoint("o", "fake_other", "o")])
    assert reg.get("ALPHA").name == "Alpha"
    assert reg.get(" Beta ").name == "beta"
    with pytest.raises(registry.BackendSelectionError, match=r"installed: alpha, beta"):
        reg.get("cublas")


@pytest.mark.parametrize("value", [None, "", "default", "DEFAULT", "native", " Native "])
def test_native_names_patch_nothing(value):
    env = {} if value is None else {"NVTE_GEMM_BACKEND": value}
    assert dispatch.Settings.from_env(env).backend == ""


def test_settings_are_read_from_the_environment_once():
    env = {"NVTE_GEMM_BACKEND": "FlyDSL", "NVTE_GEMM_BACKEND_STRICT": "1", "NVTE_GEMM_BACKEND_REPORT": "yes",
           "NVTE_FLYDSL_TARGET_ARCH": "gfx950"}  # fmt: skip
    s = dispatch.Settings.from_env(env)
    assert (s.backend, s.strict, s.report, s.target_arch) == ("flydsl", True, True, "gfx950")


def test_the_real_flydsl_entry_point_is_installed():
    reg = registry.load()
    assert "flydsl" in reg.backends, [p.error for p in reg.plugins]
    record = next(p for p in reg.plugins if p.name == "flydsl")
    assert record.value == "te_flydsl_plugin.flydsl.plugin" and record.distribution == "te-flydsl-plugin"


def test_unknown_backend_fails_loudly():
    with pytest.raises(registry.BackendSelectionError, match="flydsl"):
        dispatch.configure(backend="nosuchbackend", env={})
    dispatch.configure(backend="default", env={})


def test_settings_are_validated_when_the_dispatcher_is_created():
    from te_flydsl_plugin.spec import SettingsError

    try:
        d = dispatch.configure(backend="flydsl", executor="reference", env={"NVTE_FLYDSL_TARGET_ARCH": " GFX950 "})
        assert d.settings.target_arch == "gfx950"
        with pytest.raises(SettingsError, match="unknown NVTE_FLYDSL_TARGET_ARCH 'gfx9999'"):
            dispatch.configure(backend="flydsl", env={"NVTE_FLYDSL_TARGET_ARCH": "gfx9999"})
        with pytest.raises(SettingsError, match="executor 'bogus' is not one of auto, flydsl, reference, emulator"):
            dispatch.configure(backend="flydsl", executor="bogus", env={})
        assert issubclass(registry.BackendSelectionError, SettingsError)
    finally:
        dispatch.configure(backend="default", env={})


def test_choosing_an_executor_never_changes_the_process_wide_backend():
    """configure(executor=...) gives its dispatcher the backend's with_executor(): the registry's object stays."""
    from te_flydsl_plugin.flydsl.plugin import backend

    before = backend().requested
    try:
        d = dispatch.configure(backend="flydsl", executor="reference", env={})
        assert d.backend is not backend() and d.backend.requested == "reference"
        assert registry.registry().get("flydsl") is backend() and backend().requested == before
        assert dispatch.configure(backend="flydsl", env={}).backend is backend()
    finally:
        dispatch.configure(backend="default", env={})
