"""Scalar ALU, scalar memory and program control: SOP1/SOP2/SOPC/SOPK/SOPP and SMEM.

Scalar values are Python integers (unsigned 32/64-bit). SCC follows the ISA reference: carry out
for unsigned add/sub, signed overflow for the ``_i32`` add/sub, "result is non-zero" for bitwise
and shift ops, the comparison result for ``s_cmp*``.
"""

from __future__ import annotations

from collections.abc import Callable

from .bind import BindContext, Step, op, sreader, swriter
from .decode import EXEC, Inst
from .errors import EmulatorError
from .machine import Wave

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
# Taken backward branches one wave may execute before the emulator calls the kernel a runaway
# (a GEMM tile's K loop takes a few hundred; a kernel bug can loop forever).
MAX_BACK_BRANCHES = 5_000_000


def _s32(x: int) -> int:
    x &= M32
    return x - (1 << 32) if x & 0x80000000 else x


def _s64(x: int) -> int:
    x &= M64
    return x - (1 << 64) if x >> 63 else x


# opcode -> (width, fn(a, b) -> (result, scc or None to leave SCC alone))
_SOP2: dict[str, tuple[str, Callable[[int, int], tuple[int, int | None]]]] = {
    "s_add_u32": ("b32", lambda a, b: ((a + b) & M32, int(a + b > M32))),
    "s_sub_u32": ("b32", lambda a, b: ((a - b) & M32, int(b > a))),
    "s_add_i32": (
        "b32",
        lambda a, b: ((a + b) & M32, int(not -(1 << 31) <= _s32(a) + _s32(b) < (1 << 31))),
    ),
    "s_sub_i32": (
        "b32",
        lambda a, b: ((a - b) & M32, int(not -(1 << 31) <= _s32(a) - _s32(b) < (1 << 31))),
    ),
    "s_mul_i32": ("b32", lambda a, b: ((_s32(a) * _s32(b)) & M32, None)),
    "s_mul_hi_u32": ("b32", lambda a, b: ((a * b) >> 32, None)),
    "s_mul_hi_i32": ("b32", lambda a, b: (((_s32(a) * _s32(b)) >> 32) & M32, None)),
    "s_and_b32": ("b32", lambda a, b: (a & b, int(a & b != 0))),
    "s_or_b32": ("b32", lambda a, b: (a | b, int(a | b != 0))),
    "s_xor_b32": ("b32", lambda a, b: (a ^ b, int(a ^ b != 0))),
    "s_andn2_b32": ("b32", lambda a, b: (a & ~b & M32, int(a & ~b & M32 != 0))),
    "s_orn2_b32": ("b32", lambda a, b: ((a | ~b) & M32, int((a | ~b) & M32 != 0))),
    "s_nand_b32": ("b32", lambda a, b: (~(a & b) & M32, int(~(a & b) & M32 != 0))),
    "s_nor_b32": ("b32", lambda a, b: (~(a | b) & M32, int(~(a | b) & M32 != 0))),
    "s_xnor_b32": ("b32", lambda a, b: (~(a ^ b) & M32, int(~(a ^ b) & M32 != 0))),
    "s_and_b64": ("b64", lambda a, b: (a & b, int(a & b != 0))),
    "s_or_b64": ("b64", lambda a, b: (a | b, int(a | b != 0))),
    "s_xor_b64": ("b64", lambda a, b: (a ^ b, int(a ^ b != 0))),
    "s_andn2_b64": ("b64", lambda a, b: (a & ~b & M64, int(a & ~b & M64 != 0))),
    "s_orn2_b64": ("b64", lambda a, b: ((a | ~b) & M64, int((a | ~b) & M64 != 0))),
    "s_nand_b64": ("b64", lambda a, b: (~(a & b) & M64, int(~(a & b) & M64 != 0))),
    "s_nor_b64": ("b64", lambda a, b: (~(a | b) & M64, int(~(a | b) & M64 != 0))),
    "s_xnor_b64": ("b64", lambda a, b: (~(a ^ b) & M64, int(~(a ^ b) & M64 != 0))),
    "s_lshl_b32": ("b32", lambda a, b: ((a << (b & 31)) & M32, int((a << (b & 31)) & M32 != 0))),
    "s_lshr_b32": ("b32", lambda a, b: (a >> (b & 31), int(a >> (b & 31) != 0))),
    "s_ashr_i32": ("b32", lambda a, b: ((_s32(a) >> (b & 31)) & M32, int(_s32(a) >> (b & 31) != 0))),
    "s_lshl_b64": ("b64", lambda a, b: ((a << (b & 63)) & M64, int((a << (b & 63)) & M64 != 0))),
    "s_lshr_b64": ("b64", lambda a, b: (a >> (b & 63), int(a >> (b & 63) != 0))),
    "s_ashr_i64": ("b64", lambda a, b: ((_s64(a) >> (b & 63)) & M64, int(_s64(a) >> (b & 63) != 0))),
    "s_min_i32": ("b32", lambda a, b: (a if _s32(a) < _s32(b) else b, int(_s32(a) < _s32(b)))),
    "s_min_u32": ("b32", lambda a, b: (min(a, b), int(a < b))),
    "s_max_i32": ("b32", lambda a, b: (a if _s32(a) > _s32(b) else b, int(_s32(a) > _s32(b)))),
    "s_max_u32": ("b32", lambda a, b: (max(a, b), int(a > b))),
    "s_bfm_b32": ("b32", lambda a, b: ((((1 << (a & 31)) - 1) << (b & 31)) & M32, None)),
    "s_pack_ll_b32_b16": ("b32", lambda a, b: ((a & 0xFFFF) | ((b & 0xFFFF) << 16), None)),
    "s_pack_lh_b32_b16": ("b32", lambda a, b: ((a & 0xFFFF) | (b & 0xFFFF0000), None)),
    "s_pack_hh_b32_b16": ("b32", lambda a, b: ((a >> 16) | (b & 0xFFFF0000), None)),
}
for _n in range(1, 5):
    _SOP2[f"s_lshl{_n}_add_u32"] = (
        "b32",
        (lambda n: lambda a, b: (((a << n) + b) & M32, int(((a << n) + b) > M32)))(_n),
    )


def _bfe(a: int, b: int, signed: bool, bits: int) -> int:
    off, width = b & (bits - 1), (b >> 16) & 0x7F
    if width == 0:
        return 0
    v = (a >> off) & ((1 << width) - 1)
    if signed and v >> (width - 1):
        v -= 1 << width
    return v & ((1 << bits) - 1)


_SOP2["s_bfe_u32"] = ("b32", lambda a, b: (_bfe(a, b, False, 32), int(_bfe(a, b, False, 32) != 0)))
_SOP2["s_bfe_i32"] = ("b32", lambda a, b: (_bfe(a, b, True, 32), int(_bfe(a, b, True, 32) != 0)))
_SOP2["s_bfe_u64"] = ("b64", lambda a, b: (_bfe(a, b, False, 64), int(_bfe(a, b, False, 64) != 0)))


def _bind_sop2(inst: Inst, ctx: BindContext) -> Step:
    width, fn = _SOP2[inst.opcode]
    dst = swriter(inst.operands[0], width)
    shift = inst.opcode.startswith(("s_lshl_", "s_lshr_", "s_ashr_", "s_bfe"))
    a = sreader(inst.operands[1], width)
    b = sreader(inst.operands[2], "b32" if shift else width)

    def step(w: Wave) -> None:
        r, scc = fn(a(w), b(w))
        dst(w, r)
        if scc is not None:
            w.scc = scc

    return step


for _name in _SOP2:
    op(_name)(_bind_sop2)


@op("s_addc_u32", "s_subb_u32")
def _addc(inst: Inst, ctx: BindContext) -> Step:
    dst = swriter(inst.operands[0])
    a, b = sreader(inst.operands[1]), sreader(inst.operands[2])
    sub = inst.opcode == "s_subb_u32"

    def step(w: Wave) -> None:
        x, y = a(w), b(w)
        if sub:
            r = x - y - w.scc
            w.scc = int(r < 0)
        else:
            r = x + y + w.scc
            w.scc = int(r > M32)
        dst(w, r & M32)

    return step


@op("s_cselect_b32", "s_cselect_b64")
def _cselect(inst: Inst, ctx: BindContext) -> Step:
    width = "b64" if inst.opcode.endswith("64") else "b32"
    dst = swriter(inst.operands[0], width)
    a, b = sreader(inst.operands[1], width), sreader(inst.operands[2], width)
    return lambda w: dst(w, a(w) if w.scc else b(w))


_SOP1: dict[str, tuple[str, Callable[[int], int], bool]] = {
    # name -> (width, fn, sets scc as result != 0)
    "s_mov_b32": ("b32", lambda a: a, False),
    "s_mov_b64": ("b64", lambda a: a, False),
    "s_not_b32": ("b32", lambda a: ~a & M32, True),
    "s_not_b64": ("b64", lambda a: ~a & M64, True),
    "s_brev_b32": ("b32", lambda a: int(f"{a:032b}"[::-1], 2), False),
    "s_sext_i32_i8": ("b32", lambda a: (a & 0xFF) - ((a & 0x80) << 1) & M32, False),
    "s_sext_i32_i16": ("b32", lambda a: (a & 0xFFFF) - ((a & 0x8000) << 1) & M32, False),
    "s_bcnt1_i32_b32": ("b32", lambda a: bin(a).count("1"), True),
    "s_ff1_i32_b32": ("b32", lambda a: ((a & -a).bit_length() - 1) & M32 if a else M32, False),
    "s_flbit_i32_b32": ("b32", lambda a: 32 - a.bit_length() if a else M32, False),
}


@op(*_SOP1)
def _sop1(inst: Inst, ctx: BindContext) -> Step:
    width, fn, sets_scc = _SOP1[inst.opcode]
    dst = swriter(inst.operands[0], width)
    src = sreader(inst.operands[1], width)
    if sets_scc:

        def step(w: Wave) -> None:
            r = fn(src(w))
            dst(w, r)
            w.scc = int(r != 0)

        return step
    return lambda w: dst(w, fn(src(w)))


@op("s_abs_i32")
def _abs(inst: Inst, ctx: BindContext) -> Step:
    dst, src = swriter(inst.operands[0]), sreader(inst.operands[1])

    def step(w: Wave) -> None:
        r = abs(_s32(src(w))) & M32
        dst(w, r)
        w.scc = int(r != 0)

    return step


@op("s_cmov_b32", "s_cmov_b64")
def _cmov(inst: Inst, ctx: BindContext) -> Step:
    width = "b64" if inst.opcode.endswith("64") else "b32"
    dst, src = swriter(inst.operands[0], width), sreader(inst.operands[1], width)

    def step(w: Wave) -> None:
        if w.scc:
            dst(w, src(w))

    return step


@op("s_bitset0_b32", "s_bitset1_b32")
def _bitset(inst: Inst, ctx: BindContext) -> Step:
    d = inst.operands[0]
    dst, cur, bit = swriter(d), sreader(d), sreader(inst.operands[1])
    one = inst.opcode == "s_bitset1_b32"

    def step(w: Wave) -> None:
        b = 1 << (bit(w) & 31)
        dst(w, cur(w) | b if one else cur(w) & ~b & M32)

    return step


_SAVEEXEC: dict[str, Callable[[int, int], int]] = {
    "s_and_saveexec_b64": lambda s, e: s & e,
    "s_or_saveexec_b64": lambda s, e: s | e,
    "s_xor_saveexec_b64": lambda s, e: s ^ e,
    "s_andn2_saveexec_b64": lambda s, e: s & ~e & M64,
    "s_orn2_saveexec_b64": lambda s, e: (s | ~e) & M64,
    "s_andn1_saveexec_b64": lambda s, e: ~s & e & M64,
}


@op(*_SAVEEXEC)
def _saveexec(inst: Inst, ctx: BindContext) -> Step:
    fn = _SAVEEXEC[inst.opcode]
    dst, src = swriter(inst.operands[0], "b64"), sreader(inst.operands[1], "b64")

    def step(w: Wave) -> None:
        s = src(w)  # read before writing: the destination may alias the source
        old = w.exec_bits()
        new = fn(s, old)
        dst(w, old)
        w.set_exec(new)
        w.scc = int(new != 0)

    return step


def _cmp(kind: str, signed: bool) -> Callable[[int, int], bool]:
    def conv(x: int) -> int:
        return _s32(x) if signed else x

    return {
        "eq": lambda a, b: a == b,
        "lg": lambda a, b: a != b,
        "gt": lambda a, b: conv(a) > conv(b),
        "ge": lambda a, b: conv(a) >= conv(b),
        "lt": lambda a, b: conv(a) < conv(b),
        "le": lambda a, b: conv(a) <= conv(b),
    }[kind]


def _bind_cmp(inst: Inst, ctx: BindContext) -> Step:
    name = inst.opcode
    is_k = name.startswith("s_cmpk_")
    _, _, kind, typ = name.split("_")
    width = "b64" if typ.endswith("64") else "b32"
    fn = _cmp(kind, typ.startswith("i"))
    a = sreader(inst.operands[0], width)
    b = sreader(inst.operands[1], width)
    if is_k:
        kv = int(inst.operands[1].value)
        kv = kv & 0xFFFF if typ.startswith("u") else kv & M32
        return lambda w: setattr(w, "scc", int(fn(a(w), kv)))
    return lambda w: setattr(w, "scc", int(fn(a(w), b(w))))


for _k in ("eq", "lg", "gt", "ge", "lt", "le"):
    for _t in ("i32", "u32"):
        op(f"s_cmp_{_k}_{_t}", f"s_cmpk_{_k}_{_t}")(_bind_cmp)
op("s_cmp_eq_u64", "s_cmp_lg_u64")(_bind_cmp)


@op("s_bitcmp0_b32", "s_bitcmp1_b32")
def _bitcmp(inst: Inst, ctx: BindContext) -> Step:
    a, b = sreader(inst.operands[0]), sreader(inst.operands[1])
    want = 1 if inst.opcode.endswith("1_b32") else 0
    return lambda w: setattr(w, "scc", int(((a(w) >> (b(w) & 31)) & 1) == want))


@op("s_movk_i32", "s_cmovk_i32", "s_addk_i32", "s_mulk_i32")
def _sopk(inst: Inst, ctx: BindContext) -> Step:
    d = inst.operands[0]
    dst, cur = swriter(d), sreader(d)
    k = int(inst.operands[1].value) & 0xFFFF
    k = k - 0x10000 if k & 0x8000 else k
    name = inst.opcode
    if name == "s_movk_i32":
        return lambda w: dst(w, k & M32)
    if name == "s_cmovk_i32":
        return lambda w: dst(w, k & M32) if w.scc else None
    if name == "s_mulk_i32":
        return lambda w: dst(w, (_s32(cur(w)) * k) & M32)

    def addk(w: Wave) -> None:
        s = _s32(cur(w)) + k
        dst(w, s & M32)
        w.scc = int(not -(1 << 31) <= s < (1 << 31))

    return addk


# -- program control ---------------------------------------------------------------------------


@op(
    "s_nop",
    "v_nop",
    "v_nop_e32",
    "s_setprio",
    "s_sleep",
    "s_sched_barrier",
    "s_icache_inv",
    "s_dcache_wb",
    "s_dcache_inv",
)
def _nop(inst: Inst, ctx: BindContext) -> Step:
    return lambda w: None


@op("s_endpgm")
def _endpgm(inst: Inst, ctx: BindContext) -> Step:
    def step(w: Wave) -> None:
        w.done = True

    return step


@op("s_barrier")
def _barrier(inst: Inst, ctx: BindContext) -> Step:
    def step(w: Wave) -> None:
        w.at_barrier = True

    return step


@op("s_branch", "s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz")
def _branch(inst: Inst, ctx: BindContext) -> Step:
    tgt = ctx.target(inst)
    cond: Callable[[Wave], bool] = {
        "s_branch": lambda w: True,
        "s_cbranch_scc0": lambda w: w.scc == 0,
        "s_cbranch_scc1": lambda w: w.scc == 1,
        "s_cbranch_vccz": lambda w: (w.s[106] | w.s[107]) == 0,
        "s_cbranch_vccnz": lambda w: (w.s[106] | w.s[107]) != 0,
    }[inst.opcode]

    backward = tgt <= ctx.address_to_index[inst.address]

    def step(w: Wave) -> None:
        if cond(w):
            w.pc = tgt
            if backward:
                _count_back_branch(w, ctx.kernel, inst)

    return step


def _count_back_branch(w: Wave, kernel: str, inst: Inst) -> None:
    w.back_branches += 1
    if w.back_branches > MAX_BACK_BRANCHES:
        raise EmulatorError(
            f"{kernel}: wave {w.wave_id} took the backward branch at 0x{inst.address:x} more than "
            f"{MAX_BACK_BRANCHES} times: a loop that does not terminate?"
        )


@op("s_cbranch_execz", "s_cbranch_execnz")
def _branch_exec(inst: Inst, ctx: BindContext) -> Step:
    tgt = ctx.target(inst)
    want_zero = inst.opcode == "s_cbranch_execz"

    backward = tgt <= ctx.address_to_index[inst.address]

    def step(w: Wave) -> None:
        if ((w.s[EXEC] | w.s[EXEC + 1]) == 0) == want_zero:
            w.pc = tgt
            if backward:
                _count_back_branch(w, ctx.kernel, inst)

    return step


def waitcnt_counts(inst: Inst) -> tuple[int, int]:
    """(vmcnt, lgkmcnt) of an ``s_waitcnt``: named counters, or the raw gfx9 SIMM16 (vmcnt in bits
    3:0 and 15:14, lgkmcnt in 11:8); an absent counter is its maximum (no wait)."""
    if "raw" in inst.modifiers:
        raw = int(inst.modifiers["raw"], 0)
        return (raw & 0xF) | ((raw >> 14) & 0x3) << 4, (raw >> 8) & 0xF
    return inst.mod_int("vmcnt", 63), inst.mod_int("lgkmcnt", 15)


@op("s_waitcnt")
def _waitcnt(inst: Inst, ctx: BindContext) -> Step:
    hz = ctx.hazards
    vm, lgkm = waitcnt_counts(inst)
    return lambda w: hz.wait(w, vm, lgkm)


@op("s_trap", "s_setpc_b64", "s_swappc_b64", "s_rfe_b64")
def _unsupported_control(inst: Inst, ctx: BindContext) -> Step:
    """Traps and computed jumps: refused when executed (code that never runs them still loads)."""

    def step(w: Wave) -> None:
        raise EmulatorError(f"{ctx.kernel}: {inst.opcode} at 0x{inst.address:x} ({inst.text}) is not emulated")

    return step


@op("s_getpc_b64")
def _getpc(inst: Inst, ctx: BindContext) -> Step:
    dst = swriter(inst.operands[0], "b64")
    nxt = inst.address + 4
    return lambda w: dst(w, nxt)


# -- scalar memory ------------------------------------------------------------------------------


@op("s_load_dword", "s_load_dwordx2", "s_load_dwordx4", "s_load_dwordx8", "s_load_dwordx16")
def _s_load(inst: Inst, ctx: BindContext) -> Step:
    d, base_op = inst.operands[0], inst.operands[1]
    n = d.count
    base = sreader(base_op, "b64")
    off_op = inst.operands[2] if len(inst.operands) > 2 else None
    off = sreader(off_op) if off_op is not None else (lambda w: 0)
    extra = inst.mod_int("offset", 0)
    mem, hz = ctx.memory, ctx.hazards

    def step(w: Wave) -> None:
        addr = (base(w) + off(w) + extra) & ~3
        data = mem.view(addr, 4 * n, write=False).view("<u4")
        for i in range(n):
            w.s[d.index + i] = int(data[i])
        hz.issue(w, "lgkm", inst, sregs=(d.index, n))

    return step


@op("s_buffer_load_dword", "s_buffer_load_dwordx2", "s_buffer_load_dwordx4", "s_buffer_load_dwordx8")
def _s_buffer_load(inst: Inst, ctx: BindContext) -> Step:
    d, rsrc_op = inst.operands[0], inst.operands[1]
    n = d.count
    rsrc = sreader(rsrc_op, "b64")
    off = sreader(inst.operands[2])
    mem, hz = ctx.memory, ctx.hazards

    def step(w: Wave) -> None:
        base = rsrc(w) & 0xFFFFFFFFFFFF
        num = w.s[rsrc_op.index + 2]
        o = off(w) & ~3
        for i in range(n):
            bo = o + 4 * i
            w.s[d.index + i] = int(mem.view(base + bo, 4, False).view("<u4")[0]) if bo + 4 <= num else 0
        hz.issue(w, "lgkm", inst, sregs=(d.index, n))

    return step
