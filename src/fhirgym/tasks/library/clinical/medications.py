"""Medications: count the active ones, stop one, prescribe one."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta

from ....spec.codes import (
    RXNORM,
    SNOMED,
)
from ....tools import Toolbox
from ... import AnswerSpec, Expect, Field, Gold, View, answer_text, register
from ...checks import (
    coded,
    eq,
    may_set,
    ref,
    ref_id,
)
from ...draw import deal, deal_by_gold, pick
from ...facts import moment
from ...solve import call, create, search_all
from ._common import (
    ORAL_ROUTE,
    _adults,
    _cap,
    _Clinical,
    _locate,
    _medication_request,
    _patient_params,
    _people,
    _who,
)

DRUG_ELEMENTS = "medicationCodeableConcept,medicationReference"


def _rx(concept: dict | None) -> dict | None:
    return next((c for c in (concept or {}).get("coding", []) if c.get("system") == RXNORM), None)


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
