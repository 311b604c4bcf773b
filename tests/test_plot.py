"""``--plot`` (flydsl/plot.py) on bench-shaped rows, which only a gfx950 produces: the picked config,
torch.matmul beside it and the datasheet peak of each kind."""

from __future__ import annotations

from pathlib import Path

from te_flydsl_plugin.flydsl import plot


def test_bench_rows_plot_with_torch_and_the_peak(tmp_path: Path) -> None:
    base = {"shape": "llama3.1-8b.o.fprop", "kind": "bf16"}
    rows = [
        {**base, "config": "gemm_bf16_a", "selected": True, "tflops": 900.0},
        {**base, "config": "gemm_bf16_b", "selected": False, "tflops": 700.0},
        {**base, "config": "torch.matmul", "selected": False, "tflops": 800.0},
        {"shape": "llama3.1-8b.o.fprop", "kind": "fp8", "config": "gemm_fp8", "selected": True, "tflops": 2000.0},
    ]
    out = tmp_path / "b.png"
    assert plot.plot(rows, str(out), "measured") == 2
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert plot._peak(rows[0]) == plot.DATASHEET_PEAK_TFLOPS["bf16"]
    assert plot._peak({"tflops": 1000.0, "share_of_peak": 0.4, "kind": "bf16"}) == 2500.0
