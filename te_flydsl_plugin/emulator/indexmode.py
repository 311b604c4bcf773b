"""VGPR index mode: ``s_set_gpr_idx_on`` / ``s_set_gpr_idx_off`` (GCN "GPR indexing").

CDNA3 ISA, S_SET_GPR_IDX_ON: ``M0[7:0] = S0[7:0]``, ``M0[15:12]`` = the mode bits (SRC0, SRC1, SRC2,
DST), and until S_SET_GPR_IDX_OFF every vector instruction adds ``M0[7:0]`` to the register number of
the enabled operands that are vector registers (AMD's aiter f4gemm noBpreShuffle kernel walks its
AGPR accumulators with ``v_accvgpr_read_b32 vN, a0`` this way). LLVM prints the mode as
``gpr_idx(SRC0,...)`` (``AMDGPUInstPrinter::printGPRIdxMode``).

The emulator binds registers when a kernel is loaded, so the instructions between ON and OFF (in
program order; a branch in between is refused) are bound once per index value met at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .bind import BindContext, Step, op, sreader
from .decode import M0, Inst
from .errors import EmulatorError
from .machine import Wave

_MODE_BITS = {"SRC0": 1, "SRC1": 2, "SRC2": 4, "DST": 8}
_POSITION = {"DST": 0, "SRC0": 1, "SRC1": 2, "SRC2": 3}  # in a VOP instruction's operand list


def mode(inst: Inst) -> tuple[str, ...]:
    """The operands an ``s_set_gpr_idx_on`` makes relative, by name."""
    names = tuple(n for n in inst.modifiers.get("gpr_idx", "").split(",") if n)
    if not names or any(n not in _MODE_BITS for n in names):
        raise EmulatorError(f"cannot read the index mode of {inst.text!r}")
    return names


@op("s_set_gpr_idx_on")
def _on(inst: Inst, ctx: BindContext) -> Step:
    index = sreader(inst.operands[0])
    bits = sum(_MODE_BITS[n] for n in mode(inst)) << 12

    def step(w: Wave) -> None:
        w.s[M0] = (w.s[M0] & ~0xF0FF & 0xFFFFFFFF) | (index(w) & 0xFF) | bits

    return step


@op("s_set_gpr_idx_off")
def _off(inst: Inst, ctx: BindContext) -> Step:
    return lambda w: None  # the mode ends here; which instructions it covers is settled at bind time


def indexed(inst: Inst, ctx: BindContext, binder: Callable[[Inst, BindContext], Step], names: tuple[str, ...]) -> Step:
    """The step of a vector instruction inside an index-mode region: its enabled vector-register
    operands shifted by ``M0[7:0]``, bound on first use of each index value."""
    if inst.opcode.startswith(("s_cbranch", "s_branch", "s_setpc", "s_swappc")):
        raise EmulatorError(f"{ctx.kernel}: a branch inside VGPR index mode at 0x{inst.address:x} is not emulated")
    if not inst.opcode.startswith("v_"):
        return binder(inst, ctx)
    cache: dict[int, Step] = {}

    def bound(offset: int) -> Step:
        ops = list(inst.operands)
        for n in names:
            i = _POSITION[n]
            if i < len(ops) and ops[i].kind in ("v", "a"):
                ops[i] = replace(ops[i], index=ops[i].index + offset)
        return binder(replace(inst, operands=ops), ctx)

    def step(w: Wave) -> None:
        offset = w.s[M0] & 0xFF
        s = cache.get(offset)
        if s is None:
            s = cache[offset] = bound(offset)
        s(w)

    return step
