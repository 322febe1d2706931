"""Expected state changes and the checks on them.

A writing task declares, at instance creation (before any agent acts), the changes its reference
produces: ``Expect(op, type, id?, checks)``. Strict validation needs every expectation met by a distinct
change with all checks passing, and **no other change** (collateral writes are reported). Light
validation needs, per expectation, a change of the same operation and type (and id, if fixed) in which
the checked elements are present, whatever their values.

Checks read elements by dotted paths that flatten lists (``participant.actor.reference``) and compare
the way a careful reviewer would: references by type/id (absolute or relative), codings by system and
code anywhere in a CodeableConcept, instants as moments in time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._answer import norm_id, parse_day, parse_instant
from ._diff import Change

#: A check returns None when satisfied, else a short reason.
CheckFn = Callable[[dict, dict | None], str | None]

IGNORED_ON_PRESERVE = frozenset({"meta", "text"})


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

    def __call__(self, after: dict, before: dict | None) -> str | None:
        return self.fn(after, before)


def eq(path: str, expected: Any) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        got = values(after, path)
        return None if expected in got else f"{path} is {got or 'missing'}, expected {expected!r}"
    return Check(path, f"{path} = {expected!r}", fn)


def one_of(path: str, allowed: Iterable[Any]) -> Check:
    allowed = tuple(allowed)

    def fn(after: dict, before: dict | None) -> str | None:
        got = values(after, path)
        return None if any(g in allowed for g in got) else f"{path} is {got or 'missing'}, expected one of {allowed}"
    return Check(path, f"{path} in {allowed}", fn)


def ref(path: str, target: str) -> Check:
    """Some reference at ``path`` points to ``target`` (``Type/id``)."""
    want = ref_key(target)

    def fn(after: dict, before: dict | None) -> str | None:
        got = [ref_key(v) for v in values(after, path)]
        return None if want in got else f"{path} references {[g for g in got if g] or 'nothing'}, expected {want}"
    return Check(path, f"{path} → {want}", fn)


def refs_exactly(path: str, targets: Iterable[str]) -> Check:
    """The references at ``path`` are exactly ``targets`` (as a set): none missing, none extra."""
    want = {ref_key(t) for t in targets}

    def fn(after: dict, before: dict | None) -> str | None:
        got = {ref_key(v) for v in values(after, path)} - {None}
        if got == want:
            return None
        return f"{path} references {sorted(got)}, expected exactly {sorted(want)}"
    return Check(path, f"{path} → exactly {sorted(want)}", fn)


def coded(path: str, system: str | None, code: str) -> Check:
    """A Coding (at ``path`` or in the CodeableConcept there) with this system and code."""
    def fn(after: dict, before: dict | None) -> str | None:
        codings = []
        for v in values(after, path):
            if isinstance(v, dict):
                codings.extend(v.get("coding", [v]) if "coding" in v else [v])
        ok = any(c.get("code") == code and (system is None or c.get("system") == system)
                 for c in codings if isinstance(c, dict))
        if ok:
            return None
        found = [f"{c.get('system')}|{c.get('code')}" for c in codings if isinstance(c, dict)]
        return f"{path} has codes {found or 'none'}, expected {system}|{code}"
    return Check(path, f"{path} coded {system}|{code}", fn)


def instant(path: str, expected: str, tolerance_s: float = 60) -> Check:
    want = parse_instant(expected)

    def fn(after: dict, before: dict | None) -> str | None:
        for v in values(after, path):
            got = parse_instant(v)
            if got is not None and want is not None and abs((got - want).total_seconds()) < tolerance_s:
                return None
        return f"{path} is {values(after, path) or 'missing'}, expected {expected}"
    return Check(path, f"{path} at {expected}", fn)


def on_day(path: str, expected: str) -> Check:
    want = parse_day(expected)

    def fn(after: dict, before: dict | None) -> str | None:
        got = [parse_day(v) for v in values(after, path)]
        return None if want in got else f"{path} is {values(after, path) or 'missing'}, expected the day {expected}"
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


@dataclass(frozen=True)
class Expect:
    """One required change. ``preserve`` (updates): every top-level element not named by a check keeps
    its prior value (an update that drops data is wrong even if the checked fields are right)."""

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
        if self.op == "update" and self.preserve and change.before is not None:
            touched = {c.path.split(".")[0] for c in self.checks}
            for key in sorted(set(change.before) | set(change.after)):
                if key in touched or key in IGNORED_ON_PRESERVE:
                    continue
                if change.before.get(key) != change.after.get(key):
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
