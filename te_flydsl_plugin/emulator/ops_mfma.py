"""Matrix instructions (MFMA, incl. gfx950's f8f6f4 and block-scaled forms) and accumulator moves.

Operand lane layouts (docs/emulator.md, "MFMA operand layouts", has the table and the source of each
row). For an ``MxNxK`` instruction with ``M == N`` in {16, 32} and ``G = 64 / M`` lane groups, lane
``l`` holds row ``l % M`` of A (column ``l % N`` of B), group ``g = l // M``, ``kpl = K / G``
elements, packed little-endian from the lowest register bit:

* every MFMA but the f8f6f4 ones, and f8f6f4 with FP6/BF6 or FP4 operands: the ``kpl`` consecutive
  K elements from ``g * kpl``;
* f8f6f4 (plain and block-scaled) with FP8/BF8 operands: two runs of ``kpl / 2``: K
  ``g * kpl/2 + [0, kpl/2)``, then K ``K/2 + g * kpl/2 + [0, kpl/2)`` (16x16x128: 16g and 64 + 16g;
  32x32x64: 16g and 32 + 16g). The format is chosen per operand (cbsz, blgp), so each operand's
  logical matrix is built with its own layout.

The block-scaled ``v_mfma_scale_*`` forms read one E8M0 byte per lane and operand (byte
``op_sel + 2 * op_sel_hi``); lane ``l``'s byte is the scale of row ``l % M`` for the LOGICAL 32-wide K
block ``l // M`` (K ``32 * (l // M)`` .. +31), whichever lanes hold that block's data. So the emulator
builds the logical A and B matrices from the lane layout, the ``[M, K / 32]`` scale matrices from the
scale lanes, and multiplies ``(A * 2^sa) @ (B * 2^sb)^T``.

The f32 result: for 16x16, register ``r`` of lane ``l`` is ``D[4 * (l // 16) + r, l % 16]``; for 32x32,
``D[8 * (r // 4) + 4 * (l // 32) + r % 4, l % 32]``.

``v_mfma_*_f8f6f4``: ``cbsz`` (A) and ``blgp`` (B) select the element format: 0 E4M3, 1 E5M2,
2 E2M3 (FP6), 3 E3M2 (BF6), 4 E2M1 (FP4).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from .bind import BindContext, Step, imm_value, op, vreader, vwriter
from .decode import Inst, Operand
from .errors import EmulatorError
from .machine import LANES, Wave
from .numerics import E2M1, E2M3, E3M2, E4M3, E5M2, MiniFloat, bf16_to_f32, decode_table, e8m0_to_f32

SCALE_BLOCK = 32  # K elements per E8M0 scale of the block-scaled MFMAs (CDNA4 ISA; OCP MX block size)
_F8F6F4 = {0: E4M3, 1: E5M2, 2: E2M3, 3: E3M2, 4: E2M1}
_MFMA_RE = re.compile(
    r"^v_mfma_(scale_)?f32_(\d+)x(\d+)x(\d+)(?:_?)(f32|xf32|bf16|f16|bf16_1k|f8f6f4|fp8_fp8|bf8_bf8|fp8_bf8|bf8_fp8)$"
)


def _regs(w: Wave, o: Operand) -> np.ndarray:
    return (w.a if o.kind == "a" else w.v)[o.index : o.index + o.count]


def _unpack_bits(regs: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint32[nregs, 64] -> uint8[64, count] codes of ``bits`` bits, packed LSB-first across registers."""
    lanes = np.ascontiguousarray(regs.T).view(np.uint8)  # [64, 4*nregs]
    if bits == 8:
        return lanes[:, :count]
    stream = np.unpackbits(lanes, axis=1, bitorder="little")[:, : bits * count].reshape(LANES, count, bits)
    weights = (1 << np.arange(bits)).astype(np.uint8)
    return (stream * weights).sum(axis=2).astype(np.uint8)


def _decoder(dtype: str, fmt: MiniFloat | None) -> Callable[[np.ndarray, int], np.ndarray]:
    """A function: registers [nregs, 64] and K per lane -> float32 [64, kpl]."""
    if dtype in ("bf16", "bf16_1k"):
        return lambda r, k: bf16_to_f32(np.ascontiguousarray(r.T).view(np.uint16)[:, :k])
    if dtype == "f16":
        return lambda r, k: np.ascontiguousarray(r.T).view(np.float16)[:, :k].astype(np.float32)
    if dtype == "f32":
        return lambda r, k: np.ascontiguousarray(r.T).view(np.float32)[:, :k]
    assert fmt is not None
    table = decode_table(fmt)
    return lambda r, k: table[_unpack_bits(r, fmt.bits, k)]


def k_of_lane(mn: int, k: int, split: bool) -> np.ndarray:
    """[64, kpl] logical K index of element ``e`` (register order) of each lane (module docstring).

    ``split``: the two-run layout of the f8f6f4 MFMAs with 8-bit operands; otherwise the
    ``kpl`` consecutive K elements of the lane's group.
    """
    groups = LANES // mn
    kpl = k // groups
    g = (np.arange(LANES) // mn)[:, None]
    e = np.arange(kpl)[None, :]
    if not split:
        return g * kpl + e
    run = kpl // 2
    return np.where(e < run, g * run + e, k // 2 + g * run + (e - run))


def _to_matrix(vals: np.ndarray, mn: int, k_index: np.ndarray) -> np.ndarray:
    """[64 lanes, kpl] operand values -> [mn, k] logical matrix (row = lane % mn, K from ``k_index``)."""
    mat = np.empty((mn, k_index.size // mn), vals.dtype)
    mat[(np.arange(LANES) % mn)[:, None], k_index] = vals
    return mat


def _scale_matrix(byte: np.ndarray, mn: int) -> np.ndarray:
    """[64] E8M0 bytes -> [mn, K/32] scales: lane ``l`` scales row ``l % mn``, K block ``l // mn``."""
    return e8m0_to_f32(byte).reshape(LANES // mn, mn).T


def _result_index(mn: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of the result element held by register r of lane l, as [nregs, 64] arrays."""
    lanes = np.arange(LANES)
    if mn == 16:
        r = np.arange(4)[:, None]
        return 4 * (lanes // 16)[None, :] + r, np.broadcast_to(lanes % 16, (4, LANES))
    r = np.arange(16)[:, None]
    return 8 * (r // 4) + 4 * (lanes // 32)[None, :] + r % 4, np.broadcast_to(lanes % 32, (16, LANES))


_RESULT_INDEX = {mn: _result_index(mn) for mn in (16, 32)}


def _from_result(d: np.ndarray, mn: int) -> np.ndarray:
    """[mn, mn] f32 result -> [nregs, 64] register values in the documented output layout."""
    rows, cols = _RESULT_INDEX[mn]
    return d[rows, cols]


def _to_result_layout(regs: np.ndarray, mn: int) -> np.ndarray:
    """Inverse of :func:`_from_result`: [nregs, 64] accumulator registers -> [mn, mn] matrix."""
    rows, cols = _RESULT_INDEX[mn]
    c = np.empty((mn, mn), np.float32)
    c[rows, cols] = regs
    return c


def _bind_mfma(inst: Inst, ctx: BindContext) -> Step:
    m = _MFMA_RE.match(inst.opcode)
    if not m:
        raise EmulatorError(f"{ctx.kernel}: MFMA {inst.opcode} at 0x{inst.address:x} is not emulated")
    scaled, mdim, ndim, kdim, dtype = (
        m.group(1) is not None,
        int(m.group(2)),
        int(m.group(3)),
        int(m.group(4)),
        m.group(5),
    )
    if mdim != ndim or mdim not in (16, 32):
        raise EmulatorError(f"{ctx.kernel}: MFMA shape of {inst.opcode} at 0x{inst.address:x} is not emulated")
    for mod in ("abid", "cbsz", "blgp"):
        if dtype != "f8f6f4" and inst.mod_int(mod, 0):
            raise EmulatorError(
                f"{ctx.kernel}: {inst.opcode} with {mod} broadcast at 0x{inst.address:x} is not emulated"
            )
    split_a = split_b = False
    if dtype in ("xf32", "fp8_fp8", "bf8_bf8", "fp8_bf8", "bf8_fp8"):
        fa = E4M3 if dtype.startswith("fp8") else E5M2
        fb = E4M3 if dtype.endswith("fp8") else E5M2
        if dtype == "xf32":
            raise EmulatorError(f"{ctx.kernel}: {inst.opcode} is not emulated")
        dec_a, dec_b = _decoder("f8", fa), _decoder("f8", fb)
    elif dtype == "f8f6f4":
        fa, fb = _F8F6F4[inst.mod_int("cbsz", 0)], _F8F6F4[inst.mod_int("blgp", 0)]
        dec_a, dec_b = _decoder("f8", fa), _decoder("f8", fb)
        # The two-run layout is the f8f6f4 MFMAs' for 8-bit operands (module docstring).
        split_a, split_b = fa.bits == 8, fb.bits == 8
    else:
        dec_a = dec_b = _decoder(dtype, None)
    d_op, a_op, b_op, c_op = inst.operands[:4]
    kpl = kdim * mdim // LANES
    k_a = k_of_lane(mdim, kdim, split_a)
    k_b = k_of_lane(ndim, kdim, split_b)
    hz = ctx.hazards
    scale_a = scale_b = None
    sel_a = sel_b = 0
    if scaled:
        scale_a = vreader(inst.operands[4], ctx, inst)
        scale_b = vreader(inst.operands[5], ctx, inst)
        osel, oselhi = inst.mod_list("op_sel", 3, 0), inst.mod_list("op_sel_hi", 3, 0)
        sel_a, sel_b = osel[0] | (oselhi[0] << 1), osel[1] | (oselhi[1] << 1)
    nout = mdim * mdim // LANES

    def step(w: Wave) -> None:
        if w.hazards.pending_regs:
            for o in (a_op, b_op, c_op):
                if o.kind in ("v", "a"):
                    hz.check_read(w, o.kind, o.index, o.count, inst)
            hz.check_write(w, d_op.kind, d_op.index, nout, inst)
        # f64 throughout: a scaled product (up to 2^254 * 57344^2) or a sum of them stays exact enough.
        a = _to_matrix(dec_a(_regs(w, a_op), kpl), mdim, k_a).astype(np.float64)
        b = _to_matrix(dec_b(_regs(w, b_op), kpl), ndim, k_b).astype(np.float64)
        if scale_a is not None and scale_b is not None:
            sa = (np.broadcast_to(scale_a(w), (LANES,)) >> np.uint32(8 * sel_a)) & np.uint32(0xFF)
            sb = (np.broadcast_to(scale_b(w), (LANES,)) >> np.uint32(8 * sel_b)) & np.uint32(0xFF)
            a = a * np.repeat(_scale_matrix(sa, mdim), SCALE_BLOCK, axis=1)
            b = b * np.repeat(_scale_matrix(sb, ndim), SCALE_BLOCK, axis=1)
        if c_op.kind in ("v", "a"):
            c = _to_result_layout(_regs(w, Operand(c_op.kind, c_op.index, nout)).view(np.float32), mdim)
        else:  # an inline constant accumulator (0 for a fresh tile)
            c = np.full((mdim, mdim), np.uint32(imm_value(c_op, "f32")).view(np.float32))
        with np.errstate(all="ignore"):
            d = (a @ b.T + c).astype(np.float32)
        f = w.a if d_op.kind == "a" else w.v
        f[d_op.index : d_op.index + nout] = _from_result(d, mdim).view(np.uint32)

    return step


def register_mfma(opcode: str) -> bool:
    """Bind any opcode of the v_mfma family on first sight (the family is regular)."""
    if _MFMA_RE.match(opcode):
        op(opcode)(_bind_mfma)
        return True
    return False


@op("v_accvgpr_write_b32", "v_accvgpr_write", "v_accvgpr_read_b32", "v_accvgpr_read", "v_accvgpr_mov_b32")
def _accvgpr(inst: Inst, ctx: BindContext) -> Step:
    dst = vwriter(inst.operands[0], ctx, inst)
    src = vreader(inst.operands[1], ctx, inst)
    return lambda w: dst(w, src(w))
