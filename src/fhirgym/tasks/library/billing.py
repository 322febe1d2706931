"""Insurance & billing (FHIR-AgentEval, 9 tasks): coverage, related persons, accounts and guarantors.

The world (``world/_admin.py``) gives every case: uninsured patients, dependants whose subscriber is a
RelatedPerson, replaced (``cancelled``) and ``entered-in-error`` coverages beside the active one, and
accounts guaranteed by a RelatedPerson, by the patient or by nobody. Patients are always named with
their birth date (the world holds same-name patients).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import date, datetime, timedelta

from ...spec.codes import ACT_CODE, COVERAGE_CLASS, IDENTIFIER_TYPE, ROLE_CODE, SUBSCRIBER_RELATIONSHIP
from ...tools import Toolbox
from ...world import EMPLOYERS, INSURERS
from .. import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ..checks import Check, coded, custom, eq, on_day, phone_check, ref, ref_id, ref_key, refs_exactly
from ..draw import EitherWay, deal, human_date, new_name, new_phone, pick, pronoun, random_birth, who
from ..facts import (
    accounts,
    all_patients,
    coverages,
    full_name,
    living_patients,
    official_name,
    organizations,
    related_by_id,
    related_persons,
    unique_patient,
)
from ..solve import call, create, find_patient

#: v3-RoleCode relationship -> (word, gender)
RELATION = {"MTH": ("mother", "female"), "FTH": ("father", "male"), "SPS": ("spouse", "")}
PRIVATE = tuple(i for i in INSURERS if not i.public)
MEMBER_PREFIX = {"Aetna": "W", "Blue Cross Blue Shield": "XYZ", "UnitedHealthcare": "9", "Cigna Health": "U"}


# -- cached world facts (base world only; gold re-reads the pre-run state) ------------------------------



def _code(concept: object) -> str | None:
    if isinstance(concept, list):
        concept = concept[0] if concept else {}
    return next((c.get("code") for c in (concept or {}).get("coding", [])), None) if isinstance(concept, dict) else None


def candidates(view: View, key: str, fits: Callable[[View, dict], bool]) -> list[dict]:
    """Living patients for which ``fits(view, patient)`` holds, cached per world under ``billing.<key>``."""
    return view.cached(f"billing.{key}", lambda: [p for p in living_patients(view) if fits(view, p)])


def _uninsured(view: View, p: dict) -> bool:
    return not _active(coverages(view).get(p["id"], []))


def _active(coverages: list[dict]) -> list[dict]:
    return [c for c in coverages if c.get("status") == "active"]


def _age(birth: str, on: date) -> int:
    b = date.fromisoformat(birth)
    return on.year - b.year - ((on.month, on.day) < (b.month, b.day))


def _insurer_ids(view: View, name: str) -> list[str]:
    return sorted(oid for oid, org in organizations(view).items() if org.get("name") == name)


def _rp_name(rp: dict) -> str:
    return full_name(rp)


# -- coverage -----------------------------------------------------------------------------------------

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
            Expect("create", "RelatedPerson", checks=(
                ref("patient", patient),
                coded("relationship", ROLE_CODE, params["rel_code"]),
                eq("name.family", params["rp_family"]),
                eq("name.given", params["rp_given"]),
                eq("gender", params["rp_gender"]),
                eq("birthDate", params["rp_birth"]),
            )),
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


# -- related persons ------------------------------------------------------------------------------------

@register("billing.create_related_person", difficulty=2, writes=True, touches=("Patient", "RelatedPerson"),
          sequences=(("searchResources", "createResource"),))
class CreateRelatedPerson(Family):
    """Add a patient's parent or spouse as a RelatedPerson"""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, living_patients(view))
        adult = _age(p["birthDate"], view.anchor) >= 18
        rel_code = rng.choice(("MTH", "FTH", "SPS") if adult else ("MTH", "FTH"))
        if any(_code(r.get("relationship")) == rel_code for r in related_persons(view).get(p["id"], [])):
            return None
        born = date.fromisoformat(p["birthDate"])
        if rel_code == "SPS":
            gender = "male" if p.get("gender") == "female" else "female"
            birth = random_birth(rng, born - timedelta(days=5 * 365), born + timedelta(days=5 * 365))
            family = official_name(p).get("family") if rng.random() < 0.5 else None
        else:
            gender = RELATION[rel_code][1]
            birth = random_birth(rng, born - timedelta(days=40 * 365), born - timedelta(days=20 * 365))
            family = official_name(p).get("family")
        name = new_name(view, rng, gender, family)
        if name is None:
            return None
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "rel_code": rel_code, "rp_given": name[0], "rp_family": name[1], "rp_gender": gender,
                "rp_birth": min(birth, view.anchor - timedelta(days=19 * 365)).isoformat(), "phone": new_phone(rng)}

    def prompt(self, params: dict) -> str:
        word = RELATION[params["rel_code"]][0]
        return (f"Please add {params['rp_given']} {params['rp_family']} as a related person on the record of "
                f"{who(params['name'], params['birth_date'])}: {pronoun(params['gender'])} {word} (HL7 v3 RoleCode {params['rel_code']}), "
                f"{params['rp_gender']}, born {human_date(params['rp_birth'])}, phone {params['phone']}.")

    def gold(self, view: View, params: dict) -> Gold:
        patient = f"Patient/{unique_patient(view, params['name'], params['birth_date'])['id']}"
        return Gold(expects=[Expect("create", "RelatedPerson", checks=(
            ref("patient", patient),
            coded("relationship", ROLE_CODE, params["rel_code"]),
            eq("name.family", params["rp_family"]),
            eq("name.given", params["rp_given"]),
            eq("gender", params["rp_gender"]),
            eq("birthDate", params["rp_birth"]),
            phone_check(params["phone"]),
        ))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = find_patient(tools, params["name"], params["birth_date"])
        if patient is None:
            return "I could not find the patient."
        create(tools, {
            "resourceType": "RelatedPerson", "active": True,
            "patient": {"reference": f"Patient/{patient['id']}", "display": params["name"]},
            "relationship": [{"coding": [{"system": ROLE_CODE, "code": params["rel_code"],
                                          "display": RELATION[params["rel_code"]][0]}]}],
            "name": [{"use": "official", "family": params["rp_family"], "given": [params["rp_given"]]}],
            "telecom": [{"system": "phone", "value": params["phone"], "use": "mobile"}],
            "gender": params["rp_gender"], "birthDate": params["rp_birth"]})
        return "Added the related person."


# -- accounts -------------------------------------------------------------------------------------------

def _account_name(params: dict) -> str:
    return f"{params['name']} - patient billing account"


def _account_request(params: dict) -> str:
    return (f"Please open a billing account for {who(params['name'], params['birth_date'])}: name it \"{_account_name(params)}\", "
            "status active, type patient billing account (v3-ActCode PBILLACCT), service period starting today")


def _only_account(view: View, p: dict) -> dict | None:
    held = accounts(view).get(p["id"], [])
    return held[0] if len(held) == 1 else None


def _account_holders(view: View) -> list[dict]:
    """Living patients with exactly one Account."""
    return candidates(view, "one_account", lambda v, p: _only_account(v, p) is not None)


def _gold_account(view: View, params: dict) -> dict:
    pid = unique_patient(view, params["name"], params["birth_date"])["id"]
    held = accounts(view).get(pid, [])
    assert len(held) == 1, f"{params}: {len(held)} accounts"
    return held[0]


def _find_account(tools: Toolbox, params: dict) -> dict | None:
    patient = find_patient(tools, params["name"], params["birth_date"])
    if patient is None:
        return None
    out = call(tools, "searchResources", {"resourceType": "Account", "params": {
        "subject": f"Patient/{patient['id']}"}})
    accounts = out.get("resources", [])
    return accounts[0] if accounts else None


@register("billing.create_account", difficulty=2, writes=True, touches=("Patient", "Account"),
          sequences=(("searchResources", "createResource"),))
class CreateAccount(Family):
    """Open a billing Account for a patient and link the active coverages

    The account must link exactly the patient's active coverages (not the cancelled or voided ones)."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, candidates(view, "no_account", lambda v, q: not accounts(v).get(q["id"])))
        if p is None:
            return None
        active = sorted(_active(coverages(view).get(p["id"], [])), key=lambda c: (c.get("order", 99), c["id"]))
        payers = [c["payor"][0].get("display") or "" for c in active]
        if not all(payers) or len(payers) > 2:
            return None
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "payers": payers}

    def prompt(self, params: dict) -> str:
        payers, her = params["payers"], pronoun(params["gender"])
        if not payers:
            tail = f". {params['name']} has no insurance on file, so it is a self-pay account."
        elif len(payers) == 1:
            tail = f", and link it to {her} active {payers[0]} coverage."
        else:
            tail = f", and link it to both of {her} active coverages ({payers[0]} and {payers[1]})."
        return _account_request(params) + tail

    def gold(self, view: View, params: dict) -> Gold:
        pid = unique_patient(view, params["name"], params["birth_date"])["id"]
        assert not accounts(view).get(pid), params
        active = _active(coverages(view).get(pid, []))
        assert len(active) == len(params["payers"]), params
        checks = [ref("subject", f"Patient/{pid}"), eq("status", "active"), eq("name", _account_name(params)),
                  coded("type", ACT_CODE, "PBILLACCT"), on_day("servicePeriod.start", view.now.date().isoformat())]
        if active:
            checks.append(refs_exactly("coverage.coverage", [f"Coverage/{c['id']}" for c in active]))
        return Gold(expects=[Expect("create", "Account", checks=tuple(checks))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = find_patient(tools, params["name"], params["birth_date"])
        if patient is None:
            return "I could not find the patient."
        pref = {"reference": f"Patient/{patient['id']}", "display": params["name"]}
        body = {"resourceType": "Account", "status": "active", "name": _account_name(params),
                "type": {"coding": [{"system": ACT_CODE, "code": "PBILLACCT", "display": "patient billing account"}]},
                "subject": [pref], "servicePeriod": {"start": now.date().isoformat()}}
        if params["payers"]:
            out = call(tools, "searchResources", {"resourceType": "Coverage", "params": {
                "beneficiary": f"Patient/{patient['id']}", "status": "active"}})
            covs = sorted(out.get("resources", []), key=lambda c: c.get("order", 99))
            body["coverage"] = [{"coverage": {"reference": f"Coverage/{c['id']}"}, "priority": n + 1}
                                for n, c in enumerate(covs)]
        call(tools, "createResource", {"resourceType": "Account", "body": body})
        return "Opened the billing account."


@register("billing.existing_account", difficulty=2, touches=("Patient", "Account"),
          sequences=(("searchResources", "searchResources"),))
class ExistingAccount(Family):
    """Asked to open an account that already exists: report the existing Account

    Asked to open an account the patient already has: the right move is to report it, not to create a
    duplicate (any write fails the task)."""

    answer = AnswerSpec((Field("account_id", "id", "the id of the patient's billing account"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = deal(view, _account_holders(view))  # by seed: no account is many golds
        if p is None:
            return None
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender")}

    def prompt(self, params: dict) -> str:
        return (_account_request(params) + ". A patient must never have two billing accounts: if "
                f"{params['name']} already has one, do not open another, just tell me its id.")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(answer={"account_id": _gold_account(view, params)["id"]})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        account = _find_account(tools, params)
        return answer_text({"account_id": account["id"]}) if account else "No account found."


# -- guarantors -----------------------------------------------------------------------------------------

def _related_word(rp: dict) -> str:
    code = _code(rp.get("relationship"))
    return RELATION.get(code or "", ("related person", ""))[0]


@register("billing.set_guarantor", difficulty=2, writes=True, touches=("Patient", "RelatedPerson", "Account"),
          sequences=(("searchResources", "updateResource"),))
class SetGuarantor(Family):
    """Make a RelatedPerson the guarantor of a patient's existing Account

    An update that must keep every other element of the Account (coverage links, owner, period). The
    guarantor is a relative newly on file (staged by the setup, beside any relative already there): the
    world's unguaranteed accounts are too few to vary the gold otherwise."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        def unguaranteed(p: dict) -> bool:
            account = _only_account(view, p)
            return account is not None and not account.get("guarantor")

        p = deal(view, [p for p in _account_holders(view) if unguaranteed(p)])  # by seed: no account is many golds
        if p is None:
            return None
        born = date.fromisoformat(p["birthDate"])
        code = "SPS" if (view.now.date() - born).days > 26 * 365 else rng.choice(("MTH", "FTH"))
        gender = RELATION[code][1] or {"male": "female", "female": "male"}.get(p.get("gender", ""), "female")
        family = official_name(p).get("family", "")
        taken = {_rp_name(r) for r in related_persons(view).get(p["id"], [])}
        givens = sorted({g for q in living_patients(view) if q.get("gender") == gender
                         for g in (official_name(q).get("given") or [])[:1]})
        names = [n for g in givens if (n := f"{g} {family}") not in taken]
        if not names:
            return None
        rp_name = pick(rng, names)
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "rp_id": view.new_id("related-person"), "rp_name": rp_name, "rp_code": code, "rp_gender": gender,
                "relation": RELATION[code][0]}

    def setup(self, view: View, params: dict) -> list[dict]:
        patient = view.read("Patient", params["patient_id"]) or {}
        given, family = params["rp_name"].rsplit(" ", 1)
        rp = {"resourceType": "RelatedPerson", "id": params["rp_id"], "active": True,
              "patient": {"reference": f"Patient/{params['patient_id']}", "display": params["name"]},
              "relationship": [{"coding": [{"system": ROLE_CODE, "code": params["rp_code"],
                                            "display": params["relation"]}]}],
              "name": [{"use": "official", "family": family, "given": [given]}], "gender": params["rp_gender"]}
        if patient.get("address"):
            rp["address"] = patient["address"][:1]
        return [rp]

    def prompt(self, params: dict) -> str:
        return (f"{params['rp_name']}, the {params['relation']} of {who(params['name'], params['birth_date'])}, will be responsible "
                f"for {params['name']}'s bills. Please record {params['rp_name']} as the guarantor on "
                f"{params['name']}'s existing billing account.")

    def gold(self, view: View, params: dict) -> Gold:
        account = _gold_account(view, params)
        assert not account.get("guarantor"), params
        return Gold(expects=[Expect("update", "Account", id=account["id"], checks=(
            ref("guarantor.party", f"RelatedPerson/{params['rp_id']}"),
        ))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = find_patient(tools, params["name"], params["birth_date"])
        if patient is None:
            return "I could not find the patient."
        out = call(tools, "searchResources", {"resourceType": "RelatedPerson", "params": {
            "patient": f"Patient/{patient['id']}"}})
        rp = next(r for r in out.get("resources", []) if _rp_name(r) == params["rp_name"])
        found = call(tools, "searchResources", {"resourceType": "Account", "params": {
            "subject": f"Patient/{patient['id']}", "_elements": "id"}})
        account_id = found["resources"][0]["id"]
        account = call(tools, "getResourceById", {"resourceType": "Account", "resourceId": account_id})
        account = dict(account)  # meta too: tags, labels and profiles are kept
        account["guarantor"] = [{"party": {"reference": f"RelatedPerson/{rp['id']}", "display": params["rp_name"]},
                                 "onHold": False, "period": {"start": now.date().isoformat()}}]
        call(tools, "updateResource", {"resourceType": "Account", "resourceId": account_id, "body": account})
        return f"{params['rp_name']} is now the guarantor."


GUARANTOR_ANSWER = AnswerSpec((Field("guarantor", "text", "the full name of the account's guarantor"),))


def _guarantor_prompt(params: dict) -> str:
    return f"Who is the guarantor on the billing account of {who(params['name'], params['birth_date'])}?"


def _solve_guarantor(tools: Toolbox, params: dict) -> str:
    account = _find_account(tools, params)
    parties = [g["party"] for g in (account or {}).get("guarantor", []) if g.get("party")]
    if not parties:
        return answer_text(NOT_FOUND)
    key = ref_key(parties[0]) or ""
    rtype, rid = key.split("/", 1)
    party = call(tools, "getResourceById", {"resourceType": rtype, "resourceId": rid})
    return answer_text({"guarantor": full_name(party)})


@register("billing.find_guarantor", difficulty=2, touches=("Patient", "Account"),
          sequences=(("searchResources", "searchResources"),))
class FindGuarantor(Family):
    """Name the guarantor of a patient's Account

    The guarantor is a RelatedPerson or the patient; a reference to resolve to a name."""

    answer = GUARANTOR_ANSWER

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = deal(view, view.cached("billing.one_guarantor", lambda: [
            q for q in _account_holders(view) if len((_only_account(view, q) or {}).get("guarantor", [None, None])) == 1]))
        if p is None:
            return None
        account = _only_account(view, p)
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "party": ref_key(account["guarantor"][0].get("party"))}

    def prompt(self, params: dict) -> str:
        return _guarantor_prompt(params)

    def gold(self, view: View, params: dict) -> Gold:
        account = _gold_account(view, params)
        guarantors = account.get("guarantor", [])
        assert len(guarantors) == 1, params
        party_ref = guarantors[0]["party"]
        key = ref_key(party_ref) or ""
        rtype, rid = key.split("/", 1)
        party = (related_by_id(view).get(rid, {}) if rtype == "RelatedPerson"
                 else next((p for p in all_patients(view) if p["id"] == rid), {}))
        names = {full_name(party), party_ref.get("display")}
        for n in party.get("name") or []:
            names.add(" ".join([*(n.get("given") or []), n.get("family", "")]).strip())
        names |= {rid, key}
        if rtype == "Patient":
            names |= {"self", "the patient", "patient", "the patient themselves", "the patient (self)"}
            names |= {f"{full_name(party)} ({w})" for w in ("self", "the patient", "patient")}
        return Gold(answer={"guarantor": sorted(n for n in names if n)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_guarantor(tools, params)


@register("billing.no_guarantor", difficulty=2, touches=("Patient", "Account"),
          sequences=(("searchResources", "searchResources"),))
class NoGuarantor(EitherWay):
    """Guarantor of a patient's Account, or report that it has none (relatives on file)

    The account has no guarantor, although the patient has a relative on file who might look like one."""

    answer = AnswerSpec(GUARANTOR_ANSWER.fields, none_allowed=True)
    found = FindGuarantor

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, _account_holders(view))
        if p is None:
            return None
        account = _only_account(view, p)
        relatives = len(related_persons(view).get(p["id"], []))
        if account is None or account.get("guarantor") or (not relatives and rng.random() < 0.5):
            return None  # (mostly) a patient with a relative on file who is not the guarantor
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender"),
                "relatives": relatives}

    def prompt(self, params: dict) -> str:
        return _guarantor_prompt(params)

    def gold_none(self, view: View, params: dict) -> Gold:
        account = _gold_account(view, params)
        assert not [g for g in account.get("guarantor", []) if g.get("party")], params
        return Gold(answer=NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_guarantor(tools, params)
