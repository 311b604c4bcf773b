"""The Transformer Engine seam: TE's tensor classes as operand views, and the ``generic_gemm`` patch.

Every TE module's GEMM ends in one call, ``transformer_engine_torch.generic_gemm(...)``, looked up as a
module attribute at call time (``general_gemm`` in ``transformer_engine/pytorch/cpp_extensions/gemm.py``).
Replacing that one attribute with :func:`te_flydsl_plugin.wrap_generic_gemm` routes every GEMM of an
unmodified TE script through the plugin, and restoring it undoes everything. Nothing else in TE is
touched, with one exception: a ROCm TE build with its own in-tree FlyDSL path reads the same
``NVTE_GEMM_BACKEND`` variable through ``get_gemm_backend()`` and would take the call before it
reaches ``generic_gemm``; while the plugin is installed that getter answers what it answers for
``NVTE_GEMM_BACKEND=default`` (``te_in_tree.py``). Which path TE's GEMMs take is ``te_probe.py``'s
(the doctor's) to say.

``install()`` registers TE's classes with the host (``te_types.py``: the adapters from TE's storages
and quantizers to the plugin's descriptors); ``docs/te-seam.md`` holds the argument-by-argument table.
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .te_in_tree import IN_TREE_GETTER, neutralise
from .te_types import register_te_types

TEX_MODULE = "transformer_engine_torch"
NATIVE_ATTR = "__te_flydsl_native__"  # set by wrap_generic_gemm on its wrapper: the wrapped callable


@dataclass
class _State:
    """What install() changed, so uninstall() can put exactly that back."""

    tex: ModuleType
    native: Callable[..., Any]
    wrapper: Callable[..., Any]
    getters: list[tuple[dict[str, Any], Any]] = field(default_factory=list)  # (namespace, original)


_lock = threading.RLock()
_state: _State | None = None
_types_registered = False


def install() -> bool:
    """Route ``transformer_engine_torch.generic_gemm`` through the plugin; True if this call did it.

    Idempotent (a second call is a no-op returning False), thread-safe, and reversible with
    :func:`uninstall`. Imports ``transformer_engine.pytorch`` if TE is not loaded yet. Raises
    ImportError when TE is not installed. Creates the process's dispatcher unless one exists, so the
    settings are read and checked here: a setting naming something nonexistent raises
    :class:`~te_flydsl_plugin.spec.SettingsError` and nothing is patched.
    """
    global _state, _types_registered
    from . import dispatch
    from .wrapper import wrap_generic_gemm

    with _lock:
        tex = _load_tex()
        dispatch.current()
        current = tex.generic_gemm
        if _state is not None and current is _state.wrapper:
            return False
        if hasattr(current, NATIVE_ATTR):
            # Our wrapper from an earlier import of this module (reload): adopt it instead of nesting.
            _state = _State(tex, getattr(current, NATIVE_ATTR), current)
            _state.getters = neutralise()
            return False
        if not _types_registered:
            register_te_types(tex)
            _types_registered = True
        wrapper = wrap_generic_gemm(current)
        state = _State(tex, current, wrapper)
        tex.generic_gemm = wrapper
        state.getters = neutralise()
        _state = state
        return True


def _load_tex() -> ModuleType:
    """TE's extension module. TE loads it by file location (not through ``sys.path``), so when it is
    not loaded yet, importing ``transformer_engine.pytorch`` is what loads it."""
    tex = sys.modules.get(TEX_MODULE)
    if tex is None:
        try:
            importlib.import_module("transformer_engine.pytorch")
            tex = sys.modules.get(TEX_MODULE) or importlib.import_module(TEX_MODULE)
        except ImportError as exc:  # the one line a user needs, not TE's import chain
            raise ImportError(_missing_te(exc)) from None
    return tex


def _missing_te(exc: ImportError) -> str:
    """Why TE cannot be loaded, in one line: not installed, or installed but failing to import."""
    head = "te_flydsl_plugin.install(): Transformer Engine for PyTorch"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "transformer_engine":
        return f"{head} is not installed (no module {exc.name!r}); install transformer_engine[pytorch] first"
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{head} is installed but does not import ({type(exc).__name__}: {first})"


def uninstall() -> bool:
    """Put TE's ``generic_gemm`` (and any in-tree backend getter) back; True if this call did it.

    If something else replaced ``generic_gemm`` after the plugin did, that replacement is left in
    place (with a warning): restoring over it would silently drop someone else's patch.
    """
    global _state
    with _lock:
        state = _state
        if state is None:
            return False
        for namespace, original in state.getters:
            namespace[IN_TREE_GETTER] = original
        if state.tex.generic_gemm is state.wrapper:
            state.tex.generic_gemm = state.native
        else:
            warnings.warn(
                "[te-flydsl-plugin] transformer_engine_torch.generic_gemm was replaced by someone else "
                "after the plugin installed; leaving that replacement in place",
                RuntimeWarning,
                stacklevel=2,
            )
        _state = None
        return True


def is_installed() -> bool:
    """Whether TE's ``generic_gemm`` currently is the plugin's wrapper (never imports TE)."""
    state = _state
    tex = sys.modules.get(TEX_MODULE)
    return state is not None and tex is not None and getattr(tex, "generic_gemm", None) is state.wrapper


@contextmanager
def installed() -> Iterator[None]:
    """Context manager: the plugin installed inside, the previous state restored after (tests, tools)."""
    did = install()
    try:
        yield
    finally:
        if did:
            uninstall()


def in_tree_neutralised() -> bool:
    """Whether the installed plugin holds a ROCm TE's in-tree getter neutralised (for the doctor's probe)."""
    state = _state
    return state is not None and bool(state.getters)
