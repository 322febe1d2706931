"""What more than one of the orders modules uses: world facts, phrasing, checks and reference steps."""

from __future__ import annotations

from collections import Counter
from datetime import date

from ....tools import Toolbox
from ... import View
from ...checks import ref_id
from ...facts import (
    full_name,
    identifiable_patients,
    practitioners,
    roles,
)
from ...solve import call, find_patients


def _patients(view: View) -> dict[str, dict]:
    """Active living patients whose name and birth date identify them: id -> {name, birth_date, adult}."""
    def compute() -> dict[str, dict]:
        adult_before = date(view.anchor.year - 18, view.anchor.month, min(view.anchor.day, 28)).isoformat()
        return {p["id"]: {"id": p["id"], "name": full_name(p), "birth_date": p["birthDate"],
                          "adult": p["birthDate"] <= adult_before} for p in identifiable_patients(view)}
    return view.cached("orders_patients", compute)


def _doctors(view: View) -> dict[str, dict]:
    """Active practitioners with a unique full name and an active role: id -> {name, specialties}."""
    def compute() -> dict[str, dict]:
        prs = list(practitioners(view).values())
        counts = Counter(full_name(p).lower() for p in prs)
        specialties: dict[str, set[str]] = {}
        for r in roles(view).values():
            if r.get("active") is False:
                continue
            texts = {(s.get("text") or next((c.get("display", "") for c in s.get("coding", [])), "")).lower()
                     for s in r.get("specialty", [])}
            specialties.setdefault(ref_id(r.get("practitioner")), set()).update(texts)
        return {p["id"]: {"id": p["id"], "name": full_name(p), "specialties": sorted(specialties[p["id"]])}
                for p in sorted(prs, key=lambda p: p["id"])
                if p.get("active") is not False and p["id"] in specialties and counts[full_name(p).lower()] == 1
                and full_name(p)}
    return view.cached("orders_doctors", compute)


def _doctors_with(view: View, *words: str) -> list[dict]:
    return [d for d in _doctors(view).values() if any(w in s for s in d["specialties"] for w in words)]


def _find_patient(tools: Toolbox, name: str, birth_date: str) -> dict:
    found = find_patients(tools, name, birth_date)
    return found[0] if found else {"id": "unknown"}


def _find_doctor(tools: Toolbox, name: str) -> str:
    given, family = name.split()[0], name.split()[-1]
    out = call(tools, "searchResources", {"resourceType": "Practitioner", "params": {
        "given": given, "family": family, "active": "true"}})
    found = [p for p in out.get("resources", []) if full_name(p) == name]
    return found[0]["id"] if found else "unknown"
