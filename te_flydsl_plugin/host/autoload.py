"""Auto-registration: ``pip install`` + ``NVTE_GEMM_BACKEND=flydsl`` and an unmodified TE script is routed.

How it gets control: PyTorch runs every entry point of the group ``torch.backends`` at the end of
``import torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), and TE always imports torch before its
own GEMM module. :func:`autoload` is that entry point. With ``NVTE_GEMM_BACKEND`` unset, ``default`` or
``native`` it returns after one environment read: nothing is imported, hooked or patched. When the
variable names a backend installed through the plugin's entry-point group, it adds a one-shot
post-import hook for ``transformer_engine.pytorch.cpp_extensions.gemm`` (the module whose
``general_gemm`` calls ``transformer_engine_torch.generic_gemm``; by the time it has executed, the
extension and every TE tensor class the seam registers are loaded) and runs
:func:`te_flydsl_plugin.host.te.install` right after that module executes. The hook works whichever
of torch and TE the script imports first, and it is removed once it has fired.

ROCm TE's own values (``triton``) leave TE alone. Any other value arms the hook; whether it names an
installed backend is decided at install by the registry, and a typo gets one warning there naming the
installed backends. ``NVTE_FLYDSL_AUTOLOAD=0`` turns auto-registration
off while keeping ``NVTE_GEMM_BACKEND`` for an explicit :func:`te_flydsl_plugin.install`. Any
failure in here warns once and leaves torch and TE running their own GEMMs.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from .names import BACKEND_ENV, NATIVE_NAMES, TE_IN_TREE_NAMES

OFF_ENV = "NVTE_FLYDSL_AUTOLOAD"
TRIGGER = "transformer_engine.pytorch.cpp_extensions.gemm"

_warned = False
_warn_lock = threading.Lock()


class AutoloadWarning(RuntimeWarning):
    """Auto-registration did not happen; TE runs its own GEMMs."""


def warn_once(message: str) -> None:
    """One warning per process for everything auto-registration reports."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    # Attributed to the plugin, not to a source line: the line of TE or torch that happened to be
    # importing says nothing to the user, and the message alone is the whole story (one line).
    warnings.warn_explicit(message, AutoloadWarning, filename="te-flydsl-plugin", lineno=0)


def autoload() -> None:
    """The ``torch.backends`` entry point: never raises (torch turns an exception into a failed import)."""
    try:
        arm(os.environ)
    except Exception as exc:
        warn_once(f"auto-registration failed ({type(exc).__name__}: {exc}); TE runs its own GEMMs")


def arm(env: Mapping[str, str]) -> bool:
    """Install the post-import hook if ``env`` selects a plugin backend; True when it was armed."""
    name = (env.get(BACKEND_ENV) or "").strip().lower()
    if name in NATIVE_NAMES or name in TE_IN_TREE_NAMES or (env.get(OFF_ENV) or "").strip() == "0":
        return False
    # Whether ``name`` is an installed backend is the registry's answer (backend names, which an entry
    # point's own name need not match), given at install: loading plugins here would run third-party
    # code inside ``import torch``.
    when_imported(TRIGGER, _install)
    return True


def _install(_module: ModuleType) -> None:
    """Install the seam (which creates the dispatcher), so a bad configuration warns at import time."""
    from ..spec import SettingsError
    from . import te

    try:
        te.install()
    except SettingsError as exc:  # install patched nothing; the message names the setting
        warn_once(f"{exc}; TE runs its own GEMMs")
    except Exception as exc:
        with contextlib.suppress(Exception):  # the warning below is all that is left to do
            te.uninstall()
        warn_once(f"auto-registration failed ({type(exc).__name__}: {exc}); TE runs its own GEMMs")


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` once ``name`` has executed: now if it is loaded, else after its import."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    if not any(isinstance(f, _PostImportFinder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder(name, callback))


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the other finders and wraps its loader so ``callback`` runs after exec."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ChainedLoader(spec.loader, self)
        return spec

    def fired(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.callback(module)


class _ChainedLoader(importlib.abc.Loader):
    """Delegates to the real loader, puts it back on the module, then calls the finder's callback."""

    def __init__(self, loader: Any, finder: _PostImportFinder):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._finder.fired(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
