"""Every backed config runs in the gfx950 emulator on small shapes and matches a torch reference.

Shapes cover a single full tile, edge tiles in M and N with a K tail, several tiles, alpha / beta,
and host-split launches (pieces with storage offsets and K pieces that accumulate). The emulator
raises on the first hazard (unwaited load, unsynchronised LDS), so passing also means hazard-free.
"""

from __future__ import annotations

import pytest
import torch

from te_flydsl_plugin import emulator
from te_flydsl_plugin.emulator.trace import Trace
from te_flydsl_plugin.flydsl import executors, family
from te_flydsl_plugin.flydsl.compiled import compile_config
from te_flydsl_plugin.flydsl.kernels import gemm, mx
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.flydsl.launch_log import LaunchLog
from te_flydsl_plugin.flydsl.lds_conflicts import launch_values
from te_flydsl_plugin.flydsl.plan_types import Piece
from te_flydsl_plugin.spec import Format

from .helpers import needs_toolchain, piece_grid, plan_for, reference, run_and_compare, tolerance

pytestmark = [pytest.mark.emulator, needs_toolchain]


def _k_unit(cfg: KernelConfig) -> int:
    return 16 // cfg.lhs_format.itemsize


# (M, N, K in units of the 16-byte vector, alpha, beta); M and N shrink to a whole number of vectors
# where that dim is an operand's contiguous one (the alignment rule of N/M-major operands).
# N is a multiple of 4 (the epilogue's vector stores: the matrix's rule), not of the tile.
SHAPES = [(256, 256, 8, 1.0, 0.0), (301, 140, 9, 0.5, 0.75), (37, 76, 3, 1.0, 1.0)]


def _fit(x: int, cfg: KernelConfig, k_major: bool) -> int:
    return x if k_major else x // _k_unit(cfg) * _k_unit(cfg)


def _run_and_check(cfg: KernelConfig, m: int, n: int, k: int, alpha: float, beta: float, **kw) -> None:
    plan = plan_for(cfg, m, n, k, alpha=alpha, beta=beta, seed=m * 7 + n, **kw)
    before = plan.out.clone()
    with LaunchLog() as log:
        executors.run(plan, "emulator")
    assert log.count("gemm", "emulator") == len(plan.pieces)
    want = reference(plan, before)
    atol, rtol = tolerance(cfg, k)
    torch.testing.assert_close(plan.out.double(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:3])))
# MXFP8 configs need packed block scales: test_mx_gemm.py runs them; fused epilogues: test_epilogues.py.
@pytest.mark.parametrize(
    "cfg", [c for c in family.BACKED if c.scaling != "mx" and c.epilogue == "plain"], ids=lambda c: c.name
)
def test_backed_matches_reference(cfg: KernelConfig, shape: tuple) -> None:
    m, n, kv, alpha, beta = shape
    m, n = _fit(m, cfg, cfg.lhs_k_major), _fit(n, cfg, cfg.rhs_k_major)
    _run_and_check(cfg, m, n, kv * _k_unit(cfg), alpha, beta)


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32, waves=4),
        KernelConfig(Format.FP32, Format.FP32, False, False, Format.FP32, tile_k=32, waves=8),
        KernelConfig(Format.FP8_E5M2, Format.FP8_E4M3, True, True, Format.BF16, tile_k=128),
    ],
    ids=lambda c: c.name,
)
def test_host_split_pieces(cfg: KernelConfig) -> None:
    """Pieces in M, N and K: each view's storage offset is its launch's base, K pieces accumulate."""
    m, n, k = 300, 264, 24 * _k_unit(cfg)
    kc = 8 * _k_unit(cfg)
    pieces = piece_grid(m, n, k, kc)
    _run_and_check(cfg, m, n, k, 0.5, 0.25, pieces=pieces)


@pytest.mark.parametrize(
    ("cfg", "piece_k"),
    [
        (KernelConfig(Format.BF16, Format.BF16, True, False, Format.BF16, waves=4), 72),
        (KernelConfig(Format.FP16, Format.FP16, False, False, Format.FP32, waves=4), 72),
        (KernelConfig(Format.FP16, Format.FP16, False, False, Format.FP32, waves=4), 5 * 64 + 8),
    ],
    ids=lambda x: x.name if isinstance(x, KernelConfig) else f"k{x}",
)
def test_k_pieces_end_mid_tile_on_k_outer_operands(cfg: KernelConfig, piece_k: int) -> None:
    """K pieces whose ends fall inside a K tile: a K-outer operand's tile buffer must stop at the piece's
    last K row (``gemm._Fill._k_outer_tile``), because the next piece's rows, real data, follow it in
    memory; reading one of them would add its products to this piece's output. 328 (6 tiles, the last
    with a tail): the loop's pair refills tiles 2 and 3 from the whole operand's buffer, their K in the
    scalar offset (``_Fill.stage``'s ``whole``), the two tiles after it tiles 4 and 5 through their own."""
    m, n, k = 304, 264, 3 * piece_k  # M and N whole 16-byte vectors: the operands N/M-major
    _run_and_check(cfg, m, n, k, 1.0, 0.5, pieces=piece_grid(m, n, k, piece_k))


@pytest.mark.parametrize(
    ("cfg", "k_tiles"),
    [
        (KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4), 6),
        (KernelConfig(Format.BF16, Format.BF16, False, False, Format.FP32, waves=4), 7),
        (KernelConfig(Format.FP16, Format.FP16, True, False, Format.FP16, waves=4), 3),
        (KernelConfig(Format.FP8_E4M3, Format.FP8_E5M2, True, True, Format.BF16, tile_k=128), 7),
    ],
    ids=lambda x: x.name if isinstance(x, KernelConfig) else f"{x}tiles",
)
def test_k_loops_run_their_back_edges(cfg: KernelConfig, k_tiles: int) -> None:
    """K long enough for every loop's back edge, the last tile with a K tail: the loops with the hand-over
    run pairs of the tiles that refill (``gemm_kernel``), then the peel (tile k_tiles - 2) and the last:
    6 tiles two pairs, 7 two pairs and an odd tile, 3 the odd tile alone; FP8's (its first fragments
    read by the tile before, two B repetitions ahead) 7 as well. (Two tiles, the peel and the last, are
    ``SHAPES``' K of 9 vectors.)"""
    k = (k_tiles - 1) * cfg.tile_k + 3 * _k_unit(cfg)
    _run_and_check(cfg, _fit(272, cfg, cfg.lhs_k_major), _fit(160, cfg, cfg.rhs_k_major), k, 1.0, 0.5)


_MX_NN = KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, False, Format.BF16, tile_k=128)
_MX_NT = KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, False, False, Format.BF16, tile_k=128)


@pytest.mark.parametrize(
    ("cfg", "tiles", "past_k"),
    [
        (KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4), 5, 0),
        (KernelConfig(Format.FP16, Format.FP16, False, False, Format.FP32, waves=4), 5, 0),
        (KernelConfig(Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_k=128), 5, 0),
        (KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, tile_m=128, tile_n=128, waves=4), 5, 0),
        # MXFP8 peels where the last tile shares its group of four with the tile before (gemm_kernel); where
        # it starts a group (5 tiles), and in NT always, the tile before refills past K.
        (_MX_NN, 8, 0),
        (_MX_NN, 7, 0),
        (_MX_NN, 5, 1),
        (_MX_NT, 8, 1),
    ],
    ids=lambda x: x.name if isinstance(x, KernelConfig) else str(x),
)
def test_no_transfer_goes_past_k(cfg: KernelConfig, tiles: int, past_k: int) -> None:
    """A workgroup's waves issue the direct-to-LDS transfers of its K tiles and none past K (but for the
    MXFP8 cases above): tile k_tiles - 2 (the peel) refills nothing, where it used to load a whole tile of
    zeros (64 KiB a workgroup at 256 x 256: a tile's time on the port at a CU's share of the fabric).
    At 5 K tiles the 16-bit and FP8 loops run a pair, an odd tile, the peel and the last. MXFP8's scale
    words cross once a workgroup and K group of four tiles (``mx.word_dmas``): 8 KiB, a dword a lane for
    each of both operands' 16-row tiles, where each wave loading its own words moved twice that."""
    ck = compile_config(cfg)
    values = launch_values(cfg, tiles * cfg.tile_k)
    kernarg = emulator.pack_flydsl_kernarg(ck.code_object, ck.kernel, values)
    trace = Trace()
    block = (gemm.block_size(cfg), 1, 1)
    emulator.launch(ck.code_object, ck.kernel, kernarg, (1, 1, 1), block, workgroups=[(0, 0, 0)], trace=trace)
    dma = [
        trace.insts[pc].opcode
        for wave in trace.waves
        for pc, _ in wave
        if trace.insts[pc].opcode.startswith("buffer_load") and "lds" in trace.insts[pc].modifiers
    ]
    tile_bytes = (cfg.tile_m + cfg.tile_n) * cfg.tile_k * cfg.lhs_format.itemsize
    assert dma.count("buffer_load_dwordx4") * 64 * 16 == (tiles + past_k) * tile_bytes
    groups = -(-tiles // mx.STEPS_PER_WORD) if cfg.scaling == "mx" else 0
    assert dma.count("buffer_load_dword") * 64 * 4 == groups * mx.lds_words(cfg.tile_m, cfg.tile_n) * 4
    assert len(dma) == dma.count("buffer_load_dwordx4") + dma.count("buffer_load_dword")


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4),
        KernelConfig(Format.FP16, Format.FP16, False, True, Format.FP32, waves=4),
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, tile_m=128, tile_n=128, waves=4),
        KernelConfig(Format.FP8_E4M3, Format.FP8_E5M2, True, True, Format.FP16, tile_k=128),
        KernelConfig(Format.FP8_E5M2, Format.FP8_E4M3, True, True, Format.FP32, tile_k=128),
        KernelConfig(
            Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_m=128, tile_n=128, tile_k=128, waves=4
        ),
    ],
    ids=lambda c: c.name,
)
@pytest.mark.parametrize("beta", [0.0, 0.75])
def test_epilogue_among_the_last_mfmas_reads_d_by_beta(cfg: KernelConfig, beta: float) -> None:
    """The epilogue runs among the last tile's MFMAs (16-bit: column groups of the last K chunk; FP8: the
    row group of each B repetition), behind branches on beta (``gemm._finish``, ``epilogue.BETA``): beta 0
    never reads D (a D full of NaN leaves no trace), any other beta does (two tile columns, edges in M
    and N, a K tail)."""
    m, n = _fit(301, cfg, cfg.lhs_k_major), _fit(140, cfg, cfg.rhs_k_major)
    plan = plan_for(cfg, m, n, 12 * _k_unit(cfg), alpha=0.5, beta=beta, seed=5)
    if beta == 0.0:
        plan.out.fill_(float("nan"))
    got = run_and_compare(plan)
    assert not got.out.isnan().any()


def test_misaligned_piece_is_a_clear_error() -> None:
    """A piece starting mid-vector on an operand's contiguous dim is refused, never computed wrong."""
    cfg = KernelConfig(Format.BF16, Format.BF16, False, False, Format.FP32, waves=4)
    plan = plan_for(cfg, 64, 64, 64, pieces=(Piece(0, 37, 0, 64, 0, 64), Piece(37, 64, 0, 64, 0, 64)))
    with pytest.raises(ValueError, match="multiples of 8 elements"):
        executors.run(plan, "emulator")


def test_tile_order_covers_every_tile_once() -> None:
    """30 tiles (not a multiple of the 8 XCDs; 10 tile rows: one full group of 8 and a tail of 2):
    the XCD-aware renumbering must reach every output tile exactly once (beta 1 catches a repeat)."""
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32, waves=4)
    _run_and_check(cfg, 9 * 256 + 10, 2 * 256 + 88, 8, 1.0, 1.0)


def test_empty_k_gives_beta_times_out() -> None:
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32, waves=4)
    _run_and_check(cfg, 40, 72, 0, 1.0, 0.5)


def test_strided_output_view() -> None:
    """``out`` may be a column window of a wider D: the kernel honours its leading stride."""
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32, waves=4)
    plan = plan_for(cfg, 72, 40, 64)
    wide = torch.full((72, 100), 7.0)
    window = wide[:, 28:68]
    window.copy_(plan.out)
    import dataclasses

    plan = dataclasses.replace(plan, out=window)
    before = window.clone()
    executors.run(plan, "emulator")
    want = reference(plan, before)
    torch.testing.assert_close(window.double(), want, atol=1e-3, rtol=1e-5)
    assert torch.all(wide[:, :28] == 7.0) and torch.all(wide[:, 68:] == 7.0)
    # A window one element off the 4-column grid would make every vector store misaligned: refused.
    with pytest.raises(ValueError, match="multiples of 4 elements"):
        executors.run(dataclasses.replace(plan, out=wide[:, 29:69]), "emulator")


@pytest.mark.parametrize(("m", "n", "k_tiles"), [(800, 300, 7), (384, 256, 6)], ids=["edges-7tiles", "whole-6tiles"])
@pytest.mark.parametrize(
    "cfg",
    [
        *(
            KernelConfig(Format.BF16, Format.BF16, lk, rk, Format.BF16, tile_m=384)
            for lk, rk in ((True, True), (True, False), (False, False))  # TN, NN, NT
        ),
        KernelConfig(Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_m=384, tile_k=128),
        KernelConfig(Format.FP8_E5M2, Format.FP8_E4M3, True, True, Format.FP16, tile_m=384, tile_k=128),
    ],
    ids=lambda c: c.name,
)
def test_384_x_256_runs_its_vgpr_accumulators_and_rotating_b(cfg: KernelConfig, m: int, n: int, k_tiles: int) -> None:
    """384 x 256 (family.py): 384 accumulators a lane, the last 128 in arch VGPRs (``mfma.acc_file``), and
    B (lhs) fragments read ahead of their MFMAs (``gemm._rotates_b``): tiles along M with an edge (800
    rows: two whole tiles and 32 rows), the loop's pairs, the odd tile, the peel and a K tail; and one
    whole tile with 6 K tiles, no tail.

    bf16 in TN, NN and NT: two repetitions ahead inside each of a tile's two K chunks, with K-major and
    K-outer operands (the K-outer repetitions four apart sharing one address: ``gemm._rep_sources``).
    FP8 (``gemm._a_in_place``): one K chunk, B one repetition ahead, the next tile's A fragments each read
    into the registers of the one it replaces after the publish, the epilogue after the last tile with
    the thread index made again, the K-tail tiles' columns made again, and the two scale_inv (each
    operand its own, 0.5 - 1.5) by scalar loads."""
    assert cfg in family.BACKED
    m, n = _fit(m, cfg, cfg.lhs_k_major), _fit(n, cfg, cfg.rhs_k_major)
    k = k_tiles * cfg.tile_k - (0 if m == 384 else cfg.tile_k - 3 * _k_unit(cfg))
    _run_and_check(cfg, m, n, k, 0.5, 0.75)
