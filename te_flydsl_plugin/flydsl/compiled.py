"""Compile cache of the GEMM family: keyed by KernelConfig + arch, never by M/N/K.

Two levels: an in-process dict (one compile per key even when threads race: a per-key lock), and a
directory on disk (``$TE_FLYDSL_CACHE_DIR``, else ``~/.cache/te-flydsl-plugin/kernels``) that several
processes may share: each entry is written to a private temporary name and published with an atomic
``os.replace``, the metadata file last, so a reader sees a whole entry or none. The key also hashes
the kernel sources and the FlyDSL version, so an edited kernel never meets a stale code object.

``BACKED`` lists the configs that compile for gfx950, pass :func:`isa_report` and matched a torch
reference in the gfx950 emulator; only they may back a capability-matrix row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import llvm
from ..host import archs
from ..spec import Format
from . import kloop, matrix, toolchain
from .family import BACKED
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


@dataclass(frozen=True)
class CompiledKernel:
    """One config's gfx950 code object and what the compiler made of it."""

    config: KernelConfig
    arch: str
    kernel: str  # the kernel symbol inside the code object
    code_object: bytes
    resources: toolchain.KernelResources
    compile_seconds: float  # of the compile that produced it (also when it came from disk)
    from_disk: bool


def _cache_dir() -> Path:
    env = os.environ.get("TE_FLYDSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "te-flydsl-plugin" / "kernels"


def _source_digest() -> str:
    import flydsl

    h = hashlib.sha256(getattr(flydsl, "__version__", "?").encode())
    for f in sorted((Path(__file__).parent / "kernels").glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_digest: str | None = None
_memory: dict[tuple[str, str], CompiledKernel] = {}
_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def cache_key(cfg: KernelConfig, arch: str) -> str:
    """The on-disk entry name of a config: its name plus a digest of arch, sources and FlyDSL version."""
    global _digest
    if _digest is None:
        _digest = _source_digest()
    tail = hashlib.sha256(f"{cfg!r}|{arch}|{_digest}".encode()).hexdigest()[:16]
    return f"{cfg.name}-{arch}-{tail}"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(cfg: KernelConfig, arch: str, key: str) -> CompiledKernel | None:
    meta_path = _cache_dir() / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        blob = (_cache_dir() / f"{key}.hsaco").read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        return None  # a torn or foreign entry: recompile and overwrite it
    res = toolchain.KernelResources(**meta["resources"])
    return CompiledKernel(cfg, arch, meta["kernel"], blob, res, meta["compile_seconds"], True)


def _compile(cfg: KernelConfig, arch: str) -> CompiledKernel:
    archs.require(arch, matrix.ARCHS)  # an ArchError, not LLVM aborting the process on gfx942
    import flydsl.compiler as flyc

    from .kernels import gemm

    start = time.perf_counter()
    with toolchain.compile_for(arch):
        compiled = flyc.compile(gemm.gemm_launch, *gemm.placeholder_args(cfg))
    seconds = time.perf_counter() - start
    objects = toolchain.code_objects(compiled)
    if len(objects) != 1:
        raise RuntimeError(f"{cfg.name}: expected one code object, got {sorted(objects)}")
    blob = next(iter(objects.values()))
    kernels = toolchain.kernel_resources(blob)
    if len(kernels) != 1:
        raise RuntimeError(f"{cfg.name}: expected one kernel, got {[k.name for k in kernels]}")
    return CompiledKernel(cfg, arch, kernels[0].name, blob, kernels[0], seconds, False)


def compile_config(cfg: KernelConfig, arch: str = "gfx950") -> CompiledKernel:
    """The compiled kernel of ``cfg`` for ``arch``: from memory, else from disk, else compiled now."""
    mem_key = (repr(cfg), arch)
    hit = _memory.get(mem_key)
    if hit is not None:
        return hit
    with _locks_guard:
        lock = _locks.setdefault(mem_key, threading.Lock())
    with lock:
        hit = _memory.get(mem_key)
        if hit is not None:
            return hit
        key = cache_key(cfg, arch)
        ck = _load(cfg, arch, key)
        if ck is None:
            ck = _compile(cfg, arch)
            meta = {
                "config": cfg.name,
                "arch": arch,
                "kernel": ck.kernel,
                "compile_seconds": ck.compile_seconds,
                "sha256": hashlib.sha256(ck.code_object).hexdigest(),
                "resources": asdict(ck.resources),
            }
            _atomic_write(_cache_dir() / f"{key}.hsaco", ck.code_object)
            _atomic_write(_cache_dir() / f"{key}.json", json.dumps(meta, indent=1).encode())
        _memory[mem_key] = ck
        return ck


_launchers: dict[tuple[str, str], Any] = {}  # (config name, arch) -> compiled function
_launchers_lock = threading.Lock()


def launcher(cfg: KernelConfig, args: tuple, arch: str = "gfx950") -> Any:
    """The in-process FlyDSL ``CompiledFunction`` of ``cfg`` for this machine's GPU (flydsl executor).

    Compiled once per process, for ``arch`` (FlyDSL's target comes from the environment, which would
    otherwise default to gfx942), from the first launch's own arguments ``args`` (``gemm.jit_args``:
    the GPU tensors' dtypes and dynamic layouts; shapes are runtime values, so any later launch of
    the config reuses it). FlyDSL's own on-disk cache makes the compile cheap in a new process.
    Calling the result launches on the stream passed as its last argument.
    """
    with _launchers_lock:
        fn = _launchers.get((cfg.name, arch))
        if fn is None:
            import flydsl.compiler as flyc

            from .kernels import gemm

            with toolchain.compile_for(arch):
                fn = flyc.compile(gemm.gemm_launch, *args)
            _launchers[cfg.name, arch] = fn
        return fn


def accumulators(cfg: KernelConfig) -> int:
    """fp32 accumulator registers per lane: the wave's share of the output tile (one per element)."""
    return cfg.tile_m * cfg.tile_n // (cfg.waves * 64)  # 64 lanes per wave


_MOVES = ("v_accvgpr_read_b32", "v_accvgpr_write_b32", "v_accvgpr_mov_b32")


def accumulator_report(text: str) -> dict[str, int]:
    """Where a kernel's MFMAs accumulate in its K loops, read off its one-kernel disassembly ``text``
    (decoded by the emulator's decoder; a loop runs from a backward branch's target to the branch).

    ``agpr_accumulators`` / ``vgpr_accumulators``: distinct AGPRs / arch VGPRs that MFMAs inside loops
    write; ``not_in_place``: loop MFMAs whose D is not their C (the accumulator moves to other
    registers each iteration); ``loop_moves``: ``v_accvgpr_read/write/mov`` inside a loop (registers
    moved between the files in the K loop); ``loops``: how many loops.
    """
    bodies = [lp.body for lp in kloop.loops(kloop.instructions(text))]
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


def code_report(text: str) -> dict[str, Any]:
    """Instruction counts of a one-kernel disassembly ``text``: what the epilogue costs, and whether the
    K loop stayed as it was.

    ``loop_insts``: instructions per iteration of each loop (a backward branch's target to the branch),
    in code order; ``epilogue_insts``: instructions after the last loop's branch, to the end of the
    kernel (per wave, static: code that both sides of a branch hold is counted once per side, so the
    plain epilogue's two bodies, beta 0 and beta != 0, are both in it).
    """
    from ..emulator.decode import decode_text

    insts = [i for kernel in decode_text(text).values() for i in kernel]
    loops = [b for b in insts if b.branch_target is not None and b.branch_target <= b.address]
    sizes = [sum(1 for i in insts if b.branch_target <= i.address <= b.address) for b in loops]
    end = max((b.address for b in loops), default=-1)
    return {"loop_insts": sizes, "epilogue_insts": sum(1 for i in insts if i.address > end)}


def isa_report(cfg: KernelConfig, arch: str = "gfx950") -> dict[str, Any]:
    """The ISA budget checks of one config, with the numbers behind them.

    Checks: the expected MFMA opcode occurs, no scratch, no spills, static LDS within 160 KiB,
    VGPR + AGPR within 512 (``vgpr`` is the total, ``agpr`` its AGPR part), and ``accumulators``: the
    K loop's MFMAs accumulate in place (D is C) into exactly the config's :func:`accumulators`
    registers, all AGPRs where ``cfg.agpr_accumulators`` (kernels/mfma.py pins them) and all arch
    VGPRs otherwise, and no loop moves a register between the files. ``ok`` is True when all hold.
    ``kloop`` is the K-loop report (kloop.py: counts, XDL floor, llvm-mca cycles); it checks nothing.
    """
    ck = compile_config(cfg, arch)
    r = ck.resources
    mfma = EXPECTED_MFMA[cfg.lhs_format]
    text = llvm.disassemble(ck.code_object, arch)
    mfma_count = len(re.findall(rf"^\s+{mfma}\s", text, re.M))
    acc = accumulator_report(text)
    code = code_report(text)
    checks = {
        "mfma": mfma_count > 0,
        "scratch": r.scratch_bytes == 0,
        "spills": r.vgpr_spill_count == 0 and r.sgpr_spill_count == 0,
        "lds": r.lds_bytes <= LDS_BUDGET,
        "registers": r.vgpr_count <= REGISTER_BUDGET,
        "accumulators": acc["loops"] > 0
        and acc["loop_moves"] == 0
        and acc["not_in_place"] == 0
        and acc["agpr_accumulators" if cfg.agpr_accumulators else "vgpr_accumulators"] == accumulators(cfg)
        and acc["vgpr_accumulators" if cfg.agpr_accumulators else "agpr_accumulators"] == 0,
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
        "kloop": kloop.report(kloop.instructions(text), arch),
        "checks": checks,
        "ok": all(checks.values()),
    }


def precompile(
    arch: str = "gfx950",
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    configs: tuple[KernelConfig, ...] | None = None,
) -> list[dict[str, Any]]:
    """Compile (or load) ``configs`` (default: :data:`BACKED`) and return one ISA report per config.

    ``progress(done, total, report)`` is called after each config, for the CLI's progress display.
    An arch without kernels raises :class:`~te_flydsl_plugin.host.archs.ArchError` before anything
    compiles (LLVM aborts the process on some of them: gfx942 cannot expand gfx950's MFMAs).
    """
    arch = archs.require(arch, matrix.ARCHS)
    todo = BACKED if configs is None else configs
    reports = []
    for i, cfg in enumerate(todo):
        rep = isa_report(cfg, arch)
        reports.append(rep)
        if progress is not None:
            progress(i + 1, len(todo), rep)
    return reports
