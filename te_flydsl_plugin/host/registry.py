"""Backend discovery through entry points, with per-plugin error isolation.

Each entry point in group ``transformer_engine.gemm_backends`` names a plugin object (a module or
any object) implementing the ``te_gemm_backends`` hook. Plugins are loaded one by one: a plugin that
fails to import, or whose hook raises, is listed with its error and never stops the others. Two
backends with one name are an error that names both providers, and neither is selectable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from ..spec import ENTRY_POINT_GROUP, PROJECT, GemmBackend, Hookspecs, SettingsError


class BackendSelectionError(SettingsError):
    """``NVTE_GEMM_BACKEND`` names no installed backend (the message lists those installed)."""


@dataclass(frozen=True)
class PluginRecord:
    """One entry point as loaded: its backends, or the error that stopped it."""

    name: str
    value: str
    distribution: str
    version: str
    backends: tuple[GemmBackend, ...] = ()
    error: str = ""

    @property
    def status(self) -> str:
        return "error" if self.error else "loaded"


@dataclass
class Registry:
    """The loaded plugins and the backends they provide, by name (lower case).

    A name two providers claim is in ``clashes`` (name -> the providers), in neither ``backends`` nor
    ``providers``: no provider wins by the order site-packages happens to list them in.
    """

    plugins: list[PluginRecord] = field(default_factory=list)
    backends: dict[str, GemmBackend] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)
    clashes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def get(self, name: str) -> GemmBackend:
        key = name.strip().lower()
        if key in self.clashes:
            raise BackendSelectionError(f"NVTE_GEMM_BACKEND={name!r}: {_clash(key, self.clashes[key])}")
        if key not in self.backends:
            installed = ", ".join(sorted(self.backends)) or "none"
            broken = [p for p in self.plugins if p.error]
            extra = "".join(f"; plugin {p.name!r} failed to load: {p.error}" for p in broken)
            raise BackendSelectionError(
                f"NVTE_GEMM_BACKEND={name!r} names no installed GEMM backend "
                f"(installed: {installed}; or 'default' for TE's own GEMM){extra}"
            )
        return self.backends[key]


def _clash(name: str, providers: tuple[str, ...]) -> str:
    return f"backend name {name!r} is provided by both {' and '.join(providers)}; uninstall all but one"


def _dist_of(ep: Any) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", ""
    return dist.metadata["Name"] or "", dist.version or ""


def _key(backend: GemmBackend) -> str:
    return backend.name.strip().lower()


def load(entry_points: Iterable[Any] | None = None) -> Registry:
    """Load every plugin of the group (or the given entry points, for tests)."""
    if entry_points is None:
        # The standard library's (Python >= 3.10 has group selection and ``EntryPoint.dist``), imported
        # only when discovering: keeps the package import cheap.
        from importlib.metadata import entry_points as group_entry_points

        entry_points = group_entry_points(group=ENTRY_POINT_GROUP)
    loaded: list[PluginRecord] = []
    for ep in entry_points:
        dist, version = _dist_of(ep)
        record = PluginRecord(ep.name, ep.value, dist, version)
        try:
            plugin = ep.load()
            loaded.append(_with(record, backends=tuple(_call_hook(plugin, ep.name))))
        except Exception as exc:  # isolation: a broken plugin must not break the others
            loaded.append(_with(record, error=f"{type(exc).__name__}: {exc}"))
    claims: dict[str, list[str]] = {}
    for record in loaded:
        for b in record.backends:
            claims.setdefault(_key(b), []).append(_provider(record))
    reg = Registry(clashes={k: tuple(v) for k, v in claims.items() if len(v) > 1})
    for record in loaded:
        clashing = sorted({_key(b) for b in record.backends} & reg.clashes.keys())
        if clashing:
            record = _with(record, error="; ".join(_clash(k, reg.clashes[k]) for k in clashing))
        for b in record.backends:
            if _key(b) not in reg.clashes:
                reg.backends[_key(b)] = b
                reg.providers[_key(b)] = _provider(record)
        reg.plugins.append(record)
    return reg


def _provider(record: PluginRecord) -> str:
    who = f"{record.distribution} {record.version}".strip() or "?"
    return f"entry point {record.name!r} ({record.value}, {who})"


def _with(record: PluginRecord, **changes: Any) -> PluginRecord:
    return PluginRecord(**{**record.__dict__, **changes})


def _call_hook(plugin: Any, name: str) -> list[GemmBackend]:
    """Run one plugin's hook in a plugin manager of its own (its failure stays its own).

    A hookimpl of a hook the spec does not have (``te_gemm_backend``) raises here (pluggy's
    ``check_pending``), and so does a plugin implementing no hook at all: either would otherwise load
    as a plugin with zero backends.
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(Hookspecs)
    pm.register(plugin, name=name)
    pm.check_pending()
    if not pm.hook.te_gemm_backends.get_hookimpls():
        raise TypeError(f"{plugin!r} implements no te_gemm_backends hook (a function marked @hookimpl)")
    found: list[GemmBackend] = []
    for result in pm.hook.te_gemm_backends():
        found.extend(result)
    for b in found:
        if not isinstance(b, GemmBackend):
            raise TypeError(f"{b!r} does not implement the GemmBackend protocol")
        if not isinstance(b.name, str) or not b.name.strip():
            raise TypeError(f"{b!r} has no name to select it by (name={b.name!r})")
    return found


_cached: Registry | None = None
_lock = threading.Lock()


def registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = load()
        return _cached
