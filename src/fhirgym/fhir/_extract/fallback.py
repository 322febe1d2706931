"""Parameters outside the compiled subset, through ``fhirpathpy`` with fixes: ``resolve()``,
``hasExtension()`` and an all-matches ``extension()`` supplied, ``as`` rewritten to ``ofType``,
``Resource.`` to the concrete type, top-level unions evaluated branch by branch so values keep their
types. It is also the reference the tests hold the compiled walkers against.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Protocol

from ...spec import ElementDef, SearchParam, Spec
from .codegen import has_ext
from .fhirtypes import SYSTEM_TYPES
from .parse import split_top
from .rows import component_json, t_prim
from .values import RefTypes


class Extractor(Protocol):
    """What the fallback uses of :class:`.extractor.Extractor`: the same builders and bindings."""

    spec: Spec
    _known: frozenset[str]
    _refs: RefTypes
    _builders: dict[str, dict[str, Callable[..., None]]]

    def _components(self, p: SearchParam) -> list[tuple[str, str]]: ...

    def _binding_system(self, elem: ElementDef | None) -> str | None: ...

    def _extension_builders(self, ptype: str) -> Callable[[Any, list, Any], None]: ...


_AS_OP_RE = re.compile(r"\s+as\s+([A-Za-z]+)")
_AS_FN_RE = re.compile(r"\.as\(\s*([A-Za-z]+)\s*\)")
_SYSTEM_TYPE_ARG_RE = re.compile(r"ofType\((" + "|".join(SYSTEM_TYPES) + r")\)")
_RESOURCE_PREFIX_RE = re.compile(r"(?<![A-Za-z.])(?:Domain)?Resource\.")
_LEADING_TYPE_RE = re.compile(r"^[\s(]*([A-Z][A-Za-z]*)\b")


def _split_union(expr: str) -> list[str]:
    """Top-level ``|`` branches (outside parentheses and string literals)."""
    return [p for p in split_top(expr, "|") if p]


class FhirpathEngine:
    """fhirpathpy 2.2.4 with the fixes listed above, yielding typed values for the builders."""

    def __init__(self, ex: Extractor):
        import fhirpathpy
        from fhirpathpy.engine.nodes import ResourceNode
        from fhirpathpy.models import models

        self.ex = ex
        self.fhirpathpy = fhirpathpy
        self.ResourceNode = ResourceNode
        self.model = models["r4"]
        refs = ex._refs

        def resolve(inputs: list) -> list:
            out = []
            for r in inputs:
                ref = r.get("reference") if isinstance(r, dict) else None
                if isinstance(ref, str):
                    t, i = refs[ref]
                    if t is not None:
                        out.append(ResourceNode.create_node({"resourceType": t, "id": i}))
            return out

        def has_extension(inputs: list, url: str) -> list:
            return [any(has_ext(x, url) for x in inputs)] if inputs else []

        def extension(inputs: list, url: str) -> list:
            # fhirpathpy returns only the first matching extension; FHIRPath says all of them
            return [
                ResourceNode.create_node(e, "Extension")
                for x in inputs
                if isinstance(x, dict) and isinstance(x.get("extension"), list)
                for e in x["extension"]
                if isinstance(e, dict) and e.get("url") == url
            ]

        self.options = {
            "userInvocationTable": {
                "resolve": {"fn": resolve, "arity": {0: []}},
                "hasExtension": {"fn": has_extension, "arity": {1: ["String"]}},
                "extension": {"fn": extension, "arity": {1: ["String"]}},
            },
            "returnRawData": True,
        }

    def fix(self, rt: str, expr: str) -> list[str]:
        """Branches of ``expr`` rewritten so fhirpathpy evaluates them correctly on a ``rt``."""
        out = []
        for branch in _split_union(expr):
            b = _RESOURCE_PREFIX_RE.sub(rt + ".", branch)
            m = _LEADING_TYPE_RE.match(b)
            if m and m.group(1) in self.ex._known and m.group(1) != rt:
                continue  # another type's branch: empty on this resource anyway
            b = _AS_OP_RE.sub(r".ofType(\1)", b)
            b = _AS_FN_RE.sub(r".ofType(\1)", b)
            b = _SYSTEM_TYPE_ARG_RE.sub(lambda mm: f"ofType({SYSTEM_TYPES[mm.group(1)]})", b)
            out.append(b)
        return out

    def compile(self, rt: str, expr: str) -> list[Callable]:
        return [self.fhirpathpy.compile(b, self.model, self.options) for b in self.fix(rt, expr)]

    def param_fn(self, rt: str, p: SearchParam) -> Callable[[Any, Any, list], None]:
        """``fn(node, root, out)`` appending the param's full rows, like the generated walkers."""
        assert p.expression is not None
        branches = self.compile(rt, p.expression)
        code = p.code
        if p.type != "composite":
            ptype = p.type

            def evaluate(node: Any, root: Any, out: list) -> None:
                for fn in branches:
                    for item in fn(node, {"resource": root}):
                        self.build(item, ptype, out, code)

            return evaluate
        comps = [(self.compile(rt, expr), ctype) for expr, ctype in self.ex._components(p)]
        RN = self.ResourceNode

        def composite(node: Any, root: Any, out: list) -> None:
            for fn in branches:
                for item in fn(node, {"resource": root}):
                    elem = item if isinstance(item, RN) else RN.create_node(item)
                    parts = []
                    for cfns, ctype in comps:
                        rows: list = []
                        for cfn in cfns:
                            for v in cfn(elem, {"resource": root}):
                                self.build(v, ctype, rows, None)
                        if not rows:
                            break
                        parts.append(rows)
                    else:
                        out.append((code, component_json(tuple(parts))))

        return composite

    def build(self, item: Any, ptype: str, out: list, code: Any) -> None:
        """Rows of one fhirpathpy result, its FHIR type taken from the node (else from its shape)."""
        ex = self.ex
        system = None
        if isinstance(item, self.ResourceNode):
            value = item.data
            ftype = self.node_type(item, ptype)
            if ptype == "token" and ex.spec.is_primitive(ftype):
                system = ex._binding_system(self.element_of(item.propName))
        else:
            value = item
            ftype = _infer_type(value, ptype, ex._known)
        if ftype == "Extension":
            ex._extension_builders(ptype)(value, out, code)
            return
        b = ex._builders[ptype].get(ftype)
        if b is None:
            return
        if system is not None and b is t_prim:
            t_prim(value, out, code, system)
        else:
            b(value, out, code)

    def node_type(self, node: Any, ptype: str) -> str:
        path = node.path
        spec = self.ex.spec
        if path:
            if path.startswith("System."):
                return SYSTEM_TYPES.get(path[7:], path[7:].lower())
            if "." not in path and (
                spec.is_primitive(path) or path in spec.children or path in self.ex._known
            ):
                return path
            if "." in path:
                return "BackboneElement"
        return _infer_type(node.data, ptype, self.ex._known)

    def element_of(self, prop: str | None) -> ElementDef | None:
        """Element definition of a fhirpathpy ``propName`` such as ``Patient.name[0].given``."""
        if not prop:
            return None
        parts = [re.sub(r"\[\d+\]$", "", s) for s in prop.split(".")]
        spec = self.ex.spec
        ctx = parts[0]
        el = None
        for name in parts[1:]:
            el = spec.child_elements(ctx).get(name)
            if el is None:
                return None
            if el.is_choice or len(el.types) != 1 or el.types[0] in ("BackboneElement", "Element"):
                ctx = el.path
            else:
                ctx = el.types[0]
        return el


def _infer_type(value: Any, ptype: str, known: frozenset[str]) -> str:
    """FHIR type of an untyped fhirpathpy result, from its Python type and shape."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float | Decimal):
        return "decimal"
    if isinstance(value, str):
        if ptype == "date":
            return "dateTime"
        if ptype in ("uri", "reference"):
            return "uri"
        return "string"
    if not isinstance(value, dict):
        return "unknown"
    keys = value.keys()
    if value.get("resourceType") in known:
        return value["resourceType"]
    if "url" in keys and any(k.startswith("value") for k in keys):
        return "Extension"
    if "coding" in keys or (ptype == "token" and keys == {"text"}):
        return "CodeableConcept"
    if "reference" in keys or (ptype == "reference" and "identifier" in keys):
        return "Reference"
    if "family" in keys or "given" in keys:
        return "HumanName"
    if keys & {"line", "city", "postalCode", "country", "district", "state"}:
        return "Address"
    if "event" in keys or "repeat" in keys:
        return "Timing"
    if "start" in keys or "end" in keys:
        return "Period"
    if "low" in keys or "high" in keys:
        return "Range"
    if "currency" in keys:
        return "Money"
    if ptype in ("quantity", "number") and "value" in keys:
        return "Quantity"
    if ptype == "token" and "value" in keys:
        if value.get("system") in ("phone", "fax", "email", "pager", "url", "sms", "other"):
            return "ContactPoint"
        return "Identifier"
    if "code" in keys or "system" in keys:
        return "Coding"
    return "unknown"
