"""Launch arguments without a GPU: operands over 2 GiB through the plan's pieces (meta tensors), the
32-bit kernel argument guard, and the tile heuristic."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import torch

from te_flydsl_plugin.dtypes import payload_dtype
from te_flydsl_plugin.flydsl import executors, family, launch
from te_flydsl_plugin.flydsl.kernels import config, gemm, select
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.flydsl.plan import split
from te_flydsl_plugin.flydsl.plan_types import GemmPlan, KernelOperand, Piece
from te_flydsl_plugin.spec import Format

LIMIT = config.MAX_LAUNCH_BYTES

# (name, format, M, N, K, lhs K-major, rhs K-major): TE's shapes with an operand or D over 2 GiB.
BIG = [
    ("llama405b-mb4-fprop", Format.BF16, 32768, 16384, 53248, True, True),
    ("llama405b-mb4-wgrad", Format.BF16, 16384, 53248, 32768, False, False),
    ("qwen72b-dgrad", Format.BF16, 32768, 8192, 59136, True, False),
    ("qwen72b-fp8-fprop", Format.FP8_E4M3, 32768, 59136, 8192, True, True),
]


def _meta_plan(fmt: Format, m: int, n: int, k: int, lk: bool, rk: bool) -> GemmPlan:
    dtype = torch.uint8 if fmt.is_fp8 else payload_dtype(fmt)
    scale = torch.ones(1, device="meta") if fmt.is_fp8 else None

    def op(rows: int, k_major: bool) -> KernelOperand:
        shape = (rows, k) if k_major else (k, rows)
        return KernelOperand(torch.empty(shape, dtype=dtype, device="meta"), fmt, k_major, "tensor", scale)

    lhs, rhs = op(m, lk), op(n, rk)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
    pieces = split(m, n, k, lhs, rhs, out.element_size(), 16 // fmt.itemsize, LIMIT)
    cfg = select.select(KernelConfig(fmt, fmt, lk, rk, Format.BF16), m, n, k)
    return GemmPlan(None, cfg, lhs, rhs, out, 1.0, 0.0, pieces)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", BIG, ids=lambda c: c[0])
def test_operands_over_2gib_launch_in_pieces(case: tuple) -> None:
    _, fmt, m, n, k, lk, rk = case
    plan = _meta_plan(fmt, m, n, k, lk, rk)
    assert plan.config in family.BACKED
    sizes = [t.numel() * t.element_size() for t in (plan.lhs.data, plan.rhs.data, plan.out)]
    assert max(sizes) > LIMIT, sizes
    assert len(plan.pieces) > 1
    far = 0
    covered = 0
    for pc in plan.pieces:
        ln = launch.piece_launch(plan, pc)
        geom = gemm.launch_geometry(plan.config, ln.out, ln.lhs, ln.rhs)
        struct.pack("<" + "i" * len(geom), *geom)  # every runtime scalar is a valid 32-bit argument
        for t in (ln.out, ln.lhs, ln.rhs):
            span = ((t.shape[0] - 1) * t.stride(0) + t.shape[1]) * t.element_size()
            assert span <= LIMIT
            far = max(far, t.storage_offset() * t.element_size() + span)
        covered += (pc.m1 - pc.m0) * (pc.n1 - pc.n0) * (pc.k1 - pc.k0)
    assert covered == m * n * k
    assert far > LIMIT  # bytes past what a 32-bit offset reaches: addressed through 64-bit piece bases


def test_unsplit_big_operand_is_a_clear_error() -> None:
    """Without the plan's split, an operand over 2 GiB is refused with words, never a struct.error."""
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16)
    lhs = torch.empty(32768, 53248, dtype=torch.bfloat16, device="meta")
    rhs = torch.empty(256, 53248, dtype=torch.bfloat16, device="meta")
    out = torch.empty(32768, 256, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="the plan must split"):
        gemm.launch_geometry(cfg, out, lhs, rhs)


def test_output_needs_unit_column_stride() -> None:
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32)
    lhs = torch.empty(64, 64, dtype=torch.bfloat16)
    out = torch.empty(64, 64).t()
    plan = GemmPlan(
        None, cfg, *(KernelOperand(lhs, Format.BF16, True, "tensor"),) * 2, out, 1.0, 0.0, (Piece(0, 64, 0, 64, 0, 64),)
    )  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unit column stride"):
        executors.run(plan, "emulator")


def test_unknown_mode_and_epilogue_are_refused() -> None:
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32)
    t = torch.empty(64, 64, dtype=torch.bfloat16)
    op = KernelOperand(t, Format.BF16, True, "tensor")
    plan = GemmPlan(None, cfg, op, op, torch.empty(64, 64), 1.0, 0.0, (Piece(0, 64, 0, 64, 0, 64),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="executor"):
        executors.run(plan, "cuda")
    with pytest.raises(ValueError, match="plain epilogue"):
        executors.run(dataclasses.replace(plan, bias=torch.empty(64)), "emulator")


@pytest.mark.parametrize(
    ("fmt", "tile_k", "k_major"),
    [
        (fmt, tile_k, k_major)
        for fmt, tile_k in ((Format.BF16, 64), (Format.FP16, 64), (Format.FP32, 32), (Format.FP8_E5M2, 128))
        for k_major in ((True, True), (True, False))
        if not (fmt.is_fp8 and not k_major[1])  # FP8 is read K-major in every layout
    ],
)
def test_select_picks_a_backed_config(fmt: Format, tile_k: int, k_major: tuple[bool, bool]) -> None:
    for m, n, k in ((1, 1, 16), (4096, 4096, 4096), (32768, 59136, 8192), (300, 136, 64), (2048, 1024, 512)):
        got = select.select(KernelConfig(fmt, fmt, *k_major, Format.BF16), m, n, k)
        assert got in family.BACKED
        small_grid = -(-m // 256) * -(-n // 256) < select.SMALL_GRID
        small = small_grid and all(k_major) and fmt is not Format.FP32
        # 256 x 256 and 128 x 128 run on 4 waves (AGPR accumulators), fp32 on 8 (LLVM's MFMAs); 16-bit
        # 384 x 256 into the activation dtype where its rounds of 256 tiles move fewer bytes (32768 x
        # 59136: 78 rounds of 640 rows a K step against 116 of 512).
        waves = 8 if fmt is Format.FP32 else 4
        wide = fmt is Format.BF16 and (m, n) == (32768, 59136)
        tile = (128, 128) if small else (384, 256) if wide else (256, 256)
        assert (got.tile_m, got.tile_n, got.tile_k, got.waves) == (*tile, tile_k, waves)


@pytest.mark.parametrize(
    ("m", "n", "tile_m"),
    [
        (8192, 8192, 384),  # 704 tiles in 3 rounds of 640 rows, against 1024 in 4 of 512
        (8192, 14336, 384),  # 1232 in 5, against 1792 in 7
        (8192, 4096, 256),  # 352 tiles in 2 rounds, as many as 256 x 256's 512: more bytes a round
        (8192, 6144, 256),  # 528 in 3, 768 in 3
        (384, 256 * 256, 384),  # M of 384: one row of 256 tiles in 1 round, against two rows in 2
    ],
)
def test_select_takes_384_x_256_where_its_rounds_move_fewer_bytes(m: int, n: int, tile_m: int) -> None:
    """bf16 and fp16 in TN, NN and NT into the activation dtype (the 384 x 256 configs), with TE's fused
    epilogues of each layout (bias / GELU in TN, dGELU in NN) too, and FP8's recipe pairs; an fp32
    output, whose 384 x 256 epilogue spilled, and wgrad's bgrad, whose row sums spilled in its K loop
    (docs/kernels.md), keep 256 x 256."""
    fused = {(True, True): ("bias", "gelu", "bias_gelu"), (True, False): ("dgelu", "dgelu_bgrad"), (False, False): ()}
    for fmt in (Format.BF16, Format.FP16):
        for (lk, rk), epilogues in fused.items():
            cfg = KernelConfig(fmt, fmt, lk, rk, fmt)
            for epi in ("plain", *epilogues):
                got = select.select(dataclasses.replace(cfg, epilogue=epi), m, n, 4096)
                assert got in family.BACKED and got.tile_m == tile_m, got.name
            assert select.select(dataclasses.replace(cfg, out_format=Format.FP32), m, n, 4096).tile_m == 256
    bgrad = KernelConfig(Format.BF16, Format.BF16, False, False, Format.BF16, "bgrad")
    assert select.select(bgrad, m, n, 4096).tile_m == 256
    # FP8 (TN): the pairs TE's recipes multiply (lhs E4M3 or HYBRID's E5M2 gradient, rhs E4M3) into bf16
    # or fp16, plain; its fused epilogues, an fp32 output and the other pairs keep 256 x 256.
    e4, e5 = Format.FP8_E4M3, Format.FP8_E5M2
    for lhs, rhs, out, epi, wide in [
        (e4, e4, Format.BF16, "plain", True),
        (e5, e4, Format.FP16, "plain", True),
        (e4, e4, Format.BF16, "bias_gelu", False),
        (e5, e4, Format.BF16, "dgelu", False),
        (e4, e4, Format.FP32, "plain", False),
        (e4, e5, Format.BF16, "plain", False),
    ]:
        got = select.select(KernelConfig(lhs, rhs, True, True, out, epi), m, n, 4096)
        assert got in family.BACKED and got.tile_m == (tile_m if wide else 256), got.name


def test_select_ignores_k() -> None:
    base = KernelConfig(Format.BF16, Format.BF16, True, False, Format.FP32)
    assert len({select.select(base, 4096, 4096, k) for k in (64, 4096, 65536)}) == 1
