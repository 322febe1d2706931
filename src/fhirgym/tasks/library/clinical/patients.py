"""Patients by MRN: their record id, their MRN, their age today."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime

from ....spec.codes import (
    MRN,
)
from ....tools import Toolbox
from ... import NOT_FOUND, AnswerSpec, Field, Gold, View, answer_text, register
from ...draw import negative_seed, pick
from ...facts import patients
from ...solve import call, search_all
from ._common import _age, _Clinical, _locate, _patient_params, _people, _who


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
