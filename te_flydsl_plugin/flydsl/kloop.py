"""The K-loop report: what one steady-state K iteration of a compiled kernel costs, read off its machine code.

No gfx950 runs here, so the figures are static or predicted: instruction counts of the loop body,
the XDL floor (the MFMA passes it must issue), llvm-mca's cycles per iteration under LLVM's gfx950
scheduling model, and, from the emulator, the LDS bank-conflict cycles the lanes' real addresses cost.

Units. LLVM's AMDGPU scheduling model counts one *cycle* per issue slot of a wave, 4 clocks
(``SISchedule.td``: "The latency values are 1 / (operations / cycle) / 4"), and an MFMA of N passes
holds the XDL pipe for N of them (``Write{2,4,8,16}PassMAI``: ``ReleaseAtCycles = [N]``). A pass is
4 clocks (AMD's CDNA3/CDNA4 ISA guides list MFMA cost in passes of 4 cycles: 16x16x32 bf16 is 4
passes = 16 clocks = 16384 FLOP / 1024 per clock and SIMD, MI355X's 2.5 PFLOP/s at 2.4 GHz). So the
floor in model cycles is the sum of passes, ``xdl_floor_clocks`` is 4x that, and ``ratio`` is
llvm-mca's cycles over the floor.

FP8 correction. On gfx950 ``v_mfma[_scale]_f32_16x16x128_f8f6f4`` takes 8 passes when either operand
is FP8 (``cbsz`` or ``blgp`` <= 1), else 4; 32x32x64 takes 16 / 8. LLVM selects this through
``PredIsF8_MFMA_SCALE``, a ``SchedPredicate`` on the MachineInstr (C++, ``TII->getNamedOperand``)
that llvm-mca, working on MCInsts, cannot evaluate, so it takes the variant's default (4 / 8
passes); ``SISchedule.td`` says so itself ("TODO: This isn't reflected in MCA"). So each such FP8
MFMA reaches llvm-mca as an f32 MFMA of the same shape class and the right passes
(``v_mfma_f32_16x16x4_f32``: 8, ``v_mfma_f32_32x32x2_f32``: 16, both on the XDL pipe in the gfx950
model) with the same accumulators and the first register of each source: issue slots and pipe
occupancy exact, only the dependencies on the other source registers lost (the loop's ``s_waitcnt``
still orders the loads): ``mca_cycles``. ``mca_cycles_upper`` feeds the original twice, in place
(exact dependencies, one issue slot too many per FP8 MFMA), ``mca_cycles_uncorrected`` as is.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import llvm
from ..emulator.decode import Inst, Operand, decode_text
from ..emulator.hazards import mfma_timing, wait_states
from ..emulator.lds_banks import lane_bytes
from ..emulator.machine import LANES

CLOCKS_PER_PASS = 4  # AMD CDNA3 / CDNA4 ISA guides: an MFMA pass is 4 clocks; SISchedule.td's cycle unit
# Steady state = the cycle difference of two runs over their iteration difference (fill and drain cancel);
# our loops reach it at once: (2, 4), (10, 20) and (50, 100) give the same figures.
MCA_ITERATIONS = (4, 8)
_MCA_TIMEOUT_S = 120


@dataclass(frozen=True)
class Loop:
    """A loop of the disassembly: the instructions from a backward branch's target to the branch."""

    start: int
    end: int
    body: tuple[Inst, ...]

    def contains(self, address: int) -> bool:
        return self.start <= address <= self.end


def instructions(text: str) -> list[Inst]:
    """The decoded instructions of a disassembly (``llvm-objdump -d``), every kernel in it, in order."""
    return [i for kernel in decode_text(text).values() for i in kernel]


def loops(insts: Sequence[Inst]) -> list[Loop]:
    """Every loop: one per backward branch (a branch whose target is at or before it)."""
    return [
        Loop(b.branch_target, b.address, tuple(i for i in insts if b.branch_target <= i.address <= b.address))
        for b in insts
        if b.branch_target is not None and b.branch_target <= b.address
    ]


def is_mfma(inst: Inst) -> bool:
    return inst.opcode.startswith("v_mfma")


def k_loop(insts: Sequence[Inst]) -> Loop | None:
    """The K loop: of the innermost loops (no other loop inside), the one with the most MFMAs; None
    when no loop holds an MFMA. Robust to a prologue/epilogue loop, to nesting (an outer tile loop)
    and to where the compiler places the loop in the code."""
    found = loops(insts)
    inner = [lp for lp in found if not any(o is not lp and lp.contains(o.start) and lp.contains(o.end) for o in found)]
    best = max(inner, key=lambda lp: sum(map(is_mfma, lp.body)), default=None)
    return best if best is not None and any(map(is_mfma, best.body)) else None


def passes(inst: Inst) -> int:
    """gfx950 passes of an MFMA (the emulator's table, from SISchedule.td); ValueError for one it lacks."""
    t = mfma_timing(inst.opcode, inst.mod_int("cbsz", 0), inst.mod_int("blgp", 0))
    if t is None:
        raise ValueError(f"no gfx950 pass count for {inst.opcode} (add it to emulator/hazards._PASSES)")
    return t[0]


def _mca_undercounts(inst: Inst) -> bool:
    """An f8f6f4 MFMA with an FP8 operand (``cbsz`` or ``blgp`` <= 1: E4M3 / E5M2), whose doubled
    passes llvm-mca does not see (module docstring)."""
    return "f8f6f4" in inst.opcode and min(inst.mod_int("cbsz", 0), inst.mod_int("blgp", 0)) <= 1


_CLASSES = (
    ("mfma", lambda op: op.startswith("v_mfma")),
    ("ds", lambda op: op.startswith("ds_")),
    ("vmem", lambda op: op.startswith(("buffer_", "global_", "scratch_", "flat_"))),
    ("smem", lambda op: op.startswith("s_load") or op.startswith("s_buffer_load")),
    ("s_waitcnt", lambda op: op.startswith("s_waitcnt")),
    ("s_nop", lambda op: op == "s_nop"),
    ("s_barrier", lambda op: op == "s_barrier"),
    ("branch", lambda op: op.startswith(("s_cbranch", "s_branch"))),
    ("salu", lambda op: op.startswith("s_")),
    ("valu", lambda op: op.startswith("v_")),
)


def _class(opcode: str) -> str:
    return next((name for name, pred in _CLASSES if pred(opcode)), "other")


_DMA_WIDTH = {"dword": 4, "dwordx3": 12, "dwordx4": 16, "ubyte": 1, "sbyte": 1, "ushort": 2, "sshort": 2}


def _dma_bytes(inst: Inst) -> int:
    """LDS bytes one lane of a direct global->LDS load writes (``buffer_load_* ... lds``,
    ``global_load_lds_*``); 0 for anything else."""
    op = inst.opcode
    if op.startswith("buffer_load_") and "lds" in inst.modifiers:
        return _DMA_WIDTH.get(op.removeprefix("buffer_load_"), 0)
    if op.startswith("global_load_lds_"):
        return _DMA_WIDTH.get(op.removeprefix("global_load_lds_"), 0)
    return 0


def static_report(body: Sequence[Inst]) -> dict[str, Any]:
    """The counts of one loop body: instructions, MFMAs, passes, floor, issue slots, by class."""
    mfmas = [i for i in body if is_mfma(i)]
    total_passes = sum(map(passes, mfmas))
    slots = sum(wait_states(i) for i in body if not is_mfma(i))  # an s_nop N takes N + 1 issue slots
    classes: dict[str, int] = {name: 0 for name, _ in _CLASSES} | {"other": 0}
    for i in body:
        classes[_class(i.opcode)] += 1
    return {
        "instructions": len(body),
        "mfma": len(mfmas),
        "mfma_passes": total_passes,
        "xdl_floor": total_passes,
        "xdl_floor_clocks": total_passes * CLOCKS_PER_PASS,
        "non_mfma_slots": slots,
        "slots_per_pass": round(slots / total_passes, 3) if total_passes else None,
        "nop_wait_states": sum(wait_states(i) for i in body if i.opcode == "s_nop"),
        # LDS traffic of one wave per iteration: DS reads / writes, and direct global->LDS loads (DMA)
        "lds_read_bytes": LANES * sum(lane_bytes(i) for i in body if i.opcode.startswith("ds_read")),
        "lds_write_bytes": LANES * sum(lane_bytes(i) for i in body if i.opcode.startswith("ds_write"))
        + LANES * sum(_dma_bytes(i) for i in body),
        "by_class": classes,
    }


def mca_tool() -> str | None:
    """llvm-mca >= 18 (Debian's llvm-22 or ROCm's), or None."""

    return llvm.llvm_tool("llvm-mca")


# The f32 MFMA llvm-mca times with the passes of an FP8 f8f6f4 one of the same size (SISchedule.td's
# gfx950 model: V_MFMA_F32_16X16X4F32 -> Write8PassMAI, V_MFMA_F32_32X32X2F32 -> Write16PassMAI).
_STAND_IN = {"16x16x128": "v_mfma_f32_16x16x4_f32", "32x32x64": "v_mfma_f32_32x32x2_f32"}
FP8_CORRECTIONS = ("substitute", "duplicate", "none")


def _reg(o: Operand) -> str:
    return f"{o.kind}{o.index}" if o.count == 1 else f"{o.kind}[{o.index}:{o.index + o.count - 1}]"


def mca_text(body: Sequence[Inst], fp8: str = "substitute") -> str:
    """The loop body as llvm-mca input: LLVM's own text of each instruction, an FP8 f8f6f4 MFMA
    replaced by its stand-in (``substitute``), issued twice (``duplicate``) or left alone (``none``)."""
    if fp8 not in FP8_CORRECTIONS:
        raise ValueError(f"fp8 must be one of {FP8_CORRECTIONS}, got {fp8!r}")
    lines = []
    for i in body:
        if fp8 == "none" or not (is_mfma(i) and _mca_undercounts(i)):
            lines.append(i.text)
        elif fp8 == "duplicate":
            lines += [i.text, i.text]
        else:
            d, a, b, c = i.operands[:4]
            shape = next(k for k in _STAND_IN if k in i.opcode)
            lines.append(f"{_STAND_IN[shape]} {_reg(d)}, v{a.index}, v{b.index}, {_reg(c)}")
    return "\n".join(lines) + "\n"


def _mca_totals(tool: str, texts: Sequence[str], arch: str, iterations: int) -> list[int]:
    """llvm-mca's total cycles of each text over ``iterations``, all in one run (one code region each)."""
    regions = "".join(f"# LLVM-MCA-BEGIN r{n}\n{t}# LLVM-MCA-END r{n}\n" for n, t in enumerate(texts))
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write(regions)
        path = f.name
    try:
        res = subprocess.run(
            [tool, "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={arch}", f"-iterations={iterations}", path],
            capture_output=True,
            text=True,
            timeout=_MCA_TIMEOUT_S,
        )
    finally:
        os.unlink(path)
    if res.returncode:
        raise RuntimeError(f"llvm-mca failed: {res.stderr.strip().splitlines()[0] if res.stderr.strip() else '?'}")
    totals = [int(line.split(":")[1]) for line in res.stdout.splitlines() if line.startswith("Total Cycles:")]
    if len(totals) != len(texts):
        raise RuntimeError(f"llvm-mca printed {len(totals)} 'Total Cycles' for {len(texts)} regions")
    return totals


def mca_cycles(body: Sequence[Inst], arch: str = "gfx950", fp8: Sequence[str] = ("substitute",)) -> list[float]:
    """llvm-mca's cycles per steady-state iteration of ``body`` (model cycles of 4 clocks), one figure
    per FP8 correction in ``fp8`` (:func:`mca_text`)."""
    tool = mca_tool()
    if tool is None:
        raise FileNotFoundError("llvm-mca >= 18 not found: apt-get install llvm-22")
    texts = [mca_text(body, f) for f in fp8]
    lo, hi = (_mca_totals(tool, texts, arch, n) for n in MCA_ITERATIONS)
    return [(h - low) / (MCA_ITERATIONS[1] - MCA_ITERATIONS[0]) for low, h in zip(lo, hi, strict=True)]


def macs(inst: Inst) -> int:
    """Multiply-accumulates of one MFMA per lane-group, M * N * K from its mnemonic (``..._16x16x128_...``)."""
    shape = _SHAPE.search(inst.opcode)
    if shape is None:
        raise ValueError(f"no MxNxK in {inst.opcode}")
    m, n, k = map(int, shape.groups())
    return m * n * k


_SHAPE = re.compile(r"_(\d+)x(\d+)x(\d+)")


def k_tiles(loop: Loop, tile_macs: int) -> float:
    """The K tiles one iteration of ``loop`` multiplies, given one wave's multiply-accumulates of a tile."""
    return round(sum(macs(i) for i in loop.body if is_mfma(i)) / tile_macs, 3)


def report(insts: Sequence[Inst], arch: str = "gfx950", tile_macs: int | None = None) -> dict[str, Any]:
    """The ``kloop`` object of one kernel's decoded instructions (precompile's report).

    ``found`` False (and nothing else) when no loop holds an MFMA. llvm-mca's figures are None, with
    the reason in ``mca_note``, when llvm-mca is absent or fails; the static counts never depend on it.
    Every figure is of one loop iteration; ``tile_macs`` (one wave's multiply-accumulates of one K tile)
    gives ``k_tiles``, the K tiles an iteration multiplies (MXFP8's loop runs four, one scale-word group).
    """
    lp = k_loop(insts)
    if lp is None:
        return {"found": False}
    rep: dict[str, Any] = {"found": True, "start": f"0x{lp.start:x}", "end": f"0x{lp.end:x}"}
    rep |= static_report(lp.body)
    if tile_macs:
        rep["k_tiles"] = k_tiles(lp, tile_macs)
    rep["fp8_mfma_corrected"] = sum(1 for i in lp.body if is_mfma(i) and _mca_undercounts(i))
    keys = {"substitute": "mca_cycles", "duplicate": "mca_cycles_upper", "none": "mca_cycles_uncorrected"}
    try:
        variants = list(keys) if rep["fp8_mfma_corrected"] else ["none"]  # without FP8 MFMAs they agree
        figures = dict(zip(variants, mca_cycles(lp.body, arch, variants), strict=True))
        rep |= {key: figures.get(fp8, figures["none"]) for fp8, key in keys.items()}
        rep["ratio"] = round(rep["mca_cycles"] / rep["xdl_floor"], 3)
        rep["mca_note"] = None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        rep |= dict.fromkeys(keys.values()) | {"ratio": None, "mca_note": str(exc)}
    return rep
