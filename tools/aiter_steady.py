"""Trace AMD's prebuilt gfx950 f4gemm code objects (the amd-aiter wheel) and table their workgroup timing.

For each f4gemm tile config that aiter/configs/a4w4_blockscale_tuned_gemm.csv uses, one workgroup runs
in the emulator with a trace (zero operands: addresses and control flow do not depend on values) at the
K lengths of ``wg_timing.K_TILES``, and ``wg_timing.steady_state`` turns the traces into clock lines,
for every count of workgroups a CU holds. Output: docs/data/aiter_f4gemm_steady.json, read by
``grid_model`` calibration (tools/calibrate_aiter.py) and its test. Run from the repository root:

    PYTHONPATH=$PWD python3 tools/aiter_steady.py [TILE ...]
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import torch

from te_flydsl_plugin.emulator import launch, pack_named_kernarg
from te_flydsl_plugin.emulator.codeobject import parse
from te_flydsl_plugin.emulator.timing import SIMDS
from te_flydsl_plugin.emulator.trace import Trace
from te_flydsl_plugin.flydsl import wg_timing
from te_flydsl_plugin.flydsl.isa import LDS_BUDGET, REGISTER_BUDGET
from tests.emulator.aiter_wheel import DIST, code_object

OUT = Path("docs/data/aiter_f4gemm_steady.json")
K_TILE = 256  # FP4 elements per K tile of every f4gemm kernel (the launcher rounds K pieces to 256)
THREADS = 256  # every f4gemm launch: 4 waves (asm_gemm_a4w4.cu)
PREFIX = "_ZN5aiter"


def tuned_csv() -> Path:
    import importlib.metadata

    dist = importlib.metadata.distribution(DIST)
    return Path(str(dist.locate_file("aiter/configs/a4w4_blockscale_tuned_gemm.csv")))


def tiles_in_csv() -> list[str]:
    """The f4gemm tile names (``BpreShuffle_256x256``) the tuned CSV picks."""
    names = {r["kernelName"] for r in csv.DictReader(tuned_csv().open()) if r["kernelName"].startswith(PREFIX)}
    return sorted(n.split("Fp4_", 1)[1][:-1] for n in names)


def resident(co: bytes) -> int:
    """Workgroups a CU holds: by LDS (160 KiB) and by the unified register file (512 per lane, gfx90a+
    rsrc1 granule of 8 registers), 4 waves each over 4 SIMDs."""
    k = next(iter(parse(co).kernels.values()))
    vgprs = ((k.descriptor.rsrc1 & 0x3F) + 1) * 8
    by_lds = LDS_BUDGET // max(k.lds_bytes, 1)
    by_regs = SIMDS * (REGISTER_BUDGET // vgprs) // (THREADS // 64)
    return max(1, min(by_lds, by_regs))


def trace(co: bytes, tile_m: int, tile_n: int, k_tiles: int) -> Trace:
    k = k_tiles * K_TILE
    a = torch.zeros(tile_m, k // 2, dtype=torch.uint8)
    b = torch.zeros(tile_n, k // 2, dtype=torch.uint8)
    sa = torch.zeros(max(256, tile_m), k // 32, dtype=torch.uint8)
    sb = torch.zeros(max(256, tile_n), k // 32, dtype=torch.uint8)
    out = torch.zeros(tile_m, tile_n, dtype=torch.bfloat16)
    args = {"D": out, "C": None, "A": a, "B": b, "alpha": 1.0, "beta": 0.0, "strideC0": tile_n}
    args |= {"strideA0": k, "strideB0": k, "Mdim": tile_m, "Ndim": tile_n, "Kdim": k, "log2_k_split": 0}
    args |= {"ScaleA": sa, "ScaleB": sb, "strideScaleA0": sa.shape[1], "strideScaleB0": sb.shape[1]}
    t = Trace()
    launch(co, None, pack_named_kernarg(co, None, args), (1, 1, 1), (THREADS, 1, 1), hazards="off", trace=t)
    return t


def main(tiles: list[str]) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    for tile in tiles or tiles_in_csv():
        co = code_object(f"f4gemm/f4gemm_bf16_per1x32Fp4_{tile}.co")
        tm, tn = (int(x) for x in tile.rsplit("_", 1)[1].split("x"))
        res = resident(co)
        steady = wg_timing.steady_state(lambda n, co=co, tm=tm, tn=tn: trace(co, tm, tn, n), range(1, res + 1))
        data[tile] = {"tile_m": tm, "tile_n": tn, "tile_k": K_TILE, "resident": res, **steady}
        OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(tile, res, steady["lines"]["1"][-1], file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
