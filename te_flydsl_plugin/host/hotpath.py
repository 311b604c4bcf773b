"""Whether this install has the compiled decision path (``host/_hotpath.cpp``), and if not, why.

``setup.py`` builds it when torch and a C++ compiler are in the build environment (README: ``pip install
--no-build-isolation``), against that torch. Without it, ``host/wrapper.py``'s Python path decides every
call: the same verdicts and results, a few microseconds more a call (``benchmarks/dispatch_overhead.py``).
An extension that is there but does not load (built against another torch) is reported by ``doctor`` and
warned about once at install; the Python path then decides.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch  # noqa: F401  the extension links libc10 / libtorch without a path: loaded torch provides them

NAME = f"{__package__}._hotpath"
REBUILD = "pip install --no-build-isolation -e . (or without -e), with torch and a C++ compiler present"


def _load() -> tuple[ModuleType | None, str, bool]:
    """(the module or None, why not, whether it is there but failed to load)."""
    try:
        return importlib.import_module(NAME), "", False
    except ModuleNotFoundError as exc:
        if exc.name != NAME:
            raise
        return None, f"not built in this install; to build it: {REBUILD}", False
    except ImportError as exc:  # e.g. an undefined symbol: built against another torch
        first = (str(exc).strip().splitlines() or [""])[0]
        return None, f"built but does not load ({first}); rebuild it: {REBUILD}", True


MODULE, WHY_NOT, BROKEN = _load()


def describe() -> str:
    """One line for ``doctor``: which path decides GEMM calls."""
    return "compiled (host/_hotpath.cpp)" if MODULE is not None else f"python ({WHY_NOT})"
