"""The executors of one plan, by name: the table the backend selects from (``NVTE_FLYDSL_EXECUTOR``).

Each executor is a module of this package with the same two functions, ``run(plan)`` and
``pack_scales(scales, rows, k, blocks_along_dim, out=None)`` (MXFP8 scale packing as that executor
does it), imported only when the executor is first used (the compiled ones import flydsl):

* ``flydsl`` (``gpu.py``): the compiled kernels launched on the gfx950 GPU;
* ``reference`` (``reference.py``): torch in fp32 on any device, decoding the kernel-facing operands;
* ``emulator`` (``emulator.py``): the same gfx950 code objects as ``flydsl``, run on CPU by the
  project's gfx950 emulator.

All consume the same plan (``plan_types.GemmPlan``); the two compiled ones run the same launches
(``flydsl/launch.py``). ``auto`` is a setting, not an executor: the backend resolves it to ``flydsl``
on gfx950 (``plugin.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..matrix import COMPILED_EXECUTORS

if TYPE_CHECKING:  # the table is read when the plugin loads: torch is imported with the first plan
    from ..plan_types import GemmPlan


def _gpu() -> ModuleType:
    from . import gpu

    return gpu


def _reference() -> ModuleType:
    from . import reference

    return reference


def _emulator() -> ModuleType:
    from . import emulator

    return emulator


@dataclass(frozen=True)
class Executor:
    """One executor: its name, what it runs on, and its module. Which run compiled code (and so accept
    only what a row's backed list names) is the matrix's ``COMPILED_EXECUTORS``."""

    name: str
    runs_on: str
    load: Callable[[], ModuleType]  # the executor's module (imported on first use)


EXECUTORS: dict[str, Executor] = {
    ex.name: ex
    for ex in (
        Executor("flydsl", "the compiled kernels on the gfx950 GPU", _gpu),
        Executor("reference", "torch in fp32, on any device", _reference),
        Executor("emulator", "the compiled gfx950 code objects, in the emulator on CPU", _emulator),
    )
}
SETTINGS = ("auto", *EXECUTORS)  # what NVTE_FLYDSL_EXECUTOR may name


def run(plan: GemmPlan, executor: str) -> None:
    """Execute ``plan`` with the named executor, writing ``plan.out`` and the epilogue outputs."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {tuple(EXECUTORS)}, got {executor!r}")
    EXECUTORS[executor].load().run(plan)


def pack_scales_kernel(
    scales: Any, rows: int, k: int, blocks_along_dim: int, out: Any = None, mode: str = "flydsl"
) -> Any:
    """Pack TE's E8M0 scales with ONE scale-pack kernel launch; bit-identical to ``mx_layout.pack_scales``.

    ``mode="flydsl"`` launches the compiled kernel on the current torch stream (gfx950 tensors);
    ``mode="emulator"`` runs the same code object in the project's gfx950 emulator (CPU tensors).
    ``out`` (contiguous uint8 of ``mx_layout.packed_shape(rows, k)``) is written in place; no torch
    op touches the data on either path.
    """
    if mode not in COMPILED_EXECUTORS:
        raise ValueError(f"mode must be one of {COMPILED_EXECUTORS}, got {mode!r}")
    return EXECUTORS[mode].load().pack_scales(scales, rows, k, blocks_along_dim, out)
