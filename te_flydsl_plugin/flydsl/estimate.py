"""``te-flydsl-plugin estimate``: the predicted time of each backed config on a GEMM.

Two predictions per config and GEMM, both **predicted**, never measured (docs/perf-model.md):

* the **calibrated** one (``predict``): one tile of the config traced in the emulator and replayed by
  the timing model (``tile_timing.py``, ``emulator/timing.py``), extended to the grid by
  ``grid_model.predict`` with the calibration fitted to aiter's MI355X timings (median absolute
  error 7% on 796 GEMMs of AMD's own f4gemm kernels, docs/perf-model.md);
* the **static bound** (``static_bound``), from the K-loop report alone (``kloop.py``):

  - a CU holds ``resident`` workgroups: as many as its 160 KiB of LDS and its 512-entry register
    file per SIMD lane allow (``isa.LDS_BUDGET`` / ``REGISTER_BUDGET``), so ``waves_per_simd`` =
    ``resident x waves / 4``;
  - one K iteration of every resident wave takes the longest of: a wave's own schedule (llvm-mca's
    cycles, 4 clocks each: "issue"), the SIMD's XDL pipe shared by its waves (``waves_per_simd x
    xdl_floor`` cycles: "MFMA"), and the CU's LDS moving every resident wave's DS and direct-to-LDS
    bytes at 256 bytes per clock, plus each wave's bank-conflict clocks when the report has them
    (``kloop["lds"]``, lds_conflicts.py) ("LDS");
  - a tile takes ``ceil(K / tile_k)`` iterations, the grid ``ceil(tiles / (256 x resident))`` rounds
    of tiles (the last partial round costs a full one);
  - memory: the operands and the output cross HBM at least once, ``bytes / 8 TB/s``;
  - at the peak clock, 2.4 GHz.

The MFMA peak of the config's instruction is ``256 CUs x 4 SIMDs x FLOPs / (passes x 4 clocks)`` at
the peak clock, so ``share_of_peak`` = predicted / peak (bf16 2.5, FP8 / MXFP8 5.0 PFLOP/s dense).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..emulator.lds_banks import BYTES_PER_CLOCK
from . import grid_model
from .isa import LDS_BUDGET, REGISTER_BUDGET
from .kernels.config import KernelConfig
from .kernels.select import CUS
from .kloop import CLOCKS_PER_PASS

SIMDS_PER_CU = 4  # CDNA3 / CDNA4: four SIMDs per CU (AMD CDNA4 ISA guide; rocprofiler-compute docs)
CLOCK_HZ = 2.4e9  # MI355X peak engine clock (AMD Instinct MI355X datasheet: 2400 MHz)
HBM_BYTES_PER_S = 8.0e12  # MI355X HBM3E peak bandwidth (AMD Instinct MI355X datasheet: 8 TB/s)
_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)_")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def mfma_flops(opcode: str) -> int:
    """FLOPs of one MFMA, from its ``MxNxK`` shape (2 per multiply-add)."""
    m = _SHAPE.search(opcode + "_")
    if m is None:
        raise ValueError(f"cannot read the shape of {opcode}")
    a, b, c = map(int, m.groups())
    return 2 * a * b * c


def resident(isa: dict[str, Any], cfg: KernelConfig) -> int:
    """Workgroups of ``cfg`` one CU holds at once: limited by LDS and by registers per SIMD."""
    by_lds = LDS_BUDGET // max(isa["lds_bytes"], 1)
    waves_per_simd = REGISTER_BUDGET // max(isa["vgpr"], 1)
    by_regs = SIMDS_PER_CU * waves_per_simd // cfg.waves
    return max(1, min(by_lds, by_regs))


def gemm_bytes(cfg: KernelConfig, m: int, n: int, k: int) -> int:
    """Bytes every GEMM moves through HBM at least once: both operands and the output."""
    return (m * cfg.lhs_format.itemsize + n * cfg.rhs_format.itemsize) * k + m * n * cfg.out_format.itemsize


def peak_flops(isa: dict[str, Any]) -> float:
    """The dense MFMA peak of the config's instruction at the peak clock, FLOP/s."""
    kl = isa["kloop"]
    per_mfma = mfma_flops(isa["mfma"]) / (kl["mfma_passes"] / kl["mfma"] * CLOCKS_PER_PASS)
    return CUS * SIMDS_PER_CU * per_mfma * CLOCK_HZ


def predict(cfg: KernelConfig, isa: dict[str, Any], lines: dict[str, Any], m: int, n: int, k: int) -> dict[str, Any]:
    """The calibrated prediction (``lines``: ``tile_timing.kernel_lines``) beside the static bound."""
    p = grid_model.predict(lines, m, n, k, gemm_bytes(cfg, m, n, k))
    static = static_bound(cfg, isa, m, n, k)
    flops = 2 * m * n * k
    return {
        "config": cfg.name,
        "ms": p["seconds"] * 1e3,
        "tflops": p["tflops"],
        "share_of_peak": flops / p["seconds"] / peak_flops(isa),
        "limiter": p["limiter"],
        "tiles": p["tiles"],
        "resident": lines["resident"],
        "rounds": p["rounds"],
        "compute_ms": p["compute_s"] * 1e3,
        "memory_ms": p["hbm_s"] * 1e3,
        "static": {key: static[key] for key in ("ms", "tflops", "limiter", "iteration_clocks")},
    }


def static_bound(cfg: KernelConfig, isa: dict[str, Any], m: int, n: int, k: int) -> dict[str, Any]:
    """The static bound for one config (``isa`` its ``isa.isa_report``, with its ``kloop`` and,
    where counted, the kloop's ``lds`` bank-conflict report)."""
    kl = isa["kloop"]
    if not kl.get("found") or kl.get("mca_cycles") is None:
        raise ValueError(f"{cfg.name}: no K-loop timing ({kl.get('mca_note') or 'no K loop found'})")
    res = resident(isa, cfg)
    per_simd = res * cfg.waves / SIMDS_PER_CU
    pipe = per_simd * kl["xdl_floor"]
    conflicts = kl["lds"]["per_iteration"]["conflict_cycles"] if "lds" in kl else 0.0
    lds_clocks = res * cfg.waves * ((kl["lds_read_bytes"] + kl["lds_write_bytes"]) / BYTES_PER_CLOCK + conflicts)
    iter_clocks = max(kl["mca_cycles"] * CLOCKS_PER_PASS, pipe * CLOCKS_PER_PASS, lds_clocks)
    k_tiles = kl.get("k_tiles", 1)  # K tiles one iteration multiplies (MXFP8: four)
    tiles = _ceil(m, cfg.tile_m) * _ceil(n, cfg.tile_n)
    rounds = _ceil(tiles, CUS * res)
    compute_s = rounds * _ceil(k, cfg.tile_k) * iter_clocks / k_tiles / CLOCK_HZ
    memory_s = gemm_bytes(cfg, m, n, k) / HBM_BYTES_PER_S
    seconds = max(compute_s, memory_s)
    flops = 2 * m * n * k
    peak = peak_flops(isa)
    if memory_s > compute_s:
        limiter = "memory"
    elif lds_clocks >= max(kl["mca_cycles"], pipe) * CLOCKS_PER_PASS:
        limiter = "LDS"
    else:
        limiter = "MFMA" if pipe >= kl["mca_cycles"] else "issue"
    return {
        "config": cfg.name,
        "ms": seconds * 1e3,
        "tflops": flops / seconds / 1e12 if seconds else 0.0,
        "share_of_peak": flops / seconds / peak if seconds else 0.0,
        "limiter": limiter,
        "tiles": tiles,
        "resident": res,
        "rounds": rounds,
        "iteration_clocks": iter_clocks,
        "lds_conflicts_counted": "lds" in kl,
        "compute_ms": compute_s * 1e3,
        "memory_ms": memory_s * 1e3,
    }


def run(
    shapes: list[Any],
    kinds: list[str],
    report: Callable[[KernelConfig], dict[str, Any]],
    lines: Callable[[KernelConfig, int], dict[str, Any]],
    progress: Callable[[int, int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (shape, kind, candidate config), ``select``'s pick first and marked; a declined
    GEMM is one row with the reason. ``report(cfg)`` gives a config's ISA report (with ``kloop``),
    ``lines(cfg, resident)`` its clock lines (``tile_timing.kernel_lines``)."""
    import torch

    from . import bench

    rows: list[dict[str, Any]] = []
    done, total = 0, len(shapes) * len(kinds)
    for shape in shapes:
        for kind in kinds:
            base = {"shape": shape.name, "layout": shape.layout.value, "m": shape.m, "n": shape.n, "k": shape.k}
            base["kind"] = kind
            verdict, p = bench.plan_for(shape, kind, torch.device("meta"), "gfx950")
            if p is None:
                rows.append({**base, "config": None, "declined": str(verdict)})
            else:
                for i, cfg in enumerate(bench.candidates(p.config, shape.m, shape.n, shape.k)):
                    isa = report(cfg)
                    timing = lines(cfg, resident(isa, cfg))
                    rows.append({**base, **predict(cfg, isa, timing, shape.m, shape.n, shape.k), "selected": i == 0})
            done += 1
            if progress is not None:
                progress(done, total, shape.name)
    return rows
