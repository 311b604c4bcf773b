"""The wait-state rules on every path (static_wait_states.py): on straight code it finds what a run
finds; with branches it also finds the paths a run does not take, and only paths that exist."""

from __future__ import annotations

import pytest

from te_flydsl_plugin.emulator import static_wait_states
from te_flydsl_plugin.emulator.hazards import MAX_AFTER_MFMA

from .helpers import Program

pytestmark = pytest.mark.emulator

BF16 = "v_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[4:7], a[0:3]"  # 4 passes: a VALU read waits 8
F8 = "v_mfma_f32_16x16x128_f8f6f4 a[0:3], v[0:7], v[8:15], a[0:3]"  # 8 passes: 12
READ = "v_accvgpr_read_b32 v8, a1"


def _static(asm: str) -> list[tuple[str, int, str]]:
    prog = Program(asm)
    return [(h.kind, h.address, h.detail) for h in static_wait_states.check(prog.insts, "test")]


def _run(asm: str, setup=None) -> list[tuple[str, int, str]]:  # type: ignore[no-untyped-def]
    prog = Program(asm, lds_bytes=256, hazards="report")
    prog.run(setup)
    return [(h.kind, h.address, h.detail) for h in prog.tracker.found if h.kind == "wait-states"]


STRAIGHT = {
    "mfma-then-read": f"{BF16}\n{READ}",
    "mfma-nops-short": f"{BF16}\ns_nop 6\n{READ}",
    "mfma-nops-enough": f"{BF16}\ns_nop 7\n{READ}",
    "fp8-then-read": f"{F8}\ns_nop 9\n{READ}",
    "valu-then-mfma": f"v_mov_b32_e32 v2, 0\n{BF16}",
    "valu-nop-mfma": f"v_mov_b32_e32 v2, 0\ns_nop 1\n{BF16}",
    "exec-then-mfma": f"v_cmpx_eq_u32_e32 vcc, v30, v30\ns_nop 1\n{BF16}",
    "srcc-war": f"{BF16}\nv_accvgpr_write_b32 a1, 0",
    "chain": "\n".join([BF16] * 4 + [F8] * 2),
    "two-consumers": f"{BF16}\n{READ}\nv_mov_b32_e32 v9, a2\ns_nop 4\nv_mov_b32_e32 v9, a3",
}


@pytest.mark.parametrize("asm", STRAIGHT.values(), ids=STRAIGHT.keys())
def test_straight_code_finds_what_a_run_finds(asm: str) -> None:
    assert _static(asm) == _run(asm)


def test_a_taken_branch_over_the_nops_is_a_path() -> None:
    """The nops a run executes (SCC 0: no branch) cover the read; the path that skips them does not."""
    asm = f"{BF16}\ns_cbranch_scc1 2\ns_nop 7\ns_nop 7\n{READ}"
    assert _run(asm) == []
    (hazard,) = _static(asm)
    assert hazard[:2] == ("wait-states", 0x1000 + 8 * 4)
    assert hazard[2].endswith("after 1 wait states, needs 8")


def test_the_loop_back_edge_is_a_path() -> None:
    """The read at the loop's head is clean on entry; after the back edge it follows the MFMA by 2."""
    loop = f"s_mov_b32 s0, 3\n{READ}\n{BF16}\ns_sub_u32 s0, s0, 1\ns_cmp_eq_u32 s0, 0\ns_cbranch_scc0 -5"
    (hazard,) = _static(loop)
    assert hazard[:2] == ("wait-states", 0x1008) and hazard[2].endswith("after 3 wait states, needs 8")
    assert _run(loop) == [hazard]  # the loop runs its back edge, so a run finds it too
    padded = loop.replace("s_cbranch_scc0 -5", "s_nop 4\ns_cbranch_scc0 -6")
    assert _static(padded) == [] == _run(padded)


def test_a_short_loop_reaches_back_through_its_own_iterations() -> None:
    """A loop body of fewer wait states than the rules look back: the MFMA of an earlier iteration
    still counts (a body of 4, an F8 result wanted 12 later)."""
    asm = f"{F8}\ns_nop 0\ns_cbranch_scc0 -3\n{READ}"
    (hazard,) = _static(asm)
    assert hazard[1] == 0x1000 + 8 * 3 and hazard[2].endswith("after 2 wait states, needs 12")


def test_no_fall_through_after_an_unconditional_branch() -> None:
    """The read after ``s_branch`` has no way in (nothing branches to it), the one at the target is
    9 wait states after the MFMA: clean."""
    assert _static(f"{BF16}\ns_branch 1\n{READ}\ns_nop 7\n{READ}") == []
    assert _static(f"{BF16}\ns_cbranch_scc0 1\n{READ}\ns_nop 7\n{READ}") != []  # a conditional one falls through


def test_the_longest_rule_reaches_across_blocks() -> None:
    """A 16-pass MFMA's result wants ``MAX_AFTER_MFMA`` (20) wait states before a VALU reads it: counted
    back through a branch into the block before, 20 are clean and 19 are not."""
    big = "v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[16:23], v[24:31], 0"
    assert MAX_AFTER_MFMA == 20
    assert _static(f"{big}\ns_nop 15\ns_cbranch_scc0 0\ns_nop 2\nv_mov_b32_e32 v40, a5") == []
    (hazard,) = _static(f"{big}\ns_nop 15\ns_cbranch_scc0 0\ns_nop 1\nv_mov_b32_e32 v40, a5")
    assert hazard[2].endswith("after 19 wait states, needs 20")


def test_every_way_in_is_checked_as_far_as_it_reaches() -> None:
    """A block with two ways in replays the whole block for its first and only its first
    ``MAX_AFTER_MFMA`` + 1 wait states for the other (the rules look back no further). The taken branch
    comes first and is clean; the fall-through carries a 16-pass MFMA to a read 19 wait states into the
    block (20 needed): the farthest a hazard can sit, which the shorter replay must still reach."""
    big = "v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[16:23], v[24:31], 0"
    asm = f"s_mov_b32 s0, 3\ns_cbranch_scc1 1\n{big}\ns_nop 15\ns_nop 2\nv_mov_b32_e32 v40, a5"
    (hazard,) = _static(asm)
    assert hazard[1] == 0x1000 + 8 * 5 and hazard[2].endswith("after 19 wait states, needs 20")
    assert _static(asm.replace("s_nop 2", "s_nop 3")) == []
