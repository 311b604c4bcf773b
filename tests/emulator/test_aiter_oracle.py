"""A third-party oracle: AMD's prebuilt, hardware-validated gfx950 GEMM kernels (the ``amd-aiter``
wheel, see aiter_wheel.py) run in the emulator and must match torch.

None of this machine code was written or compiled here, so agreement checks the emulator's rules
against what AMD's kernels rely on in hardware: the BF16 MFMA and result layouts, the block-scaled
FP4 MFMA (``v_mfma_scale_f32_16x16x128_f8f6f4``, E2M1 x E2M1: which K elements a lane's registers
hold and which scale byte, chosen by ``op_sel``/``op_sel_hi``, applies to them), the FP8 (E4M3)
``v_mfma_f32_16x16x128_f8f6f4``, DPP ``row_newbcast``, buffer loads to LDS, ``v_permlane16_swap``,
split-K atomics. Scales vary along every axis (row, K block, column), so a scale applied to the
wrong elements shows as an error of the result's own size. docs/emulator.md ("The aiter oracle")
says which rules rest on it and what it found in AMD's kernels.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable

import pytest
import torch

from te_flydsl_plugin import llvm
from te_flydsl_plugin.emulator import EmulatorError, Hazard, launch, pack_named_kernarg, static_wait_states
from te_flydsl_plugin.emulator.codeobject import parse
from te_flydsl_plugin.emulator.decode import Inst, decode_text

from .aiter_wheel import code_object, code_object_names, mx_dequant, pack_fp4, preshuffle_b, shuffle_scales
from .helpers import needs_objdump

pytestmark = [pytest.mark.emulator, needs_objdump]

THREADS = 256  # every launcher: bdx = 256, "4 wv64"
GUARD = 7.0  # what the output's padding rows hold before the launch


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _run(
    co: bytes,
    args: dict,
    grid: tuple[int, int, int],
    schedule: str = "barrier",
    known: Callable[[Hazard], bool] | None = None,
) -> None:
    """Launch; every hazard the emulator reports must be one ``known`` accepts (none by default)."""
    kernarg = pack_named_kernarg(co, None, args)
    report = launch(co, None, kernarg, grid=grid, block=(THREADS, 1, 1), hazards="report", schedule=schedule)
    unknown = [h for h in report.hazards if known is None or not known(h)]
    assert not unknown, report.summary()


def test_a_missing_wheel_fails_not_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without amd-aiter the oracle fails with the setup step to run (CI installs it)."""

    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(pytest.fail.Exception, match=r"tools/setup.sh installs amd-aiter==\S+ --no-deps"):
        code_object("f8_block_scale_mi350_x32.co")


# -- bf16gemm: D[M, N] f32 = A[M, K] bf16 @ B[N, K]^T (asm_gemm_a16w16.cu) ------------------------

BF16_TILE_N = 64  # every bf16gemm config (bf16gemm_outf32.csv: tileN 64)


@pytest.mark.parametrize(
    ("tile_m", "m", "n", "k", "split_k"),
    [(32, 40, 128, 192, 1), (48, 50, 64, 128, 1), (64, 72, 64, 384, 3), (96, 100, 64, 256, 2)],
)
def test_bf16gemm(tile_m: int, m: int, n: int, k: int, split_k: int) -> None:
    """``bf16gemm_outf32_tn_<tile_m>x64_pf3``: every tile config, a partial last M tile, split-K
    (grid z; the kernel adds its partial sums with ``global_atomic_add_f32`` into a zeroed D)."""
    co = code_object(f"bf16gemm/bf16gemm_outf32_tn_{tile_m}x64_pf3.co")
    g = torch.Generator().manual_seed(tile_m)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(n, k, generator=g).bfloat16()
    m_pad = _cdiv(m, tile_m) * tile_m  # without split-K the kernel stores whole M tiles (rows past M
    out = torch.full((m_pad + tile_m, n), GUARD)  # pass its buffer range check): padded, plus guard rows
    out[:m_pad] = 0.0  # the launcher zeroes D for split-K
    f32, bf16 = 4, 2  # strides are in bytes here
    args = {"D": out, "C": None, "A": a, "B": b, "alpha": 1.0, "beta": 0.0, "strideC0": n * f32}
    args |= {"strideA0": k * bf16, "strideB0": k * bf16, "Mdim": m, "Ndim": n, "Kdim": k, "splitk": split_k}
    _run(co, args, (_cdiv(n, BF16_TILE_N), _cdiv(m, tile_m), split_k))
    ref = a.double() @ b.double().T
    torch.testing.assert_close(out[:m].double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert (out[m_pad:] == GUARD).all(), "written beyond the padded output"


# -- f4gemm: D[M, N] bf16 = MXFP4 A[M, K] @ MXFP4 B[N, K]^T, E8M0 scales per 1x32 (asm_gemm_a4w4.cu)


def _f4gemm(
    tile: str, m: int, n: int, k: int, log2_k_split: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``f4gemm_bf16_per1x32Fp4_<tile>`` on random MXFP4 data: (its D[:m], the reference, the
    magnitude the bf16 roundings are relative to), all float64 [m, n].

    Split-K as the launcher does it: 2^log2_k_split workgroups along z, each on K / 2^s rounded up to
    256, adding its partial sums, rounded to bf16, into a zeroed bf16 D (``buffer_atomic_pk_add_bf16``,
    which rounds again): the reference rounds the same way, one exact partial per K piece."""
    co = code_object(f"f4gemm/f4gemm_bf16_per1x32Fp4_{tile}.co")
    tile_m, tile_n = (int(x) for x in tile.rsplit("_", 1)[1].split("x"))
    g = torch.Generator().manual_seed(m * n)
    a_codes = torch.randint(0, 16, (m, k), generator=g, dtype=torch.uint8)
    b_codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    a_scale = torch.randint(120, 131, (m, k // 32), generator=g, dtype=torch.uint8)
    b_scale = torch.randint(120, 131, (n, k // 32), generator=g, dtype=torch.uint8)
    m_pad = _cdiv(m, tile_m) * tile_m  # aiter pads A's rows and D's to whole tiles (gemm_op_a4w4.py)
    a = torch.zeros(m_pad, k // 2, dtype=torch.uint8)
    a[:m] = pack_fp4(a_codes)
    shuffled = tile.startswith("BpreShuffle")  # else B is plain [N, K/2]
    b = preshuffle_b(pack_fp4(b_codes)) if shuffled else pack_fp4(b_codes)
    sa, sb = shuffle_scales(a_scale), shuffle_scales(b_scale)
    out = torch.full((m_pad + tile_m, n), GUARD, dtype=torch.bfloat16)
    out[:m_pad] = 0.0
    args = {"D": out, "C": None, "A": a, "B": b, "alpha": 1.0, "beta": 0.0, "strideC0": n}
    args |= {"strideA0": k, "strideB0": k, "Mdim": m, "Ndim": n, "Kdim": k}  # in FP4 elements
    args |= {"ScaleA": sa, "ScaleB": sb, "strideScaleA0": sa.shape[1], "strideScaleB0": sb.shape[1]}
    args |= {"log2_k_split": log2_k_split} if shuffled else {}  # noBpreShuffle has no split-K argument
    k_piece = _cdiv(_cdiv(k, 1 << log2_k_split), 256) * 256
    _run(co, args, (_cdiv(n, tile_n), _cdiv(m, tile_m), _cdiv(k, k_piece)))
    assert (out[m_pad:] == GUARD).all(), "written beyond the padded output"
    av, bv = mx_dequant(a_codes, a_scale), mx_dequant(b_codes, b_scale)
    parts = [av[:, k0 : k0 + k_piece] @ bv[:, k0 : k0 + k_piece].T for k0 in range(0, k, k_piece)]
    if len(parts) == 1:
        return out[:m].double(), parts[0], parts[0].abs()
    ref = torch.zeros(m, n, dtype=torch.bfloat16)
    for p in parts:
        ref = (ref.float() + p.float().bfloat16().float()).bfloat16()
    return out[:m].double(), ref.double(), sum(p.abs() for p in parts)


def _assert_bf16_result(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor) -> None:
    """Each bf16 rounding of the kernel is within 2^-8 of the magnitude it rounds; its f32 sums differ
    from the exact ones by far less, but can flip one rounding: within 2^-8 x magnitude of ``ref``."""
    err = (out - ref).abs()
    bound = 2**-8 * magnitude + 1e-6 * magnitude.max()
    worst = int((err / bound).argmax())
    assert (err <= bound).all(), (
        f"{int((err > bound).sum())} of {err.numel()} elements off; worst at {divmod(worst, ref.shape[1])}: "
        f"{out.flatten()[worst].item()} against {ref.flatten()[worst].item()}"
    )


@pytest.mark.parametrize(
    ("tile", "m", "n", "k", "split"),
    [
        ("BpreShuffle_32x128", 40, 256, 768, 0),
        ("BpreShuffle_64x256", 70, 256, 512, 0),
        ("BpreShuffle_96x128", 96, 384, 256, 0),
        ("BpreShuffle_256x256", 200, 256, 512, 0),
        ("BpreShuffle_256x256", 130, 256, 1024, 1),
        ("noBpreShuffle_256x256", 100, 256, 512, 0),
    ],
)
def test_f4gemm_mxfp4(tile: str, m: int, n: int, k: int, split: int) -> None:
    """``f4gemm_bf16_per1x32Fp4_<tile>``: MXFP4 with random codes and E8M0 scales that vary by row,
    K block and column (2^-7 .. 2^3), B in aiter's pre-shuffled layout, both scale arrays in its
    ``e8m0_shuffle`` layout (noBpreShuffle: B plain, its epilogue in VGPR index mode), a partial last
    M tile, split-K (the 256x256 config). The kernels use all four scale bytes of each operand
    (``op_sel``/``op_sel_hi`` 0..3)."""
    _assert_bf16_result(*_f4gemm(tile, m, n, k, split))


def test_f4gemm_sees_a_wrong_scale_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle can tell: with A's scale byte chosen by ``op_sel ^ 1`` the result is wrong."""
    real = Inst.mod_list

    def flipped(self: Inst, name: str, n: int, default: int = 0) -> list[int]:
        v = real(self, name, n, default)
        return [v[0] ^ 1, *v[1:]] if name == "op_sel" and self.opcode.startswith("v_mfma_scale") else v

    monkeypatch.setattr(Inst, "mod_list", flipped)
    with pytest.raises(AssertionError, match="elements off"):
        _assert_bf16_result(*_f4gemm("BpreShuffle_32x128", 32, 128, 256))


# -- f8_block_scale: D[M, N] bf16 = (FP8 X * x_scale) @ (FP8 W * w_scale)^T, f32 scales per 1x128 of X
# and per 128x128 of W (asm_mi350_a8w8_blockscale.cu; data layouts from aiter's op_tests/test_gemm_a8w8_blockscale.py)

F8_BLOCK = 128  # the scale block: one MFMA's K (v_mfma_f32_16x16x128_f8f6f4), 128 columns of W
F8_TILE_N = 256  # per workgroup: gdx = ceil(N / (TileN * 2)), TileN = 128


def _f8_known_hazard(h: Hazard) -> bool:
    """What the emulator reports in every f8_block_scale kernel (docs/emulator.md, "The aiter oracle"):
    the epilogue stages D in LDS that other waves' last A/B fragment reads use, with no barrier
    between (presumably safe on hardware by timing: those reads issue right after the preceding barrier), and
    a ``v_fma_f32`` that reads an FP8 MFMA's result 10 or 11 wait states after it, where LLVM's gfx950
    rule for an 8-pass XDL MFMA asks 12."""
    if h.kind == "lds-race":
        return h.detail.startswith("ds_write_b64")
    return h.kind == "wait-states" and bool(
        re.search(
            r"^v_fma_f32 .* by v_mfma_f32_16x16x128_f8f6f4 .*\(8 passes\) after 1[01] wait states, needs 12$", h.detail
        )
    )


def _f8_block_scale(
    tile_m: int, m: int, k: int, schedule: str, known: Callable[[Hazard], bool]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``f8_block_scale_mi350_x<tile_m>`` on random data, every hazard one ``known`` accepts:
    (its D[:m], the exact result)."""
    co = code_object(f"f8_block_scale_mi350_x{tile_m}.co")
    n = F8_TILE_N
    g = torch.Generator().manual_seed(m)
    x = (2 * torch.randn(m, k, generator=g)).to(torch.float8_e4m3fn)
    w = (2 * torch.randn(n, k, generator=g)).to(torch.float8_e4m3fn)
    x_scale = 0.5 + torch.rand(m, k // F8_BLOCK, generator=g)
    w_scale = 0.5 + torch.rand(n // F8_BLOCK, k // F8_BLOCK, generator=g)
    out = torch.full((m + tile_m, n), GUARD, dtype=torch.bfloat16)
    args = {"O": out, "X": x.view(torch.uint8), "G": preshuffle_b(w.view(torch.uint8))}
    args |= {"XQ": x_scale.T.contiguous(), "GQ": w_scale}  # x_scale as [K/128, M]
    args |= {"dim": k, "hdim": n, "batch": m, "eprt": 1, "Xs": k, "GUs": k, "Os": n * 2, "splitk": 0}
    _run(co, args, (_cdiv(n, F8_TILE_N), _cdiv(m, tile_m), 1), schedule=schedule, known=known)
    assert (out[m:] == GUARD).all(), "written beyond M"
    xs = x.double() * x_scale.double().repeat_interleave(F8_BLOCK, 1)
    ws = w.double() * w_scale.double().repeat_interleave(F8_BLOCK, 0).repeat_interleave(F8_BLOCK, 1)
    return out[:m].double(), xs @ ws.T


@pytest.mark.parametrize(("tile_m", "m", "k"), [(32, 20, 640), (64, 50, 512), (96, 90, 512), (128, 120, 512)])
def test_f8_block_scale(tile_m: int, m: int, k: int) -> None:
    """``f8_block_scale_mi350_x<tile_m>``: E4M3 data, f32 scales that vary by row, K block and N block,
    W in aiter's pre-shuffled layout, a partial M tile (the kernel clips its stores to M), waves
    interleaved (see the next test)."""
    out, ref = _f8_block_scale(tile_m, m, k, "interleaved", _f8_known_hazard)
    torch.testing.assert_close(out, ref, rtol=2**-8, atol=1e-3 * ref.abs().max().item())


def test_f8_block_scale_race_shows_when_waves_run_to_their_barrier() -> None:
    """Run wave after wave to the barrier, the epilogue's LDS reuse overwrites the fragments another
    wave has yet to read: the race ``_f8_known_hazard`` names changes the result. (The late waves'
    LDS accesses then collide with much else; their hazards are not checked here, the interleaved
    runs check them.)"""
    out, ref = _f8_block_scale(32, 32, 512, "barrier", lambda h: True)
    assert not torch.allclose(out, ref, rtol=2**-8, atol=1e-3 * ref.abs().max().item())


def test_named_kernarg_refuses_a_name_the_kernel_lacks() -> None:
    """Packing by the metadata's names: the splitk-less noBpreShuffle f4gemm has no ``log2_k_split``."""
    co = code_object("f4gemm/f4gemm_bf16_per1x32Fp4_noBpreShuffle_256x256.co")
    with pytest.raises(EmulatorError, match="'log2_k_split': 0 arguments of that name"):
        pack_named_kernarg(co, None, {"Mdim": 1, "log2_k_split": 0})


@pytest.mark.parametrize("prefix", ["bf16gemm/", "f4gemm/", "f8_block_scale"])
def test_every_path_of_the_gemm_kernels_keeps_the_wait_states(prefix: str) -> None:
    """AMD's hand-written kernels, checked on every path without running (static_wait_states.py): they
    keep every wait-state rule the emulator knows, but for the one ``_f8_known_hazard`` names, which
    every f8_block_scale kernel has. So the rules demand nothing these kernels, which run on MI355X, do
    not give (an over-strict rule would show here), on paths the launches above do not all take."""
    for name in code_object_names(prefix):
        co = code_object(name)
        kernels = parse(co).kernels
        for kernel, insts in decode_text(llvm.disassemble(co), kernels).items():
            found = [h for h in static_wait_states.check(insts, kernel) if not _f8_known_hazard(h)]
            assert not found, f"{name}: " + "; ".join(map(str, found))
