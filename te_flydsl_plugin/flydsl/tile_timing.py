"""The clock lines of one of our kernel configs (``wg_timing.py``): one tile traced in the emulator.

One output tile (workgroup 0, every wave) runs with zero operands at ``wg_timing.K_TILES`` K tiles
(addresses and control flow do not depend on values, ``lds_conflicts.launch_values`` builds the
arguments), with the emulator's trace on; ``wg_timing.steady_state`` replays the traces for every
count of workgroups a CU holds. ``grid_model.predict`` extends the lines to a GEMM.
"""

from __future__ import annotations

from typing import Any

from .. import emulator
from ..emulator.trace import Trace
from . import wg_timing
from .compiled import compile_config
from .kernels import gemm
from .kernels.config import KernelConfig
from .lds_conflicts import launch_values


def kernel_lines(cfg: KernelConfig, resident: int, arch: str = "gfx950", code_object: bytes | None = None) -> dict:
    """``{tile_m, tile_n, tile_k, resident, k_tiles, lines}`` of ``cfg`` (``code_object`` replaces the
    compiled one: a patched copy, in the tests)."""
    ck = compile_config(cfg, arch)
    co = ck.code_object if code_object is None else code_object
    block = (gemm.block_size(cfg), 1, 1)

    def trace_at(tiles: int) -> Trace:
        values: Any = launch_values(cfg, tiles * cfg.tile_k)  # held: the kernarg holds their addresses
        kernarg = emulator.pack_flydsl_kernarg(co, ck.kernel, values)
        t = Trace()
        emulator.launch(co, ck.kernel, kernarg, (1, 1, 1), block, workgroups=[(0, 0, 0)], hazards="off", trace=t)
        del values
        return t

    steady = wg_timing.steady_state(trace_at, range(1, resident + 1))
    return {"tile_m": cfg.tile_m, "tile_n": cfg.tile_n, "tile_k": cfg.tile_k, "resident": resident, **steady}
