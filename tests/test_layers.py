"""Imports point down the layer list of docs/ARCHITECTURE.md; a cycle or an upward import fails here."""

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


def test_known_layers_only():
    for child in ROOT.iterdir():
        if child.is_dir() and not child.name.startswith("_") and (child / "__init__.py").exists():
            assert child.name in LAYERS, f"unknown layer {child.name}: add it to docs/ARCHITECTURE.md's table"
