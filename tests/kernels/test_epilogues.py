"""The fused epilogues of the GEMM family, compiled for gfx950 and run in the emulator.

Each epilogue config (``family.EPILOGUE_FAMILY``) must compile within the ISA budgets (``test_compile.py``
covers that for the whole family) with a K loop identical to its plain config's, and match the
reference executor (``executors/reference.py``, the semantics TE's epilogues define) on shapes with
M != N != K, edge tiles in M and N, a K tail, a given D (beta), host-split pieces (the epilogue runs
in the last K piece only; bgrad in every K piece of the first column range) and K = 0. The bias
gradients must be the same bits on every run (the partials are reduced in a fixed order, no atomics).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import compiled, executors, family, isa
from te_flydsl_plugin.flydsl.kernels import epilogue, gemm, rowsum
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.flydsl.plan_types import GemmPlan
from te_flydsl_plugin.spec import Format

from .helpers import needs_toolchain, outputs, piece_grid, plan_for, run_and_compare, with_epilogue

pytestmark = [pytest.mark.emulator, needs_toolchain]
F = Format
EPI = [c for c in family.BACKED if c.epilogue != "plain" and c.scaling != "mx"]
MX_EPI = [c for c in family.BACKED if c.epilogue != "plain" and c.scaling == "mx"]


def _k_unit(cfg: KernelConfig) -> int:
    return 16 // cfg.lhs_format.itemsize


def _plan(cfg: KernelConfig, m: int, n: int, k: int, alpha: float, beta: float, pieces=None) -> GemmPlan:
    m = m if cfg.lhs_k_major else m // _k_unit(cfg) * _k_unit(cfg)
    n = n if cfg.rhs_k_major else n // _k_unit(cfg) * _k_unit(cfg)
    plan = plan_for(cfg, m, n, k, alpha=alpha, beta=beta, seed=m * 7 + n + k, pieces=pieces)
    return with_epilogue(plan, m + n)


def test_epilogue_family_is_the_plain_family_plus_epilogues() -> None:
    """Every epilogue config's plain twin is backed (K pieces before the last run it), and each
    epilogue appears where TE issues it: bias / GELU in TN, dGELU in NN."""
    where = {"bgrad": "NT", "dgelu": "NN", "dgelu_bgrad": "NN"}
    for cfg in EPI + MX_EPI:
        assert dataclasses.replace(cfg, epilogue="plain") in family.BACKED, cfg.name
        layout = {(True, True): "TN", (True, False): "NN", (False, False): "NT"}[(cfg.lhs_k_major, cfg.rhs_k_major)]
        want = where.get(cfg.epilogue, "TN")
        assert layout == want or (cfg.scaling == "tensor" and want == "NN"), cfg.name  # FP8 NN reads K-major
    assert {c.epilogue for c in EPI} == set(epilogue.FLAGS) - {"plain"}


@pytest.mark.parametrize("cfg", EPI, ids=lambda c: c.name)
def test_epilogue_matches_reference(cfg: KernelConfig) -> None:
    """Two tile columns with an edge in M and N, a K tail, alpha and a given D (beta)."""
    run_and_compare(_plan(cfg, 301, 140, 9 * _k_unit(cfg), 0.5, 0.75))


@pytest.mark.parametrize("cfg", [c for c in EPI if c.tile_m == 384], ids=lambda c: c.name)
def test_384_x_256_epilogues_after_the_last_tile(cfg: KernelConfig) -> None:
    """The 16-bit fused epilogues on 384 x 256 (``family._wide``), stored after the last tile by
    column groups (``gemm_kernel``): three tiles along M with an edge (800 rows: two whole and 32), two
    tile columns with an edge (300), the loop's pairs, the odd tile, the peel and a K tail, alpha and a
    given D (beta)."""
    k = 7 * cfg.tile_k - (cfg.tile_k - 3 * _k_unit(cfg))
    run_and_compare(_plan(cfg, 800, 300, k, 0.5, 0.75))


@pytest.mark.parametrize(
    "cfg",
    [c for c in EPI if c.lhs_format is F.BF16 and c.out_format is F.BF16],
    ids=lambda c: c.name,
)
def test_epilogue_beta_zero_ignores_nan_d(cfg: KernelConfig) -> None:
    """beta 0 never reads D: a D full of NaN leaves no trace (one epilogue body serves both betas)."""
    plan = _plan(cfg, 37, 76, 3 * _k_unit(cfg), 1.0, 0.0)
    plan.out.fill_(float("nan"))
    got = run_and_compare(plan)
    assert not got.out.isnan().any()


@pytest.mark.parametrize(
    "cfg",
    [c for c in EPI if c.lhs_format is F.BF16 and c.out_format is F.BF16],
    ids=lambda c: c.name,
)
def test_epilogue_in_host_split_pieces(cfg: KernelConfig) -> None:
    """Pieces in M, N and K: earlier K pieces run the plain twin, the last one the epilogue, once."""
    m, n, k = 304, 264, 24 * _k_unit(cfg)
    kc = 8 * _k_unit(cfg)
    pieces = piece_grid(m, n, k, kc)
    run_and_compare(_plan(cfg, m, n, k, 0.5, 0.25, pieces=pieces))


@pytest.mark.parametrize("epi", ["bias_gelu", "dgelu_bgrad", "bgrad"])
def test_epilogue_empty_k(epi: str) -> None:
    """K = 0: the epilogue applies to beta * out."""
    cfg = next(c for c in EPI if c.epilogue == epi and c.lhs_format is F.BF16 and c.out_format is F.BF16)
    run_and_compare(_plan(cfg, 40, 72, 0, 1.0, 0.5))


@pytest.mark.parametrize(("epi", "out"), [("dgelu_bgrad", F.BF16), ("bgrad", F.FP32)])
def test_bias_grad_is_deterministic(epi: str, out: Format) -> None:
    """Several tile rows feed the same columns (dgelu_bgrad), several K tiles and thread groups the
    same rows (bgrad): two runs give the same bits."""
    cfg = next(c for c in EPI if c.epilogue == epi and c.lhs_format is F.BF16 and c.out_format is out)
    plan = _plan(cfg, 520, 264, 5 * _k_unit(cfg) * 8, 1.0, 0.0)
    first = run_and_compare(plan).bias_grad
    again = outputs(plan)
    executors.run(again, "emulator")
    assert torch.equal(first, again.bias_grad)


NOP_SLACK = 6  # wait-state s_nops a fused epilogue's loop may have more or fewer than its plain twin's
WAIT_SLACK = 3  # s_waitcnt, the same (NN dgelu's loop has 12 to the plain twin's 15)
# The K loop's llvm-mca cycles a fused epilogue's config may spend above its plain twin's, in place of a bound
# on its s_nops: MXFP8 NN's plain loop has 2 where LLVM put its K-tail selects between the M0 writes and the
# K-outer DMAs, its fused twins 25 (an s_nop 0 before a DMA), and the fused loops cost 0.2% less (2102 cycles
# against 2106).
MCA_SLACK = 0.01
# The one instruction a fused epilogue's loop may have beyond its plain twin's, by (epilogue, tile_m): bf16 /
# fp16 NN dgelu_bgrad on 384 x 256 (its epilogue after the loop, every register in use) forms one LDS address
# 64 KiB up (past ``ds_read``'s 16-bit offset) with a ``v_or_b32`` each pair of tiles, where its plain twin
# keeps it in a register. Every other fused loop holds exactly the twin's.
REMAT = {("dgelu_bgrad", 384): "v_or_b32_e32"}


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [c for c in EPI + MX_EPI if c.epilogue != "bgrad"], ids=lambda c: c.name)
def test_epilogue_leaves_the_k_loop_alone(cfg: KernelConfig) -> None:
    """A fused epilogue runs in or after the last tile: its config's K loop holds the plain twin's
    instructions (the accumulators stay in place in the same AGPRs), an address recomputed aside
    (``REMAT``), and costs no more under llvm-mca, and only the code after the loop grows."""
    rep = isa.isa_report(cfg)
    plain = isa.isa_report(dataclasses.replace(cfg, epilogue="plain"))
    assert rep["ok"], rep
    assert rep["agpr_accumulators"] == plain["agpr_accumulators"]
    # The same instructions in every loop; only the counts of wait-state s_nops and of s_waitcnt may
    # differ, by a few (LLVM places both by the registers it allocated and, for the waits, by what the
    # code after the loop loads: MXFP8's fused-epilogue one-tile loops came out with up to 6 fewer nops,
    # NN's loop of four tiles with 3 more of its 14; bf16 NN dgelu's loop of pairs with 3 fewer waits).
    mine, twin = _loop_opcodes(cfg), _loop_opcodes(dataclasses.replace(cfg, epilogue="plain"))
    assert len(mine) == len(twin)
    k_loop = max(range(len(mine)), key=lambda n: sum(v for op, v in mine[n].items() if op.startswith("v_mfma")))
    for n, (a, b) in enumerate(zip(mine, twin, strict=True)):
        counted = Counter({"s_nop": a["s_nop"], "s_waitcnt": a["s_waitcnt"]})
        counted_twin = Counter({"s_nop": b["s_nop"], "s_waitcnt": b["s_waitcnt"]})
        extra, missing = (a - counted) - (b - counted_twin), (b - counted_twin) - (a - counted)
        assert not missing, (a, b)
        remat = REMAT.get((cfg.epilogue, cfg.tile_m))
        assert extra == (Counter({remat: 1}) if remat and n == k_loop else Counter()), (a, b)
        assert abs(a["s_waitcnt"] - b["s_waitcnt"]) <= WAIT_SLACK, (a["s_waitcnt"], b["s_waitcnt"])
        if n != k_loop:
            assert abs(a["s_nop"] - b["s_nop"]) <= NOP_SLACK, (a["s_nop"], b["s_nop"])
    assert rep["kloop"]["mca_cycles"] <= plain["kloop"]["mca_cycles"] * (1 + MCA_SLACK), (rep["kloop"], plain["kloop"])


def _loop_opcodes(cfg: KernelConfig) -> list[Counter]:
    """Opcode counts of each loop of ``cfg``'s code (a backward branch's target to the branch)."""
    from te_flydsl_plugin.emulator.decode import decode_text

    text = llvm.disassemble(compiled.compile_config(cfg).code_object, "gfx950")
    insts = [i for kernel in decode_text(text).values() for i in kernel]
    ends = [b for b in insts if b.branch_target is not None and b.branch_target <= b.address]
    return [Counter(i.opcode for i in insts if b.branch_target <= i.address <= b.address) for b in ends]


BGRAD = [c for c in EPI if c.epilogue == "bgrad"]


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [c for c in BGRAD if c.agpr_accumulators], ids=lambda c: c.name)
def test_bgrad_sums_ride_the_plain_twins_loops(cfg: KernelConfig) -> None:
    """Pinned bgrad runs the plain twin's loops (pairs of tiles with the hand-over, an odd tile alone) and
    adds lhs's rows up among each tile's MFMAs (``_Mma.multiply``, ``rowsum.Tile``): each loop holds the
    twin's MFMAs, fragment reads, DMAs and barriers exactly, plus ``tile_k / groups`` ``ds_read_b128`` a
    tile and one add an element; every tile column runs the sums (no second loop to unswitch), only the
    first stores them. Accumulators in place, nothing spills."""
    rep = isa.isa_report(cfg)
    assert rep["ok"], rep
    mine, twin = _loop_opcodes(cfg), _loop_opcodes(dataclasses.replace(cfg, epilogue="plain"))
    assert len(mine) == len(twin) == 2, (mine, twin)
    vec, _, groups = rowsum.shape(gemm.params_for(cfg))
    reads_a_tile = cfg.tile_k // groups
    mfma_a_tile = min(sum(v for op, v in c.items() if op.startswith("v_mfma")) for c in twin)
    for a, b in zip(mine, twin, strict=True):
        tiles = sum(v for op, v in b.items() if op.startswith("v_mfma")) // mfma_a_tile
        for op in {*a, *b}:
            if op.startswith(("v_mfma", "ds_read_b64", "buffer_load", "s_barrier")):
                assert a[op] == b[op], (op, a, b)
        assert a["ds_read_b128"] == b["ds_read_b128"] + tiles * reads_a_tile, (a, b)
        # One add a summed element: bf16's v_add_f32 (after its shift or mask), fp16's v_fma_mix_f32.
        adds = sum(a[op] - b[op] for op in ("v_add_f32_e32", "v_fma_mix_f32"))
        assert adds == tiles * reads_a_tile * vec, (a, b)


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [c for c in BGRAD if not c.agpr_accumulators], ids=lambda c: c.name)
def test_bgrad_sums_in_the_first_tile_column_only(cfg: KernelConfig) -> None:
    """fp32's bgrad (LLVM's own MFMAs) reads lhs's K tiles from LDS for the row sums after each tile's
    MFMAs: LLVM unswitches the uniform ``bn == 0`` test into two loops, one with the sums (extra
    ``ds_read_b128``s) and one without, which the other tile columns run; accumulators stay in place in
    both, nothing spills."""
    rep = isa.isa_report(cfg)
    plain = isa.isa_report(dataclasses.replace(cfg, epilogue="plain"))
    assert rep["ok"], rep
    assert len(rep["loop_insts"]) == 2 and len(plain["loop_insts"]) == 1, rep
    # The loop without the sums reads LDS exactly as the plain twin's loop, the other adds the sums' reads.
    lean, sums = sorted(_loop_opcodes(cfg), key=lambda c: sum(c.values()))
    (twin,) = _loop_opcodes(dataclasses.replace(cfg, epilogue="plain"))

    def reads(c: Counter) -> int:
        return sum(n for op, n in c.items() if op.startswith("ds_read"))

    assert reads(lean) == reads(twin) < reads(sums), (lean, twin, sums)
    assert sum(lean.values()) < sum(sums.values()) and sum(twin.values()) < sum(sums.values())
    # Same loop shape as the twin (LLVM's MFMAs: no hand-over on either side), so no larger.
    assert sum(lean.values()) <= sum(twin.values()), (lean, twin)
