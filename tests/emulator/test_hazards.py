"""Hazards that hardware hides: unwaited loads, unwaited LDS writes, LDS races, each with its address."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from te_flydsl_plugin.flydsl.emulator import HazardError

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
