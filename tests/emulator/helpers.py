"""Shared pieces of the emulator tests: skip reasons, compiling test kernels, running bare instructions,
and breaking a compiled kernel on purpose (one instruction word replaced)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from te_flydsl_plugin import llvm
from te_flydsl_plugin.emulator import run as emu_run
from te_flydsl_plugin.emulator.bind import BindContext
from te_flydsl_plugin.emulator.codeobject import _sections
from te_flydsl_plugin.emulator.decode import Inst, parse_line
from te_flydsl_plugin.emulator.hazards import HazardTracker
from te_flydsl_plugin.emulator.lds_banks import BankStats
from te_flydsl_plugin.emulator.machine import HostMemory, Wave
from te_flydsl_plugin.emulator.trace import Trace
from te_flydsl_plugin.flydsl import toolchain

needs_toolchain = pytest.mark.skipif(
    llvm.find_ld_lld() is None or llvm.llvm_tool("llvm-objdump") is None,
    reason="no ld.lld >= 18 / llvm-objdump >= 18 here: install lld-22 and llvm-22 (or ROCm) to compile for gfx950",
)
needs_objdump = pytest.mark.skipif(
    llvm.llvm_tool("llvm-objdump") is None,
    reason="no llvm-objdump >= 18 here: install llvm-22 (the emulator decodes its disassembly)",
)

S_NOP = 0xBF800000  # s_nop 0: what a removed instruction is replaced with
S_TRAP = 0xBF920002  # s_trap 2: an instruction the emulator refuses


@functools.cache
def kernel_module(name: str) -> Any:
    """A test kernel module from tests/emulator/kernels (FlyDSL reads kernel source from real files)."""
    here = str(Path(__file__).parent / "kernels")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def compile_kernel(module: str, fn: str, *args: Any) -> bytes:
    """Compile ``module.fn(*args)`` for gfx950 and return its (only) code object."""
    import flydsl.compiler as flyc

    os.environ.setdefault("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    with toolchain.compile_for("gfx950"):
        compiled = flyc.compile(getattr(kernel_module(module), fn), *args)
    (co,) = toolchain.code_objects(compiled).values()
    return co


def patch_word(code_object: bytes, address: int, word: int) -> bytes:
    """The code object with the 32-bit instruction word at ``address`` replaced (a broken kernel)."""
    raw = bytearray(code_object)
    for s in _sections(code_object):
        if s["name"] == ".text" and int(s["addr"]) <= address < int(s["addr"]) + int(s["size"]):
            struct.pack_into("<I", raw, address - int(s["addr"]) + int(s["off"]), word)
            return bytes(raw)
    raise ValueError(f"0x{address:x} is not in .text")


def instructions(code_object: bytes, kernel: str) -> list[Inst]:
    """The decoded instructions of one kernel."""
    from te_flydsl_plugin.emulator.decode import decode_text

    return decode_text(llvm.disassemble(code_object))[kernel]


class Program:
    """Bare instructions (assembly text, one per line) executed on fresh waves without a code object.

    This is how single instructions are tested against their documented semantics: set registers,
    run, read registers. ``setup(wave)`` runs before the code on every wave. Instructions sit 8 bytes
    apart from 0x1000; a branch operand counts instructions relative to the one after the branch.
    """

    def __init__(
        self,
        asm: str,
        lds_bytes: int = 0,
        hazards: str = "raise",
        banks: BankStats | None = None,
        trace: Trace | None = None,
    ) -> None:
        lines = [ln.strip() for ln in asm.strip().splitlines() if ln.strip()]
        self.insts = [parse_line(ln, 0x1000 + 8 * i, (0,)) for i, ln in enumerate(lines)]
        for i, inst in enumerate(self.insts):  # here a branch operand counts instructions after the branch
            if inst.opcode.startswith(("s_branch", "s_cbranch")) and inst.operands:
                inst.branch_target = 0x1000 + 8 * (i + 1 + int(inst.operands[0].value))
        self.lds = np.zeros(max(lds_bytes, 1), np.uint8)
        self.tracker = HazardTracker("test", hazards, self.lds)
        self.ctx = ctx = BindContext(
            kernel="test",
            address_to_index={inst.address: i for i, inst in enumerate(self.insts)},
            memory=HostMemory(),
            lds=self.lds,
            hazards=self.tracker,
        )
        self.trace = trace
        self.steps = emu_run._bind(self.insts, ctx, banks, trace)

    def run(self, setup: Callable[[Wave], None] | None = None, waves: int = 1) -> list[Wave]:
        """Run the program on ``waves`` waves of one workgroup, scheduled as ``launch`` does: each wave
        runs until ``s_barrier`` (or the end), and the barrier releases when all have reached it."""
        ws = [Wave(i, 512, 256) for i in range(waves)]
        if self.trace is not None:
            self.trace.start(self.insts, waves)
        self.tracker.reset_workgroup((0, 0, 0), ws)
        for w in ws:
            w.set_exec((1 << 64) - 1)
            if setup is not None:
                setup(w)
        while not all(w.done for w in ws):
            for w in ws:
                while not w.done and not w.at_barrier:
                    if w.pc >= len(self.steps):
                        w.done = True
                        break
                    w.pc += 1
                    with contextlib.suppress(emu_run._Yield):  # a barrier or the end: the loop checks which
                        self.steps[w.pc - 1](w)
            for w in ws:
                w.at_barrier = False
            self.tracker.barrier_released()
        return ws


def vset(w: Wave, reg: int, values: Any) -> None:
    """Set a VGPR's 64 lanes from any array-like of raw 32-bit values (or floats, as f32 bits)."""
    a = np.asarray(values)
    if a.dtype.kind == "f":
        a = a.astype(np.float32).view(np.uint32)
    w.v[reg] = np.broadcast_to(a.astype(np.uint32), (64,))


def vf32(w: Wave, reg: int) -> np.ndarray:
    """A VGPR as float32[64]."""
    return w.v[reg].view(np.float32)
