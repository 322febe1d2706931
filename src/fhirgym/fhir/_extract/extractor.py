"""The extractor: for each resource type, one generated function evaluating every applicable
parameter (compiled walkers where the subset allows, the fhirpathpy fallback elsewhere) into rows."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...spec import ElementDef, SearchParam, Spec
from .._store import TABLE_FOR_TYPE
from .codegen import Gen
from .fallback import FhirpathEngine
from .parse import Parser, Unsupported
from .rows import builders, component_json, t_prim
from .values import RefTypes
from .walks import Alt, Typer, cap

TABLES = TABLE_FOR_TYPE  # parameter type → index table; one definition, in the store


#: Parameters we cannot index, by SearchParameter id. Any expressionless or ``special`` parameter not
#: listed here makes :class:`Extractor` fail at construction, so the list stays a conscious decision.
UNSUPPORTED_REASONS: dict[str, str] = {
    "Resource-content": "no expression: _content is full-text search over the whole resource",
    "DomainResource-text": "no expression: _text is full-text search over the narrative",
    "Resource-query": "no expression: _query names a custom named query, not a value",
    "filter": "no expression: _filter is a query language evaluated at search time",
    "patient-extensions-Patient-age": "no expression: age depends on today's date; derive from birthdate at query time",
    "patient-extensions-Patient-birthOrderBoolean": (
        "no expression: its xpath mixes multipleBirthBoolean and multipleBirthInteger with no defined token form"
    ),
    "Location-near": "special type 'near' needs a geospatial index; no table for it",
}

#: Known defects in R4 SearchParameter definitions, corrected: (param id, component index) -> expression.
#: DocumentReference-relationship pairs the reference component with ``code`` and the token one with
#: ``target``; the intent (relatesTo target + relation code) is restored.
COMPONENT_FIXES: dict[tuple[str, int], str] = {
    ("DocumentReference-relationship", 0): "target",
    ("DocumentReference-relationship", 1): "code",
}


@dataclass(slots=True)
class _TypePlan:
    """Everything precomputed for one resource type."""

    fn: Callable[[Any, Any], dict[str, list[tuple]]]
    compiled: tuple[str, ...]  # param codes run as generated walkers
    fallback: tuple[str, ...]  # param codes run through fhirpathpy


class Extractor:
    """Turns resources into search index rows for every applicable official R4 parameter.

    The plan of a resource type (one generated function covering all its params) is built on the
    first resource of that type. ``unsupported`` lists the (type, code) pairs that get no rows, with
    the reason. ``failures`` counts params abandoned on malformed resources (a value of the wrong
    JSON shape); rows that param produced before the bad value are kept, the write never fails.
    """

    def __init__(self, spec: Spec):
        self.spec = spec
        self._known = frozenset(spec.resource_types)
        self._refs = RefTypes(self._known)
        self._plans: dict[str, _TypePlan] = {}
        self._builders = {ptype: builders(ptype, self._refs, self._known) for ptype in TABLES}
        self._typer = Typer(spec, self._refs)
        self._binding_systems: dict[str, str | None] = {}
        self._ext_value_types = {"value" + cap(t): t for t in spec.elements["Extension.value[x]"].types}
        self._fhirpath: FhirpathEngine | None = None
        self._fhirpath_fns: dict[tuple[str, str], Callable[[Any, Any, list], None]] = {}
        self.failures: Counter[tuple[str, str]] = Counter()
        self.unsupported: dict[tuple[str, str], str] = {}
        undecided = set()
        for rt in spec.resource_types:
            for code, p in spec.search_params(rt).items():
                if p.expression is None or p.type not in TABLES:
                    reason = UNSUPPORTED_REASONS.get(p.id)
                    if reason is None:
                        undecided.add(p.id)
                    else:
                        self.unsupported[(rt, code)] = reason
        if undecided:
            raise RuntimeError(f"search parameters with no extraction decision: {sorted(undecided)}")

    # -- public -----------------------------------------------------------------------------------
    def extract(self, resource: dict) -> dict[str, list[tuple]]:
        """Index rows by table for one resource (its resourceType decides the params).

        Raises ValueError when ``resourceType`` is not an R4 resource type.
        """
        plan = self._plans.get(resource.get("resourceType"))  # type: ignore[arg-type]
        if plan is None:
            plan = self._plan(resource.get("resourceType"))
        return plan.fn(resource, resource)

    def evaluate(
        self, resource: dict, *, use_fhirpath: bool = False, codes: list[str] | None = None
    ) -> dict[str, list[tuple]]:
        """Rows per param code (code column dropped, deduplicated), from ``extract`` or fhirpathpy.

        Exists so tests can hold the generated walkers against fixed fhirpathpy, param by param.
        """
        rt = resource["resourceType"]
        params = self.spec.search_params(rt)
        wanted = [c for c in (codes if codes is not None else params) if (rt, c) not in self.unsupported]
        out: dict[str, list[tuple]] = {c: [] for c in wanted}
        if use_fhirpath:
            for c in wanted:
                rows: list[tuple] = []
                self._fhirpath_fn(rt, params[c])(resource, resource, rows)
                out[c] = list(dict.fromkeys(r[1:] for r in rows))
            return out
        for rows in self.extract(resource).values():
            for r in rows:
                if r[0] in out:
                    out[r[0]].append(r[1:])
        return out

    def plan_info(self, resource_type: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(compiled codes, fallback codes) of a resource type."""
        plan = self._plans.get(resource_type) or self._plan(resource_type)
        return plan.compiled, plan.fallback

    def source(self, resource_type: str) -> str:
        """The generated Python of a resource type, for reading and debugging."""
        plan = self._plans.get(resource_type) or self._plan(resource_type)
        return plan.fn.__source__  # type: ignore[attr-defined]

    def coverage(self) -> dict[str, Any]:
        """Compiled vs fallback (type, param) counts over all resource types (builds every plan)."""
        compiled: list[tuple[str, str]] = []
        fallback: list[tuple[str, str]] = []
        for rt in self.spec.resource_types:
            c, f = self.plan_info(rt)
            compiled += [(rt, x) for x in c]
            fallback += [(rt, x) for x in f]
        return {
            "compiled": len(compiled),
            "fallback": len(fallback),
            "unsupported": len(self.unsupported),
            "fallback_params": fallback,
        }

    # -- planning ---------------------------------------------------------------------------------
    def _plan(self, rt: Any) -> _TypePlan:
        if rt not in self._known:
            raise ValueError(f"not an R4 resource type: {rt!r}")
        gen = Gen()
        name = f"extract_{rt}"
        tables = {t: f"t_{t[3:]}" for t in TABLES.values()}
        body: list[str] = []
        gen.lines = body
        compiled: list[str] = []
        fallback: list[str] = []
        used: set[str] = set()
        for code, p in sorted(self.spec.search_params(rt).items()):
            if (rt, code) in self.unsupported:
                continue
            table = TABLES[p.type]
            used.add(table)
            out = tables[table]
            mark = len(body)
            gen.emit(1, "try:")
            try:
                self._emit_param(gen, rt, p, out)
                compiled.append(code)
            except Unsupported:
                del body[mark + 1 :]
                gen.emit(2, f"{gen.const(self._fhirpath_fn(rt, p))}(node, root, {out})")
                fallback.append(code)
            gen.emit(1, "except Exception:")
            gen.emit(2, f"fail({code!r})")
        lines = [f"def {name}(node, root):"]
        lines += [f"    {tables[t]} = []" for t in TABLES.values() if t in used]
        lines += [f"    {local} = node.get({key!r})" for key, local in gen.hoisted.items()]
        lines += body
        lines.append("    res = {}")
        for t in TABLES.values():
            if t in used:
                v = tables[t]
                lines.append(f"    if {v}:")
                lines.append(f"        res[{t!r}] = list(dict.fromkeys({v})) if len({v}) > 1 else {v}")
        lines.append("    return res")
        gen.lines = lines
        failures = self.failures

        def fail(code: str) -> None:
            failures[(rt, code)] += 1

        gen.ns["fail"] = fail
        plan = _TypePlan(gen.function(name), tuple(compiled), tuple(fallback))
        self._plans[rt] = plan
        return plan

    def _emit_param(self, gen: Gen, rt: str, p: SearchParam, out: str) -> None:
        """Emit one param's walk into ``gen`` (inside its try block); raises Unsupported."""
        assert p.expression is not None
        root_alt = Alt((), rt, rt, None)
        alts = self._typer.typed(Parser(p.expression).parse(), root_alt, rt)
        code = repr(p.code)
        if p.type != "composite":
            self._emit_alts(gen, alts, p.type, 2, out, code)
            if gen.lines[-1].strip() == "try:":
                gen.emit(2, "pass")
            return
        comps = [(Parser(expr).parse(), ctype) for expr, ctype in self._components(p)]
        for alt in alts:
            elem_alt = Alt((), alt.ctx, alt.type, alt.elem)
            typed = [(self._typer.typed(paths, elem_alt, rt), ctype) for paths, ctype in comps]
            cvars = [gen.var("p") for _ in typed]

            def leaf(v: str, d: int, typed=typed, cvars=cvars) -> None:
                # innermost first: the last component (the value) is the one most often empty
                for j in range(len(typed) - 1, -1, -1):
                    calts, ctype = typed[j]
                    gen.emit(d, f"{cvars[j]} = []")
                    self._emit_alts(gen, calts, ctype, d, cvars[j], "None", start=v)
                    gen.emit(d, f"if {cvars[j]}:")
                    d += 1
                gen.emit(d, f"{out}.append(({code}, component_json(({', '.join(cvars)},))))")

            gen.walk(alt.ops, "node", 2, leaf, False)
        gen.ns["component_json"] = component_json
        if gen.lines[-1].strip() == "try:":
            gen.emit(2, "pass")

    def _components(self, p: SearchParam) -> list[tuple[str, str]]:
        out = []
        for j, c in enumerate(p.components):
            sub = self.spec.search_params_by_url.get(c.definition)
            if sub is None or sub.type not in TABLES or sub.type == "composite":
                raise RuntimeError(f"{p.id}: component {c.definition} has no indexable type")
            out.append((COMPONENT_FIXES.get((p.id, j), c.expression), sub.type))
        return out

    def _emit_alts(
        self, gen: Gen, alts: list[Alt], ptype: str, depth: int, out: str, code: str, start: str = "node"
    ) -> None:
        for alt in alts:
            call = self._builder_call(gen, alt, ptype, out, code)
            if call is not None:  # else a type this param type cannot index (e.g. SampledData)
                gen.walk(alt.ops, start, depth, lambda v, d, call=call: gen.emit(d, call.format(v)), True)

    def _builder_call(self, gen: Gen, alt: Alt, ptype: str, out: str, code: str) -> str | None:
        if alt.type == "Extension":
            return f"{gen.const(self._extension_builders(ptype))}({{}}, {out}, {code})"
        b = self._builders[ptype].get(alt.type)
        if b is None:
            return None
        if b is t_prim:
            system = self._binding_system(alt.elem)
            if system is not None:
                return f"{gen.const(b)}({{}}, {out}, {code}, {system!r})"
        return f"{gen.const(b)}({{}}, {out}, {code})"

    @functools.cache  # noqa: B019 - one per extractor and param type, lives as long as the extractor
    def _extension_builders(self, ptype: str) -> Callable[[Any, list, Any], None]:
        builders = self._builders[ptype]
        keys = self._ext_value_types

        def build(v: Any, out: list, code: Any) -> None:
            """An Extension is indexed by its ``value[x]`` (type from the key)."""
            if v.__class__ is not dict:
                return
            for k in v:
                t = keys.get(k)
                if t is not None:
                    b = builders.get(t)
                    if b is not None:
                        b(v[k], out, code)
                    return

        return build

    def _binding_system(self, elem: ElementDef | None) -> str | None:
        """The one CodeSystem of a required binding (so ``gender=<system>|male`` matches), else None."""
        if elem is None or elem.binding_strength != "required" or not elem.binding_valueset:
            return None
        vs = elem.binding_valueset
        if vs not in self._binding_systems:
            codes = self.spec.valueset_codes(vs)
            systems = {s for s, _ in codes} if codes else set()
            self._binding_systems[vs] = (next(iter(systems)) or None) if len(systems) == 1 else None
        return self._binding_systems[vs]

    # -- fhirpathpy fallback ----------------------------------------------------------------------
    def _fhirpath_fn(self, rt: str, p: SearchParam) -> Callable[[Any, Any, list], None]:
        fn = self._fhirpath_fns.get((rt, p.code))
        if fn is None:
            if self._fhirpath is None:
                self._fhirpath = FhirpathEngine(self)
            fn = self._fhirpath_fns[(rt, p.code)] = self._fhirpath.param_fn(rt, p)
        return fn

