"""The import directions of the project, read from the source with `ast` (nothing is imported):

    wire, dledger, apidocs → nothing of ours
    listener             → wire (the HTTP ports' TLS, deadlines and caps)
    namesrv              → listener, wire, apidocs (never broker)
    client               → wire (never broker)
    broker               → dledger, listener, wire, apidocs (never client, pipeline)
    pipeline             → client, wire (never broker)
    console              → client, listener, wire (never broker)
    front-ends (broker.http, broker.grpc) are imported only by themselves and the composition
    root (broker.runtime, broker.__main__, broker.container); nothing below them (broker.service,
    broker.store, broker.*) imports them
    no import circle between the modules of one top-level package

Imports inside functions and under `if TYPE_CHECKING:` count too: a type annotation or a lazy
import is still a dependency, and a circle hidden that way is still two modules that cannot be
understood apart. Known circles are listed in KNOWN_CIRCLES, owned by the areas that are breaking
them; the list may only shrink: a listed circle that no longer exists fails too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OURS = ("apidocs", "broker", "client", "console", "dledger", "listener", "namesrv", "pipeline", "wire")
FRONT_ENDS = ("broker.http", "broker.grpc")
COMPOSITION_ROOT = ("broker.runtime", "broker.__main__", "broker.container")

# package → the packages of ours it may import (itself always).
ALLOWED: dict[str, frozenset[str]] = {
    "wire": frozenset(),
    "dledger": frozenset(),
    "apidocs": frozenset(),  # the servers' offline /docs assets
    "listener": frozenset({"wire"}),
    "namesrv": frozenset({"listener", "wire", "apidocs"}),
    "client": frozenset({"wire"}),
    "broker": frozenset({"dledger", "listener", "wire", "apidocs"}),
    "pipeline": frozenset({"client", "wire"}),
    "console": frozenset({"client", "listener", "wire"}),
}

# Circles still being broken, as sets of modules (a new one may be listed only with its owner's
# name and plan); remove a line when its circle is gone.
KNOWN_CIRCLES: set[frozenset[str]] = set()  # the four of issue 12 are all broken now


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for top in OURS:
        root = REPO / top
        if (root / "__init__.py").is_file():
            for path in root.rglob("*.py"):
                found[_module_name(path)] = path
    return found


MODULES = _modules()


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            # `from pkg import mod` imports the module pkg.mod when there is one.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in OURS:
                yield Import(module, name, node.lineno)


IMPORTS = [imp for module, path in sorted(MODULES.items()) for imp in _imports_of(module, path)]


def _top(name: str) -> str:
    return name.split(".")[0]


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _where(imp: Import) -> str:
    path = MODULES.get(imp.importer)
    return f"{path.relative_to(REPO) if path else imp.importer}:{imp.line} imports {imp.imported}"


def _wrong_directions(imports: list[Import]) -> list[str]:
    return [
        _where(imp)
        for imp in imports
        if _top(imp.importer) in ALLOWED
        and _top(imp.imported) != _top(imp.importer)
        and _top(imp.imported) not in ALLOWED[_top(imp.importer)]
    ]


def _front_ends_imported_from_below(imports: list[Import]) -> list[str]:
    return [
        _where(imp)
        for imp in imports
        if _under(imp.imported, FRONT_ENDS) and not _under(imp.importer, FRONT_ENDS + COMPOSITION_ROOT)
    ]


def _circles(imports: list[Import]) -> set[frozenset[str]]:
    """Strongly connected components (Tarjan) of more than one module, within each package."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set())
        if _top(imp.imported) == _top(imp.importer) and imp.imported != imp.importer:
            graph[imp.importer].add(imp.imported)
            graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


CIRCLES = _circles(IMPORTS)


def test_packages_import_only_what_their_layer_allows() -> None:
    assert _wrong_directions(IMPORTS) == []


def test_nothing_below_the_front_ends_imports_them() -> None:
    assert _front_ends_imported_from_below(IMPORTS) == []


def test_no_import_circle_beyond_the_known_ones() -> None:
    assert sorted(sorted(c) for c in CIRCLES - KNOWN_CIRCLES) == []


def test_every_known_circle_still_exists_else_strike_it_from_the_list() -> None:
    assert sorted(sorted(c) for c in KNOWN_CIRCLES - CIRCLES) == []


def test_the_rules_catch_what_they_are_for() -> None:
    """Each rule fails on a made-up import of its kind (the checks can fail)."""
    made_up = [
        Import("dledger.server", "broker.errors", 1),
        Import("namesrv.app", "broker.config", 2),
        Import("broker.store.x", "client.errors", 3),
        Import("broker.service.pop", "broker.http.codec", 4),
        Import("broker.a", "broker.b", 5),
        Import("broker.b", "broker.c", 6),
        Import("broker.c", "broker.a", 7),
        Import("broker.runtime", "broker.http.server", 8),
    ]
    assert len(_wrong_directions(made_up)) == 3
    below = _front_ends_imported_from_below(made_up)
    assert len(below) == 1 and below[0].endswith(":4 imports broker.http.codec")
    assert _circles(made_up) == {frozenset({"broker.a", "broker.b", "broker.c"})}
    assert len(IMPORTS) > 300  # the scan reads the tree
