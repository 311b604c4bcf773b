"""The block-scaled MFMAs (``v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4``) against probes built from
AMD's documented layouts, not from our kernels and not from the emulator's code.

The layouts (docs/emulator.md, "MFMA operand layouts", cites each): with ``mn`` = 16 or 32 and lane
``l``, lane group ``g = l // mn``, every lane holds 32 elements of row ``l % mn`` of A (column of B):
FP8/BF8 as two runs of 16, K ``16 g + [0, 16)`` then ``K/2 + 16 g + [0, 16)`` (AMD's CDNA4
matrix-core blog, section 5.4, for 32x32x64; ROCm TE's MI355X-validated MXFP8 kernel for
16x16x128), FP4 and FP6 as 32 consecutive, K ``32 g + [0, 32)`` (the blog, section 5.5, for FP4;
FlyDSL's hardware-tested a6w4 GEMM for FP6, docs/emulator.md). The E8M0 byte ``op_sel + 2
op_sel_hi`` of lane ``mn * b + r`` scales row ``r``'s LOGICAL K block ``b`` (K ``32 b`` .. +31),
whichever lanes hold that block's data. So the reference
is ``(A * 2^sa) @ (B * 2^sb)^T`` with per-(row, 32-K-block) scales, as in the blog's Figure 8.
"""

from __future__ import annotations

import numpy as np
import pytest

from te_flydsl_plugin.emulator import numerics as nm

from .helpers import Program

pytestmark = pytest.mark.emulator

LANES = 64
SHAPES = {16: (16, 128), 32: (32, 64)}  # mn -> (mn, K)
FORMATS = {0: nm.E4M3, 1: nm.E5M2, 2: nm.E2M3, 3: nm.E3M2, 4: nm.E2M1}


def lane_k(lane: int, mn: int, k: int, bits: int, documented: bool = True) -> list[int]:
    """The K indices lane ``lane`` holds, in register order; ``documented=False`` is the old, wrong,
    consecutive reading for every format (kept to show the tests tell the two apart)."""
    g = lane // mn
    if bits != 8 or not documented:
        return list(range(32 * g, 32 * g + 32))
    return list(range(16 * g, 16 * g + 16)) + list(range(k // 2 + 16 * g, k // 2 + 16 * g + 16))


def operand_regs(codes: np.ndarray, bits: int, documented: bool = True) -> np.ndarray:
    """[mn, K] element codes -> uint32[32 * bits / 32, 64] registers, elements packed LSB first."""
    mn, k = codes.shape
    out = np.zeros((bits, LANES), np.uint32)
    for lane in range(LANES):
        stream = 0
        for e, kk in enumerate(lane_k(lane, mn, k, bits, documented)):
            stream |= int(codes[lane % mn, kk]) << (bits * e)
        out[:, lane] = [(stream >> (32 * r)) & 0xFFFFFFFF for r in range(bits)]
    return out


def scale_word(scales: np.ndarray, byte: int, rng: np.random.Generator) -> np.ndarray:
    """[mn, K/32] E8M0 scales -> the per-lane word: byte ``byte`` of lane ``mn * b + r`` is
    ``scales[r, b]``, the other three bytes are noise the MFMA must not read."""
    mn = scales.shape[0]
    words = rng.integers(0, 256, (LANES, 4))
    for lane in range(LANES):
        words[lane, byte] = scales[lane % mn, lane // mn]
    return (words[:, 0] | words[:, 1] << 8 | words[:, 2] << 16 | words[:, 3] << 24).astype(np.uint32)


def result_index(mn: int, lane: int, r: int) -> tuple[int, int]:
    """(row, column) of D in accumulator register ``r`` of ``lane`` (the blog's Figures 9/10 for 32x32)."""
    if mn == 16:
        return 4 * (lane // 16) + r, lane % 16
    return 8 * (r // 4) + 4 * (lane // 32) + r % 4, lane % 32


def run_scaled(
    mn: int,
    fa: int,
    fb: int,
    a_codes: np.ndarray,
    b_codes: np.ndarray,
    sa: np.ndarray,
    sb: np.ndarray,
    bytes_ab: tuple[int, int],
    documented: bool = True,
) -> np.ndarray:
    """D = the MFMA on these operands and scales (C = 0), read back as an [mn, mn] matrix."""
    rng = np.random.default_rng(99)
    bits_a, bits_b = FORMATS[fa].bits, FORMATS[fb].bits
    regs_a = operand_regs(a_codes, bits_a, documented)
    regs_b = operand_regs(b_codes, bits_b, documented)
    wa, wb = scale_word(sa, bytes_ab[0], rng), scale_word(sb, bytes_ab[1], rng)
    nout = mn * mn // LANES
    byte_a, byte_b = bytes_ab
    sel = f"op_sel:[{byte_a & 1},{byte_b & 1},0] op_sel_hi:[{byte_a >> 1},{byte_b >> 1},0]"
    k = SHAPES[mn][1]
    asm = (
        f"v_mfma_scale_f32_{mn}x{mn}x{k}_f8f6f4 a[0:{nout - 1}], v[0:{bits_a - 1}], v[16:{15 + bits_b}], "
        f"a[0:{nout - 1}], v40, v41 {sel} cbsz:{fa} blgp:{fb}"
    )

    def setup(w):  # type: ignore[no-untyped-def]
        w.v[0:bits_a] = regs_a
        w.v[16 : 16 + bits_b] = regs_b
        w.v[40], w.v[41] = wa, wb
        w.a[0:nout] = 0

    (w,) = Program(asm).run(setup)
    d = np.zeros((mn, mn), np.float32)
    for lane in range(LANES):
        for r in range(nout):
            d[result_index(mn, lane, r)] = w.a[r, lane].view(np.float32)
    return d


def reference(fa: int, fb: int, a_codes, b_codes, sa, sb) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The blog's Figure 8: sum over 32-K blocks of scale_a[i, b] * scale_b[j, b] * (A_b @ B_b^T)."""
    da = nm.decode_table(FORMATS[fa])[a_codes].astype(np.float64) * np.repeat(2.0 ** (sa - 127.0), 32, axis=1)
    db = nm.decode_table(FORMATS[fb])[b_codes].astype(np.float64) * np.repeat(2.0 ** (sb - 127.0), 32, axis=1)
    return (da @ db.T).astype(np.float32)


def operands(mn: int, fa: int, fb: int, pattern: str, seed: int):  # type: ignore[no-untyped-def]
    """Random operands and scales varying as ``pattern`` says: along K only, along A's rows only,
    along B's rows (output columns) only, or everywhere."""
    rng = np.random.default_rng(seed)
    _, k = SHAPES[mn]
    # Within FP4's range (+-6), so every format holds the values it is given.
    a = nm.encode(FORMATS[fa], np.clip(rng.standard_normal((mn, k)) * 2, -6, 6), saturate=True)
    b = nm.encode(FORMATS[fb], np.clip(rng.standard_normal((mn, k)) * 2, -6, 6), saturate=True)
    blocks = k // 32
    base = np.full((mn, blocks), 127)
    sa, sb = base.copy(), base.copy()
    if pattern == "k":
        sa = sa + np.array([6, -5, 3, -2][:blocks])[None, :]
        sb = sb + np.array([-4, 2, -1, 7][:blocks])[None, :]  # per-block products 2^2, 2^-3, 2^2, 2^5
    elif pattern == "a_rows":
        sa = sa + rng.integers(-6, 7, (mn, 1))
    elif pattern == "b_rows":
        sb = sb + rng.integers(-6, 7, (mn, 1))
    else:
        sa = rng.integers(120, 135, (mn, blocks))
        sb = rng.integers(120, 135, (mn, blocks))
    return a, b, sa, sb


MIXES = [(0, 0), (0, 1), (1, 0), (1, 1), (4, 4), (2, 3), (0, 4), (4, 1)]


@pytest.mark.parametrize("mn", [16, 32])
@pytest.mark.parametrize(("fa", "fb"), MIXES)
@pytest.mark.parametrize("pattern", ["k", "a_rows", "b_rows", "random"])
def test_scaled_mfma_matches_block_scaled_product(mn: int, fa: int, fb: int, pattern: str) -> None:
    a, b, sa, sb = operands(mn, fa, fb, pattern, seed=fa * 10 + fb + mn)
    got = run_scaled(mn, fa, fb, a, b, sa, sb, (1, 2))
    np.testing.assert_allclose(got, reference(fa, fb, a, b, sa, sb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mn", [16, 32])
@pytest.mark.parametrize("byte_a", [0, 1, 2, 3])
@pytest.mark.parametrize("byte_b", [0, 1, 2, 3])
def test_every_op_sel_byte(mn: int, byte_a: int, byte_b: int) -> None:
    """Each (op_sel, op_sel_hi) pair reads its byte: the other three hold noise that would show."""
    a, b, sa, sb = operands(mn, 0, 1, "random", seed=4 * byte_a + byte_b)
    got = run_scaled(mn, 0, 1, a, b, sa, sb, (byte_a, byte_b))
    np.testing.assert_allclose(got, reference(0, 1, a, b, sa, sb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mn", [16, 32])
@pytest.mark.parametrize(("fa", "fb"), [(0, 0), (1, 0)])
def test_consecutive_fp8_layout_is_rejected(mn: int, fa: int, fb: int) -> None:
    """FP8 registers filled the old way (32 consecutive K per lane, each lane's scale on its own
    elements) no longer give the block-scaled product once scales vary along K: the emulator now
    tells the layouts apart, as the hardware does. With uniform scales they agree (a K permutation
    shared by A and B does not change a dot product)."""
    a, b, sa, sb = operands(mn, fa, fb, "k", seed=5)
    want = reference(fa, fb, a, b, sa, sb)
    old = run_scaled(mn, fa, fb, a, b, sa, sb, (0, 0), documented=False)
    assert np.abs(old - want).max() > 0.1 * np.abs(want).max()
    ones = np.full_like(sa, 127)
    np.testing.assert_allclose(
        run_scaled(mn, fa, fb, a, b, ones, ones, (0, 0), documented=False),
        reference(fa, fb, a, b, ones, ones),
        rtol=1e-5,
        atol=1e-5,
    )


def test_scale_applies_to_logical_block_not_to_lane() -> None:
    """One hot scale: only K block 1 of A row 3 scaled by 2^4. Its data sit in lanes 3 + 16 * {2, 3},
    first run (K 32..63), while lane 16 + 3, whose byte carries the scale, holds K 16..31 and 80..95."""
    mn, k = 16, 128
    a = nm.encode(nm.E4M3, np.ones((mn, k)), saturate=True)
    b = nm.encode(nm.E4M3, np.ones((mn, k)), saturate=True)
    sa, sb = np.full((mn, 4), 127), np.full((mn, 4), 127)
    sa[3, 1] = 131
    got = run_scaled(mn, 0, 0, a, b, sa, sb, (0, 0))
    want = np.full((mn, mn), float(k), np.float32)
    want[3, :] = k - 32 + 32 * 16
    np.testing.assert_array_equal(got, want)
