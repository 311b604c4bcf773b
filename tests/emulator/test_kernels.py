"""Compiled FlyDSL kernels run in the emulator against torch; broken kernels are caught.

The small kernels are ours (tests/emulator/kernels); the GEMM runs are the project's own family
(te_flydsl_plugin/flydsl/kernels), launched the way the emulator executor launches them.
"""

from __future__ import annotations

import itertools
import re
import time

import pytest
import torch

from te_flydsl_plugin.dtypes import payload_dtype
from te_flydsl_plugin.emulator import EmulatorError, HazardError, kernarg_layout, launch, pack_flydsl_kernarg
from te_flydsl_plugin.flydsl import family

from .helpers import S_NOP, S_TRAP, compile_kernel, instructions, needs_toolchain, patch_word

pytestmark = [pytest.mark.compile, pytest.mark.emulator, needs_toolchain]


@pytest.fixture(scope="module")
def vec_add_co() -> bytes:
    return compile_kernel("vec_add", "add", torch.empty(8, 256), torch.empty(8, 256), torch.empty(8, 256))


def test_flydsl_tensor_abi(vec_add_co: bytes) -> None:
    """A dynamic-layout 2-D tensor is a pointer and a {i32 M, i32 N, i64 stride0} struct."""
    args = kernarg_layout(vec_add_co, None)
    assert [(a.offset, a.size, a.value_kind) for a in args[:2]] == [(0, 8, "global_buffer"), (8, 16, "by_value")]
    t = torch.empty(5, 7)[:, :6]
    blob = pack_flydsl_kernarg(vec_add_co, None, [t, t, t])
    assert int.from_bytes(blob[0:8], "little") == t.data_ptr()
    assert [int.from_bytes(blob[i : i + w], "little") for i, w in ((8, 4), (12, 4), (16, 8))] == [5, 6, 7]


@pytest.mark.parametrize(("m", "n"), [(4, 128), (10, 100), (13, 300)])
def test_vec_add_edges_and_grid(vec_add_co: bytes, m: int, n: int) -> None:
    a, b, c = torch.randn(m, n), torch.randn(m, n), torch.full((m, n), -7.0)
    grid = (-(-m // 4), -(-n // 128), 1)
    rep = launch(vec_add_co, None, pack_flydsl_kernarg(vec_add_co, None, [a, b, c]), grid, (128, 1, 1))
    assert torch.equal(c, a + b)
    assert rep.workgroups == grid[0] * grid[1] and rep.hazards == [] and rep.opcode_counts["global_load_dwordx4"] > 0


def test_workgroup_subset(vec_add_co: bytes) -> None:
    a, b, c = torch.randn(8, 256), torch.randn(8, 256), torch.zeros(8, 256)
    launch(
        vec_add_co,
        None,
        pack_flydsl_kernarg(vec_add_co, None, [a, b, c]),
        (2, 2, 1),
        (128, 1, 1),
        workgroups=[(1, 0, 0)],
    )
    assert torch.equal(c[4:8, :128], (a + b)[4:8, :128]) and c[:4].eq(0).all() and c[:, 128:].eq(0).all()


@pytest.mark.parametrize(
    ("elem", "dtype", "tile_k", "mfma"),
    [
        (0, torch.float32, 8, "v_mfma_f32_16x16x4_f32"),
        (1, torch.bfloat16, 64, "v_mfma_f32_16x16x32_bf16"),
        (2, torch.float16, 32, "v_mfma_f32_16x16x32_f16"),
    ],
)
def test_tiled_mma(elem: int, dtype: torch.dtype, tile_k: int, mfma: str) -> None:
    a, b, c = torch.randn(32, tile_k).to(dtype), torch.randn(32, tile_k).to(dtype), torch.zeros(32, 32)
    co = compile_kernel("tiled_mma", "mma_tile", a, b, c, tile_k, elem)
    rep = launch(co, None, pack_flydsl_kernarg(co, None, [a, b, c]), (1, 1, 1), (256, 1, 1))
    assert rep.opcode_counts.get(mfma, 0) > 0
    torch.testing.assert_close(c, a.double().matmul(b.double().T).float(), rtol=1e-5, atol=1e-5)


def test_inline_asm_mfma_without_s_nop_is_a_wait_state_hazard() -> None:
    """An MFMA written as inline asm ("=a,v,v,0") is no MFMA to LLVM's hazard recognizer: it puts no
    s_nop before the stores that read the AGPR result, and the emulator reports each of them (an
    8-pass XDL result needs 12 wait states). The same kernel with the s_nops in the asm is clean."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 512, generator=gen).to(torch.float8_e4m3fn).view(torch.uint8) for _ in range(2))
    want = a.view(torch.float8_e4m3fn).double() @ b.view(torch.float8_e4m3fn).double().T
    for pad in (0, 1):
        d = torch.full((16, 16), float("nan"))
        co = compile_kernel("asm_mfma", "asm_mfma", a, b, d, pad)
        rep = launch(co, None, pack_flydsl_kernarg(co, None, [a, b, d]), (1, 1, 1), (64, 1, 1), hazards="report")
        torch.testing.assert_close(d.double(), want, rtol=1e-5, atol=1e-5)
        if pad:
            assert rep.hazards == []
            continue
        assert rep.hazards and {h.kind for h in rep.hazards} == {"wait-states"}
        assert re.search(
            r"reads a\d+ written by v_mfma_f32_16x16x128_f8f6f4 .*\(8 passes\) .*, needs 12$", rep.hazards[0].detail
        )
        with pytest.raises(HazardError, match=r"\[wait-states\]"):
            launch(co, None, pack_flydsl_kernarg(co, None, [a, b, d]), (1, 1, 1), (64, 1, 1))


# -- the project's GEMM family ------------------------------------------------------------------


def _gemm(lhs_fmt: str, rhs_fmt: str, lhs_k: bool, rhs_k: bool, out_fmt: str):  # type: ignore[no-untyped-def]
    from te_flydsl_plugin.flydsl import compiled
    from te_flydsl_plugin.spec import Format

    f = {
        "bf16": Format.BF16,
        "fp16": Format.FP16,
        "fp32": Format.FP32,
        "e4m3": Format.FP8_E4M3,
        "e5m2": Format.FP8_E5M2,
    }
    cfg = next(
        c
        for c in family.FAMILY
        if (c.lhs_format, c.rhs_format, c.lhs_k_major, c.rhs_k_major, c.out_format)
        == (f[lhs_fmt], f[rhs_fmt], lhs_k, rhs_k, f[out_fmt])
    )
    return cfg, compiled.compile_config(cfg)


def _run_gemm(cfg, ck, m: int, n: int, k: int, code_object: bytes | None = None, hazards: str = "raise"):  # type: ignore[no-untyped-def]
    from te_flydsl_plugin.flydsl.kernels import gemm
    from te_flydsl_plugin.flydsl.launch import Launch, kernarg_values

    g = torch.Generator().manual_seed(m * 7 + n * 3 + k)

    def operand(rows: int, fmt, k_major: bool):  # type: ignore[no-untyped-def]
        x = torch.randn(rows, k, generator=g).clamp(-4, 4).to(payload_dtype(fmt))
        return (x if k_major else x.t().contiguous()), x.double()

    lhs, lref = operand(m, cfg.lhs_format, cfg.lhs_k_major)
    rhs, rref = operand(n, cfg.rhs_format, cfg.rhs_k_major)
    out = torch.full((m, n), 3.0, dtype=payload_dtype(cfg.out_format))
    one = torch.ones(1)
    scales = (one, one) if cfg.lhs_format.is_fp8 else (None, None)
    ln = Launch(cfg, out, lhs, rhs, *scales, 1.0, 0.0)
    co = code_object or ck.code_object
    kernarg = pack_flydsl_kernarg(co, ck.kernel, kernarg_values(ln))
    grid = (gemm.grid_size(cfg, m, n), 1, 1)
    rep = launch(co, ck.kernel, kernarg, grid, (gemm.block_size(cfg), 1, 1), hazards=hazards)
    return rep, out, lref @ rref.T


@pytest.mark.parametrize(
    "spec",
    [
        ("bf16", "bf16", True, True, "bf16"),
        ("fp16", "fp16", True, False, "fp32"),
        ("fp32", "fp32", True, True, "fp32"),
        ("e4m3", "e5m2", True, True, "bf16"),
    ],
    ids=lambda s: "_".join(map(str, s)),
)
def test_family_gemm_matches_torch_with_edge_tiles(spec: tuple) -> None:
    cfg, ck = _gemm(*spec)
    rep, out, ref = _run_gemm(cfg, ck, 272, 48, 2 * cfg.tile_k + 32)  # a partial second M tile, a K tail
    assert rep.hazards == [] and rep.workgroups == 2
    tol = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}[spec[4]]
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_bf16_tile_speed() -> None:
    """One 256x256 output tile with K = 512 in BF16: under 10 s on one core (the issue's target)."""
    cfg, ck = _gemm("bf16", "bf16", True, True, "bf16")
    t0 = time.perf_counter()
    rep, out, ref = _run_gemm(cfg, ck, 256, 256, 512)
    wall = time.perf_counter() - t0
    assert wall < 10.0, rep.summary()
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


# -- broken kernels are caught ----------------------------------------------------------------------


def _first(insts, opcode: str, text: str | None = None, after: int = 0):  # type: ignore[no-untyped-def]
    return next(i for i in insts if i.opcode == opcode and i.address > after and (text is None or text in i.text))


def test_removed_vmcnt_wait_is_an_unwaited_lds_hazard() -> None:
    """Drop the wait for the direct global->LDS loads before the first barrier (the prologue's publish of
    tile 0, tile 1's DMA issued before it): the MFMA operands' ds_reads would read LDS still being filled."""
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    barrier = _first(insts, "s_barrier")
    wait = max(
        (i for i in insts if i.opcode == "s_waitcnt" and "vmcnt" in i.text and i.address < barrier.address),
        key=lambda i: i.address,
    )
    broken = patch_word(ck.code_object, wait.address, S_NOP)
    with pytest.raises(HazardError, match=rf"{ck.kernel}\+0x[0-9a-f]+ \[unwaited-lds\]"):
        _run_gemm(cfg, ck, 256, 256, 128, code_object=broken)


@pytest.mark.parametrize("which", [0, 1, 2, 3], ids=["pair-first", "pair-second", "odd-tile", "peel"])
def test_removed_publish_wait_is_an_unwaited_lds_hazard(which: int) -> None:
    """The hand-over's publish waits for the next tile with the refill after it still in flight
    (``vmcnt(16)``: 16 transfers a lane and tile); the loop of pairs holds one a tile, the odd tile's
    loop one, and the peel (the tile before the last, which refills nothing) a ``vmcnt(0)``: drop any and
    the next tile's fragment reads read LDS its DMA is still filling (K of 5 tiles runs each once: a
    pair, the odd tile, the peel, the last). The first ``vmcnt(16)``, the prologue's, is the test above's."""
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    publish = [i for i in insts if i.opcode == "s_waitcnt" and "vmcnt(16)" in i.text]
    assert len(publish) == 4
    peel = [a for a, b in itertools.pairwise(insts) if a.text == "s_waitcnt vmcnt(0)" and b.opcode == "s_barrier"]
    assert len(peel) == 1 and peel[0].address > publish[-1].address
    broken = patch_word(ck.code_object, [*publish[1:], *peel][which].address, S_NOP)
    with pytest.raises(HazardError, match=rf"{ck.kernel}\+0x[0-9a-f]+ \[unwaited-lds\]"):
        _run_gemm(cfg, ck, 256, 256, 5 * cfg.tile_k, code_object=broken)


def test_removed_release_barrier_is_an_lds_race() -> None:
    """The hand-over's release barrier (every wave done reading the tile) comes before the refill of its
    stage: drop it and a wave's DMA overwrites what another wave still reads."""
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    # the first hand-over's publish (the first vmcnt(16) is the prologue's, before any barrier)
    publish = [i for i in insts if i.opcode == "s_waitcnt" and "vmcnt(16)" in i.text][1]
    barriers = [i for i in insts if i.opcode == "s_barrier" and i.address < publish.address]
    release = max(barriers, key=lambda i: i.address)
    assert any(i.opcode.startswith("buffer_load") and release.address < i.address < publish.address for i in insts)
    broken = patch_word(ck.code_object, release.address, S_NOP)
    rep, _, _ = _run_gemm(cfg, ck, 256, 256, 256, code_object=broken, hazards="report")
    assert "lds-race" in {h.kind for h in rep.hazards}, rep.hazards


def test_removed_barrier_is_an_lds_race_and_a_wrong_result() -> None:
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    broken = patch_word(ck.code_object, _first(insts, "s_barrier").address, S_NOP)
    rep, out, ref = _run_gemm(cfg, ck, 256, 256, 128, code_object=broken, hazards="report")
    kinds = {h.kind for h in rep.hazards}
    assert "lds-race" in kinds and all(h.kernel == ck.kernel for h in rep.hazards)
    assert not torch.allclose(out.double(), ref, rtol=1e-3, atol=1e-3)


def test_removed_lgkmcnt_wait_is_an_unwaited_load() -> None:
    """Drop every LDS wait between the first fragment read and the first MFMA: the MFMA reads its
    fragments while their ds_reads are still counted (the loop of pairs' first MFMA: K of 4 tiles
    reaches it)."""
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    first_ds = _first(insts, "ds_read_b128")
    first_mfma = next(i for i in insts if i.opcode.startswith("v_mfma") and i.address > first_ds.address)
    waits = [i for i in insts if i.opcode == "s_waitcnt" and "lgkmcnt" in i.text]
    waits = [i for i in waits if first_ds.address < i.address < first_mfma.address]
    assert waits
    broken = ck.code_object
    for w in waits:
        broken = patch_word(broken, w.address, S_NOP)
    rep, _, _ = _run_gemm(cfg, ck, 256, 256, 256, code_object=broken, hazards="report")
    assert any(h.kind == "unwaited-load" and h.address == first_mfma.address for h in rep.hazards), rep.hazards


def test_unemulated_instruction_names_kernel_and_address() -> None:
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    target = _first(insts, "s_barrier")
    broken = patch_word(ck.code_object, target.address, S_TRAP)
    with pytest.raises(EmulatorError, match=rf"{ck.kernel}: s_trap at 0x{target.address:x}"):
        _run_gemm(cfg, ck, 256, 256, 128, code_object=broken)


@pytest.mark.parametrize("op", [0, 1, 2], ids=["gelu_tanh", "exp_log", "div_rsqrt_sqrt"])
def test_pointwise_epilogue_math(op: int) -> None:
    m, n = 10, 200
    g = torch.Generator().manual_seed(op)
    x, z, y = torch.randn(m, n, generator=g) * 3, torch.randn(m, n, generator=g), torch.zeros(m, n)
    z[0, :4] = torch.tensor([0.0, -0.0, float("inf"), 1e-40])  # division by zero, inf, a denormal
    co = compile_kernel("pointwise", "pointwise", x, z, y, op)
    launch(co, None, pack_flydsl_kernarg(co, None, [x, z, y]), (-(-m // 4), -(-n // 128), 1), (128, 1, 1))
    xd, zd = x.double(), z.double()  # float64 truth, except where float32 overflows (x / 1e-40)
    ref = [
        0.5 * xd * (1 + torch.tanh(0.7978845608028654 * (xd + 0.044715 * xd**3))),
        torch.exp(xd) + torch.log(xd.abs() + 1),
        (x / z).double() + torch.rsqrt(zd.abs()) + xd.abs().sqrt(),
    ][op]
    torch.testing.assert_close(y.double(), ref, rtol=2e-6, atol=1e-6, equal_nan=True)


def test_wrong_swizzle_is_a_wrong_result() -> None:
    """Zero the XOR constant of one LDS read-address swizzle (a ``v_bitop3_b32 ..., <const>
    bitop3:0x36`` the GEMM uses for it): no hazard, but the values read are the wrong ones."""
    cfg, ck = _gemm("bf16", "bf16", True, True, "fp32")
    insts = instructions(ck.code_object, ck.kernel)
    cands = [
        i
        for i in insts
        if i.opcode == "v_bitop3_b32"
        and "bitop3:0x36" in i.text
        and i.operands[3].kind == "imm"
        and i.operands[3].value
    ]
    assert cands, "the GEMM no longer swizzles with v_bitop3_b32 ... bitop3:0x36: pick another swizzle to break"
    i = cands[0]
    zero_src2 = (i.words[1] & ~(0x1FF << 18)) | (0x80 << 18)  # VOP3 src2 := inline constant 0
    broken = patch_word(ck.code_object, i.address + 4, zero_src2)
    assert instructions(broken, ck.kernel)[insts.index(i)].operands[3].value == 0
    rep, out, ref = _run_gemm(cfg, ck, 256, 256, 128, code_object=broken, hazards="report")
    assert rep.hazards == []
    assert not torch.allclose(out.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
