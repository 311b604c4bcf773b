"""Predict FlyDSL's own gfx950 GEMMs with our timing model (docs/perf-model.md, "Peers").

FlyDSL's code is not part of this project: give a directory holding its ``kernels/`` package (from a
checkout of ROCm/FlyDSL, e.g. ``git -C FLYDSL archive HEAD kernels | tar -x -C DIR``). Each kernel is
compiled by hand for gfx950 at 256 x 256 tiles and ``wg_timing.K_TILES`` K tiles, one workgroup traced
in the emulator with zero operands, and its lines put through ``grid_model.predict``. Run from the
repository root:

    PYTHONPATH=$PWD python3 tools/peer_flydsl.py DIR [fp8_4wave fp8_8wave fp4_4wave]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from te_flydsl_plugin import emulator
from te_flydsl_plugin.emulator.trace import Trace
from te_flydsl_plugin.flydsl import grid_model, toolchain, wg_timing

OUT = Path("docs/data/flydsl_peers_steady.json")
TILE = 256  # every peer at 256 x 256 output tiles (their defaults; fp4_gemm_4wave is fixed at it)
# name: (module, builder, K tile in elements, threads per workgroup), from each kernel file
PEERS: dict[str, tuple[str, str, int, int]] = {
    "fp8_4wave": ("kernels.gemm.fp8_gemm_4wave", "compile_fp8_gemm_4w", 128, 256),
    "fp8_8wave": ("kernels.gemm.fp8_gemm_8wave", "compile_fp8_gemm_8w", 128, 512),
    "fp4_4wave": ("kernels.gemm.fp4_gemm_4wave", "compile_fp4_gemm_4w", 256, 256),
}
SHAPES = ((8192, 8192, 8192), (16384, 16384, 16384), (5120, 5120, 8320))


def _args(name: str, k: int) -> list[Any]:
    """Zero CPU operands of one tile in the launcher's order: A, B_T, C, A_scale, B_scale, M, N."""
    if name == "fp4_4wave":  # flat bytes: FP4 pairs and E8M0 scales per 32 (their test's _args)
        u8 = lambda n: torch.zeros(n, dtype=torch.uint8)  # noqa: E731
        out = torch.zeros(TILE * TILE, dtype=torch.bfloat16)
        return [u8(TILE * k // 2), u8(TILE * k // 2), out, u8(TILE * k // 32), u8(TILE * k // 32), TILE, TILE]
    a = torch.zeros(TILE, k, dtype=torch.float8_e4m3fn)
    c = torch.zeros(TILE, TILE, dtype=torch.bfloat16)
    return [a, a.clone(), c, torch.ones(TILE), torch.ones(TILE), TILE, TILE]


def _trace(name: str, tiles: int) -> Trace:
    import importlib

    import flydsl.compiler as flyc

    module, builder, tile_k, threads = PEERS[name]
    k = tiles * tile_k
    build = getattr(importlib.import_module(module), builder)
    fn = build(K=k, MN=(TILE, TILE)) if name == "fp4_4wave" else build(K=k, BLOCK_M=TILE, BLOCK_N=TILE)
    args = _args(name, k)
    with toolchain.compile_for("gfx950"):
        compiled = flyc.compile(fn, *args, 0)  # 0: the stream argument
    (co,) = toolchain.code_objects(compiled).values()
    t = Trace()
    kernarg = emulator.pack_flydsl_kernarg(co, None, args)
    emulator.launch(co, None, kernarg, (1, 1, 1), (threads, 1, 1), hazards="off", trace=t)
    return t


def main(argv: list[str]) -> None:
    sys.path.insert(0, argv[0])
    os.environ.setdefault("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    for name in argv[1:] or list(PEERS):
        steady = wg_timing.steady_state(lambda n, name=name: _trace(name, n), (1,))
        data[name] = {"tile_m": TILE, "tile_n": TILE, "tile_k": PEERS[name][2], "resident": 1, **steady}
        OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    for name, kern in sorted(data.items()):
        for m, n, k in SHAPES:
            elems = (m + n) * k // 2 + (m + n) * k // 32 if name == "fp4_4wave" else (m + n) * k
            p = grid_model.predict(kern, m, n, k, elems + m * n * 2)
            print(f"| {name} | {m}x{n}x{k} | {p['tflops']:.0f} | {p['limiter']} |")


if __name__ == "__main__":
    main(sys.argv[1:])
