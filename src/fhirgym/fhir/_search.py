"""FHIR search: parse a query string into SQL over the index tables, following R4 semantics.

Every parameter type (string, token, reference, date, number, quantity, uri, composite), the
modifiers and prefixes of the specification, chains and reverse chains (``_has``) compile to nested
``id IN (...)`` subqueries over the layered store (see :func:`._store.merged`). Composite parameters
reuse the same predicate builders over the JSON rows of ``ix_composite`` via ``json_each``, so there is
one definition of what "matches" means per type.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field

import orjson

from ..spec import SearchParam, Spec
from ._errors import FhirError, bad_request
from ._store import BOTH, INDEX_TABLES, TABLE_FOR_TYPE, Store, merged
from ._values import date_range, normalize_string, number_range

#: Result parameters handled by the search driver, not by the index.
CONTROL_PARAMS = frozenset(
    {
        "_count", "_sort", "_include", "_revinclude", "_summary", "_total", "_elements", "_format",
        "_pretty", "_getpages", "_getpagesoffset", "_offset", "_contained", "_containedType", "_totalMethod",
    }
)

#: Modifiers we implement, per parameter type (anything else is rejected with 400).
MODIFIERS: dict[str, frozenset[str]] = {
    "string": frozenset({"exact", "contains", "missing"}),
    "token": frozenset({"not", "text", "missing", "in", "not-in"}),
    "reference": frozenset({"identifier", "missing"}),  # plus :Type, checked separately
    "date": frozenset({"missing"}),
    "number": frozenset({"missing"}),
    "quantity": frozenset({"missing"}),
    "uri": frozenset({"below", "above", "missing"}),
    "composite": frozenset({"missing"}),
}

PREFIXES = ("eq", "ne", "gt", "lt", "ge", "le", "sa", "eb", "ap")
_MAX_CHAIN = 4
_MAX_OR_VALUES = 100

# Limits of one search, checked while parsing so that exceeding one is a 400 naming it: beyond them
# SQLite fails (expression trees deeper than 1000, joins of more than 64 tables, LIKE patterns over
# 50,000 bytes: a 500) or the query runs for minutes. Each is far above what a real client sends.

#: Search criteria per request: every parameter counts one, and so does every level of a chain or
#: ``_has`` for every target type it is tried on (``Task?subject.derived-from._id`` alone is 1,324,
#: which took 1 s; one more level took 74 s). 1,000 plain parameters exceed SQLite's expression depth.
MAX_CRITERIA = 300
#: Values per request: every comma-separated value of every parameter, again for each target type of a
#: chain or ``_has``. SQLite looks parameters up by name linearly, so preparing a query costs the square
#: of their number: 1,000 quantity values (4,000 parameters) take 0.3 s, 6,000 took 16 s.
MAX_VALUES = 1000
#: ``_sort`` keys, over all ``_sort`` parameters (each is a join).
MAX_SORT_KEYS = 16
#: Characters of one search value (one item of a comma-separated list).
MAX_VALUE_LENGTH = 4096


class SqlParams:
    """Accumulates named SQL parameters so predicate text can appear in several UNION branches."""

    def __init__(self, sides: tuple[str, ...] = BOTH) -> None:
        self.values: dict[str, object] = {}
        self.ctes: list[str] = []  # ``name AS (select)``, in dependency order
        self.sides = sides  # schemas holding rows (:meth:`Store.sides`); both is always correct
        self.criteria = 0  # criteria compiled so far, for MAX_CRITERIA
        self.searched = 0  # values compiled so far, for MAX_VALUES
        self.key = ""  # the query parameter being compiled, for error messages
        self._names: dict[tuple[type, object], str] = {}

    def count_criterion(self) -> None:
        """Charge one criterion against :data:`MAX_CRITERIA`."""
        self.criteria += 1
        if self.criteria > MAX_CRITERIA:
            raise bad_request(
                f"Too many search criteria at '{self.key}': at most {MAX_CRITERIA} per search, where every "
                "parameter counts one and so does every level of a chain or _has for each target type",
                "too-costly",
            )

    def count_values(self, n: int) -> None:
        """Charge the ``n`` values of one criterion against :data:`MAX_VALUES`."""
        self.searched += n
        if self.searched > MAX_VALUES:
            raise bad_request(
                f"Too many search values at '{self.key}': at most {MAX_VALUES} per search, counting every "
                "comma-separated value, again for each target type of a chain or _has",
                "too-costly",
            )

    def merged(self, table: str, where: str = "", cols: str = "*") -> str:
        """:func:`merged` over the schemas this query runs on."""
        return merged(table, where, cols, self.sides)

    def __call__(self, value: object) -> str:
        key = (type(value), value)  # one parameter per distinct value: each costs SQLite a linear look-up
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"p{len(self.values)}"
            self.values[name] = value
        return f":{name}"

    def cte(self, select: str) -> str:
        """Name a subquery (``WITH cN AS (...)``) instead of nesting it: chains and ``_has`` three levels
        deep nested inline overflow SQLite's parser stack (a 500), and each level would be copied into
        both branches of :func:`merged`."""
        name = f"c{len(self.ctes)}"
        self.ctes.append(f"{name} AS ({select})")
        return name


def check_format(value: str) -> None:
    """``_format``: JSON in any of its spellings; anything else is 406."""
    if value not in ("json", "application/json", "application/fhir+json", "application/json+fhir"):
        raise FhirError(406, f"Only JSON is supported (_format={value!r})", "not-supported")


def split_or(value: str) -> list[str]:
    """Split a parameter value on unescaped commas; ``\\,`` ``\\$`` ``\\|`` ``\\\\`` are escapes."""
    return _split_unescaped(value, ",")


def _split_unescaped(value: str, sep: str) -> list[str]:
    if "\\" not in value:  # the usual case: a plain split, not a walk over every character
        return value.split(sep)
    out: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            cur.append(c + value[i + 1])
            i += 2
            continue
        if c == sep:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


def unescape(value: str) -> str:
    if "\\" not in value:
        return value
    out: list[str] = []
    i = 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            out.append(value[i + 1])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _like_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


#: SQLite's limit on a LIKE pattern, in UTF-8 bytes (SQLITE_MAX_LIKE_PATTERN_LENGTH; above it the query
#: fails). MAX_VALUE_LENGTH keeps ordinary values far below it, but normalisation can expand a
#: character (NFKD turns U+FDFA into 18) and escaping doubles '%' and '_'.
_MAX_LIKE_BYTES = 50_000


def _like(column: str, pattern: str, P: SqlParams, code: str) -> str:
    """``column LIKE pattern`` (``\\`` escapes), or a 400 when SQLite would refuse the pattern."""
    if len(pattern.encode()) > _MAX_LIKE_BYTES:
        raise bad_request(f"'{code}': search value too long once normalised (at most {_MAX_LIKE_BYTES} bytes)",
                          "too-long")
    return f"{column} LIKE {P(pattern)} ESCAPE '\\'"


def _blank(part: str) -> bool:
    """A component (of a token, identifier or quantity) that is given but only whitespace: no FHIR
    system or code is, so it is an error rather than a condition that silently matches nothing."""
    return bool(part) and not part.strip()


def summary_mode(value: str, modes: tuple[str, ...] = ("true", "false", "text", "data", "count")) -> str:
    """A checked ``_summary`` value (a read takes all but ``count``)."""
    if value not in modes:
        raise bad_request(f"_summary must be one of {', '.join(modes)}; got {value!r}", "invalid", ("_summary",))
    return value


#: distinct names one ``_elements`` may list: the largest R4 resource has fewer than a hundred elements,
#: a few hundred with every choice type spelled out (``valueQuantity`` ...)
MAX_ELEMENTS = 1000


def element_names(value: str) -> list[str]:
    """The distinct names of a checked ``_elements`` value (400 beyond :data:`MAX_ELEMENTS`)."""
    names = list(dict.fromkeys(e.strip() for e in value.split(",") if e.strip()))
    if len(names) > MAX_ELEMENTS:
        raise bad_request(f"_elements lists {len(names)} names; the server takes at most {MAX_ELEMENTS}",
                          "too-costly", ("_elements",))
    nested = [e for e in names if not e.replace("_", "").isalnum() or not e.isascii()]
    if nested:  # R4's _elements names top-level elements only; 'name.family' used to keep nothing
        raise bad_request(f"_elements takes top-level element names, got {nested[:10]}", "not-supported",
                          ("_elements",))
    return names


def non_negative_int(value: str, name: str) -> int:
    """A count or offset given in a request: ASCII digits only (``int`` also takes '+5', ' 5', '1_0' and
    non-ASCII digits such as '١'), capped at 10**18 (``int`` of over 4,300 digits raises; every caller
    caps far lower anyway)."""
    if not (value.isascii() and value.isdigit()):
        raise bad_request(f"{name} must be a non-negative integer, got {value!r}", "invalid", (name,))
    digits = value.lstrip("0")
    return int(digits or "0") if len(digits) <= 18 else 10**18


def _among(rtype: str, ids: list[str], P: SqlParams) -> str:
    """The rows of these resources of one type. The ids travel as one JSON array parameter: the SQL text
    is the same for every list, so SQLite reuses the prepared statement (a page of 50 as 50 parameters
    cost 60 % more)."""
    return f"rtype = {P(rtype)} AND id IN (SELECT value FROM json_each({P(orjson.dumps(ids).decode())}))"


def _prefix(value: str) -> tuple[str, str]:
    if len(value) >= 2 and value[:2] in PREFIXES and (len(value) == 2 or not value[2].isalpha()):
        return value[:2], value[2:]
    return "eq", value


@dataclass(frozen=True)
class Criterion:
    """One parsed ``name[:modifier]=v1,v2`` (or chain / _has) term: a SELECT of ids (column ``id``) that
    match (``positive``) or whose complement matches (``:not``, ``:missing=true``)."""

    positive: bool
    sql: str
    #: the ids are index rows of the searched type, hence of its current, live resources (not so for
    #: ``_has``, whose ids are reference targets, which may be missing or deleted)
    own: bool = True


@dataclass
class SearchRequest:
    """What a search asks for, after parsing and validating the query."""

    rtype: str
    where: list[Criterion]
    count: int | None
    sort: list[tuple[str, bool]]  # (param code, descending)
    include: list[tuple[str, str, str | None, bool]]  # (source type, param, target type, iterate)
    revinclude: list[tuple[str, str, str | None, bool]]
    summary: str | None
    elements: list[str] | None
    total: str
    ignored: list[str] = field(default_factory=list)
    params: SqlParams = field(default_factory=SqlParams)


class SearchEngine:
    """Compiles queries against the official search parameters and runs them on a store."""

    def __init__(self, spec: Spec, unsupported: dict[tuple[str, str], str], base_url: str = "") -> None:
        self.spec = spec
        self.unsupported = unsupported
        self.base_url = base_url.rstrip("/")
        self.now = time.time  # for the ``ap`` prefix on dates; a frozen clock replaces it
        self._valuesets: dict[str, str] = {}  # see _valueset_json

    # -- parameter lookup --------------------------------------------------------------------------
    def param(self, rtype: str, code: str) -> SearchParam:
        p = self.spec.search_params(rtype).get(code)
        if p is None:
            raise bad_request(f"Unknown search parameter '{code}' for resource type {rtype}"
                              + self._suggest(rtype, code), "not-supported")
        reason = self.unsupported.get((rtype, code))
        if reason is not None:
            raise bad_request(f"Search parameter '{code}' of {rtype} is not supported: {reason}", "not-supported")
        return p

    def _suggest(self, rtype: str, code: str) -> str:
        """What the client may have meant: the close names, and every parameter the type has (an agent
        that guessed a name can correct itself from the error alone)."""
        names = sorted(p.code for p in self.supported_params(rtype))
        close = difflib.get_close_matches(code, [*names, *sorted(CONTROL_PARAMS)], n=3, cutoff=0.75)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return f"{hint} ({rtype}'s search parameters here: {', '.join(names)})"

    def supported_params(self, rtype: str) -> list[SearchParam]:
        return [
            p for code, p in sorted(self.spec.search_params(rtype).items())
            if (rtype, code) not in self.unsupported and p.expression
        ]

    # -- parsing -----------------------------------------------------------------------------------
    def parse(self, rtype: str, query: list[tuple[str, str]], lenient: bool = False,
              sides: tuple[str, ...] = BOTH) -> SearchRequest:
        """``sides``: :meth:`Store.sides` of the store the request will run on (its SQL is built for it)."""
        params = SqlParams(sides)
        req = SearchRequest(rtype, [], None, [], [], [], None, None, "accurate", params=params)
        for key, value in query:
            try:
                self._parse_one(req, key, value)
            except FhirError as err:
                if lenient and err.code == "not-supported":
                    req.ignored.append(f"{key}: {err.diagnostics}")
                    continue
                raise
        return req

    def _parse_one(self, req: SearchRequest, key: str, value: str) -> None:
        rtype = req.rtype
        if key in CONTROL_PARAMS:
            self._parse_control(req, key, value)
            return
        base, _, mod = key.partition(":")
        if base in ("_include", "_revinclude"):
            if mod not in ("iterate", "recurse"):  # recurse: the STU3 name of iterate
                raise bad_request(f"Modifier ':{mod}' is not supported on {base} (only :iterate)", "not-supported")
            (req.include if base == "_include" else req.revinclude).append(self._parse_include(base, value, True))
            return
        req.params.key = key
        if key.startswith("_has:"):
            req.where.append(self._has(rtype, key, value, req.params, 0))
            return
        req.where.append(self._criterion(rtype, key, value, req.params, 0))

    def _parse_control(self, req: SearchRequest, key: str, value: str) -> None:
        if key == "_count":
            req.count = non_negative_int(value, "_count")
        elif key == "_sort":
            for item in value.split(","):
                item = item.strip()
                if not item:
                    continue
                desc = item.startswith("-")
                code = item[1:] if desc else item
                p = self.param(req.rtype, code)
                if p.type == "composite":
                    raise bad_request(f"Cannot sort on composite parameter '{code}'", "not-supported")
                if len(req.sort) >= MAX_SORT_KEYS:
                    raise bad_request(f"Too many _sort keys: at most {MAX_SORT_KEYS}", "too-costly")
                req.sort.append((code, desc))
        elif key in ("_include", "_revinclude"):
            req_list = req.include if key == "_include" else req.revinclude
            req_list.append(self._parse_include(key, value))
        elif key == "_summary":
            req.summary = summary_mode(value)
        elif key == "_elements":
            req.elements = element_names(value)
        elif key == "_total":
            if value not in ("none", "estimate", "accurate"):
                raise bad_request(f"_total must be none, estimate or accurate; got {value!r}")
            req.total = value
        elif key == "_format":
            check_format(value)
        elif key in ("_contained", "_containedType", "_offset"):
            raise bad_request(f"Search control parameter '{key}' is not supported", "not-supported")
        elif key == "_totalMethod" and value not in ("count", "estimated", "accurate", "none"):
            # HAPI's name for _total, sent by common clients (fhirpy's count()); valid values pass
            raise bad_request(f"_totalMethod must be count, estimated, accurate or none; got {value!r}")
        # _pretty: accepted and ignored; _getpages handled by the server

    def _parse_include(self, key: str, value: str, iterate: bool = False) -> tuple[str, str, str | None, bool]:
        parts = value.split(":")
        if parts[-1] in ("iterate", "recurse"):
            raise bad_request(f"{key} modifier goes on the parameter name, e.g. {key}:iterate={value}")
        if value == "*":
            if key == "_revinclude":
                raise bad_request("_revinclude=* is not supported: name the source type, e.g. _revinclude=Provenance:*",
                                  "not-supported")
            return ("*", "*", None, iterate)
        if len(parts) not in (2, 3):
            raise bad_request(f"{key}={value!r}: expected SourceType:searchParam[:TargetType]")
        src, code = parts[0], parts[1]
        target = parts[2] if len(parts) == 3 else None
        if not self.spec.is_resource_type(src):
            raise bad_request(f"{key}={value!r}: unknown resource type {src}", "not-supported")
        if code != "*":  # Type:* = every reference parameter of Type
            p = self.param(src, code)
            if p.type != "reference":
                raise bad_request(f"{key}={value!r}: '{code}' is not a reference parameter", "not-supported")
        if target is not None and not self.spec.is_resource_type(target):
            raise bad_request(f"{key}={value!r}: unknown target type {target}", "not-supported")
        return (src, code, target, iterate)

    # -- criteria ----------------------------------------------------------------------------------
    def _criterion(self, rtype: str, key: str, value: str, P: SqlParams, depth: int) -> Criterion:
        """One ``name[:mod][.chain]=value`` term as a set of ids of ``rtype`` (or its complement)."""
        if depth > _MAX_CHAIN:
            raise bad_request(f"Chain too deep in '{key}'")
        P.count_criterion()
        head, dot, rest = key.partition(".")
        name, _, modifier = head.partition(":")
        p = self.param(rtype, name)
        if dot:
            if p.type != "reference":
                raise bad_request(f"Cannot chain on non-reference parameter '{name}'")
            targets = self._chain_targets(p, modifier, rtype)
            alts = []
            inner_code = rest.partition(".")[0].partition(":")[0]
            for target in targets:
                if len(targets) > 1 and inner_code not in self.spec.search_params(target):
                    continue  # the chained parameter does not exist on this target type
                # other errors (bad value, modifier, depth) are the client's to see, not a reason to skip
                inner = self._criterion(target, rest, value, P, depth + 1)
                inner_ids = P.cte(self.id_set(target, [inner], P))
                ref_where = (
                    f"rtype = {P(rtype)} AND param = {P(name)} AND target_type = {P(target)} "
                    f"AND target_id IN (SELECT id FROM {inner_ids})"
                )
                alts.append(f"SELECT id FROM ({P.merged('ix_reference', ref_where, 'id')})")
            if not alts:
                raise bad_request(f"Chained parameter '{rest}' exists on none of {', '.join(targets)}")
            return Criterion(True, " UNION ".join(alts))
        values = split_or(value)
        if len(values) > _MAX_OR_VALUES:
            raise bad_request(f"Too many values for '{key}' (at most {_MAX_OR_VALUES})")
        P.count_values(len(values))
        for v in values:
            if len(v) > MAX_VALUE_LENGTH:
                raise bad_request(
                    f"Value of '{key}' is {len(v)} characters long: at most {MAX_VALUE_LENGTH}", "too-long"
                )
        if modifier == "missing":
            if value not in ("true", "false"):
                raise bad_request(f"{key} must be true or false, got {value!r}")
            return Criterion(value == "false", self._rows(rtype, p, "1", P))
        self._check_modifier(p, modifier, rtype)
        if p.type == "token" and modifier in ("not", "not-in"):
            positive = "in" if modifier == "not-in" else ""
            conds = [self._value_pred(rtype, p, positive, v, P) for v in values]
            return Criterion(False, self._rows(rtype, p, " OR ".join(f"({c})" for c in conds), P))
        if p.type == "composite":
            return Criterion(True, " UNION ".join(self._composite_set(rtype, p, v, P) for v in values))
        conds = [self._value_pred(rtype, p, modifier, v, P) for v in values]
        return Criterion(True, self._rows(rtype, p, " OR ".join(f"({c})" for c in conds), P))

    def id_set(self, rtype: str, criteria: list[Criterion], P: SqlParams) -> str:
        """SELECT of the ids of ``rtype`` meeting every criterion (duplicates possible: every use is an
        ``IN``). The first positive set is scanned and the others probed through ``id IN (...)``: SQLite
        builds one temporary index per probed set, where ``INTERSECT`` sorts every set, the scanned one
        included, which costs twice as much on a patient-scoped search. Complements are subtracted last."""
        pos = [c.sql for c in criteria if c.positive]
        neg = [c.sql for c in criteria if not c.positive]
        if pos:
            body = f"SELECT id FROM ({pos[0]})"
            if pos[1:]:
                body += " WHERE " + " AND ".join(f"id IN ({s})" for s in pos[1:])
        else:
            body = f"SELECT id FROM ({P.merged('resources', f'rtype = {P(rtype)}', 'id')})"
        if neg:
            body = f"SELECT id FROM ({body}) WHERE " + " AND ".join(f"id NOT IN ({s})" for s in neg)
        return body

    def _rows(self, rtype: str, p: SearchParam, cond: str, P: SqlParams) -> str:
        table = TABLE_FOR_TYPE[p.type]
        where = f"rtype = {P(rtype)} AND param = {P(p.code)} AND ({cond})"
        return f"SELECT id FROM ({P.merged(table, where, 'id')})"

    def _chain_targets(self, p: SearchParam, modifier: str, rtype: str) -> list[str]:
        if modifier:
            if not self.spec.is_resource_type(modifier):
                raise bad_request(f"Unknown resource type modifier ':{modifier}' on '{p.code}'")
            return [modifier]
        targets = [t for t in p.targets if self.spec.is_resource_type(t)]
        if not targets:
            raise bad_request(f"Parameter '{p.code}' of {rtype} has no target types to chain into")
        return targets

    def _check_modifier(self, p: SearchParam, modifier: str, rtype: str) -> None:
        if not modifier:
            return
        if p.type == "reference" and self.spec.is_resource_type(modifier):
            targets = [t for t in p.targets]
            if targets and modifier not in targets:
                raise bad_request(f"'{p.code}' of {rtype} cannot reference {modifier} (targets: {', '.join(targets)})")
            return
        if modifier not in MODIFIERS.get(p.type, frozenset()):
            raise bad_request(
                f"Modifier ':{modifier}' is not supported for {p.type} parameter '{p.code}'", "not-supported"
            )

    def _has(self, rtype: str, key: str, value: str, P: SqlParams, depth: int) -> Criterion:
        """``_has:Type:refParam:param=value``: resources referenced by matching resources of Type."""
        if depth > _MAX_CHAIN:
            raise bad_request("_has nested too deep")
        P.count_criterion()
        parts = key.split(":", 3)
        if len(parts) != 4 or not all(parts[1:]):
            raise bad_request(f"Malformed _has parameter '{key}': expected _has:Type:reference:parameter")
        _, src, ref_code, rest = parts
        if not self.spec.is_resource_type(src):
            raise bad_request(f"Unknown resource type '{src}' in '{key}'")
        ref = self.param(src, ref_code)
        if ref.type != "reference":
            raise bad_request(f"'{ref_code}' of {src} is not a reference parameter (in '{key}')")
        if rest.startswith("_has:"):
            inner = self._has(src, rest, value, P, depth + 1)
        else:
            inner = self._criterion(src, rest, value, P, depth + 1)
        src_ids = P.cte(self.id_set(src, [inner], P))
        where = (
            f"rtype = {P(src)} AND param = {P(ref_code)} AND target_type = {P(rtype)} "
            f"AND id IN (SELECT id FROM {src_ids})"
        )
        return Criterion(True, f"SELECT target_id AS id FROM ({P.merged('ix_reference', where, 'target_id, id, rtype')})",
                         own=False)

    # -- value predicates per type -----------------------------------------------------------------
    def _value_pred(self, rtype: str, p: SearchParam, modifier: str, raw: str, P: SqlParams,
                    cols: dict[str, str] | None = None) -> str:
        c = cols or {}

        def col(name: str) -> str:
            return c.get(name, name)

        t = p.type
        if not raw.strip():  # no type gives a blank value a meaning; as a string it would match everything
            raise bad_request(f"Empty value for search parameter '{p.code}'" + (f" ({raw!r})" if raw else ""))
        if t == "string":
            if modifier == "exact":
                return f"{col('exact')} = {P(unescape(raw))}"
            v = self._normalized(p, raw)
            if modifier == "contains":
                return _like(col("norm"), "%" + _like_escape(v) + "%", P, p.code)
            return f"({col('norm')} >= {P(v)} AND {col('norm')} < {P(v + chr(0x10FFFF))})"
        if t == "token":
            return self._token_pred(p, modifier, raw, P, col)
        if t == "reference":
            return self._reference_pred(rtype, p, modifier, raw, P, col)
        if t == "date":
            return self._date_pred(p, raw, P, col)
        if t == "number":
            prefix, num = _prefix(raw)
            try:
                lo, hi, val = number_range(num)
            except ValueError as exc:
                raise bad_request(f"'{p.code}': {raw!r} is not a number: {exc}", "value") from None
            return self._numeric_pred(prefix, lo, hi, val, col("value"), P)
        if t == "quantity":
            return self._quantity_pred(p, raw, P, col)
        if t == "uri":
            v = unescape(raw)
            if modifier == "below":
                return f"({col('uri')} = {P(v)} OR {_like(col('uri'), _like_escape(v.rstrip('/')) + '/%', P, p.code)})"
            if modifier == "above":
                prefixes = _uri_prefixes(v)
                return f"{col('uri')} IN ({', '.join(P(x) for x in prefixes)})"
            return f"{col('uri')} = {P(v)}"
        raise bad_request(f"Search parameter '{p.code}' of type {t} is not supported", "not-supported")

    @staticmethod
    def _normalized(p: SearchParam, raw: str) -> str:
        """The normalised form string and ``:text`` search compare; a value normalising to nothing (only
        combining marks, say) would match every resource, so it is refused like an empty one."""
        v = normalize_string(unescape(raw))
        if not v:
            raise bad_request(f"'{p.code}': {raw!r} has no searchable characters (it normalises to nothing)", "value")
        return v

    def _valueset_json(self, url: str) -> str | None:
        """The expansion of a ValueSet as a JSON array of [system, code] pairs (None: not expandable),
        built once per ValueSet: a large one takes milliseconds to sort and serialise."""
        canonical = url.split("|", 1)[0]  # as the spec keys them; bounded by its ValueSets
        pairs = self._valuesets.get(canonical)
        if pairs is None:
            codes = self.spec.valueset_codes(url)
            if codes is None:
                return None
            pairs = self._valuesets[canonical] = orjson.dumps(sorted(codes)).decode()
        return pairs

    def _token_pred(self, p: SearchParam, modifier: str, raw: str, P: SqlParams, col) -> str:
        if modifier == "text":
            v = _like_escape(self._normalized(p, raw))
            return f"({_like(col('text'), v + '%', P, p.code)} OR {_like(col('text'), '% ' + v + '%', P, p.code)})"
        if modifier == "in":
            pairs = self._valueset_json(unescape(raw))
            if pairs is None:
                raise bad_request(f"ValueSet {raw!r} is unknown or cannot be expanded here", "not-supported")
            # one JSON parameter, not an OR per code: a chain of thousands of ORs (c80-doc-typecodes has
            # 6,401 codes) exceeds SQLite's expression depth of 1000
            return f"({col('system')}, {col('code')}) IN (SELECT value->>0, value->>1 FROM json_each({P(pairs)}))"
        parts = _split_unescaped(raw, "|")
        if len(parts) == 1:
            return f"{col('code')} = {P(unescape(parts[0]))}"
        if len(parts) != 2 or any(_blank(x) for x in parts):
            raise bad_request(f"'{p.code}': malformed token {raw!r} (expected [system]|[code])", "value")
        system, code = unescape(parts[0]), unescape(parts[1])
        if system and code:
            return f"({col('system')} = {P(system)} AND {col('code')} = {P(code)})"
        if code:
            return f"({col('system')} IS NULL AND {col('code')} = {P(code)})"
        if system:
            return f"{col('system')} = {P(system)}"
        raise bad_request(f"'{p.code}': empty token {raw!r}", "value")

    def _reference_pred(self, rtype: str, p: SearchParam, modifier: str, raw: str, P: SqlParams, col) -> str:
        v = unescape(raw)
        if modifier == "identifier":  # token semantics, as for an identifier parameter
            parts = _split_unescaped(raw, "|")
            if len(parts) == 1:
                return f"{col('ident_value')} = {P(unescape(parts[0]))}"
            if len(parts) != 2 or any(_blank(x) for x in parts):
                raise bad_request(f"'{p.code}:identifier': malformed identifier {raw!r} (expected [system]|[value])",
                                  "value")
            system, code = unescape(parts[0]), unescape(parts[1])
            if system and code:
                return f"({col('ident_system')} = {P(system)} AND {col('ident_value')} = {P(code)})"
            if code:  # |value: an identifier without a system
                return f"({col('ident_system')} IS NULL AND {col('ident_value')} = {P(code)})"
            if system:
                return f"{col('ident_system')} = {P(system)}"
            raise bad_request(f"'{p.code}:identifier': empty identifier {raw!r}", "value")
        if modifier:  # a resource type modifier: the value is an id
            return f"({col('target_type')} = {P(modifier)} AND {col('target_id')} = {P(v)})"
        if self.base_url and v.startswith(self.base_url + "/"):
            v = v[len(self.base_url) + 1 :]
        if "://" in v or v.startswith("urn:"):
            return f"{col('url')} = {P(v)}"
        parts = v.split("/")
        if len(parts) == 1:
            return f"{col('target_id')} = {P(v)}"
        if len(parts) in (2, 4) and self.spec.is_resource_type(parts[0]) and (len(parts) == 2 or parts[2] == "_history"):
            return f"({col('target_type')} = {P(parts[0])} AND {col('target_id')} = {P(parts[1])})"
        raise bad_request(f"'{p.code}': {raw!r} is not a valid reference (id, Type/id or URL)", "value")

    def _date_pred(self, p: SearchParam, raw: str, P: SqlParams, col) -> str:
        prefix, v = _prefix(raw)
        try:
            slo, shi = date_range(v)
        except ValueError:
            raise bad_request(f"'{p.code}': {raw!r} is not a valid date/dateTime search value", "value") from None
        lo, hi = col("lo"), col("hi")
        a, b = P(slo), P(shi)
        if prefix == "eq":
            return f"({lo} >= {a} AND {hi} <= {b})"
        if prefix == "ne":
            return f"({lo} < {a} OR {hi} > {b})"
        if prefix == "gt":
            return f"{hi} > {b}"
        if prefix == "lt":
            return f"{lo} < {a}"
        if prefix == "ge":
            return f"({hi} > {b} OR ({lo} >= {a} AND {hi} <= {b}))"
        if prefix == "le":
            return f"({lo} < {a} OR ({lo} >= {a} AND {hi} <= {b}))"
        if prefix == "sa":
            return f"{lo} >= {b}"
        if prefix == "eb":
            return f"{hi} <= {a}"
        # ap: within 10 % of the distance from now (at least the value's own precision)
        gap = max(abs(self.now() - (slo + shi) / 2) * 0.1, shi - slo)
        return f"({lo} < {P(shi + gap)} AND {hi} > {P(slo - gap)})"

    @staticmethod
    def _numeric_pred(prefix: str, lo: float, hi: float, val: float, column: str, P: SqlParams) -> str:
        if prefix == "eq":
            return f"({column} >= {P(lo)} AND {column} < {P(hi)})"
        if prefix == "ne":
            return f"({column} < {P(lo)} OR {column} >= {P(hi)})"
        if prefix in ("gt", "sa"):
            return f"{column} > {P(val)}"
        if prefix in ("lt", "eb"):
            return f"{column} < {P(val)}"
        if prefix == "ge":
            return f"{column} >= {P(val)}"
        if prefix == "le":
            return f"{column} <= {P(val)}"
        gap = abs(val) * 0.1 or (hi - lo)
        return f"({column} >= {P(val - gap)} AND {column} <= {P(val + gap)})"

    def _quantity_pred(self, p: SearchParam, raw: str, P: SqlParams, col) -> str:
        parts = _split_unescaped(raw, "|")
        if len(parts) not in (1, 3) or any(_blank(x) for x in parts):
            raise bad_request(f"'{p.code}': malformed quantity {raw!r} (expected [prefix]number[|system|code])", "value")
        prefix, num = _prefix(parts[0])
        try:
            lo, hi, val = number_range(num)
        except ValueError as exc:
            raise bad_request(f"'{p.code}': {raw!r} does not start with a number: {exc}", "value") from None
        conds = [self._numeric_pred(prefix, lo, hi, val, col("value"), P)]
        if len(parts) == 3:
            system, code = unescape(parts[1]), unescape(parts[2])
            if system:
                conds.append(f"{col('system')} = {P(system)}")
                if code:
                    conds.append(f"{col('code')} = {P(code)}")
            elif code:
                conds.append(f"({col('code')} = {P(code)} OR {col('unit')} = {P(code)})")
        return "(" + " AND ".join(conds) + ")"

    def _composite_set(self, rtype: str, p: SearchParam, raw: str, P: SqlParams) -> str:
        values = _split_unescaped(raw, "$")
        if len(values) != len(p.components):
            raise bad_request(
                f"'{p.code}' needs {len(p.components)} components separated by '$', got {raw!r}", "value"
            )
        exists = []
        for k, (comp, v) in enumerate(zip(p.components, values)):
            sub = self.spec.search_params_by_url.get(comp.definition)
            if sub is None or sub.type == "composite":
                raise bad_request(f"Composite '{p.code}' has an unusable component", "not-supported")
            names = INDEX_TABLES[TABLE_FOR_TYPE[sub.type]]
            cols = {n: f"c{k}.value->>{i}" for i, n in enumerate(names)}
            pred = self._value_pred(rtype, sub, "", v, P, cols)
            exists.append(f"EXISTS (SELECT 1 FROM json_each(comp, '$[{k}]') c{k} WHERE {pred})")
        where = f"rtype = {P(rtype)} AND param = {P(p.code)}"
        return f"SELECT id FROM ({P.merged('ix_composite', where, 'id, comp')}) WHERE {' AND '.join(exists)}"

    # -- execution ---------------------------------------------------------------------------------
    def find(self, store: Store, rtype: str, query: list[tuple[str, str]]) -> list[str]:
        """Ids of ``rtype`` matching ``query`` on ``store`` (parse + :meth:`ids`), in result order."""
        return self.ids(store, self.parse(rtype, query, sides=store.sides()))

    def ids(self, store: Store, req: SearchRequest) -> list[str]:
        """All matching ids of ``req.rtype`` in result order."""
        P = req.params
        positive = [c for c in req.where if c.positive]
        if not req.sort and P.sides == ("base",) and store.uniform_base:
            # a pristine world: the default order (lastUpdated, id) is the id order, and the matching ids
            # (index rows of this type: live resources) need no look-up in the resource table
            # The ids come back as one JSON array, deduplicated and sorted here (Python's order of str is
            # SQLite's BINARY order of their UTF-8): a row per id cost Python's sqlite3 ≈ 1.2 µs, and an ORDER
            # BY let SQLite pick an index yielding ids in order at a table look-up per row over the covering
            # one that fits the criteria (Observation?date=ge2020 on a 100-patient world: 252 ms, not 69).
            if req.where and positive and positive[0].own:
                ids = P.cte(self.id_set(req.rtype, req.where, P))
                sql = f"WITH {', '.join(P.ctes)} SELECT json_group_array(id) FROM {ids}"
                return sorted(set(orjson.loads(store.query(sql, P.values)[0][0])))
            if not req.where:  # the whole type
                sql = f"SELECT json_group_array(id) FROM base.resources WHERE rtype = {P(req.rtype)} AND deleted = 0"
                return sorted(orjson.loads(store.query(sql, P.values)[0][0]))
        t = P(req.rtype)
        where = f"rtype = {t}"
        if req.where:
            where += f" AND id IN (SELECT id FROM {P.cte(self.id_set(req.rtype, req.where, P))})"
        joins, order = [], []
        for n, (code, desc) in enumerate(req.sort):
            direction = "DESC" if desc else "ASC"
            if code == "_id":
                order.append(f"r.id {direction}")
            elif code == "_lastUpdated":
                order.append(f"r.last_updated {direction}")
            else:
                joins.append(self._sort_join(req.rtype, code, desc, n, where, P))
                # resources without a value sort last in both directions
                order.append(f"s{n}.k IS NULL, s{n}.k {direction}")
        order.append("r.last_updated, r.id")
        sql = (
            (f"WITH {', '.join(P.ctes)} " if P.ctes else "")
            + f"SELECT r.id FROM ({P.merged('resources', where, 'rtype, id, last_updated')}) r "
            + " ".join(joins)
            + f" ORDER BY {', '.join(order)}"
        )
        return [row[0] for row in store.query(sql, P.values)]

    def _sort_join(self, rtype: str, code: str, desc: bool, n: int, where: str, P: SqlParams) -> str:
        """LEFT JOIN of one sort key per matching resource (max for descending, min for ascending).

        A join over the already-restricted ids, not a correlated subquery per row: SQLite would set up
        the layer/base union once per row, which dominates sorted searches.
        """
        p = self.param(rtype, code)
        table = TABLE_FOR_TYPE[p.type]
        column = {
            "ix_string": "norm", "ix_token": "code", "ix_reference": "target_id", "ix_date": "hi" if desc else "lo",
            "ix_number": "value", "ix_quantity": "value", "ix_uri": "uri",
        }[table]
        agg = "max" if desc else "min"
        keyed = f"{where} AND param = {P(code)}"
        return (
            f"LEFT JOIN (SELECT id, {agg}({column}) AS k FROM ({P.merged(table, keyed, f'id, {column}')}) GROUP BY id) "
            f"s{n} ON s{n}.id = r.id"
        )

    def fetch(self, store: Store, rtype: str, ids: list[str]) -> dict[str, bytes]:
        """JSON of the given current resources of one type (missing ones are simply absent)."""
        P = SqlParams(store.sides())
        where = _among(rtype, ids, P)
        return dict(store.query(f"SELECT id, json FROM ({P.merged('resources', where, 'id, json')})", P.values))

    def updated_since(self, store: Store, rtype: str, ids: list[str], since: str) -> set[str]:
        """Those of the given current resources of one type last updated at or after ``since`` (an instant
        as stored: ``2025-01-01T00:00:00.000Z``)."""
        P = SqlParams(store.sides())
        where = f"{_among(rtype, ids, P)} AND deleted = 0 AND last_updated >= {P(since)}"
        return {row[0] for row in store.query(f"SELECT id FROM ({P.merged('resources', where, 'id')})", P.values)}

    def references_from(self, store: Store, rtype: str, ids: list[str], code: str, target: str | None
                        ) -> list[tuple[str, str]]:
        """(target type, target id) referenced through parameter ``code`` ('*' = any) by the given resources."""
        sides = store.sides()
        out: list[tuple[str, str]] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            P = SqlParams(sides)
            where = f"rtype = {P(rtype)} AND id IN ({', '.join(P(i) for i in chunk)}) AND target_id IS NOT NULL"
            if code != "*":
                where += f" AND param = {P(code)}"
            if target:
                where += f" AND target_type = {P(target)}"
            sql = f"SELECT DISTINCT target_type, target_id FROM ({P.merged('ix_reference', where, 'target_type, target_id')})"
            out.extend(store.query(sql, P.values))
        return out

    def referencing(self, store: Store, src: str, code: str, targets: list[tuple[str, str]]) -> list[str]:
        """Ids of ``src`` resources whose parameter ``code`` references one of ``targets``."""
        sides = store.sides()
        out: list[str] = []
        for start in range(0, len(targets), 250):
            chunk = targets[start : start + 250]
            P = SqlParams(sides)
            pairs = " OR ".join(f"(target_type = {P(t)} AND target_id = {P(i)})" for t, i in chunk)
            where = f"rtype = {P(src)} AND ({pairs})"
            if code != "*":
                where += f" AND param = {P(code)}"
            sql = f"SELECT DISTINCT id FROM ({P.merged('ix_reference', where, 'id, target_type, target_id')})"
            out.extend(r[0] for r in store.query(sql, P.values))
        return out


def _uri_prefixes(uri: str) -> list[str]:
    """``a/b/c`` → [a/b/c, a/b, a] for ``:above`` (canonical URLs, hierarchical paths)."""
    out = [uri]
    cur = uri
    while "/" in cur.rstrip("/"):
        cur = cur.rstrip("/").rsplit("/", 1)[0]
        if cur.endswith(":/") or cur.endswith(":"):
            break
        out.append(cur)
    return out
