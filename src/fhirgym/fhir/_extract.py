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

- A ``Range`` becomes two quantity (or number) rows, one per present end (``low``, ``high``), each
  with its own value, precision range and units. Search compares the ``value`` column, so
  ``lt``/``gt``/``le``/``ge`` then match when some end of the range does; an absent end gives no row.
- ``SampledData`` (quantity), ``Ratio``, ``Attachment`` etc. give no rows: there is no value to
  compare. ``string``, ``Age`` and ``Range`` values of date parameters (``onsetString``...) are skipped.
- ``Money`` without a currency gets no system/code/unit.
- ``resolve()`` only looks at the reference string (``Patient/1``, absolute URLs); ``#contained``
  and ``urn:`` references resolve to nothing, as there is nothing to read.
- An inline resource in a reference parameter (``Bundle.entry[0].resource``) gives
  ``(type, id, None, None, None)``.
- A composite gives one row per element matched by its base expression, only when every component
  has at least one row (otherwise no search could match it).
- A ``CodeableConcept`` gives a token row per coding (text: the coding's display, else the concept's
  text) and also ``(None, None, text)`` when no coding row carries the concept's text, so
  ``:text`` finds ``CodeableConcept.text`` even when the codings have displays.
- A ``code`` (or other string-like primitive) gets the system of its element's required binding
  when that ValueSet's expansion has exactly one system (``gender=http://hl7.org/fhir/administrative-gender|male``).
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

from ..spec import ElementDef, SearchParam, Spec
from ._store import TABLE_FOR_TYPE
from ._values import MAX_TIME, MIN_TIME, date_range, normalize_string, number_range, split_reference

__all__ = ["TABLES", "Extractor"]

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
_QUANTITIES = frozenset(
    {"Quantity", "Age", "Duration", "Distance", "Count", "SimpleQuantity", "MoneyQuantity"}
)
_QUANTITY_PARENTS = {t: "Quantity" for t in _QUANTITIES if t != "Quantity"}
_ISO4217 = "urn:iso:std:iso:4217"
_ABSTRACT = ("Resource", "DomainResource")


class _Unsupported(Exception):
    """An expression outside the compiled subset (it falls back to fhirpathpy)."""


# ------------------------------------------------------------------------------------------------
# Value conversions (cached: Synthea repeats displays, dates and numbers a lot)
# ------------------------------------------------------------------------------------------------


class _Memo(dict):
    """Cache whose hit is one C-level dict lookup (an lru_cache hit costs a Python-level call)."""

    __slots__ = ("fn", "limit")

    def __init__(self, fn: Callable[[Any], Any], limit: int = 1 << 16):
        super().__init__()
        self.fn = fn
        self.limit = limit

    def __missing__(self, key: Any) -> Any:
        if len(self) >= self.limit:
            self.clear()
        value = self[key] = self.fn(key)
        return value


def _date_or_none(value: str) -> tuple[float, float] | None:
    try:
        return date_range(value)
    except ValueError:
        return None


def _number_or_none(text: str) -> tuple[float, float, float] | None:
    try:
        return number_range(text)
    except ValueError:
        return None


_norm = _Memo(normalize_string).__getitem__
_DATES = _Memo(_date_or_none)
_FLOATS = _Memo(lambda v: _number_or_none(repr(v)))  # ints and floats apart: 1 == 1.0 but "1" != "1.0"
_INTS = _Memo(lambda v: _number_or_none(repr(v)))


def _num_range(v: Any) -> tuple[float, float, float] | None:
    """Precision range of a JSON number, from its textual form; None for non-numbers (and bools)."""
    cls = v.__class__
    if cls is float:
        return _FLOATS[v]
    if cls is int:
        return _INTS[v]
    if cls is Decimal:
        return _number_or_none(str(v))
    return None


class _RefTypes(_Memo):
    """Reference string -> (type, id), the type only when it is a real resource type."""

    __slots__ = ()

    def __init__(self, known: frozenset[str]):
        def split(ref: str) -> tuple[str | None, str | None]:
            t, i, _ = split_reference(ref)
            return (t, i) if t in known else (None, None)

        super().__init__(split)


def _date_of(v: Any) -> tuple[float, float] | None:
    return _DATES[v] if v.__class__ is str else None


# ------------------------------------------------------------------------------------------------
# Row builders: (value, out, code) -> append full rows. Composite components pass code=None and the
# code column is dropped when the component is serialised.
# ------------------------------------------------------------------------------------------------


def _s_prim(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str and v:
        out.append((code, _norm(v), v))


def _s_parts(v: Any, out: list, code: Any, fields: tuple[str, ...]) -> None:
    if v.__class__ is not dict:
        return
    for f in fields:
        x = v.get(f)
        if x is None:
            continue
        for y in x if x.__class__ is list else (x,):
            if y.__class__ is str and y:
                out.append((code, _norm(y), y))


_NAME_PARTS = ("family", "given", "prefix", "suffix", "text")
_ADDRESS_PARTS = ("line", "city", "district", "state", "postalCode", "country", "text")


def _s_name(v: Any, out: list, code: Any) -> None:
    _s_parts(v, out, code, _NAME_PARTS)


def _s_address(v: Any, out: list, code: Any) -> None:
    _s_parts(v, out, code, _ADDRESS_PARTS)


def _t_prim(v: Any, out: list, code: Any, system: str | None = None) -> None:
    if v.__class__ is str and v:
        out.append((code, system, v, None))


def _t_bool(v: Any, out: list, code: Any) -> None:
    if v is True:
        out.append((code, None, "true", None))
    elif v is False:
        out.append((code, None, "false", None))


def _t_int(v: Any, out: list, code: Any) -> None:
    if v.__class__ is int or v.__class__ is Decimal:
        out.append((code, None, str(v), None))


def _t_coding(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    system = v.get("system")
    c = v.get("code")
    d = v.get("display")
    text = _norm(d) if d.__class__ is str and d else None
    if system is not None or c is not None or text is not None:
        out.append((code, system, c, text))


def _t_cc(v: Any, out: list, code: Any) -> None:
    """A row per coding (text: its display, else the concept's text), plus a text-only row when the
    concept's text is carried by no coding row, so ``:text`` finds ``CodeableConcept.text``."""
    if v.__class__ is not dict:
        return
    t = v.get("text")
    ntext = _norm(t) if t.__class__ is str and t else None
    carried = False
    codings = v.get("coding")
    if codings:
        for c in codings if codings.__class__ is list else (codings,):
            if c.__class__ is not dict:
                continue
            system = c.get("system")
            cc = c.get("code")
            d = c.get("display")
            text = _norm(d) if d.__class__ is str and d else ntext
            if system is not None or cc is not None or text is not None:
                out.append((code, system, cc, text))
                carried = carried or (text is not None and text == ntext)
    if ntext is not None and not carried:
        out.append((code, None, None, ntext))


def _t_identifier(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    system = v.get("system")
    value = v.get("value")
    if system is None and value is None:
        return
    typ = v.get("type")
    t = typ.get("text") if typ.__class__ is dict else None
    out.append((code, system, value, _norm(t) if t.__class__ is str and t else None))


def _t_contactpoint(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        value = v.get("value")
        if value is not None:
            out.append((code, v.get("system"), value, None))


def _reference_builders(
    refs: _RefTypes, known: frozenset[str]
) -> tuple[Callable[..., None], Callable[..., None]]:
    """Reference and inline-resource builders bound to the set of real resource types."""

    def r_reference(v: Any, out: list, code: Any) -> None:
        if v.__class__ is not dict:
            return
        ref = v.get("reference")
        ident = v.get("identifier")
        isys = ival = None
        if ident.__class__ is dict:
            isys = ident.get("system")
            ival = ident.get("value")
        if ref.__class__ is str and ref and ref[0] != "#":
            t, i = refs[ref]
            out.append((code, t, i, ref, isys, ival))
        elif isys is not None or ival is not None:
            out.append((code, None, None, None, isys, ival))

    def r_inline(v: Any, out: list, code: Any) -> None:
        if v.__class__ is dict:
            rt = v.get("resourceType")
            rid = v.get("id")
            if rt in known and rid.__class__ is str:
                out.append((code, rt, rid, None, None, None))

    return r_reference, r_inline


def _r_uri(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str and v:
        out.append((code, None, None, v, None, None))


def _d_prim(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str:
        r = _DATES[v]
        if r is not None:
            out.append((code, r[0], r[1]))


def _d_period(v: Any, out: list, code: Any) -> None:
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
    out.append((code, lo, hi))


def _d_timing(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    events = v.get("event")
    if events.__class__ is list:
        for e in events:
            _d_prim(e, out, code)
    repeat = v.get("repeat")
    if repeat.__class__ is dict and "boundsPeriod" in repeat:
        _d_period(repeat["boundsPeriod"], out, code)


def _n_num(v: Any, out: list, code: Any) -> None:
    r = _num_range(v)
    if r is not None:
        out.append((code, r[0], r[1], r[2]))


def _n_range(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        for end in (v.get("low"), v.get("high")):
            if end.__class__ is dict:
                _n_num(end.get("value"), out, code)


def _n_quantity(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        _n_num(v.get("value"), out, code)


def _q_quantity(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    r = _num_range(v.get("value"))
    if r is not None:
        out.append((code, r[2], r[0], r[1], v.get("system"), v.get("code"), v.get("unit")))


def _q_money(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    r = _num_range(v.get("value"))
    if r is not None:
        cur = v.get("currency")
        out.append((code, r[2], r[0], r[1], _ISO4217 if cur is not None else None, cur, cur))


def _q_range(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        for end in (v.get("low"), v.get("high")):
            _q_quantity(end, out, code)


def _u_uri(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str and v:
        out.append((code, v))


def _builders(ptype: str, refs: _RefTypes, known: frozenset[str]) -> dict[str, Callable[..., None]]:
    """FHIR type -> row builder, for one search parameter type. Types absent here give no rows."""
    b: dict[str, Callable[..., None]] = {}
    if ptype == "string":
        b.update(dict.fromkeys(_STRINGISH, _s_prim), HumanName=_s_name, Address=_s_address)
    elif ptype == "token":
        b.update(dict.fromkeys(_STRINGISH, _t_prim))
        b.update(dict.fromkeys(("integer", "positiveInt", "unsignedInt"), _t_int))
        b.update(
            boolean=_t_bool,
            Coding=_t_coding,
            CodeableConcept=_t_cc,
            Identifier=_t_identifier,
            ContactPoint=_t_contactpoint,
        )
    elif ptype == "reference":
        r_reference, r_inline = _reference_builders(refs, known)
        b.update(dict.fromkeys(_URIISH, _r_uri), Reference=r_reference)
        b.update(dict.fromkeys((*known, "Resource", "DomainResource"), r_inline))
    elif ptype == "date":
        b.update(dict.fromkeys(_DATEISH, _d_prim), Period=_d_period, Timing=_d_timing)
    elif ptype == "number":
        b.update(dict.fromkeys(_NUMERIC, _n_num), Range=_n_range)
        b.update(dict.fromkeys(_QUANTITIES, _n_quantity))
    elif ptype == "quantity":
        b.update(dict.fromkeys(_QUANTITIES, _q_quantity), Money=_q_money, Range=_q_range)
    elif ptype == "uri":
        b.update(dict.fromkeys(_URIISH | {"string"}, _u_uri))
    return b


def _component_json(parts: tuple[list, ...]) -> str:
    """Compact JSON of a composite row: per component, its rows minus the code, deduped and sorted."""
    values = []
    for rows in parts:
        if len(rows) == 1:
            values.append([rows[0][1:]])
        else:
            values.append(sorted(dict.fromkeys(r[1:] for r in rows), key=repr))
    return orjson.dumps(values).decode()


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


def _ref_type_is(v: Any, rtype: str, refs: _RefTypes) -> bool:
    """``where(resolve() is X)`` on a Reference: the type named by its reference string."""
    if v.__class__ is not dict:
        return False
    ref = v.get("reference")
    return ref.__class__ is str and refs[ref][0] == rtype


def _has_ext(v: Any, url: str) -> bool:
    exts = v.get("extension") if v.__class__ is dict else None
    return exts.__class__ is list and any(e.__class__ is dict and e.get("url") == url for e in exts)


Final = Callable[[str, int], None]


class _Gen:
    """Source of one generated function: nested loops over the JSON, builder calls at the leaves."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"_ref_type_is": _ref_type_is, "_has_ext": _has_ext}
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
            self.emit(depth, f"if _ref_type_is({var}, {op[1]!r}, {self.const(op[2])}):")
            self._linear(rest, var, depth + 1, final, simple)
        elif kind == "hasext":
            self.emit(depth, f"if _has_ext({var}, {op[1]!r}):")
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


@dataclass(slots=True)
class _TypePlan:
    """Everything precomputed for one resource type."""

    fn: Callable[[Any, Any], dict[str, list[tuple]]]
    compiled: tuple[str, ...]  # param codes run as generated walkers
    fallback: tuple[str, ...]  # param codes run through fhirpathpy


# ------------------------------------------------------------------------------------------------
# The extractor
# ------------------------------------------------------------------------------------------------


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
        self._refs = _RefTypes(self._known)
        self._plans: dict[str, _TypePlan] = {}
        self._builders = {ptype: _builders(ptype, self._refs, self._known) for ptype in TABLES}
        self._type2parent: dict[str, str] | None = None
        self._binding_systems: dict[str, str | None] = {}
        self._ext_value_types = {"value" + _cap(t): t for t in spec.elements["Extension.value[x]"].types}
        self._fhirpath: _FhirpathEngine | None = None
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
        gen = _Gen()
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
            except _Unsupported:
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

    def _emit_param(self, gen: _Gen, rt: str, p: SearchParam, out: str) -> None:
        """Emit one param's walk into ``gen`` (inside its try block); raises _Unsupported."""
        assert p.expression is not None
        root_alt = _Alt((), rt, rt, None)
        alts = self._typed(_Parser(p.expression).parse(), root_alt, rt)
        code = repr(p.code)
        if p.type != "composite":
            self._emit_alts(gen, alts, p.type, 2, out, code)
            if gen.lines[-1].strip() == "try:":
                gen.emit(2, "pass")
            return
        comps = [(_Parser(expr).parse(), ctype) for expr, ctype in self._components(p)]
        for alt in alts:
            elem_alt = _Alt((), alt.ctx, alt.type, alt.elem)
            typed = [(self._typed(paths, elem_alt, rt), ctype) for paths, ctype in comps]
            cvars = [gen.var("p") for _ in typed]

            def leaf(v: str, d: int, typed=typed, cvars=cvars) -> None:
                # innermost first: the last component (the value) is the one most often empty
                for j in range(len(typed) - 1, -1, -1):
                    calts, ctype = typed[j]
                    gen.emit(d, f"{cvars[j]} = []")
                    self._emit_alts(gen, calts, ctype, d, cvars[j], "None", start=v)
                    gen.emit(d, f"if {cvars[j]}:")
                    d += 1
                gen.emit(d, f"{out}.append(({code}, _component_json(({', '.join(cvars)},))))")

            gen.walk(alt.ops, "node", 2, leaf, False)
        gen.ns["_component_json"] = _component_json
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
        self, gen: _Gen, alts: list[_Alt], ptype: str, depth: int, out: str, code: str, start: str = "node"
    ) -> None:
        for alt in alts:
            call = self._builder_call(gen, alt, ptype, out, code)
            if call is not None:  # else a type this param type cannot index (e.g. SampledData)
                gen.walk(alt.ops, start, depth, lambda v, d, call=call: gen.emit(d, call.format(v)), True)

    def _builder_call(self, gen: _Gen, alt: _Alt, ptype: str, out: str, code: str) -> str | None:
        if alt.type == "Extension":
            return f"{gen.const(self._extension_builders(ptype))}({{}}, {out}, {code})"
        b = self._builders[ptype].get(alt.type)
        if b is None:
            return None
        if b is _t_prim:
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

    # -- typing -----------------------------------------------------------------------------------
    def _typed(self, paths: list[_Path], ctx: _Alt, rt: str) -> list[_Alt]:
        """Typed walks of parsed union branches, starting at ``ctx``; other types' branches dropped."""
        out: list[_Alt] = []
        for path in paths:
            at_root = ctx.type == rt and not ctx.ops
            if path.start is None or path.start == ctx.type or (at_root and path.start in _ABSTRACT):
                alts = [ctx]
            elif path.start == "%resource":
                alts = [_Alt((("root",),), rt, rt, None)]
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
            yield _Alt((*a.ops, ("resolve_is", step[1], self._refs)), a.ctx, a.type, a.elem)
        elif kind in ("hasext", "index"):
            yield _Alt((*a.ops, step), a.ctx, a.type, a.elem)
        else:  # pragma: no cover - the parser only produces the kinds above
            raise _Unsupported(kind)

    def _is_subtype(self, t: str, want: str) -> bool:
        """FHIRPath ``is``: the type or one it derives from (fhirpathpy's R4 model hierarchy)."""
        if self._type2parent is None:
            from fhirpathpy.models import models

            self._type2parent = {**models["r4"]["type2Parent"], **_QUANTITY_PARENTS}
        cur: str | None = t
        for _ in range(32):
            if cur == want:
                return True
            if cur is None:
                return False
            cur = self._type2parent.get(cur)
        return False

    # -- fhirpathpy fallback ----------------------------------------------------------------------
    def _fhirpath_fn(self, rt: str, p: SearchParam) -> Callable[[Any, Any, list], None]:
        fn = self._fhirpath_fns.get((rt, p.code))
        if fn is None:
            if self._fhirpath is None:
                self._fhirpath = _FhirpathEngine(self)
            fn = self._fhirpath_fns[(rt, p.code)] = self._fhirpath.param_fn(rt, p)
        return fn


# ------------------------------------------------------------------------------------------------
# fhirpathpy, fixed
# ------------------------------------------------------------------------------------------------

_AS_OP_RE = re.compile(r"\s+as\s+([A-Za-z]+)")
_AS_FN_RE = re.compile(r"\.as\(\s*([A-Za-z]+)\s*\)")
_SYSTEM_TYPE_ARG_RE = re.compile(r"ofType\((" + "|".join(_SYSTEM_TYPES) + r")\)")
_RESOURCE_PREFIX_RE = re.compile(r"(?<![A-Za-z.])(?:Domain)?Resource\.")
_LEADING_TYPE_RE = re.compile(r"^[\s(]*([A-Z][A-Za-z]*)\b")


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
                        out.append((code, _component_json(tuple(parts))))

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
        if system is not None and b is _t_prim:
            _t_prim(value, out, code, system)
        else:
            b(value, out, code)

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
