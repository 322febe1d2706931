"""Genetic test orders: order sequencing, attach the lab's reports, add the family history."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta

from ....spec.codes import DIAGNOSTIC_SERVICE, LOINC, ROLE_CODE, SNOMED, UCUM
from ....tools import Toolbox
from ....world import INDICATIONS
from ... import Expect, Family, Gold, View, register
from ...checks import Check, coded, custom, eq, ref, ref_id, ref_key, refs_exactly, values
from ...draw import pick, who
from ...facts import (
    family_histories,
    reports,
    service_requests,
)
from ...solve import call
from ._common import _doctors, _doctors_with, _find_doctor, _find_patient, _patients

GENETIC_REPORT = ("51969-4", "Genetic analysis report")


CHEST_XRAY = "36643-5"


WGS = ("86206-0", "Whole genome sequence analysis in Blood or Tissue by Molecular genetics method")


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
