"""DMA issue / land against MFMA and barriers, per K iteration, in the timing model (docs/kernels.md,
"Why PR 676's bf16 is predicted faster").

One workgroup of a config (ours, by name) or of PR 676's bf16 kernel (``--peer DIR``, through
``tools/peer_pr676.py``) is traced at ``TILES`` K tiles and replayed by ``emulator.timing.replay``
with its event log at one vector-memory bandwidth (default: each CU's share of the calibrated fabric
when all 256 CUs run). Per K tile's DMA round (every wave's direct-to-LDS loads of one tile) it
prints when the round was issued, when the port sent its last byte and when its data were back, the
barrier before it, and over the steady iterations: the period, the port's idle clocks, the bytes in
flight per CU (issued, not yet back) and the MFMA pipe's busy share.

    PYTHONPATH=$PWD python3 tools/dma_timeline.py [--config NAME] [--peer DIR] [--bpc 22.3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TILES = 8  # K tiles traced: past the two-tile prologue, 4 - 5 steady iterations
DMA_BYTES = 1024  # one wave's direct-to-LDS load: 64 lanes x 16 bytes
# one K tile of both operands: 256 + 256 rows of 128 bytes (ours at 256 x 256 and PR 676's only tile)
TILE_BYTES = (256 + 256) * 128
OURS = "gemm_bf16_bf16_kk_bf16_plain_256x256x64_w4"


def trace_ours(name: str, tiles: int) -> Any:
    """One workgroup of our config ``name`` at ``tiles`` K tiles (as ``tile_timing.kernel_lines``)."""
    from te_flydsl_plugin import emulator
    from te_flydsl_plugin.emulator.trace import Trace
    from te_flydsl_plugin.flydsl import family
    from te_flydsl_plugin.flydsl.compiled import compile_config
    from te_flydsl_plugin.flydsl.kernels import gemm
    from te_flydsl_plugin.flydsl.lds_conflicts import launch_values

    cfg = next(c for c in family.FAMILY if c.name == name)
    ck = compile_config(cfg)
    values = launch_values(cfg, tiles * cfg.tile_k)
    kernarg = emulator.pack_flydsl_kernarg(ck.code_object, ck.kernel, values)
    t = Trace()
    block = (gemm.block_size(cfg), 1, 1)
    emulator.launch(
        ck.code_object, ck.kernel, kernarg, (1, 1, 1), block, workgroups=[(0, 0, 0)], trace=t, hazards="off"
    )
    return t


def trace_peer(directory: Path, tiles: int) -> Any:
    """PR 676's bf16 TN kernel at ``tiles`` K tiles (``tools/peer_pr676.py``)."""
    from te_flydsl_plugin import emulator
    from te_flydsl_plugin.emulator.trace import Trace

    sys.path.insert(0, str(Path(__file__).parent))
    import peer_pr676

    peer_pr676.import_their_package(directory)
    co, args = peer_pr676.compile_peer("bf16", "TN", tiles)
    t = Trace()
    kernarg = emulator.pack_flydsl_kernarg(co, None, args)
    emulator.launch(co, None, kernarg, (1, 1, 1), (peer_pr676.PEERS["bf16"].threads, 1, 1), hazards="off", trace=t)
    return t


def timeline(trace: Any, bpc: float, latency: int) -> dict[str, Any]:
    """Rounds of DMA (one per K tile), barriers and the steady-state figures of one replay."""
    from te_flydsl_plugin.emulator.timing import Memory, replay

    events: list[Any] = []
    end = replay(trace, Memory(bpc, latency), 1, events)
    waves = len(trace.waves)
    dma = [e for e in events if e.kind == "vmem" and trace.insts[e.pc].opcode.startswith("buffer_load")]
    dma = [e for e in dma if trace.waves[e.wave][e.pos][1] == DMA_BYTES]
    per_wave: dict[int, list[Any]] = {}
    for e in sorted(dma, key=lambda e: e.issue):
        per_wave.setdefault(e.wave, []).append(e)
    loads = TILE_BYTES // DMA_BYTES // waves  # each wave's loads of one K tile
    rounds = []
    for k in range(len(per_wave[0]) // loads):  # ours loads one round past K (zeros) per stage
        r = [e for w in range(waves) for e in per_wave[w][k * loads : (k + 1) * loads]]
        rounds.append(
            {
                "tile": k,
                "first_issue": min(e.issue for e in r),
                "last_issue": max(e.issue for e in r),
                "last_sent": round(max(e.sent for e in r)),
                "landed": max(e.done for e in r),
            }
        )
    # wave 0's barrier releases (its next issue after each arrival)
    w0 = sorted((e for e in events if e.wave == 0), key=lambda e: e.pos)
    releases = [w0[i + 1].issue for i, e in enumerate(w0[:-1]) if e.kind == "s_barrier"]
    mfma = sorted((e.issue, e.done) for e in events if e.kind == "mfma" and e.wave == 0)
    # steady window: from tile 3's round to the last (past the prologue's two rounds and the first refill)
    lo, hi = rounds[3]["first_issue"], rounds[-1]["first_issue"]
    iters = len(rounds) - 4
    period = (hi - lo) / iters
    sends = sorted((e.sent - DMA_BYTES / bpc, e.sent) for e in dma)
    busy = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in sends)
    grid = range(int(lo), int(hi), 16)
    in_flight = [sum(DMA_BYTES for e in dma if e.issue <= x < e.done) for x in grid]
    mf = sum(max(0, min(b, hi) - max(a, lo)) for a, b in mfma)
    return {
        "bytes_per_clock": bpc,
        "latency": latency,
        "end": end,
        "loads_per_wave_per_tile": loads,
        "rounds": rounds,
        "barrier_releases_wave0": releases,
        "steady": {
            "period": round(period, 1),
            "port_idle_per_iteration": round((hi - lo - busy) / iters, 1),
            "bytes_in_flight_mean": round(sum(in_flight) / len(in_flight)),
            "bytes_in_flight_min": min(in_flight),
            "bytes_in_flight_max": max(in_flight),
            "mfma_busy_share_wave0": round(mf / (hi - lo), 3),
        },
    }


def main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=OURS, help="our config's name (default: %(default)s)")
    ap.add_argument("--peer", type=Path, help="PR 676's gemm directory: time their bf16 TN kernel instead")
    ap.add_argument("--bpc", type=float, nargs="+", help="CU bytes per clock (default: the fabric share)")
    ap.add_argument("--latency", type=int, help="vector-memory latency, clocks (default: wg_timing's)")
    ap.add_argument("--json", type=Path, help="write the timelines here")
    a = ap.parse_args(argv)
    from te_flydsl_plugin.flydsl import grid_model, wg_timing

    cal = grid_model.CALIBRATED
    share = cal.fabric_bytes_per_s / (grid_model.CUS * cal.clock_hz)
    trace = trace_peer(a.peer, TILES) if a.peer else trace_ours(a.config, TILES)
    out = [timeline(trace, bpc, a.latency or wg_timing.VMEM_LATENCY) for bpc in a.bpc or [round(share, 1)]]
    for t in out:
        print(f"{t['bytes_per_clock']} B/clk, latency {t['latency']}: {json.dumps(t['steady'])}")
        for r in t["rounds"]:
            print("  ", json.dumps(r))
        print("   barrier releases (wave 0):", t["barrier_releases_wave0"])
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
