"""The emulator's timing mode (emulator/trace.py, emulator/timing.py): invariants of the cycle model on
probe programs that really run in the emulator, the trace being off by default, and a trace of AMD's
prebuilt f4gemm kernel (its K loop at the MFMA floor when memory keeps up, slower when it does not)."""

from __future__ import annotations

import numpy as np
import pytest

from te_flydsl_plugin.emulator.machine import Wave
from te_flydsl_plugin.emulator.timing import CLOCKS_PER_PASS, ISSUE_CLOCKS, LDS_LATENCY, Memory, replay
from te_flydsl_plugin.emulator.trace import Trace, vmem_lane_bytes
from te_flydsl_plugin.flydsl import wg_timing

from .helpers import Program, vset

LANE = np.arange(64)
FAST = Memory(bytes_per_clock=64.0, latency=700)
BF16_PASSES = 4  # v_mfma_f32_16x16x32_bf16 on gfx950 (hazards._PASSES, from SISchedule.td)


def _mfmas(n: int, first: int = 0) -> str:
    """``n`` independent bf16 MFMAs (each its own accumulator)."""
    return "\n".join(
        f"v_mfma_f32_16x16x32_bf16 a[{4 * i}:{4 * i + 3}], v[0:3], v[4:7], a[{4 * i}:{4 * i + 3}]"
        for i in range(first, first + n)
    )


def _clocks(asm: str, setup=None, waves: int = 1, memory: Memory = FAST, groups: int = 1) -> tuple[int, Trace]:
    t = Trace()
    Program(asm, lds_bytes=64 * 1024, hazards="off", trace=t).run(setup, waves)
    return replay(t, memory, groups), t


def test_doubling_the_mfmas_doubles_the_floor() -> None:
    one, _ = _clocks(_mfmas(16))
    two, _ = _clocks(_mfmas(32))
    per = BF16_PASSES * CLOCKS_PER_PASS
    assert one == 16 * per and two == 32 * per  # the pipe, busy for its passes, is the whole time


def test_resident_workgroups_share_the_simd_pipe_and_waves_on_other_simds_do_not() -> None:
    alone, _ = _clocks(_mfmas(16))
    shared, _ = _clocks(_mfmas(16), groups=2)  # wave 0 of both copies on SIMD 0
    spread, _ = _clocks(_mfmas(16), waves=4)  # four waves on four SIMDs
    assert shared == 2 * alone and spread == alone


def _global(setup_buf: np.ndarray):
    addr = setup_buf.ctypes.data

    def setup(w: Wave) -> None:
        vset(w, 12, np.full(64, addr & 0xFFFFFFFF, np.int64))
        vset(w, 13, np.full(64, addr >> 32, np.int64))

    return setup


def test_removing_a_prefetch_predicts_slower() -> None:
    """The same loads and MFMAs; with the next tile's load issued before the MFMAs that do not need it
    (a prefetch), its latency hides under them; waiting right after the load exposes it each time."""
    buf = np.zeros(4096, np.uint8)
    load = "global_load_dwordx4 v[8:11], v[12:13], off"
    work = _mfmas(48)  # 48 x 16 clocks: longer than the load's latency
    prefetched = "\n".join(f"{load}\n{work}\ns_waitcnt vmcnt(0)" for _ in range(4))
    exposed = "\n".join(f"{load}\ns_waitcnt vmcnt(0)\n{work}" for _ in range(4))
    fast, _ = _clocks(prefetched, _global(buf))
    slow, t = _clocks(exposed, _global(buf))
    assert [c for _, c in t.waves[0] if c][:1] == [64 * 16]  # the trace holds the bytes the lanes moved
    assert fast < 4 * 48 * BF16_PASSES * CLOCKS_PER_PASS + FAST.latency // 2  # hidden but for the slack
    assert slow - fast >= 3 * FAST.latency  # exposed at every iteration
    starved, _ = _clocks(prefetched, _global(buf), memory=Memory(bytes_per_clock=1.0, latency=700))
    assert starved > fast  # less bandwidth, slower


def test_a_bank_conflict_added_to_a_probe_is_counted_and_costs_clocks() -> None:
    """16 ds_read_b32 at consecutive dwords (1 clock each) against a stride of 64 dwords (all 64 lanes
    in one bank: 64 clocks each, lds_banks.py): the trace holds each access's clocks, the replay
    serialises them on the CU's one LDS."""
    asm = "\n".join("ds_read_b32 v4, v0" for _ in range(16)) + "\ns_waitcnt lgkmcnt(0)"
    calm, tc = _clocks(asm, lambda w: vset(w, 0, 4 * LANE))
    busy, tb = _clocks(asm, lambda w: vset(w, 0, 256 * LANE))
    assert {c for _, c in tc.waves[0][:16]} == {1} and {c for _, c in tb.waves[0][:16]} == {64}
    assert calm < 16 * ISSUE_CLOCKS + LDS_LATENCY + 8  # issue-bound: the LDS serves faster than waves ask
    assert busy >= 16 * 64 + LDS_LATENCY  # the LDS busy 64 clocks an access


def test_a_barrier_waits_for_the_slowest_wave() -> None:
    """Every wave does 8 MFMAs, then a barrier; wave 1 of two shares nothing, so the barrier costs what
    the MFMAs cost; with both waves of two copies on two SIMDs, each SIMD runs 16."""
    asm = f"{_mfmas(8)}\ns_barrier\n{_mfmas(1, 8)}"
    two, _ = _clocks(asm, waves=2)
    per = BF16_PASSES * CLOCKS_PER_PASS
    assert two >= 9 * per and two < 9 * per + 32


def test_the_trace_changes_no_result_and_is_off_by_default() -> None:
    asm = "v_add_u32 v2, v0, v1\nds_write_b32 v0, v2\ns_waitcnt lgkmcnt(0)\nds_read_b32 v3, v0\ns_waitcnt lgkmcnt(0)"

    def setup(w: Wave) -> None:
        vset(w, 0, 4 * LANE)
        vset(w, 1, LANE + 7)

    plain = Program(asm, lds_bytes=1024, hazards="off")
    assert plain.trace is None
    (a,) = plain.run(setup)
    (b,) = Program(asm, lds_bytes=1024, hazards="off", trace=Trace()).run(setup)
    assert np.array_equal(a.v[3], b.v[3]) and np.array_equal(a.v[3], (4 * LANE + LANE + 7).astype(np.uint32))


def test_lines_are_linear_in_k_and_interpolate_in_bandwidth() -> None:
    rows = [{"bytes_per_clock": b, "fixed": 100.0, "per_iteration": 1000.0 / b} for b in (8.0, 16.0)]
    assert wg_timing.at(rows, 8.0) == (100.0, 125.0) and wg_timing.at(rows, 4.0) == (100.0, 125.0)
    assert wg_timing.at(rows, 32.0) == (100.0, 62.5)
    assert wg_timing.at(rows, 1 / (0.5 / 8 + 0.5 / 16)) == pytest.approx((100.0, 93.75))


def test_vector_memory_bytes_come_from_the_opcode() -> None:
    widths = {"buffer_load_dwordx4": 16, "buffer_load_dword": 4, "global_store_short_d16_hi": 2}
    widths |= {"buffer_atomic_pk_add_bf16": 4, "global_atomic_add_f32": 4, "global_load_ubyte": 1}
    assert {op: vmem_lane_bytes(op) for op in widths} == widths
