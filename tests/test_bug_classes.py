"""The seed review's blocking bug classes, made impossible: every argument is executed or the problem is
declined with a reason (and TE's own GEMM gets the call unchanged); nothing is dropped; no shape raises.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin.flydsl import plan as _plan
from te_flydsl_plugin.flydsl.executors.reference import run as run_reference
from te_flydsl_plugin.host import problem, views
from te_flydsl_plugin.spec import Format, GemmCall, Layout

from .gemm_cases import assert_close, shapes, te_math

ARGS = dict(quantizer=None, bias=None, gelu=False, gelu_in=None, grad=False, accumulate=False)


def call(gemm, layout=Layout.TN, m=40, n=24, k=32, dtype=torch.bfloat16, *rest, **overrides):
    a_shape, b_shape = shapes(layout, m, n, k)
    a = overrides.pop("A", None)
    a = torch.randn(a_shape).to(dtype) if a is None else a
    b = torch.randn(b_shape).to(dtype)
    o = {**ARGS, **overrides}
    d = o.pop("D", None)
    res = gemm(a, layout in (Layout.TN, Layout.TT), b, layout in (Layout.NT, Layout.TT), d, o["quantizer"],
               o.pop("output_dtype", torch.bfloat16), o["bias"], None, o["gelu"], o["gelu_in"], o["grad"], None, 0,
               o["accumulate"], False, *rest, **{k: v for k, v in o.items() if k not in ARGS})  # fmt: skip
    return res, a, b


def declined(native, code: str) -> None:
    s = tp.stats()
    assert len(native.calls) == 1, "the declined GEMM must run natively"
    assert s["by_backend"] == {"native": 1}
    assert code in s["by_reason"], s


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"quantizer": object()}, "FEATURE"),
        ({"comm_overlap": object()}, "FEATURE"),
        ({"comm_type": 1}, "FEATURE"),
        ({"extra_output": torch.empty(4)}, "FEATURE"),
        ({"bulk_overlap": True}, "FEATURE"),
        ({"output_dtype": torch.float64}, "FORMAT"),
        ({"A": torch.randn(24, 32, dtype=torch.float64)}, "FORMAT"),
        ({"A": torch.randn(24, 32).to(torch.float16)}, "FORMAT"),  # mixed bf16 x fp16
        ({"A": views.Unsupported(Format.NVFP4, (24, 32), "NVFP4Tensor")}, "FORMAT"),
        ({"A": views.Unsupported(Format.FP8_BLOCK, (24, 32), "Float8BlockwiseQTensor")}, "FORMAT"),
        ({"A": object()}, "FORMAT"),  # an unknown class is a declined problem, never an exception
        ({"D": torch.empty(24, 40, dtype=torch.bfloat16).t()}, "ALIGNMENT"),  # non-contiguous D
    ],
    ids=lambda x: str(x)[:40] if not isinstance(x, dict) else next(iter(x)),
)
def test_unsupported_arguments_are_declined_with_reasons(reference_dispatcher, native, overrides, code):
    marker = {k: v for k, v in overrides.items() if k not in ("A",)}
    res, _, _ = call(tp.wrap_generic_gemm(native), **overrides)
    assert res[0] == "native"
    declined(native, code)
    args, kwargs = native.calls[0]
    # TE's own GEMM receives every argument exactly as the caller passed it.
    for k, v in marker.items():
        pos = {"quantizer": 5, "output_dtype": 6, "D": 4}.get(k)
        got = args[pos] if pos is not None else kwargs[k]
        assert got is v


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"gelu": True, "grad": True, "gelu_in": torch.randn(40, 23).bfloat16()}, "SHAPE"),  # wrong size
        ({"gelu": True, "grad": True, "gelu_in": torch.randn(24, 40).bfloat16().t()}, "ALIGNMENT"),
        ({"bias": torch.randn(48).bfloat16()[::2]}, "ALIGNMENT"),  # strided bias
    ],
    ids=["gelu_in-size", "gelu_in-strided", "bias-strided"],
)
def test_epilogue_tensors_are_validated_never_reshaped_blindly(reference_dispatcher, native, overrides, code):
    layout = Layout.NN if overrides.get("grad") else Layout.TN
    call(tp.wrap_generic_gemm(native), layout, **overrides)
    declined(native, code)


def test_output_the_epilogue_cannot_store_whole_is_declined(reference_dispatcher, native):
    """The kernels store 4 adjacent output columns as one vector: N must be a multiple of 4 and a given
    D must start on one (a view one element in would make every vector store misaligned)."""
    call(tp.wrap_generic_gemm(native), Layout.TN, 40, 26)
    declined(native, "ALIGNMENT")
    assert "N=26 is not a multiple of 4" in str(problem_verdict(40, 26))
    native.calls.clear()
    tp.reset_stats()
    d = torch.empty(40 * 24 + 1, dtype=torch.bfloat16)[1:].view(40, 24)
    _, _, _ = call(tp.wrap_generic_gemm(native), Layout.TN, 40, 24, D=d)
    declined(native, "ALIGNMENT")
    assert native.calls[0][0][4] is d


def problem_verdict(m: int, n: int):  # type: ignore[no-untyped-def]
    from te_flydsl_plugin.flydsl import check

    a, b = torch.randn(n, 32).bfloat16(), torch.randn(m, 32).bfloat16()
    c = GemmCall(a, True, b, False, None, None, torch.bfloat16, None, None, False, None, False, None, 0, False, False)
    return check.check(problem.build(c, views.spec_of(a), views.spec_of(b), "gfx950", "cpu"), "reference")


def test_tt_layout_goes_to_te(reference_dispatcher, native):
    call(tp.wrap_generic_gemm(native), Layout.TT)
    declined(native, "LAYOUT")


@pytest.mark.parametrize(("layout", "epi"), [(Layout.NN, "bias"), (Layout.NT, "gelu"), (Layout.TN, "bgrad")])
def test_epilogue_outside_its_layout_is_declined(reference_dispatcher, native, layout, epi):
    m, n = 40, 24
    o = {"bias": torch.randn(m if epi == "bgrad" else n).bfloat16()} if epi in ("bias", "bgrad") else {}
    o.update(gelu=epi == "gelu", grad=epi == "bgrad")
    call(tp.wrap_generic_gemm(native), layout, m, n, **o)
    declined(native, "EPILOGUE")


def test_fused_gelu_is_executed_never_dropped(reference_dispatcher, native):
    res, a, b = call(tp.wrap_generic_gemm(native), gelu=True, output_dtype=torch.float32)
    assert not native.calls
    pre = te_math(Layout.TN, a.double(), b.double())
    assert res[2] is not None, "the pre-activation must come back as gelu_input"
    assert_close(res[2], pre, Format.FP32, "gelu_input")
    assert not torch.allclose(res[0], res[2]), "D must be the activated output, not the plain GEMM"


def test_positional_tail_is_forwarded_unchanged(reference_dispatcher, native):
    """generic_gemm's arguments after the 16th may arrive positionally; fallbacks forward them as they came."""
    ub = object()
    call(tp.wrap_generic_gemm(native), Layout.TN, 40, 24, 32, torch.bfloat16, ub, None, None, False, 1.0, None)
    args, kwargs = native.calls[0]
    assert args[16] is ub and len(args) == 22 and not kwargs
    declined(native, "FEATURE")


def test_backend_errors_propagate_and_never_become_fallbacks(reference_dispatcher, native, monkeypatch):
    """No exception is a fallback mechanism: a bug inside run() surfaces."""
    backend = reference_dispatcher.backend

    def broken(problem, call):
        raise ZeroDivisionError("kernel bug")

    monkeypatch.setattr(backend, "run", broken)
    with pytest.raises(ZeroDivisionError):
        call(tp.wrap_generic_gemm(native))
    assert not native.calls


# ---------------------------------------------------------------- operands over 2 GiB


def _meta_call(layout, m, n, k, dtype=torch.bfloat16):
    a_shape, b_shape = shapes(layout, m, n, k)
    a = torch.empty(a_shape, dtype=dtype, device="meta")
    b = torch.empty(b_shape, dtype=dtype, device="meta")
    return GemmCall(a, layout is Layout.TN, b, layout is Layout.NT, None, None, dtype, None, None, False, None,
                    False, None, 0, False, False)  # fmt: skip


@pytest.mark.parametrize(
    ("name", "layout", "m", "n", "k"),
    [
        ("llama405b-fprop", Layout.TN, 32768, 16384, 53248),
        ("llama405b-dgrad", Layout.NN, 32768, 53248, 16384),
        ("llama405b-wgrad", Layout.NT, 16384, 53248, 32768),
        ("qwen72b-fprop", Layout.TN, 32768, 59136, 8192),
        ("qwen7b-fprop", Layout.TN, 32768, 37888, 3584),
    ],
)
def test_operands_over_2gib_are_accepted_and_split(name, layout, m, n, k):
    """Built on meta tensors: no memory, no struct.error; every launch window stays within MAX_LAUNCH_BYTES."""
    from te_flydsl_plugin.flydsl import check, matrix

    c = _meta_call(layout, m, n, k)
    # A what-if on meta tensors (no memory): the problem as it would be on one real device.
    p = dataclasses.replace(problem.build(c, views.spec_of(c.A), views.spec_of(c.B), "gfx950", "meta"), devices=())
    assert max(p.a.nbytes, p.b.nbytes, p.m * p.n * 2) > 2**31, "the case must really exceed 2 GiB"
    verdict = check.check(p, "reference")
    assert verdict.ok, verdict
    plan = _plan.build(p, c)
    assert len(plan.pieces) > 1
    spans = _plan.launch_spans(plan)
    assert all(v <= matrix.MAX_LAUNCH_BYTES for s in spans for v in s.values()), spans
    covered = sum((pc.m1 - pc.m0) * (pc.n1 - pc.n0) * (pc.k1 - pc.k0) for pc in plan.pieces)
    assert covered == m * n * k, "pieces must tile the iteration space exactly once"


@pytest.mark.parametrize(
    ("layout", "epi"),
    [(Layout.TN, "plain"), (Layout.NN, "plain"), (Layout.NT, "plain"), (Layout.TN, "bias"), (Layout.NT, "bgrad"),
     (Layout.NN, "dgelu")],
)  # fmt: skip
def test_split_pieces_compute_the_same_result(layout, epi):
    """The host split, executed: a tiny launch limit forces M, N and K pieces; results match torch."""
    m, n, k = 700, 1100, 600
    gen = torch.Generator().manual_seed(1)
    a_shape, b_shape = shapes(layout, m, n, k)
    a, b = torch.randn(a_shape, generator=gen), torch.randn(b_shape, generator=gen)
    bias = torch.randn(m if epi == "bgrad" else n, generator=gen) if epi in ("bias", "bgrad") else None
    gelu_in = torch.randn(m, n, generator=gen) if epi == "dgelu" else None
    c = GemmCall(a, layout is Layout.TN, b, layout is Layout.NT, None, None, torch.float32, bias, None,
                 epi == "dgelu", gelu_in, epi in ("bgrad", "dgelu"), None, 0, False, False)  # fmt: skip
    p = problem.build(c, views.spec_of(a), views.spec_of(b), "cpu", "cpu")
    plan = _plan.build(p, c, limit=1_200_000)
    assert len({(pc.m0, pc.m1) for pc in plan.pieces}) == 3, "M must be split (the output window is too big)"
    # K is split exactly when an operand is not K-major (its window spans whole K rows of the other dim).
    assert (len({(pc.k0, pc.k1) for pc in plan.pieces}) > 1) is (layout is not Layout.TN)
    assert all(pc.m0 % 256 == 0 and pc.n0 % 256 == 0 and pc.k0 % 4 == 0 for pc in plan.pieces), plan.pieces
    assert all(v <= 1_200_000 for span in _plan.launch_spans(plan) for v in span.values())
    run_reference(plan)
    want = te_math(layout, a.double(), b.double())
    if epi == "bias":
        want = want + bias.double()
    if epi == "dgelu":
        from .gemm_cases import dgelu64

        want = want * dgelu64(gelu_in.double())
    assert_close(plan.out, want, Format.FP32)
    if epi == "bgrad":
        assert_close(plan.bias_grad, b.double().sum(0), Format.FP32, "bias_grad")


@pytest.mark.parametrize(
    ("operands_fp8", "out_dtype", "quantizer", "want"),
    [
        (False, torch.float32, None, Format.FP32),  # bf16 operands: the output's dtype, not bias_type's
        (True, torch.float32, None, Format.BF16),  # FP8 operands: bias_type (bf16 here)
        (False, torch.bfloat16, "current", Format.BF16),  # unfused quantization: the unquantised output's
        (True, torch.bfloat16, "delayed", Format.BF16),  # fused (cuBLASLt): bias_type
    ],
)
def test_gelu_pre_activation_has_tes_dtype(operands_fp8, out_dtype, quantizer, want):
    """TE's gemm.cpp (2.20): ``gelu_type = low_precision ? bias_type : out_tensor.dtype()``."""
    from te_flydsl_plugin.operands import OutputQuantizer
    from te_flydsl_plugin.spec import QuantizerSpec

    from .gemm_cases import make_fp8

    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(24, 64, generator=gen), torch.randn(40, 64, generator=gen)
    if operands_fp8:
        a, b = make_fp8(a, Format.FP8_E4M3)[0], make_fp8(b, Format.FP8_E4M3)[0]
    else:
        a, b = a.bfloat16(), b.bfloat16()
    q = None if quantizer is None else OutputQuantizer(QuantizerSpec(quantizer, Format.FP8_E4M3))
    c = GemmCall(a, True, b, False, None, q, out_dtype, None, torch.bfloat16, True, None, False, None, 0, False, False)
    p = problem.build(c, views.spec_of(a), views.spec_of(b), "gfx950", "cpu")
    assert p.aux_dtype is want
