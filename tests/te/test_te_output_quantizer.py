"""Output quantizers executed by the plugin: the GEMM's result quantised by TE's own quantizer.

TE's ``generic_gemm`` quantises its output itself (gemm.cpp, 2.20): fused into cuBLASLt for a delayed
scaling ``Float8Quantizer`` with per-tensor FP8 operands, else unfused (the GEMM in the output dtype,
then the quantizer). Through the plugin the same call must return what TE's quantizer makes of the
plugin's unquantised result: the bytes, scale_inv, transpose and nominal dtype of running the GEMM
without a quantizer and quantising its output with TE's quantizer (what NVIDIA TE's own
``test_fp8gemm_with_unfused_quantization`` asks), the delayed quantizer's amax updated as TE's cast
updates it, and the values close to TE's own GEMM with the quantizer. Every GEMM here must run on the
plugin (its counters say so): a call that fell back to TE would compare TE with itself.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from te_real import assert_close, plugin_installed, requires_te

pytestmark = [pytest.mark.te, requires_te]

M, N, K = 96, 160, 224  # output rows, output columns, reduction


def _quantizer(scaling: str, fp8: str, columnwise: bool):
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer

    dtype = {"e4m3": tex.DType.kFloat8E4M3, "e5m2": tex.DType.kFloat8E5M2}[fp8]
    if scaling == "delayed":
        scale = torch.full((1,), 0.5, device="cuda")  # a delayed scale from an earlier amax
        return Float8Quantizer(scale, torch.zeros(1, device="cuda"), dtype, rowwise=True, columnwise=columnwise)
    return Float8CurrentScalingQuantizer(dtype, torch.device("cuda"), rowwise=True, columnwise=columnwise)


def _operands(inputs: str, gen: torch.Generator):
    """TE's A [N, K] (weight side) and B [2, M/2, K] (batched input side), bf16 or per-tensor FP8."""
    a = torch.randn(N, K, generator=gen, device="cuda").mul_(torch.linspace(0.2, 3, K, device="cuda"))
    b = torch.randn(2, M // 2, K, generator=gen, device="cuda") * 2
    if inputs == "bf16":
        return a.bfloat16(), b.bfloat16()
    q = _quantizer("current", "e4m3", columnwise=False)
    return q(a.bfloat16()), q(b.bfloat16())


def _same_quantized(got, want) -> None:
    assert type(got) is type(want) and got.dtype == want.dtype, (type(got), got.dtype, want.dtype)
    assert got._fp8_dtype == want._fp8_dtype
    assert torch.equal(got._data, want._data), "quantized bytes differ"
    assert torch.equal(got._scale_inv, want._scale_inv)
    assert (got._transpose is None) == (want._transpose is None)
    if want._transpose is not None and not want._transpose_invalid:
        assert torch.equal(got._transpose, want._transpose), "quantized transposes differ"


@pytest.mark.parametrize("inputs", ["bf16", "fp8"])
@pytest.mark.parametrize("scaling", ["delayed", "current"])
@pytest.mark.parametrize(("fp8", "columnwise", "out_dtype"), [("e4m3", False, torch.bfloat16),
                                                             ("e5m2", True, torch.float32)])  # fmt: skip
def test_output_quantizer_quantises_the_plugins_result(inputs, scaling, fp8, columnwise, out_dtype) -> None:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    gen = torch.Generator(device="cuda").manual_seed(7)
    a, b = _operands(inputs, gen)
    # TE's own GEMM with the quantizer (fused into cuBLASLt for delayed + FP8, else unfused).
    q_native = _quantizer(scaling, fp8, columnwise)
    try:
        native, *_ = general_gemm(a, b, out_dtype, quantization_params=q_native)
    except RuntimeError as exc:  # cuBLASLt has no FP8-output algorithm for some of these (fp32 C, E5M2 D)
        assert "cuBLAS" in str(exc), exc
        native = None
    q = _quantizer(scaling, fp8, columnwise)
    with plugin_installed() as plugin:
        got, *_ = general_gemm(a, b, out_dtype, quantization_params=q)
        amax_after_gemm = q.amax.clone() if scaling == "delayed" else None
        # The plugin's unquantised result, as the plugin computes it: fp32 where TE fuses the cast.
        fused = scaling == "delayed" and inputs == "fp8"
        result, *_ = general_gemm(a, b, torch.float32 if fused else out_dtype)
    plugin.assert_routed(2)
    assert plugin.ran[0].output_quantizer.scaling == scaling and plugin.ran[0].result_dtype.value == (
        "fp32" if fused else {torch.bfloat16: "bf16", torch.float32: "fp32"}[out_dtype]
    )
    assert got.shape == (2, M // 2, N) and got.dtype == out_dtype
    want = _quantizer(scaling, fp8, columnwise)
    expected = want.make_empty(result.shape, dtype=out_dtype, device=result.device)
    import transformer_engine_torch as tex

    expected = tex.quantize(result, want, expected)
    _same_quantized(got, expected)
    if scaling == "delayed":
        assert torch.equal(amax_after_gemm, want.amax), "the delayed quantizer's amax was not updated as TE's cast does"
        assert float(amax_after_gemm) == float(result.abs().max())
    if native is not None:
        assert_close("against TE's GEMM with the quantizer", got.dequantize(), native.dequantize(), 0.08)


@pytest.mark.parametrize(("scaling", "why"), [("mxfp8", "MXFP8 output quantization is declined"),
                                              ("delayed+D", "D is a Float8Tensor")])  # fmt: skip
def test_declined_output_quantizers_go_to_te_with_their_reason(scaling, why) -> None:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    gen = torch.Generator(device="cuda").manual_seed(3)
    a, b = _operands("bf16", gen)
    if scaling == "mxfp8":
        import transformer_engine_torch as tex
        from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

        q, out = MXFP8Quantizer(tex.DType.kFloat8E4M3), None
    else:
        q = _quantizer("delayed", "e4m3", columnwise=False)
        out = q.make_empty((2, M // 2, N), dtype=torch.bfloat16, device="cuda")
    # TE's own GEMM may refuse the recipe on this GPU (MXFP8 below compute capability 10): the routing
    # is the point.
    with plugin_installed() as plugin, contextlib.suppress(RuntimeError):
        general_gemm(a, b, torch.bfloat16, quantization_params=q, out=out)
    s = plugin.assert_routed(0, native=1)
    assert why in s["fallbacks"][0]["reasons"][0]["message"]
