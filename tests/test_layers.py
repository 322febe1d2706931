"""Imports point down the layer list of docs/ARCHITECTURE.md; an upward import, an import circle or a
reach into another layer's private module fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fhirgym

ROOT = Path(fhirgym.__file__).parent
ARCHITECTURE = ROOT.parents[1] / "docs" / "ARCHITECTURE.md"


def _documented_layers() -> list[str]:
    """The layers in the order of the architecture page's table (a row may name several)."""
    rows = [line for line in ARCHITECTURE.read_text().splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`(\w+)(?:/|\.py)`", row.split("|")[1])]


LAYERS = _documented_layers()


def test_the_layer_list_is_the_documented_one():
    assert LAYERS[:3] == ["spec", "fhir", "world"] and LAYERS[-1] == "cli"
    assert {"env", "agents", "runner", "analysis", "memory", "rl"} <= set(LAYERS)


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "fhirgym" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path, package: str) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                out.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                out.append(node.module)
    return out


def test_every_module_imports_only_its_own_or_lower_layers():
    violations = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        own = _layer_of(module.removesuffix(".__init__"))
        if own is None or own not in LAYERS:
            continue
        for imported in _imports(path, package):
            layer = _layer_of(imported)
            if layer in LAYERS and LAYERS.index(layer) > LAYERS.index(own):
                violations.append(f"{module} imports {imported}")
    assert not violations, "\n".join(violations)


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their own name, not ``.__init__``)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _graph() -> dict[str, set[str]]:
    """Module → the package modules it imports (anywhere in it: function bodies and TYPE_CHECKING
    blocks too). ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    edges.add(target if target in modules else source)
        graph[module] = {e for e in edges if e in modules and e != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    cycles = _cycles(_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_reaches_into_another_layers_private_modules():
    """Across layers only public names: ``from ..world import X``, never ``from ..world._admin import X``."""
    violations = []
    for module, targets in _graph().items():
        own = _layer_of(module)
        for target in targets:
            layer = _layer_of(target)
            if layer in LAYERS and layer != own and any(p.startswith("_") for p in target.split(".")[2:]):
                violations.append(f"{module} imports {target}")
    assert not violations, "\n".join(sorted(violations))


def test_known_layers_only():
    for child in ROOT.iterdir():
        if child.is_dir() and not child.name.startswith("_") and (child / "__init__.py").exists():
            assert child.name in LAYERS, f"unknown layer {child.name}: add it to docs/ARCHITECTURE.md's table"
