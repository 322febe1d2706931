"""The error-level invariants of the R4 StructureDefinitions (``per-1``, ``app-3``, ``obs-6`` ...),
evaluated with fhirpathpy on every validated write.

Each ``error`` constraint is compiled once and evaluated on every node of its element path; it fails only
when its expression is ``false`` (empty means nothing to check). fhirpathpy 2.x lacks ``hasValue()`` and
``resolve()``: both are supplied. A few are left to :mod:`._validate`, which checks them without FHIRPath
and with better messages. fhirpathpy costs 0.1-1 ms an evaluation, so :func:`shortcut` decides the common
presence-test disjunctions with dict lookups and ``per-1`` is written out (:func:`_per_1`);
``tests/test_invariants.py`` holds both against fhirpathpy over a built world (docs/SERVER.md).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..spec import Spec
from ._errors import FhirError, Issue
from ._extract.parse import split_top
from ._values import date_range, split_reference

#: Invariants the structural validator enforces itself (see the module docstring).
STRUCTURAL = frozenset({"ele-1", "ext-1", "dom-2", "dom-3", "dom-4", "dom-5", "ref-1", "txt-1", "txt-2"})


@dataclass(frozen=True, slots=True)
class Invariant:
    """One error-level constraint, compiled: ``fn(node, env) -> list``."""

    key: str
    human: str
    expression: str
    fn: Callable[..., list]
    #: ``quick(node) -> True | False | None``: the constraint's value when decided without FHIRPath
    quick: Callable[[dict], bool | None] | None = None


class Invariants:
    """The invariants of each element path (a resource type, a datatype or a backbone path such as
    ``Encounter.statusHistory``), compiled on first use; one instance per :class:`Spec`."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._at: dict[str, tuple[Invariant, ...]] = {}
        self._fns: dict[str, Callable[..., list]] = {}  # expression -> compiled, shared across paths
        self._by_type: dict[str, dict[str, list[dict]]] = {}  # type -> element path -> its constraints
        self._engine: tuple | None = None

    def at(self, path: str) -> tuple[Invariant, ...]:
        """The invariants of the element at ``path`` (a type name for a resource or datatype root)."""
        found = self._at.get(path)
        if found is None:
            found = self._at[path] = tuple(
                Invariant(c["key"], c.get("human", ""), c["expression"], self._compile(c["expression"]),
                          NATIVE.get(c["key"]) or shortcut(c["expression"], self.spec.child_elements(path)))
                for c in self._constraints(path))
        return found

    def check(self, invariants: tuple[Invariant, ...], node: dict, type_path: str, root: dict, where: Any,
              issues: list[Issue], render: Callable[[Any], str] = str, stop: Callable[[], None] | None = None
              ) -> None:
        """Evaluate ``invariants`` on one node (of the element ``type_path``) of resource ``root``;
        ``render(where)`` names the node in an issue (only computed for one). ``stop``: called every few
        thousand Python calls inside each FHIRPath evaluation, which on a large node (``entry.all(...)``
        over a 100,000-entry Bundle) runs for seconds; what it raises ends the evaluation."""
        target: Any = None
        for inv in invariants:
            result = inv.quick(node) if inv.quick is not None else None
            if result is None:
                if target is None:
                    target = node if node is root else self._fhirpath()[1].create_node(node, type_path)
                try:
                    env = {"resource": root, "rootResource": root}
                    result = (inv.fn(target, env) if stop is None else _interruptible(inv.fn, stop, target, env)) \
                        != [False]
                except FhirError:
                    raise
                except Exception as exc:  # fhirpathpy on an odd instance: say so, never block the write
                    at = render(where)
                    issues.append(Issue("warning", "exception", f"{at}: constraint {inv.key} could not be "
                                        f"evaluated: {type(exc).__name__}: {exc}", (at,)))
                    continue
            if not result:
                at = render(where)
                issues.append(Issue("error", "invariant", f"{at}: constraint {inv.key} failed: {inv.human} "
                                                          f"({inv.expression})", (at,)))

    # -- compiling -------------------------------------------------------------------------------
    def _constraints(self, path: str) -> list[dict]:
        """The error-level, non-structural constraints of an element path, from its type's definition
        (read once per type)."""
        type_name = path.split(".", 1)[0]
        paths = self._by_type.get(type_name)
        if paths is None:
            paths = self._by_type[type_name] = {}
            try:
                elements = self.spec.structure_definition(type_name).get("snapshot", {}).get("element", [])
            except KeyError:
                elements = []
            for el in elements:
                paths[el.get("path")] = [c for c in el.get("constraint", []) if c.get("severity") == "error"
                                         and c.get("key") not in STRUCTURAL and c.get("expression")]
        return paths.get(path, [])

    def _compile(self, expression: str) -> Callable[..., list]:
        fn = self._fns.get(expression)
        if fn is None:
            (fhirpathpy, model, options), _ = self._fhirpath()
            fn = self._fns[expression] = fhirpathpy.compile(expression, model, options)
        return fn

    def _fhirpath(self) -> tuple:
        if self._engine is None:
            import fhirpathpy
            from fhirpathpy.engine.nodes import ResourceNode
            from fhirpathpy.engine.util import get_data
            from fhirpathpy.models import models

            def has_value(inputs: list) -> list:
                if len(inputs) != 1:
                    return [False]
                data = get_data(inputs[0])
                return [data is not None and not isinstance(data, dict | list)]

            def resolve(inputs: list) -> list:
                out = []
                for r in inputs:
                    ref = get_data(r).get("reference") if isinstance(get_data(r), dict) else None
                    if isinstance(ref, str):
                        t, i, _ = split_reference(ref)
                        if t is not None and self.spec.is_resource_type(t):
                            out.append(ResourceNode.create_node({"resourceType": t, "id": i}))
                return out

            options = {"userInvocationTable": {"hasValue": {"fn": has_value, "arity": {0: []}},
                                               "resolve": {"fn": resolve, "arity": {0: []}}},
                       # trace() (que-1, ref-1, sdf-16 ...) prints to stdout unless given somewhere to go
                       "traceFn": lambda label, value: None,
                       "returnRawData": True}
            self._engine = ((fhirpathpy, models["r4"], options), ResourceNode)
        return self._engine


#: Python calls between two calls of ``stop`` in an interruptible evaluation (about a millisecond)
_CALLS = 5000


def _interruptible(fn: Callable[..., list], stop: Callable[[], None], *args: Any) -> list:
    """``fn(*args)`` with ``stop()`` called every :data:`_CALLS` Python calls it makes: fhirpathpy is pure
    Python, so a profile hook (this thread's only) sees each one. It costs about what the evaluation
    does, so it is kept for large nodes; an exception raised in the hook unsets it and ends ``fn``."""
    calls = 0

    def hook(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1
            if calls >= _CALLS:
                calls = 0
                stop()

    outer = sys.getprofile()
    sys.setprofile(hook)
    try:
        return fn(*args)
    finally:
        sys.setprofile(outer)


# -- shortcuts -------------------------------------------------------------------------------------
_NAME = re.compile(r"[a-z][A-Za-z0-9]*")
#: functions mapping an empty collection to an empty one: a chain of them on an absent element is empty
_EMPTY_PRESERVING = frozenset({"where", "select", "ofType", "first", "last", "tail", "distinct", "resolve"})
Quick = Callable[[dict], "bool | None"]


def _unwrap(expr: str) -> str:
    """``(a or b)`` -> ``a or b`` while one pair of parentheses encloses the whole expression."""
    while expr.startswith("(") and expr.endswith(")"):
        depth = 0
        for i, ch in enumerate(expr):  # string literals may hold parentheses: then leave it be
            depth += (ch == "(") - (ch == ")")
            if (depth == 0 and i < len(expr) - 1) or ch == "'":
                return expr
        expr = expr[1:-1].strip()
    return expr


def _present(name: str, choice: bool) -> Callable[[dict], bool]:
    """Whether element ``name`` has a value or extensions in a node (a choice: ``valueQuantity`` ...)."""
    if not choice:
        return lambda node: name in node or "_" + name in node
    n = len(name)

    def present(node: dict) -> bool:
        for k in node:
            k = k[1:] if k[:1] == "_" else k
            if k.startswith(name) and k[n:n + 1].isupper():
                return True
        return False

    return present


#: ``X.coding.where(system='S' and code='C').exists()`` (or ``(code='a' or code='b')``, or ``.empty()``)
_CODING_TEST = re.compile(r"([a-z][A-Za-z0-9]*)\.coding\.where\(system\s*=\s*'([^']*)'\s+and\s+"
                          r"\(?((?:code\s*=\s*'[^']*'(?:\s+or\s+)?)+)\)?\)\.(exists|empty)\(\)")


def _coding_test(m: re.Match, el: object) -> Quick | None:
    """A :data:`_CODING_TEST` term: whether a CodeableConcept element has a Coding of ``system`` with one
    of the codes."""
    if getattr(el, "types", ()) != ("CodeableConcept",):
        return None
    name, system, exists = m[1], m[2], m[4] == "exists"
    codes = frozenset(re.findall(r"code\s*=\s*'([^']*)'", m[3]))

    def test(node: dict) -> bool:
        value = node.get(name)
        found = False
        for cc in value if type(value) is list else (value,) if value is not None else ():
            for c in cc.get("coding", ()) if type(cc) is dict else ():
                if type(c) is dict and c.get("system") == system and c.get("code") in codes:
                    found = True
        return found is exists

    return test


def _term(expr: str, children: dict) -> Quick | None:
    """One disjunct compiled: True/False when decided by presence alone, None when FHIRPath must say."""
    expr = _unwrap(expr)
    if (m := _CODING_TEST.fullmatch(expr)) is not None:
        return _coding_test(m, children.get(m[1]))
    segs = split_top(expr, ".")
    name = segs[0]
    el = children.get(name)
    if len(segs) < 2 or not _NAME.fullmatch(name) or el is None:
        return None
    present = _present(name, el.is_choice)
    rest = segs[1:]
    if rest == ["exists()"]:
        return present
    if rest in (["empty()"], ["exists()", "not()"]):
        return lambda node: not present(node)
    if rest == ["hasValue()", "not()"] and not el.is_choice:
        return lambda node: True if name not in node else False if isinstance(node[name], str | int | float) \
            else None
    if rest[-1] == "empty()" and all(_NAME.fullmatch(s) or (s.endswith(")") and s.split("(", 1)[0]
                                                             in _EMPTY_PRESERVING) for s in rest[:-1]):
        return lambda node: True if not present(node) else None
    return None


def shortcut(expression: str, children: dict) -> Quick | None:
    """The constraint decided from presence tests where its shape allows (see the module docstring);
    ``children``: the element definitions under the constrained path, by name."""
    expr = _unwrap(" ".join(expression.split()))
    sides = split_top(expr, " implies ")
    if len(sides) == 2:  # A implies B == (not A) or B: only "not A" is compiled
        a = _term(sides[0], children)
        if a is None:
            return None
        return lambda node: True if a(node) is False else None
    terms = [_term(t, children) for t in split_top(expr, " or ")]
    known = [t for t in terms if t is not None]
    if len(sides) != 1 or not known:
        return None
    complete = len(known) == len(terms)

    def quick(node: dict) -> bool | None:
        undecided = not complete
        for t in known:
            v = t(node)
            if v is True:
                return True
            if v is None:
                undecided = True
        return None if undecided else False

    return quick


def _per_1(node: dict) -> bool | None:
    """per-1, ``start.hasValue().not() or end.hasValue().not() or (start <= end)``. FHIRPath compares
    dateTimes at their common precision and answers empty (the constraint holds) when they agree there;
    seconds and milliseconds are one precision, and a time always has seconds in FHIR."""
    start, end = node.get("start"), node.get("end")
    if type(start) is not str or type(end) is not str:
        return True
    try:
        (s_lo, _), (e_lo, e_hi) = date_range(start), date_range(end)
    except ValueError:
        return None
    if len(start) > 10 and len(end) > 10:  # both to the second: instants
        return s_lo <= e_lo
    return s_lo < e_hi  # false only when start lies wholly after end, at their common precision


def _que_7(node: dict) -> bool | None:
    """que-7, ``operator = 'exists' implies (answer is Boolean)``: R4 wrote the FHIRPath type ``Boolean``,
    which a FHIR ``boolean`` is not, so fhirpathpy refuses every ``exists`` condition; R5 corrected it to
    ``answer is boolean``, which is what is checked here: an ``exists`` condition answers with a boolean."""
    if node.get("operator") != "exists":
        return True
    answers = {k.lstrip("_") for k in node if k.lstrip("_").startswith("answer")}
    return not answers or answers == {"answerBoolean"}


#: Constraints written out in Python (each agrees with fhirpathpy, or says where R4's expression is wrong:
#: tests/test_invariants.py).
NATIVE: dict[str, Quick] = {"per-1": _per_1, "que-7": _que_7}
