"""The checks a task family's expected changes are made of: one public home for authors.

A check reads an element by a dotted path that flattens lists (``participant.actor.reference``) and
returns None when satisfied, else a short reason. Strict means exact where the meaning is single (every
value at the path must match); ``extras=True`` needs one match (a multi-valued element). ``light``
says whether light validation requires the element present.

    from fhirgym.tasks import Expect, checks as c
    Expect("create", "Observation", checks=(c.ref("subject", "Patient/p1"), c.coded("code", LOINC, "29463-7")))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ._answer import norm_id, parse_day, parse_instant
from ._diff import fhir_equal

#: A check returns None when satisfied, else a short reason.
CheckFn = Callable[[dict, dict | None], str | None]

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


def codings(concept: Any) -> list[dict]:
    """The Codings of a CodeableConcept, or the Coding itself."""
    if not isinstance(concept, dict):
        return []
    found = concept.get("coding", [concept]) if "coding" in concept else [concept]
    return [c for c in found if isinstance(c, dict)]


def coded(path: str, system: str | None, code: str, extras: bool = False,
          translations: Iterable[tuple[str, str]] = ()) -> Check:
    """The concept at ``path`` (a CodeableConcept or a Coding) is ``system|code``, exactly.

    Strict: every concept at the path carries the coding (any display; ``system`` None: any system) and no
    other coding, but for the ``translations`` the family declares ((system, code) pairs meaning the same
    concept): a second coding of another concept makes the element say two things. With ``extras`` (a
    multi-valued element), one concept at the path that is exactly this one is enough.
    """
    allowed = {(system, code), *translations}

    def is_it(c: dict) -> bool:
        return c.get("code") == code and (system is None or c.get("system") == system)

    def means_it(concept: Any) -> bool:
        found = codings(concept)
        return any(map(is_it, found)) and all(
            is_it(c) or (c.get("system"), c.get("code")) in allowed for c in found)

    def fn(after: dict, before: dict | None) -> str | None:
        concepts = values(after, path)
        if _holds(concepts, means_it, extras):
            return None
        found = [f"{c.get('system')}|{c.get('code')}" for v in concepts for c in codings(v)]
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


def unit_is(path: str, unit: str) -> Check:
    """The Quantity at ``path`` has this UCUM unit (its code or its unit text, case-insensitive)."""
    def fn(after: dict, before: dict | None) -> str | None:
        for q in values(after, path):
            if isinstance(q, dict) and unit.lower() in (str(q.get("code", "")).lower(),
                                                        str(q.get("unit", "")).lower()):
                return None
        return f"{path} has no quantity in {unit}: {values(after, path) or 'missing'}"
    return custom(path, f"{path} in {unit}", fn)


def number_near(path: str, expected: float, tolerance: float) -> Check:
    """A number at ``path`` within ``tolerance`` of ``expected``."""
    def fn(after: dict, before: dict | None) -> str | None:
        got = [v for v in values(after, path) if isinstance(v, int | float) and not isinstance(v, bool)]
        return None if any(abs(v - expected) <= tolerance for v in got) else \
            f"{path} is {got or 'missing'}, expected {expected:g} ± {tolerance:g}"
    return custom(path, f"{path} ≈ {expected:g}", fn)


def note_has(path: str, text: str) -> Check:
    """Free text at ``path`` contains ``text`` (case and white space ignored)."""
    want = " ".join(text.lower().split()).rstrip(".")

    def fn(after: dict, before: dict | None) -> str | None:
        got = " ".join(" ".join(str(v) for v in values(after, path)).lower().split())
        return None if want in got else f"{path} does not contain {text!r}"
    return custom(path, f"{path} contains the stated note", fn)


def may_set(path: str) -> Check:
    """Lets an update also set ``path`` (e.g. a reason nobody asked for) without counting it as a change
    the task forbids."""
    return Check(path, f"{path} may be set", lambda after, before: None, light=False)


def absent(*paths: str) -> Check:
    """None of these top-level elements is set."""
    def fn(after: dict, before: dict | None) -> str | None:
        there = [p for p in paths if after.get(p)]
        return f"{', '.join(there)} should not be set" if there else None
    return Check(paths[0], f"no {', '.join(paths)}", fn, light=False)


def at(path: str, expected: str) -> Check:
    """The instant at the top-level ``path`` is ``expected`` (any ISO form or offset), to the minute."""
    want = parse_instant(expected)

    def fn(after: dict, before: dict | None) -> str | None:
        for v in (after.get(path),) if not isinstance(after.get(path), list) else after[path]:
            got = parse_instant(v) if v else None
            if got is not None and want is not None and abs((got - want).total_seconds()) < 60:
                return None
        return f"{path} is {after.get(path) or 'missing'}, expected {expected}"
    return custom(path, f"{path} at {expected}", fn)


def digits(text: object) -> str:
    return "".join(ch for ch in str(text) if ch.isdigit())


def phone_check(phone: str) -> Check:
    """Some phone ContactPoint has this number (formatting and a leading country code 1 ignored)."""
    want = digits(phone)

    def fn(after: dict, before: dict | None) -> str | None:
        got = [t.get("value") for t in after.get("telecom") or [] if isinstance(t, dict)
               and t.get("system", "phone") == "phone"]
        ok = any(digits(g)[-10:] == want and len(digits(g)) in (10, 11) for g in got)
        return None if ok else f"telecom phones are {got or 'missing'}, expected {phone}"
    return custom("telecom", f"telecom has phone {phone}", fn)


def ref_id(value: Any, rtype: str | None = None) -> str:
    """The id a reference (dict or string) points to; "" when there is none, or it is not of ``rtype``."""
    key = ref_key(value)
    if not key or (rtype is not None and not key.startswith(rtype + "/")):
        return ""
    return key.split("/", 1)[1]
