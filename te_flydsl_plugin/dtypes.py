"""Format <-> torch dtype: the one map, shared by the host, the descriptors and the backend.

A :class:`~te_flydsl_plugin.spec.Format` names what a GEMM operand or output is; torch names how its
bytes are stored. fp32, fp16 and bf16 are both at once. FP8 and MXFP8 payloads are bytes in torch's
OCP FP8 dtypes (or ``uint8``); their scales live beside them in the descriptors (``operands.py``).
Framework dtype values (TE's ``tex.DType``) are the host's to name (``host/views.py``).
"""

from __future__ import annotations

import torch

from .spec import Format

# The formats torch computes in, and the dtype of each.
COMPUTE_DTYPES: dict[Format, torch.dtype] = {
    Format.FP32: torch.float32,
    Format.FP16: torch.float16,
    Format.BF16: torch.bfloat16,
}
# gfx950's FP8 is the OCP encoding: E4M3 "fn" (no infinities) and E5M2, as torch names them; an MXFP8
# payload holds the same element bytes (its scales are per 32 elements instead of per tensor).
FP8_TORCH_DTYPES: dict[Format, torch.dtype] = {
    Format.FP8_E4M3: torch.float8_e4m3fn,
    Format.FP8_E5M2: torch.float8_e5m2,
    Format.MXFP8_E4M3: torch.float8_e4m3fn,
    Format.MXFP8_E5M2: torch.float8_e5m2,
}
# A torch tensor of an FP8 dtype holds per-tensor FP8 bytes (MXFP8 needs its scales: a descriptor).
FORMAT_OF_TORCH: dict[torch.dtype, Format] = {
    **{dt: f for f, dt in COMPUTE_DTYPES.items()},
    **{dt: f for f, dt in FP8_TORCH_DTYPES.items() if f.is_fp8},
}


def torch_dtype_of(fmt: Format) -> torch.dtype | None:
    """The torch dtype of fp32 / fp16 / bf16; None for every other format."""
    return COMPUTE_DTYPES.get(fmt)


def payload_dtype(fmt: Format) -> torch.dtype:
    """The dtype a kernel sees an operand or output of ``fmt`` as: its compute dtype, or the FP8 dtype of
    an FP8 / MXFP8 payload. KeyError for a format no kernel reads (NVFP4, blockwise FP8, OTHER)."""
    return COMPUTE_DTYPES.get(fmt) or FP8_TORCH_DTYPES[fmt]


def format_of_torch(dtype: torch.dtype) -> Format:
    """The Format a plain torch tensor of ``dtype`` holds; ``OTHER`` when none."""
    return FORMAT_OF_TORCH.get(dtype, Format.OTHER)
