"""Which code path TE's GEMMs take right now: the doctor's probe (``te-flydsl-plugin doctor``).

It reads what is loaded and never imports TE: the plugin's patch (``te.py``), TE's own ``generic_gemm``,
or a ROCm TE's in-tree backend (``te_in_tree.py``) taking GEMMs before ``generic_gemm``.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from . import te as seam
from .te_in_tree import GEMM_MODULE, IN_TREE_FLYDSL_MODULE, IN_TREE_GETTER, default_answer


def active_path() -> dict[str, Any]:
    """Which code path TE's GEMMs take right now, for ``doctor`` (never imports TE).

    ``path`` is ``"plugin"`` (generic_gemm is the plugin's wrapper), ``"te-in-tree"`` (a ROCm TE's
    in-tree ``get_gemm_backend()`` is live and answers something other than ``default``, so its own
    FlyDSL/Triton path takes GEMMs before generic_gemm), ``"te"`` (TE's own generic_gemm), or
    ``"te-not-loaded"``.
    """
    tex = sys.modules.get(seam.TEX_MODULE)
    gemm = sys.modules.get(GEMM_MODULE)
    te = sys.modules.get("transformer_engine")
    getter = getattr(gemm, IN_TREE_GETTER, None) if gemm is not None else None
    neutralised = seam.in_tree_neutralised()
    in_tree: dict[str, Any] = {
        "getter_present": getter is not None,
        "neutralised": neutralised,
        "flydsl_kernels_module": _module_exists(IN_TREE_FLYDSL_MODULE) if te is not None else False,
    }
    routes_in_tree = False
    if getter is not None and not neutralised:
        try:
            answer, default = getter(), default_answer(getter)
        except Exception as exc:  # doctor reports; it never fails because TE's getter did
            in_tree["answer"] = f"get_gemm_backend() raised {type(exc).__name__}: {exc}"
        else:
            in_tree["answer"] = repr(answer)
            routes_in_tree = answer != default
    if tex is None:
        path = "te-not-loaded"
    elif seam.is_installed():
        path = "plugin"
    elif routes_in_tree:
        path = "te-in-tree"
    else:
        path = "te"
    return {
        "path": path,
        "transformer_engine": getattr(te, "__version__", None) if te is not None else None,
        "plugin_installed": seam.is_installed(),
        "in_tree": in_tree,
    }


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
