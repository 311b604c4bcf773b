"""Backend discovery through entry points, with per-plugin error isolation.

Each entry point in group ``transformer_engine.gemm_backends`` names a plugin object (a module or
any object) implementing the ``te_gemm_backends`` hook. Plugins are loaded one by one: a plugin that
fails to import, or whose hook raises, is listed with its error and never stops the others. Two
backends with one name are an error that names both providers.
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
    """The loaded plugins and the backends they provide, by name (lower case)."""

    plugins: list[PluginRecord] = field(default_factory=list)
    backends: dict[str, GemmBackend] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> GemmBackend:
        key = name.strip().lower()
        if key not in self.backends:
            installed = ", ".join(sorted(self.backends)) or "none"
            broken = [p for p in self.plugins if p.error]
            extra = "".join(f"; plugin {p.name!r} failed to load: {p.error}" for p in broken)
            raise BackendSelectionError(
                f"NVTE_GEMM_BACKEND={name!r} names no installed GEMM backend "
                f"(installed: {installed}; or 'default' for TE's own GEMM){extra}"
            )
        return self.backends[key]


def _dist_of(ep: Any) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", ""
    return dist.metadata["Name"] or "", dist.version or ""


def load(entry_points: Iterable[Any] | None = None) -> Registry:
    """Load every plugin of the group (or the given entry points, for tests)."""
    if entry_points is None:
        import importlib_metadata  # only when discovering: keeps the package import cheap

        entry_points = importlib_metadata.entry_points(group=ENTRY_POINT_GROUP)
    eps = entry_points
    reg = Registry()
    for ep in eps:
        dist, version = _dist_of(ep)
        record = PluginRecord(ep.name, ep.value, dist, version)
        try:
            plugin = ep.load()
            backends = tuple(_call_hook(plugin, ep.name))
        except Exception as exc:  # isolation: a broken plugin must not break the others
            reg.plugins.append(_with(record, error=f"{type(exc).__name__}: {exc}"))
            continue
        clash = [b.name for b in backends if b.name.lower() in reg.backends]
        if clash:
            name = clash[0]
            reg.plugins.append(
                _with(
                    record,
                    error=f"backend name {name!r} is provided by both {reg.providers[name.lower()]} "
                    f"and {_provider(record)}",
                )
            )
            continue
        for b in backends:
            reg.backends[b.name.lower()] = b
            reg.providers[b.name.lower()] = _provider(record)
        reg.plugins.append(_with(record, backends=backends))
    return reg


def _provider(record: PluginRecord) -> str:
    who = f"{record.distribution} {record.version}".strip() or "?"
    return f"entry point {record.name!r} ({record.value}, {who})"


def _with(record: PluginRecord, **changes: Any) -> PluginRecord:
    return PluginRecord(**{**record.__dict__, **changes})


def _call_hook(plugin: Any, name: str) -> list[GemmBackend]:
    """Run one plugin's hook in a plugin manager of its own (its failure stays its own)."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(Hookspecs)
    pm.register(plugin, name=name)
    found: list[GemmBackend] = []
    for result in pm.hook.te_gemm_backends():
        found.extend(result)
    for b in found:
        if not isinstance(b, GemmBackend):
            raise TypeError(f"{b!r} does not implement the GemmBackend protocol")
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
