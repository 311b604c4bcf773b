"""Shared builders for the MXFP8 scale tests: TE-shaped padded E8M0 tensors with poisoned padding."""

from __future__ import annotations

import torch

BLOCK = 32


def roundup(x: int, m: int) -> int:
    return -(-x // m) * m


def te_scales(rows: int, k: int, blocks_along_dim: int, seed: int = 0, poison: int | None = 255):
    """TE's padded scale tensor for a ``rows x k`` operand and the clean ``[rows, k/32]`` truth.

    Rowwise: ``[roundup(rows,128), roundup(k/32,4)]``; columnwise: ``[roundup(k/32,4),
    roundup(rows,128)]``. Real bytes avoid 255 (NaN); the padding holds ``poison`` (random bytes
    when None) so any padding byte that reaches a result shows up.
    """
    gen = torch.Generator().manual_seed(seed)
    kb = k // BLOCK
    truth = torch.randint(0, 255, (rows, kb), dtype=torch.uint8, generator=gen)
    padded = (roundup(rows, 128), roundup(kb, 4))
    if poison is None:
        full = torch.randint(0, 256, padded, dtype=torch.uint8, generator=gen)
    else:
        full = torch.full(padded, poison, dtype=torch.uint8)
    full[:rows, :kb] = truth
    if blocks_along_dim == 0:
        full = full.t().contiguous()
    return full, truth
