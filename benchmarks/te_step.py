"""What the plugin costs when it declines everything: a TE TransformerLayer training step, interleaved.

Issue 3's benchmark. On a device where the FlyDSL executor cannot run (``auto`` on anything but
gfx950, e.g. the H200), every GEMM goes through the plugin's full decision path (operand views, the
cache key, the cached UNAVAILABLE verdict, counters) and then TE's own GEMM. The step with the plugin
installed is timed against the same step with TE untouched, alternating the two in rounds so clock
and thermal drift hit both equally. Target: step-time ratio <= 1.01, where the ratio is the median
over rounds of plugin time / native time within the round (each pair runs back to back, so drift
between rounds cancels; the ratio of the two medians, reported too, does not cancel it).

It also prints the wrapper's own per-call overhead, measured on the GEMM calls of one real step
replayed against a no-op "native" (so the number is the plugin's Python cost alone).

    python benchmarks/te_step.py                    # hidden 4096, sequence 2048, bf16
    python benchmarks/te_step.py --require          # exit 1 when the ratio misses the target
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

TARGET = 1.01


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=16384)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=20, help="plugin/native alternations")
    p.add_argument("--steps", type=int, default=40, help="timed steps per round and mode")
    p.add_argument("--require", action="store_true", help=f"exit 1 if the ratio exceeds {TARGET}")
    return p.parse_args(argv)


def time_steps(step: Callable[[], None], n: int) -> float:
    """Milliseconds per step over ``n`` steps (CUDA events around the whole run, after one warm-up)."""
    step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def wrapper_overhead_us(calls: list[tuple[tuple[Any, ...], dict[str, Any]]], repeats: int = 200) -> float:
    """Microseconds the wrapper adds per call, replaying real calls against a no-op native GEMM."""
    import te_flydsl_plugin

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    wrapped = te_flydsl_plugin.wrap_generic_gemm(noop)
    for args, kwargs in calls:  # warm the verdict cache
        wrapped(*args, **kwargs)

    def loop(fn: Callable[..., Any]) -> float:
        t = time.perf_counter()
        for _ in range(repeats):
            for args, kwargs in calls:
                fn(*args, **kwargs)
        return (time.perf_counter() - t) / (repeats * len(calls)) * 1e6

    return loop(wrapped) - loop(noop)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import transformer_engine.pytorch as te
    import transformer_engine_torch as tex

    import te_flydsl_plugin
    from te_flydsl_plugin.host import dispatch

    d = dispatch.configure(backend="flydsl", executor="auto")
    if d.backend is None or d.unavailable.ok:
        print("the FlyDSL backend can run here: this benchmark measures the all-declined path", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    layer = te.TransformerLayer(
        a.hidden, a.ffn, a.heads, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16
    )
    x = torch.randn(a.seq, a.batch, a.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)

    def step() -> None:
        layer(x).backward(dy)

    # The GEMM calls of one step, for the per-call overhead (recorded around TE's own GEMM).
    native = tex.generic_gemm
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return native(*args, **kwargs)

    tex.generic_gemm = record
    try:
        step()
    finally:
        tex.generic_gemm = native

    times: dict[str, list[float]] = {"plugin": [], "native": []}
    te_flydsl_plugin.reset_stats()
    for r in range(a.rounds):
        for mode in ("plugin", "native") if r % 2 == 0 else ("native", "plugin"):
            if mode == "plugin":
                te_flydsl_plugin.install()
            else:
                te_flydsl_plugin.uninstall()
            times[mode].append(time_steps(step, a.steps))
    te_flydsl_plugin.uninstall()
    s = te_flydsl_plugin.stats()
    plugin_ms, native_ms = statistics.median(times["plugin"]), statistics.median(times["native"])
    paired = sorted(p / n for p, n in zip(times["plugin"], times["native"], strict=True))
    ratio = statistics.median(paired)
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [ratio, ratio, ratio]
    overhead = wrapper_overhead_us(calls)
    result = {
        "shape": {"hidden": a.hidden, "ffn": a.ffn, "heads": a.heads, "seq": a.seq, "batch": a.batch},
        "gemm_calls_per_step": len(calls),
        "plugin_ms": round(plugin_ms, 3),
        "native_ms": round(native_ms, 3),
        "ratio": round(ratio, 4),
        "ratio_iqr": [round(quartiles[0], 4), round(quartiles[2], 4)],
        "ratio_of_medians": round(plugin_ms / native_ms, 4),
        "target": TARGET,
        "wrapper_overhead_us_per_call": round(overhead, 2),
        "wrapper_overhead_per_step_pct": round(100 * overhead * len(calls) / (native_ms * 1e3), 3),
        "plugin_calls": s["by_backend"],
        "declined_by_reason": s["by_reason"],
        "rounds_ms": times,
    }
    print(json.dumps(result, indent=1))
    print(
        f"TransformerLayer step: plugin {plugin_ms:.3f} ms, native {native_ms:.3f} ms, paired ratio {ratio:.4f} "
        f"(IQR {quartiles[0]:.4f}-{quartiles[2]:.4f}; target <= {TARGET}); "
        f"wrapper {overhead:.2f} us/call x {len(calls)} calls/step"
    )
    assert s["by_backend"].get("flydsl", 0) == 0 and s["by_backend"].get("native", 0) > 0, s
    return 1 if a.require and ratio > TARGET else 0


if __name__ == "__main__":
    sys.exit(main())
