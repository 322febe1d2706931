"""Expected state changes and how an episode's changes are matched to them.

A writing task declares, at instance creation (before any agent acts), the changes its reference
produces: ``Expect(op, type, id?, checks)``, the checks from :mod:`fhirgym.tasks.checks`. Strict validation
needs every expectation met by a distinct change with all checks passing, and **no other change**
(collateral writes are reported). Light validation needs, per expectation, a change of the same operation
and type (and id, if fixed) in which the checked elements are present, whatever their values. Every
created or updated resource must also carry no modifier that contradicts the expectation
(:func:`modifier_failures`), and updates preserve everything not asked to change, ``text`` and ``meta``
included, compared by FHIR type (:func:`fhir_equal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._diff import Change, content, fhir_equal
from .checks import Check, codings, values

#: Values of a modifier status that cancel or negate what a resource says (FHIR R4 status value sets).
CANCELLING = frozenset({"entered-in-error", "cancelled", "revoked", "not-done", "not-taken", "refuted",
                        "stopped", "rejected", "noshow", "inactive", "resolved"})
#: Top-level modifier elements whose value can negate a resource, as codes or CodeableConcepts.
MODIFIER_STATUSES = ("status", "clinicalStatus", "verificationStatus")


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
    return {c.get("code") for c in codings(value) if isinstance(c.get("code"), str)}


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
