"""The execution trace a timing run needs: for each wave, the instructions it executed, in order.

Functional emulation decides control flow (loop trip counts, branches taken) and addresses; the
timing model (``timing.py``) replays the trace without re-executing anything. So the trace holds,
per executed instruction, only its index in the kernel and one number the replay cannot recompute:

* a DS instruction that touches LDS memory: the LDS clocks it occupies, from the addresses its lanes
  really use under gfx950's bank model (``lds_banks.BankModel``: broadcast, conflicts, 256 bytes per
  clock), so a bank conflict costs what it costs;
* a vector-memory instruction (``buffer_*``, ``global_*``, ``flat_*``): the bytes its active lanes move
  (EXEC decides, e.g. a partial tile's masked lanes move nothing);
* anything else: 0.

It is off by default: :func:`run.launch` wraps the steps only when given a ``Trace``. Trace one
workgroup (``launch(..., workgroups=[wg])``): the replay models one workgroup's waves on one CU.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from .decode import Inst
from .lds_banks import BankModel, accesses
from .machine import Wave

_VMEM = ("buffer_", "global_", "flat_", "scratch_")
# bytes per lane of a vector-memory opcode's data suffix (CDNA3 / CDNA4 ISA: MUBUF / FLAT opcodes)
_SUFFIX_BYTES = {"ubyte": 1, "sbyte": 1, "byte": 1, "ushort": 2, "sshort": 2, "short": 2, "dword": 4}
_SUFFIX_BYTES |= {"dwordx2": 8, "dwordx3": 12, "dwordx4": 16, "b32": 4, "b64": 8, "b96": 12, "b128": 16}
# atomics name their element type instead (a packed pair of 16-bit values is one dword)
_SUFFIX_BYTES |= {"pk_add_bf16": 4, "pk_add_f16": 4, "f32": 4, "u32": 4, "i32": 4, "f64": 8, "u64": 8, "x2": 8}
_SUFFIX = re.compile("_(" + "|".join(sorted(_SUFFIX_BYTES, key=len, reverse=True)) + ")(_|$)")


def vmem_lane_bytes(opcode: str) -> int:
    """Bytes one lane of a vector-memory instruction moves (0 if its width is not in the name)."""
    m = _SUFFIX.search(opcode)
    return _SUFFIX_BYTES[m.group(1)] if m else 0


class Trace:
    """Per wave, ``(instruction index, cost)`` of every executed instruction (module docstring)."""

    def __init__(self, model: BankModel | None = None) -> None:
        self.model = model or BankModel()
        self.insts: list[Inst] = []
        self.waves: list[list[tuple[int, int]]] = []

    def start(self, insts: list[Inst], nwaves: int) -> None:
        """Called by the launch: the kernel's instructions and its waves per workgroup (the lists are
        refilled in place: the wrapped steps hold them)."""
        self.insts = insts
        self.waves[:] = [[] for _ in range(nwaves)]

    def wrap(self, pc: int, inst: Inst, step: Callable[[Wave], None]) -> Callable[[Wave], None]:
        """``step`` preceded by recording it (and its cost) in the executing wave's list."""
        waves, model = self.waves, self.model
        ds = accesses(inst)
        if ds is not None:
            addr_reg, parts = ds

            def lds(w: Wave) -> None:
                base = w.v[addr_reg].astype(np.int64)
                clocks = sum(model.cycles(base + off, w.exec_mask, width)[0] for off, width in parts)
                waves[w.wave_id].append((pc, clocks))
                step(w)

            return lds
        if inst.opcode.startswith(_VMEM):
            lane = vmem_lane_bytes(inst.opcode)

            def vmem(w: Wave) -> None:
                waves[w.wave_id].append((pc, lane * int(w.exec_mask.sum())))
                step(w)

            return vmem

        def plain(w: Wave) -> None:
            waves[w.wave_id].append((pc, 0))
            step(w)

        return plain
