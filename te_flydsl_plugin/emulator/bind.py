"""Binding decoded instructions to executable closures: the opcode registry and operand accessors.

Each opcode family module registers a *binder* per opcode: a function that looks at one decoded
instruction once, at load time, and returns a closure ``step(wave)`` that executes it. Operand
parsing, modifier decoding and dispatch therefore happen once per instruction, not once per
execution, which is what keeps the emulator fast enough for GEMM tiles.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .decode import Inst, Operand
from .errors import EmulatorError
from .machine import Wave

if TYPE_CHECKING:
    from .hazards import HazardTracker
    from .machine import HostMemory

Step = Callable[[Wave], None]
Binder = Callable[[Inst, "BindContext"], Step]
OPS: dict[str, Binder] = {}


@dataclass
class BindContext:
    """What a binder may need besides the instruction: the kernel, LDS, memory, hazard tracking."""

    kernel: str
    address_to_index: dict[int, int]
    memory: HostMemory
    lds: np.ndarray
    hazards: HazardTracker

    def target(self, inst: Inst) -> int:
        """The instruction index a branch jumps to."""
        if inst.branch_target not in self.address_to_index:
            raise EmulatorError(
                f"{self.kernel}: branch at 0x{inst.address:x} to 0x{inst.branch_target or 0:x} outside the kernel"
            )
        return self.address_to_index[inst.branch_target]


def op(*names: str) -> Callable[[Binder], Binder]:
    """Register a binder for one or more opcodes (with and without ``_e32``/``_e64`` suffixes)."""

    def deco(fn: Binder) -> Binder:
        for n in names:
            OPS[n] = fn
        return fn

    return deco


def base_opcode(opcode: str) -> str:
    """The opcode without its encoding suffix (``v_add_u32_e32`` -> ``v_add_u32``)."""
    for suf in ("_e32", "_e64", "_sdwa", "_dpp"):
        if opcode.endswith(suf):
            return opcode[: -len(suf)]
    return opcode


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f16_bits(x: float) -> int:
    return int(np.array(x, np.float16).view(np.uint16))


def f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def imm_value(o: Operand, width: str) -> int:
    """An immediate or inline constant as raw bits for an operand of type ``width``.

    ``width`` is ``b32``/``f32``/``b16``/``f16``/``bf16``/``b64``/``f64``: inline float constants are
    encoded in the operand's own type (1.0 in an f16 operand is 0x3C00), integers are sign-extended.
    """
    if o.kind == "fimm":
        v = float(o.value)
        if width == "f16":
            return f16_bits(v)
        if width == "bf16":
            return f32_bits(v) >> 16
        if width == "f64":
            return f64_bits(v)
        return f32_bits(v)
    iv = int(o.value)
    if width in ("b64", "f64"):
        return iv & 0xFFFFFFFFFFFFFFFF
    return iv & 0xFFFFFFFF


# -- scalar operands -------------------------------------------------------------------------------


def sreader(o: Operand, width: str = "b32") -> Callable[[Wave], int]:
    """A closure reading a scalar source as an unsigned integer (32 or 64 bits)."""
    wide = width in ("b64", "f64")
    if o.kind == "s":
        idx = o.index
        if wide:
            return lambda w: w.s[idx] | (w.s[idx + 1] << 32)
        return lambda w: w.s[idx]
    if o.kind in ("imm", "fimm"):
        val = imm_value(o, width)
        return lambda w: val
    if o.kind == "scc":
        return lambda w: w.scc
    raise EmulatorError(f"unsupported scalar operand {o}")


def swriter(o: Operand, width: str = "b32") -> Callable[[Wave, int], None]:
    """A closure writing a scalar destination (32 or 64 bits)."""
    if o.kind != "s":
        raise EmulatorError(f"unsupported scalar destination {o}")
    idx = o.index
    count = 2 if width in ("b64", "f64") else 1
    if idx + count <= 124 or idx >= 128:
        if count == 1:

            def w1(w: Wave, v: int) -> None:
                w.s[idx] = v & 0xFFFFFFFF

            return w1

        def w2(w: Wave, v: int) -> None:
            w.s[idx] = v & 0xFFFFFFFF
            w.s[idx + 1] = (v >> 32) & 0xFFFFFFFF

        return w2
    return lambda w, v: w.sset(idx, v, count)


# -- vector operands -------------------------------------------------------------------------------


def vreader(o: Operand, ctx: BindContext, inst: Inst, width: str = "b32") -> Callable[[Wave], Any]:
    """A closure reading a VALU source as uint32 (or uint64 for 64-bit types) over the 64 lanes.

    SGPR and constant sources come back as numpy scalars, which broadcast. Reading a VGPR whose
    load has not been waited for is reported by the hazard tracker.
    """
    wide = width in ("b64", "f64")
    hz = ctx.hazards
    if o.kind in ("v", "a"):
        idx, file_a = o.index, o.kind == "a"
        n = 2 if wide else 1
        if wide:

            def r64(w: Wave) -> np.ndarray:
                if w.hazards.pending_regs:
                    hz.check_read(w, o.kind, idx, n, inst)
                f = w.a if file_a else w.v
                return f[idx].astype(np.uint64) | (f[idx + 1].astype(np.uint64) << np.uint64(32))

            return r64

        def r32(w: Wave) -> np.ndarray:
            if w.hazards.pending_regs:
                hz.check_read(w, o.kind, idx, 1, inst)
            return w.a[idx] if file_a else w.v[idx]

        return r32
    if o.kind == "s":
        idx = o.index
        if wide:
            return lambda w: np.uint64(w.s[idx] | (w.s[idx + 1] << 32))
        return lambda w: np.uint32(w.s[idx])
    if o.kind in ("imm", "fimm"):
        if wide:
            val64 = np.uint64(imm_value(o, width))
            return lambda w: val64
        val = np.uint32(imm_value(o, width))
        return lambda w: val
    if o.kind == "scc":
        return lambda w: np.uint32(w.scc)
    raise EmulatorError(f"unsupported vector operand {o}")


def fsrc(o: Operand, ctx: BindContext, inst: Inst) -> Callable[[Wave], np.ndarray]:
    """A closure reading an f32 source with its neg/abs modifiers applied."""
    raw = vreader(o, ctx, inst, "f32")
    neg, ab = o.neg, o.abs

    def r(w: Wave) -> np.ndarray:
        x = np.asarray(raw(w), np.uint32).view(np.float32)
        if ab:
            x = np.abs(x)
        if neg:
            x = -x
        return x

    return r


def vwriter(o: Operand, ctx: BindContext, inst: Inst, width: str = "b32") -> Callable[[Wave, Any], None]:
    """A closure writing a VALU result (uint32 array or uint64 for 64-bit types) under EXEC."""
    if o.kind not in ("v", "a"):
        raise EmulatorError(f"unsupported vector destination {o}")
    idx, kind = o.index, o.kind
    hz = ctx.hazards
    if width in ("b64", "f64"):

        def w64(w: Wave, val: Any) -> None:
            if w.hazards.pending_regs:
                hz.check_write(w, kind, idx, 2, inst)
            f = w.a if kind == "a" else w.v
            val = np.asarray(val, np.uint64)
            w.vwrite(f, idx, (val & np.uint64(0xFFFFFFFF)).astype(np.uint32))
            w.vwrite(f, idx + 1, (val >> np.uint64(32)).astype(np.uint32))

        return w64

    def w32(w: Wave, val: Any) -> None:
        if w.hazards.pending_regs:
            hz.check_write(w, kind, idx, 1, inst)
        w.vwrite(w.a if kind == "a" else w.v, idx, val)

    return w32


def as_f32(x: Any) -> np.ndarray:
    """Reinterpret uint32 lanes as float32."""
    return np.asarray(x, np.uint32).view(np.float32)


def as_u32(x: Any) -> np.ndarray:
    """Reinterpret float32 lanes as uint32 (and cast Python/numpy integers modulo 2**32)."""
    a = np.asarray(x)
    if a.dtype == np.float32:
        return a.view(np.uint32)
    if a.dtype == np.float64:
        return a.astype(np.float32).view(np.uint32)
    return a.astype(np.uint32) if a.dtype != np.uint32 else a


def bitmask_reader(o: Operand) -> Callable[[Wave], np.ndarray]:
    """A 64-bit lane mask source (VCC, an SGPR pair) as bool[64]."""
    from .machine import bits_to_mask

    if o.kind == "s":
        idx = o.index
        return lambda w: bits_to_mask(w.s[idx] | (w.s[idx + 1] << 32))
    if o.kind == "imm":
        m = bits_to_mask(int(o.value) & 0xFFFFFFFFFFFFFFFF)
        return lambda w: m
    raise EmulatorError(f"unsupported lane-mask operand {o}")
