"""Write-time search index extraction: every official R4 search parameter, turned into index rows.

For each resource written, every SearchParameter that applies to its type and has a FHIRPath
expression is evaluated, and the values become rows of one table per parameter type. The store
prefixes ``(rtype, id)``; rows here start with the parameter code.

Why compiled: ``fhirpathpy`` manages ~1,200 Observations/s, far too slow for loading a world, yet
~99 % of the R4 expressions are plain paths (see MEASUREMENTS.md). Those are parsed once, typed
against the spec's element definitions and turned into generated Python walkers over the JSON
dicts; the walker knows the FHIR type of every value it yields, so row building is typed, not
guessed. The few other expressions fall back to fixed ``fhirpathpy`` (``resolve()``,
``hasExtension()`` and an all-matches ``extension()`` supplied, ``as`` rewritten to ``ofType``,
``Resource.`` rewritten to the concrete type, top-level unions evaluated branch by branch so values
keep their types). The same fallback is the reference the tests compare the walkers against.

Row shapes (param code first):

- ``ix_string``    (param, norm, exact)
- ``ix_token``     (param, system, code, text)
- ``ix_reference`` (param, target_type, target_id, url, ident_system, ident_value)
- ``ix_date``      (param, lo, hi) — half-open epoch seconds, open ends MIN_TIME / MAX_TIME
- ``ix_number``    (param, lo, hi, value)
- ``ix_quantity``  (param, value, lo, hi, system, code, unit)
- ``ix_uri``       (param, uri)
- ``ix_composite`` (param, comp) — comp is compact JSON: one list per component, holding that
  component's rows without the param code, each list deduplicated and sorted by ``repr``.

Choices made here:

- A ``Range`` becomes ONE quantity (or number) row: value None, lo = lower bound of ``low``
  (MIN_TIME if absent), hi = upper bound of ``high`` (MAX_TIME if absent), units from ``low``
  (else ``high``). Two rows would make ``eq``/``lt``/``gt`` match either end alone.
- ``SampledData`` (quantity), ``Ratio``, ``Attachment`` etc. give no rows: there is no value to
  compare. ``string``-typed values of date parameters (e.g. ``onsetString``) are skipped.
- ``Money`` without a currency gets no system/code/unit.
- ``resolve()`` only looks at the reference string (``Patient/1``, absolute URLs); ``#contained``
  and ``urn:`` references resolve to nothing, as there is nothing to read.
- An inline resource in a reference parameter (``Bundle.entry[0].resource``) gives
  ``(type, id, None, None, None)``.
- A composite gives one row per element matched by its base expression, only when every component
  has at least one row (otherwise no search could match it).
- ``Extension`` values are indexed by their ``value[x]``.
- Rows are deduplicated per parameter. Tables without rows are absent from the result.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from ..spec._model import ElementDef, SearchParam, Spec
from ._values import MAX_TIME, MIN_TIME, date_range, normalize_string, number_range, split_reference

__all__ = ["TABLES", "Extractor"]

#: Index table of each search parameter type (``special`` has none).
TABLES: dict[str, str] = {
    "string": "ix_string",
    "token": "ix_token",
    "reference": "ix_reference",
    "date": "ix_date",
    "number": "ix_number",
    "quantity": "ix_quantity",
    "uri": "ix_uri",
    "composite": "ix_composite",
}

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

_SYSTEM_TYPES = {
    "String": "string",
    "Boolean": "boolean",
    "Integer": "integer",
    "Decimal": "decimal",
    "Date": "date",
    "DateTime": "dateTime",
    "Time": "time",
}
_STRINGISH = frozenset(
    {"string", "markdown", "code", "id", "uri", "url", "canonical", "oid", "uuid", "base64Binary", "xhtml"}
)
_URIISH = frozenset({"uri", "url", "canonical", "oid", "uuid"})
_DATEISH = frozenset({"date", "dateTime", "instant"})
_NUMERIC = frozenset({"decimal", "integer", "positiveInt", "unsignedInt", "integer64"})
_QUANTITIES = frozenset({"Quantity", "Age", "Duration", "Distance", "Count", "SimpleQuantity", "MoneyQuantity"})
_QUANTITY_PARENTS = {t: "Quantity" for t in _QUANTITIES if t != "Quantity"}
_ISO4217 = "urn:iso:std:iso:4217"


class _Unsupported(Exception):
    """An expression outside the compiled subset (it falls back to fhirpathpy)."""


# ------------------------------------------------------------------------------------------------
# Value conversions (cached: Synthea repeats displays, dates and numbers a lot)
# ------------------------------------------------------------------------------------------------

_norm = functools.lru_cache(maxsize=1 << 16)(normalize_string)


@functools.lru_cache(maxsize=1 << 16)
def _dr(value: str) -> tuple[float, float] | None:
    try:
        return date_range(value)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1 << 16)
def _nr(text: str) -> tuple[float, float, float] | None:
    try:
        return number_range(text)
    except ValueError:
        return None


def _num_range(v: Any) -> tuple[float, float, float] | None:
    """Precision range of a JSON number, from its textual form; None for non-numbers (and bools)."""
    cls = v.__class__
    if cls is int or cls is float:
        return _nr(repr(v))
    if cls is Decimal:
        return _nr(str(v))
    return None


@functools.lru_cache(maxsize=1 << 16)
def _split_ref_cached(ref: str, known: frozenset[str]) -> tuple[str | None, str | None]:
    t, i, _ = split_reference(ref)
    if t is None or t not in known:
        return None, None
    return t, i


def _date_of(v: Any) -> tuple[float, float] | None:
    return _dr(v) if v.__class__ is str else None


# ------------------------------------------------------------------------------------------------
# Row builders: (value, out) -> appends rows without the param code
# ------------------------------------------------------------------------------------------------

def _s_prim(v: Any, out: list) -> None:
    if v.__class__ is str and v:
        out.append((_norm(v), v))


def _s_parts(v: Any, out: list, fields: tuple[str, ...]) -> None:
    if v.__class__ is not dict:
        return
    for f in fields:
        x = v.get(f)
        if x is None:
            continue
        if x.__class__ is list:
            for y in x:
                if y.__class__ is str and y:
                    out.append((_norm(y), y))
        elif x.__class__ is str and x:
            out.append((_norm(x), x))


def _s_name(v: Any, out: list) -> None:
    _s_parts(v, out, ("family", "given", "prefix", "suffix", "text"))


def _s_address(v: Any, out: list) -> None:
    _s_parts(v, out, ("line", "city", "district", "state", "postalCode", "country", "text"))


def _t_prim(v: Any, out: list, system: str | None = None) -> None:
    if v.__class__ is str and v:
        out.append((system, v, None))


def _t_bool(v: Any, out: list) -> None:
    if v is True:
        out.append((None, "true", None))
    elif v is False:
        out.append((None, "false", None))


def _t_num(v: Any, out: list) -> None:
    if v.__class__ is int or v.__class__ is Decimal:
        out.append((None, str(v), None))


def _t_coding(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    system = v.get("system")
    code = v.get("code")
    d = v.get("display")
    text = _norm(d) if d.__class__ is str and d else None
    if system is not None or code is not None or text is not None:
        out.append((system, code, text))


def _t_cc(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    t = v.get("text")
    ntext = _norm(t) if t.__class__ is str and t else None
    codings = v.get("coding")
    if codings:
        for c in codings if codings.__class__ is list else (codings,):
            if c.__class__ is not dict:
                continue
            system = c.get("system")
            code = c.get("code")
            d = c.get("display")
            text = _norm(d) if d.__class__ is str and d else ntext
            if system is not None or code is not None or text is not None:
                out.append((system, code, text))
    elif ntext is not None:
        out.append((None, None, ntext))


def _t_identifier(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    system = v.get("system")
    value = v.get("value")
    if system is None and value is None:
        return
    typ = v.get("type")
    t = typ.get("text") if typ.__class__ is dict else None
    out.append((system, value, _norm(t) if t.__class__ is str and t else None))


def _t_contactpoint(v: Any, out: list) -> None:
    if v.__class__ is dict and v.get("value") is not None:
        out.append((v.get("system"), v.get("value"), None))


def _r_reference(v: Any, out: list, known: frozenset[str]) -> None:
    if v.__class__ is not dict:
        return
    ref = v.get("reference")
    ident = v.get("identifier")
    isys = ival = None
    if ident.__class__ is dict:
        isys = ident.get("system")
        ival = ident.get("value")
    if ref.__class__ is str and ref and ref[0] != "#":
        t, i = _split_ref_cached(ref, known)
        out.append((t, i, ref, isys, ival))
    elif isys is not None or ival is not None:
        out.append((None, None, None, isys, ival))


def _r_uri(v: Any, out: list) -> None:
    if v.__class__ is str and v:
        out.append((None, None, v, None, None))


def _r_inline(v: Any, out: list, known: frozenset[str]) -> None:
    if v.__class__ is dict:
        rt = v.get("resourceType")
        rid = v.get("id")
        if rt in known and rid.__class__ is str:
            out.append((rt, rid, None, None, None))


def _d_prim(v: Any, out: list) -> None:
    if v.__class__ is str:
        r = _dr(v)
        if r is not None:
            out.append(r)


def _d_period(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    start = v.get("start")
    end = v.get("end")
    if start is None and end is None:
        return
    lo = MIN_TIME
    hi = MAX_TIME
    if start is not None:
        r = _date_of(start)
        if r is None:
            return
        lo = r[0]
    if end is not None:
        r = _date_of(end)
        if r is None:
            return
        hi = r[1]
    out.append((lo, hi))


def _d_timing(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    events = v.get("event")
    if events.__class__ is list:
        for e in events:
            _d_prim(e, out)
    repeat = v.get("repeat")
    if repeat.__class__ is dict and "boundsPeriod" in repeat:
        _d_period(repeat["boundsPeriod"], out)


def _n_num(v: Any, out: list) -> None:
    r = _num_range(v)
    if r is not None:
        out.append(r)


def _range_bounds(v: Any) -> tuple[float, float, dict] | None:
    """(lo, hi, unit-bearing quantity) of a Range; None when neither end has a value."""
    if v.__class__ is not dict:
        return None
    low = v.get("low")
    high = v.get("high")
    lr = _num_range(low.get("value")) if low.__class__ is dict else None
    hr = _num_range(high.get("value")) if high.__class__ is dict else None
    if lr is None and hr is None:
        return None
    unit_src = low if lr is not None else high
    return (lr[0] if lr is not None else MIN_TIME), (hr[1] if hr is not None else MAX_TIME), unit_src


def _n_range(v: Any, out: list) -> None:
    b = _range_bounds(v)
    if b is not None:
        out.append((b[0], b[1], None))


def _n_quantity(v: Any, out: list) -> None:
    if v.__class__ is dict:
        _n_num(v.get("value"), out)


def _q_quantity(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    r = _num_range(v.get("value"))
    if r is not None:
        out.append((r[2], r[0], r[1], v.get("system"), v.get("code"), v.get("unit")))


def _q_money(v: Any, out: list) -> None:
    if v.__class__ is not dict:
        return
    r = _num_range(v.get("value"))
    if r is not None:
        cur = v.get("currency")
        out.append((r[2], r[0], r[1], _ISO4217 if cur is not None else None, cur, cur))


def _q_range(v: Any, out: list) -> None:
    b = _range_bounds(v)
    if b is not None:
        q = b[2]
        out.append((None, b[0], b[1], q.get("system"), q.get("code"), q.get("unit")))


def _u_uri(v: Any, out: list) -> None:
    if v.__class__ is str and v:
        out.append((v,))


def _builders(ptype: str, known: frozenset[str]) -> dict[str, Callable[..., None]]:
    """FHIR type -> row builder, for one search parameter type."""
    if ptype == "string":
        b: dict[str, Callable[..., None]] = dict.fromkeys(_STRINGISH, _s_prim)
        b.update(HumanName=_s_name, Address=_s_address)
        return b
    if ptype == "token":
        b = dict.fromkeys(_STRINGISH, _t_prim)
        b.update(dict.fromkeys(("integer", "positiveInt", "unsignedInt"), _t_num))
        b.update(
            boolean=_t_bool,
            Coding=_t_coding,
            CodeableConcept=_t_cc,
            Identifier=_t_identifier,
            ContactPoint=_t_contactpoint,
        )
        return b
    if ptype == "reference":
        b = dict.fromkeys(_URIISH, _r_uri)
        b["Reference"] = functools.partial(_r_reference, known=known)
        inline = functools.partial(_r_inline, known=known)
        b.update(dict.fromkeys(known, inline))
        b["Resource"] = b["DomainResource"] = inline
        return b
    if ptype == "date":
        b = dict.fromkeys(_DATEISH, _d_prim)
        b.update(Period=_d_period, Timing=_d_timing)
        return b
    if ptype == "number":
        b = dict.fromkeys(_NUMERIC, _n_num)
        b.update(dict.fromkeys(_QUANTITIES, _n_quantity))
        b["Range"] = _n_range
        return b
    if ptype == "quantity":
        b = dict.fromkeys(_QUANTITIES, _q_quantity)
        b.update(Money=_q_money, Range=_q_range)
        return b
    if ptype == "uri":
        return dict.fromkeys(_URIISH | {"string"}, _u_uri)
    return {}


# ------------------------------------------------------------------------------------------------
# Parsing the compiled FHIRPath subset
# ------------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<str>'(?:[^'\\]|\\.)*')
      | (?P<num>\d+(?:\.\d+)?)
      | (?P<ext>%[A-Za-z_][A-Za-z0-9_]*)
      | (?P<id>[A-Za-z_][A-Za-z0-9_]*|`[^`]*`)
      | (?P<op>!=|<=|>=|[().\[\]|=,<>+\-*/&~])
    )""",
    re.X,
)


@dataclass(frozen=True, slots=True)
class _Path:
    """One union branch: where it starts (type name, ``%resource`` or None = context) and its steps."""

    start: str | None
    steps: tuple[tuple, ...] = ()

    def plus(self, step: tuple) -> _Path:
        return _Path(self.start, (*self.steps, step))


def _tokenize(expr: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if not m or m.end() == pos:
            raise _Unsupported(f"cannot tokenize at {expr[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        text = m.group(kind)
        if kind == "id" and text.startswith("`"):
            text = text[1:-1]
        tokens.append((kind, text))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent over the path subset; anything else raises :class:`_Unsupported`."""

    def __init__(self, expr: str):
        self.toks = _tokenize(expr)
        self.i = 0

    def parse(self) -> list[_Path]:
        paths = self.union()
        if self.i != len(self.toks):
            raise _Unsupported(f"unexpected {self.toks[self.i][1]!r}")
        return paths

    def peek(self, text: str | None = None, kind: str | None = None) -> bool:
        if self.i >= len(self.toks):
            return False
        k, t = self.toks[self.i]
        return (text is None or t == text) and (kind is None or k == kind)

    def take(self, text: str | None = None, kind: str | None = None) -> str:
        if not self.peek(text, kind):
            got = self.toks[self.i][1] if self.i < len(self.toks) else "end"
            raise _Unsupported(f"expected {text or kind}, got {got!r}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def union(self) -> list[_Path]:
        paths = self.typed()
        while self.peek("|", "op"):
            self.i += 1
            paths += self.typed()
        return paths

    def typed(self) -> list[_Path]:
        paths = self.postfix()
        while self.peek("as", "id"):
            self.i += 1
            t = self.take(kind="id")
            paths = [p.plus(("type", t)) for p in paths]
        return paths

    def postfix(self) -> list[_Path]:
        paths = self.primary()
        while True:
            if self.peek(".", "op"):
                self.i += 1
                name = self.take(kind="id")
                if self.peek("(", "op"):
                    step = self.function(name)
                else:
                    step = ("child", name)
                paths = [p.plus(step) for p in paths]
            elif self.peek("[", "op"):
                self.i += 1
                n = int(self.take(kind="num"))
                self.take("]")
                paths = [p.plus(("index", n)) for p in paths]
            else:
                return paths

    def primary(self) -> list[_Path]:
        if self.peek("(", "op"):
            self.i += 1
            paths = self.union()
            self.take(")")
            return paths
        if self.peek("%resource", "ext"):
            self.i += 1
            return [_Path("%resource")]
        name = self.take(kind="id")
        if self.peek("(", "op"):
            raise _Unsupported(f"function {name}() at start")
        if name[0].isupper():
            return [_Path(name)]
        return [_Path(None, (("child", name),))]

    def string(self) -> str:
        s = self.take(kind="str")
        return s[1:-1].replace("\\'", "'")

    def function(self, name: str) -> tuple:
        self.take("(")
        if name in ("as", "ofType"):
            step: tuple = ("type", self.take(kind="id"))
        elif name == "extension":
            step = ("ext", self.string())
        elif name == "where":
            step = self.condition()
        else:
            raise _Unsupported(f"function {name}()")
        self.take(")")
        return step

    def condition(self) -> tuple:
        if self.peek("resolve", "id"):
            self.i += 1
            self.take("(")
            self.take(")")
            self.take("is")
            return ("resolve_is", self.take(kind="id"))
        if self.peek("hasExtension", "id"):
            self.i += 1
            self.take("(")
            url = self.string()
            self.take(")")
            return ("hasext", url)
        field = self.take(kind="id")
        self.take("=")
        return ("eq", field, self.string())


# ------------------------------------------------------------------------------------------------
# Typing paths against the spec, and generating walkers
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Alt:
    """A fully typed linear walk: concrete JSON ops and the FHIR type of what it yields."""

    ops: tuple[tuple, ...]
    ctx: str  # path to look children up under (element path for backbones, else type name)
    type: str
    elem: ElementDef | None


def _cap(t: str) -> str:
    return t[:1].upper() + t[1:]


class _Gen:
    """Generates one Python function from typed walks (exec'd once per resource type and param)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"_ref_type_is": _ref_type_is, "_has_ext": _has_ext}
        self.n = 0

    def var(self) -> str:
        self.n += 1
        return f"v{self.n}"

    def const(self, value: Any) -> str:
        name = f"K{len(self.ns)}"
        self.ns[name] = value
        return name

    def walk(self, ops: tuple[tuple, ...], var: str, root: str, depth: int, final: Callable[[str, int], None]):
        """Emit nested loops for ``ops`` starting at ``var``; ``final`` emits the innermost code."""
        idx = max((i for i, op in enumerate(ops) if op[0] == "index"), default=-1)
        if idx >= 0:
            coll = self.var()
            self.lines.append(f"{'    ' * depth}{coll} = []")
            self.walk(ops[:idx], var, root, depth, lambda v, d: self.lines.append(f"{'    ' * d}{coll}.append({v})"))
            n = ops[idx][1]
            item = self.var()
            self.lines.append(f"{'    ' * depth}if len({coll}) > {n}:")
            self.lines.append(f"{'    ' * (depth + 1)}{item} = {coll}[{n}]")
            self._walk_linear(ops[idx + 1 :], item, root, depth + 1, final)
        else:
            self._walk_linear(ops, var, root, depth, final)

    def _walk_linear(self, ops, var: str, root: str, depth: int, final: Callable[[str, int], None]) -> None:
        ind = "    " * depth
        if not ops:
            final(var, depth)
            return
        op, rest = ops[0], ops[1:]
        kind = op[0]
        if kind == "root":
            self._walk_linear(rest, root, root, depth, final)
        elif kind == "get":
            t, x = self.var(), self.var()
            self.lines.append(f"{ind}{t} = {var}.get({op[1]!r})")
            self.lines.append(f"{ind}if {t} is not None:")
            self.lines.append(f"{ind}    for {x} in ({t} if {t}.__class__ is list else ({t},)):")
            self._walk_linear(rest, x, root, depth + 2, final)
        elif kind == "ext":
            t, x = self.var(), self.var()
            self.lines.append(f"{ind}{t} = {var}.get('extension')")
            self.lines.append(f"{ind}if {t}.__class__ is list:")
            self.lines.append(f"{ind}    for {x} in {t}:")
            self.lines.append(f"{ind}        if {x}.__class__ is dict and {x}.get('url') == {op[1]!r}:")
            self._walk_linear(rest, x, root, depth + 3, final)
        elif kind == "eq":
            self.lines.append(f"{ind}if {var}.get({op[1]!r}) == {op[2]!r}:")
            self._walk_linear(rest, var, root, depth + 1, final)
        elif kind == "resolve_is":
            self.lines.append(f"{ind}if _ref_type_is({var}, {op[1]!r}, {self.const(op[2])}):")
            self._walk_linear(rest, var, root, depth + 1, final)
        elif kind == "hasext":
            self.lines.append(f"{ind}if _has_ext({var}, {op[1]!r}):")
            self._walk_linear(rest, var, root, depth + 1, final)
        elif kind == "rtype":
            self.lines.append(f"{ind}if {var}.__class__ is dict and {var}.get('resourceType') == {op[1]!r}:")
            self._walk_linear(rest, var, root, depth + 1, final)
        else:  # pragma: no cover - the typer only produces the kinds above
            raise AssertionError(kind)

    def function(self, name: str) -> Callable:
        src = "\n".join(self.lines)
        exec(compile(src, f"<fhirgym-extract {name}>", "exec"), self.ns)
        fn = self.ns[name]
        fn.__source__ = src  # type: ignore[attr-defined]
        return fn


def _ref_type_is(v: Any, rtype: str, known: frozenset[str]) -> bool:
    """``where(resolve() is X)`` on a Reference: the type named by its reference string."""
    if v.__class__ is not dict:
        return False
    ref = v.get("reference")
    return ref.__class__ is str and _split_ref_cached(ref, known)[0] == rtype


def _has_ext(v: Any, url: str) -> bool:
    exts = v.get("extension") if v.__class__ is dict else None
    return exts.__class__ is list and any(e.__class__ is dict and e.get("url") == url for e in exts)


@dataclass(slots=True)
class _ParamPlan:
    code: str
    table: str
    fn: Callable[[Any, Any], list]
    compiled: bool
    param: SearchParam


@dataclass(slots=True)
class _TypePlan:
    params: list[_ParamPlan]


# ------------------------------------------------------------------------------------------------
# The extractor
# ------------------------------------------------------------------------------------------------


class Extractor:
    """Turns resources into search index rows for every applicable official R4 parameter.

    Plans (generated walkers) are built lazily per resource type on its first resource.
    ``unsupported`` lists the (type, code) pairs that get no rows, with the reason.
    ``failures`` counts params skipped on malformed resources (a value of the wrong JSON shape).
    """

    def __init__(self, spec: Spec):
        self.spec = spec
        self._known = frozenset(spec.resource_types)
        self._plans: dict[str, _TypePlan] = {}
        self._builders = {ptype: _builders(ptype, self._known) for ptype in TABLES}
        self._type2parent: dict[str, str] | None = None
        self._binding_systems: dict[str, str | None] = {}
        self._ext_value_types = {
            "value" + _cap(t): t for t in spec.elements["Extension.value[x]"].types
        }
        self._fhirpath: _FhirpathEngine | None = None
        self.failures: Counter[tuple[str, str]] = Counter()
        self.unsupported: dict[tuple[str, str], str] = {}
        unknown = []
        for rt in spec.resource_types:
            for code, p in spec.search_params(rt).items():
                if p.expression is None or p.type not in TABLES:
                    reason = UNSUPPORTED_REASONS.get(p.id)
                    if reason is None:
                        unknown.append(p.id)
                    else:
                        self.unsupported[(rt, code)] = reason
        if unknown:
            raise RuntimeError(f"search parameters with no extraction decision: {sorted(set(unknown))}")

    # -- public -----------------------------------------------------------------------------------
    def extract(self, resource: dict) -> dict[str, list[tuple]]:
        """Index rows by table for one resource (its resourceType decides the params)."""
        rt = resource.get("resourceType")
        plan = self._plans.get(rt)  # type: ignore[arg-type]
        if plan is None:
            plan = self._plan(rt)
        out: dict[str, list[tuple]] = {}
        for p in plan.params:
            try:
                rows = p.fn(resource, resource)
            except Exception:  # malformed JSON shape for this param: skip it, never fail the write
                self.failures[(rt, p.code)] += 1  # type: ignore[index]
                continue
            if rows:
                if len(rows) > 1:
                    rows = list(dict.fromkeys(rows))
                code = (p.code,)
                t = out.get(p.table)
                if t is None:
                    out[p.table] = [code + r for r in rows]
                else:
                    t.extend([code + r for r in rows])
        return out

    def evaluate(self, resource: dict, code: str, *, use_fhirpath: bool = False) -> list[tuple]:
        """Rows (without the code) of one param; ``use_fhirpath`` forces the fhirpathpy reference.

        Exists so tests can hold the compiled walkers against fhirpathpy, value by value.
        """
        rt = resource["resourceType"]
        param = self.spec.search_params(rt)[code]
        if use_fhirpath:
            fn = self._fhirpath_fn(rt, param)
        else:
            plan = self._plans.get(rt) or self._plan(rt)
            fn = next(p.fn for p in plan.params if p.code == code)
        return list(dict.fromkeys(fn(resource, resource)))

    def is_compiled(self, resource_type: str, code: str) -> bool:
        """Whether the param runs as a generated walker (False: fhirpathpy fallback)."""
        plan = self._plans.get(resource_type) or self._plan(resource_type)
        return next(p.compiled for p in plan.params if p.code == code)

    def coverage(self) -> dict[str, Any]:
        """Compiled vs fallback counts over all types (builds every plan)."""
        compiled = fallback = 0
        fallback_params: list[tuple[str, str]] = []
        for rt in self.spec.resource_types:
            for p in self._plan_of(rt).params:
                if p.compiled:
                    compiled += 1
                else:
                    fallback += 1
                    fallback_params.append((rt, p.code))
        return {
            "compiled": compiled,
            "fallback": fallback,
            "unsupported": len(self.unsupported),
            "fallback_params": fallback_params,
        }

    # -- planning ---------------------------------------------------------------------------------
    def _plan_of(self, rt: str) -> _TypePlan:
        return self._plans.get(rt) or self._plan(rt)

    def _plan(self, rt: Any) -> _TypePlan:
        if rt not in self._known:
            raise ValueError(f"not an R4 resource type: {rt!r}")
        params: list[_ParamPlan] = []
        for code, p in sorted(self.spec.search_params(rt).items()):
            if (rt, code) in self.unsupported:
                continue
            try:
                fn = self._compile_param(rt, p)
                compiled = True
            except _Unsupported:
                fn = self._fhirpath_fn(rt, p)
                compiled = False
            params.append(_ParamPlan(code, TABLES[p.type], fn, compiled, p))
        plan = _TypePlan(params)
        self._plans[rt] = plan
        return plan

    def _compile_param(self, rt: str, p: SearchParam) -> Callable[[Any, Any], list]:
        assert p.expression is not None
        root_alt = _Alt((), rt, rt, None)
        alts = self._typed(_Parser(p.expression).parse(), root_alt, rt)
        name = "p_" + re.sub(r"\W", "_", f"{rt}_{p.code}")
        if p.type != "composite":
            gen = _Gen()
            gen.lines.append(f"def {name}(node, root):")
            gen.lines.append("    out = []")
            self._emit_alts(gen, alts, p.type, 1)
            gen.lines.append("    return out")
            return gen.function(name)
        # composite: per base alternative, a collector of elements and one walker per component
        parts: list[tuple[Callable, list[Callable]]] = []
        comps = self._components(p)
        for i, alt in enumerate(alts):
            gen = _Gen()
            gen.lines.append(f"def {name}_base{i}(node, root):")
            gen.lines.append("    out = []")
            gen.walk(alt.ops, "node", "root", 1, lambda v, d: gen.lines.append(f"{'    ' * d}out.append({v})"))
            gen.lines.append("    return out")
            collect = gen.function(f"{name}_base{i}")
            comp_fns = []
            for j, (expr, ctype) in enumerate(comps):
                elem_alt = _Alt((), alt.ctx, alt.type, alt.elem)
                calts = self._typed(_Parser(expr).parse(), elem_alt, rt)
                cg = _Gen()
                cg.lines.append(f"def {name}_c{i}_{j}(node, root):")
                cg.lines.append("    out = []")
                self._emit_alts(cg, calts, ctype, 1)
                cg.lines.append("    return out")
                comp_fns.append(cg.function(f"{name}_c{i}_{j}"))
            parts.append((collect, comp_fns))
        return _composite_fn(parts)

    def _components(self, p: SearchParam) -> list[tuple[str, str]]:
        out = []
        for j, c in enumerate(p.components):
            sub = self.spec.search_params_by_url.get(c.definition)
            if sub is None or sub.type not in TABLES or sub.type == "composite":
                raise RuntimeError(f"{p.id}: component {c.definition} has no indexable type")
            out.append((COMPONENT_FIXES.get((p.id, j), c.expression), sub.type))
        return out

    def _emit_alts(self, gen: _Gen, alts: list[_Alt], ptype: str, depth: int) -> None:
        for alt in alts:
            call = self._builder_call(gen, alt, ptype)
            if call is None:
                continue  # a type this param type cannot index (e.g. SampledData): no rows
            gen.walk(alt.ops, "node", "root", depth, lambda v, d, call=call: gen.lines.append(
                f"{'    ' * d}{call.format(v)}"
            ))

    def _builder_call(self, gen: _Gen, alt: _Alt, ptype: str) -> str | None:
        if alt.type == "Extension":
            fn = functools.partial(self._build_extension, ptype=ptype)
            return f"{gen.const(fn)}({{}}, out)"
        b = self._builders[ptype].get(alt.type)
        if b is None:
            return None
        if b is _t_prim:
            system = self._binding_system(alt.elem)
            if system is not None:
                return f"{gen.const(b)}({{}}, out, {system!r})"
        return f"{gen.const(b)}({{}}, out)"

    def _build_extension(self, v: Any, out: list, ptype: str) -> None:
        """Index an Extension by its ``value[x]`` (type from the key)."""
        if v.__class__ is not dict:
            return
        for k, t in self._ext_value_types.items():
            if k in v:
                b = self._builders[ptype].get(t)
                if b is not None:
                    b(v[k], out)
                return

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

    # -- typing -----------------------------------------------------------------------------------
    def _typed(self, paths: list[_Path], ctx: _Alt, rt: str) -> list[_Alt]:
        out: list[_Alt] = []
        for path in paths:
            if path.start is None:
                alts = [ctx]
            elif path.start == "%resource":
                alts = [_Alt((("root",),), rt, rt, None)]
            elif path.start in (rt, "Resource", "DomainResource") and ctx.ops == () and ctx.type == rt:
                alts = [ctx]
            elif path.start == ctx.type:
                alts = [ctx]
            elif path.start in self._known:
                continue  # a union branch for another resource type
            else:
                raise _Unsupported(f"path starts with {path.start!r}")
            for step in path.steps:
                alts = [a2 for a in alts for a2 in self._step(a, step)]
            out.extend(alts)
        return out

    def _step(self, a: _Alt, step: tuple) -> Iterator[_Alt]:
        kind = step[0]
        if kind == "child":
            name = step[1]
            if self.spec.is_primitive(a.type):
                raise _Unsupported(f"navigating into primitive {a.type}.{name}")
            el = self.spec.child_elements(a.ctx).get(name)
            if el is None:
                raise _Unsupported(f"no element {a.ctx}.{name}")
            if el.is_choice:
                for t in el.types:
                    yield _Alt((*a.ops, ("get", name + _cap(t))), t, t, el)
            elif el.content_reference or not el.types or el.types[0] in ("BackboneElement", "Element"):
                yield _Alt((*a.ops, ("get", name)), el.path, "BackboneElement", el)
            elif len(el.types) == 1:
                yield _Alt((*a.ops, ("get", name)), el.types[0], el.types[0], el)
            else:
                raise _Unsupported(f"{el.path} has several types but is no choice")
        elif kind == "type":
            want = _SYSTEM_TYPES.get(step[1], step[1])
            if a.type in ("Resource", "DomainResource"):
                yield _Alt((*a.ops, ("rtype", want)), want, want, a.elem)
            elif self._is_subtype(a.type, want):
                yield a
        elif kind == "ext":
            yield _Alt((*a.ops, ("ext", step[1])), "Extension", "Extension", None)
        elif kind == "eq":
            el = self.spec.child_elements(a.ctx).get(step[1])
            if el is None or el.is_choice:
                raise _Unsupported(f"where() on {a.ctx}.{step[1]}")
            yield _Alt((*a.ops, step), a.ctx, a.type, a.elem)
        elif kind == "resolve_is":
            if a.type != "Reference":
                raise _Unsupported(f"resolve() on {a.type}")
            yield _Alt((*a.ops, ("resolve_is", step[1], self._known)), a.ctx, a.type, a.elem)
        elif kind in ("hasext", "index"):
            yield _Alt((*a.ops, step), a.ctx, a.type, a.elem)
        else:  # pragma: no cover - the parser only produces the kinds above
            raise _Unsupported(kind)

    def _is_subtype(self, t: str, want: str) -> bool:
        """FHIRPath ``is``: the type or one it derives from (fhirpathpy's R4 model hierarchy)."""
        if self._type2parent is None:
            from fhirpathpy.models import models

            self._type2parent = {**models["r4"]["type2Parent"], **_QUANTITY_PARENTS}
        seen = 0
        cur: str | None = t
        while cur and seen < 32:
            if cur == want:
                return True
            cur = self._type2parent.get(cur)
            seen += 1
        return False

    # -- fhirpathpy fallback ----------------------------------------------------------------------
    def _fhirpath_fn(self, rt: str, p: SearchParam) -> Callable[[Any, Any], list]:
        if self._fhirpath is None:
            self._fhirpath = _FhirpathEngine(self)
        return self._fhirpath.param_fn(rt, p)


def _composite_fn(parts: list[tuple[Callable, list[Callable]]]) -> Callable[[Any, Any], list]:
    """One composite row per base element whose components all have rows."""

    def composite(node: Any, root: Any) -> list:
        out = []
        for collect, comp_fns in parts:
            n = len(comp_fns)
            for elem in collect(node, root):
                values: list = [None] * n
                for j in range(n - 1, -1, -1):  # value components (last) are the selective ones
                    rows = comp_fns[j](elem, root)
                    if not rows:
                        break
                    if len(rows) > 1:
                        rows = sorted(dict.fromkeys(rows), key=repr)
                    values[j] = rows
                else:
                    out.append((orjson.dumps(values).decode(),))
        return out

    return composite


# ------------------------------------------------------------------------------------------------
# fhirpathpy, fixed
# ------------------------------------------------------------------------------------------------

_AS_OP_RE = re.compile(r"\s+as\s+([A-Za-z]+)")
_AS_FN_RE = re.compile(r"\.as\(\s*([A-Za-z]+)\s*\)")
_SYSTEM_TYPE_ARG_RE = re.compile(r"ofType\((" + "|".join(_SYSTEM_TYPES) + r")\)")
_RESOURCE_PREFIX_RE = re.compile(r"(?<![A-Za-z.])(?:Domain)?Resource\.")
_LEADING_TYPE_RE = re.compile(r"^[\s(]*([A-Z][A-Za-z]*)\b")
_INDEX_RE = re.compile(r"\[(\d+)\]$")


def _split_union(expr: str) -> list[str]:
    """Top-level ``|`` branches (outside parentheses and string literals)."""
    parts, depth, cur, quote = [], 0, [], False
    for ch in expr:
        if quote:
            cur.append(ch)
            quote = ch != "'"
            continue
        if ch == "'":
            quote = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


class _FhirpathEngine:
    """fhirpathpy 2.2.4 with the fixes MEASUREMENTS.md lists, yielding typed values for the builders."""

    def __init__(self, ex: Extractor):
        import fhirpathpy
        from fhirpathpy.engine.nodes import ResourceNode
        from fhirpathpy.models import models

        self.ex = ex
        self.fhirpathpy = fhirpathpy
        self.ResourceNode = ResourceNode
        self.model = models["r4"]
        known = ex._known

        def resolve(inputs: list) -> list:
            out = []
            for r in inputs:
                ref = r.get("reference") if isinstance(r, dict) else None
                if isinstance(ref, str):
                    t, i = _split_ref_cached(ref, known)
                    if t is not None:
                        out.append(ResourceNode.create_node({"resourceType": t, "id": i}))
            return out

        def has_extension(inputs: list, url: str) -> list:
            return [any(_has_ext(x, url) for x in inputs)] if inputs else []

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
            b = _SYSTEM_TYPE_ARG_RE.sub(lambda mm: f"ofType({_SYSTEM_TYPES[mm.group(1)]})", b)
            out.append(b)
        return out

    def compile(self, rt: str, expr: str) -> list[Callable]:
        return [self.fhirpathpy.compile(b, self.model, self.options) for b in self.fix(rt, expr)]

    def param_fn(self, rt: str, p: SearchParam) -> Callable[[Any, Any], list]:
        assert p.expression is not None
        branches = self.compile(rt, p.expression)
        if p.type != "composite":
            ptype = p.type

            def evaluate(node: Any, root: Any) -> list:
                out: list = []
                for fn in branches:
                    for item in fn(node, {"resource": root}):
                        self.build(item, ptype, out)
                return out

            return evaluate
        comps = [(self.compile(rt, expr), ctype) for expr, ctype in self.ex._components(p)]
        RN = self.ResourceNode

        def composite(node: Any, root: Any) -> list:
            out = []
            for fn in branches:
                for item in fn(node, {"resource": root}):
                    elem = item if isinstance(item, RN) else RN.create_node(item)
                    values = []
                    for cfns, ctype in comps:
                        rows: list = []
                        for cfn in cfns:
                            for v in cfn(elem, {"resource": root}):
                                self.build(v, ctype, rows)
                        if not rows:
                            break
                        values.append(sorted(dict.fromkeys(rows), key=repr))
                    else:
                        out.append((orjson.dumps(values).decode(),))
            return out

        return composite

    def build(self, item: Any, ptype: str, out: list) -> None:
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
            ex._build_extension(value, out, ptype)
            return
        b = ex._builders[ptype].get(ftype)
        if b is None:
            return
        if system is not None and b is _t_prim:
            _t_prim(value, out, system)
        else:
            b(value, out)

    def node_type(self, node: Any, ptype: str) -> str:
        path = node.path
        spec = self.ex.spec
        if path:
            if path.startswith("System."):
                return _SYSTEM_TYPES.get(path[7:], path[7:].lower())
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
