"""te-flydsl-plugin: a FlyDSL GEMM backend for Transformer Engine (PyTorch) on AMD gfx950, as a plugin.

Importing this package is cheap and touches no GPU: it imports neither Transformer Engine nor flydsl.
``install()`` routes TE's ``generic_gemm`` through :func:`wrap_generic_gemm`; with
``NVTE_GEMM_BACKEND=flydsl`` that happens automatically when TE loads (docs/te-seam.md).
"""

from __future__ import annotations

from typing import Any

from .host.dispatch import configure, reset_stats, stats
from .host.wrapper import wrap_generic_gemm
from .operands import Fp8Operand, MXFP8Operand

__version__ = "0.1.0"

_TE_EXPORTS = ("install", "uninstall", "is_installed")


def __getattr__(name: str) -> Any:
    # TE-facing entry points live in host/te.py, which is only imported when asked for.
    if name in _TE_EXPORTS:
        from .host import te

        return getattr(te, name)
    raise AttributeError(f"module 'te_flydsl_plugin' has no attribute {name!r}")


__all__ = [
    "Fp8Operand",
    "MXFP8Operand",
    "configure",
    "install",
    "is_installed",
    "reset_stats",
    "stats",
    "uninstall",
    "wrap_generic_gemm",
]
