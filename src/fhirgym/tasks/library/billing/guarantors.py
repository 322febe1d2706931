"""Guarantors: set the party responsible for an account, find it, or report none."""

from __future__ import annotations

import random
from datetime import date, datetime

from ....spec.codes import ROLE_CODE
from ....tools import Toolbox
from ... import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ...checks import ref, ref_key
from ...draw import EitherWay, deal, pick, who
from ...facts import (
    all_patients,
    full_name,
    living_patients,
    official_name,
    related_by_id,
    related_persons,
)
from ...solve import call, find_patient
from ._common import RELATION, _account_holders, _find_account, _gold_account, _only_account


def _rp_name(rp: dict) -> str:
    return full_name(rp)


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
