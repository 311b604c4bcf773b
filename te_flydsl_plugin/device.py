"""What architecture a device is, asked once per device (no per-call driver queries)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def arch_of(device_type: str, index: int | None) -> str:
    """``gfx950`` (ROCm), ``sm_90`` (CUDA), or ``cpu``; the part before any ``:`` feature suffix."""
    if device_type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device())
        gcn = getattr(props, "gcnArchName", "") or ""
        if torch.version.hip and gcn:
            return gcn.split(":")[0]
        return f"sm_{props.major}{props.minor}"
    return device_type


def current_arch() -> str:
    """The architecture of the current accelerator, or ``cpu`` when there is none."""
    if torch.cuda.is_available():
        return arch_of("cuda", torch.cuda.current_device())
    return "cpu"
