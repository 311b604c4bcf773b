"""MXFP8 scale packing in the plan: one scale-pack kernel launch per operand, the weight's packed scales
reused only while its scale storage is provably unchanged, never stale after an update.

Runs the real scale-pack code object in the gfx950 emulator (the packers the compiled executors use).
"""

from __future__ import annotations

import pytest
import torch

from te_flydsl_plugin.flydsl import plan as _plan
from te_flydsl_plugin.flydsl import toolchain
from te_flydsl_plugin.flydsl.executors import run_reference
from te_flydsl_plugin.flydsl.kernels import scale_pack
from te_flydsl_plugin.flydsl.plugin import FlydslBackend
from te_flydsl_plugin.host import operands, problem
from te_flydsl_plugin.spec import Format, GemmCall, Layout

from .gemm_cases import assert_close, make_mxfp8, shapes, te_math

pytestmark = [
    pytest.mark.emulator,
    pytest.mark.skipif(toolchain.find_ld_lld() is None, reason="no ld.lld >= 18: gfx950 code cannot be compiled"),
]


def _plan_for(backend, a, b, layout):
    c = GemmCall(a, layout is Layout.TN, b, layout is Layout.NT, None, None, torch.float32, None, None, False,
                 None, False, None, 0, False, False)  # fmt: skip
    p = problem.build(c, operands.spec_of(a), operands.spec_of(b), "cpu", "cpu")
    pack, weight_pack = backend._packers("emulator")
    return _plan.build(p, c, pack=pack, weight_pack=weight_pack)


@pytest.mark.parametrize("layout", [Layout.TN, Layout.NN, Layout.NT])
def test_one_pack_launch_per_operand_and_weight_reuse(layout):
    backend = FlydslBackend(executor="reference")
    m, n, k = 64, 96, 160  # K/32 = 5 blocks: columnwise and rowwise scales both padded
    gen = torch.Generator().manual_seed(3)
    a_shape, b_shape = shapes(layout, m, n, k)
    wa = torch.randn(a_shape, generator=gen)
    a, (a_rows, a_cols) = make_mxfp8(wa, Format.MXFP8_E4M3)
    b, (b_rows, b_cols) = make_mxfp8(torch.randn(b_shape, generator=gen), Format.MXFP8_E5M2)

    b_value = b_cols if layout is Layout.NT else b_rows

    def plan_and_check(launches: int, why: str, a_rows, a_cols) -> None:
        before = scale_pack.launch_counts["emulator"]
        plan = _plan_for(backend, a, b, layout)
        assert scale_pack.launch_counts["emulator"] - before == launches, why
        run_reference(plan)
        assert_close(plan.out, te_math(layout, a_rows if layout is Layout.TN else a_cols, b_value), Format.FP32)

    plan_and_check(2, "one scale-pack launch per operand", a_rows, a_cols)

    plan_and_check(1, "unchanged weight scales are reused", a_rows, a_cols)

    # An optimizer step re-quantizes the weight in place: its packed scales must be re-packed.
    scales = a.rowwise_scale_inv if layout is Layout.TN else a.columnwise_scale_inv
    fresh, (fr_rows, fr_cols) = make_mxfp8(wa * 8.0, Format.MXFP8_E4M3)
    scales.copy_(fresh.rowwise_scale_inv if layout is Layout.TN else fresh.columnwise_scale_inv)
    data = a.rowwise_data if layout is Layout.TN else a.columnwise_data
    data.copy_(fresh.rowwise_data if layout is Layout.TN else fresh.columnwise_data)
    plan_and_check(2, "an updated weight is never served stale scales", fr_rows, fr_cols)
