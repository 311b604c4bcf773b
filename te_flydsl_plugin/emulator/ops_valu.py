"""Vector ALU: integer, bitwise, f32 and packed-f32 arithmetic, compares, selects, lane ops.

Every instruction computes all 64 lanes with one numpy expression and writes only the lanes EXEC
enables. Integer results wrap modulo 2**32; f32 arithmetic is numpy float32 (IEEE, round to nearest
even, denormals kept, as gfx950 does with the default FP mode FlyDSL compiles for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .bind import (
    BindContext,
    Step,
    as_f32,
    as_u32,
    base_opcode,
    bitmask_reader,
    fsrc,
    op,
    sreader,
    swriter,
    vreader,
    vwriter,
)
from .decode import VCC, Inst, Operand
from .errors import EmulatorError
from .machine import LANES, Wave, mask_to_bits

U32 = np.uint32
_LANE_IDS = np.arange(LANES, dtype=np.uint32)


def _i32(x: Any) -> np.ndarray:
    return np.asarray(x, np.uint32).view(np.int32)


def _sh(x: Any) -> np.ndarray:
    return np.asarray(x, np.uint32) & U32(31)


# name -> fn over uint32 sources; results are uint32 (or int, wrapped by as_u32)
_INT2: dict[str, Callable[[Any, Any], Any]] = {
    "v_add_u32": lambda a, b: a + b,
    "v_sub_u32": lambda a, b: a - b,
    "v_subrev_u32": lambda a, b: b - a,
    # gfx9's VOP3-only signed forms (CDNA3 ISA V_ADD_I32 / V_SUB_I32): the same bits mod 2^32 without
    # clamp (clamp, which would saturate, is refused below); AMD's aiter f4gemm 256x256 kernel uses them
    "v_add_i32": lambda a, b: a + b,
    "v_sub_i32": lambda a, b: a - b,
    "v_and_b32": lambda a, b: a & b,
    "v_or_b32": lambda a, b: a | b,
    "v_xor_b32": lambda a, b: a ^ b,
    "v_xnor_b32": lambda a, b: ~(a ^ b),
    "v_lshlrev_b32": lambda a, b: np.left_shift(np.asarray(b, U32), _sh(a)),
    "v_lshrrev_b32": lambda a, b: np.right_shift(np.asarray(b, U32), _sh(a)),
    "v_ashrrev_i32": lambda a, b: np.right_shift(_i32(b), _sh(a).astype(np.int32)).view(U32),
    "v_lshlrev_b16": lambda a, b: (
        np.left_shift(np.asarray(b, U32) & U32(0xFFFF), np.asarray(a, U32) & U32(15)) & U32(0xFFFF)
    ),
    "v_mul_lo_u32": lambda a, b: (np.asarray(a, np.uint64) * np.asarray(b, np.uint64)).astype(U32),
    "v_mul_hi_u32": lambda a, b: ((np.asarray(a, np.uint64) * np.asarray(b, np.uint64)) >> np.uint64(32)).astype(U32),
    "v_mul_hi_i32": lambda a, b: ((_i32(a).astype(np.int64) * _i32(b).astype(np.int64)) >> 32).astype(U32),
    "v_mul_u32_u24": lambda a, b: (np.asarray(a, U32) & U32(0xFFFFFF)) * (np.asarray(b, U32) & U32(0xFFFFFF)),
    "v_mul_i32_i24": lambda a, b: (
        (_i32(np.asarray(a, U32) << U32(8)) >> 8).astype(np.int64) * (_i32(np.asarray(b, U32) << U32(8)) >> 8)
    ).astype(U32),
    "v_min_u32": lambda a, b: np.minimum(np.asarray(a, U32), np.asarray(b, U32)),
    "v_max_u32": lambda a, b: np.maximum(np.asarray(a, U32), np.asarray(b, U32)),
    "v_min_i32": lambda a, b: np.minimum(_i32(a), _i32(b)).view(U32),
    "v_max_i32": lambda a, b: np.maximum(_i32(a), _i32(b)).view(U32),
    "v_bfm_b32": lambda a, b: (np.left_shift(U32(1), _sh(a)) - U32(1)) << _sh(b),
    "v_bcnt_u32_b32": lambda a, b: np.bitwise_count(np.asarray(a, U32)).astype(U32) + b,
}


def _bfe(a: Any, b: Any, c: Any, signed: bool) -> np.ndarray:
    off = np.asarray(b, U32) & U32(31)
    width = np.asarray(c, U32) & U32(31)
    a = np.asarray(a, U32)
    v = (a >> off) & ((np.left_shift(np.uint64(1), width.astype(np.uint64)) - np.uint64(1)).astype(U32))
    if signed:
        shift = (U32(32) - width) & U32(31)
        sv = np.right_shift((v << shift).view(np.int32), shift.astype(np.int32)).view(U32)
        v = np.where(width == 0, U32(0), sv)
    return np.where(width == 0, U32(0), v).astype(U32)


def _perm(a: Any, b: Any, sel: Any) -> np.ndarray:
    """v_perm_b32: each selector byte picks a byte of {a,b} (b is bytes 0-3), or a constant."""
    pool = (np.asarray(a, np.uint64) << np.uint64(32)) | np.asarray(b, np.uint64)
    sel = np.broadcast_to(np.asarray(sel, U32), (LANES,))
    pool = np.broadcast_to(pool, (LANES,))
    out = np.zeros(LANES, U32)
    for i in range(4):
        s = (sel >> U32(8 * i)) & U32(0xFF)
        byte = ((pool >> (np.minimum(s, 7).astype(np.uint64) * np.uint64(8))) & np.uint64(0xFF)).astype(U32)
        sign_src = {8: 15, 9: 31, 10: 47, 11: 63}
        for code, bit in sign_src.items():
            fill = np.where((pool >> np.uint64(bit)) & np.uint64(1), U32(0xFF), U32(0))
            byte = np.where(s == code, fill, byte)
        byte = np.where(s == 12, U32(0), byte)
        byte = np.where(s >= 13, U32(0xFF), byte)
        out |= byte << U32(8 * i)
    return out


_INT3: dict[str, Callable[[Any, Any, Any], Any]] = {
    "v_lshl_add_u32": lambda a, b, c: (np.asarray(a, U32) << _sh(b)) + c,
    "v_add_lshl_u32": lambda a, b, c: (np.asarray(a, U32) + b) << _sh(c),
    "v_lshl_or_b32": lambda a, b, c: (np.asarray(a, U32) << _sh(b)) | c,
    "v_and_or_b32": lambda a, b, c: (np.asarray(a, U32) & b) | c,
    "v_or3_b32": lambda a, b, c: np.asarray(a, U32) | b | c,
    "v_xor3_b32": lambda a, b, c: np.asarray(a, U32) ^ b ^ c,
    "v_add3_u32": lambda a, b, c: np.asarray(a, U32) + b + c,
    "v_xad_u32": lambda a, b, c: (np.asarray(a, U32) ^ b) + c,
    "v_mad_u32_u24": lambda a, b, c: (np.asarray(a, U32) & U32(0xFFFFFF)) * (np.asarray(b, U32) & U32(0xFFFFFF)) + c,
    "v_bfe_u32": lambda a, b, c: _bfe(a, b, c, False),
    "v_bfe_i32": lambda a, b, c: _bfe(a, b, c, True),
    "v_bfi_b32": lambda a, b, c: (np.asarray(a, U32) & b) | (~np.asarray(a, U32) & c),
    "v_alignbit_b32": lambda a, b, c: (
        ((np.asarray(a, np.uint64) << np.uint64(32)) | np.asarray(b, np.uint64)) >> (_sh(c).astype(np.uint64))
    ).astype(U32),
    "v_alignbyte_b32": lambda a, b, c: (
        ((np.asarray(a, np.uint64) << np.uint64(32)) | np.asarray(b, np.uint64))
        >> ((np.asarray(c, U32) & U32(3)).astype(np.uint64) * np.uint64(8))
    ).astype(U32),
    "v_perm_b32": _perm,
    "v_min3_u32": lambda a, b, c: np.minimum(np.minimum(np.asarray(a, U32), b), np.asarray(c, U32)),
    "v_max3_u32": lambda a, b, c: np.maximum(np.maximum(np.asarray(a, U32), b), np.asarray(c, U32)),
    "v_min3_i32": lambda a, b, c: np.minimum(np.minimum(_i32(a), _i32(b)), _i32(c)).view(U32),
    "v_max3_i32": lambda a, b, c: np.maximum(np.maximum(_i32(a), _i32(b)), _i32(c)).view(U32),
    "v_med3_i32": lambda a, b, c: (
        np.median(np.stack(np.broadcast_arrays(_i32(a), _i32(b), _i32(c))), 0).astype(np.int32).view(U32)
    ),
    "v_med3_u32": lambda a, b, c: np.median(
        np.stack(np.broadcast_arrays(*(np.asarray(x, U32).astype(np.int64) for x in (a, b, c)))), 0
    ).astype(U32),
}

_INT1: dict[str, Callable[[Any], Any]] = {
    "v_mov_b32": lambda a: a,
    "v_not_b32": lambda a: ~np.asarray(a, U32),
    "v_bfrev_b32": lambda a: _bfrev(a),
    "v_ffbh_u32": lambda a: np.where(
        np.asarray(a, U32) == 0, U32(0xFFFFFFFF), U32(31) - np.floor(np.log2(np.maximum(a, 1))).astype(U32)
    ),
    "v_ffbl_b32": lambda a: np.where(
        np.asarray(a, U32) == 0,
        U32(0xFFFFFFFF),
        np.log2((np.asarray(a, U32) & (~np.asarray(a, U32) + U32(1))).astype(np.float64)).astype(U32),
    ),
    "v_cvt_f32_u32": lambda a: np.asarray(a, U32).astype(np.float32),
    "v_cvt_f32_i32": lambda a: _i32(a).astype(np.float32),
    "v_cvt_u32_f32": lambda a: _f2u(as_f32(a)),
    "v_cvt_i32_f32": lambda a: _f2i(as_f32(a)),
    "v_cvt_f32_ubyte0": lambda a: (np.asarray(a, U32) & U32(0xFF)).astype(np.float32),
    "v_cvt_f32_ubyte1": lambda a: ((np.asarray(a, U32) >> U32(8)) & U32(0xFF)).astype(np.float32),
    "v_cvt_f32_ubyte2": lambda a: ((np.asarray(a, U32) >> U32(16)) & U32(0xFF)).astype(np.float32),
    "v_cvt_f32_ubyte3": lambda a: (np.asarray(a, U32) >> U32(24)).astype(np.float32),
}


_BYTE_REV = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], np.uint32)


def _bfrev(a: object) -> np.ndarray:
    """Reverse the 32 bits of each lane (byte-wise table, bytes in reverse order)."""
    x = np.asarray(a, U32)
    return (
        (_BYTE_REV[x & U32(0xFF)] << U32(24))
        | (_BYTE_REV[(x >> U32(8)) & U32(0xFF)] << U32(16))
        | (_BYTE_REV[(x >> U32(16)) & U32(0xFF)] << U32(8))
        | _BYTE_REV[x >> U32(24)]
    )


def _f2u(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x), 0, np.clip(np.trunc(x), 0, 4294967295.0)).astype(np.uint64).astype(U32)


def _f2i(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x), 0, np.clip(np.trunc(x), -2147483648.0, 2147483647.0)).astype(np.int64).astype(U32)


def _bind_int(inst: Inst, ctx: BindContext, fn: Callable[..., Any], nsrc: int) -> Step:
    ops = inst.operands
    if "clamp" in inst.modifiers and inst.opcode.startswith(("v_add_i32", "v_sub_i32")):
        raise EmulatorError(f"{ctx.kernel}: saturating {inst.text!r} at 0x{inst.address:x} is not emulated")
    dst = vwriter(ops[0], ctx, inst)
    srcs = [vreader(o, ctx, inst) for o in ops[1 : 1 + nsrc]]
    if nsrc == 1:
        (a,) = srcs
        return lambda w: dst(w, as_u32(fn(a(w))))
    if nsrc == 2:
        a, b = srcs
        return lambda w: dst(w, as_u32(fn(a(w), b(w))))
    a, b, c = srcs
    return lambda w: dst(w, as_u32(fn(a(w), b(w), c(w))))


def _register(table: dict[str, Callable[..., Any]], nsrc: int) -> None:
    for name, fn in table.items():

        def binder(inst: Inst, ctx: BindContext, fn: Callable[..., Any] = fn) -> Step:
            return _bind_int(inst, ctx, fn, nsrc)

        op(name, name + "_e32", name + "_e64")(binder)


_register(_INT1, 1)
_register(_INT2, 2)
_register(_INT3, 3)


@op("v_bitop3_b32", "v_bitop3_b16")
def _bitop3(inst: Inst, ctx: BindContext) -> Step:
    """gfx950 three-input bitwise op: each result bit is LUT[(a<<2)|(b<<1)|c] of the 8-bit ``bitop3``."""
    lut = inst.mod_int("bitop3", 0)
    dst = vwriter(inst.operands[0], ctx, inst)
    a, b, c = (vreader(o, ctx, inst) for o in inst.operands[1:4])
    terms = []
    for idx in range(8):
        if lut >> idx & 1:
            terms.append(((idx >> 2) & 1, (idx >> 1) & 1, idx & 1))

    def step(w: Wave) -> None:
        x, y, z = (np.asarray(f(w), U32) for f in (a, b, c))
        out = np.zeros(np.broadcast(x, y, z).shape, U32)
        for ta, tb, tc in terms:
            out |= (x if ta else ~x) & (y if tb else ~y) & (z if tc else ~z)
        dst(w, out)

    return step


# -- f32 ---------------------------------------------------------------------------------------

_F2: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "v_add_f32": lambda a, b: a + b,
    "v_sub_f32": lambda a, b: a - b,
    "v_subrev_f32": lambda a, b: b - a,
    "v_mul_f32": lambda a, b: a * b,
    "v_max_f32": np.fmax,
    "v_min_f32": np.fmin,
    "v_ldexp_f32": lambda a, b: np.ldexp(a, b.view(np.int32)).astype(np.float32),
}
_F1: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "v_rcp_f32": lambda a: np.float32(1.0) / a,
    # CDNA4 ISA: 1/S0 like V_RCP_F32, raising the integer divide-by-zero flag instead of the float
    # ones; LLVM emits it (AMDGPUISD::RCP_IFLAG) in its 32-bit integer division expansion, which is
    # exact for a reciprocal within 1 ulp (AMD's aiter bf16gemm kernels run it to split the grid)
    "v_rcp_iflag_f32": lambda a: np.float32(1.0) / a,
    "v_rsq_f32": lambda a: np.float32(1.0) / np.sqrt(a),
    "v_sqrt_f32": np.sqrt,
    "v_exp_f32": np.exp2,
    "v_log_f32": np.log2,
    "v_trunc_f32": np.trunc,
    "v_floor_f32": np.floor,
    "v_ceil_f32": np.ceil,
    "v_rndne_f32": np.rint,
    "v_fract_f32": lambda a: a - np.floor(a),
    "v_mov_b32_f": lambda a: a,
}
_F3: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "v_fma_f32": lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float32),
    "v_mad_f32": lambda a, b, c: a * b + c,
    "v_max3_f32": lambda a, b, c: np.fmax(np.fmax(a, b), c),
    "v_min3_f32": lambda a, b, c: np.fmin(np.fmin(a, b), c),
    "v_med3_f32": lambda a, b, c: np.median(np.stack(np.broadcast_arrays(a, b, c)), 0).astype(np.float32),
}


def _omod(inst: Inst) -> Callable[[np.ndarray], np.ndarray]:
    clamp = "clamp" in inst.modifiers
    mul = {"mul:2": 2.0, "mul:4": 4.0, "div:2": 0.5}
    factor = 1.0
    for k, v in inst.modifiers.items():
        factor = mul.get(f"{k}:{v}", factor)
    f32 = np.float32(factor)

    def post(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if factor != 1.0:
            x = x * f32
        if clamp:
            x = np.clip(x, np.float32(0.0), np.float32(1.0))
        return x

    return post


def _bind_f(inst: Inst, ctx: BindContext, fn: Callable[..., np.ndarray], nsrc: int) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    srcs = [fsrc(o, ctx, inst) for o in inst.operands[1 : 1 + nsrc]]
    post = _omod(inst)

    def step(w: Wave) -> None:
        with np.errstate(all="ignore"):
            r = post(fn(*(s(w) for s in srcs)))
        dst(w, np.asarray(r, np.float32).view(U32))

    return step


for _tab, _n in ((_F1, 1), (_F2, 2), (_F3, 3)):
    for _name, _fn in _tab.items():
        op(_name, _name + "_e32", _name + "_e64")((lambda fn, n: lambda inst, ctx: _bind_f(inst, ctx, fn, n))(_fn, _n))


# -- DPP (VOP1/VOP2 with a lane-permuted src0) ------------------------------------------------


def _dpp_lanes(inst: Inst, ctx: BindContext) -> tuple[np.ndarray, np.ndarray]:
    """(the lane each lane's src0 is read from, which lanes are written) of a DPP instruction.

    Controls (AMD CDNA3 ISA, "Data Parallel Processing"; LLVM ``SIDefines.h`` ``DppCtrl``):
    ``quad_perm:[a,b,c,d]`` reads lane ``4 * (l // 4) + perm[l % 4]``; ``row_newbcast:n`` (gfx90a+,
    encoding 0x150 + n, the control GFX10+ calls ``row_share``) reads lane ``n`` of the lane's 16-lane
    row. ``row_mask`` bit r enables row r (lanes 16r..16r+15), ``bank_mask`` bit b lanes
    ``l % 16 // 4 == b`` of every row; disabled lanes keep their value. Others are not emulated.
    """
    lane = np.arange(LANES)
    m = inst.modifiers
    if "row_newbcast" in m:
        src = (lane & ~15) + int(m["row_newbcast"], 0)
    elif "quad_perm" in m:
        perm = np.array(inst.mod_list("quad_perm", 4))
        src = (lane & ~3) + perm[lane & 3]
    else:
        raise EmulatorError(f"{ctx.kernel}: DPP control of {inst.text!r} at 0x{inst.address:x} is not emulated")
    row_mask, bank_mask = inst.mod_int("row_mask", 0xF), inst.mod_int("bank_mask", 0xF)
    enabled = (((row_mask >> (lane // 16)) & 1) & ((bank_mask >> (lane % 16 // 4)) & 1)).astype(bool)
    return src, enabled


def _bind_f_dpp(inst: Inst, ctx: BindContext, fn: Callable[..., np.ndarray], nsrc: int) -> Step:
    """An f32 VOP1/VOP2 op in DPP form: src0 (a VGPR) is read from the lane ``_dpp_lanes`` gives."""
    d, s0 = inst.operands[0], inst.operands[1]
    if s0.kind != "v":
        raise EmulatorError(f"{ctx.kernel}: DPP src0 must be a VGPR: {inst.text!r}")
    src, enabled = _dpp_lanes(inst, ctx)
    dst = vwriter(d, ctx, inst)
    raw0 = vreader(replace(s0, neg=False, abs=False), ctx, inst)
    rest = [fsrc(o, ctx, inst) for o in inst.operands[2 : 1 + nsrc]]
    neg, ab = s0.neg, s0.abs

    def step(w: Wave) -> None:
        if not w.exec_mask[src[enabled & w.exec_mask]].all():
            raise EmulatorError(f"{ctx.kernel}: {inst.text!r} at 0x{inst.address:x} reads a lane EXEC disables")
        x = np.asarray(raw0(w), U32)[src].view(np.float32)
        x = np.abs(x) if ab else x
        x = -x if neg else x
        with np.errstate(all="ignore"):
            r = np.asarray(fn(x, *(f(w) for f in rest)), np.float32).view(U32)
        dst(w, np.where(enabled, r, (w.a if d.kind == "a" else w.v)[d.index]))

    return step


for _tab, _n in ((_F1, 1), (_F2, 2)):
    for _name, _fn in _tab.items():
        op(_name + "_dpp")((lambda fn, n: lambda inst, ctx: _bind_f_dpp(inst, ctx, fn, n))(_fn, _n))


@op("v_fmac_f32", "v_fmac_f32_e32", "v_fmac_f32_e64", "v_mac_f32", "v_mac_f32_e32", "v_mac_f32_e64")
def _fmac(inst: Inst, ctx: BindContext) -> Step:
    d = inst.operands[0]
    dst = vwriter(d, ctx, inst)
    a, b = (fsrc(o, ctx, inst) for o in inst.operands[1:3])
    c = fsrc(d, ctx, inst)
    post = _omod(inst)

    def step(w: Wave) -> None:
        with np.errstate(all="ignore"):
            r = post((a(w).astype(np.float64) * b(w) + c(w)).astype(np.float32))
        dst(w, r.view(U32))

    return step


# -- packed f32 (gfx940+): two f32 lanes in a VGPR pair -------------------------------------------


def _pk_f32(inst: Inst, ctx: BindContext, nsrc: int, fn: Callable[..., np.ndarray]) -> Step:
    d = inst.operands[0]
    srcs = inst.operands[1 : 1 + nsrc]
    op_sel = inst.mod_list("op_sel", nsrc, 0)
    op_sel_hi = inst.mod_list("op_sel_hi", nsrc, 1)
    neg_lo = inst.mod_list("neg_lo", nsrc, 0)
    neg_hi = inst.mod_list("neg_hi", nsrc, 0)
    readers = []
    for i, o in enumerate(srcs):
        if o.kind in ("v", "a", "s"):  # a 64-bit pair: op_sel / op_sel_hi pick the dword of each half
            lo = vreader(replace(o, index=o.index + op_sel[i], count=1), ctx, inst)
            hi = vreader(replace(o, index=o.index + op_sel_hi[i], count=1), ctx, inst)
        else:
            lo = hi = vreader(o, ctx, inst)
        readers.append((lo, hi, neg_lo[i], neg_hi[i]))
    dlo = vwriter(d, ctx, inst)
    dhi = vwriter(replace(d, index=d.index + 1, count=1), ctx, inst)

    def step(w: Wave) -> None:
        los, his = [], []
        for lo, hi, nl, nh in readers:
            x, y = as_f32(lo(w)), as_f32(hi(w))
            los.append(-x if nl else x)
            his.append(-y if nh else y)
        with np.errstate(all="ignore"):
            rlo, rhi = fn(*los), fn(*his)
        dlo(w, np.asarray(rlo, np.float32).view(U32))
        dhi(w, np.asarray(rhi, np.float32).view(U32))

    return step


op("v_pk_add_f32")(lambda inst, ctx: _pk_f32(inst, ctx, 2, lambda a, b: a + b))
op("v_pk_mul_f32")(lambda inst, ctx: _pk_f32(inst, ctx, 2, lambda a, b: a * b))
op("v_pk_fma_f32")(
    lambda inst, ctx: _pk_f32(inst, ctx, 3, lambda a, b, c: (a.astype(np.float64) * b + c).astype(np.float32))
)


@op("v_pk_mov_b32")
def _pk_mov(inst: Inst, ctx: BindContext) -> Step:
    """dst.lo = src0[op_sel[0]], dst.hi = src1[op_sel[1]] (each source a 64-bit pair)."""
    d, s0, s1 = inst.operands[:3]
    sel = inst.mod_list("op_sel", 2, 0)

    def part(o: Operand, i: int) -> Callable[[Wave], Any]:
        return vreader(replace(o, index=o.index + i, count=1) if o.kind in ("v", "a", "s") else o, ctx, inst)

    lo, hi = part(s0, sel[0]), part(s1, sel[1])
    dlo = vwriter(d, ctx, inst)
    dhi = vwriter(replace(d, index=d.index + 1, count=1), ctx, inst)

    def step(w: Wave) -> None:
        x, y = lo(w), hi(w)
        dlo(w, x)
        dhi(w, y)

    return step


# -- 64-bit integer ---------------------------------------------------------------------------


@op("v_lshl_add_u64")
def _lshl_add_u64(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst, "b64")
    a = vreader(inst.operands[1], ctx, inst, "b64")
    b = vreader(inst.operands[2], ctx, inst)
    c = vreader(inst.operands[3], ctx, inst, "b64")
    return lambda w: dst(w, (np.asarray(a(w), np.uint64) << (np.asarray(b(w), np.uint64) & np.uint64(7))) + c(w))


@op("v_lshlrev_b64", "v_lshrrev_b64", "v_ashrrev_i64")
def _shift64(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst, "b64")
    sh = vreader(inst.operands[1], ctx, inst)
    val = vreader(inst.operands[2], ctx, inst, "b64")
    name = inst.opcode

    def step(w: Wave) -> None:
        s = np.asarray(sh(w), np.uint64) & np.uint64(63)
        v = np.asarray(val(w), np.uint64)
        if name == "v_lshlrev_b64":
            r = v << s
        elif name == "v_lshrrev_b64":
            r = v >> s
        else:
            r = (v.view(np.int64) >> s.astype(np.int64)).view(np.uint64)
        dst(w, r)

    return step


@op("v_mad_u64_u32", "v_mad_i64_i32")
def _mad64(inst: Inst, ctx: BindContext) -> Step:
    d, sd, a_o, b_o, c_o = inst.operands[:5]
    dst = vwriter(d, ctx, inst, "b64")
    carry = swriter(sd, "b64") if sd.kind == "s" else None
    a, b = vreader(a_o, ctx, inst), vreader(b_o, ctx, inst)
    c = vreader(c_o, ctx, inst, "b64")
    signed = inst.opcode == "v_mad_i64_i32"

    def step(w: Wave) -> None:
        if signed:
            prod = _i32(a(w)).astype(np.int64) * _i32(b(w)).astype(np.int64)
            r = prod.view(np.uint64) + np.asarray(c(w), np.uint64)
            over = np.zeros(LANES, bool)
        else:
            prod = np.asarray(a(w), np.uint64) * np.asarray(b(w), np.uint64)
            r = prod + np.asarray(c(w), np.uint64)
            over = np.broadcast_to(r < prod, (LANES,))
        dst(w, r)
        if carry is not None:
            carry(w, mask_to_bits(over & w.exec_mask))

    return step


# -- carry chains -------------------------------------------------------------------------------


@op(
    *(
        f"{n}{s}"
        for n in (
            "v_add_co_u32",
            "v_sub_co_u32",
            "v_subrev_co_u32",
            "v_addc_co_u32",
            "v_subb_co_u32",
            "v_subbrev_co_u32",
        )
        for s in ("", "_e32", "_e64")
    )
)
def _addco(inst: Inst, ctx: BindContext) -> Step:
    name = base_opcode(inst.opcode)
    # operands (e32 and e64 alike): dst, carry-out mask, src0, src1[, carry-in mask]
    first, cin_idx = 2, (4 if name in ("v_addc_co_u32", "v_subb_co_u32", "v_subbrev_co_u32") else None)
    dst = vwriter(inst.operands[0], ctx, inst)
    cout = inst.operands[1]
    a, b = vreader(inst.operands[first], ctx, inst), vreader(inst.operands[first + 1], ctx, inst)
    cin = bitmask_reader(inst.operands[cin_idx]) if cin_idx is not None else None
    cw = swriter(cout, "b64")

    def step(w: Wave) -> None:
        x = np.asarray(a(w), np.int64)
        y = np.asarray(b(w), np.int64)
        ci = cin(w).astype(np.int64) if cin is not None else 0
        if name in ("v_add_co_u32", "v_addc_co_u32"):
            r = x + y + ci
            co = r > 0xFFFFFFFF
        elif name in ("v_sub_co_u32", "v_subb_co_u32"):
            r = x - y - ci
            co = r < 0
        else:
            r = y - x - ci
            co = r < 0
        dst(w, (r & 0xFFFFFFFF).astype(U32))
        cw(w, mask_to_bits(np.broadcast_to(co, (LANES,)) & w.exec_mask))

    return step


# -- compares and selects ---------------------------------------------------------------------------

_CMP = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lg": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _write_compare(w: Wave, bits: Any, is_x: bool, dst: Any) -> None:
    """Where a vector compare's lane mask goes: EXEC for v_cmpx, the named SGPR pair when the
    encoding has one (VOP3), else VCC (VOP3 v_cmpx with no SDST writes EXEC only)."""
    if is_x:
        w.set_exec(bits)
    if dst is not None:
        dst(w, bits)
    elif not is_x:
        w.set_vcc(bits)


def _cmp_binder(inst: Inst, ctx: BindContext) -> Step:
    name = base_opcode(inst.opcode)
    parts = name.split("_")  # v, cmp|cmpx, kind, type
    is_x = parts[1] == "cmpx"
    kind, typ = parts[2], parts[3]
    e64 = inst.opcode.endswith("_e64")
    ops = inst.operands
    if (e64 and not is_x) or len(ops) == 3:
        sdst, s0, s1 = ops[0], ops[1], ops[2]
    else:
        sdst, s0, s1 = None, ops[0], ops[1]
    if typ == "f32":
        ra, rb = fsrc(s0, ctx, inst), fsrc(s1, ctx, inst)
    else:
        ra, rb = vreader(s0, ctx, inst), vreader(s1, ctx, inst)
    conv: Callable[[Any], Any] = (lambda x: _i32(x)) if typ == "i32" else (lambda x: np.asarray(x))
    if kind in ("t", "tru"):
        fn: Callable[[Any, Any], Any] = lambda x, y: np.ones(LANES, bool)  # noqa: E731
    elif kind in ("f",):
        fn = lambda x, y: np.zeros(LANES, bool)  # noqa: E731
    elif kind == "u":
        fn = lambda x, y: np.isnan(x) | np.isnan(y)  # noqa: E731
    elif kind == "o":
        fn = lambda x, y: ~(np.isnan(x) | np.isnan(y))  # noqa: E731
    elif kind.startswith("n") and typ == "f32" and kind[1:] in _CMP:
        base = _CMP[kind[1:]]
        fn = lambda x, y: ~base(x, y)  # noqa: E731
    elif kind in _CMP:
        fn = _CMP[kind]
    else:
        raise EmulatorError(f"{ctx.kernel}: unknown compare {inst.opcode} at 0x{inst.address:x}")
    dst = swriter(sdst, "b64") if sdst is not None else None

    def step(w: Wave) -> None:
        with np.errstate(invalid="ignore"):
            m = np.broadcast_to(fn(conv(ra(w)), conv(rb(w))), (LANES,)) & w.exec_mask
        _write_compare(w, mask_to_bits(m), is_x, dst)

    return step


for _k in ("eq", "ne", "lg", "lt", "le", "gt", "ge", "t", "f", "u", "o", "neq", "nlt", "nle", "ngt", "nge", "nlg"):
    for _t in ("i32", "u32", "f32"):
        for _x in ("cmp", "cmpx"):
            for _s in ("", "_e32", "_e64"):
                op(f"v_{_x}_{_k}_{_t}{_s}")(_cmp_binder)


@op("v_cndmask_b32", "v_cndmask_b32_e32", "v_cndmask_b32_e64")
def _cndmask(inst: Inst, ctx: BindContext) -> Step:
    ops = inst.operands
    dst = vwriter(ops[0], ctx, inst)
    a, b = vreader(ops[1], ctx, inst), vreader(ops[2], ctx, inst)
    sel = bitmask_reader(ops[3] if len(ops) > 3 else Operand("s", VCC, 2))
    neg_or_abs = any(o.neg or o.abs for o in ops[1:3])
    if neg_or_abs:
        fa, fb = fsrc(ops[1], ctx, inst), fsrc(ops[2], ctx, inst)
        return lambda w: dst(w, np.where(sel(w), fb(w), fa(w)).astype(np.float32).view(U32))
    return lambda w: dst(w, np.where(sel(w), b(w), a(w)).astype(U32))


# -- lane ops ----------------------------------------------------------------------------------


@op("v_readfirstlane_b32", "v_readfirstlane_b32_e32")
def _readfirstlane(inst: Inst, ctx: BindContext) -> Step:
    dst = swriter(inst.operands[0])
    src = vreader(inst.operands[1], ctx, inst)

    def step(w: Wave) -> None:
        lanes = np.flatnonzero(w.exec_mask)
        v = np.broadcast_to(src(w), (LANES,))
        dst(w, int(v[lanes[0] if lanes.size else 0]))

    return step


@op("v_readlane_b32")
def _readlane(inst: Inst, ctx: BindContext) -> Step:
    dst = swriter(inst.operands[0])
    src = vreader(inst.operands[1], ctx, inst)
    lane = sreader(inst.operands[2])
    return lambda w: dst(w, int(np.broadcast_to(src(w), (LANES,))[lane(w) & 63]))


@op("v_writelane_b32")
def _writelane(inst: Inst, ctx: BindContext) -> Step:
    d = inst.operands[0]
    val = sreader(inst.operands[1])
    lane = sreader(inst.operands[2])

    def step(w: Wave) -> None:
        w.v[d.index, lane(w) & 63] = val(w)

    return step


@op("v_mbcnt_lo_u32_b32", "v_mbcnt_lo_u32_b32_e64", "v_mbcnt_hi_u32_b32", "v_mbcnt_hi_u32_b32_e64")
def _mbcnt(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    mask, acc = vreader(inst.operands[1], ctx, inst), vreader(inst.operands[2], ctx, inst)
    hi = "_hi_" in inst.opcode
    lanes = np.arange(LANES)
    if hi:
        below = [((1 << (i - 32)) - 1) if i >= 32 else 0 for i in lanes]
    else:
        below = [((1 << i) - 1) if i < 32 else 0xFFFFFFFF for i in lanes]
    below_arr = np.array(below, np.uint64)

    def step(w: Wave) -> None:
        m = np.asarray(mask(w), np.uint64) & below_arr
        cnt = np.bitwise_count(m).astype(U32)
        dst(w, cnt + np.asarray(acc(w), U32))

    return step


@op("v_permlane16_swap_b32", "v_permlane32_swap_b32", "v_permlane16_swap_b32_e32", "v_permlane32_swap_b32_e32")
def _permlane_swap(inst: Inst, ctx: BindContext) -> Step:
    """gfx950: swap the odd rows of vdst with the even rows of vsrc (rows of 16 or 32 lanes)."""
    d, s = inst.operands[0], inst.operands[1]
    size = 16 if "16" in inst.opcode else 32
    lanes = np.arange(LANES)
    odd = (lanes // size) % 2 == 1

    def step(w: Wave) -> None:
        vd, vs = w.v[d.index].copy(), w.v[s.index].copy()
        # lane i (odd row) of vdst <-> lane i - size (even row) of vsrc
        new_d, new_s = vd.copy(), vs.copy()
        new_d[odd] = vs[lanes[odd] - size]
        new_s[lanes[odd] - size] = vd[odd]
        w.vwrite(w.v, d.index, new_d)
        w.vwrite(w.v, s.index, new_s)

    return step


def _fp_class(x: np.ndarray) -> np.ndarray:
    """The class bit (0..9, as v_cmp_class numbers them) of each f32 value, as a one-hot mask."""
    u = np.asarray(x, np.float32).view(U32)
    neg = (u >> U32(31)) == 1
    exp = (u >> U32(23)) & U32(0xFF)
    man = u & U32(0x7FFFFF)
    nan = (exp == 0xFF) & (man != 0)
    cls = np.select(
        [
            nan & ((man >> U32(22)) == 0),
            nan,
            (exp == 0xFF) & neg,
            (exp == 0xFF),
            (exp == 0) & (man == 0) & neg,
            (exp == 0) & (man == 0),
            (exp == 0) & neg,
            (exp == 0),
            neg,
        ],
        [0, 1, 2, 9, 5, 6, 4, 7, 3],
        default=8,
    )
    return (U32(1) << cls.astype(U32)).astype(U32)


@op(*(f"v_{x}_class_f32{s}" for x in ("cmp", "cmpx") for s in ("", "_e32", "_e64")))
def _cmp_class(inst: Inst, ctx: BindContext) -> Step:
    """Lane bit = the class of S0 (signaling/quiet NaN, -inf, -normal, -denorm, -0, +0, +denorm,
    +normal, +inf: bits 0-9) is one of those set in S1."""
    ops = inst.operands
    is_x = "cmpx" in inst.opcode
    sdst, s0, s1 = (ops[0], ops[1], ops[2]) if len(ops) == 3 else (None, ops[0], ops[1])
    a, b = vreader(s0, ctx, inst), vreader(s1, ctx, inst)
    dst = swriter(sdst, "b64") if sdst is not None else None

    def step(w: Wave) -> None:
        hit = (_fp_class(as_f32(np.broadcast_to(a(w), (LANES,)))) & np.asarray(b(w), U32)) != 0
        _write_compare(w, mask_to_bits(hit & w.exec_mask), is_x, dst)

    return step


# -- f32 division: v_div_scale -> Newton-Raphson -> v_div_fmas -> v_div_fixup --------------------
# The extreme-range rescaling of v_div_scale (operands whose quotient or reciprocal would be
# denormal or overflow) is not modelled: it never scales and never sets VCC; v_div_fixup returns the
# IEEE quotient S2 / S1, which is what the whole sequence computes (correctly rounded, denormals
# and special values included).


@op("v_div_scale_f32")
def _div_scale(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    vcc = swriter(inst.operands[1], "b64")
    s0 = fsrc(inst.operands[2], ctx, inst)

    def step(w: Wave) -> None:
        dst(w, np.asarray(s0(w), np.float32).view(U32))
        vcc(w, 0)

    return step


@op("v_div_fmas_f32")
def _div_fmas(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    a, b, c = (fsrc(o, ctx, inst) for o in inst.operands[1:4])

    def step(w: Wave) -> None:
        with np.errstate(all="ignore"):
            r = (np.asarray(a(w), np.float64) * b(w) + c(w)).astype(np.float32)
        dst(w, r.view(U32))

    return step


@op("v_div_fixup_f32")
def _div_fixup(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    den, num = fsrc(inst.operands[2], ctx, inst), fsrc(inst.operands[3], ctx, inst)

    def step(w: Wave) -> None:
        with np.errstate(all="ignore"):
            r = np.asarray(num(w), np.float32) / np.asarray(den(w), np.float32)
        dst(w, np.asarray(r, np.float32).view(U32))

    return step


# -- packed f16: two halves of one VGPR ---------------------------------------------------------


def _pk_f16(inst: Inst, ctx: BindContext, nsrc: int, fn: Callable[..., np.ndarray]) -> Step:
    """``op_sel[i]`` / ``op_sel_hi[i]`` pick which half of source i feeds the low / high result;
    ``neg_lo`` / ``neg_hi`` negate it; ``clamp`` clamps to [0, 1]."""
    from .numerics import f16_to_f32

    srcs = [vreader(o, ctx, inst, "f16") for o in inst.operands[1 : 1 + nsrc]]
    sel, sel_hi = inst.mod_list("op_sel", nsrc, 0), inst.mod_list("op_sel_hi", nsrc, 1)
    neg_lo, neg_hi = inst.mod_list("neg_lo", nsrc, 0), inst.mod_list("neg_hi", nsrc, 0)
    dst = vwriter(inst.operands[0], ctx, inst)
    clamp = "clamp" in inst.modifiers

    def half(x: np.ndarray, hi: int, neg: int) -> np.ndarray:
        v = f16_to_f32((np.asarray(x, U32) >> U32(16 * hi)) & U32(0xFFFF)).astype(np.float64)
        return -v if neg else v

    def step(w: Wave) -> None:
        vals = [s(w) for s in srcs]
        with np.errstate(all="ignore"):
            lo = fn(*(half(v, sel[i], neg_lo[i]) for i, v in enumerate(vals)))
            hi = fn(*(half(v, sel_hi[i], neg_hi[i]) for i, v in enumerate(vals)))
        if clamp:
            lo, hi = np.clip(lo, 0, 1), np.clip(hi, 0, 1)
        # in float64 the sum/product/fma of f16 values is exact (or nearly): one rounding, to f16
        dst(w, _f64_to_f16_bits(lo) | (_f64_to_f16_bits(hi) << U32(16)))

    return step


op("v_pk_add_f16")(lambda inst, ctx: _pk_f16(inst, ctx, 2, lambda a, b: a + b))
op("v_pk_mul_f16")(lambda inst, ctx: _pk_f16(inst, ctx, 2, lambda a, b: a * b))
op("v_pk_max_f16")(lambda inst, ctx: _pk_f16(inst, ctx, 2, np.fmax))
op("v_pk_min_f16")(lambda inst, ctx: _pk_f16(inst, ctx, 2, np.fmin))
op("v_pk_fma_f16")(lambda inst, ctx: _pk_f16(inst, ctx, 3, lambda a, b, c: a * b + c))


def _f64_to_f16_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float16).view(np.uint16).astype(U32)


@op("v_mov_b64", "v_mov_b64_e32", "v_mov_b64_e64")
def _mov_b64(inst: Inst, ctx: BindContext) -> Step:
    """gfx940+: a 64-bit move (a VGPR pair, an SGPR pair or a 64-bit constant)."""
    dst = vwriter(inst.operands[0], ctx, inst, "b64")
    src = vreader(inst.operands[1], ctx, inst, "b64")
    return lambda w: dst(w, src(w))
