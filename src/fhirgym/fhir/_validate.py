"""Structural validation of FHIR R4 JSON resources, driven by the official StructureDefinitions.

Why our own: a FHIR server must reject codes outside *required* bindings (``Patient.gender``
"robot") and point at the offending element with a FHIRPath-like ``OperationOutcome.issue.
expression``; no installable Python library does both. It also runs on every write and bulk load,
so it must be cheap: each element path is compiled once, lazily, into a table (JSON key -> element
definition, type, checker, bound codes), valid strings and references are remembered, and resources
are walked as plain JSON against those tables. No object model is built and FHIRPath is never run.
What is checked and what is not, the expressions and the issue codes: docs/SERVER.md. A bug in the
validator itself surfaces as one ``exception`` issue, never as a raised exception.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable

from fhirgym.spec import ElementDef, Spec

from ._errors import FhirError, Issue
from ._invariants import Invariant, Invariants
from ._json import FhirDecimal
from ._values import date_range
from ._xhtml import xhtml_problem

#: JSON object nesting deeper than this is refused instead of risking Python's recursion limit.
MAX_DEPTH = 100
#: units of work (see :meth:`Validator._step`) between two calls of a validation's ``stop``
_STEPS = 2000
#: a resource of more units than this has its FHIRPath evaluations made interruptible (see
#: :func:`._invariants._interruptible`): a few thousand elements, far beyond any ordinary resource
_LARGE = 20_000

_INT_MIN = -(2**31)
_INT_MAX = 2**31 - 1

# How a JSON property is walked (a field's "mode").
_PRIM_ONE = 0  # primitive datatype: a JSON string/number/boolean
_COMPLEX_ONE = 1  # datatype or backbone element: a JSON object
_COMPLEX_MANY = 2  # ... repeating: a JSON array of objects
_PRIM_MANY = 3  # repeating primitive
_SKIP = 4  # resourceType at a resource root
_PRIM_EXT = 5  # "_x": id/extension of primitive x
_RESOURCE = 6  # a whole resource (contained, Bundle.entry.resource ...)
_PRIM = (_PRIM_ONE, _PRIM_MANY)

#: Element types whose children live under the element's own path rather than under a datatype.
_INLINE_TYPES = frozenset({"BackboneElement", "Element"})

#: The spec's base64Binary regex ``(\s*([0-9a-zA-Z\+/=]){4}\s*)+`` backtracks exponentially on
#: non-matching input with whitespace runs; this one accepts the same language without ambiguity.
_BASE64 = r"\s*(?:[0-9a-zA-Z+/=]{4}\s*)+"

_ID_RE = re.compile(r"[A-Za-z0-9\-.]{1,64}", re.ASCII)
_REL_REF = re.compile(r"([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]{1,64})(?:/_history/[A-Za-z0-9\-.]{1,64})?", re.ASCII)
_COND_REF = re.compile(r"([A-Z][A-Za-z]+)\?\S+", re.ASCII)
_ABS_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+", re.ASCII)
_URL_TAIL = re.compile(
    r"/([A-Z][A-Za-z]+)/[A-Za-z0-9\-.]{1,64}(?:/_history/[A-Za-z0-9\-.]{1,64})?$", re.ASCII
)

Checker = Callable[[object], "str | None"]


#: R4 datatypes: "strings SHALL NOT exceed 1MB (1024*1024 characters) in size"; applied to ``string`` and
#: the types built on it (not to ``base64Binary`` or ``xhtml``, which are not strings).
MAX_STRING = 1024 * 1024
_STRING_TYPES = frozenset({"string", "code", "id", "markdown", "uri", "url", "canonical", "oid", "uuid"})
#: R4: "strings SHALL NOT contain Unicode character points below 32, except for u0009 (horizontal tab),
#: u0010 (carriage return) and u0013 (line feed)"; held against every primitive given as a JSON string.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")

#: Valid primitive strings (per type) and references are remembered, since codes, system URLs,
#: units and references repeat endlessly; a cache is emptied when it reaches this size, and longer
#: strings are never remembered.
_CACHE_MAX = 50_000
_CACHE_LEN = 256

#: A location in the instance, built without string formatting on the hot path: a root string,
#: ``(parent, key)`` or ``(parent, key, index)``. Rendered by :func:`_render` only for issues.
Path = str | tuple

# Post-walk checks on complex values.
_POST_REFERENCE = 1
_POST_BINDING = 2
_POST_MODIFIER = 3  # a modifierExtension: refused, none is understood


class _Field:
    """How one JSON property of one element path is validated."""

    __slots__ = (
        "check",
        "choice",
        "codes",
        "el",
        "fast",
        "key",
        "many",
        "mode",
        "other",
        "pairs",
        "plan",
        "plan_key",
        "post",
        "targets",
        "type",
        "valueset",
    )

    def __init__(self, key: str, el: ElementDef | None, type_code: str, mode: int) -> None:
        self.key = key
        self.el = el
        self.type = type_code
        self.many = el.is_array if el is not None else False
        if mode == _PRIM_ONE and self.many:
            mode = _PRIM_MANY
        elif mode == _COMPLEX_ONE and self.many:
            mode = _COMPLEX_MANY
        self.mode = mode
        self.choice: str | None = el.name if el is not None and el.is_choice else None
        # For a primitive "x": "_x" (where its extensions live); for "_x": "x".
        self.other = "_" + key
        self.check: Checker | None = None
        #: Strings known to be valid here, so the hot path skips the checker.
        self.fast: set[str] | frozenset[str] = frozenset()
        self.plan_key: str | None = None
        self.plan: _Plan | None = None
        self.post = 0  # _POST_REFERENCE, _POST_BINDING or 0
        self.targets: frozenset[str] = frozenset()
        self.valueset: str | None = None
        self.codes: frozenset[str] | None = None  # bound codes, code part only
        self.pairs: frozenset[tuple[str, str]] | None = None  # bound (system, code)


class _Plan:
    """The compiled children of one element path (a resource, backbone element or datatype)."""

    __slots__ = ("choices", "deep", "fields", "invariants", "is_extension", "key", "required")

    def __init__(self, key: str = "") -> None:
        self.key = key  # the element path: a type name, or a backbone path such as Encounter.statusHistory
        self.invariants: tuple[Invariant, ...] | None = None  # compiled on first use
        self.deep: bool | None = None  # whether this path or any under it has invariants (see Validator._deep)
        self.fields: dict[str, _Field] = {}
        self.required: list[tuple[str, tuple[str, ...]]] = []  # (element name, keys that satisfy it)
        self.choices: dict[str, tuple[str, ...]] = {}  # choice name -> its JSON keys
        self.is_extension = False


_SKIP_FIELD = _Field("", None, "", _SKIP)


def _render(p: Path) -> str:
    """``(("Patient", "name", 0), "given", 1)`` -> ``Patient.name[0].given[1]``."""
    parts: list[str] = []
    while type(p) is tuple:
        parts.append(f".{p[1]}" if len(p) == 2 else f".{p[1]}[{p[2]}]")
        p = p[0]
    parts.append(p)  # type: ignore[arg-type]
    parts.reverse()
    return "".join(parts)


def _issue(issues: list[Issue], code: str, path: Path, msg: str) -> None:
    where = _render(path)
    issues.append(Issue("error", code, f"{where}: {msg}", (where,)))


class _LocalRef(Issue):
    """A ``#id`` reference met during the walk (``diagnostics``: the reference), not a problem: a marker
    its container's :meth:`Validator._resource` takes out of the issues and resolves against its
    ``contained``. The issue list is the one thing every step of the walk shares, and stays per call."""

    __slots__ = ()


def _hash_strings(node: object, out: set[str]) -> set[str]:
    """Every string starting with ``#`` in ``node`` (references, canonicals and uris to contained ids)."""
    stack = [node]
    while stack:
        v = stack.pop()
        if type(v) is dict:
            stack.extend(v.values())
        elif type(v) is list:
            stack.extend(v)
        elif type(v) is str and v[:1] == "#":
            out.add(v)
    return out


def _kind(v: object) -> str:
    """JSON name of a value's type, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


def _show(v: object) -> str:
    text = "'" + v + "'" if isinstance(v, str) else repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _got(v: object) -> str:
    k = _kind(v)
    return f"{k} {_show(v)}" if k in ("string", "number", "boolean") else k


def _make_checker(type_code: str, spec: Spec, valid: set[str]) -> Checker:
    """A function returning why a JSON value is not a valid ``type_code`` (None if it is).

    Valid strings are added to ``valid`` so that callers can skip the checker next time.
    """
    if type_code == "boolean":

        def check_bool(v: object) -> str | None:
            return None if v is True or v is False else f"expected a JSON boolean, got {_got(v)}"

        return check_bool
    if type_code in ("integer", "positiveInt", "unsignedInt"):
        lo = {"integer": _INT_MIN, "positiveInt": 1, "unsignedInt": 0}[type_code]

        def check_int(v: object) -> str | None:
            if type(v) is FhirDecimal and v.is_integer_text:  # -0, or an integer beyond 64 bits
                v = int(v.text)
            if type(v) is not int:
                return f"expected a JSON integer ({type_code}), got {_got(v)}"
            if not lo <= v <= _INT_MAX:
                return f"{v} is out of range for {type_code} ({lo}..{_INT_MAX})"
            return None

        return check_int
    if type_code == "decimal":

        def check_decimal(v: object) -> str | None:
            if type(v) is int or (type(v) is float and math.isfinite(v)) or type(v) is FhirDecimal:
                return None  # a FhirDecimal was parsed from valid JSON number text, a FHIR decimal
            return f"expected a JSON number (decimal), got {_got(v)}"

        return check_decimal

    if type_code == "base64Binary":
        pattern: str | None = _BASE64
    elif type_code == "id":
        pattern = _ID_RE.pattern
    else:
        pattern = spec.primitive_regex.get(type_code)
    # ASCII: the spec's regexes follow XML Schema, where \s is only ASCII whitespace.
    fullmatch = re.compile(pattern, re.ASCII).fullmatch if pattern else None
    is_date = type_code in ("date", "dateTime", "instant")
    is_xhtml = type_code == "xhtml"
    max_len = MAX_STRING if type_code in _STRING_TYPES else None

    def check_str(v: object) -> str | None:
        if type(v) is not str:
            return f"expected a JSON string ({type_code}), got {_got(v)}"
        if v in valid:
            return None
        if not v or v.isspace():
            return f"{type_code} must contain at least one non-whitespace character"
        if max_len is not None and len(v) > max_len:
            return f"a {type_code} of {len(v)} characters exceeds FHIR's limit of {max_len} (1 MB)"
        bad = _CONTROL.search(v)
        if bad is not None:
            return (f"contains the control character U+{ord(bad[0]):04X} at position {bad.start()}: FHIR strings "
                    "allow none below U+0020 except tab, carriage return and line feed")
        if fullmatch is not None and fullmatch(v) is None:
            return f"{_show(v)} is not a valid {type_code}"
        if is_date and len(v) >= 10 and v[8:10] > "28":  # the regex already bounds everything else
            try:
                date_range(v)
            except ValueError:
                return f"{_show(v)} is not a valid {type_code} (no such calendar day)"
        if is_xhtml and (problem := xhtml_problem(v)) is not None:
            return problem
        if len(v) <= _CACHE_LEN:
            if len(valid) >= _CACHE_MAX:
                valid.clear()
            valid.add(v)
        return None

    return check_str


class Validator:
    """Validates resources against the R4 core definitions; one instance per :class:`Spec`.

    The compiled tables and caches only grow (bounded), so one instance can serve a whole process.
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._plans: dict[str, _Plan] = {}
        self._checkers: dict[str, tuple[Checker, set[str]]] = {}
        self._valuesets: dict[str, tuple[frozenset[tuple[str, str]], frozenset[str]] | None] = {}
        self._refs: dict[str, str] = {}  # valid reference -> its resource type ("" if it has none)
        self.invariants = Invariants(spec)
        self._local = threading.local()  # the running validation's ``stop`` and steps, per thread

    # -- public --------------------------------------------------------------------------------
    def validate(self, resource: object, invariants: bool = True, stop: Callable[[], None] | None = None
                 ) -> list[Issue]:
        """All problems with one resource; [] if valid. Never raises on any input (any JSON value).

        ``invariants``: also evaluate the error-level FHIRPath invariants (:mod:`._invariants`), on a
        resource that is otherwise valid (they assume its structure). ``stop``: called every few
        thousand elements and before each FHIRPath evaluation; what it raises (a request's deadline,
        a :class:`FhirError`) ends the validation and is raised here."""
        issues: list[Issue] = []
        outer, self._local.stop = getattr(self._local, "stop", None), stop
        self._local.steps = self._local.walked = 0
        try:
            self._resource(resource, "", issues, 0)
            # a FHIRPath evaluation on a large resource may itself run for seconds: then it is interruptible
            self._local.guard = stop if self._local.walked > _LARGE else None
            if invariants and not issues:
                self._invariants(resource, self._plan(resource["resourceType"]), resource,  # type: ignore[index]
                                 resource["resourceType"], issues)  # type: ignore[index]
        except FhirError:
            raise
        except Exception as exc:  # a bug here must not turn bad input into a server error
            issues[:] = [i for i in issues if type(i) is not _LocalRef]
            issues.append(Issue("error", "exception", f"Validator failure: {type(exc).__name__}: {exc}", ()))
        finally:
            self._local.stop = outer
        return issues

    def _step(self, n: int = 1) -> None:
        """Count ``n`` units of work (elements walked, invariants evaluated): ``stop()`` every
        :data:`_STEPS` of them, a few milliseconds of work."""
        local = self._local
        if local.stop is not None:
            local.steps += n
            local.walked += n
            if local.steps >= _STEPS:
                local.steps = 0
                local.stop()

    # -- walking -------------------------------------------------------------------------------
    def _resource(self, res: object, path: Path, issues: list[Issue], depth: int) -> None:
        if type(res) is not dict:
            self._bad_resource(path, issues, f"expected a resource (JSON object), got {_got(res)}")
            return
        rt = res.get("resourceType")
        if type(rt) is not str:
            if rt is None:
                self._bad_resource(path, issues, "missing resourceType", "required")
            else:
                self._bad_resource(path, issues, f"resourceType must be a string, got {_got(rt)}")
            return
        if not self.spec.is_resource_type(rt):
            self._bad_resource(path, issues, f"resourceType {_show(rt)} is not a known R4 resource type")
            return
        plan = self._plans.get(rt) or self._plan(rt)
        start = len(issues)
        self._step(len(res))
        self._object(res, plan, path or rt, issues, depth)
        if type(path) is tuple and path[1] == "contained":
            return  # its #id references belong to its container, which checks them
        contained = res.get("contained")
        local = [i for i in issues[start:] if type(i) is _LocalRef] if len(issues) > start else []
        if local or type(contained) is list:
            if local:
                issues[start:] = [i for i in issues[start:] if type(i) is not _LocalRef]
            self._contained(res, contained if type(contained) is list else [], local, path or rt, issues)

    def _invariants(self, obj: dict, plan: _Plan, root: dict, path: Path, issues: list[Issue]) -> None:
        """Evaluate the invariants of every element path in a structurally valid resource, skipping the
        elements under which no path has any (codings, references, meta ...)."""
        invs = plan.invariants
        if invs is None:
            invs = plan.invariants = self.invariants.at(plan.key)
        if invs:
            self._step(8 * len(invs))  # an evaluation costs about what walking a few elements does
            self.invariants.check(invs, obj, plan.key, root, path, issues, _render, self._local.guard)
        fields = plan.fields
        for key, val in obj.items():
            f = fields.get(key)
            if f is None:
                continue
            mode = f.mode
            if mode in (_COMPLEX_ONE, _COMPLEX_MANY):
                sub = f.plan or self._resolve(f)
                if sub.deep is False or (sub.deep is None and not self._deep(sub)):
                    continue
                if mode == _COMPLEX_ONE:
                    self._invariants(val, sub, root, (path, key), issues)
                else:
                    for i, item in enumerate(val):
                        self._invariants(item, sub, root, (path, key, i), issues)
            elif mode == _PRIM_EXT:  # extensions of primitives: their values may be Periods ...
                sub = self._plan("Element")
                if self._deep(sub):
                    for i, item in enumerate(val) if type(val) is list else ((-1, val),):
                        if type(item) is dict:
                            where = (path, f.other, i) if i >= 0 else (path, f.other)  # reported on the primitive
                            self._invariants(item, sub, root, where, issues)
            elif mode == _RESOURCE:
                for i, res in enumerate(val) if type(val) is list else ((-1, val),):
                    self._invariants(res, self._plan(res["resourceType"]), res,
                                     (path, key, i) if i >= 0 else (path, key), issues)

    def _deep(self, plan: _Plan) -> bool:
        """Whether any element path at or under ``plan`` has invariants (or holds resources), found once
        per plan by a search through the plans it leads to."""
        if plan.deep is None:
            plan.deep = self._reaches_invariants(plan)
        return plan.deep

    def _reaches_invariants(self, start: _Plan) -> bool:
        seen, todo = {id(start)}, [start]
        while todo:
            p = todo.pop()
            if p.invariants is None:
                p.invariants = self.invariants.at(p.key)
            if p.invariants:
                return True
            for f in p.fields.values():
                if f.mode == _RESOURCE:
                    return True
                if f.mode in (_COMPLEX_ONE, _COMPLEX_MANY, _PRIM_EXT):
                    sub = self._plan("Element") if f.mode == _PRIM_EXT else f.plan or self._resolve(f)
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        todo.append(sub)
        return False

    @staticmethod
    def _contained(res: dict, contained: list, local: list[_LocalRef], path: Path, issues: list[Issue]) -> None:
        """The rules of contained resources (dom-2 to dom-5) and of ``#id`` references, for one container.

        ``local``: its ``#id`` references, as the walk found them (in contained resources too)."""
        ids: dict[str, int] = {}
        for n, c in enumerate(contained):
            if type(c) is not dict:
                continue  # the walk has reported it
            where = (path, "contained", n)
            cid = c.get("id")
            if type(cid) is str:
                if cid in ids:
                    _issue(issues, "structure", (where, "id"),
                           f"contained[{ids[cid]}] already has the id {_show(cid)}: contained ids must be unique")
                else:
                    ids[cid] = n
            if "contained" in c:
                _issue(issues, "invariant", (where, "contained"),
                       "a contained resource cannot contain resources (dom-2)")
            meta = c.get("meta")
            if type(meta) is dict:
                for key in ("versionId", "lastUpdated"):
                    if key in meta:
                        _issue(issues, "invariant", ((where, "meta"), key),
                               f"a contained resource cannot have meta.{key} (dom-4)")
                if "security" in meta:
                    _issue(issues, "invariant", ((where, "meta"), "security"),
                           "a contained resource cannot have security labels (dom-5)")
        for ref in local:
            if ref.diagnostics[1:] not in ids:
                issues.append(Issue("error", "not-found",
                                    f"{ref.expression[0]}: {_show(ref.diagnostics)} matches no contained resource's id",
                                    ref.expression))
        if not contained:
            return
        # dom-3: each is referred to from elsewhere in the container (a reference, canonical or uri "#id"),
        # or refers to its container ("#")
        pointers = _hash_strings(res, set())
        for n, c in enumerate(contained):
            if type(c) is not dict or type(c.get("resourceType")) is not str:
                continue  # not a resource at all: reported as such
            cid = c.get("id")
            if (type(cid) is str and "#" + cid in pointers) or "#" in _hash_strings(c, set()):
                continue
            what = f"nothing in its container refers to #{cid}" if type(cid) is str else "it has no id"
            _issue(issues, "invariant", (path, "contained", n),
                   f"a contained resource must be referred to from its container or refer to the container "
                   f"with '#' (dom-3): {what}")

    @staticmethod
    def _bad_resource(path: Path, issues: list[Issue], msg: str, code: str = "structure") -> None:
        if path:
            _issue(issues, code, path, msg)
        else:
            issues.append(Issue("error", code, f"resource: {msg}", ()))

    def _object(self, obj: dict, plan: _Plan, path: Path, issues: list[Issue], depth: int) -> None:
        """Walk one JSON object against its compiled element path."""
        if depth >= MAX_DEPTH:
            _issue(issues, "structure", path, f"nested deeper than {MAX_DEPTH} levels")
            return
        fields = plan.fields
        chosen: dict[str, str] | None = None
        for key, val in obj.items():
            f = fields.get(key)
            if f is None:
                self._unknown(key, plan, path, issues)
                continue
            if f.choice is not None:
                base = f.key if f.mode != _PRIM_EXT else f.other
                if chosen is None:
                    chosen = {f.choice: base}
                elif chosen.setdefault(f.choice, base) != base:
                    prev = chosen[f.choice]
                    _issue(
                        issues,
                        "structure",
                        (path, base),
                        f"{f.choice}[x] is given twice, as '{prev}' and '{base}'",
                    )
            # Fast paths for the common, valid shapes, most frequent first; the rest goes to _slow.
            mode = f.mode
            if mode == _PRIM_ONE:
                if type(val) is str and val in f.fast:
                    continue
                if val is not None and type(val) is not list:
                    self._prim(obj, f, val, (path, key), issues, -1)
                    continue
            elif mode == _COMPLEX_ONE:
                if type(val) is dict:
                    sub = f.plan or self._resolve(f)
                    p = (path, key)
                    self._object(val, sub, p, issues, depth + 1)
                    if f.post:
                        self._post(f, val, p, issues)
                    continue
            elif mode == _COMPLEX_MANY:
                if type(val) is list and val:
                    sub = f.plan or self._resolve(f)
                    self._step(len(val))
                    for i, item in enumerate(val):
                        if type(item) is dict:
                            p = (path, key, i)
                            self._object(item, sub, p, issues, depth + 1)
                            if f.post:
                                self._post(f, item, p, issues)
                        else:
                            self._complex(f, item, (path, key, i), issues, depth)
                    continue
            elif mode == _PRIM_MANY:
                if type(val) is list and val:
                    fast = f.fast
                    for i, item in enumerate(val):
                        if type(item) is not str or item not in fast:
                            self._prim(obj, f, item, (path, key, i), issues, i)
                    continue
            elif mode == _SKIP:
                continue
            elif mode == _PRIM_EXT:
                self._prim_ext(obj, f, val, (path, f.other), issues, depth)
                continue
            self._slow(obj, f, key, val, path, issues, depth)
        if not obj:
            _issue(issues, "structure", path, "empty objects are not allowed")
        for name, keys in plan.required:
            for k in keys:
                if k in obj:
                    break
            else:
                label = name + "[x]" if name in plan.choices else name
                where = _render(path)
                issues.append(
                    Issue(
                        "error",
                        "required",
                        f"{where}: missing required element '{label}'",
                        (f"{where}.{name}",),
                    )
                )
        if plan.is_extension:
            has_value = chosen is not None and "value" in chosen
            if has_value and "extension" in obj:
                _issue(
                    issues,
                    "structure",
                    path,
                    "an extension has either value[x] or nested extensions, not both",
                )
            elif not has_value and "extension" not in obj:
                _issue(issues, "structure", path, "an extension needs a value[x] or nested extensions")

    def _slow(
        self, obj: dict, f: _Field, key: str, val: object, path: Path, issues: list[Issue], depth: int
    ) -> None:
        """Shape errors (null, empty array, array vs single value) and nested resources."""
        if val is None:
            _issue(issues, "structure", (path, key), "null is not allowed")
        elif f.many:
            if type(val) is not list:
                _issue(
                    issues,
                    "structure",
                    (path, key),
                    f"repeating element must be a JSON array, got {_kind(val)}",
                )
                self._one(obj, f, val, (path, key), issues, depth, -1)
            elif not val:
                _issue(issues, "structure", (path, key), "empty arrays are not allowed")
            else:
                for i, item in enumerate(val):
                    self._one(obj, f, item, (path, key, i), issues, depth, i)
        elif type(val) is list:
            _issue(issues, "structure", (path, key), "element allows at most one value but got a JSON array")
        else:
            self._one(obj, f, val, (path, key), issues, depth, -1)

    def _one(
        self, obj: dict, f: _Field, val: object, path: Path, issues: list[Issue], depth: int, i: int
    ) -> None:
        if f.mode in _PRIM:
            self._prim(obj, f, val, path, issues, i)
        elif f.mode != _RESOURCE:
            self._complex(f, val, path, issues, depth)
        elif val is None:
            _issue(issues, "structure", path, "null is not allowed")
        else:
            self._resource(val, path, issues, depth + 1)

    def _prim(self, obj: dict, f: _Field, val: object, path: Path, issues: list[Issue], i: int) -> None:
        """One primitive value; ``i`` is its index in a repeating element, else -1."""
        if val is None:
            sib = obj.get(f.other)
            if i >= 0 and type(sib) is list and i < len(sib) and sib[i] is not None:
                return  # this item has only extensions (in _x[i]), which FHIR allows
            _issue(issues, "structure", path, "null is not allowed")
            return
        msg = f.check(val)  # type: ignore[misc]
        if msg is not None:
            _issue(issues, "value", path, msg)
        elif f.codes is not None and val not in f.codes:
            _issue(issues, "code-invalid", path, f"{_show(val)} is not in required ValueSet {f.valueset}")

    def _complex(self, f: _Field, val: object, path: Path, issues: list[Issue], depth: int) -> None:
        if type(val) is not dict:
            msg = "null is not allowed" if val is None else f"expected an object ({f.type}), got {_got(val)}"
            _issue(issues, "structure", path, msg)
            return
        self._object(val, f.plan or self._resolve(f), path, issues, depth + 1)
        if f.post:
            self._post(f, val, path, issues)

    def _resolve(self, f: _Field) -> _Plan:
        plan = f.plan = self._plan(f.plan_key)  # type: ignore[arg-type]
        return plan

    def _post(self, f: _Field, val: dict, path: Path, issues: list[Issue]) -> None:
        """Checks that need the whole value: reference syntax and targets, Coding bindings."""
        if f.post == _POST_MODIFIER:
            _issue(issues, "not-supported", path,
                   f"modifierExtension {val.get('url')!r} is not understood by this server, so the resource "
                   "cannot be processed (FHIR R4 §2.4.1.6)")
        elif f.post == _POST_REFERENCE:
            ref = val.get("reference")
            if type(ref) is str:
                rtype = self._refs.get(ref)
                if rtype is None:
                    rtype = self._parse_reference(ref, (path, "reference"), issues)
                    if rtype is None:
                        return
                if rtype and f.targets and rtype not in f.targets:
                    allowed = ", ".join(sorted(f.targets))
                    _issue(
                        issues,
                        "value",
                        (path, "reference"),
                        f"a reference to {rtype} is not allowed here (allowed: {allowed})",
                    )
        else:
            self._binding(f, val, path, issues)

    def _prim_ext(
        self, obj: dict, f: _Field, val: object, path: Path, issues: list[Issue], depth: int
    ) -> None:
        """``_x``: id/extension of primitive ``x``, item by item when ``x`` repeats (reported at ``x``)."""
        name = f.other
        plan = f.plan
        if plan is None:
            plan = f.plan = self._plan("Element")
        if not f.many:
            if type(val) is dict:
                self._object(val, plan, path, issues, depth + 1)
            else:
                _issue(
                    issues,
                    "structure",
                    path,
                    f"_{name} must be a JSON object with id/extension, got {_kind(val)}",
                )
            return
        if type(val) is not list:
            _issue(
                issues,
                "structure",
                path,
                f"_{name} must be a JSON array aligned with {name}, got {_kind(val)}",
            )
            return
        if not val:
            _issue(issues, "structure", path, f"_{name}: empty arrays are not allowed")
            return
        values = obj.get(name)
        if type(values) is list and len(values) != len(val):
            _issue(issues, "structure", path, f"_{name} has {len(val)} items but {name} has {len(values)}")
        for i, item in enumerate(val):
            if type(item) is dict:
                self._object(item, plan, (path[0], name, i), issues, depth + 1)
            elif item is not None:
                _issue(
                    issues,
                    "structure",
                    (path[0], name, i),
                    f"_{name} items must be objects with id/extension or null, got {_kind(item)}",
                )
            elif type(values) is not list or i >= len(values) or values[i] is None:
                _issue(
                    issues,
                    "structure",
                    (path[0], name, i),
                    f"null in _{name} needs a value at the same index in {name}",
                )

    def _unknown(self, key: object, plan: _Plan, path: Path, issues: list[Issue]) -> None:
        if key == "fhir_comments":
            return
        where = _render(path)
        msg = f"Unknown element {_show(key)} in {where}"
        if isinstance(key, str):
            for name, keys in plan.choices.items():
                if key == name:
                    msg += f" ({name}[x] needs a type suffix: one of {', '.join(keys)})"
                    break
                if key.startswith(name) and key[len(name) : len(name) + 1].isupper():
                    msg += f" ('{key[len(name) :]}' is not an allowed type for {name}[x]: use one of {', '.join(keys)})"
                    break
        issues.append(Issue("error", "structure", msg, (f"{where}.{key}",)))

    # -- references and bindings -----------------------------------------------------------------
    def _parse_reference(self, ref: str, path: Path, issues: list[Issue]) -> str | None:
        """The resource type a reference names ("" if none); None after reporting a bad one."""
        rtype = ""
        if not ref or ref.isspace():
            return None  # the primitive check has already reported it
        if ref[0] == "#":
            if len(ref) > 1 and _ID_RE.fullmatch(ref, 1) is None:
                _issue(issues, "value", path, f"{_show(ref)} is not a valid local reference (#id)")
                return None
            if len(ref) > 1:  # never remembered: its container resolves it, every time (see _resource)
                issues.append(_LocalRef("error", "not-found", ref, (_render(path),)))
            return ""
        elif ref.startswith("urn:"):
            kind = "uuid" if ref.startswith("urn:uuid:") else "oid" if ref.startswith("urn:oid:") else ""
            if not kind or self._checker(kind)[0](ref) is not None:
                _issue(issues, "value", path, f"{_show(ref)} is not a valid urn:uuid: or urn:oid: reference")
                return None
        elif m := _REL_REF.fullmatch(ref) or _COND_REF.fullmatch(ref):
            rtype = m[1]
            if not self.spec.is_resource_type(rtype):
                _issue(issues, "value", path, f"{_show(ref)} refers to unknown resource type '{rtype}'")
                return None
        elif _ABS_URL.fullmatch(ref) is not None:
            tail = _URL_TAIL.search(ref)
            if tail is not None and self.spec.is_resource_type(tail[1]):
                rtype = tail[1]  # otherwise some other absolute URL: nothing more to say
        else:
            _issue(
                issues,
                "value",
                path,
                f"{_show(ref)} is not a valid reference (expected Type/id, an absolute URL, urn:uuid:, urn:oid: or #id)",
            )
            return None
        if len(ref) <= _CACHE_LEN:
            if len(self._refs) >= _CACHE_MAX:
                self._refs.clear()
            self._refs[ref] = rtype
        return rtype

    def _binding(self, f: _Field, val: dict, path: Path, issues: list[Issue]) -> None:
        """Required binding on a Coding, or on a CodeableConcept with codings (one must match)."""
        if f.type == "Coding":
            bad = _coding_outside(val, f)
            if bad is not None:
                _issue(issues, "code-invalid", path, f"{bad} is not in required ValueSet {f.valueset}")
            return
        codings = val.get("coding")
        if type(codings) is not list:
            return
        first_bad: str | None = None
        for c in codings:
            if type(c) is dict:
                bad = _coding_outside(c, f)
                if bad is None:
                    if type(c.get("code")) is str:
                        return
                else:
                    first_bad = first_bad or bad
        if first_bad is not None:
            _issue(
                issues,
                "code-invalid",
                (path, "coding"),
                f"no coding is in required ValueSet {f.valueset} (found {first_bad})",
            )

    # -- compiling -------------------------------------------------------------------------------
    def _plan(self, key: str) -> _Plan:
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._build(key)
        return plan

    def _build(self, key: str) -> _Plan:
        """Compile the children of ``key``: a resource type, a datatype or a backbone path."""
        spec = self.spec
        plan = _Plan(key)
        root = spec.is_resource_type(key)
        plan.is_extension = key == "Extension"
        fields = plan.fields
        if root:
            fields["resourceType"] = _SKIP_FIELD
        for name, el in spec.children.get(key, {}).items():
            if el.is_choice:
                keys = [self._add(fields, name + t[0].upper() + t[1:], el, t) for t in el.types]
                plan.choices[name] = tuple(keys)
            else:
                # R4 types Resource.id as string, but it is an id ([A-Za-z0-9\-.]{1,64}).
                t = "id" if root and name == "id" else el.types[0] if el.types else "BackboneElement"
                keys = [self._add(fields, name, el, t)]
            if el.min > 0:
                plan.required.append((name, tuple(k for k0 in keys for k in (k0, "_" + k0))))
        return plan

    def _add(self, fields: dict[str, _Field], key: str, el: ElementDef, t: str) -> str:
        """Compile one JSON key (and ``_key`` for primitives); returns ``key``."""
        if t == "Resource":
            f = _Field(key, el, t, _RESOURCE)
        elif self.spec.is_primitive(t):
            f = _Field(key, el, t, _PRIM_ONE)
            f.check, valid = self._checker(t)
            f.fast = valid
            ext = _Field("_" + key, el, t, _PRIM_EXT)
            ext.other = key
            fields[ext.key] = ext
        else:
            f = _Field(key, el, t, _COMPLEX_ONE)
            if el.content_reference:
                f.plan_key = el.content_reference
            elif t in _INLINE_TYPES:
                f.plan_key = el.path
            else:
                f.plan_key = t
            if t == "Reference":
                f.post = _POST_REFERENCE
                f.targets = frozenset(el.target_types)
            elif key == "modifierExtension":
                f.post = _POST_MODIFIER
        if (
            el.binding_strength == "required"
            and el.binding_valueset
            and t in ("code", "Coding", "CodeableConcept")
        ):
            vs = self._valueset(el.binding_valueset)
            if vs is not None:
                f.valueset = el.binding_valueset
                f.pairs, f.codes = vs
                if t == "code":
                    assert f.check is not None
                    check = f.check
                    f.fast = frozenset(c for c in f.codes if check(c) is None)
                else:
                    f.post = _POST_BINDING
        fields[key] = f
        return key

    def _checker(self, type_code: str) -> tuple[Checker, set[str]]:
        entry = self._checkers.get(type_code)
        if entry is None:
            valid: set[str] = set()
            entry = self._checkers[type_code] = (_make_checker(type_code, self.spec, valid), valid)
        return entry

    def _valueset(self, url: str) -> tuple[frozenset[tuple[str, str]], frozenset[str]] | None:
        if url not in self._valuesets:
            pairs = self.spec.valueset_codes(url)
            self._valuesets[url] = None if pairs is None else (pairs, frozenset(c for _, c in pairs))
        return self._valuesets[url]


def _coding_outside(c: dict, f: _Field) -> str | None:
    """``system|code`` if this Coding's code is outside the field's required ValueSet, else None."""
    code = c.get("code")
    if type(code) is not str:
        return None
    system = c.get("system")
    if type(system) is str:
        return None if (system, code) in f.pairs else f"{system}|{code}"  # type: ignore[operator]
    return None if code in f.codes else _show(code)  # type: ignore[operator]
