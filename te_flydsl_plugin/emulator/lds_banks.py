"""LDS bank conflicts: the cycles each executed ``ds_read*`` / ``ds_write*`` costs under gfx950's bank model.

The emulator knows the byte address every lane really uses, so the statistic is exact for the model,
whatever swizzle or layout algebra produced the addresses. The model (sources in docs/emulator.md):

* gfx950 (CDNA4) LDS has **64 banks of 4 bytes** (dword ``d`` lives in bank ``d % 64``) and reads
  **256 bytes per clock**: AMD's "FP8 GEMM Optimization on AMD CDNA4 Architecture" (ROCm blog, its
  table 1 from the CDNA4 ISA: 64 banks / 256 B per clock against CDNA3's 32 / 128); Modular's MAX
  kernels (``make_mma_swizzle``: "MI355X have 64 LDS banks x 4 bytes each").
* So one clock serves ``256 / width`` lanes of a wave (a *phase*): 16 lanes of a ``ds_read_b128``,
  32 of a ``ds_read_b64`` / ``ds_read_b64_tr_b*``, all 64 of a ``ds_read_b32`` or narrower (a b96
  access is served like a b128 one). The lanes of a phase are taken as consecutive (0-15, 16-31, ...):
  AMD documents no other grouping for gfx950 (HipKittens measured theirs on hardware, per
  instruction, with ``SQ_LDS_BANK_CONFLICT``; on gfx942 ``ds_read_b128`` groups non-consecutive
  lanes), so ``phase_lanes`` is a parameter of :class:`BankModel`, not a hidden constant.
* Within a phase, lanes that read the same dword share one access (broadcast); distinct dwords in one
  bank are served one per clock. A phase costs ``max over banks of distinct dwords in that bank``
  clocks; its conflict-free cost is ``ceil(distinct dwords / 64)`` (1 for a full phase).
* ``ds_read2*`` / ``ds_write2*`` are two accesses of the element size, each phased on its own.

Writes use the same model (gfx950's documented figure is the read bandwidth). Direct global->LDS
loads (``buffer_load ... lds``) are not counted: each lane writes ``M0 + offset + lane * size``,
consecutive dwords by construction. ``ds_bpermute`` / ``ds_permute`` touch no LDS memory.

The collector reads the address VGPR and offsets itself from the decoded instruction (the same
``vaddr + offset`` rule as ``ops_mem.py``, before the instruction runs) so that collecting needs no
hook inside the memory ops; :func:`run.launch` wraps the DS steps with it when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .decode import Inst
from .machine import LANES, Wave
from .ops_mem import DS_READ_BYTES, DS_READ_TR, DS_WRITE_BYTES, LDS_ADDRESS

BANKS = 64  # gfx950 LDS banks (AMD CDNA4 ISA via AMD's ROCm CDNA4 GEMM blog, table 1)
BANK_BYTES = 4
BYTES_PER_CLOCK = 256  # gfx950 LDS read bandwidth per CU per clock (same source)

# Bytes per lane of each counted DS opcode (one access; read2/write2 make two of the element size).
_WIDTH = {
    **DS_READ_BYTES,
    **DS_WRITE_BYTES,
    **{f"{k}_d16_hi": v for k, v in DS_WRITE_BYTES.items() if v <= 2},
    **dict.fromkeys(DS_READ_TR, 8),
}
_PAIRED = {"ds_read2_b32": 4, "ds_read2_b64": 8, "ds_read2st64_b32": 4, "ds_read2st64_b64": 8}
_PAIRED |= {k.replace("read", "write"): v for k, v in _PAIRED.items()}


@dataclass(frozen=True)
class BankModel:
    """Banks, bank width and bytes served per clock; ``phase_lanes(width)`` lanes share one clock."""

    banks: int = BANKS
    bank_bytes: int = BANK_BYTES
    bytes_per_clock: int = BYTES_PER_CLOCK

    def phase_lanes(self, width: int) -> int:
        """Lanes served per clock for ``width``-byte accesses (widths round up to a power of two, at
        least a dword: a b96 access takes a b128 slot, a byte access a dword)."""
        slot = max(self.bank_bytes, 1 << (width - 1).bit_length())
        return max(1, min(LANES, self.bytes_per_clock // slot))

    def cycles(self, addrs: np.ndarray, lanes: np.ndarray, width: int) -> tuple[int, int]:
        """(clocks, conflict-free clocks) of one access: ``addrs`` int64[64] byte addresses (VGPR + offset,
        wrapped to 32 bits here as the access itself is: ``ops_mem.LDS_ADDRESS``), ``lanes`` bool[64] the
        lanes that take part (EXEC)."""
        addrs = addrs & LDS_ADDRESS
        per = self.phase_lanes(width)
        words = -(-width // self.bank_bytes)
        spent = ideal = 0
        for p in range(0, LANES, per):
            act = lanes[p : p + per]
            if not act.any():
                continue
            dw = np.unique(((addrs[p : p + per][act] // self.bank_bytes)[:, None] + np.arange(words)).ravel())
            spent += int(np.bincount(dw % self.banks, minlength=self.banks).max())
            ideal += -(-dw.size // self.banks)
        return spent, ideal


@dataclass
class InstBanks:
    """What one DS instruction (by address) cost over a launch, summed over its executions and waves."""

    opcode: str
    executions: int = 0
    cycles: int = 0
    ideal_cycles: int = 0

    @property
    def conflict_cycles(self) -> int:
        return self.cycles - self.ideal_cycles


@dataclass
class BankStats:
    """Per-instruction LDS bank cycles of a launch (:func:`run.launch` with ``lds_banks=True``)."""

    model: BankModel = field(default_factory=BankModel)
    by_address: dict[int, InstBanks] = field(default_factory=dict)

    def wrap(self, inst: Inst, step: Callable[[Wave], None]) -> Callable[[Wave], None]:
        """``step`` preceded by counting its bank cycles, for a DS instruction that touches LDS memory;
        ``step`` itself for anything else."""
        acc = accesses(inst)
        if acc is None:
            return step
        addr_reg, parts = acc
        entry = self.by_address.setdefault(inst.address, InstBanks(inst.opcode))
        model = self.model

        def counted(w: Wave) -> None:
            base = w.v[addr_reg].astype(np.int64)
            lanes = w.exec_mask
            entry.executions += 1
            for off, width in parts:
                spent, ideal = model.cycles(base + off, lanes, width)
                entry.cycles += spent
                entry.ideal_cycles += ideal
            step(w)

        return counted

    def by_opcode(self, addresses: Callable[[int], bool] = lambda a: True) -> dict[str, dict[str, int]]:
        """Totals per opcode over the instructions whose address passes ``addresses``."""
        out: dict[str, dict[str, int]] = {}
        for a, e in sorted(self.by_address.items()):
            if not addresses(a) or not e.executions:
                continue
            t = out.setdefault(e.opcode, {"executions": 0, "cycles": 0, "ideal_cycles": 0, "conflict_cycles": 0})
            t["executions"] += e.executions
            t["cycles"] += e.cycles
            t["ideal_cycles"] += e.ideal_cycles
            t["conflict_cycles"] += e.conflict_cycles
        return out


def lane_bytes(inst: Inst) -> int:
    """LDS bytes one lane of a counted DS instruction reads or writes (0 for anything else)."""
    acc = accesses(inst)
    return sum(width for _, width in acc[1]) if acc is not None else 0


def accesses(inst: Inst) -> tuple[int, list[tuple[int, int]]] | None:
    """(address VGPR, [(byte offset, width), ...]) of a DS instruction that reads or writes LDS memory."""
    op = inst.opcode
    if op in _WIDTH:
        parts = [(inst.mod_int("offset", 0), _WIDTH[op])]
    elif op in _PAIRED:
        width = _PAIRED[op]
        unit = width * (64 if "st64" in op else 1)
        parts = [(inst.mod_int("offset0", 0) * unit, width), (inst.mod_int("offset1", 0) * unit, width)]
    else:
        return None
    addr = inst.operands[1] if op.startswith("ds_read") else inst.operands[0]
    if addr.kind != "v":
        return None
    return addr.index, parts
