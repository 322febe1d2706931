"""Surgery & genetic test orders (FHIR-AgentEval, 7 tasks): ServiceRequests for planned surgery and genetic
testing, the reports and family history that support a genetic order.

The world's ``_genetics`` generator gives every genetic work-up one order (a gene panel, exome or genome
``ServiceRequest``, category v2-0074 GE) in one of three states (completed with a final report, active with
a preliminary report, active and pending), family member histories, chest X-ray reports as distractors,
and surgical ``ServiceRequest`` plans (category SNOMED 387713003) before, inside and after a 14-day window.
World facts are read once per world file (cache keys ``orders_*``); gold answers and expected changes
come from those facts plus the instance's own setup, never from the reference solution.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, date, datetime, timedelta

from ...spec.codes import DIAGNOSTIC_SERVICE, LOINC, ROLE_CODE, SNOMED, UCUM
from ...tools import Toolbox
from ...world import INDICATIONS, SURGERIES
from .. import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, parse_instant, register
from ..checks import Check, coded, custom, eq, on_day, ref, ref_id, ref_key, refs_exactly, values
from ..draw import EitherWay, human_date, pick, who
from ..facts import (
    family_histories,
    full_name,
    identifiable_patients,
    practitioners,
    reports,
    roles,
    service_requests,
)
from ..solve import call, find_patients

SURGICAL = "387713003"
GENETIC_REPORT = ("51969-4", "Genetic analysis report")
CHEST_XRAY = "36643-5"
WGS = ("86206-0", "Whole genome sequence analysis in Blood or Tissue by Molecular genetics method")
WINDOW = timedelta(days=14)

#: how a request names each procedure of the world's surgery catalogue
PROCEDURE_PHRASE = {"80146002": "an appendectomy", "45595009": "a laparoscopic cholecystectomy",
                    "44558001": "an inguinal hernia repair", "609588000": "a total knee replacement",
                    "52734007": "a total hip replacement"}
ORTHOPEDIC = ("609588000", "52734007")


# ------------------------------------------------------------------------------------------------
# world facts (cached per world file; computed during sampling, i.e. on the base world)
# ------------------------------------------------------------------------------------------------


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


def _genetics(view: View) -> dict:
    """Genetic orders (one per patient, else left out), reports, chest X-rays, family histories and the lab."""
    def compute() -> dict:
        orders = service_requests(view, f"{DIAGNOSTIC_SERVICE}|GE")
        genetic = reports(view, f"{LOINC}|{GENETIC_REPORT[0]}")
        xrays = reports(view, f"{LOINC}|{CHEST_XRAY}")
        fmhs = family_histories(view)
        per_patient = Counter(ref_id(o.get("subject")) for o in orders)
        labs = Counter(ref_id(p) for o in orders for p in o.get("performer", []))
        lab = None
        if labs:
            org = view.read("Organization", labs.most_common(1)[0][0])
            same = view.search("Organization", {"name:exact": org["name"], "_elements": "name"})
            lab = {"id": org["id"], "name": org["name"]} if len(same) == 1 else None
        out = []
        for o in sorted(orders, key=lambda o: o["id"]):
            pid = ref_id(o.get("subject"))
            if per_patient[pid] != 1 or o.get("status") not in ("active", "completed"):
                continue
            coding = o["code"]["coding"][0]
            out.append({
                "id": o["id"], "patient_id": pid, "status": o["status"], "code": coding["code"],
                "text": o["code"].get("text") or coding.get("display", ""),
                "requester_id": ref_id(o.get("requester")),
                "reason": next((c["code"] for rc in o.get("reasonCode", []) for c in rc.get("coding", [])), ""),
                "supporting": [ref_key(r) for r in o.get("supportingInfo", []) if ref_key(r)],
                "reports": sorted(r["id"] for r in genetic if ref_id(r.get("subject")) == pid),
                "own_reports": sorted(r["id"] for r in genetic if any(ref_id(b) == o["id"] for b in r.get("basedOn", []))),
                "xrays": sorted(r["id"] for r in xrays if ref_id(r.get("subject")) == pid),
                "relatives": sorted({c["code"] for f in fmhs if ref_id(f.get("patient")) == pid
                                     for c in f.get("relationship", {}).get("coding", [])}),
            })
        return {"orders": out, "lab": lab, "patients_with_orders": sorted(per_patient),
                "genome_patients": sorted({ref_id(o.get("subject")) for o in orders
                                           if any(c.get("code") == WGS[0] for c in o["code"].get("coding", []))}),
                "active_patients": sorted({ref_id(o.get("subject")) for o in orders if o.get("status") == "active"}),
                "fmh_ids": frozenset(f["id"] for f in fmhs)}
    return view.cached("orders_genetics", compute)


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


def _order_params(view: View, order: dict) -> dict | None:
    """Params naming a genetic order the way a clinician would: patient, test name, ordering doctor."""
    patient = _patients(view).get(order["patient_id"])
    if patient is None:
        return None
    doctor = _doctors(view).get(order["requester_id"])
    return {"patient_id": patient["id"], "name": patient["name"], "birth_date": patient["birth_date"],
            "order_id": order["id"], "test": order["text"], "doctor": doctor["name"] if doctor else "",
            "supporting": order["supporting"]}


def _order_phrase(params: dict) -> str:
    doctor = f" placed by Dr. {params['doctor']}" if params["doctor"] else ""
    return f"the \"{params['test']}\" order{doctor}"


# ------------------------------------------------------------------------------------------------
# reference-solution helpers (tools only, from what the prompt says)
# ------------------------------------------------------------------------------------------------
def _find_patient(tools: Toolbox, name: str, birth_date: str) -> dict:
    found = find_patients(tools, name, birth_date)
    return found[0] if found else {"id": "unknown"}


def _find_doctor(tools: Toolbox, name: str) -> str:
    given, family = name.split()[0], name.split()[-1]
    out = call(tools, "searchResources", {"resourceType": "Practitioner", "params": {
        "given": given, "family": family, "active": "true"}})
    found = [p for p in out.get("resources", []) if full_name(p) == name]
    return found[0]["id"] if found else "unknown"


def _find_order(tools: Toolbox, patient_id: str, test: str) -> dict:
    out = call(tools, "searchResources", {"resourceType": "ServiceRequest", "params": {
        "subject": f"Patient/{patient_id}", "category": f"{DIAGNOSTIC_SERVICE}|GE"}})
    found = [o for o in out.get("resources", []) if o.get("code", {}).get("text") == test]
    return found[0] if found else {"id": "unknown"}


def _add_supporting(tools: Toolbox, order_id: str, refs: list[str]) -> None:
    order = call(tools, "getResourceById", {"resourceType": "ServiceRequest", "resourceId": order_id})
    body = dict(order)  # meta too: tags, labels and profiles are kept
    current = body.get("supportingInfo", [])
    have = {ref_key(r) for r in current}
    body["supportingInfo"] = current + [{"reference": r} for r in refs if r not in have]
    call(tools, "updateResource", {"resourceType": "ServiceRequest", "resourceId": order_id, "body": body})


# ------------------------------------------------------------------------------------------------
# surgery plans
# ------------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------
# genetic test orders
# ------------------------------------------------------------------------------------------------
@register("orders.order_genome_sequencing", difficulty=2, writes=True,
          touches=("Patient", "Practitioner", "ServiceRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class OrderGenomeSequencing(Family):
    """Place a whole-genome-sequencing order (LOINC 86206-0) with requester and lab

    The requester is a geneticist found by name; the lab, when named, must be found among organizations."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        gen = _genetics(view)
        busy = set(gen["genome_patients"]) | set(gen["active_patients"])
        patient = pick(rng, [p for p in _patients(view).values() if p["id"] not in busy])
        doctor = pick(rng, _doctors_with(view, "genetic"))
        if patient is None or doctor is None:
            return None
        lab = gen["lab"] if rng.random() < 0.6 else None
        return {"patient_id": patient["id"], "name": patient["name"], "birth_date": patient["birth_date"],
                "doctor_id": doctor["id"], "doctor": doctor["name"],
                "lab_id": lab["id"] if lab else None, "lab": lab["name"] if lab else None}

    def prompt(self, params: dict) -> str:
        lab = f", to be performed by {params['lab']}" if params["lab"] else ""
        return (f"Please place an order for whole genome sequencing (LOINC {WGS[0]}, whole genome sequence "
                f"analysis) for {who(params['name'], params['birth_date'])}. Record it as a ServiceRequest with status active and intent order, "
                f"requested by our clinical geneticist Dr. {params['doctor']}{lab}.")

    def gold(self, view: View, params: dict) -> Gold:
        checks = [ref("subject", f"Patient/{params['patient_id']}"), coded("code", LOINC, WGS[0]),
                  eq("status", "active"), eq("intent", "order"),
                  ref("requester", f"Practitioner/{params['doctor_id']}")]
        if params["lab_id"]:
            checks.append(ref("performer", f"Organization/{params['lab_id']}"))
        return Gold(expects=[Expect("create", "ServiceRequest", checks=tuple(checks))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params["name"], params["birth_date"])
        doctor = _find_doctor(tools, params["doctor"])
        body: dict = {
            "resourceType": "ServiceRequest", "status": "active", "intent": "order",
            "category": [{"coding": [{"system": DIAGNOSTIC_SERVICE, "code": "GE", "display": "Genetics"}]}],
            "code": {"coding": [{"system": LOINC, "code": WGS[0], "display": WGS[1]}]},
            "subject": {"reference": f"Patient/{patient['id']}"},
            "authoredOn": now.isoformat().replace("+00:00", "Z"),
            "requester": {"reference": f"Practitioner/{doctor}"},
        }
        if params["lab"]:
            out = call(tools, "searchResources", {"resourceType": "Organization",
                                                 "params": {"name:exact": params["lab"]}})
            labs = out.get("resources", [])
            body["performer"] = [{"reference": f"Organization/{labs[0]['id'] if labs else 'unknown'}"}]
        call(tools, "createResource", {"resourceType": "ServiceRequest", "body": body})
        return "Placed the whole genome sequencing order."


def _outside_reports(view: View, params: dict) -> list[dict]:
    out = []
    for n, item in enumerate(params["outside"], 1):
        out.append({
            "resourceType": "DiagnosticReport", "id": view.new_id(f"outside-report-{n}"), "status": "final",
            "category": [{"coding": [{"system": DIAGNOSTIC_SERVICE, "code": "GE", "display": "Genetics"}]}],
            "code": {"coding": [{"system": LOINC, "code": GENETIC_REPORT[0], "display": GENETIC_REPORT[1]}]},
            "subject": {"reference": f"Patient/{params['patient_id']}"},
            "effectiveDateTime": item["day"], "issued": item["day"] + "T12:00:00Z",
            "performer": [{"display": item["lab"]}],
            "conclusion": item["conclusion"],
        })
    return out


OUTSIDE_LABS = ("Commonwealth Molecular Diagnostics", "New England Genetic Reference Lab",
                "Atlantic Hereditary Testing Services")


@register("orders.attach_genetic_reports", difficulty=2, writes=True,
          touches=("Patient", "ServiceRequest", "DiagnosticReport"),
          sequences=(("searchResources", "searchResources", "updateResource"),))
class AttachGeneticReports(Family):
    """Attach all of a patient's genetic analysis reports to the genetic order's supportingInfo

    Every genetic analysis report of the patient — outside ones not based on this order included — and
    only those (the patient also has lab panels and chest X-ray reports); what is already linked stays."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        order = pick(rng, _genetics(view)["orders"])
        params = _order_params(view, order) if order else None
        if params is None:
            return None
        genes = order["text"].rsplit("(", 1)[-1].rstrip(")") if "(" in order["text"] else "the tested genes"
        outside = []
        for n in range(rng.choice((1, 2))):
            day = view.anchor - timedelta(days=rng.randint(400, 3000))
            conclusion = rng.choice(("Targeted familial variant testing: the familial variant was not detected.",
                                     f"Single-site analysis: no pathogenic variants detected in {genes}.",
                                     f"Outside sequencing report: no reportable variants in {genes}."))
            outside.append({"day": day.isoformat(), "lab": OUTSIDE_LABS[(n + rng.randrange(3)) % 3],
                            "conclusion": conclusion})
        params["outside"] = outside
        params["world_reports"] = order["reports"]
        return params

    def prompt(self, params: dict) -> str:
        return (f"{who(params['name'], params['birth_date'])} has {_order_phrase(params)}. Outside genetic test results have been filed to the "
                "chart as well. Please attach all of the patient's genetic analysis reports (LOINC "
                f"{GENETIC_REPORT[0]}), including the outside ones, to that order as supporting information, "
                "keeping whatever is already listed there. Do not attach any other kind of report.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _outside_reports(view, params)

    def gold(self, view: View, params: dict) -> Gold:
        reports = [f"DiagnosticReport/{r}" for r in params["world_reports"]]
        reports += [f"DiagnosticReport/{r['id']}" for r in _outside_reports(view, params)]
        return Gold(expects=[Expect("update", "ServiceRequest", id=params["order_id"], checks=(
            refs_exactly("supportingInfo", [*params["supporting"], *reports]),))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params["name"], params["birth_date"])
        order = _find_order(tools, patient["id"], params["test"])
        out = call(tools, "searchResources", {"resourceType": "DiagnosticReport", "params": {
            "subject": f"Patient/{patient['id']}", "code": f"{LOINC}|{GENETIC_REPORT[0]}",
            "_elements": "id,code,status"}})
        _add_supporting(tools, order["id"], [f"DiagnosticReport/{r['id']}" for r in out.get("resources", [])])
        return "Attached the genetic analysis reports to the order."


@register("orders.attach_relevant_report", difficulty=2, writes=True,
          touches=("Patient", "ServiceRequest", "DiagnosticReport"),
          sequences=(("searchResources", "searchResources", "updateResource"),))
class AttachRelevantReport(Family):
    """Attach only the genetic order's own report (not the chest X-ray) to its supportingInfo

    The patient's chart also holds chest X-ray reports (and often many lab panels) near the order date:
    only the report based on this order may be attached."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        order = pick(rng, [o for o in _genetics(view)["orders"] if o["own_reports"] and o["xrays"]])
        params = _order_params(view, order) if order else None
        if params is None:
            return None
        params["own_reports"] = order["own_reports"]
        return params

    def prompt(self, params: dict) -> str:
        return (f"The lab has reported on {_order_phrase(params)} for {who(params['name'], params['birth_date'])}. Please attach the genetic "
                "analysis report of that test to the order as supporting information, keeping whatever is already "
                "listed there. The patient has other reports on file (imaging and others); attach only the "
                "report of this genetic test.")

    def gold(self, view: View, params: dict) -> Gold:
        reports = [f"DiagnosticReport/{r}" for r in params["own_reports"]]
        return Gold(expects=[Expect("update", "ServiceRequest", id=params["order_id"], checks=(
            refs_exactly("supportingInfo", [*params["supporting"], *reports]),))])

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        """Whether the first hit of ``DiagnosticReport?patient`` (the chart's reports) is not this order's."""
        hits = view.search("DiagnosticReport", {"patient": f"Patient/{params['patient_id']}", "_elements": "id"})
        return hits[0]["id"] not in params["own_reports"] if hits else None

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params["name"], params["birth_date"])
        order = _find_order(tools, patient["id"], params["test"])
        out = call(tools, "searchResources", {"resourceType": "DiagnosticReport", "params": {
            "based-on": f"ServiceRequest/{order['id']}", "_elements": "id,code,status"}})
        _add_supporting(tools, order["id"], [f"DiagnosticReport/{r['id']}" for r in out.get("resources", [])])
        return "Attached the genetic report to the order."


def _new_fmh_linked(existing: list[str], known: frozenset[str]) -> Check:
    """supportingInfo keeps ``existing`` and adds exactly one FamilyMemberHistory created in this episode
    (an id not in the pre-run state; referential integrity makes it one that exists)."""
    keep = {ref_key(r) for r in existing}

    def fn(after: dict, before: dict | None) -> str | None:
        got = {ref_key(v) for v in values(after, "supportingInfo")} - {None}
        added = got - keep
        fresh = [k for k in added if k.startswith("FamilyMemberHistory/") and k.split("/", 1)[1] not in known]
        if keep <= got and len(added) == 1 and len(fresh) == 1:
            return None
        return (f"supportingInfo references {sorted(got)}, expected {sorted(keep)} plus the one new "
                "FamilyMemberHistory")
    return custom("supportingInfo", "supportingInfo = the prior entries + the new FamilyMemberHistory", fn)


@register("orders.add_family_history", difficulty=3, writes=True,
          touches=("Patient", "ServiceRequest", "FamilyMemberHistory"),
          sequences=(("searchResources", "createResource", "updateResource"),))
class AddFamilyHistory(Family):
    """Record a FamilyMemberHistory and add it to the genetic order's supportingInfo

    Two dependent writes: create the coded FamilyMemberHistory, then link it from the order without
    losing what the order already lists."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        order = pick(rng, [o for o in _genetics(view)["orders"] if o["status"] == "active"])
        params = _order_params(view, order) if order else None
        indication = next((i for i in INDICATIONS if order and i.reason[0] == order["reason"]), None)
        if params is None or indication is None:
            return None
        options = [r for r in indication.relatives if r[0] not in order["relatives"]]
        if not options:
            return None
        rel_code, rel_display, _sex, cond_code, cond_display, (lo, hi) = rng.choice(options)
        params.update({"rel_code": rel_code, "rel_display": rel_display, "cond_code": cond_code,
                       "cond_display": cond_display.replace(" (disorder)", ""), "age": rng.randint(max(1, lo), hi)})
        return params

    def prompt(self, params: dict) -> str:
        return (f"At today's genetic counseling visit, {who(params['name'], params['birth_date'])} reported that the patient's "
                f"{params['rel_display']} was diagnosed with {params['cond_display'].lower()} (SNOMED CT "
                f"{params['cond_code']}) at age {params['age']}. Please record this as a family member history "
                f"(status completed; relationship {params['rel_display']}, code {params['rel_code']} of {ROLE_CODE}; "
                f"the condition with an onset age of {params['age']} {'year' if params['age'] == 1 else 'years'}) and "
                "add it to the supporting information of "
                f"{_order_phrase(params)}, keeping whatever is already listed there.")

    def gold(self, view: View, params: dict) -> Gold:
        known = _genetics(view)["fmh_ids"]
        return Gold(expects=[
            Expect("create", "FamilyMemberHistory", checks=(
                ref("patient", f"Patient/{params['patient_id']}"), eq("status", "completed"),
                coded("relationship", ROLE_CODE, params["rel_code"]),
                coded("condition.code", SNOMED, params["cond_code"]),
                eq("condition.onsetAge.value", params["age"]))),
            Expect("update", "ServiceRequest", id=params["order_id"], checks=(
                _new_fmh_linked(params["supporting"], known),)),
        ])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params["name"], params["birth_date"])
        order = _find_order(tools, patient["id"], params["test"])
        created = call(tools, "createResource", {"resourceType": "FamilyMemberHistory", "body": {
            "resourceType": "FamilyMemberHistory", "status": "completed",
            "patient": {"reference": f"Patient/{patient['id']}"}, "date": now.date().isoformat(),
            "relationship": {"coding": [{"system": ROLE_CODE, "code": params["rel_code"],
                                         "display": params["rel_display"]}]},
            "condition": [{"code": {"coding": [{"system": SNOMED, "code": params["cond_code"],
                                                "display": params["cond_display"]}]},
                           "onsetAge": {"value": params["age"], "unit": "a", "system": UCUM,
                                        "code": "a"}}],
        }})
        _add_supporting(tools, order["id"], [f"FamilyMemberHistory/{created.get('id', 'unknown')}"])
        return "Recorded the family history and linked it to the order."
