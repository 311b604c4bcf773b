"""gfx950 MFMAs whose accumulators stay in AGPRs, and the wait-state fences that makes necessary.

Why inline asm. gfx950's MFMAs may read C and write D in arch VGPRs or in AGPRs; LLVM 22 selects
the VGPR form and then moves what does not fit into AGPRs, shuffling accumulators between the two
files with ``v_accvgpr_read/write/mov`` inside the K loop (51 such moves per 128 MFMAs in the 4-wave
bf16 kernel, measured). Emitting each MFMA as ``D = mfma(A, B, D)`` with the constraints
``"=a,v,v,0"`` pins D (tied to C) to AGPRs: the accumulators are allocated there once, accumulate in
place for the whole K loop, and the arch VGPRs hold only fragments and addresses. This is also how
FlyDSL's own 4-wave GEMMs (``kernels/gemm/fp8_gemm_4wave.py`` upstream) keep theirs.

What it costs. LLVM's hazard recognizer does not see an inline asm statement as an MFMA, so it
inserts none of the wait states the hardware requires around MFMAs (AMD CDNA3/CDNA4 ISA,
"required independent instructions"; gfx950's numbers in docs/emulator.md): a VALU write of a
register followed by an MFMA reading it (2), and an MFMA result read by a VALU, ``v_accvgpr_read``
or memory instruction (up to 12 for these MFMAs). Accumulators flow from MFMA to MFMA in identical
registers, which needs none. Everything else an MFMA reads or a consumer takes from one goes
through :func:`fence`: an asm statement that holds the ``s_nop``s and hands its operands back in
the same registers, so whatever produced them comes before the nops and whatever reads them after
(a data dependency, which no scheduler can reorder): the zeroed accumulators before the first
MFMAs, MXFP8's shifted scale words, MXFP8 NN / NT's A fragments, and the accumulators before the
epilogue reads them. The other fragments need none: an LDS read's are ordered by its ``s_waitcnt``, and
where the compiler assembles one with VALU instructions (the transposing 8-bit reads' ``v_perm_b32``) of
a B fragment its schedule leaves the 2 wait states today; it stopped doing so for the A fragment that
crosses MXFP8's loop back edge, which now has its fence (``gemm``'s ``fence_a``). Whether every such pair
keeps its wait states is checked on every path of every config's machine code (``isa_report``'s
``wait_states``, ``emulator/static_wait_states.py``), and on the path a launch takes by the emulator;
that is how a ``v_perm_b32`` one wait state before an MFMA was found in the MXFP8 NT kernels, when the
fragments still had a fence.

A tile with more accumulators than AGPRs (384 x 256: 384 a lane) keeps the rest in arch VGPRs
(:func:`acc_file`, the constraint ``"=v,v,v,0"``): they too accumulate in place, and go through the
same fences by file.

The MMA's A operand is the output-column side and B the output-row side (``gemm.make_tiled_mma``):
the MFMA computes ``out^T`` per 16 x 16 block, so a lane's four accumulators of one block are four
consecutive output columns of one row, which the epilogue stores as one vector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flydsl.expr as fx
from flydsl._mlir import ir
from flydsl._mlir.dialects import llvm
from flydsl.expr import const_expr, range_constexpr
from flydsl.expr.typing import T, Vector

# gfx950 f8f6f4 format codes (cbsz for A, blgp for B): 0 E4M3, 1 E5M2.
_F8_CODE = {"Float8E4M3FN": 0, "Float8E5M2": 1}
_MNEMONIC = {
    "BFloat16": "v_mfma_f32_16x16x32_bf16",
    "Float16": "v_mfma_f32_16x16x32_f16",
    "Float32": "v_mfma_f32_16x16x4_f32",
    "Float8E4M3FN": "v_mfma_f32_16x16x128_f8f6f4",
    "Float8E5M2": "v_mfma_f32_16x16x128_f8f6f4",
}
SCALED_MNEMONIC = "v_mfma_scale_f32_16x16x128_f8f6f4"
# Wait states the fences provide: more than the largest MFMA-result -> dependent-read requirement of any
# MFMA up to 16 passes (the emulator checks the exact table, docs/emulator.md), and the VALU-write ->
# MFMA-read one.
RESULT_WAIT_STATES = 24
OPERAND_WAIT_STATES = 2
# AccVGPRs a lane has (AMD CDNA3 ISA: a0 - a255); accumulator blocks past them live in arch VGPRs.
AGPRS = 256


def acc_file(i: int, j: int, a_reps: int) -> str:
    """The register file of accumulator block ``(i, j)``: AGPRs for the first 256 registers, then VGPRs."""
    return "a" if 4 * (i + a_reps * j) < AGPRS else "v"


def mnemonic(a_elem: str, b_elem: str, mx: bool) -> str:
    """The MFMA a config issues: the widest gfx950 MFMA of its element type (block-scaled for MXFP8)."""
    if mx:
        return SCALED_MNEMONIC
    if a_elem in _F8_CODE and b_elem in _F8_CODE:
        return _MNEMONIC[a_elem]
    if a_elem != b_elem:
        raise ValueError(f"MFMA operands must share an element type, got {a_elem} and {b_elem}")
    return _MNEMONIC[a_elem]


def _asm(a_elem: str, b_elem: str, mx: bool, byte: int = 0) -> tuple[str, str]:
    """The asm text and constraints of one MFMA: ``$0`` D (= C, AGPRs), ``$1`` A, ``$2`` B, ``$3/$4`` scales
    (MXFP8: their byte ``byte``)."""
    op = mnemonic(a_elem, b_elem, mx)
    if a_elem not in _F8_CODE:
        return f"{op} $0, $1, $2, $0", "=a,v,v,0"
    formats = f"cbsz:{_F8_CODE[a_elem]} blgp:{_F8_CODE[b_elem]}"
    if not mx:
        return f"{op} $0, $1, $2, $0 {formats}", "=a,v,v,0"
    # Byte op_sel + 2 * op_sel_hi of each scale word, for both operands (docs/mxfp8-layout.md). op_sel_hi
    # is always spelled out: the assembler's default, [1,1,1], would select byte 2.
    lo, hi = byte & 1, byte >> 1
    sel = f"op_sel:[{lo},{lo},0] op_sel_hi:[{hi},{hi},0]"
    return f"{op} $0, $1, $2, $0, $3, $4 {sel} {formats}", "=a,v,v,v,v,0"


def operand(frag: fx.Tensor, elem: str) -> ir.Value:
    """One lane's A or B fragment of one MFMA as the register tuple the instruction reads."""
    vec = frag.load()
    if const_expr(elem == "Float32"):
        return fx.as_ir_value(vec[0])
    if const_expr(elem in _F8_CODE):
        return fx.as_ir_value(vec.bitcast(fx.Int32))
    return fx.as_ir_value(vec)


def gemm(
    acc: fx.Tensor,
    frag_a: fx.Tensor,
    frag_b: fx.Tensor,
    a_elem: str,
    b_elem: str,
    mx: bool = False,
    words: tuple[list[fx.Int32], list[fx.Int32]] | None = None,
    interleave: Sequence[tuple[int, Sequence[Callable[[], None]]] | tuple[int, Sequence[Callable[[], None]], int]] = (),
    byte: int = 0,
    a_outer: bool = False,
    taken: dict[int, ir.Value] | None = None,
    fence_a: bool = False,
) -> None:
    """One K chunk of the wave's MFMAs: ``acc[:, i, j] += A[:, i] . B[:, j]``, accumulators in AGPRs.

    ``acc`` is the tiled MMA's C fragment ``(4, a_reps, b_reps)``, ``frag_a`` / ``frag_b`` its A / B
    fragments ``(values, reps)`` of one K chunk. MXFP8 passes the E8M0 scale words of each A and B
    repetition, this K-step's scale in byte ``byte`` (kernels/mx.py). ``taken``: B's operands by
    repetition, taken from the fragments by the caller (the last one-chunk tile, whose epilogue branches
    would otherwise carry 8-bit fragments across as bytes: ``gemm._Mma.multiply``); None takes each at
    its repetition's first MFMA.

    The MFMAs keep their program order (side-effecting asm: neither the scheduler nor memory
    operations cross them), so this is where the kernel schedules. They run B repetition by B
    repetition (B fragment ``j`` is dead after its ``a_reps`` MFMAs), or with ``a_outer`` A repetition
    by A repetition (every B fragment read already: the last tile's last chunk, whose column groups,
    finished in turn, go to the epilogue among the MFMAs; ``gemm._Mma.multiply``). ``interleave`` holds
    ``(first, issuers)`` pairs (fragment reads, the kernel's hand-over to the next tile), each list spread
    over the MFMAs from ``first`` on its own, issuer ``t`` just before MFMA ``first + t * (end - first) //
    (len + 1)``, ``end`` the total unless a triple ``(first, issuers, end)`` gives it (the early release,
    MXFP8's scale words; an issuer placed at or past the total goes after the last MFMA): from 0, ``len``
    = ``b_reps - 1`` puts B fragment ``t + 1``'s read at the start of B repetition ``t``, one repetition
    ahead of its use. Each read's latency hides behind the MFMAs after it; a wave alone on its SIMD (4
    waves) has no other wave to hide it. At most one issuer a gap between MFMAs keeps the XDL pipe fed:
    llvm-mca's gfx950 model dispatches one instruction a cycle and an MFMA of 4 passes holds the pipe
    for 4.

    The fragments go to the MFMAs as they are, but with ``fence_a``. An LDS read's fragment is ordered by
    its ``s_waitcnt``; a fragment VALU instructions put together (a transposing 8-bit read's bytes in
    operand order) needs 2 wait states before its MFMA, and the ISA checks' every-path wait-state check
    (``emulator/static_wait_states.py``) fails a kernel whose schedule leaves fewer. ``fence_a`` passes the
    A operands through one fence together before the first MFMA: MXFP8's transposed A (NN, NT), whose
    last fragment of a group's first tile crosses the loop's back edge partly as bytes, and whose
    ``v_lshl_or_b32`` LLVM moved to one wait state before its MFMA once the scale words came through LDS.
    """
    text, constraints = _asm(a_elem, b_elem, mx, byte)
    f32x4 = T.vec(4, T.f32)
    a_reps = fx.size(acc.shape[1]).get_static_leaf_int
    b_reps = fx.size(acc.shape[2]).get_static_leaf_int
    total = a_reps * b_reps
    slots: dict[int, list[Callable[[], None]]] = {}
    for first, issuers, *until in interleave:
        end = until[0] if until else total
        for t, issue in enumerate(issuers):
            slots.setdefault(first + t * (end - first) // (len(issuers) + 1), []).append(issue)

    a_ops = [operand(frag_a[None, i], a_elem) for i in range_constexpr(a_reps)]
    if const_expr(fence_a):
        a_ops = fence(a_ops, "v", OPERAND_WAIT_STATES)
    if const_expr(a_outer):
        b_ops = [operand(frag_b[None, j], b_elem) for j in range_constexpr(b_reps)]
        order = [(i, j) for i in range(a_reps) for j in range(b_reps)]
    else:
        order = [(i, j) for j in range(b_reps) for i in range(a_reps)]
    for nth, (i, j) in enumerate(order):
        for issue in slots.get(nth, ()):
            issue()
        if const_expr(a_outer):
            b_op = b_ops[j]
        elif const_expr(i == 0):
            b_op = taken[j] if taken is not None else operand(frag_b[None, j], b_elem)
        c = acc[None, i, j]
        ops = [a_ops[i], b_op]
        if const_expr(mx):
            ops += [fx.as_ir_value(words[0][i]), fx.as_ir_value(words[1][j])]
        ops.append(fx.as_ir_value(c.load()))
        cons = constraints if acc_file(i, j, a_reps) == "a" else constraints.replace("=a", "=v")
        d = llvm.inline_asm(f32x4, ops, text, cons, has_side_effects=True)
        c.store(Vector(d, (4,), fx.Float32))
    for nth in sorted(n for n in slots if n >= total):  # placed past the last MFMA: after it
        for issue in slots[nth]:
            issue()


def fence(values: list[ir.Value], register_class: str, wait_states: int) -> list[ir.Value]:
    """``values`` after ``wait_states`` wait states: one asm statement of ``s_nop``s that takes them
    (``register_class`` ``"a"``, ``"v"`` or ``"s"``) and hands them back unchanged in the same registers.

    Whatever produced the values must issue before it, and whatever reads what it returns after it,
    so the nops separate the two whatever the scheduler does (see the module docstring).
    """
    nops = []
    left = wait_states
    while left > 0:
        n = min(left, 8)  # s_nop N gives N + 1 wait states; 8 a nop keeps N within every gfx9's immediate
        nops.append(f"s_nop {n - 1}")
        left -= n
    count = len(values)
    types = [v.type for v in values]
    outs = ",".join([f"={register_class}"] * count)
    ties = ",".join(str(i) for i in range(count))
    one = count == 1  # LLVM returns a lone output as itself, several as a struct
    result = llvm.inline_asm(
        types[0] if one else llvm.StructType.get_literal(types),
        values,
        "\n".join(nops),
        f"{outs},{ties}",
        has_side_effects=True,
    )
    return [result] if one else [llvm.extractvalue(t, result, [i]) for i, t in enumerate(types)]


def fence_accumulators(
    acc: fx.Tensor, wait_states: int = RESULT_WAIT_STATES, group: tuple[int | None, int | None] = (None, None)
) -> None:
    """Pass accumulator blocks of ``acc`` through one :func:`fence`, in place (AGPRs): every block, or with
    ``group = (i, j)`` those of A repetition ``i`` and / or B repetition ``j`` only (None: all of that axis)."""
    a_reps = fx.size(acc.shape[1]).get_static_leaf_int
    b_reps = fx.size(acc.shape[2]).get_static_leaf_int
    a_sel, b_sel = group
    coords = [
        (i, j)
        for i in (range_constexpr(a_reps) if a_sel is None else (a_sel,))
        for j in (range_constexpr(b_reps) if b_sel is None else (b_sel,))
    ]
    for file in ("a", "v"):
        blocks = [acc[None, i, j] for i, j in coords if acc_file(i, j, a_reps) == file]
        if blocks:
            fenced = fence([fx.as_ir_value(b.load()) for b in blocks], file, wait_states)
            for b, v in zip(blocks, fenced, strict=True):
                b.store(Vector(v, (4,), fx.Float32))


def fence_words(words: list[fx.Int32], wait_states: int = OPERAND_WAIT_STATES) -> list[fx.Int32]:
    """Scale words computed by VALU instructions, made safe for the MFMAs that read them next."""
    return [fx.Int32(v) for v in fence([fx.as_ir_value(w) for w in words], "v", wait_states)]
