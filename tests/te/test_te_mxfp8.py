"""MXFP8 storages built directly (the H200's TE refuses the MXFP8 recipe) through the plugin.

TE's own ``MXFP8TensorStorage`` objects go through ``general_gemm`` -> the seam's adapter -> plan ->
reference executor, and the result is compared with a matmul of the dequantised storage each layout
must read (TE's own ``dequantize()`` where TE supports it; on the H200 TE refuses MXFP8 dequantize
below compute capability 10, so the same bytes are decoded independently). The rowwise and
columnwise copies hold *different* values on purpose: reading the wrong one cannot pass. Scale
padding is filled with 0xFF (E8M0 NaN): reading it poisons the output. M, N, K are distinct and not
multiples of 128, so every padding rule is exercised.
"""

from __future__ import annotations

import pytest
import torch
from te_real import assert_close, plugin_installed, requires_te

pytestmark = [pytest.mark.te, requires_te]

M, N, K = 96, 160, 224  # output rows, output columns, reduction


def _roundup(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _codes(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """Random E4M3 bit patterns without NaN codes, moderate magnitudes."""
    vals = torch.randn(rows, cols, generator=gen, device="cuda").clamp(-8, 8)
    return vals.to(torch.float8_e4m3fn).view(torch.uint8)


def _scales(rows: int, cols: int, padded: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    s = torch.full(padded, 0xFF, dtype=torch.uint8, device="cuda")
    s[:rows, :cols] = torch.randint(122, 132, (rows, cols), generator=gen, device="cuda", dtype=torch.uint8)
    return s


def _storage(rows: int, cols: int, gen: torch.Generator, rowwise: bool, columnwise: bool):
    """A [rows, cols] MXFP8 storage with independent random rowwise and/or columnwise copies."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage

    rd = _codes(rows, cols, gen) if rowwise else None
    rs = _scales(rows, cols // 32, (_roundup(rows, 128), _roundup(cols // 32, 4)), gen) if rowwise else None
    cd = _codes(rows, cols, gen) if columnwise else None
    cs = _scales(rows // 32, cols, (_roundup(rows // 32, 4), _roundup(cols, 128)), gen) if columnwise else None
    return MXFP8TensorStorage(
        rowwise_data=rd,
        rowwise_scale_inv=rs,
        columnwise_data=cd,
        columnwise_scale_inv=cs,
        fp8_dtype=tex.DType.kFloat8E4M3,
        quantizer=None,
        with_gemm_swizzled_scales=False,
        fake_dtype=torch.bfloat16,
    )


def _only(storage, rowwise: bool) -> torch.Tensor:
    """One direction of ``storage`` in fp32: TE's own dequantize where TE can run it (compute
    capability >= 10), else an independent decode of the same bytes (E4M3 code x 2**(E8M0 - 127),
    block 32 along the direction's K, padding never read): the H200's TE refuses MXFP8 dequantize."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage

    data = storage._rowwise_data if rowwise else storage._columnwise_data
    scales = storage._rowwise_scale_inv if rowwise else storage._columnwise_scale_inv
    if torch.cuda.get_device_capability()[0] >= 10:
        one = MXFP8TensorStorage(
            rowwise_data=data if rowwise else None,
            rowwise_scale_inv=scales if rowwise else None,
            columnwise_data=None if rowwise else data,
            columnwise_scale_inv=None if rowwise else scales,
            fp8_dtype=tex.DType.kFloat8E4M3,
            quantizer=None,
            with_gemm_swizzled_scales=False,
            fake_dtype=torch.float32,
        )
        return one.dequantize(dtype=torch.float32)
    vals = data.reshape(-1, data.shape[-1]).view(torch.float8_e4m3fn).float()
    rows, cols = vals.shape
    if rowwise:
        block = scales[:rows, : cols // 32].float().repeat_interleave(32, dim=1)
    else:
        block = scales[: rows // 32, :cols].float().repeat_interleave(32, dim=0)
    return (vals * torch.exp2(block - 127)).reshape(data.shape)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_mxfp8_storages_through_plan_and_reference(layout: str) -> None:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    gen = torch.Generator(device="cuda").manual_seed(5)
    # TE's logical shapes per layout (notes/te-gemm-api.md): TN A=[N,K] B=[M,K]; NN A=[K,N] B=[M,K];
    # NT A=[K,N] B=[K,M]. Both copies present, so the plan has to choose.
    a_shape = (N, K) if layout == "TN" else (K, N)
    b_shape = (K, M) if layout == "NT" else (M, K)
    a = _storage(*a_shape, gen, rowwise=True, columnwise=True)
    b = _storage(*b_shape, gen, rowwise=True, columnwise=True)
    a_row, a_col = _only(a, True), _only(a, False)
    b_row, b_col = _only(b, True), _only(b, False)
    if layout == "TN":
        want = b_row @ a_row.T  # blocks along K = the last dim of both
    elif layout == "NN":
        want = b_row @ a_col  # A's K is its leading dim: columnwise blocks
    else:
        want = b_col.T @ a_col
    with plugin_installed() as plugin:
        out, *_ = general_gemm(a, b, out_dtype=torch.float32, layout=layout)
    plugin.assert_routed(on_backend=1)
    assert plugin.ran[0].a.format.value == "mxfp8_e4m3"
    assert out.shape == (M, N)
    assert_close(f"MXFP8 {layout}", out, want, 1e-5)


def test_mxfp8_batched_input_keeps_leading_dims() -> None:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    gen = torch.Generator(device="cuda").manual_seed(6)
    a = _storage(N, K, gen, rowwise=True, columnwise=False)
    b = _storage(M, K, gen, rowwise=True, columnwise=False)
    b3 = type(b)(
        rowwise_data=b._rowwise_data.view(3, M // 3, K),
        rowwise_scale_inv=b._rowwise_scale_inv,
        columnwise_data=None,
        columnwise_scale_inv=None,
        fp8_dtype=b._fp8_dtype,
        quantizer=None,
        with_gemm_swizzled_scales=False,
        fake_dtype=torch.bfloat16,
    )
    with plugin_installed() as plugin:
        out, *_ = general_gemm(a, b3, out_dtype=torch.bfloat16, layout="TN")
    plugin.assert_routed(on_backend=1)
    assert out.shape == (3, M // 3, N)
    assert_close("MXFP8 batched TN", out.reshape(M, N), _only(b, True) @ _only(a, True).T, 1e-2)


def test_mxfp8_missing_direction_is_declined_with_a_reason() -> None:
    """NN needs A's columnwise copy; a rowwise-only A is declined (and TE's own GEMM is used)."""
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    gen = torch.Generator(device="cuda").manual_seed(7)
    a = _storage(K, N, gen, rowwise=True, columnwise=False)
    b = _storage(M, K, gen, rowwise=True, columnwise=False)
    with plugin_installed() as plugin:
        with pytest.raises(RuntimeError):  # TE's own MXFP8 GEMM cannot run on an H200
            general_gemm(a, b, out_dtype=torch.float32, layout="NN")
        s = plugin.assert_routed(on_backend=0, native=1)
    assert s["by_reason"] == {"LAYOUT": 1}, s


def _mx_tensor(rows: int, cols: int, gen: torch.Generator):
    """An ``MXFP8Tensor`` (TE's parameter class) with random rowwise and columnwise data and scales."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Tensor

    s = _storage(rows, cols, gen, rowwise=True, columnwise=True)
    return MXFP8Tensor(
        shape=(rows, cols),
        dtype=torch.bfloat16,
        rowwise_data=s._rowwise_data,
        rowwise_scale_inv=s._rowwise_scale_inv,
        columnwise_data=s._columnwise_data,
        columnwise_scale_inv=s._columnwise_scale_inv,
        fp8_dtype=tex.DType.kFloat8E4M3,
        quantizer=None,
        with_gemm_swizzled_scales=False,
    )


def _requantise(how: str, weight, gen: torch.Generator) -> None:
    """Rewrite ``weight`` in place the way TE does between optimizer steps."""
    if how == "copy_":  # MXFP8Tensor.copy_(MXFP8Tensor): TE's __torch_dispatch__ copies every buffer
        weight.copy_(_mx_tensor(N, K, gen))
        return
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    if torch.cuda.get_device_capability()[0] < 10:
        pytest.skip("TE's MXFP8 quantizer needs compute capability >= 10: on an H200 it writes nothing")
    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=True)
    ramp = torch.exp2((torch.arange(N, device="cuda")[:, None] % 5) + (torch.arange(K, device="cuda") // 32) % 3)
    quantizer.update_quantized(torch.randn(N, K, generator=gen, device="cuda") * ramp, weight)


@pytest.mark.parametrize("how", ["copy_", "update_quantized"])
def test_requantised_weight_is_never_served_stale_scales(how: str) -> None:
    """TE rewrites an MXFP8 weight in place (an optimizer step with FP8 parameters) through raw
    pointers or below autograd, leaving ``_version`` unchanged. The next GEMM must use the new data
    and scales: two GEMMs through the plugin, the weight rewritten between them."""
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    gen = torch.Generator(device="cuda").manual_seed(11)
    weight = _mx_tensor(N, K, gen)
    x = _storage(M, K, gen, rowwise=True, columnwise=False)
    with plugin_installed() as plugin:
        first, *_ = general_gemm(weight, x, out_dtype=torch.float32, layout="TN")
        assert_close("MXFP8 TN before", first, _only(x, True) @ _only(weight, True).T, 1e-5)
        old_scales = weight._rowwise_scale_inv.clone()
        _requantise(how, weight, gen)
        assert not torch.equal(weight._rowwise_scale_inv, old_scales), "the weight's scales were not rewritten"
        second, *_ = general_gemm(weight, x, out_dtype=torch.float32, layout="TN")
    plugin.assert_routed(on_backend=2)
    assert_close(f"MXFP8 TN after {how}", second, _only(x, True) @ _only(weight, True).T, 1e-5)
