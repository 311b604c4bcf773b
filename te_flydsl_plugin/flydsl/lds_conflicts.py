"""LDS bank conflicts of a kernel config, counted from the addresses its lanes really use in the emulator.

One output tile (workgroup 0, every wave) runs with K = :data:`K_TILES` K tiles (more for a loop
of several tiles an iteration), so the K loop runs in its steady state more than once, and the
emulator counts each DS instruction's bank cycles under gfx950's model (``emulator/lds_banks.py``).
Operand values do not matter to addresses, so the operands are zeros. The counts are split by where
the instruction sits relative to the K loop
(``kloop.k_loop``): per K iteration per wave for the loop body, and per wave for the code after the
loop ("epilogue": the last K tile the software pipeline peels off the loop, then the output stores)
and before it ("prologue").
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import llvm
from . import kloop
from .compiled import compile_config
from .kernels import gemm
from .kernels.config import KernelConfig

K_TILES = 4  # K tiles of the probe launch: a one-tile loop runs K_TILES - 1 times (the pipeline peels the last)


def launch_values(cfg: KernelConfig, k: int) -> list[Any]:
    """Zero operands of one full tile, in the kernel's signature order (as launch.kernarg_values); a
    fused epilogue's bias, pre-activation and partials as zeros too."""
    import torch

    from ..dtypes import payload_dtype
    from . import launch, mx_layout
    from .kernels import epilogue, mx

    m, n = cfg.tile_m, cfg.tile_n

    def operand(fmt: Any, rows: int, k_major: bool) -> torch.Tensor:
        return torch.zeros((rows, k) if k_major else (k, rows), dtype=payload_dtype(fmt))

    lhs, rhs = operand(cfg.lhs_format, m, cfg.lhs_k_major), operand(cfg.rhs_format, n, cfg.rhs_k_major)
    out = torch.zeros(m, n, dtype=payload_dtype(cfg.out_format))
    sa = sb = None
    if cfg.scaling == "tensor":
        sa, sb = torch.ones(1), torch.ones(1)
    elif cfg.scaling == "mx":
        groups = -(-k // mx_layout.K_PER_WORD)
        words = groups * mx.WORDS_PER_GROUP
        sa, sb = (torch.zeros(-(-r // mx_layout.MFMA_ROWS), words, dtype=torch.int32) for r in (m, n))
    parts = epilogue.FLAGS[cfg.epilogue]
    ws = gemm.partials_shape(cfg, m, n)
    extras = (
        torch.zeros(n) if parts.bias else None,
        torch.zeros_like(out) if parts.gelu or parts.dgelu else None,
        None if ws is None else torch.zeros(ws),
    )
    return launch.kernarg_values(launch.Launch(cfg, out, lhs, rhs, sa, sb, 1.0, 0.0, extras))


def tile_report(cfg: KernelConfig, arch: str = "gfx950", code_object: bytes | None = None) -> dict[str, Any]:
    """Bank cycles of one tile of ``cfg``: totals per region and per opcode (``executions``, ``cycles``,
    ``ideal_cycles``, ``conflict_cycles``), the K loop's per iteration and wave. ``code_object``
    replaces the config's compiled one (a patched copy of it, in the tests)."""
    from .. import emulator

    ck = compile_config(cfg, arch)
    co = ck.code_object if code_object is None else code_object
    loop = kloop.k_loop(kloop.instructions(llvm.disassemble(co, arch)))
    if loop is None:
        raise ValueError(f"{cfg.name}: no K loop (a loop holding MFMAs) in the disassembly")
    # A loop of several K tiles an iteration (the hand-over's pairs, MXFP8's scale-word groups) runs
    # twice, past the tiles after it: the peel and the last (kernels/gemm.py), or the remainder.
    per = kloop.k_tiles(loop, cfg.wave_macs)
    k = max(K_TILES, 2 * round(per) + 2) * cfg.tile_k
    values = launch_values(cfg, k)  # held until the launch ends: the kernarg holds their addresses
    kernarg = emulator.pack_flydsl_kernarg(co, ck.kernel, values)
    block = (gemm.block_size(cfg), 1, 1)
    rep = emulator.launch(
        co, ck.kernel, kernarg, (1, 1, 1), block, workgroups=[(0, 0, 0)], hazards="off", lds_banks=True
    )
    del values
    assert rep.lds_banks is not None
    waves = rep.waves_per_workgroup
    iterations = rep.address_counts.get(loop.start, 0) / waves
    stats = rep.lds_banks

    def region(pred: Any, per: float) -> dict[str, Any]:
        ops = stats.by_opcode(pred)
        scale = 1 / per if per else 0.0
        return {
            "conflict_cycles": round(sum(o["conflict_cycles"] for o in ops.values()) * scale, 2),
            "cycles": round(sum(o["cycles"] for o in ops.values()) * scale, 2),
            "by_opcode": {op: {key: round(v * scale, 2) for key, v in o.items()} for op, o in ops.items()},
        }

    return {
        "model": dataclasses.asdict(stats.model),
        "k": k,
        "iterations": iterations,
        "per_iteration": region(loop.contains, waves * iterations),  # per wave
        "epilogue": region(lambda a: a > loop.end, waves),  # per wave
        "prologue": region(lambda a: a < loop.start, waves),  # per wave
    }
