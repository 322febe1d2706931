"""Patients: find one by name and birth date, register a new one, or report that none matches."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta

from ....tools import Toolbox
from ... import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ...checks import eq, one_of, phone_check
from ...draw import (
    STREETS,
    TOWNS,
    EitherWay,
    human_date,
    new_name,
    new_phone,
    pick,
    random_birth,
)
from ...facts import (
    all_patients,
    full_name,
    living_patients,
    name_pairs,
    official_name,
    taken_names,
)
from ...solve import create, find_patient, find_patients


@register("records.find_patient", difficulty=1, touches=("Patient",), sequences=(("searchResources",),))
class FindPatient(Family):
    """Find an existing patient by name and date of birth"""

    answer = AnswerSpec((Field("patient_id", "id", "the Patient resource id"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, living_patients(view))
        return {"name": full_name(p), "birth_date": p["birthDate"]}

    def prompt(self, params: dict) -> str:
        return (f"Is {params['name']}, born {human_date(params['birth_date'])}, registered as a patient here? "
                "If so, give me the patient's record id.")

    def gold(self, view: View, params: dict) -> Gold:
        family = params["name"].split()[-1]
        found = [p for p in view.search("Patient", {"family": family, "birthdate": params["birth_date"]})
                 if full_name(p) == params["name"]]
        assert len(found) == 1, f"{params} matches {len(found)} patients"
        return Gold(answer={"patient_id": found[0]["id"]})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        found = find_patients(tools, params["name"], params["birth_date"])
        return answer_text({"patient_id": found[0]["id"]}) if found else answer_text(NOT_FOUND)


@register("records.create_patient", difficulty=1, writes=True, touches=("Patient",),
          sequences=(("createResource",),))
class CreatePatient(Family):
    """Register a new patient with name, gender, birth date, phone and address

    Every demographic element the clerk states must land in the right Patient element."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        gender = rng.choice(("female", "male"))
        relative = pick(rng, all_patients(view)) if rng.random() < 0.3 else None  # a newcomer of a known family
        family = official_name(relative).get("family") if relative else None
        name = new_name(view, rng, gender, family)
        if name is None:
            return None
        birth = random_birth(rng, date(1938, 1, 1), view.anchor - timedelta(days=200))
        town, postal = rng.choice(TOWNS)
        return {"given": name[0], "family": name[1], "gender": gender, "birth_date": birth.isoformat(),
                "phone": new_phone(rng), "line": f"{rng.randint(2, 990)} {rng.choice(STREETS)}", "city": town,
                "postal": postal}

    def prompt(self, params: dict) -> str:
        return (f"Please register a new patient: {params['given']} {params['family']}, {params['gender']}, born "
                f"{human_date(params['birth_date'])}. Phone number {params['phone']}; home address "
                f"{params['line']}, {params['city']}, MA {params['postal']}.")

    def gold(self, view: View, params: dict) -> Gold:
        assert (params["given"].casefold(), params["family"].casefold()) not in taken_names(view)
        return Gold(expects=[Expect("create", "Patient", checks=(
            eq("name.family", params["family"]),
            eq("name.given", params["given"]),
            eq("gender", params["gender"]),
            eq("birthDate", params["birth_date"]),
            phone_check(params["phone"]),
            eq("address.line", params["line"]),
            eq("address.city", params["city"]),
            eq("address.postalCode", params["postal"]),
            one_of("address.state", ("MA", "Massachusetts")),
        ))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        name = f"{params['given']} {params['family']}"
        if find_patient(tools, name, params["birth_date"]):
            return "This patient is already registered."
        create(tools, {
            "resourceType": "Patient", "active": True,
            "name": [{"use": "official", "family": params["family"], "given": [params["given"]]}],
            "telecom": [{"system": "phone", "value": params["phone"], "use": "home"}],
            "gender": params["gender"], "birthDate": params["birth_date"],
            "address": [{"use": "home", "line": [params["line"]], "city": params["city"], "state": "MA",
                         "postalCode": params["postal"], "country": "US"}],
        })
        return f"Registered {name}."


@register("records.patient_not_found", difficulty=2, touches=("Patient",), sequences=(("searchResources",),))
class PatientNotFound(EitherWay):
    """Find a patient by name and birth date, or report that nobody has both (namesakes, shared birth dates)

    Near-misses: a registered patient's name with another birth date, or a registered birth date
    under another name; only name and birth date together identify a patient."""

    answer = AnswerSpec(FindPatient.answer.fields, none_allowed=True)
    found = FindPatient

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        pats = all_patients(view)
        kind = rng.choice(("namesake", "same_birth_date", "stranger"))
        p = pick(rng, pats)
        if kind == "namesake":  # the person's name, a birth date years away from every bearer's
            name = full_name(p)
            pairs = name_pairs(p)
            births = [date.fromisoformat(q["birthDate"]) for q in pats if q.get("birthDate") and pairs & name_pairs(q)]
            birth = random_birth(rng, date(1935, 1, 1), view.anchor - timedelta(days=400))
            if any(abs((birth - b).days) < 3 * 365 for b in births):
                return None
        else:
            drawn = new_name(view, rng, p.get("gender") or rng.choice(("female", "male")))
            if drawn is None:
                return None
            name = " ".join(drawn)
            birth = (date.fromisoformat(p["birthDate"]) if kind == "same_birth_date" and p.get("birthDate")
                     else random_birth(rng, date(1935, 1, 1), view.anchor - timedelta(days=400)))
        return {"name": name, "birth_date": birth.isoformat(), "kind": kind}

    def prompt(self, params: dict) -> str:
        return FindPatient.prompt(self, params)  # the same request as when the patient exists

    def gold_none(self, view: View, params: dict) -> Gold:
        given, family = params["name"].split()[0], params["name"].split()[-1]
        same = [p for p in all_patients(view) if p.get("birthDate") == params["birth_date"]
                and ((given.casefold(), family.casefold()) in name_pairs(p) or full_name(p) == params["name"])]
        assert not same, f"{params} matches {[p['id'] for p in same]}"
        return Gold(answer=NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return FindPatient.solve(self, tools, params, now)
