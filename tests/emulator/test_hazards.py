"""Hazards that hardware hides: unwaited loads, unwaited LDS writes, LDS races, each with its address."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from te_flydsl_plugin.emulator import EmulatorError, HazardError

from .helpers import Program, vset

pytestmark = pytest.mark.emulator
LANE = np.arange(64, dtype=np.uint32)


def _rsrc(w, t: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
    base = t.data_ptr()
    w.s[8], w.s[9], w.s[10], w.s[11] = base & 0xFFFFFFFF, base >> 32, t.numel() * t.element_size(), 0x27000


def test_use_before_vmcnt_wait_raises_with_address() -> None:
    src = torch.arange(64, dtype=torch.int32)
    prog = Program("buffer_load_dword v1, v0, s[8:11], 0 offen\nv_add_u32_e32 v2, 1, v1")
    with pytest.raises(HazardError, match=r"test\+0x1008 \[unwaited-load\].*v1.*0x1000.*vmcnt"):
        prog.run(lambda w: (vset(w, 0, LANE * 4), _rsrc(w, src)))


def test_vmcnt_counts_in_order() -> None:
    """vmcnt(1) retires the older of two loads only: using the newer one is a hazard."""
    src = torch.arange(64, dtype=torch.int32)
    ok = Program(
        "buffer_load_dword v1, v0, s[8:11], 0 offen\nbuffer_load_dword v2, v0, s[8:11], 0 offen\n"
        "s_waitcnt vmcnt(1)\nv_mov_b32_e32 v3, v1",
        hazards="report",
    )
    ok.run(lambda w: (vset(w, 0, LANE * 4), _rsrc(w, src)))
    assert ok.tracker.found == []
    bad = Program(
        "buffer_load_dword v1, v0, s[8:11], 0 offen\nbuffer_load_dword v2, v0, s[8:11], 0 offen\n"
        "s_waitcnt vmcnt(1)\nv_mov_b32_e32 v3, v2",
        hazards="report",
    )
    bad.run(lambda w: (vset(w, 0, LANE * 4), _rsrc(w, src)))
    assert [(h.kind, h.address) for h in bad.tracker.found] == [("unwaited-load", 0x1018)]


def test_overwriting_a_register_with_a_load_in_flight() -> None:
    prog = Program("ds_read_b32 v1, v0\nv_mov_b32_e32 v1, 0", lds_bytes=256, hazards="report")
    prog.run(lambda w: vset(w, 0, LANE * 4))
    assert [h.kind for h in prog.tracker.found] == ["unwaited-load"]
    assert "overwrites v1" in prog.tracker.found[0].detail


def test_a_second_vmem_load_may_overwrite_the_first_in_flight() -> None:
    """VMEM loads write their registers in order, so two loads into one register need no wait between
    them (LLVM emits back-to-back scratch reloads so); a VALU overwrite still does."""
    src = torch.arange(64, dtype=torch.int32)
    both = Program(
        "buffer_load_dword v1, v0, s[8:11], 0 offen\nbuffer_load_dword v1, v0, s[8:11], 0 offen offset:4\n"
        "s_waitcnt vmcnt(0)\nv_mov_b32_e32 v2, v1",
        hazards="report",
    )
    (w,) = both.run(lambda w: (vset(w, 0, LANE * 4), _rsrc(w, src)))
    assert both.tracker.found == []
    assert (w.v[2][:63] == np.arange(1, 64)).all()  # the second load's data landed last
    valu = Program("buffer_load_dword v1, v0, s[8:11], 0 offen\nv_mov_b32_e32 v1, 0", hazards="report")
    valu.run(lambda w: (vset(w, 0, LANE * 4), _rsrc(w, src)))
    assert [h.kind for h in valu.tracker.found] == ["unwaited-load"]


def test_own_ds_write_then_read_needs_no_wait_but_direct_lds_load_does() -> None:
    own = Program("ds_write_b32 v0, v1\nds_read_b32 v2, v0\ns_waitcnt lgkmcnt(0)", lds_bytes=256)
    own.run(lambda w: (vset(w, 0, LANE * 4), vset(w, 1, LANE)))  # LDS ops of one wave are in order
    src = torch.arange(64, dtype=torch.int32)
    dma = Program(
        "s_mov_b32 m0, 0\nbuffer_load_dword v0, s[8:11], 0 offen lds\nds_read_b32 v2, v1\ns_waitcnt lgkmcnt(0)",
        lds_bytes=256,
        hazards="report",
    )
    dma.run(lambda w: (vset(w, 0, LANE * 4), vset(w, 1, LANE * 4), _rsrc(w, src)))
    assert [(h.kind, h.address) for h in dma.tracker.found] == [("unwaited-lds", 0x1010)]


def test_lds_race_between_waves_without_barrier() -> None:
    # wave 0 writes its slot, wave 1 reads wave 0's slot: a race unless a barrier separates them
    asm = "ds_write_b32 v0, v1\ns_waitcnt lgkmcnt(0)\nds_read_b32 v2, v3\ns_waitcnt lgkmcnt(0)"

    def setup(w):  # type: ignore[no-untyped-def]
        vset(w, 0, (64 * w.wave_id + LANE) * 4)
        vset(w, 1, LANE)
        vset(w, 3, LANE * 4)  # everybody reads wave 0's slot

    racy = Program(asm, lds_bytes=512, hazards="report")
    racy.run(setup, waves=2)
    assert [(h.kind, h.wave, h.address) for h in racy.tracker.found] == [("lds-race", 1, 0x1010)]
    synced = Program(asm.replace("(0)\n", "(0)\ns_barrier\n", 1), lds_bytes=512, hazards="report")
    synced.run(setup, waves=2)
    assert synced.tracker.found == []


def test_unwaited_ds_write_read_by_another_wave_after_barrier() -> None:
    prog = Program(
        "ds_write_b32 v0, v1\ns_barrier\nds_read_b32 v2, v3\ns_waitcnt lgkmcnt(0)", lds_bytes=512, hazards="report"
    )

    def setup(w):  # type: ignore[no-untyped-def]
        vset(w, 0, (64 * w.wave_id + LANE) * 4)
        vset(w, 1, LANE)
        vset(w, 3, LANE * 4)

    prog.run(setup, waves=2)  # wave 0 reaches the barrier without waiting for its ds_write
    assert [(h.kind, h.wave, h.address) for h in prog.tracker.found] == [("unwaited-lds", 1, 0x1010)]


def test_hazards_off_records_nothing() -> None:
    prog = Program("ds_read_b32 v1, v0\nv_mov_b32_e32 v2, v1", lds_bytes=256, hazards="off")
    prog.run(lambda w: vset(w, 0, LANE * 4))
    assert prog.tracker.found == []


def test_scalar_loads_retire_only_with_lgkmcnt_zero() -> None:
    """An s_load and a ds_read outstanding: lgkmcnt(1) does not say which one returned."""
    import ctypes

    buf = (ctypes.c_uint32 * 4)(1, 2, 3, 4)
    asm = "s_load_dword s4, s[0:1], 0x0\nds_read_b32 v1, v0\ns_waitcnt lgkmcnt(1)\nv_mov_b32_e32 v2, v1\n"
    prog = Program(asm, lds_bytes=256, hazards="report")
    prog.run(lambda w: (w.sset(0, ctypes.addressof(buf), 2), vset(w, 0, LANE * 4)))
    assert [(h.kind, h.address) for h in prog.tracker.found] == [("unwaited-load", 0x1018)]
    ok = Program(asm.replace("lgkmcnt(1)", "lgkmcnt(0)"), lds_bytes=256, hazards="report")
    ok.run(lambda w: (w.sset(0, ctypes.addressof(buf), 2), vset(w, 0, LANE * 4)))
    assert ok.tracker.found == []


# -- wait states (s_nop rules) ----------------------------------------------------------------------
# The numbers are gfx950's, from LLVM's GCNHazardRecognizer.cpp and SISchedule.td (see hazards.py).
# Each rule is checked at its boundary: one wait state short raises, exactly enough is clean.

BF16 = "v_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[4:7], a[0:3]"  # XDL, 4 passes
F32 = "v_mfma_f32_16x16x4_f32 a[0:3], v0, v1, a[0:3]"  # not XDL, 8 passes
F8 = "v_mfma_f32_16x16x128_f8f6f4 a[0:3], v[0:7], v[8:15], a[0:3]"  # XDL, FP8 operands: 8 passes
F4 = "v_mfma_f32_16x16x128_f8f6f4 a[0:3], v[0:3], v[8:11], a[0:3] cbsz:4 blgp:4"  # XDL, FP4: 4 passes
SCALED = "v_mfma_scale_f32_16x16x128_f8f6f4 a[0:3], v[0:7], v[8:15], a[0:3], v20, v21 op_sel_hi:[0,0,0]"


def _found(asm: str) -> list[tuple[str, int, str]]:
    prog = Program(asm, lds_bytes=256, hazards="report")
    prog.run()
    return [(h.kind, h.address, h.detail) for h in prog.tracker.found]


def _nops(n: int) -> str:
    """``n`` wait states of s_nop, as LLVM emits them (at most 16 each: s_nop 15)."""
    out = []
    while n > 0:
        out.append(f"s_nop {min(n, 16) - 1}")
        n -= 16
    return "\n".join(out)


def _needs(producer: str, consumer: str, need: int) -> None:
    """``consumer`` right after ``producer`` needs exactly ``need`` wait states between them."""
    if need:
        short = _found(f"{producer}\n{_nops(need - 1)}\n{consumer}")
        assert [k for k, _, _ in short] == ["wait-states"], short
        assert f"after {need - 1} wait states, needs {need}" in short[0][2]
    assert _found(f"{producer}\n{_nops(need)}\n{consumer}") == []


def test_mfma_result_read_at_once_raises_with_address() -> None:
    prog = Program(f"{BF16}\nv_accvgpr_read_b32 v8, a1")
    with pytest.raises(HazardError, match=r"test\+0x1008 \[wait-states\].*reads a1 written by "):
        prog.run()
    assert _found(f"{BF16}\nv_accvgpr_read_b32 v8, a1")[0][2].endswith(
        "reads a1 written by v_mfma_f32_16x16x32_bf16 at 0x1000 (4 passes) after 0 wait states, needs 8"
    )


@pytest.mark.parametrize(
    ("mfma", "need"),
    [
        (BF16, 8),
        (F4, 8),
        (F8, 12),
        (SCALED, 12),
        (F32, 10),
        ("v_mfma_f32_32x32x16_bf16 a[0:15], v[0:3], v[4:7], 0", 12),
    ],
    ids=["bf16-4pass", "fp4-4pass", "fp8-8pass", "scale-fp8-8pass", "f32-8pass-not-xdl", "32x32-bf16-8pass"],
)
def test_mfma_write_then_valu_read(mfma: str, need: int) -> None:
    """XDL: passes + 3, + 1 on gfx950 beyond 2 passes; not XDL (the f32 MFMAs): passes + 2."""
    _needs(mfma, "v_accvgpr_read_b32 v8, a1", need)


def test_mfma_write_then_valu_write_vmem_and_ds() -> None:
    """The same numbers for overwriting the result, storing it, or using it as an address."""
    _needs(BF16, "v_accvgpr_write_b32 a2, v9", 8)
    _needs(BF16, "v_mov_b32_e32 v9, a3", 8)
    mfma_v = "v_mfma_f32_16x16x32_bf16 v[40:43], v[0:3], v[4:7], v[40:43]"
    _needs(mfma_v, "ds_write_b32 v20, v41", 8)  # data
    _needs(mfma_v, "ds_read_b32 v22, v42\ns_waitcnt lgkmcnt(0)", 8)  # address
    _needs(mfma_v, "ds_read_b32 v43, v20\ns_waitcnt lgkmcnt(0)", 8)  # a load overwriting it


def test_valu_write_then_mfma_read() -> None:
    """2 wait states for every source of the MFMA: SrcA, SrcB, SrcC, the block-scale operands."""
    _needs("v_mov_b32_e32 v2, 0", BF16, 2)
    _needs("v_mov_b32_e32 v7, 0", BF16, 2)
    _needs("v_accvgpr_write_b32 a3, 0", BF16, 2)
    _needs("v_mov_b32_e32 v21, 0", SCALED, 2)
    msg = _found(f"v_accvgpr_write_b32 a3, 0\n{BF16}")[0][2]
    assert "reads a3 as SrcC written by v_accvgpr_write_b32 at 0x1000 (VALU) after 0 wait states, needs 2" in msg
    assert _found(f"ds_read_b32 v2, v20\ns_waitcnt lgkmcnt(0)\n{BF16}") == []  # loads are not VALU writes


def test_accumulation_chain_is_clean() -> None:
    """MFMAs accumulating into exactly their own destination need no wait states between them."""
    assert _found("\n".join([BF16] * 4 + [F8] * 3 + [F32] * 3)) == []


def test_srcc_overlapping_previous_destination() -> None:
    """SrcC that overlaps the previous MFMA's result without being exactly it waits for it."""
    shifted = "v_mfma_f32_16x16x32_bf16 a[4:7], v[0:3], v[4:7], a[2:5]"
    _needs(BF16, shifted, 6)  # XDL -> XDL: passes + 2
    f8_shifted = "v_mfma_f32_16x16x128_f8f6f4 a[4:7], v[0:7], v[8:15], a[2:5]"
    _needs(F8, f8_shifted, 10)  # 8 passes
    _needs(BF16, "v_mfma_f32_16x16x4_f32 a[4:7], v0, v1, a[2:5]", 6)  # XDL -> not XDL: passes + 1 (+1)
    _needs(F32, "v_mfma_f32_16x16x4_f32 a[4:7], v0, v1, a[2:5]", 8)  # not XDL -> not XDL: passes
    _needs(F32, shifted, 0)  # not XDL -> XDL: none
    msg = _found(f"{BF16}\n{shifted}")[0][2]
    assert "reads a2 as SrcC (overlapping) written by v_mfma_f32_16x16x32_bf16 at 0x1000 (4 passes)" in msg


def test_mfma_write_then_mfma_srcab() -> None:
    _needs(
        "v_mfma_f32_16x16x32_bf16 v[40:43], v[0:3], v[4:7], 0",
        "v_mfma_f32_16x16x32_bf16 a[0:3], v[40:43], v[4:7], 0",
        8,
    )
    _needs(
        "v_mfma_f32_16x16x32_bf16 v[40:43], v[0:3], v[4:7], 0",
        "v_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[40:43], 0",
        8,
    )
    _needs("v_mfma_f32_16x16x4_f32 v[40:43], v0, v1, 0", "v_mfma_f32_16x16x4_f32 a[0:3], v41, v1, 0", 10)


def test_srcc_read_then_overwrite_war() -> None:
    """After an XDL MFMA reads SrcC, overwriting those registers waits passes - 1; not XDL: free."""
    _needs("v_mfma_f32_16x16x32_bf16 a[4:7], v[0:3], v[4:7], a[0:3]", "v_accvgpr_write_b32 a1, 0", 3)
    _needs("v_mfma_f32_16x16x128_f8f6f4 a[4:7], v[0:7], v[8:15], a[0:3]", "v_accvgpr_write_b32 a1, 0", 7)
    _needs("v_mfma_f32_16x16x4_f32 a[4:7], v0, v1, a[0:3]", "v_accvgpr_write_b32 a1, 0", 0)
    msg = _found("v_mfma_f32_16x16x32_bf16 a[4:7], v[0:3], v[4:7], a[0:3]\nv_accvgpr_write_b32 a1, 0")[0][2]
    assert "overwrites a1 read as SrcC by v_mfma_f32_16x16x32_bf16 at 0x1000 (4 passes)" in msg


def test_valu_exec_write_then_mfma() -> None:
    _needs("v_cmpx_eq_u32_e32 vcc, v30, v30", BF16, 4)
    assert _found(f"s_mov_b64 exec, -1\n{BF16}") == []  # an SALU write of EXEC needs none


def test_valu_write_then_permlane_swap() -> None:
    """gfx950's v_permlane*_swap: 2 after a VALU write of either operand, 4 after a v_cmpx."""
    _needs("v_mov_b32_e32 v2, 0", "v_permlane16_swap_b32_e32 v2, v3", 2)
    _needs("v_mov_b32_e32 v3, 0", "v_permlane32_swap_b32_e32 v2, v3", 2)
    _needs("v_cmpx_eq_u32_e32 vcc, v30, v30", "v_permlane16_swap_b32_e32 v2, v3", 4)


def test_every_instruction_counts_one_wait_state() -> None:
    """s_waitcnt, a taken branch and any other instruction count 1 (s_nop N counts N + 1), as LLVM does."""
    fill = "s_waitcnt lgkmcnt(0)\ns_branch 0\nv_mov_b32_e32 v30, 0\ns_add_u32 s0, s0, 1\nv_nop\ns_nop 1"
    assert [k for k, _, _ in _found(f"{BF16}\n{fill}\nv_accvgpr_read_b32 v8, a1")] == ["wait-states"]
    assert _found(f"{BF16}\n{fill}\ns_nop 0\nv_accvgpr_read_b32 v8, a1") == []


def test_s_nop_counts_its_low_four_bits_plus_one() -> None:
    big = "v_mfma_f32_32x32x64_f8f6f4 v[0:15], v[16:23], v[24:31], 0"  # XDL, FP8, 16 passes: 20
    read = "v_mov_b32_e32 v40, v5"
    assert _found(f"{big}\ns_nop 15\ns_nop 3\n{read}") == []
    assert [k for k, _, _ in _found(f"{big}\ns_nop 15\ns_nop 2\n{read}")] == ["wait-states"]
    assert [k for k, _, _ in _found(f"{big}\ns_nop 0x12\ns_nop 15\n{read}")] == ["wait-states"]  # 3 + 16


def test_wait_states_are_counted_per_wave() -> None:
    """The other waves' instructions (14 here, while wave 0 waits at the barrier) are no wait states
    of wave 0: it reads after 1."""
    asm = f"{BF16}\ns_barrier\nv_accvgpr_read_b32 v8, a1"
    prog = Program(asm, hazards="report")
    prog.run(waves=8)
    assert [(h.kind, h.wave) for h in prog.tracker.found] == [("wait-states", 0)]  # reported once per address


def test_hazards_off_counts_no_wait_states() -> None:
    prog = Program(f"{BF16}\nv_accvgpr_read_b32 v8, a1", hazards="off")
    (w,) = prog.run()
    assert prog.tracker.found == [] and w.hazards.ws == 0 and w.hazards.mw_t == []


def test_mfma_without_timing_is_a_clear_error() -> None:
    prog = Program("v_mfma_f32_16x16x8_bf16 a[0:3], v[0:1], v[2:3], a[0:3]")
    with pytest.raises(EmulatorError, match=r"no gfx950 wait-state timing .* v_mfma_f32_16x16x8_bf16 at 0x1000"):
        prog.run()


@pytest.mark.parametrize("enabled", [True, False])
def test_a_failed_launch_leaves_the_garbage_collector_as_it_found_it(enabled: bool) -> None:
    """launch() pauses the cyclic GC for speed; an error inside the launch must not leave it off (or on)."""
    import gc

    from te_flydsl_plugin import emulator

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(EmulatorError, match="ELF"):
            emulator.launch(b"not an elf", None, b"", (1, 1, 1), (64, 1, 1))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
