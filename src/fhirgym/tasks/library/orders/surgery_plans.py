"""Surgery plans: record one, find it, or report none in a window."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from ....spec.codes import SNOMED
from ....tools import Toolbox
from ....world import SURGERIES
from ... import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, parse_instant, register
from ...checks import coded, eq, on_day, ref, ref_id
from ...draw import EitherWay, human_date, pick, who
from ...facts import (
    service_requests,
)
from ...solve import call
from ._common import _doctors_with, _find_doctor, _find_patient, _patients

SURGICAL = "387713003"


WINDOW = timedelta(days=14)


#: how a request names each procedure of the world's surgery catalogue
PROCEDURE_PHRASE = {"80146002": "an appendectomy", "45595009": "a laparoscopic cholecystectomy",
                    "44558001": "an inguinal hernia repair", "609588000": "a total knee replacement",
                    "52734007": "a total hip replacement"}


ORTHOPEDIC = ("609588000", "52734007")


def _surgery(view: View) -> dict[str, list[dict]]:
    """Surgical plans (category SNOMED 387713003) by patient id: {id, status, code, display, when}."""
    def compute() -> dict[str, list[dict]]:
        plans = service_requests(view, f"{SNOMED}|{SURGICAL}")
        out: dict[str, list[dict]] = {}
        for p in sorted(plans, key=lambda p: p["id"]):
            when = p.get("occurrenceDateTime") or p.get("occurrencePeriod", {}).get("start")
            coding = p["code"]["coding"][0]
            out.setdefault(ref_id(p.get("subject")), []).append({
                "id": p["id"], "status": p.get("status"), "code": coding["code"], "display": coding.get("display", ""),
                "at": parse_instant(when) if when else None})
        return out
    return view.cached("orders_surgery", compute)


@register("orders.record_surgery_plan", difficulty=2, writes=True, touches=("Patient", "ServiceRequest"),
          sequences=(("searchResources", "createResource"),))
class RecordSurgeryPlan(Family):
    """Record a surgery plan (SNOMED CT procedure) as a ServiceRequest

    Two lookups (patient by name and birth date, the requesting doctor by name) and a coded create."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        patient = pick(rng, [p for p in _patients(view).values() if p["adult"]])
        code, display, _, _ = SURGERIES[0] if rng.random() < 0.5 else rng.choice(SURGERIES)
        pool = (_doctors_with(view, "orthop") if code in ORTHOPEDIC
                else _doctors_with(view, "general practice", "internal medicine"))
        doctor = pick(rng, pool) if rng.random() < 0.8 else None
        if patient is None:
            return None
        day = view.now.date() + timedelta(days=rng.randint(3, 35))
        return {"patient_id": patient["id"], "name": patient["name"], "birth_date": patient["birth_date"],
                "code": code, "display": display, "day": day.isoformat(),
                "doctor_id": doctor["id"] if doctor else None, "doctor": doctor["name"] if doctor else None}

    def prompt(self, params: dict) -> str:
        what = f"{PROCEDURE_PHRASE[params['code']]} (SNOMED CT {params['code']})"
        day = human_date(params["day"])
        if params["doctor"]:
            return (f"Dr. {params['doctor']} has requested {what} for {who(params['name'], params['birth_date'])}, planned for {day}. Please "
                    f"record the surgery plan as a ServiceRequest with status active and intent plan, {day} as the "
                    f"occurrence date, and Dr. {params['doctor']} as the requester.")
        return (f"Please record a surgery plan for {who(params['name'], params['birth_date'])}: {what} on {day}. Record it as a ServiceRequest "
                "with status active and intent plan, with that day as the occurrence date.")

    def gold(self, view: View, params: dict) -> Gold:
        checks = [ref("subject", f"Patient/{params['patient_id']}"), coded("code", SNOMED, params["code"]),
                  eq("status", "active"), eq("intent", "plan"), on_day("occurrenceDateTime", params["day"])]
        if params["doctor_id"]:
            checks.append(ref("requester", f"Practitioner/{params['doctor_id']}"))
        return Gold(expects=[Expect("create", "ServiceRequest", checks=tuple(checks))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params["name"], params["birth_date"])
        body: dict = {
            "resourceType": "ServiceRequest", "status": "active", "intent": "plan",
            "category": [{"coding": [{"system": SNOMED, "code": SURGICAL, "display": "Surgical procedure"}]}],
            "code": {"coding": [{"system": SNOMED, "code": params["code"], "display": params["display"]}]},
            "subject": {"reference": f"Patient/{patient['id']}"},
            "occurrenceDateTime": params["day"], "authoredOn": now.isoformat().replace("+00:00", "Z"),
        }
        if params["doctor"]:
            body["requester"] = {"reference": f"Practitioner/{_find_doctor(tools, params['doctor'])}"}
        call(tools, "createResource", {"resourceType": "ServiceRequest", "body": body})
        return "Recorded the surgery plan."


PLAN_ANSWER = AnswerSpec((Field("procedure_code", "text", "the SNOMED CT code of the planned procedure"),
                          Field("date", "date", "the planned date of the surgery")))


def _in_window(plan: dict, now: datetime) -> bool:
    when = plan["at"]
    return plan["status"] == "active" and when is not None and now < when <= now + WINDOW


def _near_edge(plan: dict, now: datetime) -> bool:
    """Within a day of either end of the window (where "the next 14 days" could be read two ways)."""
    when = plan["at"]
    return when is not None and (now - timedelta(days=1) <= when <= now + timedelta(hours=12)
                                 or now + WINDOW - timedelta(days=1) <= when <= now + WINDOW + timedelta(days=1))


def _plans_answer(plans: list[dict], now: datetime):
    hits = [p for p in plans if _in_window(p, now)]
    assert len(hits) <= 1, f"{len(hits)} surgery plans in the window"
    if not hits:
        return NOT_FOUND
    return {"procedure_code": [hits[0]["code"], hits[0]["display"]], "date": hits[0]["at"].date().isoformat()}


def _solve_plan(tools: Toolbox, params: dict, now: datetime) -> str:
    patient = _find_patient(tools, params["name"], params["birth_date"])
    out = call(tools, "searchResources", {"resourceType": "ServiceRequest", "params": {
        "subject": f"Patient/{patient['id']}", "category": f"{SNOMED}|{SURGICAL}", "status": "active",
        "occurrence": [f"gt{now.strftime('%Y-%m-%dT%H:%M:%SZ')}",
                       f"le{(now + WINDOW).strftime('%Y-%m-%dT%H:%M:%SZ')}"], "_sort": "occurrence"}})
    plans = out.get("resources", [])
    if not plans:
        return answer_text(NOT_FOUND)
    plan = plans[0]
    day = (parse_instant(plan["occurrenceDateTime"]) or now).date().isoformat()
    return answer_text({"procedure_code": plan["code"]["coding"][0]["code"], "date": day})


class _PlanQuestion(Family):
    category = "orders"
    difficulty = 2
    writes = False
    resource_types = ("Patient", "ServiceRequest")
    sequences = (("searchResources", "searchResources"),)
    answer = PLAN_ANSWER

    def prompt(self, params: dict) -> str:
        return (f"Does {who(params['name'], params['birth_date'])} have a surgery planned within the next 14 days? If so, which procedure "
                "and on what date?")

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_plan(tools, params, now)


@register("orders.find_surgery_plan")
class FindSurgeryPlan(_PlanQuestion):
    """Find a patient's surgery planned within the next 14 days

    Date arithmetic on the clock; the patient may also have past or later plans and genetic orders."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        now, plans, patients = view.now, _surgery(view), _patients(view)
        fits = [pid for pid, ps in plans.items() if pid in patients
                and sum(_in_window(p, now) for p in ps) == 1 and not any(_near_edge(p, now) for p in ps)]
        if fits and rng.random() < 0.15:  # the world's few plans would make the gold repeat across seeds
            patient = patients[pick(rng, fits)]
            return {"patient_id": patient["id"], "name": patient["name"], "birth_date": patient["birth_date"],
                    "setup_plan": None}
        # mostly (and whenever the clock leaves no world plan inside the window) a plan added by the setup
        free = [p for p in patients.values() if p["adult"]
                and not any(_in_window(x, now) or _near_edge(x, now) for x in plans.get(p["id"], []))]
        patient = pick(rng, free)
        if patient is None:
            return None
        code, display, reason, _ = rng.choice(SURGERIES)
        pool = _doctors_with(view, "orthop") if code in ORTHOPEDIC else _doctors_with(view, "general practice")
        doctor = pick(rng, pool)
        day = now.date() + timedelta(days=rng.randint(2, 12))
        when = datetime(day.year, day.month, day.day, rng.choice((7, 8, 9, 10, 13, 14)), rng.choice((0, 30)),
                        tzinfo=UTC)
        return {"patient_id": patient["id"], "name": patient["name"], "birth_date": patient["birth_date"],
                "setup_plan": {"code": code, "display": display, "reason": list(reason) if reason else None,
                               "when": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                               "authored": (now - timedelta(days=rng.randint(1, 10))).strftime("%Y-%m-%dT%H:%M:%SZ"),
                               "doctor_id": doctor["id"] if doctor else None}}

    def setup(self, view: View, params: dict) -> list[dict]:
        plan = params["setup_plan"]
        if not plan:
            return []
        body: dict = {
            "resourceType": "ServiceRequest", "id": view.new_id("surgery-plan"), "status": "active", "intent": "order",
            "category": [{"coding": [{"system": SNOMED, "code": SURGICAL, "display": "Surgical procedure"}]}],
            "code": {"coding": [{"system": SNOMED, "code": plan["code"], "display": plan["display"]}]},
            "subject": {"reference": f"Patient/{params['patient_id']}"},
            "occurrenceDateTime": plan["when"], "authoredOn": plan["authored"],
        }
        if plan["reason"]:
            body["reasonCode"] = [{"coding": [{"system": SNOMED, "code": plan["reason"][0],
                                               "display": plan["reason"][1]}]}]
        if plan["doctor_id"]:
            body["requester"] = {"reference": f"Practitioner/{plan['doctor_id']}"}
            body["performer"] = [{"reference": f"Practitioner/{plan['doctor_id']}"}]
        return [body]

    def gold(self, view: View, params: dict) -> Gold:
        plans = list(_surgery(view).get(params["patient_id"], []))
        if params["setup_plan"]:
            sp = params["setup_plan"]
            plans.append({"id": view.new_id("surgery-plan"), "status": "active", "code": sp["code"],
                          "display": sp["display"], "at": parse_instant(sp["when"])})
        answer = _plans_answer(plans, view.now)
        assert answer is not NOT_FOUND, f"{params} has no plan in the window"
        return Gold(answer=answer)


@register("orders.no_surgery_in_window")
class NoSurgeryPlanInWindow(EitherWay, _PlanQuestion):
    """A surgery planned within 14 days, or report that there is none (plans outside the window)

    The patient has surgery plans, but all in the past or beyond 14 days: the answer is "none"."""

    answer = AnswerSpec(PLAN_ANSWER.fields, none_allowed=True)
    found = FindSurgeryPlan

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        now, plans, patients = view.now, _surgery(view), _patients(view)
        fits = [pid for pid, ps in plans.items() if pid in patients
                and not any(_in_window(p, now) or _near_edge(p, now) for p in ps)]
        if not fits:  # no plans at all is the plain form of the same answer
            fits = [pid for pid in patients if pid not in plans]
        patient = patients.get(pick(rng, fits) or "")
        if patient is None:
            return None
        return {"patient_id": patient["id"], "name": patient["name"], "birth_date": patient["birth_date"]}

    def gold_none(self, view: View, params: dict) -> Gold:
        answer = _plans_answer(_surgery(view).get(params["patient_id"], []), view.now)
        assert answer is NOT_FOUND, f"{params} has a plan in the window"
        return Gold(answer=answer)
