"""Output quantizers executed: the GEMM's unquantised result, handed once to the quantizer, is D.

TE's ``generic_gemm`` (gemm.cpp, 2.20) quantises D itself: fused into cuBLASLt (FP8 straight from the
fp32 accumulators) for a delayed scaling quantizer with a per-tensor FP8 operand, else unfused (the
GEMM in the output dtype, then the quantizer). The plugin computes the same unquantised result and
applies the quantizer to it (TE's own ``tex.quantize`` through the TE seam; here a torch per-tensor
FP8 quantizer written from its definition). These tests hold, with the reference and the emulator
executors: the quantizer sees exactly the result the same call without a quantizer returns (in fp32
where TE fuses, else in the output dtype), once, with TE's nominal output dtype; what it returns is
D; the epilogue outputs (bias, GELU pre-activation, dGELU) come out as without a quantizer; what is
not executed (MXFP8, unknown quantizers, a given D, a bias gradient) goes to TE as it came, with a
reason. Real TE's quantizers: tests/te/test_te_output_quantizer.py (H200).
"""

from __future__ import annotations

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin import llvm
from te_flydsl_plugin.dtypes import FP8_TORCH_DTYPES
from te_flydsl_plugin.flydsl.launch_log import LaunchLog
from te_flydsl_plugin.host import dispatch
from te_flydsl_plugin.operands import OutputQuantizer
from te_flydsl_plugin.spec import Format, Layout, QuantizerSpec

from .conftest import RecordingNative
from .gemm_cases import layout_operands

FP8_MAX = {Format.FP8_E4M3: 448.0, Format.FP8_E5M2: 57344.0}  # OCP FP8 largest finite values


class TorchQuantizer:
    """Per-tensor FP8 quantisation by its definition (current scaling: scale = max / amax), recording
    what it was handed."""

    def __init__(self, scaling: str, fmt: Format):
        self.spec = QuantizerSpec(scaling, fmt)
        self.seen: list[tuple[torch.Tensor, torch.dtype]] = []

    def __call__(self, result: torch.Tensor, dtype: torch.dtype) -> dict:
        self.seen.append((result.clone(), dtype))
        amax = result.float().abs().max()
        scale = FP8_MAX[self.spec.format] / amax
        data = (result.float() * scale).to(FP8_TORCH_DTYPES[self.spec.format])
        return {"data": data, "scale_inv": 1 / scale, "dtype": dtype}

    def descriptor(self) -> OutputQuantizer:
        return OutputQuantizer(self.spec, self)


@pytest.fixture(autouse=True)
def _restore_dispatcher():
    yield
    dispatch.configure(backend="default", executor=None, env={})


def _gemm(executor: str, *args):
    dispatch.configure(backend="flydsl", executor=executor, env={})
    native = RecordingNative()
    out = tp.wrap_generic_gemm(native)(*args)
    return out, tp.stats(), native


def _args(a, b, layout: Layout, q, out_dtype, bias=None, gelu=False, gelu_in=None, grad=False, D=None):
    return (a, layout is Layout.TN, b, layout is Layout.NT, D, q, out_dtype, bias, torch.bfloat16, gelu, gelu_in,
            grad, None, 0, False, False)  # fmt: skip


CASES = [
    # a, b, layout, scaling, out dtype, epilogue, (m, n, k), batched B; M != N != K, edge tiles
    (Format.BF16, Format.BF16, Layout.TN, "current", torch.bfloat16, "plain", (72, 40, 128), True),
    (Format.BF16, Format.BF16, Layout.TN, "delayed", torch.float32, "bias", (40, 72, 64), False),
    (Format.FP8_E4M3, Format.FP8_E4M3, Layout.TN, "delayed", torch.bfloat16, "plain", (48, 32, 256), True),
    (Format.FP8_E4M3, Format.FP8_E5M2, Layout.NN, "current", torch.bfloat16, "plain", (48, 32, 256), False),
    (Format.BF16, Format.BF16, Layout.TN, "current", torch.bfloat16, "gelu", (40, 24, 64), False),
    (Format.BF16, Format.BF16, Layout.NN, "delayed", torch.bfloat16, "dgelu", (24, 40, 64), False),
]


def _case_args(a_fmt, b_fmt, layout, epilogue, mnk, batched, out_dtype, q):
    m, n, k = mnk
    gen = torch.Generator().manual_seed(11)
    a, b = (op.passed for op in layout_operands(layout, a_fmt, b_fmt, m, n, k, gen))
    if batched:
        b = b.view(2, m // 2, k) if isinstance(b, torch.Tensor) else b
    extra = {}
    if epilogue == "bias":
        extra["bias"] = torch.randn(n, generator=gen).bfloat16()
    if epilogue == "gelu":
        extra["gelu"] = True
    if epilogue == "dgelu":
        extra.update(gelu=True, grad=True, gelu_in=torch.randn(m, n, generator=gen).to(out_dtype))
    return _args(a, b, layout, q, out_dtype, **extra)


@pytest.mark.parametrize(("a_fmt", "b_fmt", "layout", "scaling", "out_dtype", "epilogue", "mnk", "batched"), CASES,
                         ids=lambda x: getattr(x, "value", str(x)))  # fmt: skip
def test_reference_executor_quantises_the_result_it_would_return(a_fmt, b_fmt, layout, scaling, out_dtype, epilogue,
                                                                 mnk, batched):  # fmt: skip
    quant = TorchQuantizer(scaling, Format.FP8_E4M3)
    got, s, native = _gemm("reference", *_case_args(a_fmt, b_fmt, layout, epilogue, mnk, batched, out_dtype,
                                                    quant.descriptor()))  # fmt: skip
    assert s["by_backend"] == {"flydsl": 1} and not native.calls, s
    fused = scaling == "delayed" and a_fmt.is_fp8
    result_dtype = torch.float32 if fused else out_dtype
    want, s, _ = _gemm("reference", *_case_args(a_fmt, b_fmt, layout, epilogue, mnk, batched, result_dtype, None))
    assert s["by_backend"] == {"flydsl": 1}, s
    assert len(quant.seen) == 1
    seen, nominal = quant.seen[0]
    assert nominal == out_dtype and seen.dtype == result_dtype and seen.shape == want[0].shape
    assert torch.equal(seen, want[0]), "the quantizer was not handed the GEMM's own result"
    assert got[0]["dtype"] == out_dtype and torch.equal(got[0]["data"], quant(want[0], out_dtype)["data"])
    if epilogue == "gelu":  # the pre-activation comes back unquantised, as TE returns it
        assert got[2] is not None and torch.equal(got[2], want[2])


@pytest.mark.emulator
@pytest.mark.skipif(llvm.find_ld_lld() is None, reason="no ld.lld >= 18: gfx950 code cannot be compiled")
@pytest.mark.parametrize(("a_fmt", "b_fmt", "layout", "scaling", "out_dtype", "epilogue", "mnk", "batched"),
                         [CASES[0], CASES[2]], ids=["bf16-current", "fp8-delayed-fp32"])  # fmt: skip
def test_emulator_executor_quantises_the_compiled_kernels_result(a_fmt, b_fmt, layout, scaling, out_dtype, epilogue,
                                                                 mnk, batched):  # fmt: skip
    quant = TorchQuantizer(scaling, Format.FP8_E4M3)
    with LaunchLog() as log:
        got, s, native = _gemm("emulator", *_case_args(a_fmt, b_fmt, layout, epilogue, mnk, batched, out_dtype,
                                                       quant.descriptor()))  # fmt: skip
    assert s["by_backend"] == {"flydsl": 1} and not native.calls, s
    assert log.count("gemm", "emulator") > 0, "the compiled kernel did not run in the emulator"
    fused = scaling == "delayed" and a_fmt.is_fp8
    want, _, _ = _gemm("emulator", *_case_args(a_fmt, b_fmt, layout, epilogue, mnk, batched,
                                               torch.float32 if fused else out_dtype, None))  # fmt: skip
    ((seen, nominal),) = quant.seen
    assert nominal == out_dtype and torch.equal(seen, want[0])
    assert torch.equal(got[0]["data"], quant(want[0], out_dtype)["data"])


def _declined(q, **extra):
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(40, 64, generator=gen).bfloat16(), torch.randn(24, 64, generator=gen).bfloat16()
    layout = extra.pop("layout", Layout.TN)
    if layout is Layout.NT:
        a, b = torch.randn(24, 40, generator=gen).bfloat16(), torch.randn(24, 64, generator=gen).bfloat16()
    args = _args(a, b, layout, q, torch.bfloat16, **extra)
    out, s, native = _gemm("reference", *args)
    assert out[0] == "native" and s["by_backend"] == {"native": 1}, s
    ((got_args, got_kwargs),) = native.calls
    assert all(x is y for x, y in zip(got_args, args, strict=True)) and not got_kwargs
    return s["fallbacks"][0]["reasons"][0]["message"]


def test_what_is_not_executed_goes_to_te_as_it_came_with_its_reason():
    q = TorchQuantizer("current", Format.FP8_E4M3)
    assert "MXFP8 output quantization is declined" in _declined(
        OutputQuantizer(QuantizerSpec("mxfp8", Format.MXFP8_E4M3), q)
    )
    assert "unrecognised builtins.object" in _declined(object())
    assert "without a quantize function" in _declined(OutputQuantizer(q.spec))
    assert "a given D with an output quantizer" in _declined(q.descriptor(), D=torch.empty(24, 40).bfloat16())
    assert "bias gradient with an output quantizer" in _declined(
        q.descriptor(), layout=Layout.NT, bias=torch.zeros(64).bfloat16(), grad=True
    )
    assert not q.seen


def test_a_quantized_d_is_never_written_into():
    class Quantized(torch.Tensor):  # a tensor subclass whose bytes are not its values (TE's Float8Tensor)
        pass

    d = torch.zeros(24, 40).bfloat16().as_subclass(Quantized)
    assert "D is a test_a_quantized_d_is_never_written_into.<locals>.Quantized" in _declined(None, D=d)
    assert not d.any()


def test_a_quantizer_changed_in_place_gets_its_own_verdict():
    """The verdict cache keys a quantizer by what its converter reads (``views.register(..., key)``):
    TE's ``set_usage`` flips a quantizer's usages in place, and the next call must see the new ones."""
    from te_flydsl_plugin.host import views

    class Usage:  # a framework quantizer whose columnwise usage is switched in place
        def __init__(self, quant: TorchQuantizer) -> None:
            self.quant, self.columnwise = quant, False

    def to_view(q: Usage) -> OutputQuantizer:
        spec = QuantizerSpec("current", Format.FP8_E4M3, columnwise=q.columnwise)
        return OutputQuantizer(spec, q.quant)

    views.register(Usage, to_view, key=lambda q: q.columnwise)
    seen = []
    dispatch.configure(backend="flydsl", executor="reference", env={})
    backend = dispatch.current().backend
    run = backend.run
    backend.run = lambda problem, call: seen.append(problem.output_quantizer) or run(problem, call)
    try:
        q = Usage(TorchQuantizer("current", Format.FP8_E4M3))
        a, b = torch.randn(24, 64).bfloat16(), torch.randn(40, 64).bfloat16()
        gemm = tp.wrap_generic_gemm(RecordingNative())
        for columnwise in (False, True, False):
            q.columnwise = columnwise
            gemm(*_args(a, b, Layout.TN, q, torch.bfloat16))
    finally:
        del backend.run
    assert [s.columnwise for s in seen] == [False, True, False]
    assert len(q.quant.seen) == 3
