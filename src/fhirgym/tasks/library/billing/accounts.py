"""Billing accounts: open one, or find the patient's existing one."""

from __future__ import annotations

import random
from datetime import datetime

from ....spec.codes import ACT_CODE
from ....tools import Toolbox
from ... import AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ...checks import coded, eq, on_day, ref, refs_exactly
from ...draw import deal, pick, pronoun, who
from ...facts import (
    accounts,
    coverages,
    full_name,
    unique_patient,
)
from ...solve import call, find_patient
from ._common import _account_holders, _active, _find_account, _gold_account, candidates


def _account_name(params: dict) -> str:
    return f"{params['name']} - patient billing account"


def _account_request(params: dict) -> str:
    return (f"Please open a billing account for {who(params['name'], params['birth_date'])}: name it \"{_account_name(params)}\", "
            "status active, type patient billing account (v3-ActCode PBILLACCT), service period starting today")


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
