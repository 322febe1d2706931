"""World facts for task families: who is in the world, read once per world file and cached.

Everything here reads the world through a :class:`~fhirgym.tasks.View` (the gold side, never agents) and
is cached per world file (``View.cached``), so sampling an instance costs microseconds after the first.
"""

from __future__ import annotations

from ._family import View


def official_name(resource: dict) -> dict:
    names = resource.get("name") or [{}]
    return next((n for n in names if n.get("use") == "official"), names[0])


def full_name(resource: dict) -> str:
    """'Given Family' without prefixes (what a clinician would type)."""
    n = official_name(resource)
    return " ".join([*(n.get("given") or [])[:1], n.get("family", "")]).strip()


def patient_ref(p: dict) -> str:
    return f"Patient/{p['id']}"


def living_patients(view: View) -> list[dict]:
    """Patients of the world (base only, cached), alive, with a name and birth date, sorted by id."""
    def compute() -> list[dict]:
        pats = view.search("Patient", {"_count": "1000", "_elements": "name,birthDate,gender,deceased,identifier,address"})
        return sorted((p for p in pats if p.get("birthDate") and p.get("name")
                       and "deceasedDateTime" not in p and not p.get("deceasedBoolean")), key=lambda p: p["id"])
    return view.cached("living_patients", compute)


def unique_name_patients(view: View) -> list[dict]:
    """Living patients whose given+family name no other patient shares (a name alone identifies them)."""
    def compute() -> list[dict]:
        every = view.search("Patient", {"_count": "1000", "_elements": "name"})
        counts: dict[str, int] = {}
        for p in every:
            counts[full_name(p).lower()] = counts.get(full_name(p).lower(), 0) + 1
        return [p for p in living_patients(view) if counts.get(full_name(p).lower()) == 1]
    return view.cached("unique_name_patients", compute)


def all_patients(view: View) -> list[dict]:
    """Every Patient of the world (living or not) with name and birth date, sorted by id (cached)."""
    def compute() -> list[dict]:
        pats = view.search("Patient", {"_count": "1000", "_elements": "name,birthDate,gender,deceased"})
        return sorted((p for p in pats if p.get("name")), key=lambda p: p["id"])
    return view.cached("records.all_patients", compute)


def same_name(view: View, name: str) -> list[dict]:
    """Every Patient whose full name (given family) is ``name`` (cached index)."""
    def compute() -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for p in all_patients(view):
            out.setdefault(full_name(p), []).append(p)
        return out
    return view.cached("records.by_name", compute).get(name, [])


def unique_patient(view: View, name: str, birth_date: str) -> dict:
    """The one Patient (living or not) with this full name and birth date, from the cached world facts."""
    found = [p for p in same_name(view, name) if p.get("birthDate") == birth_date]
    assert len(found) == 1, f"{name} {birth_date} matches {len(found)} patients"
    return found[0]


def name_pairs(resource: dict) -> set[tuple[str, str]]:
    """(given, family) of every name of a resource, casefolded (official, maiden, every given name)."""
    out = set()
    for n in resource.get("name") or []:
        for g in n.get("given") or []:
            out.add((g.casefold(), str(n.get("family", "")).casefold()))
    return out


def taken_names(view: View) -> set[tuple[str, str]]:
    """(given, family) pairs any Patient or RelatedPerson of the world already has (cached)."""
    def compute() -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for p in all_patients(view):
            out |= name_pairs(p)
        for rp in view.search("RelatedPerson", {"_count": "1000", "_elements": "name"}):
            out |= name_pairs(rp)
        return out
    return view.cached("records.taken_names", compute)
