"""Family history: record a relative's condition and age at onset."""

from __future__ import annotations

import random
from datetime import datetime

from ....spec.codes import (
    ADMINISTRATIVE_GENDER,
    ROLE_CODE,
    SNOMED,
    UCUM,
)
from ....tools import Toolbox
from ... import Expect, Family, Gold, View, register
from ...checks import Check, coded, custom, eq, ref
from ...draw import (
    pick,
    pronoun,
    who,
)
from ...facts import (
    living_patients,
    unique_patient,
)
from ...solve import create, find_patient
from ._common import _person_params, _plain, _status

RELATIVES = (("FTH", "father", "male"), ("MTH", "mother", "female"), ("BRO", "brother", "male"),
             ("SIS", "sister", "female"))


#: (SNOMED code, display, what the relative had as a clinician says it, sex it is limited to)
FAMILY_CONDITIONS = (
    ("22298006", "Myocardial infarction (disorder)", "had a heart attack", None),
    ("44054006", "Diabetes mellitus type 2 (disorder)", "was diagnosed with type 2 diabetes", None),
    ("254837009", "Malignant neoplasm of breast (disorder)", "was diagnosed with breast cancer", "female"),
    ("363406005", "Malignant neoplasm of colon (disorder)", "was diagnosed with colon cancer", None),
    ("399068003", "Malignant tumor of prostate (disorder)", "was diagnosed with prostate cancer", "male"),
    ("230690007", "Cerebrovascular accident (disorder)", "had a stroke", None),
    ("26929004", "Alzheimer's disease (disorder)", "was diagnosed with Alzheimer's disease", None),
)


def _family_history(view: View) -> set[tuple[str, str, str]]:
    """(patient id, relationship code, SNOMED code) already on file (cached)."""
    def compute() -> set[tuple[str, str, str]]:
        out = set()
        for f in view.search("FamilyMemberHistory", {"_count": "1000"}):
            pid = str(f.get("patient", {}).get("reference", "")).rsplit("/", 1)[-1]
            rel = _status(f, "relationship") or ""
            for cond in f.get("condition", []):
                for x in cond.get("code", {}).get("coding", []):
                    out.add((pid, rel, str(x.get("code"))))
        return out
    return view.cached("records.family_history", compute)


def _onset_age(age: int) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        for cond in after.get("condition") or []:
            if not isinstance(cond, dict):
                continue
            onset = cond.get("onsetAge") or {}
            if onset.get("value") == age and str(onset.get("code") or onset.get("unit") or "a").lower() in (
                    "a", "yr", "y", "year", "years", "yrs"):
                return None
            if str(cond.get("onsetString", "")).strip().split(" ")[0] == str(age):
                return None
        return f"no condition has onset at age {age}"
    return custom("condition", f"condition onset at age {age}", fn)


@register("records.record_family_history", difficulty=2, writes=True,
          touches=("Patient", "FamilyMemberHistory"), sequences=(("searchResources", "createResource"),))
class RecordFamilyHistory(Family):
    """Record a relative's diagnosis as a FamilyMemberHistory"""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, living_patients(view))
        rel_code, relation, sex = rng.choice(RELATIVES)
        code, display, said, only = rng.choice(FAMILY_CONDITIONS)
        if only not in (None, sex) or (p["id"], rel_code, code) in _family_history(view):
            return None
        age = rng.randint(38, 82) if rel_code in ("FTH", "MTH") else rng.randint(30, 65)
        return {**_person_params(p), "relationship": rel_code, "relation": relation, "sex": sex, "code": code,
                "display": display, "said": said, "age": age}

    def prompt(self, params: dict) -> str:
        return (f"Please add to the family history of {who(params['name'], params['birth_date'])}: "
                f"{pronoun(params['gender'])} {params['relation']} {params['said']} at age {params['age']} "
                f"(SNOMED CT {params['code']}, {_plain(params['display'])}). Record it as a completed family member "
                f"history, relationship {params['relation']} (HL7 v3 RoleCode {params['relationship']}).")

    def gold(self, view: View, params: dict) -> Gold:
        patient = unique_patient(view, params["name"], params["birth_date"])
        return Gold(expects=[Expect("create", "FamilyMemberHistory", checks=(
            ref("patient", f"Patient/{patient['id']}"),
            eq("status", "completed"),
            coded("relationship", ROLE_CODE, params["relationship"]),
            coded("condition.code", SNOMED, params["code"]),
            _onset_age(params["age"]),
        ))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = find_patient(tools, params["name"], params["birth_date"])
        if patient is None:
            return "I could not find the patient."
        create(tools, {
            "resourceType": "FamilyMemberHistory", "status": "completed",
            "patient": {"reference": f"Patient/{patient['id']}"}, "date": now.date().isoformat(),
            "relationship": {"coding": [{"system": ROLE_CODE, "code": params["relationship"],
                                         "display": params["relation"]}]},
            "sex": {"coding": [{"system": ADMINISTRATIVE_GENDER, "code": params["sex"]}]},
            "condition": [{"code": {"coding": [{"system": SNOMED, "code": params["code"],
                                                "display": params["display"]}]},
                           "onsetAge": {"value": params["age"], "unit": "a", "system": UCUM,
                                        "code": "a"}}],
        })
        return "Recorded the family history."
