"""Dispatcher: one check per distinct problem, counters, warn-once, strict mode, the exit report, threads."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin.host import dispatch
from te_flydsl_plugin.spec import Reason, ReasonCode, Verdict


class CountingBackend:
    """Declines K=64, accepts the rest; counts check() calls."""

    name, version = "counting", "1"

    def __init__(self, availability: Verdict | None = None, raises: bool = False):
        self.checks = 0
        self._availability = availability if availability is not None else Verdict.yes()
        self.raises = raises

    def capabilities(self):
        raise NotImplementedError

    def availability(self) -> Verdict:
        return self._availability

    def check(self, problem) -> Verdict:
        self.checks += 1
        if self.raises:
            raise KeyError("bug in check")
        if problem.k == 64:
            return Verdict.no(Reason(ReasonCode.ALIGNMENT, "k=64 is declined by this test backend", "k"))
        return Verdict.yes()

    def run(self, problem, call):
        return ["backend", None, None, None]


@pytest.fixture
def use(monkeypatch):
    def install(backend, **settings):
        d = dispatch.Dispatcher(dispatch.Settings(backend=backend.name, **settings), backend)
        monkeypatch.setattr(dispatch, "_current", d)
        return d

    return install


def gemm_call(gemm, k: int, m: int = 8):
    a, b = torch.randn(16, k), torch.randn(m, k)
    return gemm(a, True, b, False, None, None, torch.float32, None, None, False, None, False, None, 0, False, False)


def test_one_check_per_distinct_problem(use, native):
    backend = CountingBackend()
    use(backend)
    gemm = tp.wrap_generic_gemm(native)
    for _ in range(5):
        assert gemm_call(gemm, 32)[0] == "backend"
        assert gemm_call(gemm, 64)[0] == "native"
    gemm_call(gemm, 32, m=12)
    assert backend.checks == 3
    s = tp.stats()
    assert s["by_backend"] == {"counting": 6, "native": 5}
    assert s["by_reason"] == {"ALIGNMENT": 5}
    assert s["fallbacks"][0]["count"] == 5 and s["fallbacks"][0]["problem"]["k"] == 64


def test_fallback_warns_once_per_reason_code(use, native):
    use(CountingBackend())
    gemm = tp.wrap_generic_gemm(native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in range(1, 6):
            gemm_call(gemm, 64, m=m)
    ours = [w for w in caught if issubclass(w.category, dispatch.FallbackWarning)]
    assert len(ours) == 1 and "k=64" in str(ours[0].message)


def test_strict_mode_raises_with_reasons(use, native):
    use(CountingBackend(), strict=True)
    gemm = tp.wrap_generic_gemm(native)
    with pytest.raises(dispatch.GemmNotSupportedError, match=r"\[ALIGNMENT\] k=64"):
        gemm_call(gemm, 64)
    assert gemm_call(gemm, 32)[0] == "backend"


def test_unavailable_backend_warns_once_and_runs_natively(use, native):
    unavailable = Verdict.no(Reason(ReasonCode.UNAVAILABLE, "no gfx950 device here", "executor"))
    with pytest.warns(dispatch.FallbackWarning, match="unavailable"):
        backend = CountingBackend(availability=unavailable)
        use(backend)
    gemm = tp.wrap_generic_gemm(native)
    assert gemm_call(gemm, 32)[0] == "native"
    assert backend.checks == 0
    assert tp.stats()["by_reason"] == {"UNAVAILABLE": 1}


def test_a_raising_check_is_a_loud_distinct_failure(use, native):
    """check() must be pure and total; one that raises is a backend bug: GemmBackendError, not a decline."""
    backend = CountingBackend(raises=True)
    use(backend)
    gemm = tp.wrap_generic_gemm(native)
    for _ in range(2):  # nothing cached: every call fails the same way
        with pytest.raises(dispatch.GemmBackendError, match=r"'counting': check\(\) raised KeyError: 'bug in check'"):
            gemm_call(gemm, 32)
    assert backend.checks == 2 and not native.calls and tp.stats()["total"] == 0


def test_report_lists_backends_reasons_and_top_fallbacks(use, native):
    d = use(CountingBackend())
    gemm = tp.wrap_generic_gemm(native)
    gemm_call(gemm, 32)
    gemm_call(gemm, 64)
    text = d.report()
    assert "2 GEMM calls" in text and "ran on counting: 1" in text and "declined [ALIGNMENT]: 1" in text
    assert "k=64" in text


def test_native_selection_calls_straight_through(monkeypatch, native):
    monkeypatch.setattr(dispatch, "_current", dispatch.Dispatcher(dispatch.Settings(), None))
    assert gemm_call(tp.wrap_generic_gemm(native), 32)[0] == "native"
    assert len(native.calls) == 1


def test_counters_are_thread_safe(use, native):
    use(CountingBackend())
    gemm = tp.wrap_generic_gemm(native)

    def work():
        for i in range(200):
            gemm_call(gemm, 32 if i % 2 else 64, m=1 + i % 3)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = tp.stats()
    assert s["total"] == 1600 and s["by_backend"] == {"counting": 800, "native": 800}


def _script(env_extra: dict[str, str], body: str):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTE_")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, env=env, timeout=120)


GEMM_SCRIPT = """
import torch, te_flydsl_plugin as tp
g = tp.wrap_generic_gemm(lambda *a, **k: ["native", None, None, None])
a, b = torch.randn(16, 32), torch.randn(8, 32)
for k in (32, 32, 30):
    g(a[:, :k], True, b[:, :k].contiguous(), False, None, None, torch.float32, None, None, False, None, False,
      None, 0, False, False)
"""


def test_exit_report_from_the_environment():
    res = _script(
        {"NVTE_GEMM_BACKEND": "FLYDSL", "NVTE_FLYDSL_EXECUTOR": "reference", "NVTE_GEMM_BACKEND_REPORT": "1"},
        GEMM_SCRIPT,
    )
    assert res.returncode == 0, res.stderr
    assert "3 GEMM calls, selected backend flydsl" in res.stderr
    assert "ran on flydsl: 2" in res.stderr and "ran on native: 1" in res.stderr
    assert "declined [ALIGNMENT]" in res.stderr


def test_unknown_backend_in_the_environment_fails_loudly_listing_installed():
    res = _script({"NVTE_GEMM_BACKEND": "cublaslt"}, GEMM_SCRIPT)
    assert res.returncode != 0
    assert "NVTE_GEMM_BACKEND='cublaslt' names no installed GEMM backend (installed: flydsl" in res.stderr
