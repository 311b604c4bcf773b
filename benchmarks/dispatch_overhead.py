"""The wrapper's added cost per GEMM call on a cached verdict, next to a direct call of the native function.

Run: ``python benchmarks/dispatch_overhead.py [--calls N] [--json]``. Target: under 5 microseconds per
GEMM on a CPU of the CI machine's kind. The "native" stand-in does no work, so what is measured is the
wrapper alone: building the cache key from operand metadata, the verdict lookup, the counters and the
forwarding call. Three paths: NVTE_GEMM_BACKEND unset; backend selected but unavailable here (executor
auto off gfx950: a pass-through); and the full decision path, where check() declined the problem once
and the cached verdict sends each call to native.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin.host import dispatch


def native(*args, **kwargs):
    return None


def per_call(fn, args, kwargs, calls: int) -> float:
    for _ in range(1000):
        fn(*args, **kwargs)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    a, b = torch.empty(1024, 768, dtype=torch.bfloat16), torch.empty(4, 128, 768, dtype=torch.bfloat16)
    bias = torch.empty(1024, dtype=torch.bfloat16)
    gemm_args = (
        a,
        True,
        b,
        False,
        None,
        None,
        torch.bfloat16,
        bias,
        None,
        False,
        None,
        False,
        None,
        0,
        False,
        False,
    )
    gemm_kwargs = {"alpha": 1.0, "beta": 0.0}
    wrapped = tp.wrap_generic_gemm(native)
    rows = {}
    rows["direct native call"] = per_call(native, gemm_args, gemm_kwargs, args.calls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dispatch.configure(backend="default", env={})
        rows["wrapper, NVTE_GEMM_BACKEND unset"] = per_call(wrapped, gemm_args, gemm_kwargs, args.calls)
        dispatch.configure(backend="flydsl", executor="auto", env={})
        rows["wrapper, flydsl unavailable (declined)"] = per_call(wrapped, gemm_args, gemm_kwargs, args.calls)
        # The full path: views, key, cached verdict, counters. A quantizer makes check() decline, so
        # what is timed is the decision and not a GEMM (the reference executor would run one).
        dispatch.configure(backend="flydsl", executor="reference", env={})
        declined = (*gemm_args[:5], object(), *gemm_args[6:])
        rows["wrapper, flydsl declined by check (cached)"] = per_call(wrapped, declined, gemm_kwargs, args.calls)
    base = rows["direct native call"]
    result = {name: {"us_per_call": t * 1e6, "added_us": (t - base) * 1e6} for name, t in rows.items()}
    worst = max(v["added_us"] for v in result.values())
    if args.json:
        print(json.dumps({"per_call": result, "worst_added_us": worst, "target_us": 5.0}, indent=2))
        return
    for name, v in result.items():
        print(f"{name:<46} {v['us_per_call']:7.2f} us/call   added {v['added_us']:6.2f} us")
    print(f"worst added cost {worst:.2f} us per GEMM (target < 5 us): {'OK' if worst < 5 else 'MISSED'}")


if __name__ == "__main__":
    main()
