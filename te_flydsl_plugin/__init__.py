"""te-flydsl-plugin: a FlyDSL GEMM backend for Transformer Engine (PyTorch) on AMD gfx950, as a plugin.

Importing this package is cheap and touches no GPU: it imports neither Transformer Engine nor flydsl.
``install()`` routes TE's ``generic_gemm`` through :func:`wrap_generic_gemm`; with
``NVTE_GEMM_BACKEND=flydsl`` that happens automatically when TE loads (docs/te-seam.md).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Everything is imported on first use: torch's start-up hook imports this package on every
# `import torch`, and with NVTE_GEMM_BACKEND unset that must cost next to nothing.
_EXPORTS = {
    "configure": "host.dispatch",
    "reset_stats": "host.dispatch",
    "stats": "host.dispatch",
    "wrap_generic_gemm": "host.wrapper",
    "Fp8Operand": "operands",
    "MXFP8Operand": "operands",
    "OutputQuantizer": "operands",
    "install": "host.te",
    "uninstall": "host.te",
    "is_installed": "host.te",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'te_flydsl_plugin' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "Fp8Operand",
    "MXFP8Operand",
    "OutputQuantizer",
    "configure",
    "install",
    "is_installed",
    "reset_stats",
    "stats",
    "uninstall",
    "wrap_generic_gemm",
]
