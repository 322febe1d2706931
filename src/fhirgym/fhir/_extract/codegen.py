"""Python source from typed walks: nested loops over the JSON, builder calls at the leaves, compiled
once per resource type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .values import RefTypes


def ref_type_is(v: Any, rtype: str, refs: RefTypes) -> bool:
    """``where(resolve() is X)`` on a Reference: the type named by its reference string."""
    if v.__class__ is not dict:
        return False
    ref = v.get("reference")
    return ref.__class__ is str and refs[ref][0] == rtype


def has_ext(v: Any, url: str) -> bool:
    exts = v.get("extension") if v.__class__ is dict else None
    return exts.__class__ is list and any(e.__class__ is dict and e.get("url") == url for e in exts)


Final = Callable[[str, int], None]


class Gen:
    """Source of one generated function: nested loops over the JSON, builder calls at the leaves."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"ref_type_is": ref_type_is, "has_ext": has_ext}
        self.consts: dict[int, str] = {}
        self.n = 0
        self.hoisted: dict[str, str] = {}  # top-level key -> local holding node.get(key), read once

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def var(self, prefix: str = "v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value: Any) -> str:
        name = self.consts.get(id(value))
        if name is None:
            name = self.consts[id(value)] = f"K{len(self.consts)}"
            self.ns[name] = value
        return name

    def walk(self, ops: tuple[tuple, ...], var: str, depth: int, final: Final, simple: bool) -> None:
        """Emit the walk of ``ops`` from ``var``; ``final(v, depth)`` emits the leaf code.

        ``simple`` means the leaf is one line, so it may be duplicated to avoid a loop for singletons.
        An index step (``entry[0]``) applies to the whole collection so far, which is materialised.
        """
        idx = max((i for i, op in enumerate(ops) if op[0] == "index"), default=-1)
        if idx < 0:
            self._linear(ops, var, depth, final, simple)
            return
        coll = self.var("c")
        self.emit(depth, f"{coll} = []")
        self.walk(ops[:idx], var, depth, lambda v, d: self.emit(d, f"{coll}.append({v})"), True)
        item = self.var()
        self.emit(depth, f"if len({coll}) > {ops[idx][1]}:")
        self.emit(depth + 1, f"{item} = {coll}[{ops[idx][1]}]")
        self._linear(ops[idx + 1 :], item, depth + 1, final, simple)

    def _linear(self, ops: tuple[tuple, ...], var: str, depth: int, final: Final, simple: bool) -> None:
        if not ops:
            final(var, depth)
            return
        op, rest = ops[0], ops[1:]
        kind = op[0]
        if kind == "root":
            self._linear(rest, "root", depth, final, simple)
        elif kind == "get":
            if var == "node":
                t = self.hoisted.get(op[1]) or self.hoisted.setdefault(op[1], f"h{len(self.hoisted)}")
            else:
                t = self.var()
                self.emit(depth, f"{t} = {var}.get({op[1]!r})")
            self.emit(depth, f"if {t} is not None:")
            x = self.var()
            if not rest and simple:
                self.emit(depth + 1, f"if {t}.__class__ is list:")
                self.emit(depth + 2, f"for {x} in {t}:")
                final(x, depth + 3)
                self.emit(depth + 1, "else:")
                final(t, depth + 2)
            else:
                self.emit(depth + 1, f"for {x} in ({t} if {t}.__class__ is list else ({t},)):")
                self._linear(rest, x, depth + 2, final, simple)
        elif kind == "ext":
            t, x = self.var(), self.var()
            self.emit(depth, f"{t} = {var}.get('extension')")
            self.emit(depth, f"if {t}.__class__ is list:")
            self.emit(depth + 1, f"for {x} in {t}:")
            self.emit(depth + 2, f"if {x}.__class__ is dict and {x}.get('url') == {op[1]!r}:")
            self._linear(rest, x, depth + 3, final, simple)
        elif kind == "eq":
            self.emit(depth, f"if {var}.get({op[1]!r}) == {op[2]!r}:")
            self._linear(rest, var, depth + 1, final, simple)
        elif kind == "resolve_is":
            self.emit(depth, f"if ref_type_is({var}, {op[1]!r}, {self.const(op[2])}):")
            self._linear(rest, var, depth + 1, final, simple)
        elif kind == "hasext":
            self.emit(depth, f"if has_ext({var}, {op[1]!r}):")
            self._linear(rest, var, depth + 1, final, simple)
        elif kind == "rtype":
            self.emit(depth, f"if {var}.__class__ is dict and {var}.get('resourceType') == {op[1]!r}:")
            self._linear(rest, var, depth + 1, final, simple)
        else:  # pragma: no cover - the typer only produces the kinds above
            raise AssertionError(kind)

    def function(self, name: str) -> Callable:
        src = "\n".join(self.lines)
        exec(compile(src, f"<fhirgym-extract {name}>", "exec"), self.ns)
        fn = self.ns[name]
        fn.__source__ = src  # type: ignore[attr-defined]
        return fn
