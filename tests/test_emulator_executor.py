"""NVTE_FLYDSL_EXECUTOR=emulator end to end: wrapper -> problem -> check -> plan -> launch arguments ->
the compiled gfx950 code object run in the emulator, against the reference executor on the same call.

A pass requires the compiled path to have run: the dispatcher's counters say flydsl ran the GEMM and
the launcher counted emulator launches (a fallback to native or to the reference fails the test).
"""

from __future__ import annotations

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin import llvm
from te_flydsl_plugin.host import dispatch
from te_flydsl_plugin.spec import Format, Layout

from .gemm_cases import layout_operands

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(llvm.find_ld_lld() is None, reason="no ld.lld >= 18: gfx950 code cannot be compiled"),
]

CASES = [
    # a_fmt, b_fmt, layout, out, (m, n, k): M and N are not tile multiples, K spans two K tiles
    (Format.BF16, Format.BF16, Layout.TN, Format.FP32, (72, 40, 128)),
    (Format.FP16, Format.FP16, Layout.TN, Format.BF16, (40, 72, 64)),
    (Format.FP32, Format.FP32, Layout.NN, Format.FP32, (24, 40, 64)),
    (Format.FP32, Format.FP32, Layout.NT, Format.BF16, (40, 24, 32)),
    (Format.FP8_E4M3, Format.FP8_E5M2, Layout.NN, Format.BF16, (48, 32, 256)),  # HYBRID dgrad, transposes
    (Format.FP8_E5M2, Format.FP8_E4M3, Layout.NT, Format.FP32, (32, 48, 128)),  # wgrad, both transposes
]


def _run(executor: str, a, b, layout, out_dtype, native):
    dispatch.configure(backend="flydsl", executor=executor, env={})
    gemm = tp.wrap_generic_gemm(native)
    res = gemm(a, layout is Layout.TN, b, layout is Layout.NT, None, None, out_dtype, None, None, False, None,
               False, None, 0, False, False)  # fmt: skip
    return res[0], tp.stats()


@pytest.mark.parametrize(("a_fmt", "b_fmt", "layout", "out", "mnk"), CASES, ids=lambda x: getattr(x, "value", x))
def test_emulator_executor_matches_reference(native, a_fmt, b_fmt, layout, out, mnk):
    from te_flydsl_plugin.flydsl.launch_log import LaunchLog

    m, n, k = mnk
    gen = torch.Generator().manual_seed(7)
    a, b = (op.passed for op in layout_operands(layout, a_fmt, b_fmt, m, n, k, gen))
    out_dtype = {Format.FP32: torch.float32, Format.BF16: torch.bfloat16}[out]
    try:
        with LaunchLog() as log:
            got, s = _run("emulator", a, b, layout, out_dtype, native)
        assert s["by_backend"] == {"flydsl": 1}, s
        assert log.count("gemm", "emulator") > 0, "the compiled kernel did not run in the emulator"
        want, s = _run("reference", a, b, layout, out_dtype, native)
        assert s["by_backend"] == {"flydsl": 1}, s
    finally:
        dispatch.configure(backend="default", env={})
    assert not native.calls
    err = (got.double() - want.double()).norm() / want.double().norm()
    assert err < (1e-5 if out is Format.FP32 else 8e-3), f"emulated kernel vs reference: relative error {err:.3g}"
