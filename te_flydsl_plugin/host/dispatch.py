"""Problem -> cached verdict -> backend or native, with counters, warn-once, strict mode and a report.

The environment is read once, when the dispatcher is created (by ``install()``, or ``configure()``),
and checked then (:func:`validate`); nothing here reads it per call. One ``check`` runs per distinct
problem; forward and backward of one shape therefore take the same path for the whole run.
"""

from __future__ import annotations

import atexit
import copy
import itertools
import os
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..spec import GemmBackend, GemmProblem, Reason, ReasonCode, SettingsError, Verdict
from . import archs
from . import registry as _registry
from .autoload import NATIVE_NAMES  # one list, kept where torch's start-up hook reads it


class GemmNotSupportedError(RuntimeError):
    """Strict mode: the selected backend declined a GEMM; the message lists the reasons."""

    def __init__(self, backend: str, problem: GemmProblem, verdict: Verdict):
        self.problem = problem
        self.verdict = verdict
        lines = "; ".join(f"[{r.code.value}] {r.message}" for r in verdict.reasons)
        super().__init__(
            f"{backend} declined GEMM {problem.layout.value} m={problem.m} n={problem.n} k={problem.k} "
            f"({problem.b.format.value} x {problem.a.format.value} -> {problem.out_dtype.value}): {lines}"
        )


class FallbackWarning(UserWarning):
    """A GEMM ran on TE's own GEMM because the selected backend declined it (once per reason code)."""


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Settings:
    """Selection and behaviour, from ``NVTE_GEMM_BACKEND*`` (README lists them)."""

    backend: str = ""
    strict: bool = False
    report: bool = False
    target_arch: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        name = (env.get("NVTE_GEMM_BACKEND") or "").strip().lower()
        return cls(
            backend="" if name in NATIVE_NAMES else name,
            strict=_truthy(env.get("NVTE_GEMM_BACKEND_STRICT")),
            report=_truthy(env.get("NVTE_GEMM_BACKEND_REPORT")),
            target_arch=(env.get("NVTE_FLYDSL_TARGET_ARCH") or "").strip(),
        )


class Decision:
    """A cached verdict for one problem; hashed by identity and precomputed, as it is counted per call."""

    __slots__ = ("codes", "ok", "problem", "verdict")

    def __init__(self, problem: GemmProblem, verdict: Verdict):
        self.problem = problem
        self.verdict = verdict
        self.ok = verdict.ok
        self.codes = tuple(r.code.value for r in verdict.reasons)


class Dispatcher:
    """Routes each problem to the selected backend or to the native GEMM, and counts where it went."""

    def __init__(self, settings: Settings, backend: GemmBackend | None):
        self.settings = settings
        self.backend = backend
        self.cache: dict[Any, Decision] = {}
        self._lock = threading.Lock()
        self._by_backend: Counter[str] = Counter()
        self._by_reason: Counter[str] = Counter()
        self._fallbacks: Counter[Decision] = Counter()
        self._warned: set[str] = set()
        self.unavailable: Verdict = Verdict.yes()
        # True when every GEMM goes to TE without a look (no backend, or it cannot run here): the
        # wrapper then skips building views and keys, so an installed-but-idle plugin costs ~nothing.
        self.passthrough = backend is None
        self._idle_calls = itertools.count()
        if backend is not None:
            try:
                self.unavailable = backend.availability()
            except Exception as exc:  # a backend's availability must never break training
                self.unavailable = Verdict.no(
                    Reason(ReasonCode.UNAVAILABLE, f"availability() raised {type(exc).__name__}: {exc}")
                )
            if not self.unavailable.ok:
                self.passthrough = True
                self._warn_once(
                    "UNAVAILABLE",
                    f"GEMM backend {backend.name!r} is unavailable here, every GEMM runs on TE's own GEMM: "
                    + "; ".join(r.message for r in self.unavailable.reasons),
                )

    @property
    def name(self) -> str:
        return self.backend.name if self.backend is not None else "native"

    def decide(self, key: Any, problem: GemmProblem) -> Decision:
        """Check ``problem`` once and cache the verdict under ``key``."""
        assert self.backend is not None
        if not self.unavailable.ok:
            verdict = self.unavailable
        else:
            try:
                verdict = self.backend.check(problem)
            except Exception as exc:  # check() must be pure and total; a bug there is a decline with a reason
                verdict = Verdict.no(Reason(ReasonCode.UNAVAILABLE, f"check() raised {type(exc).__name__}: {exc}"))
        decision = Decision(problem, verdict)
        with self._lock:
            self.cache[key] = decision
        return decision

    def ran_backend(self) -> None:
        with self._lock:
            self._by_backend[self.name] += 1

    def ran_unavailable(self) -> None:
        """Count a GEMM that went to TE because the selected backend cannot run here at all.

        ``next`` on an ``itertools.count`` is atomic under the GIL and costs ~50 ns: no lock on the
        path every GEMM of an idle plugin takes.
        """
        next(self._idle_calls)

    def _idle_count(self) -> int:
        return next(copy.copy(self._idle_calls))

    def ran_native(self, decision: Decision | None) -> None:
        """Count a native run; warn once per reason code, or raise in strict mode."""
        with self._lock:
            self._by_backend["native"] += 1
            if decision is None:
                return
            self._fallbacks[decision] += 1
            for code in decision.codes:
                self._by_reason[code] += 1
        if self.settings.strict:
            raise GemmNotSupportedError(self.name, decision.problem, decision.verdict)
        for r in decision.verdict.reasons:
            if r.code.value not in self._warned:  # read without the lock: a set lookup is atomic
                self._warn_once(r.code.value, f"{self.name} declined a GEMM, running TE's own GEMM: {r.message}")

    def _warn_once(self, code: str, message: str) -> None:
        with self._lock:
            if code in self._warned:
                return
            self._warned.add(code)
        warnings.warn(
            f"[te-flydsl-plugin] {message} (further {code} fallbacks are counted, not warned)",
            FallbackWarning,
            stacklevel=4,
        )

    def stats(self, top: int = 10) -> dict[str, Any]:
        idle = self._idle_count()
        with self._lock:
            fallbacks = self._fallbacks.most_common(top)
            by_backend, by_reason = Counter(self._by_backend), Counter(self._by_reason)
            if idle:
                by_backend["native"] += idle
                for r in self.unavailable.reasons:
                    by_reason[r.code.value] += idle
            return {
                "backend": self.name,
                "total": sum(by_backend.values()),
                "by_backend": dict(by_backend),
                "by_reason": dict(by_reason),
                "fallbacks": [
                    {
                        "problem": d.problem.to_dict(),
                        "reasons": [r.to_dict() for r in d.verdict.reasons],
                        "count": n,
                    }
                    for d, n in fallbacks
                ],
            }

    def reset(self) -> None:
        with self._lock:
            self._by_backend.clear()
            self._by_reason.clear()
            self._fallbacks.clear()
            self._warned.clear()
            self._idle_calls = itertools.count()

    def report(self) -> str:
        """The exit report: where GEMMs ran, per backend, per reason, the most frequent fallbacks."""
        s = self.stats()
        lines = [f"te-flydsl-plugin: {s['total']} GEMM calls, selected backend {s['backend']}"]
        lines += [f"  ran on {k}: {v}" for k, v in sorted(s["by_backend"].items())]
        lines += [f"  declined [{k}]: {v}" for k, v in sorted(s["by_reason"].items())]
        for f in s["fallbacks"]:
            p = f["problem"]
            why = "; ".join(r["message"] for r in f["reasons"])
            lines.append(
                f"  {f['count']:>7} x {p['layout']} m={p['m']} n={p['n']} k={p['k']} "
                f"{p['b']['format']}x{p['a']['format']}->{p['out_dtype']} {p['epilogue']}: {why}"
            )
        return "\n".join(lines)


_current: Dispatcher | None = None
_current_lock = threading.Lock()
_report_registered = False


def validate(settings: Settings, backend: GemmBackend | None) -> Settings:
    """``settings`` with the target arch normalised (host/archs.py), or SettingsError naming every
    setting that names something nonexistent: the target arch, and what the backend's optional
    ``settings_errors()`` reports (the FlyDSL backend: ``NVTE_FLYDSL_EXECUTOR``)."""
    if backend is None:
        return settings
    errors: list[str] = []
    arch = settings.target_arch
    if arch:
        try:
            arch = archs.normalize(arch, "NVTE_FLYDSL_TARGET_ARCH")
        except SettingsError as exc:
            errors.append(str(exc))
    own = getattr(backend, "settings_errors", None)
    errors += own() if own is not None else []
    if errors:
        raise SettingsError("; ".join(errors))
    return replace(settings, target_arch=arch)


def _create(settings: Settings) -> Dispatcher:
    backend = _registry.registry().get(settings.backend) if settings.backend else None
    return Dispatcher(validate(settings, backend), backend)


def current() -> Dispatcher:
    """The process-wide dispatcher, created from the environment on first use."""
    global _current
    d = _current
    if d is None:
        with _current_lock:
            if _current is None:
                _current = _create(Settings.from_env())
                _maybe_register_report(_current)
            d = _current
    return d


def configure(
    *,
    backend: str | None = None,
    executor: str | None = None,
    strict: bool | None = None,
    report: bool | None = None,
    target_arch: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Dispatcher:
    """Re-read the environment (or ``env``), apply overrides, and replace the dispatcher (tests, tools).

    ``executor`` is handed to a backend that has ``select_executor`` (the FlyDSL backend does).
    """
    global _current
    s = Settings.from_env(env)
    changes: dict[str, Any] = {}
    if backend is not None:
        name = backend.strip().lower()
        changes["backend"] = "" if name in NATIVE_NAMES else name
    for k, v in (("strict", strict), ("report", report), ("target_arch", target_arch)):
        if v is not None:
            changes[k] = v
    s = replace(s, **changes)
    if executor is not None and s.backend:
        selector = getattr(_registry.registry().get(s.backend), "select_executor", None)
        if selector is None:
            raise ValueError(f"backend {s.backend!r} has no executors to select")
        selector(executor)
    with _current_lock:
        _current = _create(s)
        _maybe_register_report(_current)
    return _current


def _maybe_register_report(d: Dispatcher) -> None:
    global _report_registered
    if d.settings.report and not _report_registered:
        _report_registered = True
        atexit.register(lambda: print(current().report(), file=sys.stderr))


def stats() -> dict[str, Any]:
    """Where GEMMs ran so far: ``{"backend", "total", "by_backend", "by_reason", "fallbacks"}``."""
    return current().stats()


def reset_stats() -> None:
    current().reset()
