"""Finding and rewriting the references inside a resource.

Referential integrity, the reference-edge table and transaction ``urn:uuid:`` rewriting all need every
Reference in a resource together with its element path, whether or not a search parameter covers it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator


def iter_references(resource: dict, root: str | None = None) -> Iterator[tuple[str, dict]]:
    """Yield ``(path, reference_object)`` for every Reference (a dict with a string ``reference``)."""
    stack: list[tuple[str, object]] = [(root or str(resource.get("resourceType", "Resource")), resource)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("reference")
            if isinstance(ref, str):
                yield path, node
            for key, value in node.items():
                if isinstance(value, dict | list) and key not in ("reference", "_reference"):
                    stack.append((f"{path}.{key}", value))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, dict | list):
                    stack.append((f"{path}[{i}]", item))


def rewrite_references(resource: dict, fn: Callable[[str], str | None]) -> None:
    """Replace each ``reference`` string by ``fn(ref)`` when it returns a new value (in place)."""
    for _, node in list(iter_references(resource)):
        new = fn(node["reference"])
        if new is not None:
            node["reference"] = new
