"""Fit ``grid_model.Calibration`` to aiter's MI355X timings of its f4gemm kernels and report the error.

Reads aiter/configs/a4w4_blockscale_tuned_gemm.csv (the amd-aiter wheel: cu_num 256, each row one
GEMM timed on MI355X with the kernel aiter's tuner picked) and docs/data/aiter_f4gemm_steady.json
(tools/aiter_steady.py: the same machine code traced in the emulator). The rows of aiter's own
f4gemm code objects are split by position: even rows fit the four calibration values (a grid
search minimising the median absolute error), odd rows are held out. Prints the fitted values and
markdown tables (overall, held out, by tile config) and writes docs/data/aiter_predictions.csv.

    PYTHONPATH=$PWD python3 tools/calibrate_aiter.py [--no-fit | --clock HZ]
"""

from __future__ import annotations

import csv
import itertools
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from te_flydsl_plugin.flydsl import grid_model
from te_flydsl_plugin.flydsl.grid_model import Calibration

sys.path.insert(0, str(Path(__file__).parent))
from aiter_steady import OUT as STEADY
from aiter_steady import PREFIX, tuned_csv

PREDICTIONS = Path("docs/data/aiter_predictions.csv")  # written by the --no-fit run (the committed calibration)
GRID = {
    "clock_hz": [1.9e9, 2.0e9, 2.1e9, 2.2e9, 2.3e9, 2.4e9],
    "fabric_bytes_per_s": [6e12, 8e12, 10e12, 12e12, 14e12, 17.2e12, 20e12],
    "hbm_bytes_per_s": [4.0e12, 4.5e12, 5.0e12, 5.5e12, 6.0e12, 7.0e12, 8.0e12],
    "launch_s": [0.0, 1e-6, 2e-6, 3e-6, 4e-6, 5e-6],
    "port_bytes_per_clock": [16.0, 24.0, 32.0, 48.0, 64.0],
}


def gemm_bytes(m: int, n: int, k: int) -> int:
    """MXFP4 operands (half a byte an element), E8M0 scales (one per 32), bf16 output."""
    return (m + n) * k // 2 + (m + n) * k // 32 + m * n * 2


def rows() -> list[dict]:
    out = []
    for r in csv.DictReader(tuned_csv().open()):
        if r["cu_num"] == "256" and r["kernelName"].startswith(PREFIX):
            m, n, k = int(r["M"]), int(r["N"]), int(r["K"])
            out.append({"m": m, "n": n, "k": k, "tile": r["kernelName"].split("Fp4_", 1)[1][:-1], "us": float(r["us"])})
    return out


def errors(data: list[dict], kernels: dict, cal: Calibration) -> list[float]:
    return [
        grid_model.predict(kernels[r["tile"]], r["m"], r["n"], r["k"], gemm_bytes(r["m"], r["n"], r["k"]), cal)[
            "seconds"
        ]
        * 1e6
        / r["us"]
        - 1
        for r in data
    ]


def fit(train: list[dict], kernels: dict) -> Calibration:
    best, best_cal = float("inf"), Calibration()
    for values in itertools.product(*GRID.values()):
        cal = Calibration(**dict(zip(GRID, values, strict=True)))
        med = statistics.median(abs(e) for e in errors(train, kernels, cal))
        if med < best:
            best, best_cal = med, cal
    return best_cal


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation (no ties expected in microsecond timings)."""
    ra, rb = (np.argsort(np.argsort(x)) for x in (a, b))
    return float(np.corrcoef(ra, rb)[0, 1])


def summary(errs: list[float]) -> str:
    a = sorted(abs(e) for e in errs)
    q = lambda p: a[min(len(a) - 1, int(p * len(a)))]  # noqa: E731
    bias = statistics.median(errs)
    return f"{len(a)} | {100 * q(0.5):.1f}% | {100 * q(0.9):.1f}% | {100 * a[-1]:.0f}% | {100 * bias:+.1f}%"


def main(argv: list[str]) -> None:
    kernels = json.loads(STEADY.read_text())
    data = [r for r in rows() if r["tile"] in kernels]
    train, held = data[0::2], data[1::2]
    if "--clock" in argv:  # fit the rest at a fixed clock (e.g. the published sustained one)
        GRID["clock_hz"] = [float(argv[argv.index("--clock") + 1])]
    cal = grid_model.CALIBRATED if "--no-fit" in argv else fit(train, kernels)
    print(cal)
    print("| rows | GEMMs | median abs error | 90th pct | max | median signed |")
    print("|---|---|---|---|---|---|")
    for name, part in (("all", data), ("fit (even)", train), ("held out (odd)", held)):
        print(f"| {name} | {summary(errors(part, kernels, cal))} |")
    print("\n| tile config | GEMMs | median abs error | 90th pct | max | median signed |")
    print("|---|---|---|---|---|---|")
    for tile in sorted(kernels, key=lambda t: -sum(r["tile"] == t for r in data)):
        part = [r for r in data if r["tile"] == tile]
        if part:
            print(f"| `{tile}` | {summary(errors(part, kernels, cal))} |")
    ms = [r["us"] for r in data]
    ps = [r["us"] * (1 + e) for r, e in zip(data, errors(data, kernels, cal), strict=True)]
    print(f"\nSpearman rank correlation of predicted vs measured time: {spearman(ms, ps):.3f}")
    if "--no-fit" not in argv:
        return
    with PREDICTIONS.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["M", "N", "K", "tile", "measured_us", "predicted_us", "error", "limiter"])
        for r in data:
            p = grid_model.predict(kernels[r["tile"]], r["m"], r["n"], r["k"], gemm_bytes(r["m"], r["n"], r["k"]), cal)
            us = p["seconds"] * 1e6
            err = round(us / r["us"] - 1, 4)
            w.writerow([r["m"], r["n"], r["k"], r["tile"], r["us"], round(us, 3), err, p["limiter"]])


if __name__ == "__main__":
    main(sys.argv[1:])
