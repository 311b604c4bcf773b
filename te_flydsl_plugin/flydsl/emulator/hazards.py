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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .decode import Inst
from .errors import HazardError

if TYPE_CHECKING:
    from .machine import Wave


@dataclass(frozen=True)
class Hazard:
    """One hazard found: which kernel, where (instruction address), what kind, and in words."""

    kernel: str
    address: int
    kind: str  # "unwaited-load" | "unwaited-lds" | "lds-race"
    detail: str
    workgroup: tuple[int, int, int] = (0, 0, 0)
    wave: int = 0

    def __str__(self) -> str:
        return f"{self.kernel}+0x{self.address:x} [{self.kind}] wg={self.workgroup} wave={self.wave}: {self.detail}"


@dataclass
class WaveCounters:
    """A wave's in-order memory counters and the registers its outstanding loads will write."""

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

    def check_write(self, w: Wave, kind: str, idx: int, n: int, inst: Inst) -> None:
        """A register range is about to be overwritten while a load into it may still land."""
        pend = w.hazards.pending_regs
        for r in range(idx, idx + n):
            e = pend.pop((kind, r), None)
            if e is not None and self._still_pending(w, e):
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
