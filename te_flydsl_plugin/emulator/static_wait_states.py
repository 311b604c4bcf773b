"""The wait-state rules on every path of a kernel, without running it.

A launch checks the wait-state rules (hazards.py) on the path it takes; a hazard on a path no launch
takes (a branch only some tiles run, the K loop's back edge into its first MFMAs, a fall-through
past a skipped block) stays unseen. Since the rules only look back a bounded number of wait states
(``MAX_AFTER_MFMA``, the largest rule: nothing older matters), every path can be checked from the
control-flow graph: for each basic block, every way into it that reaches back that far (through
loops too) is replayed with the block through the same rule code the emulator runs, with no data.
What a replay reports inside the block is a hazard on that path.

Without values, a branch is taken both ways, so a path that exists in the code but that no launch
could take (a condition that is always false) is checked too; the rules cost nothing on the paths
that do exist, which is what LLVM's hazard recognizer guarantees for the code it emits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .decode import Inst
from .hazards import MAX_AFTER_MFMA, Hazard, HazardTracker, WaveCounters, wait_states

_REACH = MAX_AFTER_MFMA + 1  # wait states of history a block's replay needs before its first instruction
_NO_FALL_THROUGH = ("s_branch", "s_endpgm", "s_setpc_b64")  # what never continues to the next instruction


class _Probe:
    """The part of a wave the wait-state rules read: its id and its counters."""

    wave_id = 0

    def __init__(self) -> None:
        self.hazards = WaveCounters()
        self.hazards.start_wait_states()


def _nothing(_w: object) -> None:
    """The instruction itself: nothing runs, only its wait states are counted and checked."""


def _blocks(insts: Sequence[Inst]) -> list[list[Inst]]:
    """Basic blocks, in code order: a block ends at a branch or an instruction that stops the wave,
    and before every branch target."""
    targets = {i.branch_target for i in insts if i.branch_target is not None}
    blocks: list[list[Inst]] = []
    cur: list[Inst] = []
    for inst in insts:
        if cur and inst.address in targets:
            blocks.append(cur)
            cur = []
        cur.append(inst)
        if inst.branch_target is not None or inst.opcode in _NO_FALL_THROUGH:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def _predecessors(blocks: list[list[Inst]]) -> list[list[int]]:
    """Each block's predecessors (indices): the block before it unless that one never falls through,
    and every block whose last instruction branches to its first."""
    start = {b[0].address: n for n, b in enumerate(blocks)}
    preds: list[list[int]] = [[] for _ in blocks]
    for n, b in enumerate(blocks):
        last = b[-1]
        if n + 1 < len(blocks) and last.opcode not in _NO_FALL_THROUGH:
            preds[n + 1].append(n)
        if last.branch_target is not None and last.branch_target in start:
            preds[start[last.branch_target]].append(n)
    return preds


def _within_reach(insts: Sequence[Inst], have: int) -> tuple[int, int]:
    """How many of ``insts``, in order, are issued fewer than ``_REACH`` wait states after the first,
    counting ``have`` already passed, and the wait states then passed. Walked backwards it is how far a
    prefix reaches back; forwards, how far into a block a prefix still reaches."""
    got = have
    for n, inst in enumerate(insts):
        if got >= _REACH:
            return n, got
        got += wait_states(inst)
    return len(insts), got


def _prefixes(n: int, blocks: list[list[Inst]], preds: list[list[int]]) -> list[tuple[int, ...]]:
    """Every distinct run of instructions (their addresses) that can come right before block ``n``,
    each reaching back ``_REACH`` wait states or to the kernel's entry."""
    out: set[tuple[int, ...]] = set()

    def walk(block: int, tail: tuple[int, ...], have: int) -> None:
        if have >= _REACH or not preds[block]:
            out.add(tail)
            return
        for p in preds[block]:
            taken, got = _within_reach(blocks[p][::-1], have)
            walk(p, tuple(i.address for i in blocks[p][len(blocks[p]) - taken :]) + tail, got)

    walk(n, (), 0)
    return sorted(out)


def _head(block: list[Inst]) -> list[Inst]:
    """The block's instructions that a prefix can still reach: those issued fewer than ``_REACH`` wait
    states after the block's first. Past them every prefix's history is older than any rule looks back,
    so the rest of the block replays the same way whatever came before it."""
    return block[: _within_reach(block, 0)[0]]


def check(insts: Sequence[Inst], kernel: str) -> list[Hazard]:
    """The wait-state hazards of one kernel's instructions (``decode_text``'s list for it), on every
    path through its basic blocks; one per instruction, in address order."""
    at = {i.address: i for i in insts}
    blocks = _blocks(insts)
    preds = _predecessors(blocks)
    found: dict[int, Hazard] = {}
    for n, block in enumerate(blocks):
        inside = {i.address for i in block}
        head = _head(block)
        for nth, prefix in enumerate(_prefixes(n, blocks, preds)):
            tracker = HazardTracker(kernel, "report", np.zeros(1, np.uint8))
            probe = _Probe()
            # the first way in replays the whole block; the others only what they can still reach
            for inst in [at[a] for a in prefix] + (head if nth else block):
                tracker.wait_state_step(inst, _nothing)(probe)  # type: ignore[arg-type]
            for h in tracker.found:
                if h.address in inside:
                    found.setdefault(h.address, h)
    return [found[a] for a in sorted(found)]
