"""A record of compiled-kernel launches, owned by whoever wants to know what ran.

The hardware and emulator tests, and ``bench``, must tell the compiled kernel from a fallback: they
open a :class:`LaunchLog` around the work and read what the compiled executors recorded into it
(launches per kernel and executor, and the emulator's report of each emulated launch). Nothing is
counted or kept while no log is open, so a training process holds no launch state at all.

The open logs are a process-wide list, not a context variable, on purpose: torch runs the backward
pass of GPU tensors on its own autograd threads, and a log opened around ``loss.backward()`` must see
the GEMMs those threads launch.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from types import TracebackType
from typing import Any

KERNELS = ("gemm", "scale_pack")  # what the compiled executors launch


@dataclass(frozen=True)
class Launched:
    """One launch: which kernel, on which executor, and the emulator's LaunchReport (None on the GPU)."""

    kernel: str
    executor: str
    report: Any = None


class LaunchLog:
    """Context manager: every compiled launch made while it is open, in order.

    Logs nest and may be open in several threads at once; each open log sees every launch.
    """

    def __init__(self) -> None:
        self.launches: list[Launched] = []

    def count(self, kernel: str, executor: str) -> int:
        """Launches of ``kernel`` (``gemm`` or ``scale_pack``) on ``executor`` (``flydsl``, ``emulator``)."""
        return Counter((ln.kernel, ln.executor) for ln in self.launches)[kernel, executor]

    def reports(self, kernel: str) -> list[Any]:
        """The emulator's reports of the emulated launches of ``kernel``, in launch order."""
        return [ln.report for ln in self.launches if ln.kernel == kernel and ln.report is not None]

    def __enter__(self) -> LaunchLog:
        with _lock:
            _open.append(self)
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with _lock:
            _open.remove(self)


_lock = threading.Lock()
_open: list[LaunchLog] = []  # the logs now open: empty unless a caller opened one


def record(kernel: str, executor: str, report: Any = None) -> None:
    """Called by the compiled executors after each launch: appended to every open log."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if not _open:  # the usual case: nobody is listening (a list's truth is read atomically)
        return
    with _lock:
        logs = tuple(_open)
    entry = Launched(kernel, executor, report)
    for log in logs:
        log.launches.append(entry)
