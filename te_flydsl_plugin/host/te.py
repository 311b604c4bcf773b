"""The Transformer Engine seam: TE's tensor classes as operand views, and the ``generic_gemm`` patch.

Every TE module's GEMM ends in one call, ``transformer_engine_torch.generic_gemm(...)``, looked up as a
module attribute at call time (``general_gemm`` in ``transformer_engine/pytorch/cpp_extensions/gemm.py``).
Replacing that one attribute with :func:`te_flydsl_plugin.wrap_generic_gemm` routes every GEMM of an
unmodified TE script through the plugin, and restoring it undoes everything. Nothing else in TE is
touched, with one exception: a ROCm TE build with its own in-tree FlyDSL path reads the same
``NVTE_GEMM_BACKEND`` variable through ``get_gemm_backend()`` and would take the call before it
reaches ``generic_gemm``; while the plugin is installed that getter answers what it answers for
``NVTE_GEMM_BACKEND=default`` (see :func:`active_path`).

``install()`` registers TE's classes with the host (``te_types.py``: the adapters from TE's storages
and quantizers to the plugin's descriptors); ``docs/te-seam.md`` holds the argument-by-argument table.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import Any

from .names import BACKEND_ENV
from .te_types import register_te_types

TEX_MODULE = "transformer_engine_torch"
GEMM_MODULE = "transformer_engine.pytorch.cpp_extensions.gemm"
IN_TREE_FLYDSL_MODULE = "transformer_engine.pytorch.flydsl_kernels"
IN_TREE_GETTER = "get_gemm_backend"
NATIVE_ATTR = "__te_flydsl_native__"  # set by wrap_generic_gemm on its wrapper: the wrapped callable
# ROCm TE's getter answers triton | flydsl | default (docs/te-seam.md); "default" is its own GEMM path.
_TE_DEFAULT = "default"


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
            _state.getters = _neutralise_in_tree_getter()
            return False
        if not _types_registered:
            register_te_types(tex)
            _types_registered = True
        wrapper = wrap_generic_gemm(current)
        state = _State(tex, current, wrapper)
        tex.generic_gemm = wrapper
        state.getters = _neutralise_in_tree_getter()
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


def _neutralise_in_tree_getter() -> list[tuple[dict[str, Any], Any]]:
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
    answer = _default_answer(getter)

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


def _default_answer(getter: Callable[..., Any]) -> Any:
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


def active_path() -> dict[str, Any]:
    """Which code path TE's GEMMs take right now, for ``doctor`` (never imports TE).

    ``path`` is ``"plugin"`` (generic_gemm is the plugin's wrapper), ``"te-in-tree"`` (a ROCm TE's
    in-tree ``get_gemm_backend()`` is live and answers something other than ``default``, so its own
    FlyDSL/Triton path takes GEMMs before generic_gemm), ``"te"`` (TE's own generic_gemm), or
    ``"te-not-loaded"``.
    """
    tex = sys.modules.get(TEX_MODULE)
    gemm = sys.modules.get(GEMM_MODULE)
    te = sys.modules.get("transformer_engine")
    getter = getattr(gemm, IN_TREE_GETTER, None) if gemm is not None else None
    neutralised = _state is not None and bool(_state.getters)
    in_tree: dict[str, Any] = {
        "getter_present": getter is not None,
        "neutralised": neutralised,
        "flydsl_kernels_module": _module_exists(IN_TREE_FLYDSL_MODULE) if te is not None else False,
    }
    routes_in_tree = False
    if getter is not None and not neutralised:
        try:
            answer, default = getter(), _default_answer(getter)
        except Exception as exc:  # doctor reports; it never fails because TE's getter did
            in_tree["answer"] = f"get_gemm_backend() raised {type(exc).__name__}: {exc}"
        else:
            in_tree["answer"] = repr(answer)
            routes_in_tree = answer != default
    if tex is None:
        path = "te-not-loaded"
    elif is_installed():
        path = "plugin"
    elif routes_in_tree:
        path = "te-in-tree"
    else:
        path = "te"
    return {
        "path": path,
        "transformer_engine": getattr(te, "__version__", None) if te is not None else None,
        "plugin_installed": is_installed(),
        "in_tree": in_tree,
    }


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
