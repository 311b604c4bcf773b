"""Conversions between f32 and the narrow formats: bf16, f16, FP8 (E4M3) and BF8 (E5M2).

Rounding is to nearest even. The FP8/BF8 packing instructions saturate to the largest normal when
``clamp`` is set; otherwise out-of-range values become NaN (E4M3, which has no Inf) or Inf (E5M2),
the OCP rule for non-saturating conversion. ``op_sel`` picks which half (packs) or byte (unpacks)
of the 32-bit register is used; the other bits of the destination are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from .bind import BindContext, Step, fsrc, op, vreader, vwriter
from .decode import Inst
from .errors import EmulatorError
from .machine import Wave
from .numerics import E4M3, E5M2, MiniFloat, bf16_to_f32, decode_table, encode, f16_to_f32, f32_to_bf16, f32_to_f16

U32 = np.uint32


@op("v_cvt_pk_bf16_f32", "v_cvt_pk_bf16_f32_e64")
def _pk_bf16(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    a, b = fsrc(inst.operands[1], ctx, inst), fsrc(inst.operands[2], ctx, inst)
    return lambda w: dst(w, f32_to_bf16(a(w)) | (f32_to_bf16(b(w)) << U32(16)))


@op("v_cvt_pk_f16_f32", "v_cvt_pk_f16_f32_e64")
def _pk_f16(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    a, b = fsrc(inst.operands[1], ctx, inst), fsrc(inst.operands[2], ctx, inst)
    return lambda w: dst(w, f32_to_f16(a(w)) | (f32_to_f16(b(w)) << U32(16)))


@op("v_cvt_pkrtz_f16_f32", "v_cvt_pkrtz_f16_f32_e32", "v_cvt_pkrtz_f16_f32_e64")
def _pkrtz(inst: Inst, ctx: BindContext) -> Step:
    """Pack two f32 as f16 rounding toward zero (truncate the f32 first to f16 precision)."""
    dst = vwriter(inst.operands[0], ctx, inst)
    a, b = fsrc(inst.operands[1], ctx, inst), fsrc(inst.operands[2], ctx, inst)

    def rtz(x: np.ndarray) -> np.ndarray:
        h = f32_to_f16(x)
        back = f16_to_f32(h)
        with np.errstate(invalid="ignore"):
            too_far = np.isfinite(x) & (np.abs(back) > np.abs(x))
        return np.where(too_far, h - U32(1), h).astype(U32) & U32(0xFFFF)

    return lambda w: dst(w, rtz(a(w)) | (rtz(b(w)) << U32(16)))


def _half_sel(inst: Inst, nsrc: int) -> tuple[list[int], int]:
    sel = inst.mod_list("op_sel", nsrc + 1, 0)
    return sel[:nsrc], sel[nsrc]


@op("v_cvt_f32_f16", "v_cvt_f32_f16_e32", "v_cvt_f32_f16_e64", "v_cvt_f32_f16_sdwa")
def _f16_to_f32(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    src = vreader(inst.operands[1], ctx, inst)
    if inst.modifiers.get("dst_sel", "DWORD") != "DWORD":
        raise EmulatorError(f"{inst.text}: only dst_sel:DWORD is modelled")
    # the half: op_sel[0] (VOP3) or src0_sel:WORD_1 (SDWA, what LLVM emits for a packed pair's high half)
    hi = _half_sel(inst, 1)[0][0] or inst.modifiers.get("src0_sel", "") == "WORD_1"
    neg, ab = inst.operands[1].neg, inst.operands[1].abs

    def step(w: Wave) -> None:
        x = f16_to_f32((np.asarray(src(w), U32) >> U32(16 * hi)) & U32(0xFFFF))
        x = np.abs(x) if ab else x
        dst(w, (-x if neg else x).view(U32))

    return step


@op("v_cvt_f32_bf16", "v_cvt_f32_bf16_e32", "v_cvt_f32_bf16_e64")
def _bf16_to_f32(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    src = vreader(inst.operands[1], ctx, inst)
    hi = _half_sel(inst, 1)[0][0]
    return lambda w: dst(w, bf16_to_f32((np.asarray(src(w), U32) >> U32(16 * hi)) & U32(0xFFFF)).view(U32))


@op("v_cvt_f16_f32", "v_cvt_f16_f32_e32", "v_cvt_f16_f32_e64")
def _f32_to_f16(inst: Inst, ctx: BindContext) -> Step:
    d = inst.operands[0]
    dst, cur = vwriter(d, ctx, inst), vreader(d, ctx, inst)
    src = fsrc(inst.operands[1], ctx, inst)
    hi = _half_sel(inst, 1)[1]

    def step(w: Wave) -> None:
        h = f32_to_f16(src(w))
        if hi:
            dst(w, (np.asarray(cur(w), U32) & U32(0xFFFF)) | (h << U32(16)))
        else:
            dst(w, h)  # the f16 result zeroes the high half unless op_sel writes it

    return step


def _pk_fp8(inst: Inst, ctx: BindContext, fmt: MiniFloat) -> Step:
    d = inst.operands[0]
    dst, cur = vwriter(d, ctx, inst), vreader(d, ctx, inst)
    a, b = fsrc(inst.operands[1], ctx, inst), fsrc(inst.operands[2], ctx, inst)
    hi = _half_sel(inst, 2)[1]
    sat = "clamp" in inst.modifiers

    def step(w: Wave) -> None:
        lo8 = encode(fmt, a(w), sat).astype(U32)
        hi8 = encode(fmt, b(w), sat).astype(U32)
        word = lo8 | (hi8 << U32(8))
        old = np.asarray(cur(w), U32)
        if hi:
            dst(w, (old & U32(0xFFFF)) | (word << U32(16)))
        else:
            dst(w, (old & U32(0xFFFF0000)) | word)

    return step


op("v_cvt_pk_fp8_f32", "v_cvt_pk_fp8_f32_e64")(lambda inst, ctx: _pk_fp8(inst, ctx, E4M3))
op("v_cvt_pk_bf8_f32", "v_cvt_pk_bf8_f32_e64")(lambda inst, ctx: _pk_fp8(inst, ctx, E5M2))


def _unpack_fp8(inst: Inst, ctx: BindContext, fmt: MiniFloat, packed: bool) -> Step:
    d = inst.operands[0]
    src = vreader(inst.operands[1], ctx, inst)
    sel = inst.mod_list("op_sel", 2, 0)
    table = decode_table(fmt)
    sdwa = inst.modifiers.get("src0_sel", "")
    if packed:  # the word: op_sel[0] (VOP3) or src0_sel:WORD_1 (SDWA, what LLVM emits)
        shift = 16 * (sel[0] or sdwa == "WORD_1")
        lo, hi = vwriter(d, ctx, inst), vwriter(replace(d, index=d.index + 1, count=1), ctx, inst)

        def pstep(w: Wave) -> None:
            word = np.asarray(src(w), U32) >> U32(shift)
            lo(w, table[word & U32(0xFF)].view(U32))
            hi(w, table[(word >> U32(8)) & U32(0xFF)].view(U32))

        return pstep
    # the byte: src0_sel:BYTE_n (SDWA, what LLVM emits for a constant byte select) or op_sel (VOP3)
    byte = int(sdwa[-1]) if sdwa.startswith("BYTE_") else sel[0] | (sel[1] << 1)
    dst = vwriter(d, ctx, inst)
    return lambda w: dst(w, table[(np.asarray(src(w), U32) >> U32(8 * byte)) & U32(0xFF)].view(U32))


for _suf in ("", "_e32", "_e64", "_sdwa"):
    op(f"v_cvt_f32_fp8{_suf}")(lambda inst, ctx: _unpack_fp8(inst, ctx, E4M3, False))
    op(f"v_cvt_f32_bf8{_suf}")(lambda inst, ctx: _unpack_fp8(inst, ctx, E5M2, False))
    op(f"v_cvt_pk_f32_fp8{_suf}")(lambda inst, ctx: _unpack_fp8(inst, ctx, E4M3, True))
    op(f"v_cvt_pk_f32_bf8{_suf}")(lambda inst, ctx: _unpack_fp8(inst, ctx, E5M2, True))


@op("v_fma_mix_f32", "v_mad_mix_f32")
def _fma_mix(inst: Inst, ctx: BindContext) -> Step:
    """f32 = a * b + c where each source is f32, or f16 (``op_sel_hi[i]``) from the half ``op_sel[i]``."""
    srcs = inst.operands[1:4]
    sel, hi = inst.mod_list("op_sel", 3, 0), inst.mod_list("op_sel_hi", 3, 0)
    readers = []
    for j, o in enumerate(srcs):
        raw = vreader(o, ctx, inst, "f16" if hi[j] else "f32")
        readers.append((raw, bool(hi[j]), 16 * sel[j], o.neg, o.abs))
    dst = vwriter(inst.operands[0], ctx, inst)
    clamp = "clamp" in inst.modifiers

    def val(w: Wave, raw: Callable[[Wave], Any], is_f16: bool, shift: int, neg: bool, ab: bool) -> np.ndarray:
        x = np.asarray(raw(w), U32)
        f = f16_to_f32((x >> U32(shift)) & U32(0xFFFF)) if is_f16 else x.view(np.float32)
        f = np.abs(f) if ab else f
        return -f if neg else f

    def step(w: Wave) -> None:
        a, b, c = (val(w, *r) for r in readers)
        with np.errstate(all="ignore"):
            r = (a.astype(np.float64) * b + c).astype(np.float32)
        if clamp:
            r = np.clip(r, np.float32(0), np.float32(1))
        dst(w, np.asarray(r, np.float32).view(U32))

    return step
