"""Contract tests: every problem the matrix accepts runs through plan + reference executor and matches
an independent torch reference; every combination a row backs runs its compiled gfx950 kernel in the
emulator executor and matches it too; every problem it rejects carries reasons and runs natively.

Shapes have M != N != K, B batched where TE batches it, padded MXFP8 scales (M, N not multiples of
128, K/32 not a multiple of 4), and every epilogue the matrix allows in each layout.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import te_flydsl_plugin as tp
from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import check, matrix
from te_flydsl_plugin.spec import Format, Layout, ReasonCode

from .gemm_cases import assert_close, dgelu64, gelu64, layout_operands, te_math

M, N, K = 80, 48, 96
BATCH = (2,)  # TN/NN: B is [2, 40, K] -> D is [2, 40, N]


def _combinations():
    """Every (row, layout, output, epilogue) of the matrix, with whether the epilogue is defined in the layout."""
    caps = matrix.capabilities()
    for row in caps.rows:
        for layout, out, (epi, where) in itertools.product(caps.layouts, caps.out_dtypes, caps.epilogues):
            yield row, layout, out, epi, layout in where


def _param(row, layout, out, epi):
    return pytest.param(
        row.a_format,
        row.b_format,
        layout,
        out,
        epi,
        id=f"{row.a_format.value}-{row.b_format.value}-{layout.value}-{out.value}-{epi}",
    )


def _cases():
    return [_param(row, lay, out, epi) for row, lay, out, epi, defined in _combinations() if defined]


# What a row's backed list names: one case per combination, and so about one per backed kernel config
# (family.BACKED: an FP8 config serves three layouts, MXFP8's have one config per layout).
BACKED = [_param(row, lay, out, epi) for row, lay, out, epi, _ in _combinations() if row.is_backed(lay, out, epi)]
OUTSIDE_LAYOUT = [_param(row, lay, out, epi) for row, lay, out, epi, defined in _combinations() if not defined]


def run_gemm(a_fmt, b_fmt, layout, out, epi, native, m=M, n=N, k=K, seed=0, accumulate=False, alpha=1.0):
    """Build operands, call the wrapped generic_gemm, and return (result, expected dict)."""
    gen = torch.Generator().manual_seed(seed)
    batch = BATCH if layout is not Layout.NT and m % 2 == 0 else ()
    a, b = layout_operands(layout, a_fmt, b_fmt, m // (batch[0] if batch else 1), n, k, gen, batch)
    raw = te_math(layout, a.value, b.value)  # float64, TE's output shape
    out_dtype = {Format.FP32: torch.float32, Format.BF16: torch.bfloat16, Format.FP16: torch.float16}[out]
    bias_dtype = torch.bfloat16 if out is Format.FP32 else out_dtype
    bias = gelu_in = None
    want: dict[str, torch.Tensor] = {}
    grad = epi in ("bgrad", "dgelu", "dgelu_bgrad")
    gelu = "gelu" in epi
    if epi in ("bias", "bias_gelu", "dgelu_bgrad"):
        bias = torch.randn(n, generator=gen).to(bias_dtype)
    if epi == "bgrad":
        bias = torch.randn(m, generator=gen).to(bias_dtype)
    d = None
    res = alpha * raw
    if accumulate:
        d = torch.randn(raw.shape, generator=gen).to(out_dtype)
        res = res + d.double()
    if epi in ("bias", "bias_gelu"):
        res = res + bias.double()
    if epi in ("gelu", "bias_gelu"):
        want["gelu_input"] = res
        res = gelu64(res)
    if epi in ("dgelu", "dgelu_bgrad"):
        gelu_in = torch.randn(raw.shape, generator=gen).to(out_dtype)
        res = res * dgelu64(gelu_in.double())
    if epi == "bgrad":
        want["bias_grad"] = b.value.reshape(-1, b.value.shape[-1]).sum(0)
    if epi == "dgelu_bgrad":
        want["bias_grad"] = res.reshape(-1, res.shape[-1]).sum(0)
    want["D"] = res
    gemm = tp.wrap_generic_gemm(native)
    got = gemm(a.passed, layout is Layout.TN, b.passed, layout is Layout.NT, d, None, out_dtype, bias, None,
               gelu, gelu_in, grad, None, 0, accumulate, False, alpha=alpha)  # fmt: skip
    return got, want, d


def _assert_results(got, want, out) -> None:
    assert_close(got[0], want["D"], out)
    if "gelu_input" in want:
        assert_close(got[2], want["gelu_input"], out, "gelu_input")
    else:
        assert got[2] is None, "only fprop GELU returns a pre-activation (TE returns None for dGELU)"
    if "bias_grad" in want:
        assert_close(got[1], want["bias_grad"], Format.BF16, "bias_grad")
    else:
        assert got[1] is None
    assert got[3] is None


@pytest.mark.parametrize(("a_fmt", "b_fmt", "layout", "out", "epi"), _cases())
def test_every_accepted_problem_matches_torch(reference_dispatcher, native, a_fmt, b_fmt, layout, out, epi):
    got, want, _ = run_gemm(a_fmt, b_fmt, layout, out, epi, native)
    assert not native.calls, f"fell back to native: {tp.stats()['fallbacks']}"
    assert tp.stats()["by_backend"] == {"flydsl": 1}
    _assert_results(got, want, out)
    # The same problem, judged for compiled code: accepted exactly where the row backs it, else KERNEL.
    (decision,) = reference_dispatcher.cache.values()
    compiled = check.check(decision.problem, "emulator")
    backed = matrix.capabilities().row(a_fmt, b_fmt).is_backed(layout, out, epi)
    assert compiled.ok is backed, compiled
    assert backed or [r.code for r in compiled.reasons] == [ReasonCode.KERNEL], compiled


@pytest.mark.emulator
@pytest.mark.skipif(llvm.find_ld_lld() is None, reason="no ld.lld >= 18: gfx950 code cannot be compiled")
@pytest.mark.parametrize(("a_fmt", "b_fmt", "layout", "out", "epi"), BACKED)
def test_every_backed_combination_runs_in_the_emulator(emulator_dispatcher, native, a_fmt, b_fmt, layout, out, epi):
    """The table claims nothing it cannot run: each backed combination compiles, its gfx950 code runs in the
    emulator (hazard-checked) through the whole host path, and matches the torch reference."""
    from te_flydsl_plugin.flydsl.launch_log import LaunchLog

    with LaunchLog() as log:
        got, want, _ = run_gemm(a_fmt, b_fmt, layout, out, epi, native)
    assert not native.calls, f"fell back to native: {tp.stats()['fallbacks']}"
    assert tp.stats()["by_backend"] == {"flydsl": 1}
    assert log.count("gemm", "emulator") > 0, "the compiled kernel did not run in the emulator"
    _assert_results(got, want, out)


@pytest.mark.parametrize(("a_fmt", "b_fmt", "layout", "out", "epi"), OUTSIDE_LAYOUT)
def test_every_epilogue_outside_its_layouts_is_declined_with_a_reason(
    reference_dispatcher, native, a_fmt, b_fmt, layout, out, epi
):
    got, _, _ = run_gemm(a_fmt, b_fmt, layout, out, epi, native)
    assert got[0] == "native" and len(native.calls) == 1
    (fallback,) = tp.stats()["fallbacks"]
    assert "EPILOGUE" in {r["code"] for r in fallback["reasons"]}, fallback


@pytest.mark.parametrize("layout", [Layout.TN, Layout.NN, Layout.NT])
@pytest.mark.parametrize("fmt", [Format.BF16, Format.FP8_E4M3, Format.MXFP8_E5M2])
def test_accumulate_and_alpha_update_d_in_place(reference_dispatcher, native, layout, fmt):
    got, want, d = run_gemm(fmt, fmt, layout, Format.FP32, "plain", native, accumulate=True, alpha=0.5)
    assert got[0] is d, "D given: the result must land in D itself"
    assert_close(d, want["D"], Format.FP32)


def test_mixed_fp8_dgrad_reads_transposes(reference_dispatcher, native):
    """HYBRID dgrad: E4M3 weight (A, read through its transpose) x E5M2 grad_output (B)."""
    got, want, _ = run_gemm(Format.FP8_E4M3, Format.FP8_E5M2, Layout.NN, Format.BF16, "plain", native, m=72, n=40)
    assert_close(got[0], want["D"], Format.BF16)


# Formats the helpers can build; NVFP4 / blockwise operands are covered in test_bug_classes.py.
_FORMATS = [f for f in Format if f not in (Format.OTHER, Format.NVFP4, Format.FP8_BLOCK)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    a_fmt=st.sampled_from(_FORMATS),
    b_fmt=st.sampled_from(_FORMATS),
    layout=st.sampled_from([Layout.TN, Layout.NN, Layout.NT]),
    out=st.sampled_from([Format.FP32, Format.BF16, Format.FP16]),
    m=st.integers(1, 70),
    n=st.integers(1, 70),
    k=st.sampled_from([16, 32, 48, 64, 96, 100]),
)
def test_any_problem_runs_or_declines_with_reasons(reference_dispatcher, a_fmt, b_fmt, layout, out, m, n, k):
    """Across the space: accepted problems match torch; declined ones ran natively and carry reasons."""
    from .conftest import RecordingNative

    native = RecordingNative()
    tp.reset_stats()
    # MXFP8 copies are built where their blocked dim holds whole 32-blocks; a missing copy is declined.
    assume(not (a_fmt.is_mx or b_fmt.is_mx) or k % 32 == 0)
    got, want, _ = run_gemm(a_fmt, b_fmt, layout, out, "plain", native, m=m, n=n, k=k)
    s = tp.stats()
    if native.calls:
        assert got[0] == "native"
        assert s["by_backend"] == {"native": 1}
        assert s["fallbacks"] and all(f["reasons"] for f in s["fallbacks"])
        assert all(r["message"] and r["code"] in ReasonCode.__members__ for f in s["fallbacks"] for r in f["reasons"])
    else:
        assert s["by_backend"] == {"flydsl": 1}
        assert_close(got[0], want["D"], out)
