"""Clinical orders and chart questions in the style of MedAgentBench.

Reads (a patient by MRN, age, recent and mean labs, the last HbA1c, active drugs, the last visit) and
writes (vital signs, conditional orders, referrals, prescriptions, allergies, immunizations, voiding a
mis-charted observation). Setups add at most two labs near the frozen ``now``, so every branch occurs in
every world, and mix in the world's ambiguity; a conditional order whose other branch writes nothing is a
pair of families with one prompt, since every instance of a writing family must write. Gold reads cached
base-world indexes plus the instance's own setup, never the reference solution (docs/TASKS.md,
"The built-in library").
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

from ...spec.codes import (
    ACT_SITE,
    ALLERGY_CLINICAL,
    ALLERGY_VERIFICATION,
    CVX,
    LOINC,
    MRN,
    OBSERVATION_CATEGORY,
    RXNORM,
    SNOMED,
    UCUM,
)
from ...tools import Toolbox
from .. import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ..checks import (
    Check,
    coded,
    custom,
    eq,
    instant,
    may_set,
    note_has,
    number_near,
    on_day,
    ref,
    ref_id,
    unit_is,
)
from ..draw import Branched, deal, deal_by_gold, deal_positive, human_date, negative_seed, pick, who
from ..facts import moment, official_name, patients, results
from ..solve import call, create, search_all

VALID = ("final", "amended", "corrected")
IV_ROUTE = ("47625008", "Intravenous route")
ORAL_ROUTE = ("26643006", "Oral route")
DRUG_ELEMENTS = "medicationCodeableConcept,medicationReference"
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
GLUCOSE = ("2339-0", "2345-7")


# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")







def _rx(concept: dict | None) -> dict | None:
    return next((c for c in (concept or {}).get("coding", []) if c.get("system") == RXNORM), None)


# ------------------------------------------------------------------------------------------------
# cached base-world facts (keys prefixed clin_)
# ------------------------------------------------------------------------------------------------


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


def _all_mrns(view: View) -> dict[str, list[str]]:
    """MRN -> ids of every patient (living or not) with that MRN."""
    def compute() -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for p in patients(view):
            for i in p.get("identifier", []):
                if i.get("system") == MRN and i.get("value"):
                    out[i["value"]].append(p["id"])
        return dict(out)
    return view.cached("clin_mrns", compute)


def _age(birth: str, day: date) -> int:
    born = date.fromisoformat(birth)
    return day.year - born.year - ((day.month, day.day) < (born.month, born.day))


def _world_results(view: View, pid: str, codes: tuple[str, ...]) -> list[tuple]:
    return results(view, codes).get(pid, [])


def _quiet_since(view: View, pid: str, codes: tuple[str, ...], since: datetime) -> bool:
    """No world result with these codes (any status) at or after ``since``."""
    return all(r[0] < since for r in _world_results(view, pid, codes))


def _medications(view: View) -> dict[str, dict]:
    """Medication id -> its RxNorm coding."""
    def compute() -> dict[str, dict]:
        return {m["id"]: rx for m in view.search("Medication", {"_count": "1000", "_elements": "code"})
                if (rx := _rx(m.get("code")))}
    return view.cached("clin_medications", compute)


def _med_requests(view: View) -> dict[str, list[dict]]:
    """Patient id -> [{id, status, code, display, authored}] of the world's MedicationRequests (drug
    resolved through Medication references)."""
    def compute() -> dict[str, list[dict]]:
        meds = _medications(view)
        out: dict[str, list[dict]] = defaultdict(list)
        query = {"_count": "1000",
                 "_elements": "subject,status,medicationCodeableConcept,medicationReference,authoredOn"}
        for m in view.search("MedicationRequest", query):
            pid = ref_id(m.get("subject"), "Patient") or None
            rx = _rx(m.get("medicationCodeableConcept")) or meds.get(
                ref_id(m.get("medicationReference"), "Medication"))
            if pid and rx:
                out[pid].append({"id": m["id"], "status": m.get("status"), "code": rx["code"],
                                 "display": rx.get("display", ""), "authored": m.get("authoredOn", "")})
        return dict(out)
    return view.cached("clin_med_requests", compute)


def _visits(view: View) -> dict[str, list[tuple]]:
    """Patient id -> sorted [(start, SNOMED type code, type display)] of ambulatory encounters."""
    def compute() -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = defaultdict(list)
        query = {"class": "AMB", "_count": "1000", "_elements": "subject,period,type"}
        for e in view.search("Encounter", query):
            pid, start = ref_id(e.get("subject"), "Patient") or None, (e.get("period") or {}).get("start")
            coding = next((c for t in e.get("type", []) for c in t.get("coding", [])
                           if c.get("system") == SNOMED), None)
            if pid and start and coding:
                out[pid].append((moment(start), coding["code"], coding.get("display", "")))
        for rows in out.values():
            rows.sort()
        return dict(out)
    return view.cached("clin_visits", compute)


def _allergy_codes(view: View) -> dict[str, set[str]]:
    def compute() -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for a in view.search("AllergyIntolerance", {"_count": "1000", "_elements": "patient,code"}):
            pid = ref_id(a.get("patient"), "Patient") or None
            if pid:
                out[pid] |= {c.get("code") for c in a.get("code", {}).get("coding", [])}
        return dict(out)
    return view.cached("clin_allergies", compute)


# ------------------------------------------------------------------------------------------------
# patients in prompts and in reference solutions
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# setup labs: params carry [minutes before now, value, status]; resources are built at setup time
# ------------------------------------------------------------------------------------------------
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


def _shadow(view: View, rng: random.Random, pid: str, codes: tuple[str, ...]) -> dict | None:
    """An entered-in-error copy (a decimal slip) to chart minutes after the patient's latest valid result of
    these codes, the trap a plain newest-first search falls into; None when the chart already holds one
    or the latest result is too close to now."""
    rows = [r for r in results(view, codes).get(pid, []) if r.at <= view.now]
    valid = [r for r in rows if r.status in VALID and r.value is not None]
    if not valid or any(r.status == "entered-in-error" and r.at > valid[-1].at for r in rows):
        return None
    latest, minutes = valid[-1], rng.randint(3, 40)
    if latest.at + timedelta(minutes=minutes) > view.now:
        return None
    return {"of": latest.id, "id": view.new_id("shadow"), "minutes": minutes, "value": _slip(rng, latest.value)}


def _shadow_resources(view: View, shadow: dict | None) -> list[dict]:
    """The copy :func:`_shadow` describes, made as the world makes its own (``world._clinical``)."""
    if shadow is None:
        return []
    real = view.read("Observation", shadow["of"])
    assert real is not None
    wrong = {k: v for k, v in copy.deepcopy(real).items() if k not in ("meta", "interpretation", "referenceRange")}
    wrong.update(id=shadow["id"], status="entered-in-error",
                 effectiveDateTime=_iso(moment(real["effectiveDateTime"]) + timedelta(minutes=shadow["minutes"])),
                 note=[{"text": "Value keyed in with a misplaced decimal point; entered in error."}])
    wrong["valueQuantity"]["value"] = shadow["value"]
    return [wrong]


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


# ------------------------------------------------------------------------------------------------
# checks shared by the writing families
# ------------------------------------------------------------------------------------------------








def _vital_checks(pid: str, code: str, now: datetime) -> tuple[Check, ...]:
    return (ref("subject", f"Patient/{pid}"), eq("status", "final"),
            coded("category", OBSERVATION_CATEGORY, "vital-signs"), coded("code", LOINC, code),
            instant("effectiveDateTime", _iso(now), tolerance_s=300))


def _new_vital(pid: str, code: str, display: str, now: datetime) -> dict:
    return {"resourceType": "Observation", "status": "final",
            "category": [{"coding": [{"system": OBSERVATION_CATEGORY, "code": "vital-signs",
                                      "display": "Vital Signs"}]}],
            "code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
            "subject": {"reference": f"Patient/{pid}"}, "effectiveDateTime": _iso(now)}




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


# ================================================================================================
# reads
# ================================================================================================
@register("clinical.patient_by_mrn", difficulty=1, touches=("Patient",), sequences=(("searchResources",),))
class PatientByMrn(_Clinical):
    """Find a patient's record id from their MRN (or report that none has it)

    Some MRNs belong to nobody: the agent must answer "not found" rather than guess."""

    answer = AnswerSpec((Field("patient_id", "id", "the Patient resource id"),), none_allowed=True)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        if negative_seed(view):
            taken = _all_mrns(view)
            mrn = str(rng.randint(1_000_000, 9_999_999))
            return None if mrn in taken else {"mrn": mrn}
        person = pick(rng, _people(view))
        return {"mrn": person["mrn"]}

    def prompt(self, params: dict) -> str:
        return (f"Which patient has the medical record number (MRN) {params['mrn']}? "
                "I need the id of their patient record.")

    def gold(self, view: View, params: dict) -> Gold:
        hits = _all_mrns(view).get(params["mrn"], [])
        assert len(hits) <= 1, f"MRN {params['mrn']} is shared"
        return Gold(answer={"patient_id": hits[0]} if hits else NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        hits = [p for p in search_all(tools, "Patient", {"identifier": params["mrn"]})
                if any(i.get("value") == params["mrn"] for i in p.get("identifier", []))]
        return answer_text({"patient_id": hits[0]["id"]}) if hits else answer_text(NOT_FOUND)


@register("clinical.patient_mrn", difficulty=1, touches=("Patient",), sequences=(("searchResources",),))
class PatientMrn(_Clinical):
    """Give a patient's MRN from their name and date of birth

    The world has same-name patients: only the birth date tells which MRN is meant."""

    answer = AnswerSpec((Field("mrn", "text", "the medical record number"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        return _patient_params(pick(rng, _people(view)), rng, by_mrn=False)

    def prompt(self, params: dict) -> str:
        return f"What is the medical record number (MRN) of {_who(params)}?"

    def gold(self, view: View, params: dict) -> Gold:
        person = next(p for p in _people(view) if p["pid"] == params["pid"])
        return Gold(answer={"mrn": person["mrn"]})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        patient = call(tools, "getResourceById", {"resourceType": "Patient", "resourceId": pid})
        mrn = next(i["value"] for i in patient.get("identifier", []) if i.get("system") == MRN)
        return answer_text({"mrn": mrn})


@register("clinical.patient_age", difficulty=1, touches=("Patient",), sequences=(("searchResources",),))
class PatientAge(_Clinical):
    """Age in whole years today of the patient with a given MRN

    Age on the frozen today (birthdays near today make off-by-one answers wrong)."""

    answer = AnswerSpec((Field("age", "int", "age in completed years today"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        return _patient_params(pick(rng, _people(view)), rng, by_mrn=True)

    def prompt(self, params: dict) -> str:
        return f"How old is {_who(params)} today, in completed years?"

    def gold(self, view: View, params: dict) -> Gold:
        person = next(p for p in _people(view) if p["pid"] == params["pid"])
        return Gold(answer={"age": _age(person["birth"], view.now.date())})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        patient = call(tools, "getResourceById", {"resourceType": "Patient", "resourceId": pid})
        return answer_text({"age": _age(patient["birthDate"], now.date())})


@register("clinical.lab_last_24h", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LabLast24h(_Clinical):
    """Latest value of a lab within the last 24 hours (or nothing found)

    A window filter, an entered-in-error copy more recent than the real result; often nothing qualifies."""

    answer = AnswerSpec((Field("value", "number", "the result in the unit the lab reports"),),
                        none_allowed=True)
    CODES = ("19123-9", "2823-3", "2951-2", "2160-0", "718-7")

    def sample(self, view: View, rng: random.Random) -> dict | None:
        code = rng.choice(self.CODES)
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], RELATED.get(code, (code,)), view.now - timedelta(days=5)):
            return None
        if not negative_seed(view):  # a result inside the window, often shadowed by a newer entered-in-error copy
            recent, value = rng.randint(30, 22 * 60), _lab_value(rng, code)
            draws = [[recent, value, "final"]]
            other = rng.random()
            if other < 0.5:
                draws.append([rng.randint(5, recent - 5), _slip(rng, value), "entered-in-error"])
            elif other < 0.8:
                draws.append([rng.randint(27 * 60, 70 * 60), _lab_value(rng, code), "final"])
        else:  # only an older result, and often an entered-in-error one inside the window
            draws = [[rng.randint(27 * 60, 70 * 60), _lab_value(rng, code), "final"]]
            if rng.random() < 0.7:
                wrong = _slip(rng, _lab_value(rng, code))
                draws.append([rng.randint(30, 22 * 60), wrong, "entered-in-error"])
        return {**_patient_params(person, rng), "code": code, "draws": draws}

    def prompt(self, params: dict) -> str:
        _, words, unit, *_ = LABS[params["code"]]
        return (f"What is the most recent {words} (LOINC {params['code']}) of {_who(params)} from the last "
                f"24 hours? Give the value in {unit}.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "lab", params["pid"], params["code"], params["draws"])

    def gold(self, view: View, params: dict) -> Gold:
        rows = _all_results(view, params["pid"], params["code"], params["draws"])
        latest = _latest_valid(rows, view.now, since=view.now - timedelta(hours=24))
        return Gold(answer={"value": latest[2]} if latest else NOT_FOUND)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], (params["code"],))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, params["code"], since=now - timedelta(hours=24))
                 if moment(o["effectiveDateTime"]) <= now]
        return answer_text({"value": found[0]["valueQuantity"]["value"]}) if found else answer_text(NOT_FOUND)


@register("clinical.lab_mean", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LabMean(_Clinical):
    """Mean of a lab's results between two dates

    Averaging needs every valid result of the window and none outside it (hospital stays chart labs
    daily; the world's entered-in-error copies sometimes fall inside)."""

    answer = AnswerSpec((Field("mean", "number", "the average, rounded to one decimal", tolerance=0.06),))
    CODES = ("2345-7", "2823-3", "2951-2", "2160-0", "718-7")

    def sample(self, view: View, rng: random.Random) -> dict | None:
        code = rng.choice(self.CODES)
        candidates = [p for p in _adults(view)
                      if sum(r[1] in VALID for r in _world_results(view, p["pid"], (code,))) >= 2]
        person = pick(rng, candidates)
        if person is None:
            return None
        rows = [r for r in _world_results(view, person["pid"], (code,)) if r[2] is not None]
        pivot = rng.choice([r for r in rows if r[1] in VALID])[0].date()
        first = pivot - timedelta(days=rng.randint(0, 2))
        last = pivot + timedelta(days=rng.randint(0, 3))
        inside = [r for r in rows if first <= r[0].date() <= last]
        if last >= view.now.date() or sum(r[1] in VALID for r in inside) < 2:
            return None
        return {**_patient_params(person, rng), "code": code, "first": first.isoformat(),
                "last": last.isoformat()}

    def prompt(self, params: dict) -> str:
        _, words, unit, *_ = LABS[params["code"]]
        return (f"What was the average {words} (LOINC {params['code']}, in {unit}) of {_who(params)} from "
                f"{human_date(params['first'])} through {human_date(params['last'])} (UTC dates, both days "
                "included)? Round to one decimal.")

    def gold(self, view: View, params: dict) -> Gold:
        first, last = date.fromisoformat(params["first"]), date.fromisoformat(params["last"])
        found = [r[2] for r in _world_results(view, params["pid"], (params["code"],))
                 if r[1] in VALID and r[2] is not None and first <= r[0].date() <= last]
        assert len(found) >= 2
        return Gold(answer={"mean": sum(found) / len(found)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        end = date.fromisoformat(params["last"]) + timedelta(days=1)
        query = {"patient": pid, "code": f"{LOINC}|{params['code']}",
                 "date": [f"ge{params['first']}", f"lt{end}"],
                 "_count": "15", "_elements": "status,effectiveDateTime,valueQuantity"}
        found = [o["valueQuantity"]["value"] for o in search_all(tools, "Observation", query)
                 if o["status"] in VALID]
        return answer_text({"mean": round(sum(found) / len(found), 1)})


@register("clinical.latest_glucose", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LatestGlucose(_Clinical):
    """Most recent glucose value and when it was taken

    Two glucose codes (blood, serum) to merge, and an entered-in-error copy (world or setup) just after the
    real latest. Always a patient with a result: "none on file" is last_hba1c's branch (each family offering
    it adds its negative seeds to what a blind "nothing found" reply scores)."""

    answer = AnswerSpec((Field("value", "number", "the glucose in mg/dL"),
                         Field("taken", "datetime", "when it was taken")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        tested = view.cached("clin_glucose_tested", lambda: [p for p in _people(view) if any(
            r.status in VALID and r.value is not None for r in _world_results(view, p["pid"], GLUCOSE))])
        person = deal(view, tested)  # by seed: no patient is the gold of many seeds
        if person is None:
            return None
        rows = _world_results(view, person["pid"], GLUCOSE)
        if not _quiet_since(view, person["pid"], GLUCOSE, view.now - timedelta(hours=2)):
            return None
        valid = [r for r in rows if r[1] in VALID and r[2] is not None and r[0] <= view.now]
        if not valid or (len(valid) > 1 and valid[-1][0] == valid[-2][0]):
            return None
        return {**_patient_params(person, rng), "shadow": _shadow(view, rng, person["pid"], GLUCOSE)}

    def setup(self, view: View, params: dict) -> list[dict]:
        return _shadow_resources(view, params["shadow"])

    def prompt(self, params: dict) -> str:
        return (f"What was the most recent glucose result (LOINC 2339-0 or 2345-7) of {_who(params)}, "
                "and when was it taken?")

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid([r[:3] for r in _world_results(view, params["pid"], GLUCOSE)], view.now)
        assert latest is not None, params
        return Gold(answer={"value": latest[2], "taken": latest[0]})

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], GLUCOSE)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, ",".join(GLUCOSE), newest=True)
                 if moment(o["effectiveDateTime"]) <= now]
        if not found:
            return answer_text(NOT_FOUND)
        return answer_text({"value": found[0]["valueQuantity"]["value"], "taken": found[0]["effectiveDateTime"]})


@register("clinical.last_hba1c", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LastHba1c(_Clinical):
    """Last HbA1c value and its date (or none on file)

    An entered-in-error copy charted minutes after the real latest HbA1c, from the world or the setup
    (a world where no living patient has an HbA1c gets one, with such a copy, from the setup)."""

    answer = AnswerSpec((Field("value", "number", "the HbA1c in %"),
                         Field("date", "date", "the day it was taken")), none_allowed=True)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        tested = view.cached("clin_a1c_tested", lambda: [
            p for p in _people(view)
            if any(r[1] in VALID for r in _world_results(view, p["pid"], ("4548-4",)))])
        want = not negative_seed(view)
        untested = [p for p in _people(view) if p not in tested]
        person = (deal_positive(view, tested) if want and tested  # the few tested patients share the positives
                  else pick(rng, untested if not want and untested else _people(view)))
        if not _quiet_since(view, person["pid"], ("4548-4",), view.now - timedelta(days=1)):
            return None
        has = person in tested
        if has != want and tested:
            return None
        draws: list[list] = []
        if want and not has:
            days = rng.randint(30, 900)
            value = _lab_value(rng, "4548-4")
            draws = [[days * 1440, value, "final"],
                     [days * 1440 - 17, _slip(rng, value, up=True), "entered-in-error"]]
        params = _patient_params(person, rng)
        shadow = _shadow(view, rng, person["pid"], ("4548-4",)) if want and has else None
        return {**params, "draws": draws, "shadow": shadow}

    def setup(self, view: View, params: dict) -> list[dict]:
        return (_draw_resources(view, "a1c", params["pid"], "4548-4", params["draws"])
                + _shadow_resources(view, params.get("shadow")))

    def prompt(self, params: dict) -> str:
        return (f"What was the last hemoglobin A1c (LOINC 4548-4) of {_who(params)}, and on what date was "
                "it taken?")

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid(_all_results(view, params["pid"], "4548-4", params["draws"]), view.now)
        return Gold(answer={"value": latest[2], "date": latest[0].date()} if latest else NOT_FOUND)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("4548-4",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, "4548-4", newest=True) if moment(o["effectiveDateTime"]) <= now]
        if not found:
            return answer_text(NOT_FOUND)
        return answer_text({"value": found[0]["valueQuantity"]["value"], "date": found[0]["effectiveDateTime"][:10]})


@register("clinical.active_medication_count", difficulty=3, touches=("Patient", "MedicationRequest"),
          sequences=(("searchResources", "searchResources"),))
class ActiveMedicationCount(_Clinical):
    """Number of distinct drugs with an active prescription

    Drugs are named inline or through a Medication reference; stopped and entered-in-error orders and
    repeated prescriptions of the same drug must not count."""

    answer = AnswerSpec((Field("count", "int", "how many distinct drugs (RxNorm codes)"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        candidates = []  # (count, person): the counts are dealt by seed, so no count is the gold of many seeds
        for person in _people(view):
            requests = _med_requests(view).get(person["pid"], [])
            if not any(moment(r["authored"]) > view.now - timedelta(days=1) for r in requests if r["authored"]):
                candidates.append((len({r["code"] for r in requests if r["status"] == "active"}), person))
        person = deal_by_gold(view, rng, candidates)
        return None if person is None else _patient_params(person, rng)

    def prompt(self, params: dict) -> str:
        return (f"How many different drugs does {_who(params)} currently have an active prescription for? "
                "Count each drug (RxNorm code) once, however many active orders it has.")

    def gold(self, view: View, params: dict) -> Gold:
        active = {r["code"] for r in _med_requests(view).get(params["pid"], []) if r["status"] == "active"}
        return Gold(answer={"count": len(active)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        orders = search_all(tools, "MedicationRequest", {"patient": pid, "status": "active", "_count": "15",
                                                      "_elements": DRUG_ELEMENTS})
        codes = set()
        for o in orders:
            rx = _rx(o.get("medicationCodeableConcept"))
            if rx is None and o.get("medicationReference"):
                med_id = o["medicationReference"]["reference"].split("/")[-1]
                med = call(tools, "getResourceById", {"resourceType": "Medication", "resourceId": med_id})
                rx = _rx(med.get("code"))
            if rx:
                codes.add(rx["code"])
        return answer_text({"count": len(codes)})


@register("clinical.last_outpatient_visit", difficulty=2, touches=("Patient", "Encounter"),
          sequences=(("searchResources", "searchResources"),))
class LastOutpatientVisit(_Clinical):
    """Date and type of the most recent outpatient visit

    Outpatient means class AMB: emergency and inpatient encounters (often more recent) do not count."""

    answer = AnswerSpec((Field("date", "date", "the day the visit started"),
                         Field("type_code", "text", "the SNOMED CT code of the visit type")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _people(view))
        visits = _visits(view).get(person["pid"], [])
        if not visits or visits[-1][0] > view.now - timedelta(hours=2):
            return None
        return _patient_params(person, rng)

    def prompt(self, params: dict) -> str:
        return (f"When was the most recent outpatient (ambulatory) visit of {_who(params)}, and what type of "
                "visit was it?")

    def gold(self, view: View, params: dict) -> Gold:
        visits = [v for v in _visits(view)[params["pid"]] if v[0] <= view.now]
        last = visits[-1][0]
        kinds = sorted({x for v in visits if v[0] == last for x in (v[1], v[2])})
        return Gold(answer={"date": last.date(), "type_code": kinds})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        query = {"patient": pid, "class": "AMB", "_sort": "-date", "_count": "5"}
        found = [e for e in search_all(tools, "Encounter", query, all_pages=False)
                 if moment(e["period"]["start"]) <= now]
        first = found[0]
        code = next(c["code"] for t in first["type"] for c in t["coding"] if c.get("system") == SNOMED)
        return answer_text({"date": first["period"]["start"][:10], "type_code": code})


# ================================================================================================
# writes: vital signs
# ================================================================================================
def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


class _RecordVital(_Clinical):
    writes = True
    resource_types = ("Patient", "Observation")
    sequences = (("searchResources", "createResource"),)
    CODE: str
    DISPLAY: str

    def measure(self, rng: random.Random) -> dict:
        raise NotImplementedError

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        raise NotImplementedError

    def value_body(self, params: dict) -> dict:
        raise NotImplementedError

    def sample(self, view: View, rng: random.Random) -> dict | None:
        return {**_patient_params(pick(rng, _adults(view)), rng), **self.measure(rng)}

    def gold(self, view: View, params: dict) -> Gold:
        checks = _vital_checks(params["pid"], self.CODE, view.now) + self.value_checks(params)
        return Gold(expects=[Expect("create", "Observation", checks=checks)])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        create(tools, {**_new_vital(pid, self.CODE, self.DISPLAY, now), **self.value_body(params)})
        return "Charted the measurement."


@register("clinical.record_blood_pressure", difficulty=2)
class RecordBloodPressure(_RecordVital):
    """Chart a blood pressure reading (LOINC panel with systolic and diastolic components)

    A panel with two coded components, each with its own value and unit."""

    CODE, DISPLAY = "85354-9", "Blood pressure panel with all children optional"

    def measure(self, rng: random.Random) -> dict:
        systolic = rng.randint(96, 176)
        return {"systolic": systolic, "diastolic": rng.randint(54, min(108, systolic - 25))}

    def prompt(self, params: dict) -> str:
        reading = f"{params['systolic']}/{params['diastolic']}"
        return (f"Record a blood pressure of {reading} mmHg for {_who(params)}, taken just now. Chart it as "
                "a vital-signs Observation with status final, LOINC 85354-9 (blood pressure panel), a "
                "systolic component (LOINC 8480-6) and a diastolic component (LOINC 8462-4), both in mm[Hg] "
                "(UCUM), effective now.")

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        want = (("8480-6", params["systolic"]), ("8462-4", params["diastolic"]))

        def fn(after: dict, before: dict | None) -> str | None:
            missing = []
            for code, value in want:
                ok = any(any(c.get("code") == code and c.get("system") == LOINC
                             for c in comp.get("code", {}).get("coding", []))
                         and (comp.get("valueQuantity") or {}).get("value") == value
                         and (comp.get("valueQuantity") or {}).get("code") == "mm[Hg]"
                         for comp in after.get("component", []) if isinstance(comp, dict))
                if not ok:
                    missing.append(f"{code}={value} mm[Hg]")
            return f"component lacks {missing}" if missing else None
        return (custom("component", f"components 8480-6={want[0][1]}, 8462-4={want[1][1]} mm[Hg]", fn),)

    def value_body(self, params: dict) -> dict:
        def comp(code: str, display: str, value: int) -> dict:
            return {"code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
                    "valueQuantity": {"value": value, "unit": "mm[Hg]", "system": UCUM, "code": "mm[Hg]"}}
        return {"component": [comp("8480-6", "Systolic blood pressure", params["systolic"]),
                               comp("8462-4", "Diastolic blood pressure", params["diastolic"])]}


class _SimpleVital(_RecordVital):
    UNIT: str

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        return (eq("valueQuantity.value", params["value"]), unit_is("valueQuantity", self.UNIT))

    def value_body(self, params: dict) -> dict:
        return {"valueQuantity": {"value": params["value"], "unit": self.UNIT, "system": UCUM,
                                  "code": self.UNIT}}


@register("clinical.record_body_weight", difficulty=2)
class RecordBodyWeight(_SimpleVital):
    """Chart a body weight in kg"""

    CODE, DISPLAY, UNIT = "29463-7", "Body weight", "kg"

    def measure(self, rng: random.Random) -> dict:
        return {"value": round(rng.uniform(48, 125), 1)}

    def prompt(self, params: dict) -> str:
        return (f"{_cap(_who(params))} was just weighed at {params['value']} kg. Chart it as a vital-signs "
                "Observation with status final, LOINC 29463-7 (body weight), the value in kg (UCUM kg), "
                "effective now.")


@register("clinical.record_heart_rate", difficulty=2)
class RecordHeartRate(_SimpleVital):
    """Chart a heart rate in beats per minute"""

    CODE, DISPLAY, UNIT = "8867-4", "Heart rate", "/min"

    def measure(self, rng: random.Random) -> dict:
        return {"value": rng.randint(46, 132)}

    def prompt(self, params: dict) -> str:
        return (f"The heart rate of {_who(params)} is {params['value']} beats per minute, measured just now. "
                "Chart it as a vital-signs Observation with status final, LOINC 8867-4 (heart rate), the "
                "value in /min (UCUM), effective now.")


@register("clinical.record_temperature", difficulty=2)
class RecordTemperature(_RecordVital):
    """Chart a body temperature given in °F as °C

    The reading is given in °F and must be charted in °C (converted and rounded)."""

    CODE, DISPLAY = "8310-5", "Body temperature"

    def measure(self, rng: random.Random) -> dict:
        return {"fahrenheit": round(rng.uniform(96.8, 104.0), 1)}

    def prompt(self, params: dict) -> str:
        return (f"{_cap(_who(params))} has a temperature of {params['fahrenheit']} °F, measured just now. "
                "Chart it as a vital-signs Observation with status final, LOINC 8310-5 (body temperature), "
                "effective now, with the value converted to degrees Celsius (UCUM Cel) and rounded to one "
                "decimal.")

    @staticmethod
    def celsius(params: dict) -> float:
        return (params["fahrenheit"] - 32) * 5 / 9

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        return (number_near("valueQuantity.value", self.celsius(params), 0.06),
                unit_is("valueQuantity", "Cel"))

    def value_body(self, params: dict) -> dict:
        return {"valueQuantity": {"value": round(self.celsius(params), 1), "unit": "Cel", "system": UCUM,
                                  "code": "Cel"}}


# ================================================================================================
# writes: conditional orders
# ================================================================================================
MAGNESIUM_SULFATE = ("6585", "magnesium sulfate")
POTASSIUM_CHLORIDE = ("8591", "potassium chloride")


def _magnesium_dose(value: float) -> int:
    return 4 if value < 1.2 else 2 if value < 1.5 else 1


@register("clinical.magnesium_if_low", difficulty=3, writes=True,
          touches=("Patient", "Observation", "MedicationRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class MagnesiumIfLow(Branched, _Clinical):
    """Magnesium in the last 24 h: if low, order IV magnesium sulfate at the dose for its band

    One IV order at the dose of the band when the magnesium is low, nothing when it is normal: both
    branches in one family. The entered-in-error copy (more recent, decimal slip) and an older result lie on
    the other side of the threshold; the dose depends on the band the real value falls in.

    Seed 2k is seed k of the former ``clinical.magnesium_replacement`` (low), seed 2k+1 seed k of the
    former ``clinical.magnesium_no_order`` (normal): the same prompt, params, setup and gold."""

    read_resource_types = ("Patient", "Observation")
    read_sequences = (("searchResources", "searchResources"),)
    branches = ("clinical.magnesium_replacement", "clinical.magnesium_no_order")
    answer = AnswerSpec((Field("magnesium", "number", "the result you acted on, in mg/dL"),
                         Field("ordered", "bool", "whether you ordered magnesium sulfate")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], ("19123-9",), view.now - timedelta(days=5)):
            return None
        low = self.branch(view) == 0
        value = _lab_value(rng, "19123-9", 0.8, 1.7) if low else _lab_value(rng, "19123-9", 1.9, 2.5)
        recent = rng.randint(30, 20 * 60)
        draws = [[recent, value, "final"]]
        distractor = rng.random()
        if distractor < 0.45:  # a newer entered-in-error copy on the other side of the threshold
            draws.append([rng.randint(5, recent - 5), _slip(rng, value, up=low), "entered-in-error"])
        elif distractor < 0.8:  # an older (over 24 h) result on the other side
            other = _lab_value(rng, "19123-9", 1.9, 2.4) if low else _lab_value(rng, "19123-9", 1.0, 1.6)
            draws.append([rng.randint(26 * 60, 60 * 60), other, "final"])
        return {**_patient_params(person, rng), "draws": draws}

    def prompt(self, params: dict) -> str:
        return (f"Check the most recent serum magnesium (LOINC 19123-9) of {_who(params)} from the last 24 "
                "hours. If it is below 1.8 mg/dL, order IV magnesium sulfate (RxNorm 6585) as a "
                "MedicationRequest with status active and intent order, with a dosage instruction giving "
                "the route as intravenous (SNOMED CT 47625008) and the dose in grams (UCUM g) by this "
                "scale: below 1.2 mg/dL, 4 g; from 1.2 to below 1.5 mg/dL, 2 g; from 1.5 to below 1.8 "
                "mg/dL, 1 g. If it is 1.8 mg/dL or higher, do not order anything.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "mg", params["pid"], "19123-9", params["draws"])

    def gold(self, view: View, params: dict) -> Gold:
        rows = _all_results(view, params["pid"], "19123-9", params["draws"])
        latest = _latest_valid(rows, view.now, since=view.now - timedelta(hours=24))
        assert latest is not None
        low = latest[2] < 1.8
        assert low == (self.branch(view) == 0), params
        expects = []
        if low:
            expects.append(Expect("create", "MedicationRequest", checks=(
                ref("subject", f"Patient/{params['pid']}"), eq("status", "active"), eq("intent", "order"),
                coded("medicationCodeableConcept", RXNORM, MAGNESIUM_SULFATE[0]),
                eq("dosageInstruction.doseAndRate.doseQuantity.value", _magnesium_dose(latest[2])),
                unit_is("dosageInstruction.doseAndRate.doseQuantity", "g"),
                coded("dosageInstruction.route", SNOMED, IV_ROUTE[0]))))
        return Gold(answer={"magnesium": latest[2], "ordered": low}, expects=expects)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("19123-9",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, "19123-9", since=now - timedelta(hours=24))
                 if moment(o["effectiveDateTime"]) <= now]
        value = found[0]["valueQuantity"]["value"]
        if value < 1.8:
            dose = _magnesium_dose(value)
            create(tools, _medication_request(pid, MAGNESIUM_SULFATE, dose, "g", IV_ROUTE, now,
                                               f"{dose} g magnesium sulfate IV"))
        return answer_text({"magnesium": value, "ordered": value < 1.8})


@register("clinical.hba1c_if_due", difficulty=3, writes=True,
          touches=("Patient", "Observation", "ServiceRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class Hba1cIfDue(Branched, _Clinical):
    """Last HbA1c: if it is over a year old, order a new one

    Order a new HbA1c when the last valid one is over a year old, nothing when there is a recent one:
    both branches in one family. "Most recent" must skip an entered-in-error copy that would flip the
    one-year decision.

    Seed 2k is seed k of the former ``clinical.hba1c_reorder`` (due), seed 2k+1 seed k of the former
    ``clinical.hba1c_not_due`` (recent): the same prompt, params, setup and gold."""

    read_resource_types = ("Patient", "Observation")
    read_sequences = (("searchResources", "searchResources"),)
    branches = ("clinical.hba1c_reorder", "clinical.hba1c_not_due")
    answer = AnswerSpec((Field("hba1c", "number", "the most recent HbA1c in %"),
                         Field("date", "date", "the day it was taken"),
                         Field("ordered", "bool", "whether you ordered a new HbA1c")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        due = self.branch(view) == 0
        days = rng.randint(400, 1000) if due else rng.randint(20, 330)
        world = _world_results(view, person["pid"], ("4548-4",))
        if any(r[0] > view.now - timedelta(days=1)
               or (r[1] in VALID and r[0] > view.now - timedelta(days=days + 2)) for r in world):
            return None
        draws = [[days * 1440 + rng.randint(0, 600), _lab_value(rng, "4548-4"), "final"]]
        distractor = rng.random()
        if distractor < 0.5:  # a newer entered-in-error copy (inside the year when the real one is older)
            newer = rng.randint(20, 300) if due else rng.randint(1, days - 1)
            wrong = _slip(rng, draws[0][1], up=True)
            draws.append([newer * 1440 + rng.randint(0, 600), wrong, "entered-in-error"])
        elif distractor < 0.75:
            draws.append([(days + rng.randint(150, 500)) * 1440, _lab_value(rng, "4548-4"), "final"])
        return {**_patient_params(person, rng), "draws": draws}

    def prompt(self, params: dict) -> str:
        return (f"When did {_who(params)} last have a hemoglobin A1c (LOINC 4548-4)? If the most recent "
                "result is more than one year old, order a new HbA1c: a ServiceRequest coded LOINC 4548-4 "
                "with status active, intent order and priority routine. If there is a result from within "
                "the past year, do not order anything.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "a1c", params["pid"], "4548-4", params["draws"])

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid(_all_results(view, params["pid"], "4548-4", params["draws"]), view.now)
        assert latest is not None
        due = latest[0] < view.now - timedelta(days=365)
        assert due == (self.branch(view) == 0), params
        expects = []
        if due:
            expects.append(Expect("create", "ServiceRequest", checks=(
                ref("subject", f"Patient/{params['pid']}"), coded("code", LOINC, "4548-4"),
                eq("status", "active"), eq("intent", "order"), eq("priority", "routine"))))
        return Gold(answer={"hba1c": latest[2], "date": latest[0].date(), "ordered": due}, expects=expects)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("4548-4",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, "4548-4", newest=True) if moment(o["effectiveDateTime"]) <= now]
        last = found[0]
        due = moment(last["effectiveDateTime"]) < now - timedelta(days=365)
        if due:
            create(tools, _service_request(pid, LOINC, "4548-4", LABS["4548-4"][0], now, priority="routine"))
        return answer_text({"hba1c": last["valueQuantity"]["value"], "date": last["effectiveDateTime"][:10], "ordered": due})


@register("clinical.potassium_replacement", difficulty=3, writes=True,
          touches=("Patient", "Observation", "ServiceRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class PotassiumReplacement(_Clinical):
    """Replace potassium if low (dose from the value) and order a next-morning potassium

    Conditional replacement with a computed dose (both branches occur), a distractor result on the other
    side of 3.5, and a lab timed for tomorrow 08:00 UTC in every case."""

    answer = AnswerSpec((Field("potassium", "number", "the result you acted on, in mmol/L"),
                         Field("replacement_ordered", "bool", "whether you ordered potassium chloride")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], RELATED["2823-3"], view.now - timedelta(days=30)):
            return None
        low = rng.random() < 0.55
        value = _lab_value(rng, "2823-3", 2.8, 3.4) if low else _lab_value(rng, "2823-3", 3.6, 5.0)
        recent = rng.randint(60, 20 * 60)
        draws = [[recent, value, "final"]]
        distractor = rng.random()
        if distractor < 0.4:  # a newer entered-in-error copy on the other side of 3.5
            draws.append([rng.randint(5, recent - 5), _slip(rng, value, up=low), "entered-in-error"])
        elif distractor < 0.75:  # an older result on the other side
            other = _lab_value(rng, "2823-3", 3.7, 4.8) if low else _lab_value(rng, "2823-3", 2.9, 3.3)
            draws.append([rng.randint(24 * 60, 72 * 60), other, "final"])
        return {**_patient_params(person, rng), "draws": draws}

    def prompt(self, params: dict) -> str:
        return (f"Review the most recent serum potassium (LOINC 2823-3) of {_who(params)}. If it is below "
                "3.5 mmol/L, order oral potassium chloride (RxNorm 8591): a MedicationRequest with status "
                "active and intent order, route oral (SNOMED CT 26643006) and a dose in mEq (UCUM meq) of "
                "10 mEq for every 0.1 mmol/L below 3.5 (for example, 3.2 mmol/L means 30 mEq). Whatever the "
                "result, also order a repeat serum potassium to be drawn tomorrow at 08:00 UTC: a "
                "ServiceRequest coded LOINC 2823-3 with status active, intent order and occurrenceDateTime "
                "tomorrow at 08:00 UTC.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "k", params["pid"], "2823-3", params["draws"])

    @staticmethod
    def dose(value: float) -> int:
        return round((3.5 - value) * 100)

    @staticmethod
    def tomorrow_8(now: datetime) -> datetime:
        day = now.date() + timedelta(days=1)
        return datetime(day.year, day.month, day.day, 8, 0, tzinfo=UTC)

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid(_all_results(view, params["pid"], "2823-3", params["draws"]), view.now)
        assert latest is not None
        subject = ref("subject", f"Patient/{params['pid']}")
        expects = [Expect("create", "ServiceRequest", checks=(
            subject, coded("code", LOINC, "2823-3"), eq("status", "active"), eq("intent", "order"),
            instant("occurrenceDateTime", _iso(self.tomorrow_8(view.now)))))]
        low = latest[2] < 3.5
        if low:
            expects.append(Expect("create", "MedicationRequest", checks=(
                subject, eq("status", "active"), eq("intent", "order"),
                coded("medicationCodeableConcept", RXNORM, POTASSIUM_CHLORIDE[0]),
                eq("dosageInstruction.doseAndRate.doseQuantity.value", self.dose(latest[2])),
                unit_is("dosageInstruction.doseAndRate.doseQuantity", "meq"),
                coded("dosageInstruction.route", SNOMED, ORAL_ROUTE[0]))))
        return Gold(answer={"potassium": latest[2], "replacement_ordered": low}, expects=expects)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("2823-3",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        latest = next(o for o in _results(tools, pid, "2823-3", newest=True)
                      if moment(o["effectiveDateTime"]) <= now)
        value = latest["valueQuantity"]["value"]
        if value < 3.5:
            dose = self.dose(value)
            create(tools, _medication_request(pid, POTASSIUM_CHLORIDE, dose, "meq", ORAL_ROUTE, now,
                                               f"{dose} mEq potassium chloride by mouth"))
        create(tools, _service_request(pid, LOINC, "2823-3", LABS["2823-3"][0], now,
                                        occurrenceDateTime=_iso(self.tomorrow_8(now))))
        return answer_text({"potassium": value, "replacement_ordered": value < 3.5})


# ================================================================================================
# writes: referrals, prescriptions, allergies, immunizations, corrections
# ================================================================================================
#: (service, SNOMED CT code, display, notes a referring clinician writes)
REFERRALS = [
    ("orthopedic surgery", "183545006", "Referral to orthopedic service (procedure)", (
        "Left knee pain and instability after a fall; MRI shows a complete ACL tear. Please evaluate "
        "for repair.",
        "Right hip osteoarthritis with pain at rest despite physiotherapy; please assess for joint "
        "replacement.")),
    ("cardiology", "183519002", "Referral to cardiology service (procedure)", (
        "Exertional chest tightness for three weeks with a normal resting ECG; please assess for stable "
        "angina.",
        "New atrial fibrillation, rate controlled; please advise on anticoagulation and rhythm strategy.")),
    ("physiotherapy", "306170007", "Referral to physiotherapy service (procedure)", (
        "Chronic low back pain without red flags; please start a graded exercise program.",)),
    ("gastroenterology", "183523005", "Referral to gastroenterology service (procedure)", (
        "Iron deficiency anemia with a positive fecal immunochemical test; please arrange a colonoscopy.",)),
    ("psychiatry", "183524004", "Referral to psychiatry service (procedure)", (
        "Moderate depression not improving after two SSRIs; please review the medication plan.",)),
    ("a dietitian", "103699006", "Referral to dietitian (procedure)", (
        "Newly diagnosed type 2 diabetes with a BMI of 34; please provide dietary counselling.",)),
]


@register("clinical.referral", difficulty=2, writes=True, touches=("Patient", "ServiceRequest"),
          sequences=(("searchResources", "createResource"),))
class Referral(_Clinical):
    """Refer a patient to a specialty (ServiceRequest with SNOMED code, priority and note)

    A referral order whose note must carry the clinician's free text."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        n = rng.randrange(len(REFERRALS))
        notes = REFERRALS[n][3]
        return {**_patient_params(pick(rng, _adults(view)), rng), "service": n,
                "note": notes[rng.randrange(len(notes))], "priority": rng.choice(("routine", "urgent"))}

    def prompt(self, params: dict) -> str:
        service, code, display, _ = REFERRALS[params["service"]]
        return (f"Please refer {_who(params)} to {service}. Place it as a ServiceRequest coded SNOMED CT "
                f"{code} ({display}) with status active, intent order and priority {params['priority']}, and "
                f"put this text in its note: \"{params['note']}\"")

    def gold(self, view: View, params: dict) -> Gold:
        _, code, _, _ = REFERRALS[params["service"]]
        return Gold(expects=[Expect("create", "ServiceRequest", checks=(
            ref("subject", f"Patient/{params['pid']}"), coded("code", SNOMED, code), eq("status", "active"),
            eq("intent", "order"), eq("priority", params["priority"]),
            note_has("note.text", params["note"])))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        _, code, display, _ = REFERRALS[params["service"]]
        create(tools, _service_request(pid, SNOMED, code, display, now, priority=params["priority"],
                                        note=[{"text": params["note"]}]))
        return "Placed the referral."


@register("clinical.stop_medication", difficulty=2, writes=True, touches=("Patient", "MedicationRequest"),
          sequences=(("searchResources", "searchResources", "updateResource"),))
class StopMedication(_Clinical):
    """Discontinue an active prescription (status stopped, rest unchanged)

    The drug may sit behind a Medication reference; the update must keep every other element, and an
    entered-in-error duplicate of the order may exist."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        fits = [(p, r) for p in _people(view) for r in self._stoppable(view, p)]
        person, chosen = deal(view, fits) or (None, None)  # dealt by seed: the gold varies across seeds
        if chosen is None:
            return None
        return {**_patient_params(person, rng), "request": chosen["id"], "drug": chosen["display"]}

    @staticmethod
    def _stoppable(view: View, person: dict) -> list[dict]:
        """Active prescriptions older than a day whose drug has one active order and one name."""
        requests = _med_requests(view).get(person["pid"], [])
        active = [r for r in requests if r["status"] == "active" and r["authored"]
                  and moment(r["authored"]) < view.now - timedelta(days=1)]
        by_code: dict[str, list[dict]] = defaultdict(list)
        for r in active:
            by_code[r["code"]].append(r)
        names = defaultdict(set)
        for r in active:
            names[r["display"].lower()].add(r["code"])
        single = [rs[0] for rs in by_code.values()
                  if len(rs) == 1 and len(names[rs[0]["display"].lower()]) == 1]
        return sorted(single, key=lambda r: r["id"])

    def prompt(self, params: dict) -> str:
        return (f"{_cap(_who(params))} has to stop taking {params['drug']}. Please discontinue that active "
                "prescription (set its status to stopped) and leave everything else on the order unchanged.")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(expects=[Expect("update", "MedicationRequest", id=params["request"],
                                    checks=(eq("status", "stopped"), may_set("statusReason")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        orders = search_all(tools, "MedicationRequest", {"patient": pid, "status": "active", "_count": "15",
                                                      "_elements": DRUG_ELEMENTS})
        wanted = params["drug"].lower()
        target = None
        for o in orders:
            rx = _rx(o.get("medicationCodeableConcept"))
            if rx is None and o.get("medicationReference"):
                med_id = o["medicationReference"]["reference"].split("/")[-1]
                rx = _rx(call(tools, "getResourceById", {"resourceType": "Medication", "resourceId": med_id}).get("code"))
            if rx and rx.get("display", "").lower() == wanted:
                target = o
                break
        assert target is not None
        key = {"resourceType": "MedicationRequest", "resourceId": target["id"]}
        body = dict(call(tools, "getResourceById", key))  # meta too: tags, labels and profiles are kept
        body["status"] = "stopped"
        call(tools, "updateResource", {**key, "body": body})
        return "Stopped the prescription."


#: (RxNorm code, clinical drug, tablets per dose, times per day, how a prescriber says it)
PRESCRIPTIONS = [
    ("314231", "Simvastatin 10 MG Oral Tablet", 1, 1, "one tablet by mouth once a day"),
    ("308136", "amLODIPine 2.5 MG Oral Tablet", 1, 1, "one tablet by mouth once a day"),
    ("313988", "Furosemide 40 MG Oral Tablet", 1, 1, "one tablet by mouth once a day"),
    ("313096", "spironolactone 25 MG Oral Tablet", 1, 1, "one tablet by mouth once a day"),
    ("310273", "famotidine 20 MG Oral Tablet", 1, 2, "one tablet by mouth twice a day"),
    ("866083", "buspirone hydrochloride 10 MG Oral Tablet", 1, 3, "one tablet by mouth three times a day"),
    ("856519", "propranolol hydrochloride 40 MG Oral Tablet", 1, 2, "one tablet by mouth twice a day"),
    ("313782", "Acetaminophen 325 MG Oral Tablet", 2, 4, "two tablets by mouth four times a day"),
]


@register("clinical.prescribe_medication", difficulty=2, writes=True,
          touches=("Patient", "MedicationRequest"), sequences=(("searchResources", "createResource"),))
class PrescribeMedication(_Clinical):
    """Start a new oral medication with a structured dosage

    A structured dosage (route, dose, frequency, period) rather than free text."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        n = rng.randrange(len(PRESCRIPTIONS))
        active = {r["code"] for r in _med_requests(view).get(person["pid"], []) if r["status"] == "active"}
        if PRESCRIPTIONS[n][0] in active:
            return None
        return {**_patient_params(person, rng), "drug": n}

    def prompt(self, params: dict) -> str:
        code, name, tablets, times, spoken = PRESCRIPTIONS[params["drug"]]
        unit = "tablet" if tablets == 1 else "tablets"
        return (f"Start {_who(params)} on {name} (RxNorm {code}), {spoken}. Record it as a MedicationRequest "
                "with status active and intent order whose dosage instruction has route oral (SNOMED CT "
                f"26643006), a dose of {tablets} {unit} and a timing of {times} per day (frequency {times}, "
                "period 1, period unit d).")

    def gold(self, view: View, params: dict) -> Gold:
        code, _, tablets, times, _ = PRESCRIPTIONS[params["drug"]]
        return Gold(expects=[Expect("create", "MedicationRequest", checks=(
            ref("subject", f"Patient/{params['pid']}"), eq("status", "active"), eq("intent", "order"),
            coded("medicationCodeableConcept", RXNORM, code),
            coded("dosageInstruction.route", SNOMED, ORAL_ROUTE[0]),
            eq("dosageInstruction.doseAndRate.doseQuantity.value", tablets),
            eq("dosageInstruction.timing.repeat.frequency", times),
            eq("dosageInstruction.timing.repeat.period", 1),
            eq("dosageInstruction.timing.repeat.periodUnit", "d")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        code, name, tablets, times, spoken = PRESCRIPTIONS[params["drug"]]
        body = _medication_request(pid, (code, name), tablets, "{tbl}", ORAL_ROUTE, now, spoken,
                                   timing={"repeat": {"frequency": times, "period": 1, "periodUnit": "d"}})
        create(tools, body)
        return "Prescribed."


#: (system, code, display, category, how the patient names it)
ALLERGENS = [
    (RXNORM, "7984", "Penicillin V", "medication", "penicillin V"),
    (RXNORM, "29046", "Lisinopril", "medication", "lisinopril"),
    (RXNORM, "10831", "Sulfamethoxazole / Trimethoprim", "medication", "sulfamethoxazole/trimethoprim"),
    (RXNORM, "1191", "Aspirin", "medication", "aspirin"),
    (RXNORM, "25037", "cefdinir", "medication", "cefdinir"),
    (SNOMED, "762952008", "Peanut (substance)", "food", "peanuts"),
    (SNOMED, "111088007", "Latex (substance)", "environment", "latex"),
    (SNOMED, "288328004", "Bee venom (substance)", "environment", "bee stings"),
]
#: (SNOMED CT code, display, criticality)
REACTIONS = [("247472004", "Hives", "low"), ("271807003", "Skin rash", "low"),
             ("39579001", "Anaphylaxis", "high"), ("267036007", "Dyspnea", "high")]


@register("clinical.record_allergy", difficulty=2, writes=True, touches=("Patient", "AllergyIntolerance"),
          sequences=(("searchResources", "createResource"),))
class RecordAllergy(_Clinical):
    """Record a new allergy with its reaction

    Several coded elements with their own code systems (clinical, verification status, manifestation)."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _people(view))
        n = rng.randrange(len(ALLERGENS))
        if ALLERGENS[n][1] in _allergy_codes(view).get(person["pid"], set()):
            return None
        return {**_patient_params(person, rng), "allergen": n, "reaction": rng.randrange(len(REACTIONS))}

    def prompt(self, params: dict) -> str:
        system, code, display, category, spoken = ALLERGENS[params["allergen"]]
        rcode, reaction, criticality = REACTIONS[params["reaction"]]
        coding = "RxNorm" if system == RXNORM else "SNOMED CT"
        return (f"{_cap(_who(params))} reacts to {spoken} ({reaction.lower()}). Please record the allergy: "
                f"an AllergyIntolerance coded {coding} {code} ({display}), type allergy, category "
                f"{category}, clinical status active, verification status confirmed, criticality "
                f"{criticality}, with a reaction whose manifestation is {reaction} (SNOMED CT {rcode}).")

    def gold(self, view: View, params: dict) -> Gold:
        system, code, _, category, _ = ALLERGENS[params["allergen"]]
        rcode, _, criticality = REACTIONS[params["reaction"]]
        return Gold(expects=[Expect("create", "AllergyIntolerance", checks=(
            ref("patient", f"Patient/{params['pid']}"), coded("code", system, code),
            coded("clinicalStatus", ALLERGY_CLINICAL, "active"),
            coded("verificationStatus", ALLERGY_VERIFICATION, "confirmed"), eq("type", "allergy"),
            eq("category", category), eq("criticality", criticality),
            coded("reaction.manifestation", SNOMED, rcode)))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        system, code, display, category, _ = ALLERGENS[params["allergen"]]
        rcode, reaction, criticality = REACTIONS[params["reaction"]]
        create(tools, {
            "resourceType": "AllergyIntolerance",
            "clinicalStatus": {"coding": [{"system": ALLERGY_CLINICAL, "code": "active"}]},
            "verificationStatus": {"coding": [{"system": ALLERGY_VERIFICATION, "code": "confirmed"}]},
            "type": "allergy", "category": [category], "criticality": criticality,
            "code": {"coding": [{"system": system, "code": code, "display": display}]},
            "patient": {"reference": f"Patient/{pid}"}, "recordedDate": _iso(now),
            "reaction": [{"manifestation": [{"coding": [{"system": SNOMED, "code": rcode,
                                                         "display": reaction}]}]}]})
        return "Recorded the allergy."


#: (CVX code, display, how a nurse names it)
VACCINES = [
    ("140", "Influenza, seasonal, injectable, preservative free", "the seasonal flu shot"),
    ("115", "Tdap", "a Tdap booster"),
    ("43", "Hep B, adult", "an adult hepatitis B vaccine dose"),
    ("33", "pneumococcal polysaccharide vaccine, 23 valent",
     "the pneumococcal polysaccharide vaccine (PPSV23)"),
    ("187", "zoster vaccine recombinant", "the recombinant zoster vaccine"),
    ("208", "COVID-19, mRNA, LNP-S, PF, 30 mcg/0.3 mL dose", "a COVID-19 mRNA vaccine dose"),
]


@register("clinical.record_immunization", difficulty=2, writes=True, touches=("Patient", "Immunization"),
          sequences=(("searchResources", "createResource"),))
class RecordImmunization(_Clinical):
    """Record a vaccine given today (CVX, lot number, site)"""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        lot = "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(2)) + str(rng.randint(1000, 99999))
        return {**_patient_params(pick(rng, _adults(view)), rng), "vaccine": rng.randrange(len(VACCINES)),
                "lot": lot, "site": rng.choice(("LA", "RA"))}

    def prompt(self, params: dict) -> str:
        code, _, spoken = VACCINES[params["vaccine"]]
        arm = "left" if params["site"] == "LA" else "right"
        return (f"{_cap(_who(params))} was given {spoken} (CVX {code}) here today, lot number "
                f"{params['lot']}, in the {arm} arm. Please record the immunization with status completed, "
                f"today's date, that lot number and the site coded as HL7 ActSite {params['site']}.")

    def gold(self, view: View, params: dict) -> Gold:
        code, _, _ = VACCINES[params["vaccine"]]
        return Gold(expects=[Expect("create", "Immunization", checks=(
            ref("patient", f"Patient/{params['pid']}"), coded("vaccineCode", CVX, code),
            eq("status", "completed"),
            on_day("occurrenceDateTime", view.now.date().isoformat()), eq("lotNumber", params["lot"]),
            coded("site", ACT_SITE, params["site"])))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        code, display, _ = VACCINES[params["vaccine"]]
        create(tools, {"resourceType": "Immunization", "status": "completed",
                        "vaccineCode": {"coding": [{"system": CVX, "code": code, "display": display}]},
                        "patient": {"reference": f"Patient/{pid}"}, "occurrenceDateTime": _iso(now),
                        "primarySource": True, "lotNumber": params["lot"],
                        "site": {"coding": [{"system": ACT_SITE, "code": params["site"]}]}})
        return "Recorded the immunization."


#: (LOINC, display, words, UCUM unit, how the unit is said, plausible range, implausible range, decimals)
VOIDABLE = [
    ("8867-4", "Heart rate", "heart rate", "/min", "/min", (62, 96), (132, 158), 0),
    ("29463-7", "Body weight", "body weight", "kg", "kg", (55, 105), (128, 160), 1),
    ("8310-5", "Body temperature", "body temperature", "Cel", "°C", (36.4, 37.3), (39.6, 40.6), 1),
]


@register("clinical.void_observation", difficulty=2, writes=True, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources", "updateResource"),))
class VoidObservation(_Clinical):
    """Mark a mis-charted vital sign as entered in error

    Another reading of the same vital that day: the one named by time and value must be marked
    entered-in-error by an update (not deleted), everything else on it kept."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        n = rng.randrange(len(VOIDABLE))
        code, _, _, _, _, (lo, hi), (bad_lo, bad_hi), decimals = VOIDABLE[n]
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], (code,), view.now - timedelta(days=2)):
            return None
        minutes = sorted(rng.sample(range(15, 16 * 60, 23), 2), reverse=True)
        wrong = rng.randrange(2)
        readings = []
        for i, m in enumerate(minutes):
            a, b = (bad_lo, bad_hi) if i == wrong else (lo, hi)
            value = round(rng.uniform(a, b), decimals)
            readings.append([_iso(view.now - timedelta(minutes=m)), int(value) if decimals == 0 else value])
        return {**_patient_params(person, rng), "vital": n, "readings": readings, "wrong": wrong}

    def prompt(self, params: dict) -> str:
        _, _, words, _, spoken, *_ = VOIDABLE[params["vital"]]
        at, value = params["readings"][params["wrong"]]
        when = moment(at)
        return (f"The {words} of {value} {spoken} charted for {_who(params)} on {human_date(when.date())} "
                f"at {when.strftime('%H:%M')} UTC was recorded on the wrong patient. Mark that observation "
                "as entered in error (do not delete it, and leave the rest of it unchanged).")

    def setup(self, view: View, params: dict) -> list[dict]:
        code, display, _, unit, *_ = VOIDABLE[params["vital"]]
        return [_observation(view.new_id(f"vital-{i}"), params["pid"], code, display, value, unit, moment(at),
                             category="vital-signs")
                for i, (at, value) in enumerate(params["readings"], 1)]

    def gold(self, view: View, params: dict) -> Gold:
        target = view.new_id(f"vital-{params['wrong'] + 1}")
        assert view.read("Observation", target) is not None
        return Gold(expects=[Expect("update", "Observation", id=target,
                                    checks=(eq("status", "entered-in-error"), may_set("note")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        code = VOIDABLE[params["vital"]][0]
        at, value = params["readings"][params["wrong"]]
        since = _iso(moment(at) - timedelta(minutes=1))
        query = {"patient": pid, "code": f"{LOINC}|{code}", "date": f"ge{since}", "_sort": "date"}
        found = search_all(tools, "Observation", query)
        target = next(o for o in found if moment(o["effectiveDateTime"]) == moment(at)
                      and o["valueQuantity"]["value"] == value)
        body = dict(target)  # meta too: tags, labels and profiles are kept
        body["status"] = "entered-in-error"
        call(tools, "updateResource", {"resourceType": "Observation", "resourceId": target["id"], "body": body})
        return "Marked the observation as entered in error."
