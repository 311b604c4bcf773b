"""Problem -> cached verdict -> backend or native, with counters, warn-once, strict mode and a report.

The environment is read once, when the dispatcher is created (by ``install()``, or ``configure()``),
and checked then (:func:`validate`); nothing here reads it per call. One ``check`` runs per distinct
problem; forward and backward of one shape therefore take the same path for the whole run.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import archs
from ..spec import GemmBackend, GemmProblem, Reason, ReasonCode, SettingsError, Verdict
from . import registry as _registry
from .names import NATIVE_NAMES


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


class GemmBackendError(RuntimeError):
    """A backend broke its contract (``check()`` raised): a bug to fix, never a silent fallback."""

    def __init__(self, backend: str, method: str, exc: BaseException):
        super().__init__(
            f"GEMM backend {backend!r}: {method}() raised {type(exc).__name__}: {exc} (a bug in the backend; "
            "NVTE_GEMM_BACKEND=default runs TE's own GEMM meanwhile)"
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


class Tally:
    """A call counter the hot path bumps without a lock.

    ``hit()`` is ``next`` on an ``itertools.count``: one C call, atomic under the GIL (~50 ns), so
    concurrent GEMMs never lose a count; the compiled decision path advances the same ``_count``. Reading
    it takes one number too, so :meth:`value` subtracts its own reads; readers hold the dispatcher's lock.
    :meth:`reset` zeroes it in place, so whoever holds the counter keeps counting into it.
    """

    __slots__ = ("_count", "_reads", "hit")

    def __init__(self) -> None:
        self._count = itertools.count()
        self.hit = self._count.__next__
        self._reads = 0

    def value(self) -> int:
        n = self.hit() - self._reads
        self._reads += 1
        return n

    def reset(self) -> None:
        self._reads = self.hit() + 1


class Decision:
    """A cached verdict for one problem, with the count of calls it decided (hashed by identity)."""

    __slots__ = ("codes", "loud", "ok", "problem", "tally", "verdict")

    def __init__(self, problem: GemmProblem, verdict: Verdict):
        self.problem = problem
        self.verdict = verdict
        self.ok = verdict.ok
        # Each code once: a call declined for two FORMAT reasons is one FORMAT decline.
        self.codes = tuple(dict.fromkeys(r.code.value for r in verdict.reasons))
        self.tally = Tally()
        # A declined call must raise (strict) or may still owe a warning: the wrapper calls declined().
        self.loud = not verdict.ok


class Dispatcher:
    """Routes each problem to the selected backend or to the native GEMM, and counts where it went."""

    def __init__(self, settings: Settings, backend: GemmBackend | None):
        self.settings = settings
        self.backend = backend
        self.cache: dict[Any, Decision] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.unavailable: Verdict = Verdict.yes()
        # True when every GEMM goes to TE without a look (no backend, or it cannot run here): the
        # wrapper then skips building views and keys, so an installed-but-idle plugin costs ~nothing.
        self.passthrough = backend is None
        self._idle = Tally()
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

    def decide(self, key: Any, problem: GemmProblem, host_reason: Reason | None = None) -> Decision:
        """Check ``problem`` once and cache the verdict under ``key``.

        ``host_reason``: the host itself declines the call (it holds arguments no ``GemmCall`` can carry),
        and the backend is not asked. ``check()`` is pure and total by contract; one that raises is a
        bug in the backend, and a bug is never a fallback: :class:`GemmBackendError` names it, nothing
        is cached, the call fails.
        """
        assert self.backend is not None
        if host_reason is not None:
            verdict = Verdict.no(host_reason)
        else:
            try:
                verdict = self.backend.check(problem)
            except Exception as exc:
                raise GemmBackendError(self.name, "check", exc) from exc
        decision = Decision(problem, verdict)
        with self._lock:
            self.cache[key] = decision
        return decision

    def ran_unavailable(self) -> None:
        """Count a GEMM that went to TE because the selected backend cannot run here at all."""
        self._idle.hit()

    def declined(self, decision: Decision) -> None:
        """A declined call of a ``loud`` decision: raise in strict mode, else warn once per reason code.

        The wrapper counts the call itself and comes here only while ``decision.loud`` holds, so a
        fallback whose warnings were given costs the hot path one attribute read.
        """
        if self.settings.strict:
            raise GemmNotSupportedError(self.name, decision.problem, decision.verdict)
        for r in decision.verdict.reasons:
            if r.code.value not in self._warned:  # read without the lock: a set lookup is atomic
                self._warn_once(r.code.value, f"{self.name} declined a GEMM, running TE's own GEMM: {r.message}")
        decision.loud = False

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
        """Calls per backend and per reason code (each call counted once per code), the top fallbacks."""
        by_backend: Counter[str] = Counter()
        by_reason: Counter[str] = Counter()
        fallbacks: Counter[Decision] = Counter()
        with self._lock:
            idle = self._idle.value()
            counted = [(dec, dec.tally.value()) for dec in list(self.cache.values())]
        for dec, n in counted:
            if not n:
                continue
            if dec.ok:
                by_backend[self.name] += n
                continue
            by_backend["native"] += n
            fallbacks[dec] += n
            for code in dec.codes:
                by_reason[code] += n
        if idle:
            by_backend["native"] += idle
            for code in dict.fromkeys(r.code.value for r in self.unavailable.reasons):
                by_reason[code] += idle
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
                for d, n in fallbacks.most_common(top)
            ],
        }

    def reset(self) -> None:
        """Zero the counters and forget which warnings were given (verdicts stay cached)."""
        with self._lock:
            for dec in self.cache.values():
                dec.tally.reset()
                dec.loud = not dec.ok
            self._warned.clear()
            self._idle.reset()

    def report(self) -> str:
        """The exit report: where GEMMs ran, per backend, per reason, the most frequent fallbacks."""
        s = self.stats()
        rank = _rank()
        who = f"te-flydsl-plugin [rank {rank}]" if rank is not None else "te-flydsl-plugin"
        lines = [f"{who}: {s['total']} GEMM calls, selected backend {s['backend']}"]
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


def _rank() -> str | None:
    """This process's rank in a distributed job (every rank prints its own report), else None.

    ``torch.distributed`` when a process group is up, else ``RANK`` (torchrun sets it; at exit the group
    may be gone already). The module is only looked up, never imported, so a report costs no import.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return str(dist.get_rank())
    return os.environ.get("RANK")


_current: Dispatcher | None = None
_current_lock = threading.Lock()
_report_registered = False


def validate(settings: Settings, backend: GemmBackend | None) -> Settings:
    """``settings`` with the target arch normalised (archs.py), or SettingsError naming every
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


def _create(settings: Settings, executor: str | None = None) -> Dispatcher:
    """A dispatcher for ``settings``; with ``executor``, its backend is the registry's one's
    ``with_executor(executor)`` (a new object: the registry's backend is left as it is)."""
    backend = _registry.registry().get(settings.backend) if settings.backend else None
    if executor is not None and backend is not None:
        fork = getattr(backend, "with_executor", None)
        if fork is None:
            raise ValueError(f"backend {settings.backend!r} has no executors to select")
        backend = fork(executor)
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

    ``executor``: the dispatcher gets the backend's ``with_executor(executor)`` (spec.GemmBackend's
    optional method; the FlyDSL backend has it), so the process-wide backend object is never changed
    and nothing needs undoing afterwards.
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
    with _current_lock:
        _current = _create(s, executor)
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
