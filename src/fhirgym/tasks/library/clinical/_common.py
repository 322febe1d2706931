"""What more than one of the clinical modules uses: world facts, phrasing, checks and reference steps."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

from ....spec.codes import (
    LOINC,
    MRN,
    OBSERVATION_CATEGORY,
    RXNORM,
    SNOMED,
    UCUM,
)
from ....tools import Toolbox
from ... import Family, View
from ...draw import who
from ...facts import official_name, patients, results
from ...solve import search_all

VALID = ("final", "amended", "corrected")


ORAL_ROUTE = ("26643006", "Oral route")


ERROR_NOTE = "Value keyed in with a misplaced decimal point; entered in error."


#: LOINC -> (display, words a clinician uses, UCUM unit, low, high, decimals) of the labs setups chart.
LABS = {
    "19123-9": ("Magnesium [Mass/volume] in Serum or Plasma", "serum magnesium", "mg/dL", 1.0, 2.6, 1),
    "2823-3": ("Potassium [Moles/volume] in Serum or Plasma", "serum potassium", "mmol/L", 2.9, 5.6, 1),
    "2951-2": ("Sodium [Moles/volume] in Serum or Plasma", "serum sodium", "mmol/L", 128, 147, 0),
    "2160-0": ("Creatinine [Mass/volume] in Serum or Plasma", "serum creatinine", "mg/dL", 0.6, 2.8, 1),
    "718-7": ("Hemoglobin [Mass/volume] in Blood", "hemoglobin", "g/dL", 7.5, 15.5, 1),
    "2345-7": ("Glucose [Mass/volume] in Serum or Plasma", "serum glucose", "mg/dL", 70, 260, 0),
    "4548-4": ("Hemoglobin A1c/Hemoglobin.total in Blood", "hemoglobin A1c", "%", 5.2, 10.5, 1),
}


#: Codes whose world results would blur a setup's answer (the same analyte under a second code).
RELATED = {"2823-3": ("2823-3", "6298-4"), "2951-2": ("2951-2", "2947-0"), "2160-0": ("2160-0", "38483-4"),
           "2345-7": ("2345-7", "2339-0")}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _people(view: View) -> list[dict]:
    """Living patients with an active record, a name, a birth date and an MRN (name+birth date unique)."""
    def compute() -> list[dict]:
        found = []
        for p in patients(view):
            if p.get("active") is False or "deceasedDateTime" in p or p.get("deceasedBoolean"):
                continue
            name = official_name(p)
            given, family = ((name.get("given") or [""])[0], name.get("family", ""))
            mrn = next((i.get("value") for i in p.get("identifier", []) if i.get("system") == MRN),
                       None)
            if p.get("birthDate") and given and family and mrn:
                found.append({"pid": p["id"], "given": given, "family": family, "birth": p["birthDate"][:10],
                              "mrn": mrn})
        keys = defaultdict(int)
        for f in found:
            keys[(f["given"].lower(), f["family"].lower(), f["birth"])] += 1
        return sorted((f for f in found if keys[(f["given"].lower(), f["family"].lower(), f["birth"])] == 1),
                      key=lambda f: f["pid"])
    return view.cached("clin_people", compute)


def _adults(view: View) -> list[dict]:
    def compute() -> list[dict]:
        return [p for p in _people(view) if _age(p["birth"], view.anchor) >= 18]
    return view.cached("clin_adults", compute)


def _age(birth: str, day: date) -> int:
    born = date.fromisoformat(birth)
    return day.year - born.year - ((day.month, day.day) < (born.month, born.day))


def _world_results(view: View, pid: str, codes: tuple[str, ...]) -> list[tuple]:
    return results(view, codes).get(pid, [])


def _quiet_since(view: View, pid: str, codes: tuple[str, ...], since: datetime) -> bool:
    """No world result with these codes (any status) at or after ``since``."""
    return all(r[0] < since for r in _world_results(view, pid, codes))


def _patient_params(person: dict, rng: random.Random, by_mrn: bool | None = None) -> dict:
    return {**person, "by_mrn": rng.random() < 0.5 if by_mrn is None else by_mrn}


def _who(params: dict) -> str:
    if params["by_mrn"]:
        return f"the patient with MRN {params['mrn']}"
    return who(f"{params['given']} {params['family']}", params["birth"])


def _locate(tools: Toolbox, params: dict) -> str:
    """The reference's patient lookup: by MRN, or by family name and birth date then the given name."""
    if params["by_mrn"]:
        hits = search_all(tools, "Patient", {"identifier": params["mrn"]})
        hits = [p for p in hits if any(i.get("value") == params["mrn"] for i in p.get("identifier", []))]
    else:
        hits = search_all(tools, "Patient", {"family": params["family"], "birthdate": params["birth"]})
        hits = [p for p in hits if (official_name(p).get("given") or [""])[0] == params["given"]]
    assert len(hits) == 1, f"reference found {len(hits)} patients for {params}"
    return hits[0]["id"]


def _results(tools: Toolbox, pid: str, code: str, since: datetime | None = None,
             newest: bool = False) -> list[dict]:
    """Valid results (not entered in error) of LOINC code(s) for a patient, newest first (``newest``: the
    first page only, enough for "the latest")."""
    query = {"patient": pid, "code": ",".join(f"{LOINC}|{c}" for c in code.split(",")), "_sort": "-date",
             "_count": "15", "_elements": "status,effectiveDateTime,valueQuantity,code"}
    if since is not None:
        query["date"] = f"ge{_iso(since)}"
    return [o for o in search_all(tools, "Observation", query, all_pages=not newest) if o.get("status") in VALID]


def _observation(rid: str, pid: str, code: str, display: str, value: float, unit: str, when: datetime,
                 status: str = "final", category: str = "laboratory") -> dict:
    label = "Vital Signs" if category == "vital-signs" else "Laboratory"
    obs = {"resourceType": "Observation", "id": rid, "status": status,
           "category": [{"coding": [{"system": OBSERVATION_CATEGORY, "code": category, "display": label}]}],
           "code": {"coding": [{"system": LOINC, "code": code, "display": display}], "text": display},
           "subject": {"reference": f"Patient/{pid}"}, "effectiveDateTime": _iso(when),
           "valueQuantity": {"value": value, "unit": unit, "system": UCUM, "code": unit}}
    if status == "entered-in-error":
        obs["note"] = [{"text": ERROR_NOTE}]
    return obs


def _draw_resources(view: View, prefix: str, pid: str, code: str, draws: list[list]) -> list[dict]:
    display, _, unit, *_ = LABS[code]
    now = view.now
    return [_observation(view.new_id(f"{prefix}-{n}"), pid, code, display, value, unit,
                         now - timedelta(minutes=minutes), status)
            for n, (minutes, value, status) in enumerate(draws, 1)]


def _voided_first(view: View, pid: str, codes: tuple[str, ...]) -> bool | None:
    """The distractor probe of the lab questions: None when no entered-in-error copy of these labs is on the
    chart, else whether the newest result (the first hit of ``Observation?patient&code&_sort=-date``) is one."""
    hits = view.search("Observation", {"patient": f"Patient/{pid}", "code": ",".join(f"{LOINC}|{c}" for c in codes),
                                       "_sort": "-date", "_elements": "status"})
    if not any(o.get("status") == "entered-in-error" for o in hits):
        return None
    return hits[0].get("status") == "entered-in-error"


def _all_results(view: View, pid: str, code: str, draws: list[list]) -> list[tuple]:
    """(effective, status, value) of the pre-run state: the world's results plus the setup's, oldest first."""
    rows = [(r[0], r[1], r[2]) for r in _world_results(view, pid, (code,)) if r[3] == code]
    rows += [(view.now - timedelta(minutes=m), s, v) for m, v, s in draws]
    return sorted(rows, key=lambda r: r[0])


def _latest_valid(rows: list[tuple], now: datetime, since: datetime | None = None) -> tuple | None:
    ok = [r for r in rows
          if r[1] in VALID and r[0] <= now and (since is None or r[0] >= since) and r[2] is not None]
    return ok[-1] if ok else None


def _lab_value(rng: random.Random, code: str, lo: float | None = None,
               hi: float | None = None) -> float | int:
    _, _, _, low, high, decimals = LABS[code]
    lo, hi = (low if lo is None else lo), (high if hi is None else hi)
    steps = round((hi - lo) * 10 ** decimals)
    value = round(lo + rng.randint(0, steps) / 10 ** decimals, decimals)
    return int(value) if decimals == 0 else value


def _slip(rng: random.Random, value: float, up: bool | None = None) -> float:
    """A decimal-point slip of ``value`` (x10 or /10), as the world's entered-in-error copies have."""
    up = rng.random() < 0.5 if up is None else up
    return round(value * 10 if up else value / 10, 2)


def _medication_request(pid: str, rx: tuple[str, str], dose: float, unit: str, route: tuple[str, str],
                        now: datetime, text: str, timing: dict | None = None) -> dict:
    dosage: dict = {
        "text": text, "route": {"coding": [{"system": SNOMED, "code": route[0], "display": route[1]}]},
        "doseAndRate": [{"doseQuantity": {"value": dose, "unit": unit, "system": UCUM, "code": unit}}]}
    if timing:
        dosage["timing"] = timing
    return {"resourceType": "MedicationRequest", "status": "active", "intent": "order",
            "medicationCodeableConcept": {"coding": [{"system": RXNORM, "code": rx[0], "display": rx[1]}],
                                          "text": rx[1]},
            "subject": {"reference": f"Patient/{pid}"}, "authoredOn": _iso(now),
            "dosageInstruction": [dosage]}


def _service_request(pid: str, system: str, code: str, display: str, now: datetime, **extra: object) -> dict:
    return {"resourceType": "ServiceRequest", "status": "active", "intent": "order",
            "code": {"coding": [{"system": system, "code": code, "display": display}], "text": display},
            "subject": {"reference": f"Patient/{pid}"}, "authoredOn": _iso(now), **extra}


class _Clinical(Family):
    category = "clinical"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]
