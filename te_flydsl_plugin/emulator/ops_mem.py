"""Vector memory and LDS: global and buffer loads/stores (incl. direct global->LDS), ds_read/ds_write.

Loads deliver their data at issue and register their destinations with the hazard tracker, which
knows when a real wave would have it (``vmcnt`` for global/buffer, ``lgkmcnt`` for LDS).

Buffer resources (V#, 4 SGPRs): base = bits 0-47, stride = bits 48-61, num_records = dword 2. Range
checking, as the emulator applies it: with stride 0 (raw buffers, what FlyDSL builds) each dword of
a dword/dwordx2/x3/x4 access is checked on its own (as the ISA reference says), a byte/short access
as a whole, and a unit is in range when it ends at or below ``num_records`` counting ``vaddr +
inst_offset`` (a dword straddling the end is out, as LLVM documents; the scalar offset is not
range-checked, as on gfx9); with a stride, when ``index < num_records``. Out-of-range loads return
0, out-of-range stores are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .bind import BindContext, Step, op, sreader
from .decode import M0, Inst, Operand
from .errors import EmulatorError
from .machine import LANES, HostMemory, Wave

_WIDTH = {
    "dword": 4,
    "dwordx2": 8,
    "dwordx3": 12,
    "dwordx4": 16,
    "ubyte": 1,
    "sbyte": 1,
    "ushort": 2,
    "sshort": 2,
    "byte": 1,
    "short": 2,
}


def _register_widths(space: str, load: Callable[..., Any], store: Callable[..., Any]) -> None:
    """Register ``<space>_load_<w>`` / ``<space>_store_<w>`` for every width the ISA has for them:
    stores exist for ``byte``/``short`` (no sign), loads for the signed/unsigned sub-dword forms."""
    for w in _WIDTH:
        if w not in ("byte", "short"):
            op(f"{space}_load_{w}")(load)
        if w not in ("ubyte", "sbyte", "ushort", "sshort"):
            op(f"{space}_store_{w}")(store)


_LANE_IDX = np.arange(LANES)


def _bytes_to_regs(data: np.ndarray, suffix: str) -> np.ndarray:
    """uint8[lanes, n] loaded bytes -> uint32[nregs, lanes] register values (sign/zero extended)."""
    if suffix in ("ubyte", "sbyte", "ushort", "sshort"):
        if suffix == "ubyte":
            v = data[:, 0].astype(np.uint32)
        elif suffix == "sbyte":
            v = data[:, 0].view(np.int8).astype(np.int32).view(np.uint32)
        elif suffix == "ushort":
            v = data.view("<u2")[:, 0].astype(np.uint32)
        else:
            v = data.view("<i2")[:, 0].astype(np.int32).view(np.uint32)
        return v[None, :]
    return np.ascontiguousarray(data).view("<u4").T


def _regs_to_bytes(regs: np.ndarray, nbytes: int) -> np.ndarray:
    """uint32[nregs, lanes] -> uint8[lanes, nbytes] (low bytes for byte/short stores)."""
    return np.ascontiguousarray(regs.T).view(np.uint8)[:, :nbytes]


def _vdata_writer(
    ctx: BindContext, inst: Inst, d: Operand, nregs: int
) -> Callable[[Wave, np.ndarray, np.ndarray], None]:
    """Write loaded registers for the given lanes (bool[64]), then mark them pending on vmcnt."""
    file_a = d.kind == "a"

    def write(w: Wave, regs: np.ndarray, lanes: np.ndarray) -> None:
        f = w.a if file_a else w.v
        if w.hazards.pending_regs:
            ctx.hazards.check_write(w, d.kind, d.index, nregs, inst, in_order="vm")
        f[d.index : d.index + nregs, lanes] = regs[:nregs, lanes]

    return write


def _vreg_read(ctx: BindContext, inst: Inst, o: Operand, n: int) -> Callable[[Wave], np.ndarray]:
    """Read ``n`` consecutive VGPRs/AGPRs (store data, addresses) with the unwaited-load check."""
    kind, idx = o.kind, o.index

    def r(w: Wave) -> np.ndarray:
        if w.hazards.pending_regs:
            ctx.hazards.check_read(w, kind, idx, n, inst)
        return (w.a if kind == "a" else w.v)[idx : idx + n]

    return r


# -- global -----------------------------------------------------------------------------------


def _global_addr(ctx: BindContext, inst: Inst, vaddr: Operand, saddr: Operand) -> Callable[[Wave], np.ndarray]:
    off = np.uint64(inst.mod_int("offset", 0) & 0xFFFFFFFFFFFFFFFF)
    if saddr.kind == "off":
        rd = _vreg_read(ctx, inst, vaddr, 2)

        def a64(w: Wave) -> np.ndarray:
            v = rd(w)
            return (v[0].astype(np.uint64) | (v[1].astype(np.uint64) << np.uint64(32))) + off

        return a64
    rd1 = _vreg_read(ctx, inst, vaddr, 1)
    base = sreader(saddr, "b64")
    return lambda w: (rd1(w)[0].astype(np.uint64) + np.uint64(base(w))) + off


def _bind_global_load(inst: Inst, ctx: BindContext) -> Step:
    suffix = inst.opcode.split("_", 2)[2]
    nbytes = _WIDTH[suffix]
    d, vaddr, saddr = inst.operands[:3]
    addr = _global_addr(ctx, inst, vaddr, saddr)
    nregs = max(nbytes // 4, 1)
    write = _vdata_writer(ctx, inst, d, nregs)
    mem, hz = ctx.memory, ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        a = addr(w)[lanes]
        regs = np.zeros((nregs, LANES), np.uint32)
        regs[:, lanes] = _bytes_to_regs(mem.gather(a, nbytes), suffix)
        write(w, regs, lanes)
        hz.issue(w, "vm", inst, vregs=(d.kind, d.index, nregs))

    return step


def _bind_global_store(inst: Inst, ctx: BindContext) -> Step:
    suffix = inst.opcode.split("_", 2)[2]
    nbytes = _WIDTH[suffix]
    vaddr, data, saddr = inst.operands[:3]
    addr = _global_addr(ctx, inst, vaddr, saddr)
    rd = _vreg_read(ctx, inst, data, max(nbytes // 4, 1))
    mem, hz = ctx.memory, ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        mem.scatter(addr(w)[lanes], _regs_to_bytes(rd(w), nbytes)[lanes])
        hz.issue(w, "vm", inst)

    return step


def _bind_global_load_lds(inst: Inst, ctx: BindContext) -> Step:
    """gfx950 ``global_load_lds_*``: global memory straight into LDS at ``M0 + offset + lane * size``."""
    nbytes = _WIDTH[inst.opcode.removeprefix("global_load_lds_")]
    vaddr, saddr = inst.operands[:2]
    addr = _global_addr(ctx, inst, vaddr, saddr)
    inst_off = inst.mod_int("offset", 0)
    mem, hz, lds = ctx.memory, ctx.hazards, ctx.lds

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        data = mem.gather(addr(w)[lanes], nbytes)
        la = ((w.s[M0] & 0x3FFFF) + inst_off + _LANE_IDX[lanes] * nbytes)[:, None] + np.arange(nbytes)
        inr = la < lds.size
        flat = la[inr].astype(np.int64)
        lds[flat] = data[inr]
        seq = hz.issue(w, "vm", inst)
        hz.lds_write(w, flat, inst, "vm", seq)

    return step


for _s in ("dword", "dwordx3", "dwordx4", "ubyte", "sbyte", "ushort", "sshort"):
    op(f"global_load_lds_{_s}")(_bind_global_load_lds)

_register_widths("global", _bind_global_load, _bind_global_store)


# -- scratch (architected flat scratch, gfx940+) ------------------------------------------------


def _scratch_addr(ctx: BindContext, inst: Inst, vaddr: Operand, saddr: Operand) -> Callable[[Wave], np.ndarray]:
    """Per-lane offsets into the lane's own private segment: vaddr + saddr + offset (each optional)."""
    off = inst.mod_int("offset", 0)
    vrd = _vreg_read(ctx, inst, vaddr, 1) if vaddr.kind in ("v", "a") else None
    srd = sreader(saddr) if saddr.kind != "off" else None

    def addr(w: Wave) -> np.ndarray:
        a = np.full(LANES, off, np.int64)
        if vrd is not None:
            a += vrd(w)[0].astype(np.int64)
        if srd is not None:
            a += srd(w)
        return a

    return addr


def _scratch_index(w: Wave, ctx: BindContext, inst: Inst, a: np.ndarray, nbytes: int) -> np.ndarray:
    idx = a[:, None] + np.arange(nbytes)
    if idx.size and (idx.min() < 0 or idx.max() >= w.scratch.shape[1]):
        raise EmulatorError(
            f"{ctx.kernel}: {inst.text} at 0x{inst.address:x} addresses private byte {int(idx.max())} "
            f"outside the {w.scratch.shape[1]}-byte private segment"
        )
    return idx


def _bind_scratch_load(inst: Inst, ctx: BindContext) -> Step:
    suffix = inst.opcode.removeprefix("scratch_load_")
    nbytes = _WIDTH[suffix]
    d, vaddr, saddr = inst.operands[:3]
    addr = _scratch_addr(ctx, inst, vaddr, saddr)
    nregs = max(nbytes // 4, 1)
    write = _vdata_writer(ctx, inst, d, nregs)
    hz = ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        raw = np.zeros((LANES, nbytes), np.uint8)
        rows = np.flatnonzero(lanes)
        raw[rows] = w.scratch[rows[:, None], _scratch_index(w, ctx, inst, addr(w)[rows], nbytes)]
        write(w, _bytes_to_regs(raw, suffix), lanes)
        hz.issue(w, "vm", inst, vregs=(d.kind, d.index, nregs))

    return step


def _bind_scratch_store(inst: Inst, ctx: BindContext) -> Step:
    nbytes = _WIDTH[inst.opcode.removeprefix("scratch_store_")]
    vaddr, data, saddr = inst.operands[:3]
    addr = _scratch_addr(ctx, inst, vaddr, saddr)
    rd = _vreg_read(ctx, inst, data, max(nbytes // 4, 1))
    hz = ctx.hazards

    def step(w: Wave) -> None:
        rows = np.flatnonzero(w.exec_mask)
        idx = _scratch_index(w, ctx, inst, addr(w)[rows], nbytes)
        w.scratch[rows[:, None], idx] = _regs_to_bytes(rd(w), nbytes)[rows]
        hz.issue(w, "vm", inst)

    return step


_register_widths("scratch", _bind_scratch_load, _bind_scratch_store)


# -- buffer -------------------------------------------------------------------------------------


class _BufferAddr:
    """Per-lane byte addresses and in-range masks of one buffer instruction."""

    def __init__(self, ctx: BindContext, inst: Inst, vaddr: Operand, rsrc: Operand, soff: Operand) -> None:
        self.offen = "offen" in inst.modifiers
        self.idxen = "idxen" in inst.modifiers
        self.inst_off = inst.mod_int("offset", 0)
        self.rsrc = rsrc.index
        self.soff = sreader(soff)
        nv = int(self.offen) + int(self.idxen)
        self.vread = _vreg_read(ctx, inst, vaddr, nv) if nv else None

    def __call__(self, w: Wave, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
        """(byte address per lane, in-range mask per lane and byte)."""
        s = w.s
        r = self.rsrc
        base = s[r] | ((s[r + 1] & 0xFFFF) << 32)
        stride = (s[r + 1] >> 16) & 0x3FFF
        num = s[r + 2]
        idx = np.zeros(LANES, np.uint64)
        voff = np.zeros(LANES, np.uint64)
        if self.vread is not None:
            v = self.vread(w)
            if self.idxen:
                idx = v[0].astype(np.uint64)
            if self.offen:
                voff = v[-1].astype(np.uint64)
        if (s[r + 3] >> 23) & 1:  # ADD_TID_ENABLE
            idx = idx + _LANE_IDX.astype(np.uint64)
        off = voff + np.uint64(self.inst_off)
        if stride == 0:  # dword accesses are checked per dword, narrower ones as a whole
            unit = 4 if nbytes >= 4 else nbytes
            ends = off[:, None] + (np.arange(nbytes) // unit * unit + unit).astype(np.uint64)
            ok = ends <= np.uint64(num)
        else:
            ok = np.broadcast_to((idx < np.uint64(num))[:, None], (LANES, nbytes))
        addr = np.uint64(base + self.soff(w)) + off + idx * np.uint64(stride)
        return addr, ok


def _buffer_gather(mem: HostMemory, addr: np.ndarray, ok: np.ndarray, lanes: np.ndarray, nbytes: int) -> np.ndarray:
    """uint8[64, nbytes] loaded for the enabled lanes; out-of-range bytes (and other lanes) are 0."""
    raw = np.zeros((LANES, nbytes), np.uint8)
    any_ok = lanes & ok.any(axis=1)
    raw[any_ok] = mem.gather(addr[any_ok], nbytes)
    raw[~ok] = 0
    return raw


def _buffer_parts(inst: Inst) -> tuple[str, int]:
    name = inst.opcode
    suffix = name.split("_", 2)[2]
    if suffix.startswith("format"):
        raise EmulatorError(f"typed buffer access {name} is not emulated")
    return suffix, _WIDTH[suffix]


def _bind_buffer_load(inst: Inst, ctx: BindContext) -> Step:
    suffix, nbytes = _buffer_parts(inst)
    mem, hz, lds = ctx.memory, ctx.hazards, ctx.lds
    if "lds" in inst.modifiers:
        vaddr, rsrc, soff = inst.operands[:3]
        baddr = _BufferAddr(ctx, inst, vaddr, rsrc, soff)
        # The immediate offset moves the LDS address as well as the global one (LLVM's AMDGPU DMA operations
        # docs: the LDS-load intrinsics' offset "applied to both global and LDS address"); AMD's shipped
        # gfx950 MLA kernels (aiter wheel, mla/*.co) step runs of `buffer_load_dword ... offset:256 lds` at
        # one M0 and then advance M0 past them, which only works so. docs/emulator.md, "Buffer resources".
        inst_off = inst.mod_int("offset", 0)
        lds_size = lds.size

        def to_lds(w: Wave) -> None:
            addr, ok = baddr(w, nbytes)
            lanes = w.exec_mask
            data = _buffer_gather(mem, addr, ok, lanes, nbytes)
            lbase = (w.s[M0] & 0x3FFFF) + inst_off
            la = (lbase + _LANE_IDX[lanes] * nbytes)[:, None] + np.arange(nbytes)
            inr = la < lds_size
            flat = la[inr]
            lds[flat] = data[lanes][inr]
            seq = hz.issue(w, "vm", inst)
            hz.lds_write(w, flat.astype(np.int64), inst, "vm", seq)

        return to_lds
    d, vaddr, rsrc, soff = inst.operands[:4]
    baddr = _BufferAddr(ctx, inst, vaddr, rsrc, soff)
    nregs = max(nbytes // 4, 1)
    write = _vdata_writer(ctx, inst, d, nregs)

    def step(w: Wave) -> None:
        addr, ok = baddr(w, nbytes)
        lanes = w.exec_mask
        write(w, _bytes_to_regs(_buffer_gather(mem, addr, ok, lanes, nbytes), suffix), lanes)
        hz.issue(w, "vm", inst, vregs=(d.kind, d.index, nregs))

    return step


def _bind_buffer_store(inst: Inst, ctx: BindContext) -> Step:
    _, nbytes = _buffer_parts(inst)
    data, vaddr, rsrc, soff = inst.operands[:4]
    baddr = _BufferAddr(ctx, inst, vaddr, rsrc, soff)
    rd = _vreg_read(ctx, inst, data, max(nbytes // 4, 1))
    mem, hz = ctx.memory, ctx.hazards

    def step(w: Wave) -> None:
        addr, ok = baddr(w, nbytes)
        lanes = w.exec_mask
        data = _regs_to_bytes(rd(w), nbytes)
        whole = lanes & ok.all(axis=1)
        mem.scatter(addr[whole], data[whole])
        part = lanes & ok.any(axis=1) & ~whole  # a dwordx4 running past the end: its in-range dwords
        if part.any():
            flat = (addr[part][:, None] + np.arange(nbytes, dtype=np.uint64))[ok[part]]
            mem.scatter(flat, data[part][ok[part]][:, None])
        hz.issue(w, "vm", inst)

    return step


_register_widths("buffer", _bind_buffer_load, _bind_buffer_store)


_ATOMIC_KINDS = ("add_f32", "pk_add_bf16", "add", "pk_add_f16")


def _add_u32(kind: str, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The sum an atomic add of ``kind`` stores, per 32-bit word (uint32 arrays): f32, u32, or two
    bf16 / f16 halves each added in f32 and rounded to nearest even."""
    from .numerics import bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16

    if kind == "add_f32":
        return (old.view(np.float32) + new.view(np.float32)).view(np.uint32)
    if kind == "add":
        return old + new
    to32, back = (bf16_to_f32, f32_to_bf16) if kind == "pk_add_bf16" else (f16_to_f32, f32_to_f16)
    halves = [
        back(to32((old >> np.uint32(sh)) & np.uint32(0xFFFF)) + to32((new >> np.uint32(sh)) & np.uint32(0xFFFF)))
        for sh in (0, 16)
    ]
    return halves[0] | (halves[1] << np.uint32(16))


def _atomic_add(mem: HostMemory, kind: str, addrs: np.ndarray, vals: np.ndarray) -> None:
    """One atomic add per (address, 32-bit value), in lane order (split-K reductions). Lanes on distinct
    addresses are applied at once; lanes sharing an address one after another."""
    vals = np.asarray(vals, np.uint32)
    if np.unique(addrs).size == addrs.size:
        old = mem.gather(addrs, 4).view("<u4")[:, 0]
        mem.scatter(addrs, _add_u32(kind, old, vals).astype("<u4").view(np.uint8).reshape(-1, 4))
        return
    for a, v in zip(addrs.tolist(), vals.tolist(), strict=True):
        view = mem.view(int(a), 4, write=True).view("<u4")
        view[:] = _add_u32(kind, view.copy(), np.array([v], np.uint32))


def _no_return(inst: Inst, ctx: BindContext) -> None:
    if "sc0" in inst.modifiers or "glc" in inst.modifiers:
        raise EmulatorError(f"{ctx.kernel}: returning atomic {inst.opcode} at 0x{inst.address:x} is not emulated")


def _buffer_atomic(inst: Inst, ctx: BindContext) -> Step:
    """Buffer atomic adds without return; out-of-range lanes are dropped like stores."""
    _no_return(inst, ctx)
    data, vaddr, rsrc, soff = inst.operands[:4]
    baddr = _BufferAddr(ctx, inst, vaddr, rsrc, soff)
    rd = _vreg_read(ctx, inst, data, 1)
    mem, hz = ctx.memory, ctx.hazards
    kind = inst.opcode.removeprefix("buffer_atomic_")

    def step(w: Wave) -> None:
        addr, okb = baddr(w, 4)
        lanes = w.exec_mask & okb.all(axis=1)
        _atomic_add(mem, kind, addr[lanes], rd(w)[0][lanes])
        hz.issue(w, "vm", inst)

    return step


def _global_atomic(inst: Inst, ctx: BindContext) -> Step:
    """Global atomic adds without return: ``vaddr, vdata, saddr|off`` like a global store."""
    _no_return(inst, ctx)
    vaddr, data, saddr = inst.operands[:3]
    addr = _global_addr(ctx, inst, vaddr, saddr)
    rd = _vreg_read(ctx, inst, data, 1)
    mem, hz = ctx.memory, ctx.hazards
    kind = inst.opcode.removeprefix("global_atomic_")

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        _atomic_add(mem, kind, addr(w)[lanes], rd(w)[0][lanes])
        hz.issue(w, "vm", inst)

    return step


for _k in _ATOMIC_KINDS:
    op(f"buffer_atomic_{_k}")(_buffer_atomic)
    op(f"global_atomic_{_k}")(_global_atomic)


# -- LDS ------------------------------------------------------------------------------------------

DS_READ_BYTES = {  # bytes per lane of each plain DS read (CDNA3/CDNA4 ISA, DS opcodes)
    "ds_read_b32": 4,
    "ds_read_b64": 8,
    "ds_read_b96": 12,
    "ds_read_b128": 16,
    "ds_read_u8": 1,
    "ds_read_i8": 1,
    "ds_read_u16": 2,
    "ds_read_i16": 2,
}
DS_WRITE_BYTES = {  # bytes per lane of each plain DS write (same source)
    "ds_write_b8": 1,
    "ds_write_b16": 2,
    "ds_write_b32": 4,
    "ds_write_b64": 8,
    "ds_write_b96": 12,
    "ds_write_b128": 16,
}


def _lds_addr(ctx: BindContext, inst: Inst, o: Operand) -> Callable[[Wave], np.ndarray]:
    rd = _vreg_read(ctx, inst, o, 1)
    return lambda w: rd(w)[0].astype(np.int64)


# A DS address is the lane's 32-bit VGPR plus the instruction's 16-bit offset, modulo 2**32: LLVM folds a
# constant into the offset whatever the sign of the base on every generation since Sea Islands
# (AMDGPUISelDAGToDAG.cpp, ``isDSOffsetLegal``: only Southern Islands, where "instruction with a negative base
# value and an offset don't seem to work", keeps the base non-negative), so gfx950 code it compiles relies on
# the wrap: a base of ``x - 0x8000`` with ``offset:32768`` reads ``x`` (our MXFP8 kernel's peel does). The LDS
# bank model (lds_banks.BankModel.cycles) counts the same wrapped addresses.
LDS_ADDRESS = 0xFFFFFFFF


def _lds_gather(lds: np.ndarray, addrs: np.ndarray, nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes at ``addrs`` (int64[n]: VGPR + offset, wrapped to 32 bits here) -> (uint8[n, nbytes], flat in-range
    byte addresses); OOB reads 0."""
    idx = (addrs & LDS_ADDRESS)[:, None] + np.arange(nbytes)
    inr = idx < lds.size
    out = np.zeros(idx.shape, np.uint8)
    out[inr] = lds[idx[inr]]
    return out, idx[inr]


@op(*DS_READ_BYTES)
def _ds_read(inst: Inst, ctx: BindContext) -> Step:
    nbytes = DS_READ_BYTES[inst.opcode]
    d, a = inst.operands[:2]
    off = inst.mod_int("offset", 0)
    addr = _lds_addr(ctx, inst, a)
    nregs = max(nbytes // 4, 1)
    write = _vdata_writer(ctx, inst, d, nregs)
    suffix = {"u8": "ubyte", "i8": "sbyte", "u16": "ushort", "i16": "sshort"}.get(inst.opcode.split("_")[2], "dword")
    lds, hz = ctx.lds, ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        raw, flat = _lds_gather(lds, addr(w)[lanes] + off, nbytes)
        hz.lds_read(w, flat, inst)
        full = np.zeros((LANES, nbytes), np.uint8)
        full[lanes] = raw
        write(w, _bytes_to_regs(full, suffix), lanes)
        hz.issue(w, "lgkm", inst, vregs=(d.kind, d.index, nregs))

    return step


@op("ds_read2_b32", "ds_read2_b64", "ds_read2st64_b32", "ds_read2st64_b64")
def _ds_read2(inst: Inst, ctx: BindContext) -> Step:
    size = 8 if inst.opcode.endswith("b64") else 4
    unit = size * (64 if "st64" in inst.opcode else 1)
    d, a = inst.operands[:2]
    o0, o1 = inst.mod_int("offset0", 0) * unit, inst.mod_int("offset1", 0) * unit
    addr = _lds_addr(ctx, inst, a)
    nregs = 2 * size // 4
    write = _vdata_writer(ctx, inst, d, nregs)
    lds, hz = ctx.lds, ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        base = addr(w)[lanes]
        r0, f0 = _lds_gather(lds, base + o0, size)
        r1, f1 = _lds_gather(lds, base + o1, size)
        hz.lds_read(w, np.concatenate([f0, f1]), inst)
        full = np.zeros((LANES, 2 * size), np.uint8)
        full[lanes] = np.concatenate([r0, r1], axis=1)
        write(w, _bytes_to_regs(full, "dword"), lanes)
        hz.issue(w, "lgkm", inst, vregs=(d.kind, d.index, nregs))

    return step


def _lds_scatter(lds: np.ndarray, addrs: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Write uint8[n, nbytes] at ``addrs`` (wrapped to 32 bits, as :func:`_lds_gather`); OOB bytes are dropped.
    Returns the written flat addresses."""
    idx = (addrs & LDS_ADDRESS)[:, None] + np.arange(data.shape[1])
    inr = idx < lds.size
    lds[idx[inr]] = data[inr]
    return idx[inr]


@op(*DS_WRITE_BYTES, "ds_write_b8_d16_hi", "ds_write_b16_d16_hi")
def _ds_write(inst: Inst, ctx: BindContext) -> Step:
    name = inst.opcode
    hi = name.endswith("_d16_hi")
    nbytes = DS_WRITE_BYTES[name.removesuffix("_d16_hi")]
    a, data = inst.operands[:2]
    off = inst.mod_int("offset", 0)
    addr = _lds_addr(ctx, inst, a)
    rd = _vreg_read(ctx, inst, data, max(nbytes // 4, 1))
    lds, hz = ctx.lds, ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        regs = rd(w)
        if hi:
            regs = regs >> np.uint32(16)
        flat = _lds_scatter(lds, addr(w)[lanes] + off, _regs_to_bytes(regs, nbytes)[lanes])
        seq = hz.issue(w, "lgkm", inst)
        hz.lds_write(w, flat, inst, "lgkm", seq)

    return step


@op("ds_write2_b32", "ds_write2_b64", "ds_write2st64_b32", "ds_write2st64_b64")
def _ds_write2(inst: Inst, ctx: BindContext) -> Step:
    size = 8 if inst.opcode.endswith("b64") else 4
    unit = size * (64 if "st64" in inst.opcode else 1)
    a, d0, d1 = inst.operands[:3]
    o0, o1 = inst.mod_int("offset0", 0) * unit, inst.mod_int("offset1", 0) * unit
    addr = _lds_addr(ctx, inst, a)
    r0, r1 = _vreg_read(ctx, inst, d0, size // 4), _vreg_read(ctx, inst, d1, size // 4)
    lds, hz = ctx.lds, ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        base = addr(w)[lanes]
        f0 = _lds_scatter(lds, base + o0, _regs_to_bytes(r0(w), size)[lanes])
        f1 = _lds_scatter(lds, base + o1, _regs_to_bytes(r1(w), size)[lanes])
        seq = hz.issue(w, "lgkm", inst)
        hz.lds_write(w, np.concatenate([f0, f1]), inst, "lgkm", seq)

    return step


@op("ds_bpermute_b32", "ds_permute_b32")
def _ds_permute(inst: Inst, ctx: BindContext) -> Step:
    """Lane permutes through the LDS crossbar (no LDS memory touched): addresses are lane*4 bytes."""
    d, a, data = inst.operands[:3]
    off = inst.mod_int("offset", 0)
    addr = _lds_addr(ctx, inst, a)
    rd = _vreg_read(ctx, inst, data, 1)
    write = _vdata_writer(ctx, inst, d, 1)
    back = inst.opcode == "ds_bpermute_b32"
    hz = ctx.hazards

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        src = rd(w)[0]
        lane_sel = ((addr(w) + off) >> 2) & 63
        out = np.zeros(LANES, np.uint32)
        if back:
            ok = w.exec_mask[lane_sel]
            out = np.where(ok, src[lane_sel], 0).astype(np.uint32)
        else:
            for lane in np.flatnonzero(lanes):
                out[lane_sel[lane]] = src[lane]
        write(w, out[None, :], lanes)
        hz.issue(w, "lgkm", inst, vregs=(d.kind, d.index, 1))

    return step


DS_READ_TR = ("ds_read_b64_tr_b16", "ds_read_b64_tr_b8", "ds_read_b64_tr_b4")  # 8 bytes per lane each


@op(*DS_READ_TR)
def _ds_read_tr(inst: Inst, ctx: BindContext) -> Step:
    """gfx950 transposing LDS read: each lane addresses 64 bits, then lanes exchange elements.

    Within each group of 16 lanes, the 16 x 64 bits read form a tile of ``E = 64 / bits`` rows of 16
    elements (row ``r`` is the data of lanes ``(16 / E) * r ..``), and lane ``i`` of the group receives
    column ``i``: its element ``r`` is element ``i % E`` of source lane ``(16 / E) * r + i // E``. So
    data stored contiguous along M/N arrives K-contiguous in the lane, as the MFMA operand wants.
    """
    bits = int(inst.opcode.rsplit("_b", 1)[1])
    elems = 64 // bits
    lanes_per_row = 16 // elems
    d, a = inst.operands[:2]
    off = inst.mod_int("offset", 0)
    addr = _lds_addr(ctx, inst, a)
    write = _vdata_writer(ctx, inst, d, 2)
    lds, hz = ctx.lds, ctx.hazards
    i = np.arange(LANES)
    grp, li = i // 16, i % 16
    r = np.arange(elems)
    src_lane = (grp[:, None] * 16 + lanes_per_row * r[None, :] + li[:, None] // elems).ravel()
    src_elem = np.broadcast_to((li % elems)[:, None], (LANES, elems)).ravel()

    def step(w: Wave) -> None:
        lanes = w.exec_mask
        raw, flat = _lds_gather(lds, addr(w)[lanes] + off, 8)
        hz.lds_read(w, flat, inst)
        full = np.zeros((LANES, 8), np.uint8)
        full[lanes] = raw
        bitsarr = np.unpackbits(full, axis=1, bitorder="little").reshape(LANES, elems, bits)
        out = bitsarr[src_lane, src_elem].reshape(LANES, elems * bits)
        packed = np.packbits(out, axis=1, bitorder="little")
        write(w, _bytes_to_regs(packed, "dword"), lanes)
        hz.issue(w, "lgkm", inst, vregs=(d.kind, d.index, 2))

    return step
