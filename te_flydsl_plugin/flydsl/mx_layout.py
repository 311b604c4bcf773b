"""The MFMA-ready packed layout of MXFP8 E8M0 scales and its torch reference.

``v_mfma_scale_f32_16x16x128_f8f6f4`` takes one 32-bit scale VGPR per operand and lane and reads ONE
byte of it, chosen by the instruction's ``op_sel``/``op_sel_hi`` bits (byte = op_sel + 2 * op_sel_hi).
In one 16x16x128 MFMA, lane ``l`` supplies the scale of operand row ``l % 16`` for the logical
32-element K-block ``l // 16`` of that 128-wide K-step, whose FP8 data other lanes hold as well
(docs/mxfp8-layout.md has the full mapping and its sources). The packed
layout therefore puts, in each 32-bit word, the scales of ONE (row, K-block-within-step) for FOUR
consecutive K-steps: a GEMM loads one dword per lane per 512 K elements, keeps it in a register next
to its data fragments, and selects the K-step with ``op_sel`` (an unrolled K-step) or by shifting the
word down a byte per K-step (a runtime K loop: the GEMM family, kernels/mx.py).

Packed tensor: uint8, C-contiguous, shape ``packed_shape(rows, k) = (ceil(rows/16), ceil(k/512), 4,
16, 4)`` indexed ``[R, T, g, i, b]``::

    packed[R, T, g, i, b] = scale[row = 16 R + i, k_block = 16 T + 4 b + g]

Viewed as int32 (little endian) that is ``word[R, T, lane = 16 g + i]`` whose byte ``b`` serves K-step
``4 T + b``. The 64 words a wave needs for one 16-row tile and 4 K-steps are 256 contiguous bytes,
and a row range of 16-row tiles is one contiguous slice (host-split GEMM pieces take slices).
Every position not backed by a real ``(row, k_block)`` (row >= rows, k_block >= k / 32) holds 127
(2^0): TE's padding bytes are never read, and zero data in the K tail times a finite scale stays 0.

This module is the reference that ``kernels/scale_pack.py`` matches bit for bit; it runs on any
device with plain torch ops (no Python loops over elements).
"""

from __future__ import annotations

import torch

from ..operands import MX_BLOCK
from .kernels.config import MAX_LAUNCH_BYTES

MFMA_ROWS = 16  # operand rows per 16x16x128 MFMA
MFMA_K = 128  # K elements per MFMA step = 4 scale blocks
STEPS_PER_WORD = 4  # K-steps per 32-bit scale word (one per op_sel byte)
K_PER_WORD = MFMA_K * STEPS_PER_WORD  # 512
PAD_BYTE = 127  # E8M0 2^0: what every position outside the real scales holds
E8M0_NAN = 255


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def unsupported_reason(rows: int, k: int) -> str | None:
    """Why ``(rows, k)`` cannot be packed, or None. Pure: the matrix's check() uses it to decline
    before anything runs; pack functions raise ValueError only for what this declines."""
    if rows < 0 or k < 0:
        return f"negative extent rows={rows}, k={k}"
    if k % MX_BLOCK:
        return f"MXFP8 needs K a multiple of {MX_BLOCK}, got K={k}"
    if packed_bytes(rows, k) > MAX_LAUNCH_BYTES:
        return f"packed scales of {packed_bytes(rows, k)} bytes exceed the 32-bit buffer offset range"
    return None


def packed_shape(rows: int, k: int) -> tuple[int, int, int, int, int]:
    """``(row_tiles, word_groups, 4, 16, 4)`` = ``[R, T, g, i, b]`` as in the module docstring."""
    return (_ceil_div(rows, MFMA_ROWS), _ceil_div(k, K_PER_WORD), 4, MFMA_ROWS, STEPS_PER_WORD)


def packed_bytes(rows: int, k: int) -> int:
    """Size of the packed tensor in bytes (64 bytes per 16 rows and 128 K)."""
    r, t, g, i, b = packed_shape(rows, k)
    return r * t * g * i * b


def logical_view(scales: torch.Tensor, rows: int, k: int, blocks_along_dim: int) -> torch.Tensor:
    """The ``[rows, k // 32]`` view of TE's padded scale tensor (no copy, real strides kept).

    ``blocks_along_dim`` is 1 for rowwise scales ``[rows_pad, kb_pad]`` and 0 for columnwise scales
    ``[kb_pad, rows_pad]``. Only the real extent is viewed, so padding can never leak into a result.
    """
    reason = unsupported_reason(rows, k)
    if reason:
        raise ValueError(reason)
    if scales.dtype != torch.uint8 or scales.dim() != 2:
        raise ValueError(f"E8M0 scales must be a 2-D uint8 tensor, got {scales.dtype} {tuple(scales.shape)}")
    if blocks_along_dim not in (0, 1):
        raise ValueError(f"blocks_along_dim must be 0 or 1, got {blocks_along_dim}")
    kb = k // MX_BLOCK
    view = scales if blocks_along_dim == 1 else scales.t()
    if view.shape[0] < rows or view.shape[1] < kb:
        raise ValueError(
            f"scales {tuple(scales.shape)} (blocks along dim {blocks_along_dim}) do not cover "
            f"rows={rows} x k_blocks={kb}"
        )
    return view[:rows, :kb]


def check_out(out: torch.Tensor, rows: int, k: int, device: torch.device) -> None:
    """Raise ValueError unless ``out`` can receive the packed scales in place."""
    shape = packed_shape(rows, k)
    if out.dtype != torch.uint8 or tuple(out.shape) != shape or out.device != device:
        raise ValueError(f"out must be uint8 {shape} on {device}, got {out.dtype} {tuple(out.shape)}")
    if not out.is_contiguous():
        # The GEMM reads the packed form as one flat buffer; never write into a throwaway copy.
        raise ValueError("out must be contiguous: packed scales are written in place, never copied")


def pack_scales(
    scales: torch.Tensor, rows: int, k: int, blocks_along_dim: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Pack TE's E8M0 scales into the MFMA layout (torch reference of the scale-pack kernel).

    Reads ``scales`` through its strides (any view), never touches its padding, and writes ``out``
    (allocated when None) in place. Returns the packed uint8 tensor of ``packed_shape(rows, k)``.
    """
    src = logical_view(scales, rows, k, blocks_along_dim)
    if out is None:
        out = torch.empty(packed_shape(rows, k), dtype=torch.uint8, device=scales.device)
    else:
        check_out(out, rows, k, scales.device)
    n_r, n_t = out.shape[0], out.shape[1]
    # [R*16 + i, T*16 + 4b + g] -> [R, i, T, b, g] -> [R, T, g, i, b]
    grid = torch.full((n_r * MFMA_ROWS, n_t * 16), PAD_BYTE, dtype=torch.uint8, device=scales.device)
    grid[:rows, : k // MX_BLOCK] = src
    out.copy_(grid.view(n_r, MFMA_ROWS, n_t, STEPS_PER_WORD, 4).permute(0, 2, 4, 1, 3))
    return out


def mfma_scale_byte(packed: torch.Tensor, rows: int, k: int, row: torch.Tensor, kblock: torch.Tensor) -> torch.Tensor:
    """The byte the MFMA reads for operand ``row`` and K-block ``kblock`` (index tensors, broadcast).

    Models the hardware path: K-step ``t = kblock // 4`` is MFMA number ``t``; its lane is
    ``16 * (kblock % 4) + row % 16``; that lane's word is dword ``(R * T_n + t // 4) * 64 + lane`` of
    the packed buffer; ``op_sel``/``op_sel_hi`` of that MFMA select byte ``t % 4``.
    """
    n_t = packed_shape(rows, k)[1]
    words = packed.reshape(-1).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    step = kblock // 4
    lane = 16 * (kblock % 4) + row % MFMA_ROWS
    word = words[((row // MFMA_ROWS) * n_t + step // STEPS_PER_WORD) * 64 + lane]
    opsel = step % STEPS_PER_WORD
    return ((word >> (8 * opsel)) & 0xFF).to(torch.uint8)


def unpack_scales(packed: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Decode the packed layout into uint8 ``[rows, k // 32]`` exactly as the MFMA consumes it.

    Deliberately not the inverse permutation of :func:`pack_scales`: it walks the lane / dword /
    op_sel mapping (:func:`mfma_scale_byte`), so a round trip checks the layout against the hardware
    model rather than against itself.
    """
    reason = unsupported_reason(rows, k)
    if reason:
        raise ValueError(reason)
    shape = packed_shape(rows, k)
    if packed.dtype != torch.uint8 or tuple(packed.shape) != shape or not packed.is_contiguous():
        raise ValueError(f"packed must be contiguous uint8 {shape}, got {packed.dtype} {tuple(packed.shape)}")
    row = torch.arange(rows, device=packed.device).view(-1, 1)
    kblock = torch.arange(k // MX_BLOCK, device=packed.device).view(1, -1)
    return mfma_scale_byte(packed, rows, k, row, kblock)


def e8m0_to_float(u8: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes to float32: 2^(byte - 127), exact for 0..254 (byte 0 is 2^-127, a float32
    subnormal); 255 is NaN per the OCP MX spec."""
    if u8.dtype != torch.uint8:
        raise ValueError(f"E8M0 values are uint8, got {u8.dtype}")
    e = u8.to(torch.int32)
    # float32 bit pattern 2^(e-127) for e >= 1 is e << 23; 2^-127 is the subnormal 1 << 22.
    bits = torch.where(e == 0, torch.full_like(e, 1 << 22), e << 23)
    val = bits.view(torch.float32)
    return torch.where(e == E8M0_NAN, torch.full_like(val, float("nan")), val)
