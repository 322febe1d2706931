"""Helpers shared by the task families: cached world facts, names, references and prompt phrases.

Everything here reads the world through a :class:`~fhirgym.tasks.View` (gold side) and is cached per
world file, so sampling an instance costs microseconds after the first one.
"""

from __future__ import annotations

import hashlib
import random
from datetime import date, datetime
from typing import ClassVar

from .._family import Family, Gold, View

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


def negative_seed(view: View) -> bool:
    """Whether this instance is a "nothing found" one, in a family that offers that answer.

    Three of every ten consecutive seeds, at a phase of the family's own: over seeds 0–19 both kinds
    occur (6 negative, 14 positive), and a constant "nothing found" reply passes at most 30 % of such
    a family (under 5 % of the library).
    """
    phase = int(hashlib.sha256(view.family.encode()).hexdigest()[:8], 16) % 10
    return (view.seed + phase) % 10 < 3


class EitherWay(Family):
    """A family whose answer may be "nothing found": on :func:`negative_seed` seeds its own hooks
    (``sample_none``, ``setup_none``, ``gold_none``) draw a negative instance, on the others its positive
    sibling's (``found``, same prompt) draw one with an answer, so the reply cannot be guessed."""

    found: ClassVar[type[Family]]

    def sample(self, view: View, rng: random.Random) -> dict | None:
        negative = negative_seed(view)
        params = self.sample_none(view, rng) if negative else self.found.sample(self, view, rng)
        return None if params is None else {**params, "negative": negative}

    def setup(self, view: View, params: dict) -> list[dict]:
        return self.setup_none(view, params) if params["negative"] else self.found.setup(self, view, params)

    def gold(self, view: View, params: dict) -> Gold:
        return self.gold_none(view, params) if params["negative"] else self.found.gold(self, view, params)

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        raise NotImplementedError

    def setup_none(self, view: View, params: dict) -> list[dict]:
        return []

    def gold_none(self, view: View, params: dict) -> Gold:
        raise NotImplementedError


def deal(view: View, items: list):
    """The item of this seed from a shuffle of its own to the family: consecutive seeds take ``items`` in
    turn, so over 20 seeds none is drawn more than ⌈20/len⌉ times (the gold varies as far as the world lets
    it). A redraw (the sample did not fit) moves on to the next item."""
    if not items:
        return None
    order = sorted(range(len(items)), key=lambda i: hashlib.sha256(f"{view.family}|{i}".encode()).digest())
    return items[order[(view.seed + view.attempt) % len(items)]]


def deal_by_gold(view: View, rng: random.Random, candidates: list[tuple]):
    """For answers that many candidates share (counts): deal the distinct golds by seed (:func:`deal`), then
    draw a candidate with that gold. ``candidates`` are (gold, item) pairs; returns the item."""
    golds = sorted({g for g, _ in candidates})
    gold = deal(view, golds)
    return pick(rng, [item for g, item in candidates if g == gold])


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
