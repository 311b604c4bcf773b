"""The ``emulator`` executor: the same gfx950 code objects as ``flydsl``, run on CPU tensors by the
project's gfx950 emulator (``te_flydsl_plugin.emulator``, hazards raise).

It packs the same launch arguments as a GPU launch (``launch.kernarg_values``, ``pack_flydsl_kernarg``)
and records each launch, with the emulator's report, in the open
:class:`~te_flydsl_plugin.flydsl.launch_log.LaunchLog` s.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import emulator
from .. import launch, launch_log
from ..compiled import compile_config, scale_pack_code_object
from ..kernels import gemm, scale_pack
from ..plan_types import GemmPlan

NAME = "emulator"
ARCH = "gfx950"  # the emulator's machine


def run(plan: GemmPlan) -> None:
    """Run one emulated launch per piece of ``plan`` (``launch.execute``)."""
    launch.execute(plan, lambda ln: launch_log.record("gemm", NAME, emulate(ln)))


def emulate(ln: launch.Launch) -> Any:
    """Run one launch's gfx950 code object in the emulator on CPU tensors; returns its report."""
    cfg = ln.config
    ck = compile_config(cfg, ARCH)
    kernarg = emulator.pack_flydsl_kernarg(ck.code_object, ck.kernel, launch.kernarg_values(ln))
    grid = (gemm.grid_size(cfg, ln.out.shape[0], ln.out.shape[1]), 1, 1)
    return emulator.launch(ck.code_object, ck.kernel, kernarg, grid, (gemm.block_size(cfg), 1, 1))


def pack_scales(
    scales: torch.Tensor, rows: int, k: int, blocks_along_dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Pack TE's E8M0 scales (CPU tensors) with ONE emulated scale-pack launch; bit-identical to
    ``mx_layout.pack_scales``. Returns the packed tensor (``out`` when given)."""
    out, ln = launch.scale_pack_launch(scales, rows, k, blocks_along_dim, out)
    if ln is None:
        return out
    if scales.is_cuda or out.is_cuda:
        raise ValueError("mode 'emulator' runs on CPU tensors")
    blob = scale_pack_code_object(ln.blocks_along_dim, ARCH)
    kernarg = emulator.pack_flydsl_kernarg(blob, scale_pack.KERNEL_NAME, [ln.scales, ln.words, ln.rows, ln.kb, ln.n_t])
    grid = scale_pack.grid(ln.n_t, ln.n_tiles)
    report = emulator.launch(blob, scale_pack.KERNEL_NAME, kernarg, grid, (scale_pack.THREADS, 1, 1))
    launch_log.record("scale_pack", NAME, report)
    return out
