"""A GEMM's predicted time on MI355X from one workgroup's clock lines (``wg_timing.py``) and the grid.

Per GEMM ``M x N x K`` of a kernel with ``tile_m x tile_n`` output tiles and ``tile_k`` K tiles:

* ``tiles = ceil(M / tile_m) x ceil(N / tile_n)`` workgroups, ``ceil(K / tile_k)`` iterations each;
  a CU holds ``resident`` of them, so they run in rounds of ``256 x resident`` (workgroups are
  dispatched in order, so every round but the last is full and the last one costs a whole tile time);
* in a round with ``active`` busy CUs, each CU gets ``min(cal.port_bytes_per_clock, fabric / (active x
  clock))`` bytes per clock of vector memory: the chip's L2 / MALL fabric shared (the traced clocks
  at that bandwidth come from the kernel's lines);
* the operands, scales and output also cross HBM at least once: ``bytes / hbm`` is a floor;
* ``time = launch + max(sum over rounds of tile clocks / clock, HBM floor)``.

The :class:`Calibration` values (but the clock) are not published for this chip's GEMM load and were fitted
to aiter's MI355X timings of its own f4gemm code objects (tools/calibrate_aiter.py; the fit, its
held-out error and what the model misses are in docs/perf-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import wg_timing
from .kernels.select import CUS

PEAK_CLOCK_HZ = 2.4e9  # MI355X peak engine clock (AMD Instinct MI355X datasheet: 2400 MHz)
HBM_PEAK_BYTES_PER_S = 8.0e12  # MI355X HBM3E (AMD Instinct MI355X datasheet: 8 TB/s)
MALL_PEAK_BYTES_PER_S = 17.2e12  # Infinity Cache peak on MI300X (AMD CDNA3 launch material, via ServeTheHome)


@dataclass(frozen=True)
class Calibration:
    """The fitted values (docs/perf-model.md, "Calibration"): the sustained clock, the fabric's
    bandwidth shared by busy CUs, HBM's achieved bandwidth, and the launch's fixed cost."""

    clock_hz: float = 2.1e9  # held at the published sustained clock under GEMM load (issue 12), not fitted
    fabric_bytes_per_s: float = 12e12
    hbm_bytes_per_s: float = 4.5e12
    launch_s: float = 3e-6
    port_bytes_per_clock: float = 32.0


CALIBRATED = Calibration()


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def predict(kernel: dict[str, Any], m: int, n: int, k: int, nbytes: int, cal: Calibration = CALIBRATED) -> dict:
    """Predicted seconds of ``kernel`` (``tile_m``, ``tile_n``, ``tile_k``, ``resident``, ``lines`` as
    ``wg_timing.steady_state`` gives) on ``M x N x K`` moving ``nbytes`` through HBM at least once."""
    tiles = _ceil(m, kernel["tile_m"]) * _ceil(n, kernel["tile_n"])
    iterations = _ceil(k, kernel["tile_k"])
    res = kernel["resident"]
    slots = CUS * res
    clocks, left = 0.0, tiles
    limiter = "compute"
    while left > 0:
        now = min(left, slots)
        active = min(CUS, now)
        groups = min(res, _ceil(now, CUS))
        bpc = min(cal.port_bytes_per_clock, cal.fabric_bytes_per_s / (active * cal.clock_hz))
        fixed, per = wg_timing.at(kernel["lines"][str(groups)], bpc)
        clocks += fixed + iterations * per
        if bpc < cal.port_bytes_per_clock and left == tiles:
            starved = wg_timing.at(kernel["lines"][str(groups)], cal.port_bytes_per_clock)[1]
            limiter = "fabric" if per > 1.05 * starved else "compute"
        left -= now
    compute_s = clocks / cal.clock_hz
    hbm_s = nbytes / cal.hbm_bytes_per_s
    if hbm_s > compute_s:
        limiter = "HBM"
    seconds = cal.launch_s + max(compute_s, hbm_s)
    return {
        "seconds": seconds,
        "tflops": 2 * m * n * k / seconds / 1e12,
        "limiter": limiter,
        "tiles": tiles,
        "rounds": _ceil(tiles, slots),
        "compute_s": compute_s,
        "hbm_s": hbm_s,
    }
