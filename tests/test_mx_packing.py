"""MXFP8 scale packing: one pack per operand on every GEMM call, so a weight requantised in place is never
computed with stale scales, even when the write is invisible to torch.

TE's quantizers write ``_rowwise_scale_inv`` / ``_columnwise_scale_inv`` (and the data) through raw
pointers: ``torch.Tensor._version`` stays put (measured with TE 2.20.2 on an H200). The tests here make
the same kind of write with ``ctypes.memmove`` between two GEMM calls and assert that the second call
computes with the new bytes, through the whole wrapper, for the reference executor and for the compiled
code run in the gfx950 emulator (whose packer is the scale-pack kernel).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import plan as _plan
from te_flydsl_plugin.flydsl.launch_log import LaunchLog
from te_flydsl_plugin.flydsl.plugin import FlydslBackend
from te_flydsl_plugin.host import dispatch, problem, views
from te_flydsl_plugin.spec import Format, GemmCall, Layout

from .gemm_cases import assert_close, make_mxfp8, shapes, te_math

needs_lld = pytest.mark.skipif(llvm.find_ld_lld() is None, reason="no ld.lld >= 18: gfx950 code cannot be compiled")
M, N, K = 64, 96, 160  # K/32 = 5 blocks: columnwise and rowwise scales both padded


def _raw_overwrite(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src``'s bytes into ``dst`` behind torch's back, as TE's quantizer kernels do."""
    assert dst.is_contiguous() and src.is_contiguous() and dst.nbytes == src.nbytes
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes)


def _call(gemm, a, b, layout: Layout) -> torch.Tensor:
    res = gemm(a, layout is Layout.TN, b, layout is Layout.NT, None, None, torch.float32, None, None, False, None,
               False, None, 0, False, False)  # fmt: skip
    return res[0]


def _operands(layout: Layout):
    gen = torch.Generator().manual_seed(3)
    a_shape, b_shape = shapes(layout, M, N, K)
    w = torch.randn(a_shape, generator=gen)
    # Scales that vary along rows and K: a per-row, per-K-block ramp over the weight.
    ramp = torch.exp2(torch.arange(a_shape[0])[:, None] % 5 + (torch.arange(a_shape[1])[None, :] // 32) % 3)
    a, a_vals = make_mxfp8(w * ramp, Format.MXFP8_E4M3)
    b, b_vals = make_mxfp8(torch.randn(b_shape, generator=gen), Format.MXFP8_E5M2)
    fresh, fresh_vals = make_mxfp8(w.flip(0) * ramp.flip(1) * 64.0, Format.MXFP8_E4M3)
    return a, a_vals, b, b_vals, fresh, fresh_vals


def _logical(layout: Layout, vals, is_a: bool) -> torch.Tensor:
    rows, cols = vals
    if is_a:
        return rows if layout is Layout.TN else cols
    return cols if layout is Layout.NT else rows


def _requantise_in_place(a, fresh) -> None:
    """Every buffer of the weight rewritten with another quantisation's bytes; versions untouched."""
    versions = [t._version for t in (a.rowwise_data, a.rowwise_scale_inv, a.columnwise_data, a.columnwise_scale_inv)]
    _raw_overwrite(a.rowwise_data, fresh.rowwise_data)
    _raw_overwrite(a.rowwise_scale_inv, fresh.rowwise_scale_inv)
    _raw_overwrite(a.columnwise_data, fresh.columnwise_data)
    _raw_overwrite(a.columnwise_scale_inv, fresh.columnwise_scale_inv)
    after = [t._version for t in (a.rowwise_data, a.rowwise_scale_inv, a.columnwise_data, a.columnwise_scale_inv)]
    assert after == versions, "the rewrite must be invisible to torch's version counters, as TE's is"


def _second_call_sees_rewrite(executor: str, layout: Layout, native) -> None:
    a, a_vals, b, b_vals, fresh, fresh_vals = _operands(layout)
    b_value = _logical(layout, b_vals, False)
    dispatch.configure(backend="flydsl", executor=executor, env={})
    try:
        gemm = tp.wrap_generic_gemm(native)
        first = _call(gemm, a, b, layout)
        assert_close(first, te_math(layout, _logical(layout, a_vals, True), b_value), Format.FP32, "first call")
        _requantise_in_place(a, fresh)
        second = _call(gemm, a, b, layout)
        assert tp.stats()["by_backend"] == {"flydsl": 2}, tp.stats()
    finally:
        dispatch.configure(backend="default", env={})
    assert not native.calls
    want = te_math(layout, _logical(layout, fresh_vals, True), b_value)
    assert_close(second, want, Format.FP32, "second call after the weight was requantised in place")


@pytest.mark.parametrize("layout", [Layout.TN, Layout.NN, Layout.NT], ids=lambda x: x.value)
def test_reference_executor_never_serves_stale_scales(native, layout: Layout) -> None:
    _second_call_sees_rewrite("reference", layout, native)


@pytest.mark.emulator
@needs_lld
def test_emulator_executor_never_serves_stale_scales(native) -> None:
    _second_call_sees_rewrite("emulator", Layout.TN, native)


@pytest.mark.emulator
@needs_lld
@pytest.mark.parametrize("layout", [Layout.TN, Layout.NN, Layout.NT], ids=lambda x: x.value)
def test_one_pack_launch_per_operand_on_every_call(layout: Layout) -> None:
    backend = FlydslBackend(executor="reference")
    a, a_vals, b, b_vals, _, _ = _operands(layout)
    c = GemmCall(a, layout is Layout.TN, b, layout is Layout.NT, None, None, torch.float32, None, None, False,
                 None, False, None, 0, False, False)  # fmt: skip
    p = problem.build(c, views.spec_of(a), views.spec_of(b), "cpu", "cpu")
    for call in ("first", "second"):
        with LaunchLog() as log:
            plan = _plan.build(p, c, pack=backend._packer("emulator"))
        assert log.count("scale_pack", "emulator") == 2, f"{call} call: one pack launch per operand"
        from te_flydsl_plugin.flydsl.executors.reference import run as run_reference

        run_reference(plan)
        want = te_math(layout, _logical(layout, a_vals, True), _logical(layout, b_vals, False))
        assert_close(plan.out, want, Format.FP32)
