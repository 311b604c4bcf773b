"""The launch entry point: dispatch a kernel of a code object over a grid, on the CPU.

The dispatch model follows what the hardware and the HSA runtime do: the kernel descriptor says
which SGPRs are initialised (kernarg pointer, workgroup ids, ...), work-item ids are packed into
v0 (gfx90a+: x | y << 10 | z << 20), waves of a workgroup take consecutive flat thread ids, and a
partial last wave runs with the missing lanes off in EXEC. Workgroups run one after another; the
waves of one workgroup run in turn, each until it reaches ``s_barrier`` or ends, and the barrier
releases when every live wave has reached it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import gc
import itertools
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .. import llvm
from . import indexmode, ops_cvt, ops_mem, ops_mfma, ops_salu, ops_valu  # noqa: F401  (register the opcodes)
from .bind import OPS, BindContext, Binder, Step, base_opcode
from .codeobject import CodeObject, Kernel, parse
from .decode import Inst, decode_text
from .errors import EmulatorError, HazardError
from .hazards import Hazard, HazardTracker
from .lds_banks import BankStats
from .machine import LANES, HostMemory, Wave
from .trace import Trace

_VGPRS, _AGPRS = 512, 256
# instructions a wave runs before the next wave's turn (a barrier or the end always ends a turn)
_QUANTUM = {"barrier": 1 << 62, "interleaved": 1}


@dataclass
class LaunchReport:
    """What a launch did: instructions executed (total, per opcode and per instruction address, all
    waves), hazards found, wall time, and the LDS bank statistic when it was asked for."""

    kernel: str
    instructions: int
    opcode_counts: dict[str, int]
    hazards: list[Hazard]
    wall_time_s: float
    workgroups: int
    waves_per_workgroup: int
    address_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    lds_banks: BankStats | None = None

    def summary(self) -> str:
        """A few lines for logs: totals, the most frequent opcodes, every hazard."""
        top = ", ".join(f"{k} {v}" for k, v in Counter(self.opcode_counts).most_common(8))
        lines = [
            f"{self.kernel}: {self.instructions} instructions in {self.workgroups} workgroup(s) x "
            f"{self.waves_per_workgroup} wave(s), {self.wall_time_s:.2f} s; top: {top}"
        ]
        lines += [f"  hazard: {h}" for h in self.hazards]
        return "\n".join(lines)


class _Yield(Exception):
    """Raised by ``s_barrier`` / ``s_endpgm`` to hand control back to the scheduler."""


@functools.lru_cache(maxsize=32)
def _load(code_object: bytes) -> tuple[CodeObject, dict[str, list[Inst]]]:

    co = parse(code_object)
    return co, decode_text(llvm.disassemble(code_object), co.kernels.keys())


def _unknown(inst: Inst, kernel: str, why: str = "unknown instruction") -> Step:
    def step(w: Wave) -> None:
        raise EmulatorError(f"{kernel}: {why} {inst.opcode!r} at 0x{inst.address:x} ({inst.text})")

    return step


def _binder_for(opcode: str) -> Binder | None:
    """The binder of an opcode; SDWA/DPP forms only where registered by their full name (falling
    back to the plain opcode would silently drop their lane and sub-dword selects)."""
    if opcode.endswith(("_sdwa", "_dpp")):
        return OPS.get(opcode)
    b = OPS.get(opcode) or OPS.get(base_opcode(opcode))
    if b is None and ops_mfma.register_mfma(base_opcode(opcode)):
        b = OPS[base_opcode(opcode)]
    return b


def _bind(
    insts: list[Inst], ctx: BindContext, banks: BankStats | None = None, trace: Trace | None = None
) -> list[Step]:
    steps: list[Step] = []
    index_mode: tuple[str, ...] = ()  # operands made relative by a preceding s_set_gpr_idx_on
    for pc, inst in enumerate(insts):
        binder = _binder_for(inst.opcode)
        if "error" in inst.extra:
            step = _unknown(inst, ctx.kernel, f"undecodable ({inst.extra['error']})")
        elif binder is None:
            step = _unknown(inst, ctx.kernel)
        elif index_mode:
            step = indexmode.indexed(inst, ctx, binder, index_mode)
        else:
            step = binder(inst, ctx)
        if inst.opcode == "s_set_gpr_idx_on" and "error" not in inst.extra:
            index_mode = indexmode.mode(inst)
        elif inst.opcode == "s_set_gpr_idx_off":
            index_mode = ()
        if inst.opcode in ("s_barrier", "s_endpgm"):
            step = _yielding(step)
        if banks is not None:  # counts the DS instruction's bank cycles from its lane addresses
            step = banks.wrap(inst, step)
        if trace is not None:  # records the wave, the instruction and its LDS clocks / VMEM bytes
            step = trace.wrap(pc, inst, step)
        if ctx.hazards.enabled:  # count its wait states and check the s_nop rules before it runs
            step = ctx.hazards.wait_state_step(inst, step)
        steps.append(step)
    return steps


def _yielding(step: Step) -> Step:
    def wrapped(w: Wave) -> None:
        step(w)
        raise _Yield

    return wrapped


def _init_wave(
    w: Wave,
    k: Kernel,
    wg: tuple[int, int, int],
    block: tuple[int, int, int],
    kernarg_addr: int,
    dispatch_addr: int,
    nwaves: int,
) -> None:
    d = k.descriptor
    props = d.code_properties
    s = 0
    if props & 1:  # private segment buffer: no scratch is emulated
        s += 4
    if props & 2:
        w.sset(s, dispatch_addr, 2)
        s += 2
    if props & 4:  # queue ptr
        s += 2
    if props & 8:
        w.sset(s, kernarg_addr, 2)
        s += 2
    if props & 16:  # dispatch id
        s += 2
    if props & 32:  # flat scratch init
        s += 2
    if props & 64:  # private segment size
        s += 1
    preload = d.kernarg_preload & 0x7F
    if preload:
        off = (d.kernarg_preload >> 7) & 0x1FF
        raw = (ctypes.c_uint32 * preload).from_address(kernarg_addr + 4 * off)
        for i in range(preload):
            w.s[s + i] = raw[i]
    s = d.user_sgpr_count
    for enabled, gid in zip(d.tgid_enable, wg, strict=True):
        if enabled:
            w.s[s] = gid
            s += 1
    if d.tg_size_enable:
        w.s[s] = nwaves & 0x3F
        s += 1
    flat = np.arange(LANES) + LANES * w.wave_id
    total = block[0] * block[1] * block[2]
    x = flat % block[0]
    y = (flat // block[0]) % block[1]
    z = flat // (block[0] * block[1])
    w.v[0] = (x | (y << 10) | (z << 20)).astype(np.uint32)
    w.set_exec(int(sum(1 << i for i in range(LANES) if flat[i] < total)))


def _dispatch_packet(grid: tuple[int, int, int], block: tuple[int, int, int], lds: int, karg: int) -> ctypes.Array:
    """An hsa_kernel_dispatch_packet_t, for kernels that read block/grid sizes through the dispatch ptr."""
    buf = (ctypes.c_uint8 * 64)()
    pkt = np.frombuffer(buf, np.uint8)
    pkt[4:10] = np.array(block, "<u2").view(np.uint8)
    pkt[12:24] = np.array([g * b for g, b in zip(grid, block, strict=True)], "<u4").view(np.uint8)
    pkt[28:32] = np.array([lds], "<u4").view(np.uint8)
    pkt[40:48] = np.array([karg], "<u8").view(np.uint8)
    return buf


def launch(
    code_object: bytes,
    kernel: str | None,
    kernarg: bytes,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    dynamic_lds: int = 0,
    workgroups: Iterable[tuple[int, int, int]] | None = None,
    hazards: str = "raise",
    lds_banks: bool = False,
    schedule: str = "barrier",
    trace: Trace | None = None,
) -> LaunchReport:
    """Run one kernel of ``code_object`` over ``grid`` workgroups of ``block`` threads, on the CPU.

    ``kernarg`` is the kernel-argument segment as the runtime would pass it (see
    :func:`pack_flydsl_kernarg`); addresses in it are host addresses. ``workgroups`` limits the run to
    some workgroup ids (for speed). ``hazards`` is "raise" (first hazard raises :class:`HazardError`),
    "report" (collected in the report) or "off". ``lds_banks`` counts every DS instruction's bank
    cycles under gfx950's bank model (``lds_banks.py``) into ``LaunchReport.lds_banks``. ``schedule``
    orders the waves of a workgroup:
    "barrier" runs each wave until its next ``s_barrier`` (or end) in turn, "interleaved" runs them
    one instruction each in turn, closer to waves that run at once on their own SIMDs: a kernel that
    relies on timing between barriers (a race the hazard report names) computes there what it does
    on hardware. ``trace`` (off by default, so functional runs pay nothing) records what every wave
    executed, for the timing model (``trace.py``, ``timing.py``).
    """
    if schedule not in _QUANTUM:
        raise EmulatorError(f"schedule must be one of {sorted(_QUANTUM)}, not {schedule!r}")
    with _gc_paused():
        return _launch(
            code_object,
            kernel,
            kernarg,
            grid,
            block,
            dynamic_lds,
            workgroups,
            hazards,
            lds_banks,
            _QUANTUM[schedule],
            trace,
        )


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one launch, back to its previous state however it ends.

    Why: it would rescan the thousands of bound closures of a launch again and again, while the
    emulator's temporaries are freed by reference counting anyway. Measured: one 256 x 256 x 128
    bf16 GEMM tile (gemm_bf16_bf16_kk_fp32_plain_256x256x64_w4) takes 1.5 s with it paused and 2.5 s
    with it running (best of 3, on a 2-core machine under load). Only a launch that found it enabled re-enables it,
    so launches in several threads leave it as they found it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _launch(
    code_object: bytes,
    kernel: str | None,
    kernarg: bytes,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    dynamic_lds: int,
    workgroups: Iterable[tuple[int, int, int]] | None,
    hazards: str,
    lds_banks: bool,
    quantum: int,
    trace: Trace | None = None,
) -> LaunchReport:
    t0 = time.perf_counter()
    co, text = _load(bytes(code_object))
    k = co.kernel(kernel)
    if k.name not in text:
        raise EmulatorError(f"no disassembly for kernel {k.name}")
    insts = text[k.name]
    if len(kernarg) < k.kernarg_size:
        raise EmulatorError(f"{k.name}: kernarg is {len(kernarg)} bytes, the kernel reads {k.kernarg_size}")
    nthreads = block[0] * block[1] * block[2]
    if k.reqd_workgroup_size and tuple(block) != tuple(k.reqd_workgroup_size):
        raise EmulatorError(f"{k.name}: block {block} differs from the required workgroup size {k.reqd_workgroup_size}")
    nwaves = (nthreads + LANES - 1) // LANES
    lds_size = k.lds_bytes + dynamic_lds
    karg_buf = (ctypes.c_uint8 * max(len(kernarg), 8)).from_buffer_copy(bytes(kernarg).ljust(8, b"\0"))
    karg_addr = ctypes.addressof(karg_buf)
    pkt = _dispatch_packet(grid, block, lds_size, karg_addr)
    lds = np.zeros(max(lds_size, 1), np.uint8)
    tracker = HazardTracker(k.name, hazards, lds)
    ctx = BindContext(
        kernel=k.name,
        address_to_index={inst.address: i for i, inst in enumerate(insts)},
        memory=HostMemory(),
        lds=lds,
        hazards=tracker,
    )
    banks = BankStats() if lds_banks else None
    if trace is not None:
        trace.start(insts, nwaves)
    steps = _bind(insts, ctx, banks, trace)
    counts = [0] * len(steps)
    wgs = list(workgroups) if workgroups is not None else list(itertools.product(*(range(g) for g in grid)))
    wgs = [(x, y, z) for x, y, z in ((*tuple(g), 0, 0)[:3] for g in wgs)]
    for g in wgs:
        if not all(0 <= g[i] < grid[i] for i in range(3)):
            raise EmulatorError(f"workgroup {g} outside grid {grid}")
    n_steps = len(steps)
    sregs = [
        tuple(r for o in inst.operands if o.kind == "s" for r in range(o.index, o.index + o.count)) for inst in insts
    ]
    for wg in wgs:
        lds.fill(0)
        waves = [Wave(i, _VGPRS, _AGPRS) for i in range(nwaves)]
        tracker.reset_workgroup(wg, waves)
        for w in waves:
            _init_wave(w, k, wg, block, karg_addr, ctypes.addressof(pkt), nwaves)
            if k.descriptor.private_segment_fixed_size:
                w.scratch = np.zeros((LANES, k.descriptor.private_segment_fixed_size), np.uint8)
        while True:
            running = True
            while running:  # one pass runs every wave to its barrier; "interleaved" needs many
                running = False
                for w in waves:
                    if w.done or w.at_barrier:
                        continue
                    running = True
                    pending_s = w.hazards.pending_s
                    try:
                        left = quantum
                        while left:
                            left -= 1
                            pc = w.pc
                            w.pc = pc + 1
                            counts[pc] += 1
                            if pending_s:
                                tracker.check_scalar(w, sregs[pc], insts[pc])
                            steps[pc](w)
                    except _Yield:
                        pass
                    except HazardError:
                        raise
                    except EmulatorError as e:
                        raise EmulatorError(f"{e} [workgroup {wg}, wave {w.wave_id}]") from None
                    except IndexError as e:
                        if w.pc > n_steps:
                            raise EmulatorError(f"{k.name}: wave {w.wave_id} ran past the end of the kernel") from None
                        inst = insts[w.pc - 1]
                        raise EmulatorError(
                            f"{k.name}: {inst.opcode} at 0x{inst.address:x} ({inst.text}) failed: {e!r}"
                        ) from e
                    except Exception as e:
                        inst = insts[w.pc - 1]
                        raise EmulatorError(
                            f"{k.name}: {inst.opcode} at 0x{inst.address:x} ({inst.text}) failed: {e!r}"
                        ) from e
            live = [w for w in waves if not w.done]
            if not live:
                break
            for w in live:
                w.at_barrier = False
            tracker.barrier_released()
    per_op: Counter[str] = Counter()
    for inst, c in zip(insts, counts, strict=True):
        if c:
            per_op[inst.opcode] += c
    return LaunchReport(
        kernel=k.name,
        instructions=sum(counts),
        opcode_counts=dict(per_op),
        hazards=list(tracker.found),
        wall_time_s=time.perf_counter() - t0,
        workgroups=len(wgs),
        waves_per_workgroup=nwaves,
        address_counts={inst.address: c for inst, c in zip(insts, counts, strict=True) if c},
        lds_banks=banks,
    )
