"""LDS bank conflicts counted from the lanes' real addresses (emulator/lds_banks.py, gfx950's 64 x 4-byte
banks, 256 bytes per clock): exact counts on probe instructions and a probe kernel that computes its
fragment addresses with and without a swizzle, and the compiled GEMMs' K loops (conflict-free)."""

from __future__ import annotations

import numpy as np
import pytest

from te_flydsl_plugin.emulator.lds_banks import BankModel, BankStats
from te_flydsl_plugin.emulator.machine import Wave
from te_flydsl_plugin.flydsl import lds_conflicts
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format

from .helpers import Program, needs_toolchain, vset

LANE = np.arange(64)


def _run(asm: str, addrs: np.ndarray, exec_bits: int = (1 << 64) - 1) -> BankStats:
    stats = BankStats()

    def setup(w: Wave) -> None:
        vset(w, 0, addrs)
        w.set_exec(exec_bits)

    Program(asm, lds_bytes=64 * 1024, banks=stats).run(setup)
    return stats


def _only(stats: BankStats) -> tuple[int, int]:
    (e,) = stats.by_address.values()
    return e.cycles, e.ideal_cycles


def test_bank_model_counts_wrapped_addresses() -> None:
    """The model counts the address the access uses, VGPR + offset modulo 2**32 (ops_mem.LDS_ADDRESS): half
    the lanes reaching one dword through a base that wrapped below zero still share it with the others."""
    m = BankModel()
    lanes = np.ones(64, bool)
    same = np.full(64, 0x40, np.int64)
    wrapped = np.where(LANE % 2 == 1, 0x1_0000_0040, 0x40)  # 0x8040 - 0x8000 wrapped, plus offset 0x8000
    assert m.cycles(wrapped, lanes, 4) == m.cycles(same, lanes, 4) == (1, 1)


def test_lanes_per_clock_follow_the_width() -> None:
    m = BankModel()
    assert [m.phase_lanes(w) for w in (1, 2, 4, 8, 12, 16)] == [64, 64, 64, 32, 16, 16]
    assert BankModel(banks=32, bytes_per_clock=128).phase_lanes(16) == 8  # CDNA3's LDS, for contrast


def test_consecutive_b128_is_conflict_free() -> None:
    assert _only(_run("ds_read_b128 v[4:7], v0", 16 * LANE)) == (4, 4)  # 4 phases of 16 lanes, 1 clock each


def test_rows_r_and_r_plus_8_collide() -> None:
    """Lanes 0-7 read the 8 chunks of one 128-byte row and lanes 8-15 those of the row two rows of
    128 bytes on (256 bytes further): same banks, other dwords, so every phase takes 2 clocks."""
    addrs = (LANE % 8) * 16 + (LANE // 8) * 256
    cycles, ideal = _only(_run("ds_read_b128 v[4:7], v0", addrs))
    assert (cycles, ideal) == (8, 4)
    shifted = addrs + (LANE // 8 % 2) * 128  # the second half of each phase moved to the other 32 banks
    assert _only(_run("ds_read_b128 v[4:7], v0", shifted)) == (4, 4)


def test_same_bank_stride_serialises_and_broadcast_does_not() -> None:
    assert _only(_run("ds_write_b32 v0, v1", 256 * LANE)) == (64, 1)  # 64 lanes, one bank, 64 dwords
    assert _only(_run("ds_read_b32 v4, v0", np.zeros(64, np.int64))) == (1, 1)  # one dword for all


def test_offsets_exec_and_paired_accesses() -> None:
    # offset:128 moves every lane by 32 banks: still conflict-free
    assert _only(_run("ds_read_b64 v[4:5], v0 offset:128", 8 * LANE)) == (2, 2)
    # only lanes 0-15 on: one phase of a b128 read
    assert _only(_run("ds_read_b128 v[4:7], v0", 16 * LANE, exec_bits=0xFFFF)) == (1, 1)
    # read2_b64 = two 8-byte accesses, each of 2 phases; offset1 puts the second on the same dwords
    assert _only(_run("ds_read2_b64 v[4:7], v0 offset1:0", 8 * LANE)) == (4, 4)
    # the transposing read is served 32 lanes a clock, like any 8-byte read
    assert _only(_run("ds_read_b64_tr_b16 v[4:5], v0", 8 * LANE)) == (2, 2)


def test_stats_by_address_and_opcode() -> None:
    stats = BankStats()
    asm = "ds_read_b128 v[4:7], v0\nds_read_b128 v[8:11], v1\nds_write_b32 v2, v3"
    prog = Program(asm, 64 * 1024, hazards="off", banks=stats)

    def setup(w: Wave) -> None:
        vset(w, 0, 16 * LANE)
        vset(w, 1, (LANE % 8) * 16 + (LANE // 8) * 256)
        vset(w, 2, 4 * LANE)

    prog.run(setup, waves=2)
    ops = stats.by_opcode()
    assert ops["ds_read_b128"] == {"executions": 4, "cycles": 24, "ideal_cycles": 16, "conflict_cycles": 8}
    assert ops["ds_write_b32"]["conflict_cycles"] == 0
    first = min(stats.by_address)
    assert stats.by_opcode(lambda a: a == first)["ds_read_b128"]["conflict_cycles"] == 0


def _fragment_read(swizzle: str, model: BankModel | None = None) -> tuple[int, int]:
    """A probe kernel: each lane computes its address as a 16x16 MFMA fragment read does (lane l reads
    row l % 16 of 128-byte rows, 16-byte chunk l // 16), XOR-swizzles the chunk with ``swizzle`` (an
    instruction computing v4 from the row in v2), and reads 16 bytes."""
    stats = BankStats(model or BankModel())
    asm = f"""
        v_mbcnt_lo_u32_b32 v1, -1, 0
        v_mbcnt_hi_u32_b32 v1, -1, v1
        v_and_b32 v2, 15, v1
        v_lshrrev_b32 v3, 4, v1
        {swizzle}
        v_xor_b32 v3, v3, v4
        v_lshlrev_b32 v5, 7, v2
        v_lshl_add_u32 v6, v3, 4, v5
        ds_read_b128 v[8:11], v6
    """
    Program(asm, lds_bytes=64 * 1024, banks=stats).run()
    return stats.by_opcode()["ds_read_b128"]["cycles"], stats.by_opcode()["ds_read_b128"]["conflict_cycles"]


def test_probe_kernel_swizzles() -> None:
    """Unswizzled, the 16 rows of a phase fall on two 4-bank groups: 8-way. Our K-major swizzle
    (chunk ^= row mod 8) leaves rows r and r + 8 on the same banks: 2-way, one extra clock per phase.
    chunk ^= (row mod 16) / 2 (PR 676's and FlyDSL's) spreads the 16 rows over all 64 banks."""
    assert _fragment_read("v_mov_b32 v4, 0") == (32, 28)
    assert _fragment_read("v_and_b32 v4, 7, v2") == (8, 4)
    assert _fragment_read("v_lshrrev_b32 v4, 1, v2") == (4, 0)
    # CDNA3's 32 banks, 8 lanes a clock: the other way round (why the hardware-tuned gfx950 kernels'
    # choice of the second swizzle is evidence for the 64-bank model)
    cdna3 = BankModel(banks=32, bytes_per_clock=128)
    assert _fragment_read("v_and_b32 v4, 7, v2", cdna3) == (8, 0)
    assert _fragment_read("v_lshrrev_b32 v4, 1, v2", cdna3) == (16, 8)


BF16_TN = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4)


@pytest.mark.compile
@needs_toolchain
def test_gemm_tile_report() -> None:
    """Our bf16 TN K loop, a pair of tiles an iteration: 32 ds_read_b128 per wave and tile (chunk 1 of
    the tile and chunk 0 of the next, kernels/gemm.py's hand-over), conflict-free under the 64-bank model
    with the swizzle ``chunk ^= (row mod 16) / 2`` (the probe above): 4 clocks each. The probe's K of 6
    tiles runs the loop twice, then the peel (tile 4, its 32 reads) and the last tile (its chunk 1's 16);
    chunk 0 of the first tile is read before the loop."""
    rep = lds_conflicts.tile_report(BF16_TN)
    it = rep["per_iteration"]
    assert rep["k"] == 6 * BF16_TN.tile_k and rep["iterations"] == 2
    assert it["by_opcode"]["ds_read_b128"]["executions"] == 2 * 32
    assert (it["conflict_cycles"], it["cycles"]) == (0, 2 * 128)
    assert rep["epilogue"] == {"conflict_cycles": 0, "cycles": 128 + 64, "by_opcode": rep["epilogue"]["by_opcode"]}
    assert (rep["prologue"]["conflict_cycles"], rep["prologue"]["cycles"]) == (0, 64)
    assert rep["model"] == {"banks": 64, "bank_bytes": 4, "bytes_per_clock": 256}


# The K-outer LDS layouts' transposing reads (16-bit ``ds_read_b64_tr_b16``, MXFP8's ``_tr_b8``) and
# fp32's ``ds_read_b32`` of both majornesses, beside the K-major ``ds_read_b128`` ones; 384-row K-outer
# tiles in their blocks of 128 rows (``gemm._kouter_width``: NT 384 x 256's lhs).
KOUTER = [
    KernelConfig(Format.BF16, Format.BF16, True, False, Format.BF16, waves=4),
    KernelConfig(Format.FP16, Format.FP16, False, False, Format.FP16, waves=4),
    KernelConfig(Format.BF16, Format.BF16, False, False, Format.BF16, tile_m=384, waves=4),
    KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, False, Format.BF16, tile_k=128),
    KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, False, False, Format.BF16, tile_k=128),
    KernelConfig(Format.FP32, Format.FP32, False, False, Format.FP32, tile_k=32, waves=8),
    KernelConfig(Format.FP32, Format.FP32, True, True, Format.FP32, tile_k=32, waves=8),
]


@pytest.mark.compile
@needs_toolchain
@pytest.mark.parametrize("cfg", KOUTER, ids=lambda c: c.name)
def test_every_fragment_read_is_conflict_free(cfg: KernelConfig) -> None:
    """Every LDS read of the tile, in and around the K loop, costs its conflict-free clocks: the K-outer
    layouts store K rows in the bit order that puts the rows one clock serves on distinct banks
    (kernels/gemm.py ``_KOUTER``; the single ``block ^= K mod 4`` swizzle before left the 16-bit
    transposing reads 2-way and the 8-bit ones 4-way conflicted)."""
    rep = lds_conflicts.tile_report(cfg)
    for region in ("per_iteration", "prologue", "epilogue"):
        assert rep[region]["conflict_cycles"] == 0, (region, rep[region])
    assert rep["per_iteration"]["cycles"] > 0
