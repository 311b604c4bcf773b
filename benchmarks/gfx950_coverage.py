"""Which share of a TE training step's GEMM FLOPs the compiled gfx950 kernels would run (issue 11).

Runs a forward and backward pass of TE modules (real TE, any CUDA device: TE computes every GEMM
itself) with the plugin's wrapper installed around ``generic_gemm`` and a recording backend behind
it: each distinct GEMM problem is asked ``check(problem, "flydsl")`` as for gfx950 (the verdict the
FlyDSL backend would give on an MI355X), every call is counted, and the FLOPs (2 M N K) are summed
per verdict. Nothing runs on the plugin, so the step is TE's own and the script works on an H200.

    python benchmarks/gfx950_coverage.py                         # every module x recipe below
    python benchmarks/gfx950_coverage.py --modules mlp --recipes bf16,fp8-delayed --json

Output: per module and recipe, the FLOP share compiled kernels back and, for the rest, each decline
reason with its share. Comm-overlap GEMMs (tensor-parallel userbuffers) do not occur here.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from te_flydsl_plugin.host import dispatch
from te_flydsl_plugin.spec import Capabilities, GemmCall, GemmProblem, Reason, ReasonCode, Verdict

RECIPES = ("bf16", "fp16", "fp8-delayed", "fp8-current")
_COVERAGE = Reason(ReasonCode.FEATURE, "coverage run: TE computes every GEMM itself", "coverage")


@dataclass
class Recorder:
    """A GEMM backend that runs nothing: it keeps the FlyDSL gfx950 verdict of every problem it is
    asked about, and declines, so the dispatcher counts each call and TE computes it."""

    name: str = "flydsl"
    version: str = "coverage"
    verdicts: dict[str, tuple[GemmProblem, Verdict]] = field(default_factory=dict)

    def capabilities(self) -> Capabilities:
        from te_flydsl_plugin.flydsl import matrix

        return matrix.capabilities()

    def availability(self) -> Verdict:
        return Verdict.yes()

    def check(self, problem: GemmProblem) -> Verdict:
        from te_flydsl_plugin.flydsl.check import check

        self.verdicts[_key(problem)] = (problem, check(problem, "flydsl"))
        return Verdict.no(_COVERAGE)

    def run(self, problem: GemmProblem, call: GemmCall) -> list[Any]:
        raise AssertionError("the coverage recorder declines every GEMM")


def _key(problem: GemmProblem) -> str:
    return json.dumps(problem.to_dict(), sort_keys=True)


def recording_dispatcher(recorder: Recorder) -> dispatch.Dispatcher:
    """A dispatcher evaluating every problem for gfx950 through ``recorder``; made the current one."""
    settings = dispatch.Settings.from_env({"NVTE_GEMM_BACKEND": "flydsl", "NVTE_FLYDSL_TARGET_ARCH": "gfx950"})
    d = dispatch.Dispatcher(settings, recorder)
    dispatch._current = d  # the process-wide dispatcher the installed wrapper reads (as configure() sets it)
    return d


def summarize(d: dispatch.Dispatcher, recorder: Recorder) -> dict[str, Any]:
    """FLOP shares of the calls ``d`` counted: backed, and per decline reason (code: message)."""
    flops: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for row in d.stats(top=1 << 30)["fallbacks"]:
        problem, verdict = recorder.verdicts[json.dumps(row["problem"], sort_keys=True)]
        f = 2 * problem.m * problem.n * problem.k * row["count"]
        where = "backed" if verdict.ok else "; ".join(f"{r.code.value}: {r.message}" for r in verdict.reasons)
        flops[where] += f
        calls[where] += row["count"]
    total = sum(flops.values())
    share = {w: f / total for w, f in flops.most_common()} if total else {}
    return {"gemm_flops": total, "calls": sum(calls.values()), "backed_share": share.get("backed", 0.0),
            "declined": {w: s for w, s in share.items() if w != "backed"}}  # fmt: skip


# ---------------------------------------------------------------- TE modules and recipes (needs TE + a GPU)


def modules(te: Any, hidden: int, ffn: int, heads: int) -> dict[str, Callable[[], Any]]:
    """The modules issue 11 names (TransformerLayer with GQA: a quarter of the heads as KV groups)."""
    return {
        "transformer_layer": lambda: te.TransformerLayer(hidden, ffn, heads, num_gqa_groups=heads // 4, bias=True),
        "mlp": lambda: te.LayerNormMLP(hidden, ffn, bias=True, activation="gelu"),
        "linear_bias": lambda: te.Linear(hidden, ffn, bias=True),
        "linear_wgrad_acc": lambda: te.Linear(hidden, ffn, bias=False, fuse_wgrad_accumulation=True),
        "linear_bias_wgrad_acc": lambda: te.Linear(hidden, ffn, bias=True, fuse_wgrad_accumulation=True),
    }


def recipe_context(te: Any, recipe: str) -> Any:
    import contextlib

    from transformer_engine.common import recipe as te_recipe

    hybrid = te_recipe.Format.HYBRID
    if recipe == "fp8-delayed":
        return te.fp8_autocast(enabled=True, fp8_recipe=te_recipe.DelayedScaling(fp8_format=hybrid))
    if recipe == "fp8-current":
        return te.fp8_autocast(enabled=True, fp8_recipe=te_recipe.Float8CurrentScaling(fp8_format=hybrid))
    return contextlib.nullcontext()


def measure(name: str, recipe: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformer_engine.pytorch as te

    import te_flydsl_plugin as tp

    dtype = torch.float16 if recipe == "fp16" else torch.bfloat16
    recorder = Recorder()
    d = recording_dispatcher(recorder)
    tp.install()
    with torch.device("cuda"):
        mod = modules(te, args.hidden, args.ffn, args.heads)[name]().to(dtype)
    for p in mod.parameters():
        if getattr(p, "main_grad", None) is None:
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
    x = torch.randn(args.seq, args.batch, args.hidden, device="cuda", dtype=dtype, requires_grad=True)
    for _ in range(2):  # the second step sees what steady state issues (FP8 transposes cached, ...)
        d.reset()
        with recipe_context(te, recipe):
            y = mod(x)
        y.float().sum().backward()
    torch.cuda.synchronize()
    return {"module": name, "recipe": recipe, **summarize(d, recorder)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modules", default="transformer_layer,mlp,linear_bias,linear_wgrad_acc,linear_bias_wgrad_acc")
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--fused-gelu", action="store_true",
                   help="NVTE_BIAS_GELU_NVFUSION=0: LayerNormMLP fuses bias-GELU / dGELU into its GEMMs")  # fmt: skip
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.fused_gelu:
        os.environ["NVTE_BIAS_GELU_NVFUSION"] = "0"
    rows = [measure(m, r, args) for m in args.modules.split(",") for r in args.recipes.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['module']:<24} {row['recipe']:<12} {100 * row['backed_share']:6.1f}% of "
              f"{row['gemm_flops'] / 1e12:.2f} TFLOP in {row['calls']} GEMMs")  # fmt: skip
        for why, share in row["declined"].items():
            print(f"    {100 * share:5.1f}%  {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
