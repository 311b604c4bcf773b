"""The K-loop report (flydsl/kloop.py): found by its backward branch in hand-written disassemblies,
counted exactly, timed by llvm-mca with the FP8 pass correction; the real family's report and the
precompile CLI's table and JSON."""

from __future__ import annotations

import json
import struct

import pytest

from te_flydsl_plugin import cli
from te_flydsl_plugin.flydsl import isa, kloop
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format

from .helpers import needs_toolchain

needs_mca = pytest.mark.skipif(kloop.mca_tool() is None, reason="no llvm-mca >= 18: apt-get install llvm-22")

BASE = 0x1000


def disassembly(lines: list[str]) -> str:
    """llvm-objdump-shaped text of one kernel ``k``: one 8-byte word pair per instruction; a line
    ``s_cbranch_scc1 @N`` branches to instruction N (objdump prints the 16-bit word offset)."""
    out = [f"{BASE:016x} <k>:"]
    for i, asm in enumerate(lines):
        addr = BASE + 8 * i
        words = "00000000 00000000"
        if "@" in asm:
            op, target = asm.split("@")
            simm = (BASE + 8 * int(target) - (addr + 4)) // 4 & 0xFFFF
            asm, words = f"{op}{simm}", f"{struct.unpack('<I', struct.pack('<HH', simm, 0xBF85))[0]:08X}"
        out.append(f"\t{asm:<60}// {addr:012X}: {words}")
    return "\n".join(out) + "\n"


MFMA = "v_mfma_f32_16x16x32_bf16 a[{0}:{1}], v[0:3], v[4:7], a[{0}:{1}]"


def _mfmas(n: int, fmt: str = MFMA) -> list[str]:
    return [fmt.format(4 * j, 4 * j + 3) for j in range(n)]


def _kernel(n_mfma: int) -> list[str]:
    """A prologue with an MFMA, a K loop (reads, waits, ``n_mfma`` MFMAs, a fence, a barrier, the loop
    counter), and an epilogue MFMA: only the loop's count."""
    body = ["ds_read_b128 v[0:3], v10", "s_waitcnt lgkmcnt(0)", *_mfmas(n_mfma), "s_nop 3", "s_barrier",
            "v_add_u32_e32 v10, 64, v10", "s_add_i32 s4, s4, -1", "s_cmp_lg_u32 s4, 0"]  # fmt: skip
    head = ["s_mov_b32 s4, 8", MFMA.format(0, 3)]
    return [*head, *body, f"s_cbranch_scc1 @{len(head)}", MFMA.format(0, 3), "s_endpgm"]


def test_handwritten_loop_is_found_and_counted() -> None:
    insts = kloop.instructions(disassembly(_kernel(2)))
    rep = kloop.report(insts)
    assert rep["found"] and rep["start"] == f"0x{BASE + 16:x}" and rep["end"] == f"0x{BASE + 8 * 11:x}"
    assert (rep["instructions"], rep["mfma"], rep["mfma_passes"]) == (10, 2, 8)
    assert (rep["xdl_floor"], rep["xdl_floor_clocks"]) == (8, 32)
    assert rep["non_mfma_slots"] == 11 and rep["nop_wait_states"] == 4  # s_nop 3 is 4 slots
    assert rep["slots_per_pass"] == round(11 / 8, 3)
    c = rep["by_class"]
    assert (c["ds"], c["s_waitcnt"], c["s_nop"], c["s_barrier"], c["branch"], c["salu"], c["valu"]) == (
        1, 1, 1, 1, 1, 2, 1,
    )  # fmt: skip


def test_doubling_mfmas_doubles_the_floor() -> None:
    one, two = (kloop.report(kloop.instructions(disassembly(_kernel(n)))) for n in (8, 16))
    assert two["xdl_floor"] == 2 * one["xdl_floor"] == 2 * 8 * 4
    assert two["mfma_passes"] == 2 * one["mfma_passes"]


@needs_mca
def test_mca_times_an_mfma_bound_loop_at_its_floor() -> None:
    """Independent MFMAs only: the XDL pipe is the bottleneck, 4 model cycles per 4-pass MFMA, and
    twice the MFMAs take twice the cycles."""
    reps = [kloop.report(kloop.instructions(disassembly([*_mfmas(n), "s_cbranch_scc1 @0"]))) for n in (16, 32)]
    for r in reps:
        assert r["mca_note"] is None and r["mca_cycles"] == pytest.approx(r["xdl_floor"], rel=0.02)
    assert reps[1]["mca_cycles"] == pytest.approx(2 * reps[0]["mca_cycles"], rel=0.02)


F8 = "v_mfma_f32_16x16x128_f8f6f4 a[{0}:{1}], v[0:7], v[8:15], a[{0}:{1}]"


@needs_mca
def test_fp8_mfmas_are_corrected_to_8_passes() -> None:
    """llvm-mca times the FP8 16x16x128 MFMA as 4 passes; with its 8-pass stand-in (or fed twice)
    an MFMA-bound loop of 16 takes 16 x 8 cycles."""
    insts = kloop.instructions(disassembly([*_mfmas(16, F8), "s_cbranch_scc1 @0"]))
    rep = kloop.report(insts)
    assert rep["mfma_passes"] == 16 * 8 and rep["fp8_mfma_corrected"] == 16
    assert rep["mca_cycles_uncorrected"] == pytest.approx(16 * 4, rel=0.05)
    assert rep["mca_cycles"] == pytest.approx(16 * 8, rel=0.05) and rep["ratio"] == pytest.approx(1.0, rel=0.05)
    assert rep["mca_cycles_upper"] >= rep["mca_cycles"]


def test_fp8_stand_ins_keep_accumulators_and_first_source_registers() -> None:
    (f8,) = kloop.instructions(disassembly([F8.format(8, 11) + " blgp:1"]))
    assert kloop.mca_text([f8]) == "v_mfma_f32_16x16x4_f32 a[8:11], v0, v8, a[8:11]\n"
    assert kloop.mca_text([f8], "duplicate") == 2 * (f8.text + "\n") and kloop.mca_text([f8], "none") == f8.text + "\n"
    (big,) = kloop.instructions(disassembly(["v_mfma_f32_32x32x64_f8f6f4 a[0:15], v[0:7], v[8:15], a[0:15]"]))
    assert kloop.passes(big) == 16 and kloop.mca_text([big]).startswith("v_mfma_f32_32x32x2_f32 a[0:15], v0, v8,")
    with pytest.raises(ValueError, match="fp8 must be one of"):
        kloop.mca_text([f8], "twice")


def test_fp4_operands_take_4_passes() -> None:
    (inst,) = kloop.instructions(disassembly([F8.format(0, 3) + " cbsz:4 blgp:4"]))
    assert kloop.passes(inst) == 4 and "v_mfma" in kloop.mca_text([inst]) and kloop.mca_text([inst]).count("\n") == 1


def test_nested_loops_pick_the_inner_one_and_no_loop_is_reported() -> None:
    lines = ["s_mov_b32 s5, 2", "s_mov_b32 s4, 4", *_mfmas(4), "s_cmp_lg_u32 s4, 0", "s_cbranch_scc1 @1",
             *_mfmas(1), "s_cmp_lg_u32 s5, 0", "s_cbranch_scc1 @0", "s_endpgm"]  # fmt: skip
    lp = kloop.k_loop(kloop.instructions(disassembly(lines)))
    assert lp is not None and (lp.start, lp.end) == (BASE + 8, BASE + 8 * 7)
    assert kloop.report(kloop.instructions(disassembly(["s_mov_b32 s4, 0", *_mfmas(2), "s_endpgm"]))) == {
        "found": False
    }


def test_missing_llvm_mca_is_one_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kloop, "mca_tool", lambda: None)
    rep = kloop.report(kloop.instructions(disassembly(_kernel(2))))
    assert rep["mca_cycles"] is None and rep["ratio"] is None and "apt-get install llvm-22" in rep["mca_note"]
    assert rep["xdl_floor"] == 8  # the static counts never depend on llvm-mca


BF16_TN = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4)
FP8_TN = KernelConfig(Format.FP8_E4M3, Format.FP8_E5M2, True, True, Format.BF16, tile_k=128, waves=4)


@pytest.mark.compile
@needs_toolchain
@needs_mca
@pytest.mark.parametrize("cfg", [BF16_TN, FP8_TN], ids=lambda c: c.name)
def test_family_kloop_report(cfg: KernelConfig) -> None:
    """The 256 x 256 K loop of 4 waves: 128 x 128 per wave per K tile = 64 16x16 blocks, each 2 bf16
    MFMAs of K 32 (tile_k 64) or one FP8 MFMA of K 128: 512 passes a tile either way; both loops run a
    pair of tiles an iteration (gemm_kernel)."""
    k = isa.isa_report(cfg)["kloop"]
    fp8 = cfg.lhs_format.is_fp8
    tiles = 2
    assert k["found"] and k["k_tiles"] == tiles and k["mfma"] == tiles * (64 if fp8 else 128)
    assert k["xdl_floor"] == tiles * 512 and k["fp8_mfma_corrected"] == (tiles * 64 if fp8 else 0)
    assert k["mca_cycles"] >= k["xdl_floor"] and k["ratio"] == round(k["mca_cycles"] / k["xdl_floor"], 3)
    assert k["mca_cycles_upper"] >= k["mca_cycles"] >= k["mca_cycles_uncorrected"]
    assert k["by_class"]["ds"] == tiles * 32 and k["by_class"]["s_barrier"] >= tiles


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.compile
@needs_toolchain
def test_precompile_cli_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    only = BF16_TN.name
    rc, out, _ = _cli(capsys, "precompile", "--only", only)
    assert rc == 0 and "K loop, one steady-state iteration" in out
    head = next(ln for ln in out.splitlines() if "ratio" in ln and "slots/pass" in ln)
    row = out.splitlines()[out.splitlines().index(head) + 1].split()
    assert row[0] == only and row[1] == "2.0" and row[6] == "1024"  # a pair of K tiles an iteration; the floor
    rc, out, _ = _cli(capsys, "precompile", "--only", only, "--json", "--lds")
    (rep,) = json.loads(out)["kernels"]
    lds = rep["kloop"]["lds"]["per_iteration"]
    assert rc == 0 and rep["kloop"]["xdl_floor"] == 1024 and lds["conflict_cycles"] == 0 and lds["cycles"] > 0
    rc, out, err = _cli(capsys, "precompile", "--only", "no-such-config")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no-such-config" in err
