"""Run FlyDSL upstream's gfx950 MX GEMM in the emulator against torch, with scales varying along K.

Why: the emulator's block-scaled MFMA semantics (docs/emulator.md, "MFMA operand layouts") should
agree with machine code that ran on hardware, written by no one here. FlyDSL's preshuffle MX GEMM
(``kernels/gemm/mxfp4_preshuffle.py``; gfx950-tested upstream by
``tests/kernels/test_preshuffle_gemm.py::test_mfma_{a8w8,a6w4,w4}_preshuffle``) takes MXFP8, MXFP6
or MXFP4 A and MXFP8 / MXFP4 B with E8M0 scales. Nothing of it is vendored: pass a checkout of
ROCm/FlyDSL (``git archive HEAD kernels tests``), whose host-side quantisers and shufflers build
the operands exactly as its own test does.

    PYTHONPATH=. python3 tools/crosscheck_flydsl_mx.py /path/to/FlyDSL fp8 fp8   # also: fp6 fp4, fp4 fp4

Prints the relative max error against a float64 dequantise-then-matmul reference (the kernel
stores bf16, so about 2^-9 is a match) and the hazards the emulator saw.
"""

from __future__ import annotations

import sys
import types


def main(repo: str, a_dtype: str, b_dtype: str) -> None:
    sys.path.insert(0, repo)
    # The upstream test utilities import triton for kernels this check does not use.
    triton = types.ModuleType("triton")
    triton.jit = lambda fn=None, **_: fn if fn else (lambda g: g)  # type: ignore[attr-defined]
    triton.language = types.ModuleType("triton.language")  # type: ignore[attr-defined]
    triton.language.constexpr = object  # type: ignore[attr-defined]
    sys.modules.setdefault("triton", triton)
    sys.modules.setdefault("triton.language", triton.language)  # type: ignore[attr-defined]

    import flydsl.compiler as flyc
    import flydsl.expr as fx
    import torch
    from kernels.gemm.mxfp4_preshuffle import launch_gemm
    from tests.kernels.utils import gemm_common_utils as g

    from te_flydsl_plugin.emulator import launch, pack_flydsl_kernarg
    from te_flydsl_plugin.flydsl import toolchain

    m, n, k, bm, bn, bk = 32, 128, 512, 32, 128, 256
    gen = torch.Generator().manual_seed(0)

    def values(rows: int) -> torch.Tensor:  # magnitudes 2^-8 .. 2^8 per 32-K block: scales vary along K
        block = torch.randint(-8, 9, (rows, k // 32), generator=gen).float().repeat_interleave(32, dim=1)
        return torch.randn(rows, k, generator=gen) * torch.exp2(block)

    def quantise(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes as the kernel reads them, E8M0 scales [rows, K/32], dequantised values)."""
        if dtype == "fp8":
            q, s = g.per_1x32_f8_quant(x)
            return q, s, q.float() * g.e8m0_to_f32(s.repeat_interleave(32, dim=1))
        if dtype == "fp6":
            q, s, unpacked = g.per_1x32_f6_quant(x)
            return q, s, g.fp6_e2m3_to_f32(unpacked) * g.e8m0_to_f32(s.repeat_interleave(32, dim=1))
        q, s, _ = g.per_1x32_f4_quant(x)
        return q, s, g.mxfp4_to_f32(q) * g.e8m0_to_f32(s.repeat_interleave(32, dim=1))

    a_q, a_s, a_deq = quantise(values(m), a_dtype)
    b_q, b_s, b_deq = quantise(values(n), b_dtype)
    want = (a_deq.double() @ b_deq.double().T).float()

    def as_bytes(t: torch.Tensor) -> torch.Tensor:
        return (t if t.dtype in (torch.uint8, torch.int8) else t.view(torch.uint8)).contiguous().view(-1)

    c = torch.zeros(m, n, dtype=torch.bfloat16)
    bufs = [
        as_bytes(c),
        as_bytes(a_q),
        as_bytes(g.shuffle_weight_w4(b_q, 16, False, False)),
        as_bytes(g.shuffle_scale_w4(a_s, 1, False)),
        as_bytes(g.shuffle_scale_w4(b_s, 1, False)),
    ]
    null = [flyc.from_c_void_p(fx.Uint8, None) for _ in bufs]  # compile placeholders: nothing launches
    consts = (n, k, bm, bn, bk, a_dtype, "bf16", b_dtype, 1, -1, -1, -1, -1, -1, -1, 0, 0)
    with toolchain.compile_for("gfx950"):
        compiled = flyc.compile(launch_gemm, *null, m, n, fx.Stream(None), *consts)
    (code,) = toolchain.code_objects(compiled).values()
    kernarg = pack_flydsl_kernarg(code, None, [t.data_ptr() for t in bufs] + [m, n])
    report = launch(code, None, kernarg, grid=(m // bm, n // bn, 1), block=(256, 1, 1), hazards="report")
    err = float((c.float() - want).abs().max() / want.abs().max())
    span = [int(s.view(torch.uint8).to(torch.int32).min()) - 127 for s in (a_s, b_s)]
    print(
        f"{a_dtype} x {b_dtype}, M N K = {m} {n} {k}: max |emulator - torch| / max |torch| = {err:.2e}; "
        f"lowest scales 2^{span[0]} (A), 2^{span[1]} (B); {len(report.hazards)} hazards; "
        f"{report.instructions} instructions"
    )


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: crosscheck_flydsl_mx.py FLYDSL_CHECKOUT A_DTYPE B_DTYPE  (fp8 fp8 | fp6 fp4 | fp4 fp4)")
    main(*sys.argv[1:])
