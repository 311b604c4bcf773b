"""Operand descriptors: the project's own view of quantized GEMM operands.

TE's tensor classes (``Float8TensorStorage``, ``MXFP8TensorStorage``) are turned into these by the TE
seam (``host/te.py``); tests and users without TE build them directly. Plain ``torch.Tensor`` operands
need no descriptor. Each descriptor only holds references: building one copies no data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .spec import Format


@dataclass(frozen=True)
class Fp8Operand:
    """A per-tensor scaled FP8 operand, as TE stores it.

    ``data`` is the uint8 payload in its logical shape and may be None (TE's wgrad input keeps only
    the transpose). ``transpose`` is ``[last, *lead]`` and is only used when ``transpose_valid``.
    ``scale_inv`` is the fp32 dequantisation scale, shape ``(1,)``: real value = fp8 value * scale_inv.
    """

    data: torch.Tensor | None
    transpose: torch.Tensor | None
    scale_inv: torch.Tensor
    format: Format
    transpose_valid: bool = True

    def __post_init__(self) -> None:
        if not self.format.is_fp8:
            raise ValueError(f"Fp8Operand needs fp8_e4m3 or fp8_e5m2, got {self.format.value}")
        if self.data is None and not self.has_transpose:
            raise ValueError("Fp8Operand needs data or a valid transpose")

    @property
    def has_transpose(self) -> bool:
        return self.transpose is not None and self.transpose_valid

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape (the shape ``data`` has, or would have)."""
        if self.data is not None:
            return tuple(self.data.shape)
        t = tuple(self.transpose.shape)  # type: ignore[union-attr]
        return t[1:] + t[:1]


@dataclass(frozen=True)
class MXFP8Operand:
    """An MXFP8 operand: FP8 payloads with E8M0 scales, one per 32 elements, as TE stores them.

    ``rowwise_data`` has the logical shape ``[*lead, last]`` with blocks along ``last`` and scales
    ``[roundup(prod(lead), 128), roundup(last / 32, 4)]``. ``columnwise_data`` has the same logical
    shape with blocks along the flattened leading dim and scales
    ``[roundup(prod(lead) / 32, 4), roundup(last, 128)]``. Either pair may be None. Scales are uint8
    E8M0 bytes (value = 2 ** (byte - 127)); the padding rows/columns are never read.
    """

    rowwise_data: torch.Tensor | None
    rowwise_scale_inv: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale_inv: torch.Tensor | None
    format: Format

    def __post_init__(self) -> None:
        if not self.format.is_mx:
            raise ValueError(f"MXFP8Operand needs mxfp8_e4m3 or mxfp8_e5m2, got {self.format.value}")
        if self.rowwise_data is None and self.columnwise_data is None:
            raise ValueError("MXFP8Operand needs rowwise or columnwise data")
        for data, scale, which in (
            (self.rowwise_data, self.rowwise_scale_inv, "rowwise"),
            (self.columnwise_data, self.columnwise_scale_inv, "columnwise"),
        ):
            if (data is None) != (scale is None):
                raise ValueError(f"MXFP8Operand {which} data and scales must be given together")

    @property
    def shape(self) -> tuple[int, ...]:
        d = self.rowwise_data if self.rowwise_data is not None else self.columnwise_data
        return tuple(d.shape)  # type: ignore[union-attr]
