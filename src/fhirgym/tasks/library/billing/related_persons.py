"""Related persons: record a relative as a RelatedPerson of the patient."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta

from ....spec.codes import ROLE_CODE
from ....tools import Toolbox
from ... import Expect, Family, Gold, View, register
from ...checks import phone_check
from ...draw import human_date, new_name, new_phone, pick, pronoun, random_birth, who
from ...facts import (
    full_name,
    living_patients,
    official_name,
    related_persons,
    unique_patient,
)
from ...solve import create, find_patient
from ._common import RELATION, _age, _code, _related_person


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
        return Gold(expects=[Expect("create", "RelatedPerson",
                                    checks=(*_related_person(patient, params), phone_check(params["phone"])))])

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
