"""Hazards that hardware hides and the emulator must not: unwaited asynchronous results, LDS races.

The emulator applies every load's data at issue (so a correct kernel computes the right values
whatever the order), and this module tracks what a real wave would still have in flight:

* **Counters.** Each wave's vector-memory (``vmcnt``) and LDS/scalar-memory (``lgkmcnt``)
  operations get sequence numbers, retired in order by ``s_waitcnt`` (``vmcnt(N)`` retires all
  but the newest N); scalar loads return out of order, so while one is outstanding only
  ``lgkmcnt(0)`` retires anything on that counter. A register written by a load stays *pending*
  until its operation retires; reading it, or overwriting it, before then is a hazard ("unwaited-load").
* **LDS in flight.** LDS bytes written by a direct global->LDS load (``buffer_load ... lds``, on
  ``vmcnt``) or by a ``ds_write`` (on ``lgkmcnt``) are pending the same way. Their data lands at
  issue: a kernel that issues a burst of loads and reads a stage before the wait that formally
  covers it usually works on hardware (in-order returns, similar latencies); the emulator computes
  what such a kernel computes there and reports the read. Reading them before
  the writer has waited is a hazard ("unwaited-lds"), except a wave reading its own ``ds_write``
  (LDS operations of one wave complete in order).
* **Races.** Every LDS byte remembers which wave last wrote and read it and in which barrier
  interval ("epoch"). Two waves touching a byte in the same interval, one of them writing, is a
  race ("lds-race"): the kernel is missing an ``s_barrier`` between them.
* **Wait states.** Some dependencies the hardware does not interlock: the program must put enough
  independent instructions or ``s_nop`` between producer and consumer ("wait-states"). Each wave
  counts the wait states it issues, as LLVM's hazard recognizer does (``SIInstrInfo::
  getNumWaitStates``: ``s_nop N`` is N + 1, every other instruction 1, ``s_waitcnt`` and branches
  included), and remembers per register of the unified file (v0..v511, a0..a255) the last VALU
  write, the last MFMA write (opcode, passes, exact destination range) and the last XDL MFMA that
  read it as SrcC. The rules are gfx950's (CDNA4) MFMA rules, below; N is the producer's pass count.

  ====================================  ==============================================  ============
  producer                              consumer                                        wait states
  ====================================  ==============================================  ============
  VALU writes a VGPR/AGPR               MFMA reads it (SrcA/B/C, scale operands)        2
  VALU writes EXEC                      MFMA                                            4
  XDL MFMA writes (N passes)            VALU, VMEM, DS reads or overwrites it;          N + 3 (+1 if N > 2)
                                        MFMA reads it as SrcA/B or scale                = 5, 8, 12, 20
  non-XDL MFMA (``*_f32``) writes       same                                            N + 2
  MFMA writes exactly SrcC's registers  MFMA reads them as SrcC (accumulation chain)    0 (2 if N = 2)
  XDL MFMA writes, SrcC overlaps        XDL MFMA reads SrcC                             N + 2
                                        non-XDL MFMA reads SrcC                         N + 1 (+1 if N > 2)
  non-XDL MFMA writes, SrcC overlaps    XDL MFMA reads SrcC / non-XDL reads SrcC        0 / N
  XDL MFMA reads SrcC (N passes)        VALU, VMEM, DS overwrites it (WAR)              N - 1
  VALU writes a VGPR / v_cmpx EXEC      ``v_permlane{16,32}_swap`` reads it / any       2 / 4
  ====================================  ==============================================  ============

  Sources: LLVM ``llvm/lib/Target/AMDGPU/GCNHazardRecognizer.cpp`` (``checkMAIHazards90A``,
  ``checkMAIVALUHazards``, ``checkPermlaneHazards`` and the ``GFX940_*_N_Pass*`` helpers, whose
  ``IsGFX950`` argument adds gfx950's extra wait state: to the XDL-write rules for 4, 8 and 16
  passes, and for 2 passes too in XDL -> XDL overlapped SrcC); pass counts from ``SISchedule.td``'s
  ``SIDPGFX950FullSpeedModel`` (``Write{2,4,8,16}PassMAI``, ``WriteMFMAScale_*_F8F6F4``); XDL or not
  from ``VOP3PInstructions.td`` (``is_gfx940_xdl``). ROCm rocRoller's
  ``Scheduling/Observers/WaitState/MFMA`` tables (``XDLWrite94x``, ``XDLReadSrcC94x``, ``VALUWrite``,
  ``CMPXWriteExec``; its ``ACCVGPR*`` rules are gfx908's) give the same numbers, with the same gfx950
  adjustment in ``XDLWrite94x.cpp``. Every number was also checked against LLVM 22's
  ``post-RA-hazard-rec`` pass for ``-mcpu=gfx950`` (the ``s_nop`` it inserts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .decode import EXEC, Inst, Operand
from .errors import EmulatorError, HazardError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .machine import Wave


@dataclass(frozen=True)
class Hazard:
    """One hazard found: which kernel, where (instruction address), what kind, and in words."""

    kernel: str
    address: int
    kind: str  # "unwaited-load" | "unwaited-lds" | "lds-race" | "wait-states"
    detail: str
    workgroup: tuple[int, int, int] = (0, 0, 0)
    wave: int = 0

    def __str__(self) -> str:
        return f"{self.kernel}+0x{self.address:x} [{self.kind}] wg={self.workgroup} wave={self.wave}: {self.detail}"


# -- wait states: register numbering, gfx950 MFMA timing, what each instruction reads and writes ----

_AGPR0 = 512  # a0's index in the unified register numbering (v0..v511, then a0..a255)
_NREGS = _AGPR0 + 256
_LONG_AGO = -(1 << 40)  # "never": wait states since then exceed every rule
MAX_AFTER_MFMA = 20  # the largest MFMA-write rule (a 16-pass XDL), so older MFMA writes never matter
_MAX_WAR = 15  # the largest SrcC-read (WAR) rule
_VALU_TO_MFMA = 2
_EXEC_TO_MFMA = 4
_VALU_TO_PERMLANE = 2
_CMPX_TO_PERMLANE = 4

_MFMA_NAME = re.compile(r"^v_mfma_(?:scale_)?f32_(\d+)x\d+x(\d+)_?(f32|f16|bf16|f8f6f4|(?:fp8|bf8)_(?:fp8|bf8))$")
# gfx950 pass counts (SISchedule.td, SIDPGFX950FullSpeedModel) by (M, K, operand type), for the MFMAs
# the emulator runs. The f8f6f4 forms take 8 (16x16) / 16 (32x32) passes when either operand is FP8
# (cbsz or blgp <= 1, PredIsF8_MFMA_SCALE), else 4 / 8.
_PASSES = {
    (16, 4, "f32"): 8,
    (32, 2, "f32"): 16,
    (16, 16, "f16"): 4,
    (16, 16, "bf16"): 4,
    (32, 8, "f16"): 8,
    (32, 8, "bf16"): 8,
    (16, 32, "f16"): 4,
    (16, 32, "bf16"): 4,
    (32, 16, "f16"): 8,
    (32, 16, "bf16"): 8,
    (16, 32, "fp8"): 4,
    (32, 16, "fp8"): 8,
    (16, 128, "f8f6f4"): 4,
    (32, 64, "f8f6f4"): 8,
}


def mfma_timing(opcode: str, cbsz: int = 0, blgp: int = 0) -> tuple[int, bool] | None:
    """(passes, XDL or not) of an MFMA on gfx950, or None for one this table does not know.

    Only the f32-input MFMAs (``v_mfma_f32_*_f32``) are not XDL on gfx940+ (``is_gfx940_xdl`` in LLVM's
    VOP3PInstructions.td); the f64 ones (DGEMM) are not emulated.
    """
    m = _MFMA_NAME.match(opcode)
    if not m:
        return None
    mn, k, ty = int(m.group(1)), int(m.group(2)), m.group(3)
    passes = _PASSES.get((mn, k, "fp8" if ty[:3] in ("fp8", "bf8") else ty))
    if passes is None:
        return None
    if ty == "f8f6f4" and (cbsz <= 1 or blgp <= 1):
        passes *= 2
    return passes, ty != "f32"


def _rng(o: Operand) -> tuple[int, int] | None:
    """An operand's registers as a [start, stop) range of the unified numbering, None if not VGPR/AGPR."""
    if o.kind == "v":
        return o.index, o.index + o.count
    if o.kind == "a":
        return _AGPR0 + o.index, _AGPR0 + o.index + o.count
    return None


def _reg_name(r: int) -> str:
    return f"a{r - _AGPR0}" if r >= _AGPR0 else f"v{r}"


def _writes_exec(o: Operand) -> bool:
    return o.kind == "s" and o.index <= EXEC + 1 and o.index + o.count > EXEC


def wait_states(inst: Inst) -> int:
    """Wait states an instruction issues (``SIInstrInfo::getNumWaitStates``): ``s_nop N`` is N + 1, where
    only SIMM16[3:0] is significant on gfx8+ (``GCNSubtarget::getSNopBits``: 4, so LLVM's insertNoops
    emits at most ``s_nop 15`` and a larger immediate counts its low 4 bits); anything else is 1."""
    if inst.opcode != "s_nop":
        return 1
    return ((int(inst.operands[0].value) if inst.operands else 0) & 0xF) + 1


class _WSOp:
    """What the wait-state rules need to know of one instruction, worked out once at load time."""

    def __init__(self, inst: Inst) -> None:
        self.inst = inst
        op = inst.opcode
        ops = inst.operands
        self.ws = 1  # wait states it counts for later instructions
        self.kind = "other"  # "valu" | "mfma" | "mem" | "other"
        self.uses: list[tuple[int, int]] = []
        self.defs: list[tuple[int, int]] = []
        self.writes_exec = self.cmpx_exec = self.permlane = False
        self.passes, self.xdl = 0, False
        self.srcs: list[tuple[int, int, str]] = []  # an MFMA's register sources and their roles
        self.dst: tuple[int, int] | None = None
        self.src_c: tuple[int, int] | None = None
        self.unknown_mfma = False
        if op == "s_nop":
            self.ws = wait_states(inst)
        elif op.startswith("v_mfma"):
            self._mfma(inst)
        elif op.startswith("v_"):
            self._valu(inst)
        elif op.startswith(("buffer_", "global_", "scratch_", "flat_", "ds_")):
            self.kind = "mem"
            returns = "sc0" in inst.modifiers or "glc" in inst.modifiers
            loads = op.startswith(("buffer_load", "global_load", "scratch_load", "flat_load", "ds_read"))
            loads = loads and "lds" not in inst.modifiers and not op.startswith("global_load_lds")
            loads = loads or op.startswith(("ds_bpermute", "ds_permute", "ds_swizzle")) or "_rtn" in op
            loads = loads or ("_atomic_" in op and returns)
            for i, o in enumerate(ops):
                r = _rng(o)
                if r is not None:
                    (self.defs if i == 0 and loads else self.uses).append(r)
        # each register range with its per-register fill values, for recording writes quickly
        self.def_fill = [(s, e, [self] * (e - s)) for s, e in self.defs]
        self.accesses = [(s, e, "reads") for s, e in self.uses] + [(s, e, "overwrites") for s, e in self.defs]

    def _valu(self, inst: Inst) -> None:
        self.kind = "valu"
        op, ops = inst.opcode, inst.operands
        compare = op.startswith(("v_cmp_", "v_cmpx_"))
        both = op.startswith(("v_permlane16_swap", "v_permlane32_swap", "v_swap_"))
        self.permlane = op.startswith("v_permlane")
        for i, o in enumerate(ops):
            r = _rng(o)
            if r is None:
                continue
            if both:
                self.defs.append(r)
                self.uses.append(r)
            else:
                (self.defs if i == 0 and not compare else self.uses).append(r)
        carry_out = "_co_" in op or op.startswith(("v_div_scale", "v_mad_u64", "v_mad_i64"))
        self.writes_exec = op.startswith("v_cmpx") or (
            bool(ops) and (_writes_exec(ops[0]) or (carry_out and len(ops) > 1 and _writes_exec(ops[1])))
        )
        self.cmpx_exec = self.writes_exec and compare

    def _mfma(self, inst: Inst) -> None:
        self.kind = "mfma"
        timing = mfma_timing(inst.opcode, inst.mod_int("cbsz", 0), inst.mod_int("blgp", 0))
        if timing is None:
            self.unknown_mfma = True
            return
        self.passes, self.xdl = timing
        ops = inst.operands
        self.dst = _rng(ops[0])
        if self.dst is not None:
            self.defs.append(self.dst)
        roles = ("SrcA", "SrcB", "SrcC", "scale A", "scale B")
        for o, role in zip(ops[1:6], roles, strict=False):
            r = _rng(o)
            if r is not None:
                self.srcs.append((r[0], r[1], role))
                if role == "SrcC":
                    self.src_c = r
        n = self.passes
        # XDL: N + 3, gfx950 + 1 beyond 2 passes (GFX940_XDL_N_PassWriteVgprVALUMemExpReadWaitStates,
        # ..._VALUWawWaitStates, ..._WritesVGPROverlappedSrcABWaitStates); non-XDL: N + 2 (GFX940_SMFMA_*)
        self.after = n + 3 + (n != 2) if self.xdl else n + 2
        self.war = n - 1 if self.xdl else 0  # SMFMA4x4ReadVgprVALUWarWaitStates etc.: 1, 3, 7, 15

    def srcc_need(self, consumer: _WSOp, rng: tuple[int, int]) -> int:
        """Wait states an MFMA reading ``rng`` as SrcC needs after this MFMA wrote (part of) it."""
        n = self.passes
        if self.dst == rng:  # the same registers: an accumulation chain
            return 2 if n == 2 else 0
        if self.xdl:  # GFX940_XDL_N_PassWritesVGPROverlapped{XDLOrSMFMA,SGEMMDGEMM}SrcCWaitStates
            return n + 2 if consumer.xdl else n + 1 + (n != 2)
        return 0 if consumer.xdl else n  # GFX940_SMFMA_N_PassWritesVGPROverlappedSMFMASrcCWaitStates

    def producer(self, el: int) -> str:
        i = self.inst
        what = f"{self.passes} passes" if self.kind == "mfma" else "VALU"
        return f"{i.opcode} at 0x{i.address:x} ({what}) after {el} wait states"


@dataclass
class WaveCounters:
    """A wave's in-order memory counters and the registers its outstanding loads will write, and its
    wait-state clock with the last writers (and SrcC readers) of each vector register."""

    issued: dict[str, int] = field(default_factory=lambda: {"vm": 0, "lgkm": 0})
    retired: dict[str, int] = field(default_factory=lambda: {"vm": 0, "lgkm": 0})
    # what had retired when the wave last passed a barrier: all that other waves may rely on
    retired_at_barrier: dict[str, int] = field(default_factory=lambda: {"vm": 0, "lgkm": 0})
    # (file, register) -> (counter, sequence number, address of the load)
    pending_regs: dict[tuple[str, int], tuple[str, int, int]] = field(default_factory=dict)
    # SGPR -> (counter, sequence number, address of the s_load); checked by the scheduler loop
    pending_s: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    # lgkm sequence numbers of scalar-memory loads: they return out of order (see wait)
    smem_seqs: list[int] = field(default_factory=list)
    # wait states issued so far, and, per register of the unified numbering, the clock at which the
    # last MFMA wrote it (mw_t, mw_op), the last VALU wrote it (vw_t, vw_op), and the last XDL MFMA read
    # it as SrcC (cr_t, cr_op); filled only when hazards are checked
    ws: int = 0
    last_mfma: int = _LONG_AGO
    last_valu_write: int = _LONG_AGO
    exec_t: int = _LONG_AGO
    exec_op: _WSOp | None = None
    cmpx_t: int = _LONG_AGO
    cmpx_op: _WSOp | None = None
    mw_t: list[int] = field(default_factory=list)
    mw_op: list[_WSOp | None] = field(default_factory=list)
    vw_t: list[int] = field(default_factory=list)
    vw_op: list[_WSOp | None] = field(default_factory=list)
    cr_t: list[int] = field(default_factory=list)
    cr_op: list[_WSOp | None] = field(default_factory=list)

    def start_wait_states(self) -> None:
        self.mw_t, self.vw_t, self.cr_t = ([_LONG_AGO] * _NREGS for _ in range(3))
        self.mw_op, self.vw_op, self.cr_op = ([None] * _NREGS for _ in range(3))


def _too_recent(
    t: int, ts: list[int], ps: list[_WSOp | None], horizon: int, need: Callable[[_WSOp], int]
) -> tuple[int, _WSOp, int, int] | None:
    """The first register of a range whose last producer is fewer than ``need(producer)`` wait states
    before clock ``t``: ``(offset in the range, producer, wait states elapsed, needed)``, else None.

    ``ts`` / ``ps`` are the range's producer clocks and producers. Nothing within ``horizon`` (the
    largest ``need``) returns at once, and so does a range one producer wrote at once long enough
    ago: the common cases cost one ``max`` and one ``count``.
    """
    tmax = max(ts)
    if t - tmax > horizon:
        return None
    first = ps[0]
    if first is not None and ps.count(first) == len(ps) and t - tmax - 1 >= need(first):
        return None
    for i, tw in enumerate(ts):
        p = ps[i]
        if p is not None:
            el, n = t - tw - 1, need(p)
            if el < n:
                return i, p, el, n
    return None


class HazardTracker:
    """Hazard bookkeeping for one launch; ``mode`` is "raise", "report" or "off"."""

    def __init__(self, kernel: str, mode: str, lds: np.ndarray) -> None:
        if mode not in ("raise", "report", "off"):
            raise ValueError(f"hazards must be 'raise', 'report' or 'off', not {mode!r}")
        self.kernel = kernel
        self.mode = mode
        self.enabled = mode != "off"
        self.found: list[Hazard] = []
        self._seen: set[tuple[int, str]] = set()
        self.workgroup: tuple[int, int, int] = (0, 0, 0)
        self.waves: list[Wave] = []
        self.lds = lds
        self._lds_size = lds.size
        self.reset_workgroup((0, 0, 0), [])

    # -- bookkeeping ---------------------------------------------------------------------------
    def reset_workgroup(self, wg: tuple[int, int, int], waves: list[Wave]) -> None:
        """Start a workgroup: fresh LDS history, fresh counters for its waves."""
        self.workgroup = wg
        self.waves = waves
        self.epoch = 0
        n = max(self._lds_size, 1)
        self.w_wave = np.full(n, -1, np.int16)
        self.w_epoch = np.full(n, -1, np.int32)
        self.r_wave = np.full(n, -1, np.int16)
        self.r_epoch = np.full(n, -1, np.int32)
        self.p_wave = np.full(n, -1, np.int16)
        self.p_seq = np.zeros(n, np.int64)
        self.p_vm = np.zeros(n, bool)
        self.p_addr = np.zeros(n, np.int64)  # the writing instruction, for the report
        for w in waves:
            w.hazards = WaveCounters()
            if self.enabled:
                w.hazards.start_wait_states()

    def barrier_released(self) -> None:
        """All waves passed an ``s_barrier``: accesses after it no longer race with those before, and
        what each wave had waited for by then is what the others may rely on (a wave's later waits run
        concurrently with the other waves, however the emulator happens to order them)."""
        self.epoch += 1
        for w in self.waves:
            w.hazards.retired_at_barrier = dict(w.hazards.retired)

    def _report(self, w: Wave, inst: Inst, kind: str, detail: str) -> None:
        key = (inst.address, kind)
        if key in self._seen:
            return
        self._seen.add(key)
        hz = Hazard(self.kernel, inst.address, kind, f"{inst.text}: {detail}", self.workgroup, w.wave_id)
        self.found.append(hz)
        if self.mode == "raise":
            raise HazardError(str(hz))

    # -- counters ------------------------------------------------------------------------------
    def issue(
        self,
        w: Wave,
        counter: str,
        inst: Inst,
        vregs: tuple[str, int, int] | None = None,
        sregs: tuple[int, int] | None = None,
    ) -> int:
        """Count one memory operation; mark the registers it will write as pending. Returns its seq."""
        c = w.hazards
        c.issued[counter] += 1
        seq = c.issued[counter]
        if not self.enabled:
            return seq
        if vregs is not None:
            kind, idx, n = vregs
            for r in range(idx, idx + n):
                c.pending_regs[(kind, r)] = (counter, seq, inst.address)
        if sregs is not None:
            c.smem_seqs.append(seq)
            for r in range(sregs[0], sregs[0] + sregs[1]):
                c.pending_s[r] = (counter, seq, inst.address)
        return seq

    def wait(self, w: Wave, vmcnt: int, lgkmcnt: int) -> None:
        """``s_waitcnt``: retire all but the newest ``vmcnt`` / ``lgkmcnt`` operations."""
        c = w.hazards
        c.retired["vm"] = max(c.retired["vm"], c.issued["vm"] - vmcnt)
        # Scalar loads return out of order with LDS ops: while one is outstanding, lgkmcnt(N > 0)
        # says how many remain but not which, so it retires nothing; lgkmcnt(0) retires everything.
        c.smem_seqs = [q for q in c.smem_seqs if q > c.retired["lgkm"]]
        if lgkmcnt == 0 or not c.smem_seqs:
            c.retired["lgkm"] = max(c.retired["lgkm"], c.issued["lgkm"] - lgkmcnt)
        ret = c.retired
        if c.pending_regs:
            c.pending_regs = {k: v for k, v in c.pending_regs.items() if v[1] > ret[v[0]]}
        for r in [r for r, v in c.pending_s.items() if v[1] <= ret[v[0]]]:
            del c.pending_s[r]  # in place: the scheduler holds this dict

    def _still_pending(self, w: Wave, entry: tuple[str, int, int]) -> bool:
        return entry[1] > w.hazards.retired[entry[0]]

    def check_read(self, w: Wave, kind: str, idx: int, n: int, inst: Inst) -> None:
        """A register range is about to be read: was every load into it waited for?"""
        pend = w.hazards.pending_regs
        for r in range(idx, idx + n):
            e = pend.get((kind, r))
            if e is not None and self._still_pending(w, e):
                self._report(
                    w, inst, "unwaited-load", f"reads {kind}{r}, loaded at 0x{e[2]:x} and not waited for ({e[0]}cnt)"
                )
                return

    def check_write(self, w: Wave, kind: str, idx: int, n: int, inst: Inst, in_order: str = "") -> None:
        """A register range is about to be overwritten while a load into it may still land.

        ``in_order`` names the counter of a load doing the overwriting: a later load on the same
        in-order counter writes its registers after the earlier one (gfx9 VMEM loads return in order,
        which is why LLVM puts no wait between two scratch reloads of one register), so that is safe.
        """
        pend = w.hazards.pending_regs
        for r in range(idx, idx + n):
            e = pend.pop((kind, r), None)
            if e is not None and e[0] != in_order and self._still_pending(w, e):
                self._report(
                    w, inst, "unwaited-load", f"overwrites {kind}{r} while its load from 0x{e[2]:x} is in flight"
                )

    def check_scalar(self, w: Wave, sregs: tuple[int, ...], inst: Inst) -> None:
        """The SGPRs an instruction names, while an ``s_load`` into some SGPR is outstanding."""
        pend = w.hazards.pending_s
        for r in sregs:
            e = pend.get(r)
            if e is not None and e[2] != inst.address:
                self._report(w, inst, "unwaited-load", f"uses s{r}, loaded at 0x{e[2]:x} and not waited for (lgkmcnt)")
                return

    # -- LDS -----------------------------------------------------------------------------------
    def lds_write(self, w: Wave, addrs: np.ndarray, inst: Inst, counter: str, seq: int) -> None:
        """LDS bytes ``addrs`` (int64, in range) written by wave ``w`` (pending on ``counter``)."""
        if not self.enabled or addrs.size == 0:
            return
        wid = w.wave_id
        cur = self.epoch
        other_w = (self.w_epoch[addrs] == cur) & (self.w_wave[addrs] != wid)
        rw = self.r_wave[addrs]
        other_r = (self.r_epoch[addrs] == cur) & (rw != wid) & (rw != -1)
        if other_w.any() or other_r.any():
            bad = addrs[other_w | other_r]
            who = self.w_wave[bad[0]] if other_w.any() else rw[other_r][0]
            self._report(
                w,
                inst,
                "lds-race",
                f"writes LDS byte 0x{int(bad[0]):x} that wave {who} accessed with no barrier between",
            )
        self.w_wave[addrs] = wid
        self.w_epoch[addrs] = cur
        self.p_wave[addrs] = wid
        self.p_seq[addrs] = seq
        self.p_vm[addrs] = counter == "vm"
        self.p_addr[addrs] = inst.address

    def lds_read(self, w: Wave, addrs: np.ndarray, inst: Inst) -> None:
        """LDS bytes ``addrs`` read by wave ``w``: check in-flight writes and races, then record."""
        if not self.enabled or addrs.size == 0:
            return
        wid = w.wave_id
        cur = self.epoch
        race = (self.w_epoch[addrs] == cur) & (self.w_wave[addrs] != wid)
        if race.any():  # the missing barrier is the bug; whether the writer also waited is moot
            a0 = int(addrs[race][0])
            self._report(
                w,
                inst,
                "lds-race",
                f"reads LDS byte 0x{a0:x} written by wave {int(self.w_wave[a0])} with no barrier between",
            )
        pw = self.p_wave[addrs]
        has = (pw >= 0) & ~race
        if has.any():
            for owner in np.unique(pw[has]):
                sel = has & (pw == owner)
                if owner == wid and not self.p_vm[addrs[sel]].any():
                    continue
                ow = self.waves[int(owner)]
                done = ow.hazards.retired if owner == wid else ow.hazards.retired_at_barrier
                vm = self.p_vm[addrs[sel]]
                seqs = self.p_seq[addrs[sel]]
                late = np.where(vm, seqs > done["vm"], seqs > done["lgkm"])
                if late.any():
                    a0 = int(addrs[sel][late][0])
                    cnt = "vmcnt" if vm[late][0] else "lgkmcnt"
                    self._report(
                        w,
                        inst,
                        "unwaited-lds",
                        f"reads LDS byte 0x{a0:x} written by wave {int(owner)} at 0x{int(self.p_addr[a0]):x}, "
                        f"not waited for ({cnt})",
                    )
                    break
        fresh = self.r_epoch[addrs] != cur
        rw = self.r_wave[addrs]
        self.r_wave[addrs] = np.where(fresh, wid, np.where(rw == wid, wid, -2))
        self.r_epoch[addrs] = cur

    # -- wait states ---------------------------------------------------------------------------
    def wait_state_step(self, inst: Inst, step: Callable[[Wave], None]) -> Callable[[Wave], None]:
        """``step`` wrapped to count this instruction's wait states and check the rules before it runs
        (bound only when hazards are checked: with ``hazards="off"`` nothing is counted)."""
        op = inst.extra.get("wait_states")
        if not isinstance(op, _WSOp):  # worked out once per decoded instruction, kept for later launches
            op = inst.extra["wait_states"] = _WSOp(inst)
        k = op.ws
        if op.kind == "other":

            def other(w: Wave) -> None:
                w.hazards.ws += k
                step(w)

            return other
        if op.kind == "mfma":
            if op.unknown_mfma:

                def unknown(w: Wave) -> None:
                    raise EmulatorError(
                        f"{self.kernel}: no gfx950 wait-state timing (passes, XDL) for {inst.opcode} at "
                        f"0x{inst.address:x} ({inst.text}); add it to hazards._PASSES"
                    )

                return unknown
            return self._mfma_step(op, step)
        valu = op.kind == "valu"
        def_fill, permlane, writes_exec = op.def_fill, op.permlane, op.writes_exec
        check_regs = bool(op.uses or op.defs)

        def vector(w: Wave) -> None:
            c = w.hazards
            t = c.ws
            c.ws = t + 1
            if check_regs and t - c.last_mfma <= MAX_AFTER_MFMA:  # (SrcC reads are MFMAs too)
                self._check_after_mfma(w, c, t, op)
            if valu:
                if permlane:
                    self._check_permlane(w, c, t, op)
                for s, e, fill in def_fill:
                    c.vw_t[s:e] = [t] * (e - s)
                    c.vw_op[s:e] = fill
                    c.last_valu_write = t
                if writes_exec:
                    c.exec_t, c.exec_op = t, op
                    if op.cmpx_exec:
                        c.cmpx_t, c.cmpx_op = t, op
            step(w)

        return vector

    def _mfma_step(self, op: _WSOp, step: Callable[[Wave], None]) -> Callable[[Wave], None]:
        dst, src_c, xdl = op.dst, op.src_c, op.xdl
        dfill = [op] * (dst[1] - dst[0]) if dst else []
        cfill = [op] * (src_c[1] - src_c[0]) if src_c else []

        def mfma(w: Wave) -> None:
            c = w.hazards
            t = c.ws
            c.ws = t + 1
            self._check_mfma(w, c, t, op)
            if dst is not None:
                c.mw_t[dst[0] : dst[1]] = [t] * len(dfill)
                c.mw_op[dst[0] : dst[1]] = dfill
            c.last_mfma = t
            if xdl and src_c is not None:
                c.cr_t[src_c[0] : src_c[1]] = [t] * len(cfill)
                c.cr_op[src_c[0] : src_c[1]] = cfill
            step(w)

        return mfma

    def _wait_report(self, w: Wave, op: _WSOp, detail: str) -> None:
        self._report(w, op.inst, "wait-states", detail)

    def _check_after_mfma(self, w: Wave, c: WaveCounters, t: int, op: _WSOp) -> None:
        """A VALU / VMEM / DS instruction: its reads and writes after MFMA writes, its writes after XDL
        MFMA SrcC reads (checkMAIVALUHazards)."""
        for s, e, verb in op.accesses:
            hit = _too_recent(t, c.mw_t[s:e], c.mw_op[s:e], MAX_AFTER_MFMA, lambda p: p.after)
            if hit is not None:
                i, p, el, need = hit
                self._wait_report(w, op, f"{verb} {_reg_name(s + i)} written by {p.producer(el)}, needs {need}")
                return
        for s, e in op.defs:
            hit = _too_recent(t, c.cr_t[s:e], c.cr_op[s:e], _MAX_WAR, lambda p: p.war)
            if hit is not None:
                i, p, el, need = hit
                name = _reg_name(s + i)
                self._wait_report(w, op, f"overwrites {name} read as SrcC by {p.producer(el)}, needs {need}")
                return

    def _check_mfma(self, w: Wave, c: WaveCounters, t: int, op: _WSOp) -> None:
        """An MFMA: its sources after VALU and MFMA writes, and EXEC after a VALU wrote it
        (checkMAIHazards90A)."""
        el = t - c.exec_t - 1
        if el < _EXEC_TO_MFMA and c.exec_op is not None:
            self._wait_report(w, op, f"runs after EXEC written by {c.exec_op.producer(el)}, needs {_EXEC_TO_MFMA}")
            return
        if t - c.last_valu_write <= _VALU_TO_MFMA:
            for s, e, role in op.srcs:
                hit = _too_recent(t, c.vw_t[s:e], c.vw_op[s:e], _VALU_TO_MFMA, lambda _p: _VALU_TO_MFMA)
                if hit is not None:
                    i, p, el, need = hit
                    name = _reg_name(s + i)
                    self._wait_report(w, op, f"reads {name} as {role} written by {p.producer(el)}, needs {need}")
                    return
        if t - c.last_mfma > MAX_AFTER_MFMA:
            return
        for s, e, role in op.srcs:
            src_c = role == "SrcC"

            def need(p: _WSOp, s: int = s, e: int = e, src_c: bool = src_c) -> int:
                return p.srcc_need(op, (s, e)) if src_c else p.after

            hit = _too_recent(t, c.mw_t[s:e], c.mw_op[s:e], MAX_AFTER_MFMA, need)
            if hit is not None:
                i, p, el, n = hit
                how = "" if not src_c else " (same registers)" if p.dst == (s, e) else " (overlapping)"
                name = _reg_name(s + i)
                self._wait_report(w, op, f"reads {name} as {role}{how} written by {p.producer(el)}, needs {n}")
                return

    def _check_permlane(self, w: Wave, c: WaveCounters, t: int, op: _WSOp) -> None:
        """gfx950 ``v_permlane*``: its VGPR sources after VALU writes, EXEC after ``v_cmpx``
        (checkPermlaneHazards)."""
        for s, e in op.uses:
            if s >= _AGPR0:
                continue  # permlane reads arch VGPRs only
            hit = _too_recent(t, c.vw_t[s:e], c.vw_op[s:e], _VALU_TO_PERMLANE, lambda _p: _VALU_TO_PERMLANE)
            if hit is not None:
                i, p, el, need = hit
                self._wait_report(w, op, f"reads {_reg_name(s + i)} written by {p.producer(el)}, needs {need}")
                return
        el = t - c.cmpx_t - 1
        if el < _CMPX_TO_PERMLANE and c.cmpx_op is not None:
            self._wait_report(w, op, f"runs after EXEC written by {c.cmpx_op.producer(el)}, needs {_CMPX_TO_PERMLANE}")
