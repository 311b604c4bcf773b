"""The ISA checks of a compiled config, and ``precompile``: every backed config's report.

What a config must compile to on gfx950 (the widest MFMA for its format, accumulators in AGPRs with no
moves in the K loop, registers and LDS within budget, no scratch), read from the code object's
disassembly and metadata notes; the K-loop report beside it (``kloop.py``). ``precompile`` fills the
compile cache (``compiled.py``) for the whole family and returns one report per config.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from .. import archs, llvm
from ..emulator import static_wait_states
from ..emulator.decode import Inst
from ..spec import Format
from . import kloop, matrix
from .compiled import compile_config
from .family import BACKED
from .kernels import mfma
from .kernels.config import KernelConfig

LDS_BUDGET = 160 * 1024
REGISTER_BUDGET = 512  # VGPR + AGPR per lane on gfx950

# The MFMA each operand format must compile to (the widest gfx950 offers; kernels/mfma.py issues it).
# FP8 uses the f8f6f4 MFMA, whose cbsz / blgp pick E4M3 or E5M2 per operand; MXFP8 its block-scaled form.
EXPECTED_MFMA = {
    Format.BF16: "v_mfma_f32_16x16x32_bf16",
    Format.FP16: "v_mfma_f32_16x16x32_f16",
    Format.FP32: "v_mfma_f32_16x16x4_f32",
    Format.FP8_E4M3: "v_mfma_f32_16x16x128_f8f6f4",
    Format.FP8_E5M2: "v_mfma_f32_16x16x128_f8f6f4",
    Format.MXFP8_E4M3: "v_mfma_scale_f32_16x16x128_f8f6f4",
    Format.MXFP8_E5M2: "v_mfma_scale_f32_16x16x128_f8f6f4",
}


def accumulators(cfg: KernelConfig) -> int:
    """fp32 accumulator registers per lane: the wave's share of the output tile (one per element)."""
    return cfg.tile_m * cfg.tile_n // (cfg.waves * 64)  # 64 lanes per wave


def accumulator_files(cfg: KernelConfig) -> tuple[int, int]:
    """(AGPRs, arch VGPRs) the accumulators take: pinned, the AGPRs first and the rest in arch VGPRs
    (``mfma.acc_file``); else all arch VGPRs (LLVM's own MFMAs)."""
    total = accumulators(cfg)
    if not cfg.agpr_accumulators:
        return 0, total
    return min(total, mfma.AGPRS), total - min(total, mfma.AGPRS)


_MOVES = ("v_accvgpr_read_b32", "v_accvgpr_write_b32", "v_accvgpr_mov_b32")


def accumulator_report(insts: list[Inst]) -> dict[str, int]:
    """Where a kernel's MFMAs accumulate in its K loops, read off its decoded one-kernel disassembly
    ``insts`` (``kloop.instructions``; a loop runs from a backward branch's target to the branch).

    ``agpr_accumulators`` / ``vgpr_accumulators``: distinct AGPRs / arch VGPRs that MFMAs inside loops
    write; ``not_in_place``: loop MFMAs whose D is not their C (the accumulator moves to other
    registers each iteration); ``loop_moves``: ``v_accvgpr_read/write/mov`` inside a loop (registers
    moved between the files in the K loop); ``loops``: how many loops.
    """
    bodies = [lp.body for lp in kloop.loops(insts)]
    regs: dict[str, set[int]] = {"a": set(), "v": set()}
    not_in_place = moves = 0
    for body in bodies:
        for i in body:
            moves += i.opcode in _MOVES
            if i.opcode.startswith("v_mfma") and i.operands[0].kind in regs:
                d, c = i.operands[0], i.operands[3]
                regs[d.kind].update(range(d.index, d.index + d.count))
                not_in_place += (c.kind, c.index, c.count) != (d.kind, d.index, d.count)
    return {
        "agpr_accumulators": len(regs["a"]),
        "vgpr_accumulators": len(regs["v"]),
        "not_in_place": not_in_place,
        "loop_moves": moves,
        "loops": len(bodies),
    }


def code_report(insts: list[Inst]) -> dict[str, Any]:
    """Instruction counts of a decoded one-kernel disassembly ``insts``: what the epilogue costs, and
    whether the K loop stayed as it was.

    ``loop_insts``: instructions per iteration of each loop (a backward branch's target to the branch),
    in code order; ``epilogue_insts``: instructions after the last loop's branch, to the end of the
    kernel (per wave, static: code that both sides of a branch hold is counted once per side, so the
    plain epilogue's two bodies, beta 0 and beta != 0, are both in it).
    """
    loops = [b for b in insts if b.branch_target is not None and b.branch_target <= b.address]
    sizes = [sum(1 for i in insts if b.branch_target <= i.address <= b.address) for b in loops]
    end = max((b.address for b in loops), default=-1)
    return {"loop_insts": sizes, "epilogue_insts": sum(1 for i in insts if i.address > end)}


def isa_report(cfg: KernelConfig, arch: str = "gfx950") -> dict[str, Any]:
    """The ISA budget checks of one config, with the numbers behind them.

    Checks: the expected MFMA opcode occurs, no scratch, no spills, static LDS within 160 KiB,
    VGPR + AGPR within 512 (``vgpr`` is the total, ``agpr`` its AGPR part), and ``accumulators``: the
    K loop's MFMAs accumulate in place (D is C) into exactly the config's :func:`accumulators`
    registers, split between the files as :func:`accumulator_files` says, and no loop moves a register
    between the files, and ``wait_states``: no path through the kernel breaks gfx950's wait-state rules
    (the emulator's rules, checked on every path without running: ``emulator/static_wait_states.py``;
    ``wait_state_hazards`` lists what breaks them).
    ``ok`` is True when all hold.
    ``kloop`` is the K-loop report (kloop.py: counts, XDL floor, llvm-mca cycles); it checks nothing.
    """
    ck = compile_config(cfg, arch)
    r = ck.resources
    mfma = EXPECTED_MFMA[cfg.lhs_format]
    text = llvm.disassemble(ck.code_object, arch)
    mfma_count = len(re.findall(rf"^\s+{mfma}\s", text, re.M))
    # Decoded once for every report below: three decodes left a cold config 0.91 s of CPU time outside
    # its compile, one 0.60 s (precompile --jobs 2, user time less the compile seconds).
    insts = kloop.instructions(text)
    acc = accumulator_report(insts)
    code = code_report(insts)
    hazards = static_wait_states.check(insts, ck.kernel)
    checks = {
        "mfma": mfma_count > 0,
        "scratch": r.scratch_bytes == 0,
        "spills": r.vgpr_spill_count == 0 and r.sgpr_spill_count == 0,
        "lds": r.lds_bytes <= LDS_BUDGET,
        "registers": r.vgpr_count <= REGISTER_BUDGET,
        "accumulators": acc["loops"] > 0
        and acc["loop_moves"] == 0
        and acc["not_in_place"] == 0
        and (acc["agpr_accumulators"], acc["vgpr_accumulators"]) == accumulator_files(cfg),
        "wait_states": not hazards,
    }
    return {
        "config": cfg.name,
        "plain_twin": dataclasses.replace(cfg, epilogue="plain").name,  # the same kernel with the plain store
        "arch": arch,
        "kernel": ck.kernel,
        "mfma": mfma,
        "mfma_count": mfma_count,
        "vgpr": r.vgpr_count,
        "agpr": r.agpr_count,
        **acc,
        **code,
        "sgpr": r.sgpr_count,
        "lds_bytes": r.lds_bytes,
        "scratch_bytes": r.scratch_bytes,
        "spills": r.vgpr_spill_count + r.sgpr_spill_count,
        "compile_s": round(ck.compile_seconds, 2),
        "from_disk": ck.from_disk,
        "kloop": kloop.report(insts, arch, cfg.wave_macs),
        "wait_state_hazards": [h.detail for h in hazards],
        "checks": checks,
        "ok": all(checks.values()),
    }


def precompile(
    arch: str = "gfx950",
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    configs: tuple[KernelConfig, ...] | None = None,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """Compile (or load) ``configs`` (default: :data:`BACKED`) and return one ISA report per config, in
    ``configs``' order.

    ``jobs`` > 1 compiles in that many worker processes: a config compiles on one core (FlyDSL's tracing in
    Python, then MLIR's and LLVM's passes), so a cold family compiles up to ``jobs`` times faster on as
    many cores; the workers fill the same disk cache (``compiled.py``'s writes are atomic).
    Workers are spawned, not forked, so none inherits a half-initialised LLVM or torch from the caller.
    ``progress(done, total, report)`` is called after each config, in the order they finish, for the
    CLI's progress display. An arch without kernels raises :class:`~te_flydsl_plugin.archs.ArchError`
    before anything compiles (LLVM aborts the process on some of them: gfx942 cannot expand gfx950's
    MFMAs); a worker that dies raises :class:`CompileCrash` naming a config it held.
    """
    arch = archs.require(arch, matrix.ARCHS)
    todo = BACKED if configs is None else configs
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    if jobs == 1 or len(todo) < 2:
        reports = []
        for i, cfg in enumerate(todo):
            reports.append(isa_report(cfg, arch))
            if progress is not None:
                progress(i + 1, len(todo), reports[-1])
        return reports
    return _precompile_in_workers(todo, arch, min(jobs, len(todo)), progress)


class CompileCrash(RuntimeError):
    """A compile worker process died (LLVM aborted, or the machine ran out of memory)."""


def _precompile_in_workers(
    todo: tuple[KernelConfig, ...],
    arch: str,
    jobs: int,
    progress: Callable[[int, int, dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    """:func:`precompile` over ``jobs`` spawned worker processes."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    reports: list[dict[str, Any] | None] = [None] * len(todo)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(isa_report, cfg, arch): i for i, cfg in enumerate(todo)}
        done = 0
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    i = pending.pop(future)
                    try:
                        reports[i] = future.result()
                    except BrokenProcessPool:
                        raise CompileCrash(
                            f"a compile worker died while {len(pending) + 1} config(s) were left, among them "
                            f"{todo[i].name}; `precompile --only {todo[i].name} --jobs 1` shows its own error"
                        ) from None
                    done += 1
                    if progress is not None:
                        progress(done, len(todo), reports[i])
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return [r for r in reports if r is not None]
