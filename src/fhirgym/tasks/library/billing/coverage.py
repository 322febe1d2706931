"""Insurance coverage: add a dependant's coverage, find the primary one, or report none."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta

from ....spec.codes import COVERAGE_CLASS, IDENTIFIER_TYPE, ROLE_CODE, SUBSCRIBER_RELATIONSHIP
from ....tools import Toolbox
from ....world import EMPLOYERS, INSURERS
from ... import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ...checks import Check, coded, custom, eq, on_day, ref, ref_id, ref_key
from ...draw import EitherWay, deal, human_date, new_name, pick, pronoun, random_birth, who
from ...facts import (
    coverages,
    full_name,
    official_name,
    organizations,
    related_by_id,
    related_persons,
    unique_patient,
)
from ...solve import call, create, find_patient
from ._common import RELATION, _active, _age, _code, _related_person, candidates

PRIVATE = tuple(i for i in INSURERS if not i.public)


MEMBER_PREFIX = {"Aetna": "W", "Blue Cross Blue Shield": "XYZ", "UnitedHealthcare": "9", "Cigna Health": "U"}


def _uninsured(view: View, p: dict) -> bool:
    return not _active(coverages(view).get(p["id"], []))


def _insurer_ids(view: View, name: str) -> list[str]:
    return sorted(oid for oid, org in organizations(view).items() if org.get("name") == name)


def _class_check(kind: str, value: str) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        for cls in after.get("class") or []:
            if isinstance(cls, dict) and _code(cls.get("type")) == kind and cls.get("value") == value:
                return None
        return f"no Coverage.class of type {kind} with value {value!r}"
    return custom("class", f"class {kind} = {value!r}", fn)


def _new_related_person(existing: set[str]) -> Check:
    """The subscriber is a RelatedPerson that did not exist before the run (the one the agent created)."""
    def fn(after: dict, before: dict | None) -> str | None:
        key = ref_key(after.get("subscriber"))
        if key and key.startswith("RelatedPerson/") and key.split("/", 1)[1] not in existing:
            return None
        return f"subscriber is {key or 'missing'}, expected the newly created RelatedPerson"
    return custom("subscriber", "subscriber → the new RelatedPerson", fn)


@register("billing.add_coverage", difficulty=3, writes=True,
          touches=("Patient", "Organization", "RelatedPerson", "Coverage"),
          sequences=(("searchResources", "createResource", "createResource"),))
class AddCoverage(Family):
    """Record a dependant's new coverage, creating the subscriber as a RelatedPerson first

    Two dependent creates: the subscriber (a RelatedPerson) first, then a Coverage referencing it,
    the insurer Organization found by search, and group and plan as Coverage.class."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, candidates(view, "uninsured", _uninsured))
        if p is None:
            return None
        age = _age(p["birthDate"], view.anchor)
        if age < 26:
            rel_code, relationship = rng.choice(("MTH", "FTH")), "child"
            gender = RELATION[rel_code][1]
            birth = random_birth(rng, date.fromisoformat(p["birthDate"]) - timedelta(days=40 * 365),
                                 date.fromisoformat(p["birthDate"]) - timedelta(days=22 * 365))
            family = official_name(p).get("family")
        else:
            rel_code, relationship = "SPS", "spouse"
            gender = "male" if p.get("gender") == "female" else "female"
            birth = random_birth(rng, date.fromisoformat(p["birthDate"]) - timedelta(days=6 * 365),
                                 date.fromisoformat(p["birthDate"]) + timedelta(days=6 * 365))
            family = official_name(p).get("family") if rng.random() < 0.6 else None
        birth = min(birth, view.anchor - timedelta(days=19 * 365))
        if any(_code(r.get("relationship")) == rel_code for r in related_persons(view).get(p["id"], [])):
            return None
        name = new_name(view, rng, gender, family)
        if name is None:
            return None
        ins = rng.choice(PRIVATE)
        plan = rng.choice(ins.plans)
        start = view.anchor.replace(day=1)
        if rng.random() < 0.5:
            start = (start + timedelta(days=32)).replace(day=1)
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "rel_code": rel_code, "relationship": relationship, "rp_given": name[0], "rp_family": name[1],
                "rp_gender": gender, "rp_birth": birth.isoformat(), "insurer": ins.name,
                "member": f"{MEMBER_PREFIX[ins.name]}{rng.randint(10**7, 10**8 - 1)}",
                "group": str(rng.randint(100000, 999999)), "group_name": f"{rng.choice(EMPLOYERS)} Employee Plan",
                "plan": plan.code, "plan_name": plan.name, "start": start.isoformat()}

    def prompt(self, params: dict) -> str:
        word = "spouse" if params["rel_code"] == "SPS" else RELATION[params["rel_code"]][0]
        rp = f"{params['rp_given']} {params['rp_family']}"
        return (f"{who(params['name'], params['birth_date'])} is now insured as a dependant on {pronoun(params['gender'])} {word}'s "
                f"employer plan with {params['insurer']}. The {word}, {rp}, is not on file yet: first add "
                f"{rp} as a related person of {params['name']} (relationship {word}, HL7 v3 RoleCode "
                f"{params['rel_code']}; {params['rp_gender']}; born {human_date(params['rp_birth'])}). Then record "
                f"the coverage: status active, insurer {params['insurer']}, subscriber {rp} with subscriber ID "
                f"{params['member']}, {params['name']}'s relationship to the subscriber '{params['relationship']}', "
                f"group {params['group']} ({params['group_name']}) and plan {params['plan']} "
                f"({params['plan_name']}) as the coverage classes, coverage starting {human_date(params['start'])}.")

    def gold(self, view: View, params: dict) -> Gold:
        patient = f"Patient/{unique_patient(view, params['name'], params['birth_date'])['id']}"
        insurers = _insurer_ids(view, params["insurer"])
        assert insurers, params["insurer"]
        existing = set(related_by_id(view))
        payor = ref("payor", f"Organization/{insurers[0]}") if len(insurers) == 1 else custom(
            "payor", f"payor → one of {insurers}",
            lambda a, b: None if {ref_id(x) for x in a.get("payor") or []} & set(insurers) else "wrong payor")
        return Gold(expects=[
            Expect("create", "RelatedPerson", checks=_related_person(patient, params)),
            Expect("create", "Coverage", checks=(
                eq("status", "active"),
                ref("beneficiary", patient),
                payor,
                _new_related_person(existing),
                coded("relationship", None, params["relationship"]),  # the prompt names the code only
                eq("subscriberId", params["member"]),
                _class_check("group", params["group"]),
                _class_check("plan", params["plan"]),
                on_day("period.start", params["start"]),
            )),
        ])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = find_patient(tools, params["name"], params["birth_date"])
        orgs = call(tools, "searchResources", {"resourceType": "Organization", "params": {
            "name": params["insurer"], "_elements": "name,type"}})
        insurer = next((o for o in orgs.get("resources", []) if o.get("name") == params["insurer"]), None)
        if patient is None or insurer is None:
            return "I could not find the patient or the insurer."
        pref = {"reference": f"Patient/{patient['id']}", "display": params["name"]}
        rp_name = f"{params['rp_given']} {params['rp_family']}"
        word = RELATION[params["rel_code"]][0]
        created = call(tools, "createResource", {"resourceType": "RelatedPerson", "body": {
            "resourceType": "RelatedPerson", "active": True, "patient": pref,
            "relationship": [{"coding": [{"system": ROLE_CODE, "code": params["rel_code"], "display": word}]}],
            "name": [{"use": "official", "family": params["rp_family"], "given": [params["rp_given"]]}],
            "gender": params["rp_gender"], "birthDate": params["rp_birth"]}})
        create(tools, {
            "resourceType": "Coverage", "status": "active",
            "subscriber": {"reference": f"RelatedPerson/{created.get('id')}", "display": rp_name},
            "subscriberId": params["member"], "beneficiary": pref,
            "relationship": {"coding": [{"system": SUBSCRIBER_RELATIONSHIP, "code": params["relationship"]}]},
            "period": {"start": params["start"]},
            "payor": [{"reference": f"Organization/{insurer['id']}", "display": params["insurer"]}],
            "class": [
                {"type": {"coding": [{"system": COVERAGE_CLASS, "code": "group"}]}, "value": params["group"],
                 "name": params["group_name"]},
                {"type": {"coding": [{"system": COVERAGE_CLASS, "code": "plan"}]}, "value": params["plan"],
                 "name": params["plan_name"]},
            ]})
        return f"Added {rp_name} and the {params['insurer']} coverage."


COVERAGE_ANSWER = AnswerSpec((
    Field("payer", "text", "the insurance company's name"),
    Field("member_id", "text", "the member (subscriber) ID of that coverage"),
))


def _coverage_prompt(params: dict) -> str:
    return (f"Which insurance company is {who(params['name'], params['birth_date'])} currently covered by (the primary coverage), "
            "and what is the member ID on it?")


def _solve_coverage(tools: Toolbox, params: dict) -> str:
    patient = find_patient(tools, params["name"], params["birth_date"])
    if patient is None:
        return answer_text(NOT_FOUND)
    out = call(tools, "searchResources", {"resourceType": "Coverage", "params": {
        "beneficiary": f"Patient/{patient['id']}", "status": "active"}})
    covs = sorted(out.get("resources", []), key=lambda c: c.get("order", 99))
    if not covs:
        return answer_text(NOT_FOUND)
    payer = covs[0]["payor"][0].get("display")
    if not payer:
        org = call(tools, "getResourceById", {"resourceType": "Organization",
                                             "resourceId": ref_id(covs[0]["payor"][0])})
        payer = org.get("name")
    return answer_text({"payer": payer, "member_id": covs[0].get("subscriberId")})


def _one_primary(view: View, p: dict) -> bool:
    """Exactly one active coverage is primary (order 1) and every other active one has an order."""
    active = _active(coverages(view).get(p["id"], []))
    primary = [c for c in active if c.get("order") == 1]
    return len(primary) == 1 and all(isinstance(c.get("order"), int) for c in active)


@register("billing.find_coverage", difficulty=2, touches=("Patient", "Coverage"),
          sequences=(("searchResources", "searchResources"),))
class FindCoverage(Family):
    """Name the payer and member ID of a patient's active primary coverage

    The active primary coverage among cancelled (replaced), entered-in-error (wrong payer) and
    secondary ones."""

    answer = COVERAGE_ANSWER

    def sample(self, view: View, rng: random.Random) -> dict | None:
        # dealt by seed among every patient with one primary coverage (many with cancelled, entered-in-error
        # or secondary ones beside it), so no patient's coverage is the gold of many seeds
        p = deal(view, candidates(view, "one_primary", _one_primary))
        if p is None:
            return None
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "others": len(coverages(view)[p["id"]]) - 1}

    def prompt(self, params: dict) -> str:
        return _coverage_prompt(params)

    def gold(self, view: View, params: dict) -> Gold:
        pid = unique_patient(view, params["name"], params["birth_date"])["id"]
        active = _active(coverages(view).get(pid, []))
        primary = [c for c in active if c.get("order") == 1]
        assert len(primary) == 1 and all(isinstance(c.get("order"), int) for c in active), params
        cov = primary[0]
        org = organizations(view).get(ref_id(cov["payor"][0]), {})
        payers = sorted({x for x in (org.get("name"), cov["payor"][0].get("display")) if x})
        members = sorted({x for x in [cov.get("subscriberId"), *(i.get("value") for i in cov.get("identifier", []))]
                          if x})
        return Gold(answer={"payer": payers, "member_id": members})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_coverage(tools, params)


@register("billing.no_coverage", difficulty=2, touches=("Patient", "Coverage"),
          sequences=(("searchResources", "searchResources"),))
class NoCoverage(EitherWay):
    """Payer and member ID of the active coverage, or report that there is none (lapsed coverage)

    An uninsured patient, sometimes with a lapsed (cancelled) old coverage or an insured namesake."""

    answer = AnswerSpec(COVERAGE_ANSWER.fields, none_allowed=True)
    found = FindCoverage

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, candidates(view, "uninsured", _uninsured))
        if p is None:
            return None
        ins = rng.choice(PRIVATE)
        end = view.anchor - timedelta(days=rng.randint(40, 700))
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "lapsed": rng.random() < 0.5, "insurer": ins.name, "plan": ins.plans[0].code,
                "plan_name": ins.plans[0].name, "end": end.isoformat(),
                "start": end.replace(year=end.year - rng.randint(1, 4), day=1).isoformat(),
                "member": f"{MEMBER_PREFIX[ins.name]}{rng.randint(10**7, 10**8 - 1)}"}

    def setup_none(self, view: View, params: dict) -> list[dict]:
        if not params["lapsed"]:
            return []
        pref = {"reference": f"Patient/{params['patient_id']}", "display": params["name"]}
        return [{
            "resourceType": "Coverage", "id": view.new_id("lapsed-coverage"), "status": "cancelled",
            "identifier": [{"type": {"coding": [{"system": IDENTIFIER_TYPE,
                                                 "code": "MB"}]}, "value": params["member"]}],
            "subscriber": pref, "subscriberId": params["member"], "beneficiary": pref,
            "relationship": {"coding": [{"system": SUBSCRIBER_RELATIONSHIP, "code": "self"}]},
            "period": {"start": params["start"], "end": params["end"]},
            "payor": [{"reference": f"Organization/{_insurer_ids(view, params['insurer'])[0]}",
                       "display": params["insurer"]}],
            "class": [{"type": {"coding": [{"system": COVERAGE_CLASS, "code": "plan"}]}, "value": params["plan"],
                       "name": params["plan_name"]}],
        }]

    def prompt(self, params: dict) -> str:
        return _coverage_prompt(params)

    def gold_none(self, view: View, params: dict) -> Gold:
        pid = unique_patient(view, params["name"], params["birth_date"])["id"]
        added = [r for r in self.setup_none(view, params) if ref_id(r.get("beneficiary")) == pid]
        assert not _active(coverages(view).get(pid, []) + added), params
        return Gold(answer=NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_coverage(tools, params)
