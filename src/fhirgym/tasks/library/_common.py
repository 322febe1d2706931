"""Helpers shared by the task families: cached world facts, names, references and prompt phrases.

Everything here reads the world through a :class:`~fhirgym.tasks.View` (gold side) and is cached per
world file, so sampling an instance costs microseconds after the first one.
"""

from __future__ import annotations

import random
from datetime import date, datetime

from .._family import View

SNOMED = "http://snomed.info/sct"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"


def official_name(resource: dict) -> dict:
    names = resource.get("name") or [{}]
    return next((n for n in names if n.get("use") == "official"), names[0])


def full_name(resource: dict) -> str:
    """'Given Family' without prefixes (what a clinician would type)."""
    n = official_name(resource)
    return " ".join([*(n.get("given") or [])[:1], n.get("family", "")]).strip()


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


def pick(rng: random.Random, items: list):
    return items[rng.randrange(len(items))] if items else None


def human_date(d: date | str) -> str:
    """'March 4, 1961' — how people write dates in requests."""
    d = date.fromisoformat(d) if isinstance(d, str) else d
    return f"{d.strftime('%B')} {d.day}, {d.year}"


def human_time(t: datetime) -> str:
    return t.strftime("%H:%M")


def patient_ref(p: dict) -> str:
    return f"Patient/{p['id']}"
