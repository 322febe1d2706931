"""Expected state changes and the checks on them.

A writing task declares, at instance creation (before any agent acts), the changes its reference
produces: ``Expect(op, type, id?, checks)``. Strict validation needs every expectation met by a distinct
change with all checks passing, and **no other change** (collateral writes are reported). Light
validation needs, per expectation, a change of the same operation and type (and id, if fixed) in which
the checked elements are present, whatever their values.

Checks read elements by dotted paths that flatten lists (``participant.actor.reference``) and compare
the way a careful reviewer would: references by type/id (absolute or relative), codings by system and
code, instants as moments in time. Strict means **exact where the meaning is single**: every value at
the path must match (a Condition coded hypertension *and* infarction, an Account for two patients fail);
a check built with ``extras=True`` only needs one match (the family declares a multi-valued element).
A coding of *another* system in the same CodeableConcept is read as a translation and allowed; another
code of the same system is another concept. Every created or updated resource must also carry no
modifier that contradicts the expectation (:func:`modifier_failures`), and updates preserve everything
not asked to change, ``text`` and ``meta`` included, compared by FHIR type (:func:`fhir_equal`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._answer import norm_id, parse_day, parse_instant
from ._diff import Change, content, fhir_equal

#: A check returns None when satisfied, else a short reason.
CheckFn = Callable[[dict, dict | None], str | None]

#: Values of a modifier status that cancel or negate what a resource says (FHIR R4 status value sets).
CANCELLING = frozenset({"entered-in-error", "cancelled", "revoked", "not-done", "not-taken", "refuted",
                        "stopped", "rejected", "noshow", "inactive", "resolved"})
#: Top-level modifier elements whose value can negate a resource, as codes or CodeableConcepts.
MODIFIER_STATUSES = ("status", "clinicalStatus", "verificationStatus")


def values(resource: Any, path: str) -> list[Any]:
    """All values at a dotted path, lists flattened at every step."""
    current = [resource]
    for part in path.split("."):
        nxt: list[Any] = []
        for item in current:
            if isinstance(item, dict) and part in item:
                value = item[part]
                nxt.extend(value if isinstance(value, list) else [value])
        current = nxt
    return current


def ref_key(value: Any) -> str | None:
    """``Type/id`` of a reference (dict or string), absolute URLs and versions stripped."""
    if isinstance(value, dict):
        value = value.get("reference")
    if not isinstance(value, str) or "/" not in value:
        return None
    text = value.split("/_history/")[0]
    parts = text.rstrip("/").split("/")
    return f"{parts[-2]}/{parts[-1]}"


@dataclass(frozen=True)
class Check:
    path: str  # the element the check is about (what light validation requires present)
    describe: str
    fn: CheckFn
    light: bool = True  # False: not an element-presence requirement (e.g. "unchanged")
    kind: str = ""  # "coded", "ref", "eq": what the near-miss mutations of tasks check aim at
    want: Any = None  # the expected value of a coded/ref check: (system, code) or "Type/id"
    extras: bool = False  # the family allows further values at the path

    def __call__(self, after: dict, before: dict | None) -> str | None:
        return self.fn(after, before)


def _holds(got: list[Any], ok: Callable[[Any], bool], extras: bool) -> bool:
    """Strict: values present and every one right; with ``extras``: at least one right."""
    return bool(got) and (any(map(ok, got)) if extras else all(map(ok, got)))


def _only(extras: bool) -> str:
    return "" if extras else " only"


def eq(path: str, expected: Any, extras: bool = False) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        got = values(after, path)
        ok = _holds(got, lambda g: fhir_equal(g, expected), extras)
        return None if ok else f"{path} is {got or 'missing'}, expected{_only(extras)} {expected!r}"
    return Check(path, f"{path} = {expected!r}", fn, kind="eq", want=expected, extras=extras)


def one_of(path: str, allowed: Iterable[Any], extras: bool = False) -> Check:
    allowed = tuple(allowed)

    def fn(after: dict, before: dict | None) -> str | None:
        got = values(after, path)
        ok = _holds(got, lambda g: any(fhir_equal(g, a) for a in allowed), extras)
        return None if ok else f"{path} is {got or 'missing'}, expected{_only(extras)} one of {allowed}"
    return Check(path, f"{path} in {allowed}", fn)


def ref(path: str, target: str, extras: bool = False) -> Check:
    """The reference at ``path`` points to ``target`` (``Type/id``); with ``extras``, one of them does."""
    want = ref_key(target)

    def fn(after: dict, before: dict | None) -> str | None:
        got = [ref_key(v) for v in values(after, path)]
        if _holds(got, lambda g: g == want, extras):
            return None
        return f"{path} references {[g for g in got if g] or 'nothing'}, expected{_only(extras)} {want}"
    return Check(path, f"{path} → {want}", fn, kind="ref", want=want, extras=extras)


def refs_exactly(path: str, targets: Iterable[str]) -> Check:
    """The references at ``path`` are exactly ``targets`` (as a set): none missing, none extra."""
    want = {ref_key(t) for t in targets}

    def fn(after: dict, before: dict | None) -> str | None:
        got = {ref_key(v) for v in values(after, path)} - {None}
        if got == want:
            return None
        return f"{path} references {sorted(got)}, expected exactly {sorted(want)}"
    return Check(path, f"{path} → exactly {sorted(want)}", fn, kind="ref", want=sorted(want))


def _codings(concept: Any) -> list[dict]:
    """The Codings of a CodeableConcept, or the Coding itself."""
    if not isinstance(concept, dict):
        return []
    found = concept.get("coding", [concept]) if "coding" in concept else [concept]
    return [c for c in found if isinstance(c, dict)]


def coded(path: str, system: str | None, code: str, extras: bool = False) -> Check:
    """The concept at ``path`` (a CodeableConcept or a Coding) is ``system|code``.

    Strict: every concept at the path carries the coding and no other code of the same system (another
    system's coding is a translation). With ``extras``, one concept carrying it is enough.
    """
    def means_it(concept: Any) -> bool:
        codings = _codings(concept)
        hit = [c for c in codings if c.get("code") == code and (system is None or c.get("system") == system)]
        rivals = [c for c in codings if c.get("code") != code
                  and (system is None or c.get("system") in (system, None))]
        return bool(hit) and (extras or not rivals)

    def fn(after: dict, before: dict | None) -> str | None:
        concepts = values(after, path)
        if _holds(concepts, means_it, extras):
            return None
        found = [f"{c.get('system')}|{c.get('code')}" for v in concepts for c in _codings(v)]
        return f"{path} has codes {found or 'none'}, expected{_only(extras)} {system}|{code}"
    return Check(path, f"{path} coded {system}|{code}", fn, kind="coded", want=(system, code), extras=extras)


def instant(path: str, expected: str, tolerance_s: float = 60, extras: bool = False) -> Check:
    want = parse_instant(expected)

    def near(v: Any) -> bool:
        got = parse_instant(v)
        return got is not None and want is not None and abs((got - want).total_seconds()) < tolerance_s

    def fn(after: dict, before: dict | None) -> str | None:
        got = values(after, path)
        return None if _holds(got, near, extras) else f"{path} is {got or 'missing'}, expected{_only(extras)} {expected}"
    return Check(path, f"{path} at {expected}", fn)


def on_day(path: str, expected: str, extras: bool = False) -> Check:
    want = parse_day(expected)

    def fn(after: dict, before: dict | None) -> str | None:
        got = values(after, path)
        if _holds(got, lambda v: parse_day(v) == want, extras):
            return None
        return f"{path} is {got or 'missing'}, expected{_only(extras)} the day {expected}"
    return Check(path, f"{path} on {expected}", fn)


def present(path: str) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        return None if values(after, path) else f"{path} is missing"
    return Check(path, f"{path} present", fn)


def text_mentions(path: str, *words: str) -> Check:
    """Free text at ``path`` mentions every word (case-insensitive): notes, reasons."""
    def fn(after: dict, before: dict | None) -> str | None:
        text = " ".join(str(v) for v in values(after, path)).lower()
        missing = [w for w in words if w.lower() not in text]
        return None if not missing else f"{path} does not mention {missing}"
    return Check(path, f"{path} mentions {list(words)}", fn)


def same_id(expected: str) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        return None if norm_id(after.get("id", "")) == expected else f"id is {after.get('id')}, expected {expected}"
    return Check("id", f"id = {expected}", fn, light=False)


def custom(path: str, describe: str, fn: CheckFn) -> Check:
    return Check(path, describe, fn)


def _modifier_extensions(obj: Any, path: str = "") -> list[str]:
    """Paths of every ``modifierExtension`` url in a resource."""
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "modifierExtension" and isinstance(v, list):
                out += [f"{path}{k}[{e.get('url') if isinstance(e, dict) else e}]" for e in v]
            else:
                out += _modifier_extensions(v, f"{path}{k}.")
    elif isinstance(obj, list):
        for v in obj:
            out += _modifier_extensions(v, path)
    return out


def _status_codes(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value}
    return {c.get("code") for c in _codings(value) if isinstance(c.get("code"), str)}


def modifier_failures(after: dict, before: dict | None, checked: set[str]) -> list[str]:
    """Modifiers on a written resource that contradict what the expectation asks for.

    ``doNotPerform: true``, a status that cancels or negates (:data:`CANCELLING`), ``active: false`` and
    any ``modifierExtension`` change the meaning of every other element; one the expectation does not
    check and the before-state did not already carry is a contradiction.
    """
    before = before or {}
    out = [f"modifierExtension {m} changes the meaning" for m in _modifier_extensions(after)
           if m not in _modifier_extensions(before)]
    if after.get("doNotPerform") is True and "doNotPerform" not in checked and before.get("doNotPerform") is not True:
        out.append("doNotPerform: true makes it an order not to do it")
    if after.get("active") is False and "active" not in checked and before.get("active") is not False:
        out.append("active: false retires it")
    for element in MODIFIER_STATUSES:
        if element in checked:
            continue
        negating = (_status_codes(after.get(element)) - _status_codes(before.get(element))) & CANCELLING
        if negating:
            out.append(f"{element} {sorted(negating)} negates it")
    return out


@dataclass(frozen=True)
class Expect:
    """One required change. ``preserve`` (updates): every top-level element not named by a check keeps
    its prior value by FHIR type, ``text`` and ``meta`` (but for the server's ``versionId`` and
    ``lastUpdated``) included: an update that drops or rewrites data is wrong even if the checked fields
    are right."""

    op: str  # create | update | delete
    rtype: str
    id: str | None = None
    checks: tuple[Check, ...] = ()
    preserve: bool = True
    note: str = ""

    def describe(self) -> str:
        target = f"{self.rtype}/{self.id}" if self.id else f"a new {self.rtype}" if self.op == "create" else self.rtype
        parts = [c.describe for c in self.checks]
        return f"{self.op} {target}" + (f" with {', '.join(parts)}" if parts else "") + (
            f" ({self.note})" if self.note else "")

    def targets(self, change: Change) -> bool:
        return change.op == self.op and change.rtype == self.rtype and (self.id is None or change.id == self.id)

    def failures(self, change: Change) -> list[str]:
        """Why ``change`` does not satisfy this expectation (empty = it does)."""
        if not self.targets(change):
            return [f"{change.op} {change.key} is not {self.describe()}"]
        if change.after is None:
            return []
        out = [r for c in self.checks if (r := c(change.after, change.before))]
        touched = {c.path.split(".")[0] for c in self.checks}
        out += [f"{change.key}: {r}" for r in modifier_failures(change.after, change.before, touched)]
        if self.op == "update" and self.preserve and change.before is not None:
            before, after = content(change.before), content(change.after)
            for key in sorted(set(before) | set(after)):
                if key not in touched and not fhir_equal(before.get(key), after.get(key)):
                    out.append(f"{change.key}: {key} changed although the task does not ask for it")
        return out

    def light_ok(self, change: Change) -> bool:
        if not self.targets(change):
            return False
        if change.after is None:
            return True
        return all(values(change.after, c.path) for c in self.checks if c.light)


@dataclass
class Match:
    """How an episode's changes line up with the expectations."""

    unmet: list[tuple[Expect, list[str]]] = field(default_factory=list)
    collateral: list[Change] = field(default_factory=list)
    light_ok: bool = True

    @property
    def ok(self) -> bool:
        return not self.unmet and not self.collateral


def match(expects: list[Expect], changes: list[Change]) -> Match:
    """Assign changes to expectations (each change at most once), most constrained expectation first."""
    result = Match()
    free = list(changes)
    for exp in sorted(expects, key=lambda e: (e.id is None, -len(e.checks))):
        candidates = [c for c in free if exp.targets(c)]
        best = None
        best_reasons: list[str] | None = None
        for c in candidates:
            reasons = exp.failures(c)
            if not reasons:
                best, best_reasons = c, []
                break
            if best_reasons is None or len(reasons) < len(best_reasons):
                best, best_reasons = c, reasons
        if best is not None and best_reasons == []:
            free.remove(best)
        else:
            reasons = best_reasons if best_reasons else [f"no {exp.op} of {exp.rtype}"
                                                         + (f"/{exp.id}" if exp.id else "") + " was made"]
            result.unmet.append((exp, reasons))
            if best is not None:
                free.remove(best)  # the attempt at this expectation is not also collateral
    result.collateral = [c for c in free]
    # light: each expectation has some change of its kind with the elements present (values not enforced)
    result.light_ok = all(any(e.light_ok(c) for c in changes) for e in expects)
    return result
