"""One declaration each (issue 15): the kernel's argument order (kernels/args.py) and the kernels' limits
(kernels/config.py), which the capability matrix, the launch guards and both executors' argument lists
read instead of restating."""

from __future__ import annotations

import inspect

import flydsl.expr as fx
import pytest
import torch

from te_flydsl_plugin.flydsl import launch, matrix, mx_layout
from te_flydsl_plugin.flydsl.kernels import args, config, gemm, mx
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format


def test_both_flydsl_signatures_are_the_declared_order() -> None:
    """Checked at import too; here the checker itself is shown to refuse a swapped or mistyped signature."""
    args.check_signature(gemm.gemm_kernel._func, fx, ("p",))
    args.check_signature(gemm.gemm_launch.func, fx, ("p", "stream"))

    def swapped(out: fx.Tensor, rhs: fx.Tensor, lhs: fx.Tensor) -> None: ...

    with pytest.raises(TypeError, match="KernelArgs"):
        args.check_signature(swapped, fx, ())

    def mistyped(*values: object) -> None: ...

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # every parameter a tensor: m .. beta mistyped
    names = (*args.KernelArgs._fields, "p")
    mistyped.__signature__ = inspect.Signature([inspect.Parameter(n, kind, annotation=fx.Tensor) for n in names])
    with pytest.raises(TypeError, match="Int32"):
        args.check_signature(mistyped, fx, ("p",))


def test_the_emulator_and_the_gpu_pass_the_same_values_in_the_declared_order() -> None:
    cfg = KernelConfig(Format.BF16, Format.BF16, True, False, Format.FP32)  # NN: lhs [M, K], rhs [K, N]
    out = torch.zeros(24, 40)
    lhs = torch.zeros(24, 64, dtype=torch.bfloat16)
    rhs = torch.zeros(64, 40, dtype=torch.bfloat16)
    ln = launch.Launch(cfg, out, lhs, rhs, None, None, 2.0, 0.5)
    values = launch.kernarg_values(ln)
    assert len(values) == len(args.KernelArgs._fields)
    named = dict(zip(args.KernelArgs._fields, values, strict=True))
    assert named["out"] is out and named["lhs"] is not None and named["lhs_scale"] is named["lhs"]
    assert (named["m"], named["n"], named["k"]) == (24, 40, 64)
    assert (named["ld_lhs"], named["ld_rhs"], named["ld_out"]) == (64, 40, 40)
    assert (named["alpha"], named["beta"]) == (2.0, 0.5)
    jit = ln.jit_args()
    assert len(jit) == len(args.KernelArgs._fields) + 1 and jit[-1] == gemm.params_for(cfg)
    assert jit[8:16] == tuple(values[8:16])  # the scalars, in the same slots


def test_the_matrix_states_the_kernels_own_limits() -> None:
    assert matrix.OPERAND_ALIGN is config.OPERAND_ALIGN == gemm.DMA_BYTES == 16
    assert matrix.K_MULTIPLE is config.K_MULTIPLE
    assert matrix.K_MULTIPLE == {
        Format.FP32: 4,
        Format.FP16: 8,
        Format.BF16: 8,
        Format.FP8_E4M3: 16,
        Format.FP8_E5M2: 16,
    }
    assert matrix.OUT_VEC is config.OUT_VEC
    assert matrix.MAX_DIM == config.INT32_MAX == 2**31 - 1
    assert matrix.MAX_LAUNCH_BYTES is config.MAX_LAUNCH_BYTES
    assert mx_layout.unsupported_reason(16, 32) is None


def test_the_two_out_of_bounds_offsets_are_one_past_the_other() -> None:
    """The raw byte offset is the largest int32; element offsets, scaled in 32 bits, land one byte further."""
    assert config.OOB_OFFSET == 0x7FFFFFFF >= config.MAX_LAUNCH_BYTES
    for itemsize in (1, 2, 4):
        elems = -(config.OOB_BYTES // itemsize)
        assert -(2**31) <= elems <= config.INT32_MAX  # a valid int32 element offset
        assert (elems * itemsize) % 2**32 == config.OOB_OFFSET + 1  # byte 2**31: past every span


def test_an_early_buffer_still_ends_before_the_out_of_bounds_offset() -> None:
    """A DMA buffer starts up to its M0 run's reach before the operand (gemm's bias, mx's word bias), and its
    records grow by as much: even for the longest span a launch allows they must stay below the
    out-of-bounds byte offset, which a load reaches with no immediate offset (the run's first transfer).
    With 2**31 - 1 bytes allowed they did not: an out-of-bounds K-tail load of a span past 2**31 - 3 KiB
    passed the range check and read memory where the K tail needs zeros. With a scalar offset in the
    check as well (up to the span), the sum must not wrap past 2**32."""
    gemm_bias = (gemm.M0_SHARE - 1) * gemm.WAVE_DMA_BYTES
    mx_bias = (mx.MAX_SHARE - 1) * mx.WORDS_PER_GROUP * 4
    for bias in (gemm_bias, mx_bias):
        assert 0 < bias < config.IMM_OFFSET_LIMIT
        assert config.MAX_LAUNCH_BYTES + bias < config.OOB_BYTES
        assert config.OOB_BYTES + config.IMM_OFFSET_LIMIT + config.MAX_LAUNCH_BYTES <= 2**32


def test_the_launch_guard_refuses_what_the_matrix_declines() -> None:
    """launch_geometry's alignment comes from config.vector_elems, the matrix's K multiple."""
    cfg = KernelConfig(Format.FP16, Format.FP16, True, True, Format.FP16)
    k = matrix.K_MULTIPLE[Format.FP16]
    out = torch.zeros(8, 8, dtype=torch.float16)
    ok = torch.zeros(8, k, dtype=torch.float16)
    gemm.launch_geometry(cfg, out, ok, ok)
    bad = torch.zeros(8, k + k // 2, dtype=torch.float16)
    with pytest.raises(ValueError, match=f"multiples of {k} elements"):
        gemm.launch_geometry(cfg, out, bad, bad)
