"""Cycle-approximate replay of a trace (``trace.py``): the clocks one CU takes to run the traced waves.

Off the functional path: it reads a finished :class:`~.trace.Trace` and re-executes nothing. What it
models (docs/perf-model.md lists every constant's source and what is left out):

* **Issue.** Each wave issues in order, at most one instruction per ``ISSUE_CLOCKS`` (a wave64 on a
  16-lane SIMD: a SIMD is offered one instruction of a wave every 4 clocks). Wave ``i`` of each
  resident workgroup runs on SIMD ``i % 4``.
* **Pipes.** A VALU instruction holds its SIMD's VALU for ``ISSUE_CLOCKS``; an MFMA holds its SIMD's
  matrix pipe for ``passes x 4`` clocks (``hazards.mfma_timing``), and a wave whose next MFMA finds the
  pipe busy waits (in order), while its other instructions issue under a running MFMA.
* **Dependencies.** A VGPR / AGPR written by an MFMA is ready when the MFMA ends, one written by a VALU
  op after its ``ISSUE_CLOCKS``; a reader waits. Loads are not scoreboarded: ``s_waitcnt`` orders them,
  as on the hardware.
* **LDS.** One LDS per CU, shared by every wave: a DS access occupies it for the clocks the trace
  counted (bank conflicts included), and its data returns ``LDS_LATENCY`` clocks after it was served.
* **Vector memory.** One port per CU moving ``vmem_bytes_per_clock`` (a parameter: the CU's share of
  the L2 / MALL / HBM bandwidth when the whole chip runs, set by the grid model); data returns
  ``vmem_latency`` clocks after it was sent. Direct-to-LDS loads are vector loads on ``vmcnt``.
* **Counters.** ``vmcnt`` returns in order; ``lgkmcnt`` (LDS in order, scalar loads out of order) by
  completion time. ``s_waitcnt`` waits until at most N are outstanding; ``s_barrier`` until every live
  wave of its workgroup has arrived.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .decode import Inst
from .hazards import mfma_timing
from .ops_salu import waitcnt_counts
from .trace import Trace

SIMDS = 4  # SIMDs per CU (AMD CDNA3 / CDNA4 ISA guides; ROCm Compute Profiler: "four 16-wide SIMDs")
ISSUE_CLOCKS = 4  # a wave64 instruction on a 16-lane SIMD: 4 clocks (same sources)
CLOCKS_PER_PASS = 4  # an MFMA pass is 4 clocks (AMD CDNA3 / CDNA4 ISA guides, MFMA tables)
LDS_LATENCY = 64  # clocks from an LDS access served to its data in VGPRs (see docs/perf-model.md)
SMEM_LATENCY = 200  # clocks of a scalar load from the scalar cache / L2 (see docs/perf-model.md)
SLEEP_CLOCKS = 64  # ``s_sleep N`` waits about 64 x N clocks (CDNA3 ISA guide, S_SLEEP)


@dataclass(frozen=True)
class Memory:
    """The CU's vector-memory port: bandwidth and round-trip latency, in clocks."""

    bytes_per_clock: float
    latency: int


@dataclass
class _Wave:
    trace: list[tuple[int, int]]
    simd: int
    group: int
    pos: int = 0
    t: int = 0
    vm: list[int] = field(default_factory=list)
    lgkm: list[int] = field(default_factory=list)
    at_barrier: bool = False
    done: bool = False


def _classify(inst: Inst) -> str:
    op = inst.opcode
    if op.startswith("v_mfma"):
        return "mfma"
    if op.startswith("ds_"):
        return "ds"
    if op.startswith(("buffer_", "global_", "flat_", "scratch_")):
        return "vmem"
    if op.startswith(("s_load", "s_buffer_load")):
        return "smem"
    if op in ("s_waitcnt", "s_barrier", "s_endpgm", "s_nop", "s_sleep"):
        return op
    return "valu" if op.startswith("v_") else "salu"


def _regs(inst: Inst, start: int) -> list[tuple[str, int]]:
    ops = inst.operands[start:]
    return [(o.kind, r) for o in ops if o.kind in ("v", "a") for r in range(o.index, o.index + o.count)]


def _count(inst: Inst) -> int:
    """Registers the destination (operand 0) writes: 0 unless it is a VGPR / AGPR."""
    d = inst.operands[0] if inst.operands else None
    return d.count if d is not None and d.kind in ("v", "a") else 0


@dataclass(frozen=True)
class _Decoded:
    kind: str
    reads: tuple[tuple[str, int], ...]
    writes: tuple[tuple[str, int], ...]
    clocks: int  # an MFMA's pipe clocks, an s_nop's / s_sleep's wait
    vm: int = 63
    lgkm: int = 15


def _decode(inst: Inst) -> _Decoded:
    kind = _classify(inst)
    if kind == "mfma":
        t = mfma_timing(inst.opcode, inst.mod_int("cbsz", 0), inst.mod_int("blgp", 0))
        if t is None:
            raise ValueError(f"no gfx950 pass count for {inst.opcode}")
        return _Decoded(kind, tuple(_regs(inst, 1)), tuple(_regs(inst, 0)[: _count(inst)]), t[0] * CLOCKS_PER_PASS)
    if kind == "valu":
        return _Decoded(kind, tuple(_regs(inst, 1)), tuple(_regs(inst, 0)[: _count(inst)]), 0)
    if kind == "s_waitcnt":
        vm, lgkm = waitcnt_counts(inst)
        return _Decoded(kind, (), (), 0, vm, lgkm)
    if kind == "s_nop":
        return _Decoded(kind, (), (), int(inst.operands[0].value) + 1 if inst.operands else 1)
    if kind == "s_sleep":
        return _Decoded(kind, (), (), SLEEP_CLOCKS * (int(inst.operands[0].value) if inst.operands else 1))
    reads = tuple(_regs(inst, 0)) if kind in ("ds", "vmem") else ()
    return _Decoded(kind, reads, (), 0)


def _wait_until(queue: list[int], keep: int) -> int:
    """The time at which at most ``keep`` of ``queue``'s completion times are still ahead."""
    if len(queue) <= keep:
        return 0
    return sorted(queue)[len(queue) - keep - 1]


def replay(trace: Trace, memory: Memory, groups: int = 1, events: list[Event] | None = None) -> int:
    """Clocks until the last of ``groups`` copies of the traced workgroup finishes on one CU (every
    copy's wave ``i`` on SIMD ``i % 4``; LDS, vector memory and the SIMDs shared). ``events``, when
    given, receives every issued instruction's :class:`Event` (timelines: ``tools/dma_timeline.py``)."""
    decoded = [_decode(i) for i in trace.insts]
    waves = [_Wave(tr, i % SIMDS, g) for g in range(groups) for i, tr in enumerate(trace.waves)]
    ready: list[dict[tuple[str, int], int]] = [{} for _ in waves]
    mfma_free = [0] * SIMDS
    valu_free = [0] * SIMDS
    lds_free = 0
    vmem_free = 0.0
    end = 0
    heap = [(0, i) for i in range(len(waves))]
    while heap:
        key, wi = heapq.heappop(heap)
        w = waves[wi]
        if w.pos >= len(w.trace):
            w.done = True
            end = max(end, w.t, *w.vm, *w.lgkm, *ready[wi].values())  # its loads, stores and MFMAs drained
            _release(waves, w.group, heap)
            continue
        pc, cost = w.trace[w.pos]
        d = decoded[pc]
        rd = ready[wi]
        t = max([w.t] + [rd.get(r, 0) for r in d.reads])
        if d.kind == "s_barrier":
            if events is not None:  # its arrival; the release is the wave's next issue
                events.append(Event(wi, w.pos, pc, d.kind, t, t))
            w.pos += 1
            w.t = t + ISSUE_CLOCKS
            w.at_barrier = True
            _release(waves, w.group, heap)
            continue
        if d.kind == "s_waitcnt":
            t = max(t, _wait_until(w.vm, d.vm), _wait_until(w.lgkm, d.lgkm))
        elif d.kind == "mfma":
            t = max(t, mfma_free[w.simd])
        elif d.kind == "valu":
            t = max(t, valu_free[w.simd])
        if t > key:  # it cannot start before t: let the waves that can go earlier claim the pipes first
            w.t = t
            heapq.heappush(heap, (t, wi))
            continue
        if d.kind == "s_waitcnt":
            w.vm = [c for c in w.vm if c > t]
            w.lgkm = [c for c in w.lgkm if c > t]
            nxt = t + ISSUE_CLOCKS
        elif d.kind == "mfma":
            mfma_free[w.simd] = t + d.clocks
            for r in d.writes:
                rd[r] = t + d.clocks
            nxt = t + ISSUE_CLOCKS
        elif d.kind == "valu":
            valu_free[w.simd] = t + ISSUE_CLOCKS
            for r in d.writes:
                rd[r] = t + ISSUE_CLOCKS
            nxt = t + ISSUE_CLOCKS
        elif d.kind == "ds":
            served = max(t, lds_free)
            lds_free = served + max(cost, 1)
            w.lgkm.append(lds_free + LDS_LATENCY)
            nxt = t + ISSUE_CLOCKS
        elif d.kind == "vmem":
            sent = max(float(t), vmem_free) + cost / memory.bytes_per_clock
            vmem_free = sent
            done = int(sent) + memory.latency
            w.vm.append(max(done, w.vm[-1]) if w.vm else done)  # vmcnt returns in order
            nxt = t + ISSUE_CLOCKS
        elif d.kind == "smem":
            w.lgkm.append(t + SMEM_LATENCY)
            nxt = t + ISSUE_CLOCKS
        elif d.kind in ("s_nop", "s_sleep"):
            nxt = t + max(ISSUE_CLOCKS, d.clocks)
        else:
            nxt = t + ISSUE_CLOCKS
        if events is not None:
            events.append(_event(wi, w.pos, pc, d, t, w, vmem_free))
        w.t = nxt
        w.pos += 1
        heapq.heappush(heap, (w.t, wi))
    return end


@dataclass(frozen=True)
class Event:
    """One issued instruction of a replay: wave, position in its trace, instruction index, kind
    (``_classify``), issue clock and the clock its work is done: an MFMA's end, a DS access's data
    back, a vector-memory access's last byte sent (``sent``) and data back (``done``)."""

    wave: int
    pos: int
    pc: int
    kind: str
    issue: int
    done: int
    sent: float = 0.0


def _event(wi: int, pos: int, pc: int, d: _Decoded, t: int, w: _Wave, vm: float) -> Event:
    """The :class:`Event` of the instruction just issued at ``t`` (the replay's state after it)."""
    if d.kind == "mfma":
        return Event(wi, pos, pc, d.kind, t, t + d.clocks)
    if d.kind == "ds":
        return Event(wi, pos, pc, d.kind, t, w.lgkm[-1])
    if d.kind == "vmem":
        return Event(wi, pos, pc, d.kind, t, w.vm[-1], vm)
    return Event(wi, pos, pc, d.kind, t, t)


def _release(waves: list[_Wave], group: int, heap: list[tuple[int, int]]) -> None:
    """Release a workgroup's barrier once every live wave of it waits there."""
    members = [(i, w) for i, w in enumerate(waves) if w.group == group]
    live = [(i, w) for i, w in members if not w.done]
    if not live or not all(w.at_barrier for _, w in live):
        return
    t = max(w.t for _, w in live)
    for i, w in live:
        w.at_barrier = False
        w.t = t
        heapq.heappush(heap, (t, i))
