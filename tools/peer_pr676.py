"""ROCm TransformerEngine PR 676's FlyDSL GEMMs beside ours, through the same model (docs/perf-model.md, "PR 676").

PR 676's code is not part of this project: give the directory holding its kernel modules
(``transformer_engine/pytorch/flydsl_kernels/gemm/`` of a ROCm/TransformerEngine checkout, copied
outside this repository). Each of their kernels (bf16, FP8 with per-tensor scales, MXFP8) is
compiled by hand for gfx950 with the installed FlyDSL at its default (and only) tile, 256 x 256,
at two K lengths (``wg_timing.K_TILES``); then, as for our configs:

* the K-loop report: their K loop is unrolled at compile time (``range_constexpr``), so there is no
  backward branch for ``kloop.k_loop`` to find; one steady iteration is cut out of the straight-line
  code instead (:func:`unrolled_iteration`) and given to ``kloop.static_report`` and
  ``kloop.mca_cycles``;
* one workgroup traced in the emulator with zero operands at both K lengths, ``wg_timing.steady_state``;
* ``grid_model.predict`` with the committed calibration at 8192^3 and on every GEMM of
  ``estimate --suite llm`` their dispatch accepts (M and N multiples of 256, K of their K tile, at
  least 4 K tiles), beside ``estimate.run``'s pick of ours on the same GEMMs, in the same run.

Run from the repository root (minutes: it also predicts our suite):

    PYTHONPATH=$PWD python3 tools/peer_pr676.py DIR --commit SHA [--kinds bf16,fp8,mxfp8] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path("docs/data/pr676_peer.json")
PACKAGE = "pr676_gemm"  # the name their directory is imported under (their modules import each other relatively)
TILE = 256  # their BLOCK_M = BLOCK_N, fixed in every kernel file
MIN_K_TILES = 4  # their doGemm's "at least 4 K tiles" (the two-page pipeline)
SQUARE = (8192, 8192, 8192)


@dataclass(frozen=True)
class Peer:
    """One of their kernels: module, K tile, threads, operand bytes per element, the layouts it
    compiles, and whether its ``_compile_kernel`` takes the layout (their FP8 one is TN only)."""

    module: str
    tile_k: int
    threads: int
    operand_bytes: int
    layouts: tuple[str, ...]  # the layouts their kernel compiles (TE's TN / NN / NT)
    takes_layout: bool = True


# from each kernel file's _BLOCK_K, NUM_THREADS and _compile_kernel's signature
PEERS: dict[str, Peer] = {
    "bf16": Peer("bf16_gemm", 64, 256, 2, ("TN", "NN", "NT")),
    "fp8": Peer("fp8_gemm", 128, 256, 1, ("TN",), takes_layout=False),
    "mxfp8": Peer("mxfp8_gemm", 128, 256, 1, ("TN", "NN", "NT")),
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; every kind must be one of :data:`PEERS` and its module in the directory."""
    p = argparse.ArgumentParser(prog="peer_pr676.py", description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="PR 676's flydsl_kernels/gemm directory (outside this repository)")
    p.add_argument("--commit", required=True, help="the ROCm/TransformerEngine commit the sources are from")
    p.add_argument("--kinds", default=",".join(PEERS), help=f"comma list of {', '.join(PEERS)}")
    p.add_argument("--out", type=Path, default=OUT, help=f"the result JSON (default {OUT})")
    args = p.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = sorted(set(args.kinds) - set(PEERS))
    if bad or not args.kinds:
        p.error(f"--kinds takes a comma list of {', '.join(PEERS)}; got {bad or 'nothing'}")
    missing = [f"{PEERS[k].module}.py" for k in args.kinds if not (args.dir / f"{PEERS[k].module}.py").is_file()]
    if missing:
        p.error(f"{args.dir} holds no {', '.join(missing)} (give their flydsl_kernels/gemm directory)")
    return args


def import_their_package(directory: Path) -> None:
    """Make ``directory`` the package :data:`PACKAGE` without running its ``__init__`` (which demands
    FlyDSL 0.3.x and imports TE's wrappers; the kernel modules need neither), so their relative imports
    resolve among themselves."""
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(directory)]
    sys.modules[PACKAGE] = package


def _args(kind: str, k: int) -> list[Any]:
    """Zero CPU operands of one 256 x 256 tile in their launcher's order: A and B as flat byte views
    of the operands, C flat (bf16), M and N; FP8 (``fp8_gemm.doGemm``) puts the two one-element FP32
    inverse scales after C, MXFP8 (``mxfp8_gemm.do_gemm``) puts each operand's packed E8M0 scale
    words (int32, ``[K / 128, rows]``) after it."""
    import torch

    elem = PEERS[kind].operand_bytes
    a = torch.zeros(TILE * k * elem, dtype=torch.uint8)
    b, c = a.clone(), torch.zeros(TILE * TILE, dtype=torch.bfloat16)
    if kind == "fp8":
        return [a, b, c, torch.ones(1), torch.ones(1), TILE, TILE]
    if kind == "mxfp8":
        scales = torch.zeros(k // PEERS[kind].tile_k * TILE, dtype=torch.int32)
        return [a, scales, b, scales.clone(), c, TILE, TILE]
    return [a, b, c, TILE, TILE]


def _build_args(kind: str, k: int, layout: str) -> tuple[Any, ...]:
    """Their ``_compile_kernel`` arguments: K, the element types (FP8 and MXFP8 take A's and B's
    FP8 type and the output type; E4M3 both, which changes only the MFMA's cbsz / blgp fields),
    then the layout where it takes one."""
    import torch

    if kind == "bf16":
        dtypes: tuple[Any, ...] = (torch.bfloat16,)
    else:
        dtypes = (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16)
    return (k, *dtypes, layout) if PEERS[kind].takes_layout else (k, *dtypes)


def compile_peer(kind: str, layout: str, tiles: int) -> tuple[bytes, list[Any]]:
    """Their kernel at ``tiles`` K tiles for gfx950: the code object and the launch arguments."""
    import flydsl.compiler as flyc

    from te_flydsl_plugin.flydsl import toolchain

    peer = PEERS[kind]
    k = tiles * peer.tile_k
    build = importlib.import_module(f"{PACKAGE}.{peer.module}")._compile_kernel
    fn = build(*_build_args(kind, k, layout))
    args = _args(kind, k)
    with toolchain.compile_for("gfx950"):
        compiled = flyc.compile(fn, *args, 0)  # 0: the stream argument
    (co,) = toolchain.code_objects(compiled).values()
    return co, args


def unrolled_iteration(short: Sequence[Any], long: Sequence[Any], extra: int) -> tuple[list[Any], int]:
    """Two steady iterations of a kernel whose K loop is unrolled, and their count (2).

    ``short`` and ``long`` are the instructions of the kernel at K tiles differing by ``extra``: the
    long one holds ``extra`` more iterations of about ``(len(long) - len(short)) / extra`` instructions
    (the first and last iterations differ a little). The window skips the first iteration after the
    point where their opcodes part, then takes two periods: the period is the length near that
    average whose next copy repeats the same opcodes (the steady iterations of a ping-pong pair of
    LDS pages differ only in addresses). A window that starts mid-iteration is a rotation of the
    iteration, which costs the same in steady state."""
    span = (len(long) - len(short)) // extra
    if span <= 0:
        raise ValueError(f"the kernel at +{extra} K tiles is not longer")
    first = next(i for i, (a, b) in enumerate(zip(short, long, strict=False)) if a.opcode != b.opcode)
    x = first + span
    ops = [i.opcode for i in long]

    def repeats(p: int) -> int:
        return sum(ops[x + j] == ops[x + p + j] for j in range(p)) if x + 2 * p <= len(ops) else -1

    period = max(range(max(1, span - 16), span + 17), key=lambda p: (repeats(p) == p, -abs(p - span)))
    if repeats(period) != period:
        raise ValueError(f"no period near {span} instructions repeats in the unrolled K loop")
    return list(long[x : x + 2 * period]), 2


def kloop_report(body: Sequence[Any], iterations: int) -> dict[str, Any]:
    """``kloop.report``'s figures for ``iterations`` iterations of straight-line code, per iteration."""
    from te_flydsl_plugin.flydsl import kloop

    rep = kloop.static_report(body)
    for key in (
        "instructions",
        "mfma",
        "mfma_passes",
        "xdl_floor",
        "xdl_floor_clocks",
        "non_mfma_slots",
        "nop_wait_states",
    ):
        rep[key] = rep[key] / iterations
    rep["lds_read_bytes"] /= iterations
    rep["lds_write_bytes"] /= iterations
    rep["by_class"] = {c: n / iterations for c, n in rep["by_class"].items()}
    fp8 = sum(1 for i in body if kloop.is_mfma(i) and kloop._mca_undercounts(i))
    (cycles,) = kloop.mca_cycles(body, "gfx950", ("substitute" if fp8 else "none",))
    rep["mca_cycles"] = cycles / iterations
    rep["ratio"] = round(rep["mca_cycles"] / rep["xdl_floor"], 3)
    rep["unrolled"] = True
    return rep


def peer_kernel(kind: str, layout: str) -> dict[str, Any]:
    """Their kernel's lines (``wg_timing.steady_state``) and resources at one layout, and for TN its
    K-loop report (their NN / NT kernels schedule the two pages of a ping-pong pair differently, so
    no opcode period repeats exactly there)."""
    from te_flydsl_plugin import emulator, llvm
    from te_flydsl_plugin.emulator.trace import Trace
    from te_flydsl_plugin.flydsl import kloop, toolchain, wg_timing

    peer = PEERS[kind]
    built: dict[int, tuple[bytes, list[Any]]] = {}

    def trace_at(tiles: int) -> Trace:
        co, args = built.setdefault(tiles, compile_peer(kind, layout, tiles))
        t = Trace()
        kernarg = emulator.pack_flydsl_kernarg(co, None, args)
        emulator.launch(co, None, kernarg, (1, 1, 1), (peer.threads, 1, 1), hazards="off", trace=t)
        return t

    steady = wg_timing.steady_state(trace_at, (1,))  # 128 KiB of LDS: one workgroup a CU
    (t1, co1), (t2, co2) = ((t, built[t][0]) for t in wg_timing.K_TILES)
    (res,) = toolchain.kernel_resources(co1)
    out = {
        "tile_m": TILE,
        "tile_n": TILE,
        "tile_k": peer.tile_k,
        "resident": 1,
        **steady,
        "resources": {"vgpr": res.vgpr_count, "agpr": res.agpr_count, "lds_bytes": res.lds_bytes},
    }
    if layout == "TN":  # the K-loop report is the TN kernel's (ours is reported for select's TN pick too)
        short, long = (kloop.instructions(llvm.disassemble(co)) for co in (co1, co2))
        out["kloop"] = kloop_report(*unrolled_iteration(short, long, t2 - t1))
    return out


def accepts(kind: str, m: int, n: int, k: int) -> bool:
    """Their doGemm's shape checks: M, N multiples of 256, K of the K tile, at least 4 K tiles."""
    tk = PEERS[kind].tile_k
    return m % TILE == 0 and n % TILE == 0 and k % tk == 0 and k // tk >= MIN_K_TILES


def gemm_bytes(kind: str, m: int, n: int, k: int) -> int:
    """Operands and bf16 output through HBM at least once (``estimate.gemm_bytes``'s rule: scales
    not counted, as for ours)."""
    return (m + n) * k * PEERS[kind].operand_bytes + m * n * 2


def ours(kinds: Sequence[str], shapes: list[Any]) -> list[dict[str, Any]]:
    """``estimate.run``'s rows (select's pick and the other candidates) on ``shapes``, in this run."""
    from te_flydsl_plugin.flydsl import estimate, isa, tile_timing

    reports: dict[Any, dict[str, Any]] = {}
    timings: dict[Any, dict[str, Any]] = {}

    def report(cfg: Any) -> dict[str, Any]:
        if cfg not in reports:
            reports[cfg] = isa.isa_report(cfg)
        return reports[cfg]

    def lines(cfg: Any, resident: int) -> dict[str, Any]:
        if cfg not in timings:
            timings[cfg] = tile_timing.kernel_lines(cfg, resident)
        return timings[cfg]

    rows = estimate.run(shapes, list(kinds), report, lines)
    for r in rows:
        if r.get("selected"):
            r["kloop"] = {k: reports_of(reports, r["config"])[k] for k in ("mca_cycles", "xdl_floor", "ratio")}
            r["kloop"]["slots_per_pass"] = reports_of(reports, r["config"])["slots_per_pass"]
    return rows


def reports_of(reports: dict[Any, dict[str, Any]], name: str) -> dict[str, Any]:
    """The K-loop report of the config called ``name``."""
    return next(rep["kloop"] for cfg, rep in reports.items() if cfg.name == name)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"gemms": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def side_by_side(
    kinds: Sequence[str],
    peers: dict[str, dict[str, Any]],
    rows: list[dict[str, Any]],
    fused: set[str],
    predict: Callable[..., dict],
) -> dict[str, Any]:
    """Per kind: ours (select's pick) and theirs at 8192^3 and on the suite GEMMs both take, with the
    per-GEMM ratio ours / theirs. A GEMM with a fused epilogue (``fused``) is one PR 676 as reviewed
    does not run (bias raised NotImplementedError, GELU was dropped), so it counts as declined."""
    out: dict[str, Any] = {}
    for kind in kinds:
        picks = [r for r in rows if r["kind"] == kind and r.get("selected")]
        both, declined = [], []
        for r in picks:
            if r["shape"] == "square" or r["shape"] in fused or not accepts(kind, r["m"], r["n"], r["k"]):
                if r["shape"] != "square":
                    declined.append(r["shape"])
                continue
            layout = r["layout"] if r["layout"] in peers[kind] else "TN"
            p = predict(peers[kind][layout], r["m"], r["n"], r["k"], gemm_bytes(kind, r["m"], r["n"], r["k"]))
            both.append({"shape": r["shape"], "layout": r["layout"], "ours": r["tflops"], "pr676": p["tflops"],
                         "pr676_limiter": p["limiter"], "ratio": r["tflops"] / p["tflops"]})  # fmt: skip
        sq = next(r for r in picks if r["shape"] == "square")
        psq = predict(peers[kind]["TN"], *SQUARE, gemm_bytes(kind, *SQUARE))
        out[kind] = {
            "square_8192": {
                "ours": sq["tflops"],
                "ours_config": sq["config"],
                "ours_limiter": sq["limiter"],
                "pr676": psq["tflops"],
                "pr676_limiter": psq["limiter"],
                "ratio": sq["tflops"] / psq["tflops"],
            },
            "llm_ours_all": summary([r["tflops"] for r in picks if r["shape"] != "square"]),
            "llm_both": {
                "ours": summary([b["ours"] for b in both]),
                "pr676": summary([b["pr676"] for b in both]),
                "ratio": summary([b["ratio"] for b in both]),
            },
            "pr676_declines": declined,
            "kloop": {
                "ours": sq["kloop"],
                "pr676": {
                    k: peers[kind]["TN"]["kloop"][k]
                    for k in ("mca_cycles", "xdl_floor", "ratio", "slots_per_pass", "instructions", "mfma")
                },
            },
            "gemms": both,
        }
    return out


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    os.environ.setdefault("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    import_their_package(args.dir)

    from te_flydsl_plugin.flydsl import bench, grid_model
    from te_flydsl_plugin.spec import Layout

    peers = {kind: {lay: peer_kernel(kind, lay) for lay in PEERS[kind].layouts} for kind in args.kinds}
    shapes = [bench.Shape("square", Layout.TN, *SQUARE), *bench.SUITES["llm"](8192)]
    rows = ours(args.kinds, shapes)
    fused = {s.name for s in shapes if s.epilogue != "plain"}
    result = {
        "predicted": True,
        "pr676_commit": args.commit,
        "calibration": vars(grid_model.CALIBRATED),
        "kinds": side_by_side(args.kinds, peers, rows, fused, grid_model.predict),
        "pr676_kernels": peers,
    }
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    for kind, s in result["kinds"].items():
        sq, both = s["square_8192"], s["llm_both"]
        cells = (sq["ours"], sq["pr676"], both["ours"]["median"], both["pr676"]["median"])
        ratios = (both["ratio"]["min"], both["ratio"]["median"])
        print(f"| {kind} | " + " | ".join(f"{c:.0f}" for c in cells) + " | " + " | ".join(f"{r:.3f}" for r in ratios))


if __name__ == "__main__":
    main(sys.argv[1:])
