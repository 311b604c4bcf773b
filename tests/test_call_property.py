"""The GEMM-call contract, held over odd calls (hypothesis), with the reference and the emulator executors.

Every call is executed right (checked against TE's layout math in float64, shapes included), declined to
TE with its arguments exactly as given (the very objects): always so for an argument TE 2.20's
signature lacks (an unknown keyword, a 23rd positional), which TE's own binding then judges. Never an
exception from inside the plugin, never a wrong or reshaped result. The calls mix storage offsets,
strides, sparse tensors, devices (CPU, meta, mixed), dtypes, shapes (empty dims, batched B, K off the
vector), NaN/Inf, and operand descriptors whose fields contradict each other; the oracle never asks the
plugin's own check what should happen. Both decision paths hold it: the compiled one and the Python one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import te_flydsl_plugin as tp
from te_flydsl_plugin import Fp8Operand, MXFP8Operand, llvm
from te_flydsl_plugin.host import dispatch, views
from te_flydsl_plugin.spec import Format, Layout

from .gemm_cases import dgelu64, gelu64, make_fp8, make_operand, shapes, te_math

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}
PLAIN = {Format.FP32: torch.float32, Format.FP16: torch.float16, Format.BF16: torch.bfloat16}
TORCH_FP8 = {Format.FP8_E4M3: torch.float8_e4m3fn, Format.FP8_E5M2: torch.float8_e5m2}


class Contradicting:
    """A framework tensor whose converter builds a descriptor with contradicting fields, of kind ``kind``."""

    def __init__(self, shape: tuple[int, ...], kind: int = 0):
        self.shape = shape
        self.kind = kind


def _contradicting_view(t: Contradicting) -> Any:
    u8 = torch.zeros(t.shape, dtype=torch.uint8)
    if t.kind == 1:  # E4M3 bytes labelled E5M2
        return Fp8Operand(u8.view(torch.float8_e4m3fn), None, torch.ones(1), Format.FP8_E5M2)
    if t.kind == 2:  # two scales for one tensor
        return Fp8Operand(u8, None, torch.ones(2), Format.FP8_E4M3)
    if t.kind == 3:  # MXFP8 with one scale for everything, in fp32
        return MXFP8Operand(u8, torch.ones(1, 1), None, None, Format.MXFP8_E4M3)
    return Fp8Operand(torch.zeros(t.shape, dtype=torch.bfloat16), None, torch.ones(1), Format.FP8_E4M3)


views.register(Contradicting, _contradicting_view)


def _placed(values: torch.Tensor, dtype: torch.dtype, how: str) -> torch.Tensor:
    """``values`` as ``dtype`` stored ``how``: contiguous, at a storage offset, transposed, or strided."""
    if how.startswith("offset"):
        off = int(how[6:])
        out = torch.empty(values.numel() + off, dtype=dtype)[off:].view(values.shape)
        return out.copy_(values)
    if how == "transposed" and values.dim() == 2:
        return values.t().contiguous().to(dtype).t()
    if how == "strided" and values.dim() >= 1:
        wide = torch.empty(*values.shape[:-1], 2 * values.shape[-1], dtype=dtype)
        return wide[..., ::2].copy_(values)
    return values.to(dtype)


@dataclasses.dataclass
class Case:
    """One call: what is passed, and the float64 values TE's math uses (None where none are defined)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    layout: Layout
    a: torch.Tensor | None
    b: torch.Tensor | None
    for_te: bool  # holds an argument TE 2.20 lacks: must reach TE's own generic_gemm as it came


# Odd features; each call takes up to two of them, the rest of it canonical, so a good share executes.
ODD = (
    "a_offset1", "a_offset4", "b_offset1", "a_strided", "b_transposed", "a_meta", "b_meta", "d_meta",
    "nan", "inf", "empty_m", "empty_k", "k_off", "n_off", "fp64_a", "mixed_formats", "tt", "d_wrong_shape",
    "d_transposed", "d_offset1", "bias_wrong_length", "bias_meta", "bias_empty", "gelu_in_transposed",
    "out_none", "out_fp64", "quantizer", "comm", "unknown_keyword", "extra_positional", "fp8_no_data",
    "fp8_no_transpose", "fp8_offset", "fp8_dtype", "fp8_meta_scale", "contradicting", "batched",
    "epilogue_elsewhere", "alpha_beta", "d_not_tensor", "bias_not_tensor", "a_sparse", "d_sparse",
)  # fmt: skip
EPILOGUES = {Layout.TN: ("plain", "bias", "gelu", "bias_gelu"), Layout.NN: ("plain", "dgelu", "dgelu_bgrad"),
             Layout.NT: ("plain", "bgrad")}  # fmt: skip


def _plain_operand(shape, fmt, gen, odd, name):
    dtype = torch.float64 if f"fp64_{name}" in odd else PLAIN[fmt]
    if f"{name}_meta" in odd:
        return torch.empty(shape, dtype=dtype, device="meta"), None
    if f"{name}_sparse" in odd:  # no strides to read: never a GEMM operand
        t = torch.zeros(shape, dtype=dtype)
        return (t.to_sparse_csr() if t.dim() == 2 else t.to_sparse()), None
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.5
    for special, value in (("nan", math.nan), ("inf", math.inf)):
        if special in odd and x.numel() and name == "b":
            x.view(-1)[x.numel() // 2] = value
    how = "contig"
    for h in ("offset1", "offset4", "strided", "transposed"):
        if f"{name}_{h}" in odd:
            how = h
    t = _placed(x, dtype, how)
    return t, t.double()


def _fp8_operand(shape, fmt, gen, odd, name):
    if 0 in shape:  # nothing to scale: zero bytes, unit scale
        last, lead = shape[-1], math.prod(shape[:-1])
        op = Fp8Operand(torch.zeros(shape, dtype=torch.uint8), torch.zeros(last, lead, dtype=torch.uint8),
                        torch.ones(1), fmt)  # fmt: skip
        deq = torch.zeros(shape, dtype=torch.float64)
    else:
        op, deq = make_fp8(torch.randn(shape, generator=gen), fmt)
    if name == "b":  # the odd storages go on B
        if "fp8_no_data" in odd:
            op = dataclasses.replace(op, data=None)
        if "fp8_no_transpose" in odd:
            op = dataclasses.replace(op, transpose=None)
        if "fp8_offset" in odd and op.data is not None:
            op = dataclasses.replace(op, data=_placed(op.data, torch.uint8, "offset1"))
        if "fp8_dtype" in odd and op.data is not None:  # the torch FP8 dtype of its format is as good as uint8
            op = dataclasses.replace(op, data=op.data.view(TORCH_FP8[fmt]))
        if "fp8_meta_scale" in odd:  # one descriptor on two devices
            op = dataclasses.replace(op, scale_inv=torch.ones(1, device="meta"))
    return op, deq.view(shape)


@st.composite
def calls(draw: Any, emulator: bool = False) -> Case:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    odd = draw(st.sets(st.sampled_from(ODD), max_size=2))
    if emulator:  # the formats and layouts of kernels compiled in CI (tests/test_emulator_executor.py)
        odd -= {"tt", "quantizer", "comm", "mixed_formats", "batched", "epilogue_elsewhere", "contradicting"}
        fa, layout = draw(st.sampled_from([(Format.BF16, Layout.TN), (Format.FP32, Layout.NN),
                                           (Format.FP32, Layout.NT), (Format.FP8_E4M3, Layout.NN)]))  # fmt: skip
        fb = Format.FP8_E5M2 if fa is Format.FP8_E4M3 else fa
        epi = "plain"
        m, n, k = draw(st.sampled_from([1, 24, 40])), draw(st.sampled_from([8, 24])), draw(st.sampled_from([32, 64]))
    else:
        fa = draw(st.sampled_from([Format.BF16, Format.FP16, Format.FP32, Format.FP8_E4M3, Format.FP8_E5M2,
                                   Format.MXFP8_E4M3]))  # fmt: skip
        fb = fa
        if fa.is_fp8:
            fb = draw(st.sampled_from([Format.FP8_E4M3, Format.FP8_E5M2]))
        if "mixed_formats" in odd:
            fb = Format.BF16 if fa is not Format.BF16 else Format.FP16
        layout = draw(st.sampled_from([Layout.TN, Layout.NN, Layout.NT]))
        epi = draw(st.sampled_from(EPILOGUES[layout]))
        if "epilogue_elsewhere" in odd:
            epi = draw(st.sampled_from(["bias", "gelu", "bgrad", "dgelu"]))
        if fa.is_mx or fb.is_mx:
            m, n, k = (draw(st.sampled_from([32, 64])) for _ in range(3))
        else:
            m, n, k = (
                draw(st.sampled_from([1, 8, 24, 40])),
                draw(st.sampled_from([16, 48])),
                draw(st.sampled_from([32, 64])),
            )
    m = 0 if "empty_m" in odd else m
    k = 0 if "empty_k" in odd else k + (4 if "k_off" in odd else 0)
    n = n + (2 if "n_off" in odd else 0)
    batch = (2,) if "batched" in odd and layout is not Layout.NT else ()
    if "tt" in odd:
        layout = Layout.TT
    a_shape, b_shape = shapes(layout, m, n, k, batch) if layout is not Layout.TT else ((n, k), (k, m))
    ops = []
    for name, fmt, shape, rowwise in (
        ("a", fa, a_shape, layout is Layout.TN),
        ("b", fb, b_shape, layout is not Layout.NT),
    ):
        if "contradicting" in odd and name == "a":
            ops.append((Contradicting(shape, draw(st.integers(0, 3))), None))
        elif fmt in PLAIN:
            ops.append(_plain_operand(shape, fmt, gen, odd, name))
        elif fmt.is_fp8:
            ops.append(_fp8_operand(shape, fmt, gen, odd, name))
        elif (shape[-1] % 32 and math.prod(shape[:-1]) % 32) or 0 in shape:  # TE holds no MXFP8 of this shape
            ops.append((Contradicting(shape), None))
        else:
            o = make_operand(shape, fmt, gen, quant_rowwise=rowwise)
            ops.append((o.passed, o.value))
    (A, a), (B, b) = ops
    out_shape = (*batch, m, n)
    out_dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    if "out_fp64" in odd:
        out_dtype = torch.float64
    D = None
    d_kind = next((x for x in ("d_meta", "d_wrong_shape", "d_transposed", "d_offset1", "d_sparse") if x in odd),
                  None)  # fmt: skip
    if d_kind is None and draw(st.booleans()):
        d_kind = "right"
    if "out_none" in odd:
        out_dtype, d_kind = None, d_kind or "right"
    d_dtype = out_dtype if out_dtype is not None else torch.float32
    if d_kind == "d_meta":
        D = torch.empty(out_shape, dtype=d_dtype, device="meta")
    elif d_kind == "d_sparse":
        D = torch.zeros(out_shape, dtype=d_dtype).to_sparse()
    elif d_kind == "d_wrong_shape":
        D = torch.randn(n, m * max(math.prod(batch), 1)).to(d_dtype)
    elif d_kind is not None:
        how = {"right": "contig", "d_offset1": "offset1", "d_transposed": "transposed"}[d_kind]
        D = _placed(torch.randn(out_shape, generator=gen, dtype=torch.float64), d_dtype, how)
    gelu, grad = "gelu" in epi, epi in ("bgrad", "dgelu", "dgelu_bgrad")
    bias = None
    if "bias" in epi or "bgrad" in epi or any(x.startswith("bias_") for x in odd):
        length = m if epi == "bgrad" else n
        length = length + 1 if "bias_wrong_length" in odd else 0 if "bias_empty" in odd else length
        bias = torch.randn(length, generator=gen, dtype=torch.float64).to(torch.bfloat16)
        if "bias_meta" in odd:
            bias = bias.to("meta")
    if "d_not_tensor" in odd:
        D = object()
    if "bias_not_tensor" in odd:
        bias = "bias"
    gelu_in = None
    if gelu and grad:
        gshape = (n, m) if "gelu_in_transposed" in odd else out_shape
        gelu_in = torch.randn(gshape, generator=gen, dtype=torch.float64).to(torch.float32)
    accumulate = D is not None and draw(st.booleans())
    quantizer = object() if "quantizer" in odd else None
    kwargs: dict[str, Any] = {"alpha": 1.0, "beta": None}
    if "alpha_beta" in odd:
        kwargs = {"alpha": draw(st.sampled_from([0.5, -2.0])), "beta": draw(st.sampled_from([0.0, 1.0, 0.25]))}
    if "comm" in odd:
        kwargs["comm_type"] = 1  # declined FEATURE, never dropped
    tail: tuple[Any, ...] = ()
    if "unknown_keyword" in odd:
        kwargs["frobnicate"] = 1
    if "extra_positional" in odd:
        tail, kwargs = (None, None, None, False, 1.0, None, "23rd"), {}
    for_te = "unknown_keyword" in odd or "extra_positional" in odd
    args = (A, layout in (Layout.TN, Layout.TT), B, layout in (Layout.NT, Layout.TT), D, quantizer, out_dtype,
            bias, None, gelu, gelu_in, grad, None, 0, accumulate, False, *tail)  # fmt: skip
    return Case(args, kwargs, layout, a, b, for_te)


def _expected(case: Case, d0: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
    """TE's result in float64: D, bias_grad, gelu_input, from the logical operand values."""
    (_, _, _, _, _, _, _, bias, _, gelu, gelu_in, grad, _, _, accumulate, _) = case.args[:16]
    alpha = case.kwargs.get("alpha", 1.0)
    beta = case.kwargs.get("beta")
    beta = (1.0 if accumulate else 0.0) if beta is None else beta
    acc = te_math(case.layout, case.a, case.b)
    res = alpha * acc
    if beta != 0.0:
        res = res + beta * d0
    has_bias = bias is not None and bias.numel() > 0
    bias_grad = pre = None
    if has_bias and not grad:
        res = res + bias.double()
    if gelu and not grad:
        pre = res
        res = gelu64(res)
    elif gelu and grad:
        res = res * dgelu64(gelu_in.double())
    if has_bias and grad:
        bias_grad = res.reshape(-1, res.shape[-1]).sum(0) if gelu else case.b.reshape(-1, case.b.shape[-1]).sum(0)
    return {"D": res, "bias_grad": bias_grad, "gelu_input": pre}


def _assert_matches(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert tuple(got.shape) == tuple(want.shape), f"{what}: reshaped {tuple(got.shape)} != {tuple(want.shape)}"
    g = got.double()
    assert torch.equal(torch.isnan(g), torch.isnan(want)), f"{what}: NaN where TE has none (or the reverse)"
    fin = torch.isfinite(want)
    assert torch.equal(g[~fin & ~torch.isnan(want)], want[~fin & ~torch.isnan(want)]), f"{what}: infinities differ"
    err = (g[fin] - want[fin]).norm() / max(float(want[fin].norm()), 1e-12)
    assert err < TOL[got.dtype], f"{what}: relative error {err:.3g}"


def _hold_contract(case: Case, native, compiled: bool | None = None) -> str:
    """Run one call through the wrapper (``compiled``: which decision path, wrap_generic_gemm's argument)
    and assert the contract; returns what happened."""
    gemm = tp.wrap_generic_gemm(native, compiled=compiled)
    tp.reset_stats()
    native.calls.clear()
    D = case.args[4]
    d0 = D.double().clone() if isinstance(D, torch.Tensor) and D.device.type == "cpu" else None
    res = gemm(*case.args, **case.kwargs)  # nothing may raise from inside the plugin
    assert native.calls or not case.for_te, "an argument TE 2.20 lacks must take the call to TE"
    if native.calls:
        args, kwargs = native.calls[0]
        assert len(native.calls) == 1 and len(args) == len(case.args)
        assert all(x is y for x, y in zip(args, case.args, strict=True)), "TE must get the arguments as given"
        assert kwargs.keys() == case.kwargs.keys() and all(kwargs[k] is v for k, v in case.kwargs.items())
        return "declined"
    assert tp.stats()["by_backend"] == {"flydsl": 1}
    assert case.a is not None and case.b is not None, "a GEMM without defined operand values ran"
    want = _expected(case, d0)
    _assert_matches(res[0], want["D"], "D")
    if D is not None:
        assert res[0] is D, "a given D must be written and returned"
    for i, name in ((1, "bias_grad"), (2, "gelu_input")):
        if want[name] is None:
            assert res[i] is None, f"{name} returned where TE returns None"
        else:
            _assert_matches(res[i], want[name], name)
    assert res[3] is None
    return "executed"


@pytest.fixture
def executor_dispatcher(request):
    d = dispatch.configure(backend="flydsl", executor=request.param, env={})
    yield d
    dispatch.configure(backend="default", executor=None, env={})


_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


@pytest.mark.filterwarnings("ignore::te_flydsl_plugin.host.dispatch.FallbackWarning")
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-path", "python-path"])
@pytest.mark.parametrize("executor_dispatcher", ["reference"], indirect=True)
@settings(max_examples=300, deadline=None, suppress_health_check=_QUIET, derandomize=True)
@given(case=calls())
def test_reference_executor_holds_the_call_contract(executor_dispatcher, native, compiled, case):
    event(_hold_contract(case, native, compiled))


@pytest.mark.emulator
@pytest.mark.filterwarnings("ignore::te_flydsl_plugin.host.dispatch.FallbackWarning")
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-path", "python-path"])
@pytest.mark.parametrize("executor_dispatcher", ["emulator"], indirect=True)
@settings(max_examples=12, deadline=None, suppress_health_check=_QUIET, derandomize=True)
@given(case=calls(emulator=True))
def test_emulator_executor_holds_the_call_contract(executor_dispatcher, native, compiled, case):

    if llvm.find_ld_lld() is None:
        pytest.skip("no ld.lld >= 18: gfx950 code cannot be compiled")
    event(_hold_contract(case, native, compiled))


@pytest.mark.parametrize("executor_dispatcher", ["reference"], indirect=True)
def test_the_odd_calls_do_execute_where_they_should(executor_dispatcher, native):
    """The property is not vacuous: canonical calls among the generated ones run on the backend."""
    gen = torch.Generator().manual_seed(3)
    for layout in (Layout.TN, Layout.NN, Layout.NT):
        a_shape, b_shape = shapes(layout, 24, 16, 32)
        a, b = torch.randn(a_shape, generator=gen), torch.randn(b_shape, generator=gen)
        args = (a, layout is Layout.TN, b, layout is Layout.NT, None, None, torch.float32, None, None, False,
                None, False, None, 0, False, False)  # fmt: skip
        case = Case(args, {}, layout, a.double(), b.double(), False)
        assert _hold_contract(case, native) == "executed"
