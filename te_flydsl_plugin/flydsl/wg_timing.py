"""One workgroup's predicted clocks on one CU, from emulator traces (``emulator/trace.py``, ``timing.py``).

A tile's time is ``fixed + iterations x per_iteration`` clocks: the kernel is traced at two K lengths
(``K_TILES``), each trace replayed by the timing model, and the two totals give the line. The vector
memory bandwidth a CU gets depends on how many CUs share the chip's memory system, which only the
grid model knows (``grid_model.py``), so the line is tabled over ``BYTES_PER_CLOCK`` (the CU's share)
and the grid model interpolates. ``groups`` copies of the workgroup share the CU when it holds more
than one (its LDS and registers allow it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..emulator.timing import Memory, replay
from ..emulator.trace import Trace

K_TILES = (4, 8)  # the two traced K lengths, in K tiles: past any prologue a software pipeline has
# the CU's vector-memory bytes per clock the line is tabled at (from a starved CU to a CU port's worth)
BYTES_PER_CLOCK = (2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)
VMEM_LATENCY = 700  # clocks from a vector load sent to its data back, under load (docs/perf-model.md)


def line(
    traces: Sequence[Trace], k_tiles: Sequence[int] = K_TILES, groups: int = 1, latency: int = VMEM_LATENCY
) -> list[dict[str, float]]:
    """``[{bytes_per_clock, fixed, per_iteration}]`` (clocks) from traces at ``k_tiles`` K tiles."""
    (t1, t2), (k1, k2) = traces, k_tiles
    rows = []
    for bpc in BYTES_PER_CLOCK:
        c1, c2 = (replay(t, Memory(bpc, latency), groups) for t in (t1, t2))
        per = (c2 - c1) / (k2 - k1)
        rows.append({"bytes_per_clock": bpc, "fixed": c1 - k1 * per, "per_iteration": per})
    return rows


def steady_state(trace_at: Callable[[int], Trace], groups: Sequence[int] = (1,)) -> dict[str, Any]:
    """The lines of a kernel for each count of resident workgroups in ``groups``; ``trace_at(tiles)``
    runs one traced workgroup with ``tiles`` K tiles."""
    traces = [trace_at(t) for t in K_TILES]
    return {"k_tiles": list(K_TILES), "lines": {str(g): line(traces, K_TILES, g) for g in groups}}


def at(rows: list[dict[str, float]], bpc: float) -> tuple[float, float]:
    """(fixed, per_iteration) clocks at ``bpc`` bytes per clock, linear between tabled points (the
    time is close to linear in 1 / bandwidth where memory limits), clamped at the ends."""
    pts = sorted(rows, key=lambda r: r["bytes_per_clock"])
    if bpc <= pts[0]["bytes_per_clock"]:
        lo = hi = pts[0]
    elif bpc >= pts[-1]["bytes_per_clock"]:
        lo = hi = pts[-1]
    else:
        hi = next(p for p in pts if p["bytes_per_clock"] >= bpc)
        lo = pts[pts.index(hi) - 1]
    if lo is hi:
        return lo["fixed"], lo["per_iteration"]
    x, x0, x1 = 1 / bpc, 1 / lo["bytes_per_clock"], 1 / hi["bytes_per_clock"]
    f = (x - x0) / (x1 - x0)
    return (
        lo["fixed"] + f * (hi["fixed"] - lo["fixed"]),
        lo["per_iteration"] + f * (hi["per_iteration"] - lo["per_iteration"]),
    )
