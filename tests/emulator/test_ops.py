"""Single instructions against their documented semantics: scalar, vector, conversions, memory, LDS."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from te_flydsl_plugin.emulator import EmulatorError
from te_flydsl_plugin.emulator import numerics as nm

from .helpers import Program, vf32, vset

pytestmark = pytest.mark.emulator
LANE = np.arange(64, dtype=np.uint32)


def test_scalar_carry_chain_and_compare() -> None:
    (w,) = Program(
        """
        s_add_u32 s4, s0, s2
        s_addc_u32 s5, s1, s3
        s_cmp_lt_i32 s6, 0
        s_cselect_b32 s7, 11, 22
        s_sub_u32 s8, 0, 1
        s_subb_u32 s9, 0, 0
        s_lshl_b64 s[10:11], s[0:1], 4
        s_bfe_u32 s12, 0xabcd1234, 0x80004
        s_movk_i32 s13, 0xfff0
        """
    ).run(lambda w: w.s.__setitem__(slice(0, 7), [0xFFFFFFFF, 1, 2, 3, 0, 0, 0xFFFFFFFF]))
    assert (w.s[4], w.s[5]) == (1, 5)  # 0x1_FFFFFFFF + 0x3_00000002
    assert w.s[7] == 11  # -1 < 0
    assert (w.s[8], w.s[9]) == (0xFFFFFFFF, 0xFFFFFFFF)  # borrow propagates
    assert w.sget(10, 2) == (0x1_FFFFFFFF << 4)
    assert w.s[12] == 0x23 and w.s[13] == 0xFFFFFFF0


def test_saveexec_masks_lanes() -> None:
    (w,) = Program(
        """
        v_cmp_gt_u32_e32 vcc, 10, v0
        s_and_saveexec_b64 s[4:5], vcc
        v_mov_b32_e32 v1, 7
        s_or_b64 exec, exec, s[4:5]
        v_add_u32_e32 v2, 1, v1
        """
    ).run(lambda w: vset(w, 0, LANE))
    assert w.sget(4, 2) == (1 << 64) - 1 and w.exec_full
    assert (w.v[1][:10] == 7).all() and (w.v[1][10:] == 0).all()
    assert (w.v[2] == np.where(LANE < 10, 8, 1)).all()


def test_vector_64bit_address_math() -> None:
    (w,) = Program(
        """
        v_mad_u64_u32 v[2:3], s[0:1], v0, s8, v[4:5]
        v_lshl_add_u64 v[6:7], v[2:3], 2, v[4:5]
        v_add_co_u32_e32 v8, vcc, -1, v0
        v_addc_co_u32_e32 v9, vcc, 0, v1, vcc
        """
    ).run(
        lambda w: (
            vset(w, 0, LANE * 1000),
            vset(w, 1, 5),
            vset(w, 4, 0xFFFFFFFF),
            vset(w, 5, 1),
            w.s.__setitem__(8, 0x10000),
        )
    )
    lo = w.v[2].astype(np.uint64) | (w.v[3].astype(np.uint64) << np.uint64(32))
    want = LANE.astype(np.uint64) * 1000 * 0x10000 + 0x1_FFFFFFFF
    assert (lo == want).all()
    v67 = w.v[6].astype(np.uint64) | (w.v[7].astype(np.uint64) << np.uint64(32))
    assert (v67 == (want << np.uint64(2)) + np.uint64(0x1_FFFFFFFF)).all()
    assert (w.v[9] == np.where(LANE > 0, 6, 5)).all()  # carry out of (x - 1) for every x > 0


def test_bit_ops() -> None:
    (w,) = Program(
        """
        v_bfe_u32 v2, v0, 4, 8
        v_bfe_i32 v3, v0, 4, 8
        v_perm_b32 v4, v0, v1, 0x05040100
        v_bitop3_b32 v5, v0, v1, 0xff00ff00 bitop3:0x48
        v_lshl_or_b32 v6, v0, 4, 0xf
        v_and_or_b32 v7, v0, 0xff, 0x1000
        v_add3_u32 v8, v0, v1, 1
        v_cndmask_b32_e64 v9, v0, v1, s[4:5]
        """
    ).run(lambda w: (vset(w, 0, 0x8F0 + LANE), vset(w, 1, 0x12345678), w.sset(4, 0x5555555555555555, 2)))
    x = (0x8F0 + LANE).astype(np.uint32)
    assert (w.v[2] == ((x >> 4) & 0xFF)).all()
    sx = ((x >> 4) & 0xFF).astype(np.int64)
    assert (w.v[3] == np.where(sx >= 128, sx - 256, sx).astype(np.int64).astype(np.uint32)).all()
    assert (w.v[4] == ((0x5678) | ((x & 0xFFFF) << 16))).all()
    a, b, c = x, np.uint32(0x12345678), np.uint32(0xFF00FF00)
    lut = 0x48  # bit (a<<2|b<<1|c) of the LUT
    want = np.zeros(64, np.uint32)
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        want |= (((lut >> idx) & 1).astype(np.uint32)) << bit
    assert (w.v[5] == want).all()
    assert (w.v[6] == (x << 4) | 0xF).all() and (w.v[7] == (x & 0xFF) | 0x1000).all()
    assert (w.v[8] == x + 0x12345679).all()
    assert (w.v[9] == np.where(LANE % 2 == 0, 0x12345678, x)).all()


def test_f32_arith_and_compare_with_nan() -> None:
    vals = np.array([1.5, -2.0, np.nan, np.inf] * 16, np.float32)
    (w,) = Program(
        """
        v_mul_f32_e32 v1, 2.0, v0
        v_fmac_f32_e32 v2, v0, v0
        v_max_f32_e32 v3, 0, v0
        v_cmp_neq_f32_e64 s[4:5], v0, v0
        v_rcp_f32_e32 v5, v0
        v_rcp_iflag_f32_e32 v9, v0
        v_pk_mul_f32 v[6:7], v[0:1], v[0:1]
        v_add_f32_e64 v8, -v0, |v0|
        """
    ).run(lambda w: (vset(w, 0, vals), vset(w, 1, vals), vset(w, 2, 1.0)))
    np.testing.assert_array_equal(vf32(w, 1), 2 * vals)
    np.testing.assert_array_equal(vf32(w, 2), (vals.astype(np.float64) * vals + 1).astype(np.float32))
    np.testing.assert_array_equal(vf32(w, 3), np.fmax(np.float32(0), vals))
    assert w.sget(4, 2) == sum(1 << i for i in range(64) if i % 4 == 2)  # only NaN != NaN
    np.testing.assert_array_equal(vf32(w, 6), vals * vals)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(vf32(w, 9), np.float32(1) / vals)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(vf32(w, 8), np.abs(vals) - vals)


def test_readfirstlane_and_mbcnt() -> None:
    (w,) = Program(
        """
        s_mov_b64 exec, 0xfffffff0
        v_readfirstlane_b32 s4, v0
        s_mov_b64 exec, -1
        v_mbcnt_lo_u32_b32 v1, -1, 0
        v_mbcnt_hi_u32_b32 v1, -1, v1
        """
    ).run(lambda w: vset(w, 0, LANE + 100))
    assert w.s[4] == 104 and (w.v[1] == LANE).all()


# -- conversions at their edge values ------------------------------------------------------------

EDGE = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.5,
        448.0,
        464.0,
        57344.0,
        1e6,
        -1e6,
        np.inf,
        -np.inf,
        np.nan,
        2.0**-9,
        2.0**-10,
        2.0**-17,
        2.0**-16,
    ]
    * 4,
    np.float32,
)


def test_cvt_pk_bf16_f32_matches_torch() -> None:
    f32 = np.finfo(np.float32)
    lo = np.resize(np.array([f32.max, f32.tiny / 2, 1.00390625, -0.0, np.nan, np.inf, 3.14159], np.float32), 64)
    hi = lo[::-1].copy()
    (w,) = Program("v_cvt_pk_bf16_f32 v2, v0, v1").run(lambda w: (vset(w, 0, lo), vset(w, 1, hi)))
    tb = lambda x: torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16).astype(np.uint32)  # noqa: E731
    got_lo, got_hi = w.v[2] & 0xFFFF, w.v[2] >> 16
    nan = np.isnan(lo)
    assert (got_lo[~nan] == tb(lo)[~nan]).all() and np.isnan(nm.bf16_to_f32(got_lo[nan])).all()
    nanh = np.isnan(hi)
    assert (got_hi[~nanh] == tb(hi)[~nanh]).all()


@pytest.mark.parametrize(("opc", "fmt"), [("v_cvt_pk_fp8_f32", nm.E4M3), ("v_cvt_pk_bf8_f32", nm.E5M2)])
@pytest.mark.parametrize("clamp", [False, True])
def test_cvt_pk_fp8_f32(opc: str, fmt: nm.MiniFloat, clamp: bool) -> None:
    b = EDGE[::-1].copy()
    c = " clamp" if clamp else ""
    (w,) = Program(
        f"v_cvt_pk_{opc[9:12]}_f32 v2, v0, v1{c}\nv_cvt_pk_{opc[9:12]}_f32 v3, v0, v1 op_sel:[0,0,1]{c}"
    ).run(lambda w: (vset(w, 0, EDGE), vset(w, 1, b), vset(w, 2, 0xAAAAAAAA), vset(w, 3, 0xBBBBBBBB)))
    lo, hi = nm.encode(fmt, EDGE, clamp).astype(np.uint32), nm.encode(fmt, b, clamp).astype(np.uint32)
    assert (w.v[2] == (0xAAAA0000 | lo | hi << 8)).all()  # low word written, high word kept
    assert (w.v[3] == (0x0000BBBB | (lo | hi << 8) << 16)).all()
    if fmt is nm.E4M3:  # the in-range values agree with torch's float8_e4m3fn
        ok = np.abs(EDGE) <= 448
        want = torch.from_numpy(EDGE[ok]).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        assert (lo[ok] == want).all()
        assert (lo[EDGE == 1e6] == (0x7E if clamp else 0x7F)).all()


def test_cvt_f32_fp8_bytes() -> None:
    codes = np.arange(256, dtype=np.uint32)[:64]
    word = codes | ((codes + 64) << 8) | ((codes + 128) << 16) | ((codes + 192) << 24)
    (w,) = Program(
        """
        v_cvt_f32_fp8_e64 v1, v0 op_sel:[1,1]
        v_cvt_pk_f32_bf8_e64 v[2:3], v0 op_sel:[1,0]
        """
    ).run(lambda w: vset(w, 0, word))
    np.testing.assert_array_equal(vf32(w, 1), nm.decode_table(nm.E4M3)[codes + 192])
    np.testing.assert_array_equal(vf32(w, 2), nm.decode_table(nm.E5M2)[codes + 128])
    np.testing.assert_array_equal(vf32(w, 3), nm.decode_table(nm.E5M2)[codes + 192])


def test_fma_mix_f16_source() -> None:
    h = torch.tensor(np.resize([1.5, -2.0, 65504.0, 2.0**-24], 64), dtype=torch.float16)
    bits = h.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    (w,) = Program("v_fma_mix_f32 v1, v0, s4, neg(0) op_sel_hi:[1,0,0]").run(
        lambda w: (vset(w, 0, bits << 16 | 0x3C00), w.s.__setitem__(4, int(np.float32(3.0).view(np.uint32))))
    )
    np.testing.assert_array_equal(vf32(w, 1), np.float32(1.0) * 3)  # low half is 1.0: op_sel selects it
    (w,) = Program("v_fma_mix_f32 v1, v0, s4, 0 op_sel:[1,0,0] op_sel_hi:[1,0,0]").run(
        lambda w: (vset(w, 0, bits << 16), w.s.__setitem__(4, int(np.float32(3.0).view(np.uint32))))
    )
    np.testing.assert_array_equal(vf32(w, 1), h.float().numpy() * 3)


# -- memory ------------------------------------------------------------------------------------


def _rsrc(w, base: int, num_records: int, at: int = 8) -> None:  # type: ignore[no-untyped-def]
    w.s[at], w.s[at + 1], w.s[at + 2], w.s[at + 3] = base & 0xFFFFFFFF, (base >> 32) & 0xFFFF, num_records, 0x27000


def test_buffer_out_of_range_loads_zero_and_drops_stores() -> None:
    src = torch.arange(64, dtype=torch.int32)
    dst = torch.full((80,), -1, dtype=torch.int32)
    n_valid = 40  # elements in range
    prog = Program(
        """
        buffer_load_dword v1, v0, s[8:11], 0 offen
        s_waitcnt vmcnt(0)
        buffer_store_dword v1, v0, s[12:15], 0 offen offset:16
        s_waitcnt vmcnt(0)
        """
    )

    def setup(w):  # type: ignore[no-untyped-def]
        vset(w, 0, LANE * 4)
        _rsrc(w, src.data_ptr(), n_valid * 4)
        _rsrc(w, dst.data_ptr(), 50 * 4, at=12)

    (w,) = prog.run(setup)
    assert (w.v[1][:n_valid] == np.arange(n_valid)).all() and (w.v[1][n_valid:] == 0).all()
    got = dst.numpy()
    assert (got[:4] == -1).all()  # offset:16 shifts the store by 4 elements
    assert (got[4:50] == np.concatenate([np.arange(n_valid), np.zeros(6)])).all()  # 4 + lane < 50 only
    assert (got[50:] == -1).all()


def test_global_load_store_dwordx4() -> None:
    src = torch.arange(256, dtype=torch.float32)
    dst = torch.zeros(256, dtype=torch.float32)

    def setup(w):  # type: ignore[no-untyped-def]
        a, b = src.data_ptr() + 16 * LANE.astype(np.uint64), dst.data_ptr() + 16 * LANE[::-1].astype(np.uint64)
        vset(w, 0, (a & 0xFFFFFFFF).astype(np.uint32))
        vset(w, 1, (a >> np.uint64(32)).astype(np.uint32))
        vset(w, 2, (b & 0xFFFFFFFF).astype(np.uint32))
        vset(w, 3, (b >> np.uint64(32)).astype(np.uint32))

    Program(
        "global_load_dwordx4 v[4:7], v[0:1], off\ns_waitcnt vmcnt(0)\nglobal_store_dwordx4 v[2:3], v[4:7], off"
    ).run(setup)
    assert torch.equal(dst.view(64, 4), src.view(64, 4).flip(0))


def test_unmapped_global_address_is_an_error_not_a_crash() -> None:
    prog = Program("global_load_dword v1, v[2:3], off")
    with pytest.raises(EmulatorError, match=r"unmapped|null"):
        prog.run(lambda w: (vset(w, 2, 0x10), vset(w, 3, 0)))


def test_direct_to_lds_buffer_load() -> None:
    src = torch.arange(64 * 4, dtype=torch.int32)
    prog = Program(
        """
        s_mov_b32 m0, 0x100
        buffer_load_dwordx4 v0, s[8:11], 0 offen lds
        s_waitcnt vmcnt(0)
        ds_read_b128 v[4:7], v1
        s_waitcnt lgkmcnt(0)
        """,
        lds_bytes=2048,
    )

    def setup(w):  # type: ignore[no-untyped-def]
        vset(w, 0, LANE[::-1] * 16)  # lane l loads source vector 63 - l
        vset(w, 1, 0x100 + LANE * 16)
        _rsrc(w, src.data_ptr(), src.numel() * 4)

    (w,) = prog.run(setup)
    want = src.view(64, 4).flip(0).numpy().T.astype(np.uint32)
    assert (w.v[4:8] == want).all()  # LDS[M0 + 16 * lane] holds lane's 16 bytes


def test_ds_write_read_variants() -> None:
    prog = Program(
        """
        ds_write_b32 v0, v1 offset:4
        ds_write_b16 v0, v2 offset:8
        ds_write_b16_d16_hi v0, v2 offset:10
        ds_write2_b32 v0, v1, v2 offset0:4 offset1:5
        ds_read_b64 v[4:5], v0 offset:4
        ds_read_u16 v6, v0 offset:10
        ds_read2_b32 v[7:8], v0 offset0:4 offset1:5
        s_waitcnt lgkmcnt(0)
        """,
        lds_bytes=64 * 32,
    )
    (w,) = prog.run(lambda w: (vset(w, 0, LANE * 32), vset(w, 1, LANE + 1000), vset(w, 2, 0xBEEF0000 | LANE)))
    assert (w.v[4] == LANE + 1000).all()
    assert (w.v[5] == (0xBEEF << 16) | LANE).all()
    assert (w.v[6] == 0xBEEF).all()
    assert (w.v[7] == LANE + 1000).all() and (w.v[8] == 0xBEEF0000 | LANE).all()


def test_ds_address_wraps_at_32_bits() -> None:
    """A DS address is VGPR + offset modulo 2**32 (LLVM folds constants into the offset whatever the base's
    sign, ``isDSOffsetLegal``; ops_mem.py cites it): a base 0x8000 below the bytes, as a 32-bit wrapped
    value, with ``offset:32768`` writes and reads them. Without the wrap the sum fell past the LDS and
    read zeros, which failed MXFP8's peel at an odd count of K tiles."""
    prog = Program(
        """
        v_subrev_u32_e32 v3, 0x8000, v0
        ds_write_b32 v3, v1 offset:32768
        ds_read_b32 v4, v3 offset:32768
        ds_read_b32 v5, v0
        s_waitcnt lgkmcnt(0)
        """,
        lds_bytes=64 * 4,
    )
    (w,) = prog.run(lambda w: (vset(w, 0, LANE * 4), vset(w, 1, LANE + 77)))
    assert (w.v[3][1:] > 0xFFFF0000).all()  # the bases wrapped below zero
    assert (w.v[4] == LANE + 77).all() and (w.v[5] == LANE + 77).all()


def test_ds_read_b64_tr_b16_transposes_4x16_blocks() -> None:
    # LDS holds a 4 x 64 matrix of b16, row-major (row r at byte 128 * r): element (r, c) = 1000 * r + c.
    # Lane l addresses the 4 elements at row (l // 4) % 4, columns 16 * (l // 16) + 4 * (l % 4) ...
    # within each 16-lane group; the exchange gives lane l the column 16 * (l // 16) + l % 16, rows 0..3.
    prog = Program("ds_read_b64_tr_b16 v[2:3], v0\ns_waitcnt lgkmcnt(0)", lds_bytes=4 * 128)
    mat = (1000 * np.arange(4)[:, None] + np.arange(64)[None, :]).astype(np.uint16)

    def setup(w):  # type: ignore[no-untyped-def]
        prog.lds[:] = mat.view(np.uint8).ravel()
        g, i = LANE // 16, LANE % 16
        vset(w, 0, 128 * (i // 4) + 2 * (16 * g + 4 * (i % 4)))

    (w,) = prog.run(setup)
    got = np.ascontiguousarray(w.v[2:4].T).view(np.uint16)  # [lane, 4 elements]
    col = 16 * (LANE // 16) + LANE % 16
    assert (got == (1000 * np.arange(4)[None, :] + col[:, None])).all()


def test_ds_bpermute() -> None:
    (w,) = Program("ds_bpermute_b32 v2, v0, v1\ns_waitcnt lgkmcnt(0)").run(
        lambda w: (vset(w, 0, ((LANE + 1) % 64) * 4), vset(w, 1, LANE * 10))
    )
    assert (w.v[2] == ((LANE + 1) % 64) * 10).all()


def test_s_load_reads_kernarg_memory() -> None:
    buf = (ctypes.c_uint32 * 8)(*range(10, 18))
    addr = ctypes.addressof(buf)
    (w,) = Program("s_load_dwordx4 s[4:7], s[0:1], 0x10\ns_waitcnt lgkmcnt(0)").run(lambda w: w.sset(0, addr, 2))
    assert w.s[4:8] == [14, 15, 16, 17]


def test_unknown_instruction_names_opcode_address_kernel() -> None:
    prog = Program("v_nop\nv_sin_f32_e32 v0, v1")
    with pytest.raises(EmulatorError, match=r"test: unknown instruction 'v_sin_f32_e32' at 0x1008"):
        prog.run()


def test_cmp_class_and_division_special_values() -> None:
    vals = np.resize(np.array([np.nan, -np.inf, -1.0, -1e-40, -0.0, 0.0, 1e-40, 2.0, np.inf], np.float32), 64)
    den = np.resize(np.array([1.0, 2.0, 0.0, -0.0, 3.0, 0.0, 1e-40, np.inf, 7.0], np.float32), 64)
    (w,) = Program(
        """
        v_cmp_class_f32_e64 s[4:5], v0, 0x3fc
        v_div_scale_f32 v2, s[6:7], v1, v1, v0
        v_div_fixup_f32 v3, v2, v1, v0
        """
    ).run(lambda w: (vset(w, 0, vals), vset(w, 1, den)))
    finite_or_inf = [not np.isnan(v) for v in vals]  # 0x3fc: every class but the NaNs
    assert w.sget(4, 2) == sum(1 << i for i, ok in enumerate(finite_or_inf) if ok)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(vf32(w, 3), vals / den)


def test_global_load_lds() -> None:
    src = torch.arange(64 * 3, dtype=torch.int32)
    prog = Program(
        "s_mov_b32 m0, 64\nglobal_load_lds_dwordx3 v[0:1], off\ns_waitcnt vmcnt(0)\nds_read_b96 v[4:6], v2\n"
        "s_waitcnt lgkmcnt(0)",
        lds_bytes=64 + 64 * 12,
    )

    def setup(w):  # type: ignore[no-untyped-def]
        a = src.data_ptr() + 12 * LANE.astype(np.uint64)
        vset(w, 0, (a & 0xFFFFFFFF).astype(np.uint32))
        vset(w, 1, (a >> np.uint64(32)).astype(np.uint32))
        vset(w, 2, 64 + 12 * LANE)

    (w,) = prog.run(setup)
    assert (w.v[4:7] == src.view(64, 3).numpy().T).all()


def test_runaway_loop_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    from te_flydsl_plugin.emulator import ops_salu

    monkeypatch.setattr(ops_salu, "MAX_BACK_BRANCHES", 1000)
    prog = Program("s_add_u32 s0, s0, 1\ns_branch -2")  # back to the s_add, forever
    with pytest.raises(EmulatorError, match=r"backward branch at 0x1008 more than 1000 times"):
        prog.run()


def test_buffer_dwordx4_is_range_checked_per_dword() -> None:
    """num_records = 22 bytes: of a dwordx4 at offset 8, the dwords at 8, 12 and 16 are in range,
    the one at 20 straddles the end and reads 0; the store of the same shape writes only three."""
    src = torch.arange(16, dtype=torch.int32)
    dst = torch.full((16,), -1, dtype=torch.int32)
    prog = Program(
        "buffer_load_dwordx4 v[1:4], v0, s[8:11], 0 offen\ns_waitcnt vmcnt(0)\n"
        "buffer_store_dwordx4 v[1:4], v0, s[12:15], 0 offen\ns_waitcnt vmcnt(0)"
    )

    def setup(w):  # type: ignore[no-untyped-def]
        w.set_exec(1)  # one lane
        vset(w, 0, 8)
        _rsrc(w, src.data_ptr(), 22)
        _rsrc(w, dst.data_ptr(), 22, at=12)

    (w,) = prog.run(setup)
    assert list(w.v[1:5, 0]) == [2, 3, 4, 0]
    assert dst.tolist() == [-1, -1, 2, 3, 4] + [-1] * 11


def test_sdwa_forms_are_refused_not_approximated() -> None:
    prog = Program("v_mov_b32_sdwa v1, v2 dst_sel:WORD_1 dst_unused:UNUSED_PRESERVE src0_sel:BYTE_0")
    with pytest.raises(EmulatorError, match=r"unknown instruction 'v_mov_b32_sdwa'"):
        prog.run()


def test_packed_f16_with_op_sel_and_neg() -> None:
    rng = np.random.default_rng(3)
    a, b, c = (torch.from_numpy(rng.standard_normal((64, 2)).astype(np.float16)) for _ in range(3))
    word = lambda t: t.view(torch.int32).numpy().view(np.uint32)[:, 0]  # noqa: E731  [lo, hi] halves
    (w,) = Program(
        """
        v_pk_add_f16 v3, v0, v1
        v_pk_mul_f16 v4, v0, v1 op_sel:[1,0] op_sel_hi:[0,1] neg_lo:[0,1]
        v_pk_fma_f16 v5, v0, v1, v2
        """
    ).run(lambda w: (vset(w, 0, word(a)), vset(w, 1, word(b)), vset(w, 2, word(c))))
    halves = lambda reg: torch.from_numpy(w.v[reg].copy()).view(torch.float16).view(64, 2).float()  # noqa: E731
    torch.testing.assert_close(halves(3), (a.float() + b.float()).half().float())
    want_lo = (a[:, 1].float() * -b[:, 0].float()).half().float()
    want_hi = (a[:, 0].float() * b[:, 1].float()).half().float()
    torch.testing.assert_close(halves(4), torch.stack([want_lo, want_hi], 1))
    want = (a.double() * b.double() + c.double()).half().float()
    torch.testing.assert_close(halves(5), want)


@pytest.mark.parametrize("size", [16, 32])
def test_permlane_swap(size: int) -> None:
    """The odd rows (of 16 or 32 lanes) of vdst trade places with the even rows of vsrc."""
    (w,) = Program(f"v_permlane{size}_swap_b32_e32 v0, v1").run(lambda w: (vset(w, 0, LANE), vset(w, 1, LANE + 100)))
    odd = (LANE // size) % 2 == 1
    want_d = np.where(odd, LANE - size + 100, LANE)
    want_s = np.where(~odd, LANE + size, LANE + 100)
    assert (w.v[0] == want_d).all() and (w.v[1] == want_s).all()


def test_bfrev_ffbh() -> None:
    vals = np.resize(np.array([1, 0x80000000, 0x12345678, 0, 0xFFFFFFFF], np.uint32), 64)
    (w,) = Program("v_bfrev_b32_e32 v1, v0\nv_ffbh_u32_e32 v2, v0").run(lambda w: vset(w, 0, vals))
    assert (w.v[1] == [int(f"{int(v):032b}"[::-1], 2) for v in vals]).all()
    assert (w.v[2] == [32 - int(v).bit_length() if v else 0xFFFFFFFF for v in vals]).all()


def test_cvt_fp8_sdwa_selects_as_llvm_emits_them() -> None:
    """llc -mcpu=gfx950 turns cvt.f32.fp8(x, byte) into ``_sdwa src0_sel:BYTE_n`` and
    cvt.pk.f32.fp8(x, hi) into ``_sdwa src0_sel:WORD_1``."""
    codes = np.arange(64, dtype=np.uint32)
    word = codes | ((codes + 64) << 8) | ((codes + 128) << 16) | ((codes + 192) << 24)
    (w,) = Program(
        """
        v_cvt_f32_fp8_sdwa v1, v0 src0_sel:BYTE_1
        v_cvt_pk_f32_fp8_sdwa v[2:3], v0 src0_sel:WORD_1
        """
    ).run(lambda w: vset(w, 0, word))
    tab = nm.decode_table(nm.E4M3)
    np.testing.assert_array_equal(vf32(w, 1), tab[codes + 64])
    np.testing.assert_array_equal(vf32(w, 2), tab[codes + 128])
    np.testing.assert_array_equal(vf32(w, 3), tab[codes + 192])


def test_cvt_f32_f16_sdwa_takes_the_selected_half() -> None:
    """A packed f16 pair read back from memory: llc converts its high half as ``_sdwa src0_sel:WORD_1``."""
    lo = torch.linspace(-3, 3, 64, dtype=torch.float16)
    hi = torch.linspace(100, -7, 64, dtype=torch.float16)
    pair = (lo.view(torch.int16).int() & 0xFFFF) | ((hi.view(torch.int16).int() & 0xFFFF) << 16)
    (w,) = Program(
        """
        v_cvt_f32_f16_sdwa v1, v0 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:WORD_1
        v_cvt_f32_f16_sdwa v2, v0 dst_sel:DWORD dst_unused:UNUSED_PAD src0_sel:WORD_0
        """
    ).run(lambda w: vset(w, 0, pair.numpy().astype(np.uint32)))
    np.testing.assert_array_equal(vf32(w, 1), hi.float().numpy())
    np.testing.assert_array_equal(vf32(w, 2), lo.float().numpy())


def test_scratch_spill_and_reload() -> None:
    """Architected flat scratch (gfx940+): each lane has its own private segment."""
    prog = Program(
        """
        scratch_store_dwordx4 off, a[0:3], off offset:8
        scratch_store_dword v9, v0, off
        s_waitcnt vmcnt(0)
        scratch_load_dwordx4 v[4:7], off, off offset:8
        scratch_load_dword v8, v9, off
        s_waitcnt vmcnt(0)
        """
    )

    def setup(w):  # type: ignore[no-untyped-def]
        w.scratch = np.zeros((64, 32), np.uint8)
        w.a[0:4] = LANE[None, :] * 10 + np.arange(4, dtype=np.uint32)[:, None]
        vset(w, 0, LANE + 1000)
        vset(w, 9, 28)

    (w,) = prog.run(setup)
    assert (w.v[4:8] == w.a[0:4]).all() and (w.v[8] == LANE + 1000).all()
    bad = Program("scratch_store_dword off, v0, off offset:32")
    with pytest.raises(EmulatorError, match="outside the 32-byte private segment"):
        bad.run(lambda w: setattr(w, "scratch", np.zeros((64, 32), np.uint8)))


def test_mov_b64() -> None:
    (w,) = Program("v_mov_b64_e32 v[2:3], v[0:1]\nv_mov_b64_e32 v[4:5], s[4:5]").run(
        lambda w: (vset(w, 0, LANE), vset(w, 1, LANE + 7), w.sset(4, 0x1122334455667788, 2))
    )
    assert (w.v[2] == LANE).all() and (w.v[3] == LANE + 7).all()
    assert (w.v[4] == 0x55667788).all() and (w.v[5] == 0x11223344).all()


def test_dpp_row_newbcast_quad_perm_and_masks() -> None:
    """DPP src0 lane selection (CDNA3 ISA "Data Parallel Processing"; LLVM DppCtrl): row_newbcast:n
    reads lane n of the lane's 16-lane row (AMD's aiter f8_block_scale kernels broadcast a scale so),
    quad_perm permutes within 4 lanes, row_mask / bank_mask leave disabled lanes unwritten."""
    x = (LANE * 3 + 1).astype(np.float32)
    y = np.full(64, 2.0, np.float32)
    lane = np.arange(64)
    (w,) = Program(
        """
        v_mul_f32_dpp v2, v0, v1 row_newbcast:5 row_mask:0xf bank_mask:0xf
        v_mul_f32_dpp v3, -v0, v1 quad_perm:[3,2,1,0] row_mask:0xf bank_mask:0xf
        v_mul_f32_dpp v4, v0, v1 row_newbcast:0 row_mask:0x5 bank_mask:0x2
        """
    ).run(lambda w: (vset(w, 0, x), vset(w, 1, y), vset(w, 4, 7.0)))
    np.testing.assert_array_equal(vf32(w, 2), x[lane // 16 * 16 + 5] * 2)
    np.testing.assert_array_equal(vf32(w, 3), -x[lane // 4 * 4 + 3 - lane % 4] * 2)
    on = (lane // 16 % 2 == 0) & (lane % 16 // 4 == 1)  # rows 0 and 2, bank 1
    np.testing.assert_array_equal(vf32(w, 4), np.where(on, x[lane // 16 * 16] * 2, 7.0))


def test_global_atomic_add_f32_applies_every_lane() -> None:
    """global_atomic_add_f32 without return (aiter's split-K bf16gemm): lanes hitting one address all add."""
    acc = torch.full((4,), 0.5, dtype=torch.float32)

    def setup(w):  # type: ignore[no-untyped-def]
        vset(w, 0, (4 * (LANE % 4)).astype(np.uint32))
        vset(w, 1, np.full(64, 1.25, np.float32))
        w.s[8], w.s[9] = acc.data_ptr() & 0xFFFFFFFF, acc.data_ptr() >> 32

    Program("global_atomic_add_f32 v0, v1, s[8:9]").run(setup)
    assert torch.equal(acc, torch.full((4,), 0.5 + 16 * 1.25))


def test_branch_to_a_named_label_stays_in_the_kernel() -> None:
    """Hand-written assembly keeps local labels in its symbol table: llvm-objdump prints them as symbols
    and as branch operands; with the kernel names known they are branch targets, not new kernels."""
    from te_flydsl_plugin.emulator.decode import decode_text

    text = (
        "0000000000001000 <kern>:\n"
        "\ts_branch label_0002   // 000000001000: BF820001\n"
        "\ts_nop 0               // 000000001004: BF800000\n"
        "0000000000001008 <label_0002>:\n"
        "\ts_endpgm              // 000000001008: BF810000\n"
    )
    (insts,) = decode_text(text, {"kern"}).values()
    assert [i.opcode for i in insts] == ["s_branch", "s_nop", "s_endpgm"]
    assert insts[0].branch_target == 0x1008 and "error" not in insts[0].extra


def test_vgpr_index_mode_shifts_the_enabled_operands() -> None:
    """s_set_gpr_idx_on (CDNA3 ISA): M0[7:0] = the index, M0[15:12] = the mode; until
    s_set_gpr_idx_off the enabled vector operands are relative to it (here SRC0, then DST)."""

    def setup(w):  # type: ignore[no-untyped-def]
        for r in range(4):
            vset(w, r, 100 + r)
        w.a[2] = 77

    (w,) = Program(
        """
        s_mov_b32 s0, 2
        s_set_gpr_idx_on s0, gpr_idx(SRC0)
        v_mov_b32_e32 v10, v1
        v_accvgpr_read_b32 v11, a0
        s_set_gpr_idx_off
        v_mov_b32_e32 v12, v1
        s_set_gpr_idx_on s0, gpr_idx(DST)
        v_mov_b32_e32 v20, v1
        s_set_gpr_idx_off
        """
    ).run(setup)
    assert (w.v[10] == 103).all() and (w.v[11] == 77).all() and (w.v[12] == 101).all()
    assert (w.v[22] == 101).all() and (w.v[20] == 0).all()
    assert w.s[124] & 0xFF == 2 and (w.s[124] >> 12) & 0xF == 8  # M0 of the last ON: index 2, DST
