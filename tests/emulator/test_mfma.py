"""Every MFMA kind our kernels use, against torch, on identity and random matrices.

The operand registers are built here from the documented lane layouts (docs/emulator.md, "MFMA
operand layouts"), independently of the emulator's own code: lane ``l`` holds row/column ``l % 16``;
its ``K / 4`` elements are consecutive from ``(l // 16) * K / 4``, except for the f8f6f4 MFMAs with
8-bit operands, whose lane holds two runs, K ``16 g + [0, 16)`` and ``64 + 16 g + [0, 16)``
(``g = l // 16``); result register ``r`` of lane ``l`` is ``D[4 * (l // 16) + r, l % 16]``.
The block-scaled forms have their own tests (``test_mfma_scaled.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from te_flydsl_plugin.emulator import numerics as nm

from .helpers import Program

pytestmark = pytest.mark.emulator

LANES = 64


def lane_k(lane: int, k: int, split: bool) -> list[int]:
    """The K indices lane ``lane`` of a 16x16xK MFMA holds, in register order (module docstring)."""
    g, kpl = lane // 16, k // 4
    if not split:
        return list(range(g * kpl, (g + 1) * kpl))
    return list(range(16 * g, 16 * g + 16)) + list(range(k // 2 + 16 * g, k // 2 + 16 * g + 16))


def lane_bytes(mat_codes: np.ndarray, bits: int, split: bool = False) -> np.ndarray:
    """[16, K] element codes -> uint32[nregs, 64] operand registers (elements packed LSB first)."""
    k = mat_codes.shape[1]
    kpl = k // 4
    regs_bits = []
    for lane in range(LANES):
        codes = mat_codes[lane % 16, lane_k(lane, k, split)].astype(np.uint64)
        stream = 0
        for e, c in enumerate(codes):
            stream |= int(c) << (bits * e)
        nregs = kpl * bits // 32
        regs_bits.append([(stream >> (32 * r)) & 0xFFFFFFFF for r in range(nregs)])
    return np.array(regs_bits, np.uint64).T.astype(np.uint32)


def result_matrix(regs: np.ndarray) -> np.ndarray:
    d = np.zeros((16, 16), np.float32)
    for lane in range(LANES):
        for r in range(4):
            d[4 * (lane // 16) + r, lane % 16] = regs[r, lane].view(np.float32)
    return d


def acc_regs(c: np.ndarray) -> np.ndarray:
    regs = np.zeros((4, LANES), np.float32)
    for lane in range(LANES):
        for r in range(4):
            regs[r, lane] = c[4 * (lane // 16) + r, lane % 16]
    return regs.view(np.uint32)


def run_mfma(
    asm: str, a_regs: np.ndarray, b_regs: np.ndarray, c: np.ndarray, extra: dict[int, np.ndarray] | None = None
) -> np.ndarray:
    def setup(w):  # type: ignore[no-untyped-def]
        w.v[0 : a_regs.shape[0]] = a_regs
        w.v[16 : 16 + b_regs.shape[0]] = b_regs
        w.a[0:4] = acc_regs(c)
        for reg, val in (extra or {}).items():
            w.v[reg] = val

    (w,) = Program(asm).run(setup)
    return result_matrix(w.a[0:4])


def codes_f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).view(np.uint32)


def codes_16(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.int16).numpy().view(np.uint16)


def inputs(kind: str, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "identity":
        a = np.zeros((16, k), np.float32)
        b = np.zeros((16, k), np.float32)
        for i in range(16):
            a[i, i % k] = 1.0
        b[:, :] = np.random.default_rng(seed).integers(-4, 5, (16, k))
        return a, b
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, k)).astype(np.float32), rng.standard_normal((16, k)).astype(np.float32)


@pytest.mark.parametrize("kind", ["identity", "random"])
def test_mfma_16x16x4_f32(kind: str) -> None:
    a, b = inputs(kind, 4, 1)
    c = np.random.default_rng(2).standard_normal((16, 16)).astype(np.float32)
    got = run_mfma(
        "v_mfma_f32_16x16x4_f32 a[0:3], v0, v16, a[0:3]", lane_bytes(codes_f32(a), 32), lane_bytes(codes_f32(b), 32), c
    )
    want = (torch.from_numpy(a).double() @ torch.from_numpy(b).double().T + torch.from_numpy(c)).float().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["identity", "random"])
def test_mfma_16x16x32_16bit(dtype: str, kind: str) -> None:
    a, b = inputs(kind, 32, 3)
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    ta, tb = torch.from_numpy(a).to(tdt), torch.from_numpy(b).to(tdt)
    c = np.zeros((16, 16), np.float32)
    got = run_mfma(
        f"v_mfma_f32_16x16x32_{dtype} a[0:3], v[0:3], v[16:19], a[0:3]",
        lane_bytes(codes_16(ta), 16),
        lane_bytes(codes_16(tb), 16),
        c,
    )
    want = (ta.double() @ tb.double().T).float().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    if kind == "identity":
        np.testing.assert_array_equal(got, tb.float().numpy()[:, :16].T)


_F8F6F4 = {0: nm.E4M3, 1: nm.E5M2, 2: nm.E2M3, 3: nm.E3M2, 4: nm.E2M1}


@pytest.mark.parametrize(("fa", "fb"), [(0, 0), (0, 1), (1, 0), (1, 1), (4, 4), (2, 3), (0, 4)])
@pytest.mark.parametrize("kind", ["identity", "random"])
def test_mfma_16x16x128_f8f6f4(fa: int, fb: int, kind: str) -> None:
    a, b = inputs(kind, 128, 5)
    fmt_a, fmt_b = _F8F6F4[fa], _F8F6F4[fb]
    ca = nm.encode(fmt_a, np.clip(a, -6, 6), saturate=True)
    cb = nm.encode(fmt_b, np.clip(b, -6, 6), saturate=True)
    nra, nrb = 32 * fmt_a.bits // 32, 32 * fmt_b.bits // 32
    asm = (
        f"v_mfma_f32_16x16x128_f8f6f4 a[0:3], v[0:{nra - 1}], v[16:{15 + nrb}], a[0:3]"
        + (f" cbsz:{fa}" if fa else "")
        + (f" blgp:{fb}" if fb else "")
    )
    regs_a = lane_bytes(ca, fmt_a.bits, split=fmt_a.bits == 8)
    regs_b = lane_bytes(cb, fmt_b.bits, split=fmt_b.bits == 8)
    got = run_mfma(asm, regs_a, regs_b, np.ones((16, 16), np.float32))
    da = torch.from_numpy(nm.decode_table(fmt_a)[ca]).double()
    db = torch.from_numpy(nm.decode_table(fmt_b)[cb]).double()
    want = (da @ db.T + 1.0).float().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    if fa == 0:  # E4M3 decoding agrees with torch's own float8 type
        np.testing.assert_array_equal(
            da.float().numpy(), torch.from_numpy(ca).view(torch.float8_e4m3fn).float().numpy()
        )


def test_mfma_inline_zero_accumulator_and_vgpr_destination() -> None:
    a, b = inputs("random", 32, 9)
    ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()

    def setup(w):  # type: ignore[no-untyped-def]
        w.v[0:4] = lane_bytes(codes_16(ta), 16)
        w.v[16:20] = lane_bytes(codes_16(tb), 16)

    (w,) = Program("v_mfma_f32_16x16x32_bf16 v[0:3], v[0:3], v[16:19], 0").run(setup)
    np.testing.assert_allclose(
        result_matrix(w.v[0:4]), (ta.double() @ tb.double().T).float().numpy(), rtol=1e-6, atol=1e-5
    )


def test_accvgpr_moves() -> None:
    (w,) = Program(
        """
        v_accvgpr_write_b32 a3, v1
        v_accvgpr_read_b32 v2, a3
        v_accvgpr_write_b32 a4, 7
        v_accvgpr_mov_b32 a5, a4
        """
    ).run(lambda w: w.v.__setitem__(1, np.arange(64, dtype=np.uint32)))
    assert (w.v[2] == np.arange(64)).all() and (w.a[5] == 7).all()


def test_mfma_32x32x16_bf16_layout() -> None:
    """32x32: lane l holds row l % 32 with K elements 8 * (l // 32) ..; register r of lane l is
    D[8 * (r // 4) + 4 * (l // 32) + r % 4, l % 32] (CDNA3 layouts, per the matrix calculator)."""
    rng = np.random.default_rng(11)
    ta = torch.from_numpy(rng.standard_normal((32, 16)).astype(np.float32)).bfloat16()
    tb = torch.from_numpy(rng.standard_normal((32, 16)).astype(np.float32)).bfloat16()

    def regs(t: torch.Tensor) -> np.ndarray:
        codes = codes_16(t).astype(np.uint32)
        out = np.zeros((4, LANES), np.uint32)
        for lane in range(LANES):
            k = codes[lane % 32, 8 * (lane // 32) : 8 * (lane // 32) + 8]
            out[:, lane] = k[0::2] | (k[1::2] << 16)
        return out

    def setup(w):  # type: ignore[no-untyped-def]
        w.v[0:4], w.v[16:20] = regs(ta), regs(tb)

    (w,) = Program("v_mfma_f32_32x32x16_bf16 a[0:15], v[0:3], v[16:19], 0").run(setup)
    want = (ta.double() @ tb.double().T).float().numpy()
    got = np.zeros((32, 32), np.float32)
    for lane in range(LANES):
        for r in range(16):
            got[8 * (r // 4) + 4 * (lane // 32) + r % 4, lane % 32] = w.a[r, lane].view(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
