"""The FlyDSL backend as a plugin: registered through the entry point like any third-party backend.

``pyproject.toml`` names this module under ``transformer_engine.gemm_backends``; the host's registry
loads it and calls :func:`te_gemm_backends`. Nothing here imports ``flydsl`` at import time: the
compiled-kernel executor imports it lazily, only when it runs.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any

from ..spec import Capabilities, GemmCall, GemmProblem, Reason, ReasonCode, SettingsError, Verdict, hookimpl
from . import check as _check
from . import matrix
from .executors import EXECUTORS, SETTINGS

__version__ = "0.1.0"


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class FlydslBackend:
    """FlyDSL GEMMs for gfx950; ``executor`` picks compiled kernels, the emulator or the torch reference.

    The executor is fixed for the object's life: :meth:`with_executor` makes another object for another one.
    """

    name = "flydsl"
    version = __version__

    def __init__(self, executor: str | None = None):
        self._lock = threading.Lock()
        # Read once, when the registry first loads the plugin (at install); settings_errors() judges it.
        self.requested = (executor or os.environ.get("NVTE_FLYDSL_EXECUTOR") or "auto").strip().lower()
        self._availability: Verdict | None = None
        self._resolved = ""

    def settings_errors(self) -> list[str]:
        """What is wrong with the settings this backend read; the dispatcher refuses to start on any."""
        if self.requested in SETTINGS:
            return []
        return [f"NVTE_FLYDSL_EXECUTOR={self.requested!r} is not one of {', '.join(SETTINGS)}"]

    def with_executor(self, executor: str) -> FlydslBackend:
        """A new backend that runs and judges with ``executor`` (spec.GemmBackend's optional method);
        ``self``, the process-wide one included, keeps its own. SettingsError for an unknown name."""
        name = executor.strip().lower()
        if name not in SETTINGS:
            raise SettingsError(f"executor {executor!r} is not one of {', '.join(SETTINGS)}")
        return FlydslBackend(name)

    @property
    def executor(self) -> str:
        """The executor actually used: ``auto`` resolved to ``flydsl`` (on gfx950) or kept as ``auto``."""
        self.availability()
        return self._resolved

    def capabilities(self) -> Capabilities:
        return matrix.capabilities()

    def availability(self) -> Verdict:
        with self._lock:
            if self._availability is None:
                self._resolved, self._availability = self._evaluate()
            return self._availability

    def _evaluate(self) -> tuple[str, Verdict]:
        ex = self.requested
        if ex not in SETTINGS:
            return ex, Verdict.no(
                Reason(
                    ReasonCode.UNAVAILABLE,
                    f"NVTE_FLYDSL_EXECUTOR={ex!r} is not one of {', '.join(SETTINGS)}",
                    "executor",
                )
            )
        if ex == "reference":
            return ex, Verdict.yes()
        if ex == "emulator":
            missing = [m for m in ("flydsl", "te_flydsl_plugin.emulator") if not _has_module(m)]
            from .toolchain import find_ld_lld

            if find_ld_lld() is None:
                missing.append("ld.lld >= 18 (apt-get install lld-22)")
            if missing:
                return ex, Verdict.no(
                    Reason(ReasonCode.UNAVAILABLE, f"emulator executor needs {', '.join(missing)}", "executor")
                )
            return ex, Verdict.yes()
        from ..device import current_arch

        arch = current_arch()
        problems = []
        if arch not in matrix.ARCHS:
            problems.append(f"no gfx950 device here (current device: {arch})")
        if not _has_module("flydsl"):
            problems.append("the flydsl package is not installed")
        if not problems:
            return "flydsl", Verdict.yes()
        hint = "" if ex == "flydsl" else "; NVTE_FLYDSL_EXECUTOR=reference runs the same plans with torch"
        return ex, Verdict.no(
            Reason(
                ReasonCode.UNAVAILABLE,
                f"compiled FlyDSL kernels cannot run: {'; '.join(problems)}{hint}",
                "executor",
            )
        )

    def check(self, problem: GemmProblem) -> Verdict:
        return _check.check(problem, self.executor or self.requested)

    def run(self, problem: GemmProblem, call: GemmCall) -> list[Any]:
        from . import executors, plan

        pack = self._packer(self.executor) if problem.a.format.is_mx else None
        p = plan.build(problem, call, pack=pack)
        executors.run(p, self.executor)
        return plan.results(p, call)

    @staticmethod
    def _packer(executor: str) -> Any:
        """MXFP8 scale packing as this executor does it (``executors/``): one scale-pack kernel launch per
        operand and call for the compiled ones, the torch reference for ``reference``.

        Packed weight scales are never reused across calls. Nothing TE guarantees can tell that a
        weight's scales were rewritten: TE's quantizers (``update_quantized``, ``copy_`` into an
        MXFP8 tensor) write ``_rowwise_scale_inv``/``_columnwise_scale_inv`` through raw pointers and
        leave ``torch.Tensor._version`` at 0 (measured with TE 2.20.2 on an H200), so a cache keyed on
        it served the first step's scales forever. PR 676 packs once per GEMM as well; the cost is one
        pass over K/32 bytes per operand row (docs/mxfp8-layout.md).
        """
        return EXECUTORS[executor].load().pack_scales


_backend: FlydslBackend | None = None


def backend() -> FlydslBackend:
    """The process-wide backend object (one per process, so executor state is shared)."""
    global _backend
    if _backend is None:
        _backend = FlydslBackend()
    return _backend


@hookimpl
def te_gemm_backends() -> list[FlydslBackend]:
    return [backend()]
