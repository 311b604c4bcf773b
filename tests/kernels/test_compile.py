"""Every config of the family compiles for gfx950 on the CPU and stays within its ISA budgets."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest

from te_flydsl_plugin import llvm
from te_flydsl_plugin.emulator import static_wait_states
from te_flydsl_plugin.emulator.decode import Inst, parse_line
from te_flydsl_plugin.flydsl import compiled, family, isa, kloop
from te_flydsl_plugin.flydsl.kernels import gemm
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format

from .helpers import needs_toolchain

pytestmark = [pytest.mark.compile, needs_toolchain]


@pytest.mark.parametrize("cfg", family.FAMILY, ids=lambda c: c.name)
def test_isa_budget(cfg: KernelConfig) -> None:
    rep = isa.isa_report(cfg)
    assert rep["ok"], rep
    assert rep["mfma"] == isa.EXPECTED_MFMA[cfg.lhs_format]
    assert rep["mfma_count"] > 0 and rep["scratch_bytes"] == 0 and rep["spills"] == 0
    assert rep["lds_bytes"] == gemm.geometry(cfg).lds_bytes <= isa.LDS_BUDGET
    assert rep["vgpr"] <= isa.REGISTER_BUDGET
    assert rep["kernel"].startswith(cfg.name)
    assert rep["wait_state_hazards"] == [] and rep["checks"]["wait_states"]


def _instructions(cfg: KernelConfig) -> tuple[str, list[Inst]]:
    """A config's kernel name and its decoded instructions."""
    ck = compiled.compile_config(cfg)
    return ck.kernel, kloop.instructions(llvm.disassemble(ck.code_object))


def test_wait_state_check_sees_a_fence_go() -> None:
    """The check on real machine code: with every ``s_nop`` dropped (the accumulators' 24 wait states
    before each epilogue column group among them), the epilogue's ``v_accvgpr_read``s follow the MFMAs
    that wrote them too soon (cut to one wait state each, the instructions between suffice here)."""
    kernel, insts = _instructions(
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, tile_m=128, tile_n=128, waves=4)
    )
    assert static_wait_states.check(insts, kernel) == []
    found = static_wait_states.check([i for i in insts if i.opcode != "s_nop"], kernel)
    assert found and any(h.detail.startswith("v_accvgpr_read_b32") for h in found), found


def test_wait_state_check_sees_a_valu_write_before_a_k_loop_mfma() -> None:
    """A VALU write of an MFMA's SrcA right before it, inside MXFP8 NT's K loop, is found at that MFMA."""
    cfg = KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, False, False, Format.BF16, tile_k=128)
    kernel, insts = _instructions(cfg)
    assert static_wait_states.check(insts, kernel) == []
    loop = kloop.k_loop(insts)
    assert loop is not None
    mfma = [i for i in loop.body if kloop.is_mfma(i)][5]
    src_a = mfma.operands[1]
    write = parse_line(f"v_mov_b32_e32 v{src_a.index}, 0", mfma.address - 2, (0,))  # an address no instruction has
    at = insts.index(mfma)
    (hazard,) = static_wait_states.check([*insts[:at], write, *insts[at:]], kernel)
    assert (
        hazard.address == mfma.address and f"as SrcA written by v_mov_b32_e32 at 0x{write.address:x}" in hazard.detail
    )


@pytest.mark.parametrize(
    ("cfg", "agprs", "vgprs"),
    [
        (KernelConfig(Format.BF16, Format.BF16, True, False, Format.BF16), 256, 0),
        (KernelConfig(Format.FP8_E4M3, Format.FP8_E5M2, True, True, Format.FP16, tile_k=128), 256, 0),
        (KernelConfig(Format.MXFP8_E5M2, Format.MXFP8_E4M3, False, False, Format.BF16, tile_k=128), 256, 0),
        (KernelConfig(Format.FP16, Format.FP16, True, True, Format.FP32, tile_m=128, tile_n=128, waves=4), 64, 0),
        (KernelConfig(Format.BF16, Format.BF16, True, False, Format.BF16, "dgelu", tile_m=384), 256, 128),
        (KernelConfig(Format.FP8_E5M2, Format.FP8_E4M3, True, True, Format.FP16, tile_m=384, tile_k=128), 256, 128),
        (KernelConfig(Format.FP32, Format.FP32, False, False, Format.BF16, tile_k=32, waves=8), 0, 128),
    ],
    ids=lambda x: x.name if isinstance(x, KernelConfig) else str(x),
)
def test_accumulators_stay_in_place(cfg: KernelConfig, agprs: int, vgprs: int) -> None:
    """Every accumulator is an AGPR that MFMAs write in place (fp32: an arch VGPR, LLVM's own MFMAs;
    KernelConfig.agpr_accumulators), and no loop moves registers between the files (the v_accvgpr_*
    shuffles LLVM's MFMA selection left in the 4-wave K loops before the accumulators were pinned)."""
    rep = isa.isa_report(cfg)
    assert (rep["agpr_accumulators"], rep["vgpr_accumulators"]) == (agprs, vgprs), rep
    assert agprs + vgprs == isa.accumulators(cfg) and cfg.agpr_accumulators == (agprs > 0)
    assert rep["loop_moves"] == rep["not_in_place"] == 0 and rep["loops"] >= 1 and rep["checks"]["accumulators"], rep
    assert rep["agpr"] >= agprs, rep


def test_accumulator_report_sees_moves_in_loops_only() -> None:
    """The check itself: inside the loop a move counts and so does an MFMA whose D is not its C;
    the MFMAs and the move outside the loop do not."""
    text = """
0000000000001900 <k>:
\tv_accvgpr_write_b32 a0, 0                 // 000000001900: D3D94000 18000080
\tv_mfma_f32_16x16x32_bf16 a[0:3], v[0:3], v[4:7], a[0:3] // 000000001908: D3B58000 04020900
\tv_accvgpr_mov_b32 a4, a0                  // 000000001910: D3D94004 18000100
\tv_mfma_f32_16x16x32_bf16 v[8:11], v[0:3], v[4:7], v[12:15] // 000000001918: D3B50008 04220900
\ts_cbranch_scc1 65529                      // 000000001920: BF85FFF9 <k+0x8>
\tv_mfma_f32_16x16x32_bf16 a[16:19], v[0:3], v[4:7], 0 // 000000001924: D3B58010 02020900
\tv_accvgpr_read_b32 v12, a0                // 00000000192C: D3D8400C 18000100
"""
    rep = isa.accumulator_report(kloop.instructions(text))
    assert rep == {"agpr_accumulators": 4, "vgpr_accumulators": 4, "not_in_place": 1, "loop_moves": 1, "loops": 1}


def _is_dma(i: Inst) -> bool:
    return i.opcode.startswith("buffer_load") and " lds" in i.text


@pytest.mark.parametrize(
    ("cfg", "prologue_dmas", "overlap"),
    [
        (KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16), 32, True),
        (KernelConfig(Format.FP16, Format.FP16, False, True, Format.FP32), 32, True),
        (KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, epilogue="bias_gelu"), 32, True),
        (KernelConfig(Format.BF16, Format.BF16, False, False, Format.BF16, epilogue="bgrad"), 32, True),
        (KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, epilogue="bias_gelu", tile_m=384), 40, False),
        (KernelConfig(Format.FP16, Format.FP16, True, False, Format.FP16, "dgelu_bgrad", tile_m=384), 40, False),
        (KernelConfig(Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_k=128), 32, True),
        (KernelConfig(Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_m=384, tile_k=128), 40, False),
        (
            KernelConfig(Format.FP8_E5M2, Format.FP8_E4M3, True, True, Format.BF16, tile_k=128, epilogue="dgelu"),
            32,
            True,
        ),
        (
            KernelConfig(Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_k=128, epilogue="dgelu_bgrad"),
            32,
            False,
        ),
        (KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, True, Format.BF16, tile_k=128), 24, True),
        (KernelConfig(Format.MXFP8_E5M2, Format.MXFP8_E4M3, False, False, Format.FP32, tile_k=128), 24, True),
    ],
    ids=lambda x: x.name if isinstance(x, KernelConfig) else str(x),
)
def test_prologue_and_epilogue_keep_the_port_busy(cfg: KernelConfig, prologue_dmas: int, overlap: bool) -> None:
    """What the timing model rewards at the start and end of a tile (docs/kernels.md, "A tile's start
    and end"): the first DMA goes out before the accumulators are zeroed (256 ``v_accvgpr_write`` /
    ``_mov`` a wave); tile 1's DMA before the first wait for memory (16 transfers a lane and tile; MXFP8
    waits for tile 0 and its first group's 8 scale-word DMAs first: its loop's LDS waits would merge badly
    otherwise); FP8's two scale_inv loads (scalar)
    in the prologue, before that wait; and each epilogue body stores its first block before it reads
    half the accumulators (one fence for all had LLVM read all 256 first). The epilogue runs among the
    last tile's MFMAs, group by group (two K chunks, bf16 / fp16: column groups of the last chunk; one,
    FP8 / MXFP8: row groups; bgrad's row sums too), except the one-chunk dgelu_bgrad's, whose column sums
    span the row groups, and on 384 x 256 the fused epilogues and FP8's, which spilled among the MFMAs."""
    _, insts = _instructions(cfg)
    first_dma = next(n for n, i in enumerate(insts) if _is_dma(i))
    first_wait = next(n for n, i in enumerate(insts) if i.opcode == "s_waitcnt" and "vmcnt" in i.text)
    zeros = {"v_accvgpr_write_b32", "v_accvgpr_mov_b32"}
    assert sum(i.opcode in zeros for i in insts[:first_dma]) <= 8  # LLVM hoists a few of the 256
    assert sum(_is_dma(i) for i in insts[:first_wait]) == prologue_dmas
    scale_loads = [n for n, i in enumerate(insts) if i.opcode == "s_buffer_load_dword"]
    assert len(scale_loads) == (2 if cfg.scaling == "tensor" else 0)
    assert not scale_loads or max(scale_loads) < first_wait
    assert not any(i.opcode == "buffer_load_dword" for i in insts[:first_wait]) or cfg.scaling == "mx"
    loop = kloop.k_loop(insts)
    assert loop is not None
    tail = insts[insts.index(loop.body[-1]) :]
    first_store = next(n for n, i in enumerate(tail) if i.opcode.startswith("buffer_store"))
    assert sum(i.opcode == "v_accvgpr_read_b32" for i in tail[:first_store]) <= 128  # of 256
    # the stores start among the last tile's MFMAs (at 256 x 256 on 4 waves with the last 7 groups' 56),
    # or after the last one
    after = sum(kloop.is_mfma(i) for i in tail[first_store:])
    assert after == (56 if overlap else 0)


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, True, Format.BF16, tile_k=128),
        KernelConfig(Format.MXFP8_E5M2, Format.MXFP8_E4M3, True, False, Format.FP32, tile_k=128),
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, False, False, Format.FP16, tile_k=128),
    ],
    ids=lambda c: c.name,
)
def test_mx_scale_words_cross_the_port_once_and_stay_in_their_registers(cfg: KernelConfig) -> None:
    """MXFP8's loop of four tiles brings the next group's scale words into LDS once per workgroup: 8 word
    DMAs a wave, 2 KiB, so the 4 waves move the 8 KiB of 2 x 16 16-row tiles' words once each (which
    words, the emulator's MXFP8 tests check: a missing one would scale with zeros). They go one between
    two MFMAs and all before their tile's refill, whose publish then waits for them too. Each wave reads
    its 16 words (8 + 8 repetitions) into the very registers its MFMAs read them from, so the loop
    carries them in place: no VALU copy, whose MFMA would need 2 wait states that LLVM does not see."""
    _, insts = _instructions(cfg)
    loop = kloop.k_loop(insts)
    assert loop is not None
    body = list(loop.body)
    words = [n for n, i in enumerate(body) if i.opcode == "buffer_load_dword" and _is_dma(i)]
    assert len(words) == 8
    mfmas_before = [sum(kloop.is_mfma(i) for i in body[:n]) for n in words]
    assert len(set(mfmas_before)) == len(words)  # at most one a gap
    tile = [n for n, i in enumerate(body) if _is_dma(i) and i.opcode != "buffer_load_dword"]
    assert not any(words[0] < n < words[-1] for n in tile)
    refill = next(n for n in tile if n > words[-1])
    assert any(body[n].opcode == "s_barrier" for n in range(words[-1], refill))  # the release, then the refill
    # A word a read, but LLVM may join two adjacent ones (the last two, after the last MFMA) into a
    # ds_read2st64_b32 of a register pair.
    reads = [i for i in body if i.opcode in ("ds_read_b32", "ds_read2st64_b32")]
    read_into = {(i.operands[0].kind, i.operands[0].index + r) for i in reads for r in range(i.operands[0].count)}
    assert len(read_into) == 16
    mfmas = [i for i in body if kloop.is_mfma(i)]
    scales = {(o.kind, o.index) for i in mfmas for o in i.operands[4:6]}
    assert read_into == scales
    assert not any(
        i.opcode.startswith("v_") and not kloop.is_mfma(i) and (i.operands[0].kind, i.operands[0].index) in scales
        for i in body
    )


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16),
        KernelConfig(Format.FP8_E4M3, Format.FP8_E4M3, True, True, Format.BF16, tile_k=128),
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, tile_m=128, tile_n=128),
        KernelConfig(Format.FP16, Format.FP16, True, False, Format.FP32),  # NN: the K-outer rhs too
        KernelConfig(Format.BF16, Format.BF16, False, False, Format.BF16),  # NT: both K-outer
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, False, Format.BF16, tile_k=128),
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, False, False, Format.BF16, tile_k=128),
    ],
    ids=lambda c: c.name,
)
def test_a_waves_transfers_share_an_m0_four_at_a_time(cfg: KernelConfig) -> None:
    """A wave's transfers fill 1 KiB blocks of LDS one after the other, and runs of four share one M0
    write, the rest reached by the immediate offset, 1 KiB apart (docs/kernels.md, "Runs of four
    transfers at one M0"), K-major and K-outer operands alike. An ``s_nop`` is left only where nothing
    fills the wait state between a run's M0 write and its first transfer: at most one a run. (The
    emulator tests run these loops: a transfer at the wrong LDS or global address fails their
    comparison with torch.)"""
    _, insts = _instructions(cfg)
    loop = kloop.k_loop(insts)
    assert loop is not None
    body = list(loop.body)
    dmas = [i for i in body if _is_dma(i) and i.opcode == "buffer_load_dwordx4"]
    m0_writes = [i for i in body if i.opcode.startswith("s_") and i.text.split()[1:2] == ["m0,"]]
    per_loop = {256: 32, 128: 16}[cfg.tile_m] * (2 if cfg.scaling == "mx" else 1)  # MXFP8: 4 tiles, not 2
    assert len(dmas) == per_loop
    words = sum(_is_dma(i) for i in body) - len(dmas)  # MXFP8's scale words: one M0 for a wave's run
    assert len(m0_writes) == len(dmas) // 4 + (words > 0) * 2
    offsets = sorted(i.mod_int("offset") for i in dmas)
    assert offsets == sorted(1024 * (n % 4) for n in range(len(dmas)))
    nops = [i for i in body if i.opcode == "s_nop"]
    assert len(nops) <= len(m0_writes), [i.text for i in nops]


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16),
        KernelConfig(Format.FP16, Format.FP16, True, False, Format.FP16),
        KernelConfig(Format.BF16, Format.BF16, False, False, Format.FP32),
        KernelConfig(Format.FP8_E4M3, Format.FP8_E5M2, True, True, Format.BF16, tile_k=128),
        KernelConfig(Format.FP16, Format.FP16, True, True, Format.FP16, tile_m=128, tile_n=128),
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, True, Format.BF16, tile_k=128),
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, True, False, Format.BF16, tile_k=128),
        KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E4M3, False, False, Format.BF16, tile_k=128),
    ],
    ids=lambda c: c.name,
)
def test_the_k_loop_masks_no_k_tail(cfg: KernelConfig) -> None:
    """The K loop refills only tiles wholly inside K (``gemm._Fill.stage``'s ``whole``; the K tail's refill
    runs in the tiles after it): no compare or select of a K-tail offset (K-major), no tile buffer of its
    own (K-outer: the per-tile base's 64-bit add and stride mask), every transfer's tile in its scalar
    offset instead. Before, a bf16 TN iteration held 32 selects and NT's four tile buffers about 40
    scalar instructions (docs/kernels.md, "Whole tiles in the K loop")."""
    _, insts = _instructions(cfg)
    loop = kloop.k_loop(insts)
    assert loop is not None
    body = list(loop.body)
    assert not [i.text for i in body if i.opcode.startswith(("v_cndmask", "v_cmp", "s_cselect", "s_and_b32"))]
    assert not [i.text for i in body if i.opcode in ("s_addc_u32", "s_lshl_b64")]
    dmas = [i for i in body if _is_dma(i) and i.opcode == "buffer_load_dwordx4"]
    assert dmas and all(re.match(r"s\d+$", i.text.replace(",", " ").split()[3]) for i in dmas), dmas[0].text


def test_backed_is_part_of_the_family() -> None:
    assert set(family.BACKED) <= set(family.FAMILY)


def test_mixed_fp8_uses_per_operand_kinds() -> None:
    """lhs E4M3 x rhs E5M2 needs no conversion: the MFMA's A operand is rhs (kernels/mfma.py), so its
    format code says cbsz:1 and B's (E4M3, blgp 0, not printed) is the default."""

    cfg = KernelConfig(Format.FP8_E4M3, Format.FP8_E5M2, True, True, Format.BF16, tile_k=128)
    text = llvm.disassemble(compiled.compile_config(cfg).code_object)
    mfmas = [ln for ln in text.splitlines() if "v_mfma_f32_16x16x128_f8f6f4" in ln]
    assert mfmas and all("cbsz:1" in ln and "blgp" not in ln for ln in mfmas)


def test_transposed_operands_read_lds_transposed() -> None:

    cfg = KernelConfig(Format.BF16, Format.BF16, False, False, Format.BF16, waves=4)
    assert "ds_read_b64_tr_b16" in llvm.disassemble(compiled.compile_config(cfg).code_object)


def test_direct_to_lds_loads() -> None:

    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16, waves=4)
    text = llvm.disassemble(compiled.compile_config(cfg).code_object)
    assert any("buffer_load_dwordx4" in ln and " lds" in ln for ln in text.splitlines())


def test_cache_memory_then_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TE_FLYDSL_CACHE_DIR", str(tmp_path))
    cfg = KernelConfig(Format.FP16, Format.FP16, True, True, Format.FP16)
    monkeypatch.setattr(compiled, "_memory", {})
    first = compiled.compile_config(cfg)
    assert not first.from_disk and compiled.compile_config(cfg) is first
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".hsaco", ".json"]
    monkeypatch.setattr(compiled, "_memory", {})
    again = compiled.compile_config(cfg)
    assert again.from_disk and again.code_object == first.code_object and again.resources == first.resources


def test_cache_key_ignores_shapes_and_separates_configs() -> None:
    a = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16)
    b = KernelConfig(Format.BF16, Format.BF16, True, False, Format.BF16)
    assert compiled.cache_key(a, "gfx950") == compiled.cache_key(a, "gfx950")
    assert compiled.cache_key(a, "gfx950") != compiled.cache_key(b, "gfx950")
    assert compiled.cache_key(a, "gfx950") != compiled.cache_key(a, "gfx942")


def test_cache_threads_compile_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TE_FLYDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_memory", {})
    calls = []
    real = compiled._compile

    def counting(cfg: KernelConfig, arch: str) -> compiled.CompiledKernel:
        calls.append(cfg)
        return real(cfg, arch)

    monkeypatch.setattr(compiled, "_compile", counting)
    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.FP32)
    got: list[compiled.CompiledKernel] = []
    threads = [threading.Thread(target=lambda: got.append(compiled.compile_config(cfg))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len({id(g) for g in got}) == 1


_CHILD = """
import sys
from te_flydsl_plugin.flydsl import compiled, isa
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format
ck = compiled.compile_config(KernelConfig(Format.FP16, Format.FP16, True, False, Format.FP32))
print(len(ck.code_object))
"""


def test_cache_processes_share_a_directory(tmp_path) -> None:
    """Two processes racing on one directory both succeed and leave one whole entry."""
    env = {**__import__("os").environ, "TE_FLYDSL_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    sizes = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(sizes) == 1
    names = sorted(p.name for p in tmp_path.iterdir())
    assert [n.rsplit(".", 1)[1] for n in names] == ["hsaco", "json"]  # no temporaries left behind


def test_precompile_reports_progress() -> None:
    seen: list[tuple[int, int]] = []
    cfgs = family.FAMILY[:2]
    reports = isa.precompile("gfx950", progress=lambda i, n, r: seen.append((i, n)), configs=cfgs)
    assert [r["config"] for r in reports] == [c.name for c in cfgs] and seen == [(1, 2), (2, 2)]
    assert all(r["ok"] and r["compile_s"] >= 0 for r in reports)


def test_precompile_in_worker_processes_matches_one_process(tmp_path, monkeypatch) -> None:
    """``jobs=2``: the reports of spawned workers, in the configs' order, as one process makes them; the
    workers fill the disk cache (the serial pass after them loads every config from it)."""
    monkeypatch.setenv("TE_FLYDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "_memory", {})
    cfgs = tuple(c for c in family.FAMILY if c.tile_m == 128)[:3]  # the cheapest to compile
    seen: list[tuple[int, int, str]] = []
    parallel = isa.precompile("gfx950", lambda i, n, r: seen.append((i, n, r["config"])), cfgs, jobs=2)
    assert [r["config"] for r in parallel] == [c.name for c in cfgs]
    assert [s[:2] for s in seen] == [(1, 3), (2, 3), (3, 3)] and {s[2] for s in seen} == {c.name for c in cfgs}
    assert not any(r["from_disk"] for r in parallel) and len(list(tmp_path.glob("*.hsaco"))) == 3
    serial = isa.precompile("gfx950", configs=cfgs)
    assert all(r["from_disk"] for r in serial)
    timing = ("compile_s", "from_disk")
    assert [{k: v for k, v in r.items() if k not in timing} for r in parallel] == [
        {k: v for k, v in r.items() if k not in timing} for r in serial
    ]
    with pytest.raises(ValueError, match="at least 1"):
        isa.precompile("gfx950", configs=cfgs, jobs=0)


def test_launcher_compiles_once_per_config() -> None:
    """The flydsl executor's in-process function: compiled for gfx950 from the launch's own
    arguments, then reused for every later launch of the config (any shape)."""
    from te_flydsl_plugin.flydsl.kernels import gemm

    cfg = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16)
    first = compiled.launcher(cfg, gemm.placeholder_args(cfg))
    assert type(first).__name__ == "CompiledFunction"
    assert compiled.launcher(cfg, gemm.placeholder_args(cfg)) is first
