"""Odd GEMM calls from issue 14: each is executed right, declined to TE with its arguments exactly as given,
or refused as TE's own signature refuses it; never an exception from inside the plugin, never a wrong or
reshaped result."""

from __future__ import annotations

import pytest
import torch

import te_flydsl_plugin as tp

ARGS16 = (None, None, torch.float32, None, None, False, None, False, None, 0, False, False)


def tn_args(m: int = 24, n: int = 16, k: int = 32, **tensors) -> tuple:
    """generic_gemm's sixteen positionals for a TN fp32 GEMM (D, bias, gelu_in from ``tensors``)."""
    a = tensors.pop("A", None)
    b = tensors.pop("B", None)
    a = torch.randn(n, k) if a is None else a
    b = torch.randn(m, k) if b is None else b
    args = list((a, True, b, False, *ARGS16))
    for name, pos in (("D", 4), ("bias", 7), ("gelu", 9), ("gelu_in", 10), ("grad", 11)):
        if name in tensors:
            args[pos] = tensors.pop(name)
    assert not tensors
    return tuple(args)


# ---------------------------------------------------------------- item 1: TE's signature


def _te_2_20_generic_gemm(A, transA, B, transB, D, quantizer, output_dtype, bias, bias_type, gelu, gelu_in,
                          grad, workspace, workspace_size, accumulate, use_split_accumulator, comm_overlap=None,
                          comm_type=None, extra_output=None, bulk_overlap=False, alpha=1.0, beta=None):  # fmt: skip
    """TE 2.20's binding, as far as refusing arguments goes (pybind11 raises TypeError the same way)."""
    return ["native", None, None, None]


@pytest.mark.parametrize(
    ("args_extra", "kwargs", "unknown"),
    [
        ((), {"frobnicate": 1}, "frobnicate"),
        ((None, None, None, False, 1.0, None, "extra"), {}, "positional argument 23"),
    ],
    ids=["unknown-keyword", "23rd-positional"],
)
def test_an_argument_te_2_20_lacks_goes_to_te_as_it_came(reference_dispatcher, native, args_extra, kwargs, unknown):
    """Never dropped, never guessed: TE's own generic_gemm gets the call untouched and decides (TE 2.20
    raises TypeError; a newer TE that has the argument runs it)."""
    args = (*tn_args(), *args_extra)
    assert tp.wrap_generic_gemm(native)(*args, **kwargs)[0] == "native"
    (got_args, got_kwargs), *more = native.calls
    assert not more and got_kwargs == kwargs and all(a is b for a, b in zip(got_args, args, strict=True))
    s = tp.stats()
    assert s["by_reason"] == {"FEATURE": 1} and s["by_backend"] == {"native": 1}, s
    assert unknown in s["fallbacks"][0]["reasons"][0]["message"]
    with pytest.raises(TypeError):
        tp.wrap_generic_gemm(_te_2_20_generic_gemm)(*args, **kwargs)


def test_the_same_call_without_the_unknown_argument_still_runs_on_the_backend(reference_dispatcher, native):
    """The decline is keyed on the unknown names: it never sticks to the plain call of the same shape."""
    gemm = tp.wrap_generic_gemm(native)
    gemm(*tn_args(), frobnicate=1)
    gemm(*tn_args())
    assert tp.stats()["by_backend"] == {"native": 1, "flydsl": 1}


@pytest.mark.parametrize(
    ("args_extra", "kwargs", "match"),
    [((None,), {"comm_overlap": None}, "multiple values"), ((), {"A": None}, "multiple values")],
    ids=["tail-twice", "A-twice"],
)
def test_a_call_te_would_refuse_raises_typeerror(reference_dispatcher, native, args_extra, kwargs, match):
    with pytest.raises(TypeError, match=match):
        tp.wrap_generic_gemm(native)(*tn_args(), *args_extra, **kwargs)
    assert not native.calls and tp.stats()["total"] == 0


def test_a_missing_argument_raises_typeerror(reference_dispatcher, native):
    with pytest.raises(TypeError, match="use_split_accumulator"):
        tp.wrap_generic_gemm(native)(*tn_args()[:15])


def test_every_argument_may_come_by_keyword(reference_dispatcher, native):
    from te_flydsl_plugin.host.signature import REQUIRED

    args = tn_args()
    res = tp.wrap_generic_gemm(native)(**dict(zip(REQUIRED, args, strict=True)), alpha=2.0)
    torch.testing.assert_close(res[0], 2.0 * args[2] @ args[0].t())
    assert not native.calls


# ---------------------------------------------------------------- item 6 and 13: counting, raising check


def test_the_report_counts_calls_not_reasons(reference_dispatcher, native):
    """Two FORMAT reasons (fp64 A and fp64 B) on one call are one FORMAT decline."""
    a, b = torch.randn(16, 32, dtype=torch.float64), torch.randn(24, 32, dtype=torch.float64)
    gemm = tp.wrap_generic_gemm(native)
    gemm(*tn_args(A=a, B=b))
    gemm(*tn_args(A=a, B=b))
    s = tp.stats()
    assert s["by_reason"] == {"FORMAT": 2} and s["total"] == 2, s
    assert "declined [FORMAT]: 2" in reference_dispatcher.report()


def test_dispatch_copies_no_iterator():
    """copy.copy of itertools.count is deprecated (removed in Python 3.14); counters never need it."""
    import inspect

    from te_flydsl_plugin.host import dispatch

    assert "copy" not in inspect.getsource(dispatch)


# ---------------------------------------------------------------- item 2: operand starts


def declined_to_te(native, args: tuple, code: str) -> None:
    """The call went to TE with exactly its arguments, declined for ``code``."""
    s = tp.stats()
    assert s["by_backend"] == {"native": 1} and code in s["by_reason"], s
    got, kwargs = native.calls[-1]
    assert len(got) == len(args) and all(x is y for x, y in zip(got, args, strict=True)) and not kwargs


def offset_view(shape: tuple[int, ...], offset: int, dtype=torch.bfloat16) -> torch.Tensor:
    """A contiguous tensor of ``shape`` starting ``offset`` elements into its storage."""
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + offset).to(dtype)[offset:].view(shape)


@pytest.mark.emulator
@pytest.mark.parametrize(("which", "offset"), [("A", 1), ("A", 4), ("B", 1), ("B", 4)])
def test_an_operand_off_a_16_byte_start_is_declined(emulator_dispatcher, native, which, offset):
    m, n, k = 72, 40, 128  # the emulator's bf16 TN case (its kernel is compiled already)
    shape = (n, k) if which == "A" else (m, k)
    args = tn_args(m, n, k, **{which: offset_view(shape, offset)}, **{"AB".replace(which, ""): torch.randn(
        (m, k) if which == "A" else (n, k)).bfloat16()})  # fmt: skip
    args = (*args[:6], torch.float32, *args[7:])
    tp.wrap_generic_gemm(native)(*args)
    declined_to_te(native, args, "ALIGNMENT")
    assert "vector loads need 16" in str(tp.stats()["fallbacks"][0]["reasons"])


@pytest.mark.emulator
def test_an_operand_on_a_16_byte_start_runs_in_the_emulator(emulator_dispatcher, native):
    m, n, k = 72, 40, 128
    a, b = offset_view((n, k), 8), offset_view((m, k), 16)  # 16 and 32 bytes in
    res = tp.wrap_generic_gemm(native)(*tn_args(m, n, k, A=a, B=b))
    assert tp.stats()["by_backend"] == {"flydsl": 1}
    torch.testing.assert_close(res[0], b.float() @ a.float().t(), rtol=2e-5, atol=2e-5)


def test_the_verdict_cache_tells_d_starts_apart(reference_dispatcher, native):
    """An aligned D first, then a D of the same shape one element in: the second must not reuse the verdict."""
    gemm = tp.wrap_generic_gemm(native)
    gemm(*tn_args(D=torch.empty(24, 16)))
    assert tp.stats()["by_backend"] == {"flydsl": 1}
    tp.reset_stats()
    args = tn_args(D=offset_view((24, 16), 1, torch.float32))
    gemm(*args)
    declined_to_te(native, args, "ALIGNMENT")


# ---------------------------------------------------------------- item 3: devices


@pytest.mark.parametrize(
    ("where", "code"),
    [
        ({"A": "meta"}, "SHAPE"),
        ({"B": "meta"}, "SHAPE"),
        ({"A": "meta", "B": "meta"}, "FEATURE"),  # D on CPU: mixed too, and meta
        ({"A": "meta", "B": "meta", "D": "meta"}, "FEATURE"),
        ({"bias": "meta"}, "SHAPE"),
        ({"D": "meta"}, "SHAPE"),
    ],
    ids=lambda w: "+".join(f"{k}={v}" for k, v in w.items()) if isinstance(w, dict) else w,
)
def test_meta_and_mixed_devices_are_declined(reference_dispatcher, native, where, code):
    m, n, k = 24, 16, 32
    t = {
        "A": torch.randn(n, k, device=where.get("A", "cpu")),
        "B": torch.randn(m, k, device=where.get("B", "cpu")),
        "D": torch.empty(m, n, device=where.get("D", "cpu")),
    }
    if "bias" in where:
        t["bias"] = torch.randn(n, device="meta")
    args = tn_args(m, n, k, **t)
    tp.wrap_generic_gemm(native)(*args)
    declined_to_te(native, args, code)


def test_the_operand_start_rule_is_the_kernels_dma_width():
    pytest.importorskip("flydsl")
    from te_flydsl_plugin.flydsl import matrix
    from te_flydsl_plugin.flydsl.kernels import gemm

    assert matrix.OPERAND_ALIGN == gemm.DMA_BYTES


# ---------------------------------------------------------------- item 4: output and gelu_in shapes


@pytest.mark.parametrize("d_shape", [(16, 24), (24 * 16,), (2, 12, 16), (1, 24, 16)], ids=str)
def test_a_d_of_another_shape_is_left_to_te(reference_dispatcher, native, d_shape):
    args = tn_args(D=torch.empty(d_shape))  # the output is (24, 16)
    tp.wrap_generic_gemm(native)(*args)
    declined_to_te(native, args, "SHAPE")


def test_dgelu_with_a_transposed_gelu_in_is_left_to_te(reference_dispatcher, native):
    m, n, k = 24, 16, 32
    args = tn_args(m, n, k, A=torch.randn(k, n), gelu=True, grad=True, gelu_in=torch.randn(n, m))
    args = (args[0], False, *args[2:])  # NN: dgrad
    tp.wrap_generic_gemm(native)(*args)
    declined_to_te(native, args, "SHAPE")


def test_forward_gelu_ignores_a_given_gelu_in_as_te_does(reference_dispatcher, native):
    """TE allocates the forward pre-activation itself: a caller's gelu_in is neither written nor returned."""
    given = torch.zeros(24, 16)
    args = tn_args(gelu=True, gelu_in=given)
    res = tp.wrap_generic_gemm(native)(*args)
    assert tp.stats()["by_backend"] == {"flydsl": 1}
    pre = args[2] @ args[0].t()
    torch.testing.assert_close(res[2], pre)
    assert res[2] is not given and not given.any(), "the caller's gelu_in must stay untouched"
    assert res[2].shape == (24, 16) and res[0].shape == (24, 16)


# ---------------------------------------------------------------- item 5: descriptors validate at construction


def _fp8(fmt_name: str = "FP8_E4M3", **fields):
    from te_flydsl_plugin import Fp8Operand
    from te_flydsl_plugin.spec import Format

    base = {"data": torch.zeros(16, 32, dtype=torch.uint8), "transpose": None, "scale_inv": torch.ones(1)}
    return Fp8Operand(**{**base, **fields, "format": Format[fmt_name]})


def _mx(**fields):
    from te_flydsl_plugin import MXFP8Operand
    from te_flydsl_plugin.spec import Format

    base = {
        "rowwise_data": torch.zeros(64, 32, dtype=torch.uint8),
        "rowwise_scale_inv": torch.full((128, 4), 127, dtype=torch.uint8),
        "columnwise_data": None,
        "columnwise_scale_inv": None,
    }
    return MXFP8Operand(**{**base, **fields, "format": Format.MXFP8_E4M3})


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: _fp8("FP8_E5M2", data=torch.zeros(16, 32).to(torch.float8_e4m3fn)), "float8_e4m3fn, but format"),
        (lambda: _fp8(data=torch.zeros(16, 32, dtype=torch.bfloat16)), "bfloat16"),
        (lambda: _fp8(scale_inv=torch.ones(2)), "one float32 value"),
        (lambda: _fp8(scale_inv=torch.ones(1, dtype=torch.bfloat16)), "one float32 value"),
        (lambda: _fp8(transpose=torch.zeros(16, 32, dtype=torch.uint8)), "not the transpose"),
        (lambda: _mx(rowwise_scale_inv=torch.full((32, 1), 127, dtype=torch.uint8)), "covering"),
        (lambda: _mx(rowwise_scale_inv=torch.ones(128, 4)), "uint8"),
        (lambda: _mx(rowwise_data=torch.zeros(64, 32, dtype=torch.float16)), "float16"),
        (
            lambda: _mx(
                columnwise_data=torch.zeros(64, 64, dtype=torch.uint8),
                columnwise_scale_inv=torch.full((4, 128), 127, dtype=torch.uint8),
            ),
            "differ in shape",
        ),
    ],
    ids=[
        "fp8-dtype-vs-format",
        "fp8-bf16-data",
        "fp8-2-scales",
        "fp8-bf16-scale",
        "fp8-bad-transpose",
        "mx-few-scales",
        "mx-fp32-scales",
        "mx-fp16-data",
        "mx-shapes-differ",
    ],
)
def test_descriptors_with_contradicting_fields_are_refused_at_construction(build, match):
    from te_flydsl_plugin.operands import InvalidOperand

    with pytest.raises(InvalidOperand, match=match):
        build()


def test_a_framework_tensor_with_contradicting_fields_is_declined(reference_dispatcher, native):
    """A converter (TE's seam) building an invalid descriptor: declined FORMAT, never an error mid-GEMM."""
    from te_flydsl_plugin.host import views

    class FakeFp8:  # bf16 bytes where FP8 bytes belong
        shape = (16, 32)

    views.register(FakeFp8, lambda t: _fp8(data=torch.zeros(16, 32, dtype=torch.bfloat16)))
    args = tn_args(A=FakeFp8())
    tp.wrap_generic_gemm(native)(*args)
    declined_to_te(native, args, "FORMAT")
    assert "bfloat16" in str(tp.stats()["fallbacks"][0]["reasons"])


@pytest.mark.parametrize(
    "overrides",
    [{"D": object()}, {"bias": "bias"}, {"gelu": True, "grad": True, "gelu_in": [1.0]}, {"alpha": "two"}],
    ids=["D-object", "bias-str", "gelu_in-list", "alpha-str"],
)
def test_arguments_of_a_type_te_does_not_take_go_to_te_as_given(reference_dispatcher, native, overrides):
    """Never an AttributeError from inside the plugin: TE's binding answers for such a call."""
    alpha = overrides.pop("alpha", None)
    args = tn_args(**overrides)
    kwargs = {} if alpha is None else {"alpha": alpha}
    tp.wrap_generic_gemm(native)(*args, **kwargs)
    got, got_kwargs = native.calls[-1]
    assert all(x is y for x, y in zip(got, args, strict=True)) and got_kwargs.keys() == kwargs.keys()
    assert all(got_kwargs[k] is v for k, v in kwargs.items()) and "SHAPE" in tp.stats()["by_reason"]
