"""MXFP8 as a scaling mode of the GEMM family: E8M0 block scales fed from the packed layout.

Every backed MX config compiles for gfx950 within budget (``test_compile.py`` covers the family, this
file adds the MX-specific ISA facts), runs in the gfx950 emulator on shapes with M / N edge tiles, a K
tail inside a 512 group and TE-padded scales (poisoned, so a padding byte that leaked would blow the
result up), and matches the reference executor on the same plan. Host-split pieces take slices of the
packed scales; one end-to-end call goes through ``wrap_generic_gemm`` with the emulator executor and
the scale-pack kernel. The gfx950 hardware test is skipped elsewhere with the reason.
"""

from __future__ import annotations

import dataclasses
import re
import types

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import compiled, executors, family, isa
from te_flydsl_plugin.flydsl.executors.reference import run as run_reference
from te_flydsl_plugin.flydsl.kernels import mx
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.flydsl.launch_log import LaunchLog
from te_flydsl_plugin.flydsl.mx_layout import pack_scales, packed_shape
from te_flydsl_plugin.flydsl.plan_types import GemmPlan, KernelOperand, Piece
from te_flydsl_plugin.spec import Format, Layout

from ..gemm_cases import layout_operands, make_mxfp8, te_math
from .helpers import needs_toolchain, plan_of, run_and_compare, tolerance, with_epilogue

F = Format
MX_BACKED = [c for c in family.BACKED if c.scaling == "mx" and c.epilogue == "plain"]
MX_EPILOGUES = [c for c in family.BACKED if c.scaling == "mx" and c.epilogue != "plain"]
_TORCH_OUT = {F.FP32: torch.float32, F.BF16: torch.bfloat16, F.FP16: torch.float16}


def _operand(fmt: Format, rows: int, k: int, k_major: bool, gen: torch.Generator) -> KernelOperand:
    """An operand as the plan builds it: K-major from TE's rowwise data ``[rows, K]``, else from TE's
    columnwise data ``[K, rows]`` (blocks along K), with its packed scales (TE's padding is poison).

    Magnitudes vary by 2^-3 .. 2^3 per row and again per 32-K block, so the E8M0 scales vary along
    both: a scale applied to the wrong K block (e.g. data in the wrong MFMA register) shows, and fp16
    outputs stay finite."""
    row_exp = torch.randint(-3, 4, (rows, 1), generator=gen).float()
    block_exp = torch.randint(-3, 4, (1, -(-k // 32)), generator=gen).float().repeat_interleave(32, dim=1)[:, :k]
    x = torch.randn(rows, k, generator=gen) * torch.exp2(row_exp + block_exp)
    if k_major:
        op, _ = make_mxfp8(x, fmt, rowwise=True, columnwise=False)
        packed = pack_scales(op.rowwise_scale_inv, rows, k, 1)
        return KernelOperand(op.rowwise_data.view(rows, k), fmt, True, "rowwise", mx_scales=packed)
    op, _ = make_mxfp8(x.t().contiguous(), fmt, rowwise=False, columnwise=True)
    packed = pack_scales(op.columnwise_scale_inv, rows, k, 0)
    return KernelOperand(op.columnwise_data.view(k, rows), fmt, False, "columnwise", mx_scales=packed)


def _plan(cfg: KernelConfig, m: int, n: int, k: int, alpha: float, beta: float, pieces=None) -> GemmPlan:
    gen = torch.Generator().manual_seed(m * 31 + n + k)
    lhs = _operand(cfg.lhs_format, m, k, cfg.lhs_k_major, gen)
    rhs = _operand(cfg.rhs_format, n, k, cfg.rhs_k_major, gen)
    out = torch.randn(m, n, generator=gen).to(_TORCH_OUT[cfg.out_format])
    return plan_of(cfg, lhs, rhs, out, alpha, beta, pieces)


def _run_and_compare(plan: GemmPlan) -> None:
    want = dataclasses.replace(plan, out=plan.out.clone())
    run_reference(want)
    with LaunchLog() as log:
        executors.run(plan, "emulator")
    assert log.count("gemm", "emulator") == len(plan.pieces)
    atol, rtol = tolerance(plan.config, plan.lhs.k)
    scale = float(want.out.abs().max())  # operands span 2^-6 .. 2^6: compare relative to the output
    torch.testing.assert_close(plan.out.double() / scale, want.out.double() / scale, atol=atol, rtol=rtol)


@needs_toolchain
@pytest.mark.compile
def test_mx_configs_cover_every_kind_and_layout() -> None:
    """What is backed: every E4M3/E5M2 pair (mixed too) x fp32/bf16/fp16 out x TN / NN / NT majorness."""
    kinds = {(c.lhs_format, c.rhs_format, c.out_format, c.lhs_k_major, c.rhs_k_major) for c in MX_BACKED}
    mx_fmts = (F.MXFP8_E4M3, F.MXFP8_E5M2)
    majors = ((True, True), (True, False), (False, False))
    assert kinds == {(a, b, o, *mj) for a in mx_fmts for b in mx_fmts for o in _TORCH_OUT for mj in majors}
    assert len(MX_BACKED) == 36 and all(c.tile_k == mx.TILE_K for c in MX_BACKED)


@needs_toolchain
@pytest.mark.compile
@pytest.mark.parametrize("k_major", [(True, True), (True, False), (False, False)], ids=["tn", "nn", "nt"])
def test_mx_isa_feeds_scales_from_registers(k_major: tuple[bool, bool]) -> None:
    """Real scales: the scale operands are VGPRs holding the tile's words, the MFMA reading byte
    ``op_sel + 2 * op_sel_hi`` of both (op_sel_hi always spelled out): bytes 0 - 3 in the unrolled
    loop of whole groups, TN, NN and NT alike;
    the words arrive through LDS, each once a workgroup (a dword DMA a 16-row tile and 512 K, split among
    the waves that share its rows), and the N/M-major operands' fragments come through gfx950's
    transposing 8-bit LDS read."""
    cfg = KernelConfig(F.MXFP8_E4M3, F.MXFP8_E5M2, *k_major, F.BF16, tile_k=mx.TILE_K)
    rep = isa.isa_report(cfg)
    assert rep["ok"] and rep["scratch_bytes"] == 0 and rep["spills"] == 0, rep
    text = llvm.disassemble(compiled.compile_config(cfg).code_object, "gfx950")
    mfmas = re.findall(r"^\s+v_mfma_scale_f32_16x16x128_f8f6f4 .*$", text, re.M)
    assert len(mfmas) == rep["mfma_count"] > 0
    scale_regs = r"a\[\d+:\d+\], v\[\d+:\d+\], v\[\d+:\d+\], a\[\d+:\d+\], v\d+, v\d+ "
    assert all(re.search(scale_regs, s) for s in mfmas), "accumulators in AGPRs, scale operands per-lane VGPRs"

    def byte(mfma: str) -> int:
        lo = re.search(r"op_sel:\[(\d),(\d),0\]", mfma)
        hi = re.search(r"op_sel_hi:\[(\d),(\d),0\]", mfma)
        assert hi is not None, "op_sel_hi spelled out (the assembler's default would select byte 2)"
        lo_bits = (int(lo[1]), int(lo[2])) if lo else (0, 0)
        assert lo_bits[0] == lo_bits[1] and hi[1] == hi[2], "both operands read the same byte"
        return lo_bits[0] + 2 * int(hi[1])

    assert {byte(s) for s in mfmas} == {0, 1, 2, 3}
    # The MMA's A operand is rhs (kernels/mfma.py): E5M2 rhs -> cbsz:1, E4M3 lhs -> blgp 0, not printed.
    assert all("cbsz:1" in s and "blgp" not in s for s in mfmas)
    # 8 word DMAs a wave per 512 K (the 2 x 16 16-row tiles' words split among 4 waves), before the loops
    # and in each of them (the groups wholly inside K, then the K tail's), and no other dword load (bf16
    # output: the epilogue loads no dwords).
    words = re.findall(r"^\s+buffer_load_dword v.*$", text, re.M)
    assert len(words) == 24 and all(w.rstrip().split("//")[0].rstrip().endswith(" lds") for w in words)
    assert bool(re.search(r"^\s+ds_read_b64_tr_b8 ", text, re.M)) == (k_major != (True, True))


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize("cfg", MX_BACKED, ids=lambda c: c.name)
def test_mx_backed_matches_reference(cfg: KernelConfig) -> None:
    """Edge tiles in M and N, K with a tail in its 512 group (K / 32 not a multiple of 4), padded scales;
    an N/M-major operand's rows are whole 16-byte vectors (the matrix's rule)."""
    m = 37 if cfg.lhs_k_major else 48
    n = 20 if cfg.rhs_k_major else 32
    _run_and_compare(_plan(cfg, m, n, 160, 0.5, 0.75))


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize("cfg", MX_EPILOGUES, ids=lambda c: c.name)
def test_mx_epilogue_matches_reference(cfg: KernelConfig) -> None:
    """The fused epilogues on MXFP8 (tests/kernels/test_epilogues.py has the rest): edge tiles, a K tail
    in the 512 group, alpha and a given D."""
    m = 37 if cfg.lhs_k_major else 48
    n = 20 if cfg.rhs_k_major else 32
    run_and_compare(with_epilogue(_plan(cfg, m, n, 160, 0.5, 0.75), m + n))


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize(
    "cfg",
    [
        c
        for c in MX_EPILOGUES
        if (c.epilogue, c.out_format, c.lhs_format)
        in (("bias_gelu", Format.FP16, Format.MXFP8_E4M3), ("dgelu_bgrad", Format.BF16, Format.MXFP8_E5M2))
    ],
    ids=lambda c: c.name,
)
def test_mx_epilogue_after_the_peel_in_either_stage(cfg: KernelConfig) -> None:
    """The fused epilogues after MXFP8's peel (``gemm_kernel``) in stage 1 (7 K tiles: a group, one tile
    alone, the peel, the last) and stage 0 (8): TN bias_gelu with fp16 out, NN dgelu_bgrad E5M2 x E4M3;
    edges in M and N, a K tail."""
    m = 37 if cfg.lhs_k_major else 48
    n = 20 if cfg.rhs_k_major else 32
    for k in (800, 960):
        run_and_compare(with_epilogue(_plan(cfg, m, n, k, 0.5, 0.75), m + n))


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize("k_major", [(True, True), (True, False), (False, False)])
def test_mx_beta_zero_never_reads_d(k_major: tuple[bool, bool]) -> None:
    """The epilogue runs among the last tile's MFMAs, a row group behind branches on beta
    (``epilogue.BETA``): beta 0 over a D full of NaN leaves no trace (TN, NN and NT; two tile columns,
    edges in M and N, a K tail in its 512 group)."""
    cfg = KernelConfig(F.MXFP8_E4M3, F.MXFP8_E5M2, *k_major, F.BF16, tile_k=mx.TILE_K)
    assert cfg in family.BACKED
    m = 301 if k_major[0] else 304
    plan = _plan(cfg, m, 272 if k_major[1] else 288, 1056, 0.5, 0.0)
    plan.out.fill_(float("nan"))
    _run_and_compare(plan)
    assert not plan.out.isnan().any()


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize(
    ("m", "n", "k", "k_major"),
    [
        (301, 140, 1056, (True, True)),
        (16, 272, 32, (True, True)),
        (304, 144, 1056, (False, False)),
        (48, 32, 960, (True, True)),
        (48, 32, 800, (True, False)),
        (48, 32, 1056, (True, False)),
        (48, 32, 800, (False, False)),
    ],
)
def test_mx_several_tiles_and_groups(m: int, n: int, k: int, k_major: tuple[bool, bool]) -> None:
    """Several workgroups, three K groups (the last one partial), and a K of one 32-block. The loop's
    ends (``gemm_kernel``): 8 K tiles run a group, two tiles alone, the peel (tile 6, no refill) and the
    last; 7 one alone, the peel and the last; 9 a group whose last tile refills past K, as NT's last tile
    alone always does (7 tiles), before a last tile that starts its own group."""
    cfg = KernelConfig(F.MXFP8_E5M2, F.MXFP8_E4M3, *k_major, F.FP32, tile_k=mx.TILE_K)
    assert cfg in family.BACKED
    _run_and_compare(_plan(cfg, m, n, k, 1.0, 0.0))


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize("k_major", [(True, True), (True, False)], ids=["tn", "nn"])
def test_mx_host_split_pieces_slice_the_packed_scales(k_major: tuple[bool, bool]) -> None:
    """Pieces along M (whole 16-row tiles) and K (whole 512 groups) read slices of the packed words;
    the second K piece accumulates onto the first."""
    cfg = KernelConfig(F.MXFP8_E4M3, F.MXFP8_E4M3, *k_major, F.BF16, tile_k=mx.TILE_K)
    m, n, k = 272, 48, 1056
    pieces = tuple(Piece(m0, m1, 0, n, k0, k1) for m0, m1 in ((0, 256), (256, m)) for k0, k1 in ((0, 512), (512, k)))
    _run_and_compare(_plan(cfg, m, n, k, 1.0, 0.5, pieces))


@needs_toolchain
@pytest.mark.emulator
def test_mx_empty_k_gives_beta_times_out() -> None:
    """K = 0: the packed scales are empty, the kernel loads nothing from them and writes beta * out."""
    cfg = KernelConfig(F.MXFP8_E4M3, F.MXFP8_E5M2, True, True, F.FP32, tile_k=mx.TILE_K)
    m, n = 37, 20

    def empty(fmt: Format, rows: int) -> KernelOperand:
        scales = torch.empty(packed_shape(rows, 0), dtype=torch.uint8)
        return KernelOperand(torch.empty(rows, 0, dtype=torch.uint8), fmt, True, "rowwise", mx_scales=scales)

    out = torch.randn(m, n)
    before = out.clone()
    plan = GemmPlan(
        problem=types.SimpleNamespace(epilogue="plain"),  # type: ignore[arg-type]
        config=cfg,
        lhs=empty(cfg.lhs_format, m),
        rhs=empty(cfg.rhs_format, n),
        out=out,
        alpha=1.0,
        beta=0.5,
        pieces=(Piece(0, m, 0, n, 0, 0),),
    )
    executors.run(plan, "emulator")
    torch.testing.assert_close(out, 0.5 * before)


def test_lds_columns_hold_the_k_the_scaled_mfma_reads() -> None:
    """Lane group g's fragment is LDS columns 32g .. 32g+31 (FlyDSL's tiled copy); the fill must have
    put there K 16g .. 16g+15 then 64+16g .. 64+16g+15, AMD's FP8 operand layout for
    v_mfma_scale_f32_16x16x128_f8f6f4 (docs/mxfp8-layout.md), built here from the documented rule."""
    for g in range(4):
        documented = list(range(16 * g, 16 * g + 16)) + list(range(64 + 16 * g, 64 + 16 * g + 16))
        assert [mx.k_of_lds_column(c) for c in range(32 * g, 32 * g + 32)] == documented
    assert sorted(mx.k_of_lds_column(c) for c in range(mx.TILE_K)) == list(range(mx.TILE_K))  # a permutation


def test_piece_words_is_a_slice() -> None:
    packed = torch.arange(3 * 2 * 64, dtype=torch.int32).view(torch.uint8).view(3, 2, 4, 16, 4)
    words = mx.piece_words(packed, 16, 48, 512, 1000)
    assert words.shape == (2, 64) and words.stride() == (128, 1)
    assert words.data_ptr() == packed.data_ptr() + (1 * 2 + 1) * 256
    with pytest.raises(ValueError, match="16-row tile"):
        mx.piece_words(packed, 8, 48, 0, 512)


@needs_toolchain
@pytest.mark.emulator
@pytest.mark.parametrize("layout", [Layout.TN, Layout.NN, Layout.NT], ids=lambda x: x.value)
def test_mx_end_to_end_through_the_emulator_executor(native, layout: Layout) -> None:
    """wrap_generic_gemm -> plan (one scale-pack launch per operand) -> the MX GEMM in the emulator."""
    from te_flydsl_plugin.host import dispatch

    m, n, k = 48, 32, 544
    gen = torch.Generator().manual_seed(3)
    a, b = layout_operands(layout, F.MXFP8_E4M3, F.MXFP8_E5M2, m, n, k, gen)
    try:
        dispatch.configure(backend="flydsl", executor="emulator", env={})
        gemm = tp.wrap_generic_gemm(native)
        with LaunchLog() as log:
            res = gemm(a.passed, layout is Layout.TN, b.passed, layout is Layout.NT, None, None, torch.float32,
                       None, None, False, None, False, None, 0, False, False)  # fmt: skip
        stats = tp.stats()
    finally:
        dispatch.configure(backend="default", env={})
    assert stats["by_backend"] == {"flydsl": 1}, stats
    assert log.count("gemm", "emulator") == 1, "the compiled MX GEMM did not run in the emulator"
    assert log.count("scale_pack", "emulator") == 2, "expected one scale-pack launch per operand"
    assert not native.calls
    want = te_math(layout, a.value, b.value)
    err = (res[0].double() - want).norm() / want.norm()
    assert err < 1e-5, f"emulated MX GEMM vs dequantise-then-matmul: relative error {err:.3g}"


def _gfx950_reason() -> str | None:
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        return "needs a ROCm GPU (torch.cuda with HIP): none here"
    arch = torch.cuda.get_device_properties(0).gcnArchName
    return None if arch.startswith("gfx950") else f"needs gfx950 (MI355X), found {arch}"


def _on_gpu(plan: GemmPlan) -> GemmPlan:
    """The plan with its operands, packed scales and output copied to the GPU."""
    return dataclasses.replace(
        plan,
        lhs=dataclasses.replace(plan.lhs, data=plan.lhs.data.cuda(), mx_scales=plan.lhs.mx_scales.cuda()),
        rhs=dataclasses.replace(plan.rhs, data=plan.rhs.data.cuda(), mx_scales=plan.rhs.mx_scales.cuda()),
        out=plan.out.cuda(),
    )


@pytest.mark.gfx950
@pytest.mark.skipif(_gfx950_reason() is not None, reason=_gfx950_reason() or "")
@pytest.mark.parametrize("cfg", MX_BACKED, ids=lambda c: c.name)
def test_mx_on_gfx950(cfg: KernelConfig) -> None:
    """The compiled MX kernel ran on the GPU (launch counter) and matches the reference executor."""
    m, n = (1000 if cfg.lhs_k_major else 1008), (1500 if cfg.rhs_k_major else 1504)  # N/M-major: 16-multiples
    plan = _plan(cfg, m, n, 4128, 1.0, 0.0)
    dev = _on_gpu(plan)
    with LaunchLog() as log:
        executors.run(dev, "flydsl")
    torch.cuda.synchronize()
    assert log.count("gemm", "flydsl") == 1, "the compiled kernel did not run"
    run_reference(plan)
    atol, rtol = tolerance(cfg, plan.lhs.k)
    scale = float(plan.out.abs().max())
    torch.testing.assert_close(dev.out.cpu().double() / scale, plan.out.double() / scale, atol=atol, rtol=rtol)


@pytest.mark.gfx950
@pytest.mark.skipif(_gfx950_reason() is not None, reason=_gfx950_reason() or "")
@pytest.mark.parametrize("cfg", MX_EPILOGUES, ids=lambda c: c.name)
def test_mx_epilogue_on_gfx950(cfg: KernelConfig) -> None:
    """The fused epilogues on MXFP8, on the GPU, against the reference executor (launch counter checked)."""
    m, n = (1000 if cfg.lhs_k_major else 1008), (1500 if cfg.rhs_k_major else 1504)
    plan = _plan(cfg, m, n, 4128, 1.0, 0.0)
    dev = _on_gpu(plan)
    run_and_compare(with_epilogue(dev, m + n), "flydsl")
