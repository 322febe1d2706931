"""Parsed paths typed against the spec's element definitions: the concrete JSON steps of each walk
and the FHIR type of what it yields (so rows are built by type, not guessed)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ...spec import ElementDef, Spec
from .fhirtypes import ABSTRACT, QUANTITY_PARENTS, SYSTEM_TYPES
from .parse import Path, Unsupported
from .values import RefTypes


@dataclass(frozen=True, slots=True)
class Alt:
    """A fully typed linear walk: concrete JSON ops and the FHIR type of what it yields."""

    ops: tuple[tuple, ...]
    ctx: str  # path to look children up under (element path for backbones, else type name)
    type: str
    elem: ElementDef | None


def cap(t: str) -> str:
    return t[:1].upper() + t[1:]


class Typer:
    """Types parsed paths for one spec (``refs``: the reference splitter ``where(resolve() is T)`` uses)."""

    def __init__(self, spec: Spec, refs: RefTypes):
        self.spec = spec
        self._known = frozenset(spec.resource_types)
        self._refs = refs
        self._type2parent: dict[str, str] | None = None

    def typed(self, paths: list[Path], ctx: Alt, rt: str) -> list[Alt]:
        """Typed walks of parsed union branches, starting at ``ctx``; other types' branches dropped."""
        out: list[Alt] = []
        for path in paths:
            at_root = ctx.type == rt and not ctx.ops
            if path.start is None or path.start == ctx.type or (at_root and path.start in ABSTRACT):
                alts = [ctx]
            elif path.start == "%resource":
                alts = [Alt((("root",),), rt, rt, None)]
            elif path.start in self._known:
                continue  # a union branch for another resource type
            else:
                raise Unsupported(f"path starts with {path.start!r}")
            for step in path.steps:
                alts = [a2 for a in alts for a2 in self.step(a, step)]
            out.extend(alts)
        return out

    def step(self, a: Alt, step: tuple) -> Iterator[Alt]:
        kind = step[0]
        if kind == "child":
            name = step[1]
            if self.spec.is_primitive(a.type):
                raise Unsupported(f"navigating into primitive {a.type}.{name}")
            el = self.spec.child_elements(a.ctx).get(name)
            if el is None:
                raise Unsupported(f"no element {a.ctx}.{name}")
            if el.is_choice:
                for t in el.types:
                    yield Alt((*a.ops, ("get", name + cap(t))), t, t, el)
            elif el.content_reference or not el.types or el.types[0] in ("BackboneElement", "Element"):
                yield Alt((*a.ops, ("get", name)), el.path, "BackboneElement", el)
            elif len(el.types) == 1:
                yield Alt((*a.ops, ("get", name)), el.types[0], el.types[0], el)
            else:
                raise Unsupported(f"{el.path} has several types but is no choice")
        elif kind == "type":
            want = SYSTEM_TYPES.get(step[1], step[1])
            if a.type in ("Resource", "DomainResource"):
                yield Alt((*a.ops, ("rtype", want)), want, want, a.elem)
            elif self.is_subtype(a.type, want):
                yield a
        elif kind == "ext":
            yield Alt((*a.ops, ("ext", step[1])), "Extension", "Extension", None)
        elif kind == "eq":
            el = self.spec.child_elements(a.ctx).get(step[1])
            if el is None or el.is_choice:
                raise Unsupported(f"where() on {a.ctx}.{step[1]}")
            yield Alt((*a.ops, step), a.ctx, a.type, a.elem)
        elif kind == "resolve_is":
            if a.type != "Reference":
                raise Unsupported(f"resolve() on {a.type}")
            yield Alt((*a.ops, ("resolve_is", step[1], self._refs)), a.ctx, a.type, a.elem)
        elif kind in ("hasext", "index"):
            yield Alt((*a.ops, step), a.ctx, a.type, a.elem)
        else:  # pragma: no cover - the parser only produces the kinds above
            raise Unsupported(kind)

    def is_subtype(self, t: str, want: str) -> bool:
        """FHIRPath ``is``: the type or one it derives from (fhirpathpy's R4 model hierarchy)."""
        if self._type2parent is None:
            from fhirpathpy.models import models

            self._type2parent = {**models["r4"]["type2Parent"], **QUANTITY_PARENTS}
        cur: str | None = t
        for _ in range(32):
            if cur == want:
                return True
            if cur is None:
                return False
            cur = self._type2parent.get(cur)
        return False
