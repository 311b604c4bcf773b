"""Operand descriptors: the project's own view of quantized GEMM operands.

TE's tensor classes (``Float8TensorStorage``, ``MXFP8TensorStorage``) are turned into these by the TE
seam (``host/te.py``); tests and users without TE build them directly. Plain ``torch.Tensor`` operands
need no descriptor. Each descriptor only holds references: building one copies no data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .dtypes import FP8_TORCH_DTYPES
from .spec import Format, QuantizerSpec

MX_BLOCK = 32  # elements per E8M0 scale (OCP MX specification)


class InvalidOperand(ValueError):
    """A descriptor whose fields contradict each other; raised at construction, so none ever reaches a GEMM."""


def _check_payload(cls: str, which: str, t: object, fmt: Format) -> None:
    """FP8 bytes: a tensor of uint8 (TE's storage) or of the torch FP8 dtype ``fmt`` names, nothing else."""
    if not isinstance(t, torch.Tensor):
        raise InvalidOperand(f"{cls} {which} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.uint8, FP8_TORCH_DTYPES[fmt]):
        raise InvalidOperand(
            f"{cls} {which} is {t.dtype}, but format {fmt.value} stores uint8 or {FP8_TORCH_DTYPES[fmt]}"
        )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
            raise InvalidOperand(f"Fp8Operand needs fp8_e4m3 or fp8_e5m2, got {self.format.value}")
        if self.data is None and not self.has_transpose:
            raise InvalidOperand("Fp8Operand needs data or a valid transpose")
        for which, t in (("data", self.data), ("transpose", self.transpose if self.has_transpose else None)):
            if t is not None:
                _check_payload("Fp8Operand", which, t, self.format)
        if self.data is not None and self.has_transpose:
            d, t = tuple(self.data.shape), tuple(self.transpose.shape)  # type: ignore[union-attr]
            if not d or t[:1] != d[-1:] or self.data.numel() != self.transpose.numel():  # type: ignore[union-attr]
                raise InvalidOperand(f"Fp8Operand transpose {t} is not the transpose of data {d}")
        s = self.scale_inv
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.numel() != 1:
            got = f"{s.dtype} of {s.numel()} elements" if isinstance(s, torch.Tensor) else type(s).__name__
            raise InvalidOperand(f"Fp8Operand scale_inv must be one float32 value, got {got}")

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
            raise InvalidOperand(f"MXFP8Operand needs mxfp8_e4m3 or mxfp8_e5m2, got {self.format.value}")
        if self.rowwise_data is None and self.columnwise_data is None:
            raise InvalidOperand("MXFP8Operand needs rowwise or columnwise data")
        for data, scale, which in (
            (self.rowwise_data, self.rowwise_scale_inv, "rowwise"),
            (self.columnwise_data, self.columnwise_scale_inv, "columnwise"),
        ):
            if (data is None) != (scale is None):
                raise InvalidOperand(f"MXFP8Operand {which} data and scales must be given together")
            if data is not None:
                _check_payload("MXFP8Operand", f"{which}_data", data, self.format)
        shapes = {tuple(d.shape) for d in (self.rowwise_data, self.columnwise_data) if d is not None}
        if len(shapes) > 1 or not next(iter(shapes)):
            raise InvalidOperand(f"MXFP8Operand rowwise and columnwise data differ in shape: {sorted(shapes)}")
        shape = next(iter(shapes))
        lead, last = math.prod(shape[:-1]), shape[-1]
        for scale, which, need in (
            (self.rowwise_scale_inv, "rowwise", (lead, _ceil_div(last, MX_BLOCK))),
            (self.columnwise_scale_inv, "columnwise", (_ceil_div(lead, MX_BLOCK), last)),
        ):
            if scale is None:
                continue
            ok = isinstance(scale, torch.Tensor) and scale.dtype == torch.uint8 and scale.dim() == 2
            if not ok or scale.shape[0] < need[0] or scale.shape[1] < need[1]:
                got = f"{scale.dtype} {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else type(scale).__name__
                raise InvalidOperand(
                    f"MXFP8Operand {which}_scale_inv must be 2-D uint8 E8M0 covering {need} for data {shape}, got {got}"
                )

    @property
    def shape(self) -> tuple[int, ...]:
        d = self.rowwise_data if self.rowwise_data is not None else self.columnwise_data
        return tuple(d.shape)  # type: ignore[union-attr]


@dataclass(frozen=True)
class OutputQuantizer:
    """An output quantizer as the plugin sees it: the facts a backend judges, and how to apply it.

    ``quantize(result, dtype)`` turns the GEMM's unquantized result (``GemmProblem.result_dtype``, the
    output's shape) into what ``generic_gemm`` returns as D, a quantized tensor of nominal torch ``dtype``
    (TE's ``output_dtype``), with every side effect the quantizer owns (amax, scale, transpose). The TE
    seam binds it to TE's own ``tex.quantize``, which TE's ``generic_gemm`` applies on its unfused path.
    None for a what-if (the CLI's ``check``): such a descriptor is judged, never executed.
    """

    spec: QuantizerSpec
    quantize: Callable[[torch.Tensor, torch.dtype], Any] | None = field(default=None, compare=False, repr=False)
