"""The package's import graph: no cycles, and the emulator imports nothing of the plugin but ``llvm``.

Every ``import`` in every module counts, those inside functions too (a lazy import is still a
dependency; only imports under ``if TYPE_CHECKING:`` are left out, as they never run). A cycle means
two rooms that cannot be understood, or changed, one without the other (issue 15).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "te_flydsl_plugin"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (``from . import x`` counts as importing module ``x``)."""
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            subs = {f"{base}.{a.name}" for a in node.names}
            found.update(subs & modules if subs <= modules else {base, *(subs & modules)})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != me and m != package}


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module(p) for p in paths}
    return {_module(p): _imports(p, modules) for p in paths}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_emulator_imports_nothing_of_the_plugin_but_llvm() -> None:
    g = graph()
    outside = {
        (m, dep)
        for m, deps in g.items()
        if m.startswith("te_flydsl_plugin.emulator")
        for dep in deps
        if not dep.startswith("te_flydsl_plugin.emulator") and dep != "te_flydsl_plugin.llvm"
    }
    assert outside == set()


# The benchmark driver builds its GEMMs as TE would call them, through the host's problem builder; it is
# a tool the CLI runs, not a part of the backend the registry loads.
_BACKEND_TOOLS = {"te_flydsl_plugin.flydsl.bench"}


def test_the_backend_imports_nothing_of_the_host() -> None:
    """The backend sees the host only through the contract (spec.py) and the shared rooms at the package
    root: it is loaded through the entry point like any third-party backend (issue 15)."""
    g = graph()
    inside = {
        (m, dep)
        for m, deps in g.items()
        if m.startswith("te_flydsl_plugin.flydsl") and m not in _BACKEND_TOOLS
        for dep in deps
        if dep.startswith("te_flydsl_plugin.host")
    }
    assert inside == set()
