"""benchmarks/gfx950_coverage.py's CPU-runnable part: the recording backend and the FLOP accounting.

The TE modules it drives need real TE on a GPU (the lead runs it on the H200); here the wrapper is fed
GEMM calls directly with CPU tensors, as TE would issue them, and the shares are checked by hand.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin.host import dispatch

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gfx950_coverage.py"


@pytest.fixture
def coverage(monkeypatch):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gfx950_coverage", _PATH)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gfx950_coverage", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    monkeypatch.setattr(dispatch, "_current", dispatch._current)  # restored after the test
    return mod


def test_shares_follow_the_gfx950_verdicts(coverage, native) -> None:  # type: ignore[no-untyped-def]
    rec = coverage.Recorder()
    d = coverage.recording_dispatcher(rec)
    gemm = tp.wrap_generic_gemm(native)
    m, n, k = 64, 96, 128

    def call(out_dtype, bias, grad=False, times=1):  # type: ignore[no-untyped-def]
        for _ in range(times):
            a, b = torch.randn(n, k, dtype=torch.bfloat16), torch.randn(m, k, dtype=torch.bfloat16)
            gemm(a, True, b, False, None, None, out_dtype, bias, None, False, None, grad, None, 0, False, False)

    call(torch.bfloat16, torch.randn(n, dtype=torch.bfloat16), times=3)  # fprop with bias: backed
    call(torch.float16, None)  # bf16 operands into fp16: a plain config TE's fprop would not use, backed
    call(torch.float32, torch.randn(n, dtype=torch.bfloat16))  # bias into fp32 from bf16: not backed
    got = coverage.summarize(d, rec)
    assert len(native.calls) == 5  # TE computed every one
    assert got["calls"] == 5 and got["gemm_flops"] == 5 * 2 * m * n * k
    assert got["backed_share"] == pytest.approx(4 / 5)
    [(why, share)] = got["declined"].items()
    assert why.startswith("KERNEL: ") and "epilogue bias" in why and share == pytest.approx(1 / 5)
