"""``estimate`` (flydsl/estimate.py): the static K-loop bound's invariants on synthetic K-loop reports,
and the command on the real family (the calibrated prediction, --json, --plot, matplotlib missing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from te_flydsl_plugin import cli
from te_flydsl_plugin.flydsl import estimate
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format

from .helpers import needs_toolchain

BF16 = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4)


def _isa(mca: float, floor: int = 512, lds: float | None = None, vgpr: int = 512, lds_bytes: int = 128 * 1024) -> dict:
    """An ISA report as isa.isa_report gives it, with only what the model reads: a 256 x 256 bf16
    loop of 128 four-pass MFMAs (``floor`` passes) timed by llvm-mca at ``mca`` cycles."""
    kl = {"found": True, "mca_cycles": mca, "xdl_floor": floor, "mfma_passes": floor, "mfma": floor // 4,
          "lds_read_bytes": 32768, "lds_write_bytes": 16384}  # fmt: skip
    if lds is not None:
        kl["lds"] = {"per_iteration": {"conflict_cycles": lds}}
    return {"mfma": "v_mfma_f32_16x16x32_bf16", "vgpr": vgpr, "lds_bytes": lds_bytes, "kloop": kl}


def test_at_the_floor_the_mfma_pipe_limits_and_peak_is_reached() -> None:
    r = estimate.static_bound(BF16, _isa(512), 8192, 8192, 8192)
    assert r["limiter"] == "MFMA" and r["share_of_peak"] == pytest.approx(1.0)
    # 256 CUs x 4 SIMDs x 16384 FLOP / 16 clocks x 2.4 GHz: MI355X's 2.5 PFLOP/s dense bf16
    assert r["tflops"] == pytest.approx(256 * 4 * 1024 * 2.4e9 / 1e12)
    assert (r["tiles"], r["resident"], r["rounds"]) == (1024, 1, 4)


def test_a_slower_loop_is_predicted_slower_in_proportion() -> None:
    fast, slow = (estimate.static_bound(BF16, _isa(c), 8192, 8192, 8192) for c in (512, 1024))
    assert slow["limiter"] == "issue" and slow["ms"] == pytest.approx(2 * fast["ms"])


def test_doubling_k_doubles_a_compute_bound_time_and_tiles_round_up() -> None:
    a, b = (estimate.static_bound(BF16, _isa(645), 8192, 8192, k) for k in (4096, 8192))
    assert b["ms"] == pytest.approx(2 * a["ms"])
    # 1025 tiles need a fifth round of 256: the last partial wave of tiles costs a whole one
    edge = estimate.static_bound(BF16, _isa(645), 8192 + 1, 8192, 8192)
    assert edge["rounds"] == 5 and edge["ms"] == pytest.approx(a["ms"] * 2 * 5 / 4)


def test_memory_floor_and_lds_conflicts() -> None:
    thin = estimate.static_bound(BF16, _isa(645), 256, 256, 64 * 1024)  # one tile, a long K: HBM floor?
    assert thin["limiter"] == "issue" and thin["memory_ms"] < thin["compute_ms"]
    flat = estimate.static_bound(BF16, _isa(645), 65536, 65536, 64)  # K = one tile: the output dominates
    assert flat["limiter"] == "memory" and flat["ms"] == pytest.approx(flat["memory_ms"])
    # 4 waves x (48 KiB / 256 + conflicts) LDS clocks against 512 x 4 clocks of MFMA pipe
    calm = estimate.static_bound(BF16, _isa(512, lds=0.0), 8192, 8192, 8192)
    busy = estimate.static_bound(BF16, _isa(512, lds=400.0), 8192, 8192, 8192)
    assert calm["limiter"] == "MFMA" and busy["limiter"] == "LDS"
    assert busy["iteration_clocks"] == 4 * (49152 / 256 + 400) and busy["lds_conflicts_counted"]


def test_residency_by_lds_and_registers() -> None:
    small = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, tile_m=128, tile_n=128, waves=8)
    assert estimate.resident(_isa(0, vgpr=96, lds_bytes=64 * 1024), small) == 2  # LDS: 160 // 64
    assert estimate.resident(_isa(0, vgpr=200, lds_bytes=64 * 1024), small) == 1  # registers: 2 waves a SIMD
    with pytest.raises(ValueError, match="no K-loop timing"):
        estimate.static_bound(BF16, {"kloop": {"found": True, "mca_cycles": None, "mca_note": "no llvm-mca"}}, 1, 1, 1)


@pytest.mark.compile
@needs_toolchain
def test_estimate_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "e.png"
    args = ["--shape", "4096x2048x1024", "--kinds", "bf16", "--json", "--no-lds", "--plot", f"{png}"]
    rc = cli.main(["estimate", *args])
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    rows = data["rows"]
    assert rc == 0 and data["predicted"] and rows[0]["selected"] and not any(r["selected"] for r in rows[1:])
    assert {r["config"] for r in rows} >= {BF16.name} and all(0 < r["share_of_peak"] <= 1 for r in rows)
    assert all(r["limiter"] in ("compute", "fabric", "HBM") and r["static"]["tflops"] > 0 for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plotted 1 GEMM(s)" in captured.err
    rc = cli.main(["estimate", "--suite", "llm", "--only", "llama3.1-8b.o.", "--kinds", "fp8"])
    out = capsys.readouterr().out
    assert rc == 0 and "llama3.1-8b.o.wgrad" in out and "limiter" in out and "*" in out and "predicted" in out
    assert cli.main(["estimate", "--shape", "12x3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MxNxK" in err


def test_plot_without_matplotlib_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib is optional: without it ``--plot`` fails at once, in one line, before any work."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    for command in (["estimate", "--shape", "64x64x64"], ["bench", "--suite", "square"]):
        assert cli.main([*command, "--plot", "x.png"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "pip install 'te-flydsl-plugin[plot]'" in err


@pytest.mark.compile
@needs_toolchain
@pytest.mark.parametrize("name", [BF16.name, "gemm_fp8_e4m3_fp8_e4m3_kk_bf16_plain_256x256x128_w4"])
def test_the_memory_stream_never_drains_where_the_port_limits(name: str) -> None:
    """The hand-over issues tile t + 2's DMA before it waits for tile t + 1 (docs/kernels.md, "Why PR 676's
    bf16 is predicted faster"): where the CU's bandwidth limits, an iteration costs exactly its 64 KiB
    at that bandwidth, no memory latency on top (waiting first cost 700 clocks more an iteration)."""
    from te_flydsl_plugin.flydsl import family, tile_timing

    cfg = next(c for c in family.FAMILY if c.name == name)
    lines = {r["bytes_per_clock"]: r["per_iteration"] for r in tile_timing.kernel_lines(cfg, 1)["lines"]["1"]}
    tile_bytes = (cfg.tile_m + cfg.tile_n) * 128  # 128 bytes of K a row
    for bpc in (2.0, 4.0, 8.0, 16.0):
        assert lines[bpc] == pytest.approx(tile_bytes / bpc, abs=1), (bpc, lines)
