"""The ``flydsl`` executor: the compiled kernels launched on the gfx950 GPU.

Every launch is enqueued on the current torch stream and nothing else happens: no host sync, and for
a plain epilogue no allocation (views and argument wrappers only), so a GEMM can be captured in a
CUDA/HIP graph. A fused epilogue adds small tensors from torch's caching allocator (the fp32 bias,
the bias-gradient partials) and torch ops on the same stream, which graph capture records as well.
Each launch is recorded in the open :class:`~te_flydsl_plugin.flydsl.launch_log.LaunchLog` s.
"""

from __future__ import annotations

import torch

from .. import launch, launch_log
from ..compiled import launcher, scale_pack_launcher
from ..kernels import scale_pack
from ..plan_types import GemmPlan

NAME = "flydsl"


def run(plan: GemmPlan) -> None:
    """Launch one kernel per piece of ``plan`` on the current stream (``launch.execute``)."""

    def on_stream(ln: launch.Launch) -> None:
        args = ln.jit_args()
        launcher(ln.config, args)(*args, torch.cuda.current_stream())
        launch_log.record("gemm", NAME)

    launch.execute(plan, on_stream)


def pack_scales(
    scales: torch.Tensor, rows: int, k: int, blocks_along_dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Pack TE's E8M0 scales (on the gfx950 device) with ONE scale-pack launch on the current stream;
    bit-identical to ``mx_layout.pack_scales``. Returns the packed tensor (``out`` when given)."""
    out, ln = launch.scale_pack_launch(scales, rows, k, blocks_along_dim, out)
    if ln is None:
        return out
    if not scales.is_cuda:
        raise ValueError("mode 'flydsl' needs scales on the gfx950 device; use mode 'emulator' on CPU")
    s, p = scale_pack.jit_args(ln.scales, ln.words)
    fn = scale_pack_launcher(ln.blocks_along_dim)
    fn(s, p, ln.rows, ln.kb, ln.n_t, ln.n_tiles, ln.blocks_along_dim, torch.cuda.current_stream())
    launch_log.record("scale_pack", NAME)
    return out
