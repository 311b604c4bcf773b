"""A ROCm TE's in-tree GEMM backend getter, made to stand aside while the plugin is installed.

ROCm TE builds with their own FlyDSL / Triton GEMM paths read ``NVTE_GEMM_BACKEND`` through
``get_gemm_backend()`` in ``transformer_engine/pytorch/cpp_extensions/gemm.py`` and take a GEMM before it
reaches ``generic_gemm`` when it answers ``flydsl`` or ``triton``. The plugin owns that variable's
``flydsl``, so while it is installed the getter answers what it answers for ``default`` (TE's own GEMM,
which the plugin's patch then routes). NVIDIA TE has no such getter: nothing here does anything there.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import FunctionType, ModuleType
from typing import Any

from .names import BACKEND_ENV

GEMM_MODULE = "transformer_engine.pytorch.cpp_extensions.gemm"
IN_TREE_FLYDSL_MODULE = "transformer_engine.pytorch.flydsl_kernels"
IN_TREE_GETTER = "get_gemm_backend"
# ROCm TE's getter answers triton | flydsl | default (docs/te-seam.md); "default" is its own GEMM path.
_TE_DEFAULT = "default"


def neutralise() -> list[tuple[dict[str, Any], Any]]:
    """Make a ROCm TE's ``get_gemm_backend()`` answer as for ``NVTE_GEMM_BACKEND=default``.

    Patched wherever a loaded ``transformer_engine`` module holds the same getter object (general_gemm
    resolves it from its module's globals at call time). The answer is computed once, from the
    unwrapped getter with the variable set to ``default``, so its type (string or enum) is TE's own.
    Returns (namespace, original) pairs for uninstall; empty on TE builds without the getter.
    """
    gemm = sys.modules.get(GEMM_MODULE)
    if gemm is None:
        try:
            gemm = importlib.import_module(GEMM_MODULE)
        except ImportError:
            return []
    getter = getattr(gemm, IN_TREE_GETTER, None)
    if not callable(getter):
        return []
    answer = default_answer(getter)

    def get_gemm_backend(*_args: Any, **_kwargs: Any) -> Any:
        """te-flydsl-plugin is installed: TE's in-tree GEMM backends stand aside for it."""
        return answer

    patched: list[tuple[dict[str, Any], Any]] = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformer_engine") or module is None:
            continue
        namespace = getattr(module, "__dict__", None)
        if namespace is not None and namespace.get(IN_TREE_GETTER) is getter:
            patched.append((namespace, getter))
            namespace[IN_TREE_GETTER] = get_gemm_backend
    return patched


def default_answer(getter: Callable[..., Any]) -> Any:
    """What ``getter`` returns with ``NVTE_GEMM_BACKEND=default``, without touching the process environment.

    TE's getter takes no argument: it reads the variable from ``os.environ`` (behind an lru_cache,
    bypassed through ``__wrapped__``). Setting the variable around a call would be seen, for that
    moment, by every other thread of the process (and ``putenv`` racing a C ``getenv`` is undefined
    behaviour), so the unwrapped getter runs instead against a private copy of the environment: the
    same code with ``os`` / ``os.environ`` / ``os.getenv`` in its globals replaced. The answer's type
    (string or enum) is TE's own. A getter that reads the variable some other way (the copy never
    sees the lookup) gets TE's documented default value, ``"default"``.
    """
    raw = getattr(getter, "__wrapped__", getter)
    code = getattr(raw, "__code__", None)
    if code is None:
        return _TE_DEFAULT
    env = _PrivateEnviron({**os.environ, BACKEND_ENV: _TE_DEFAULT})
    private_os = ModuleType("os")
    private_os.__dict__.update(os.__dict__)
    private_os.environ = env  # type: ignore[attr-defined]
    private_os.getenv = env.get  # type: ignore[attr-defined]
    swap = {id(os): private_os, id(os.environ): env, id(os.getenv): env.get}
    namespace = {name: swap.get(id(value), value) for name, value in raw.__globals__.items()}
    private = FunctionType(code, namespace, raw.__name__, raw.__defaults__, raw.__closure__)
    private.__kwdefaults__ = raw.__kwdefaults__
    answer = private()
    return answer if env.read else _TE_DEFAULT


class _PrivateEnviron(dict):
    """A copy of the environment for one getter call; notes whether the backend variable was read."""

    read = False

    def __getitem__(self, key: str) -> str:
        self.read = self.read or key == BACKEND_ENV
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read = self.read or key == BACKEND_ENV
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read = self.read or key == BACKEND_ENV
        return super().__contains__(key)
