"""Patient records (FHIR-AgentEval, 7 tasks): register, find, report absence, conditions, family history."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta

from ...spec.codes import (
    ADMINISTRATIVE_GENDER,
    CONDITION_CLINICAL,
    CONDITION_VERIFICATION,
    ROLE_CODE,
    SNOMED,
    UCUM,
)
from ...tools import Toolbox
from .. import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ..checks import Check, coded, custom, eq, on_day, one_of, phone_check, ref
from ..draw import (
    STREETS,
    TOWNS,
    EitherWay,
    human_date,
    new_name,
    new_phone,
    pick,
    pronoun,
    random_birth,
    who,
)
from ..facts import (
    all_patients,
    full_name,
    living_patients,
    name_pairs,
    official_name,
    same_name,
    taken_names,
    unique_patient,
)
from ..solve import call, create, find_patient, find_patients


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


HYPERTENSION = ("59621000", "Essential hypertension (disorder)")


@register("records.record_condition", difficulty=2, writes=True, touches=("Patient", "Condition"),
          sequences=(("searchResources", "createResource"),))
class RecordCondition(Family):
    """Record a diagnosis (SNOMED) as a Condition"""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, living_patients(view))
        return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"],
                "code": HYPERTENSION[0], "display": HYPERTENSION[1]}

    def prompt(self, params: dict) -> str:
        return (f"Please record that {who(params['name'], params['birth_date'])} was diagnosed today "
                f"with essential hypertension (SNOMED CT {params['code']}). Record it as an active, confirmed "
                "condition with today's date as the onset.")

    def gold(self, view: View, params: dict) -> Gold:
        today = view.now.date().isoformat()
        return Gold(expects=[Expect("create", "Condition", checks=(
            ref("subject", f"Patient/{params['patient_id']}"),
            coded("code", SNOMED, params["code"]),
            coded("clinicalStatus", CONDITION_CLINICAL, "active"),
            coded("verificationStatus", CONDITION_VERIFICATION, "confirmed"),
            on_day("onsetDateTime", today),
        ))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = find_patients(tools, params["name"], params["birth_date"])[0]
        create(tools, {
            "resourceType": "Condition",
            "clinicalStatus": {"coding": [{"system": CONDITION_CLINICAL, "code": "active"}]},
            "verificationStatus": {"coding": [{"system": CONDITION_VERIFICATION, "code": "confirmed"}]},
            "code": {"coding": [{"system": SNOMED, "code": params["code"], "display": params["display"]}]},
            "subject": {"reference": f"Patient/{patient['id']}"},
            "onsetDateTime": now.date().isoformat(),
        })
        return "Recorded the diagnosis."


# -- shared facts and helpers of the records (and billing) families -----------------------------------















def _person_params(p: dict) -> dict:
    return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender")}


# -- registering patients -------------------------------------------------------------------------------

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


# -- conditions -------------------------------------------------------------------------------------------

def condition_index(view: View) -> dict[str, list[tuple[str, str, str | None, str | None, str | None]]]:
    """Patient id -> its Conditions as (SNOMED code, display, clinical status, verification status, onset)."""
    def compute() -> dict[str, list[tuple[str, str, str | None, str | None, str | None]]]:
        out: dict[str, list] = {}
        for c in view.search("Condition", {"_count": "1000", "_elements":
                                           "code,subject,clinicalStatus,verificationStatus,onsetDateTime"}):
            coding = next((x for x in c.get("code", {}).get("coding", []) if x.get("system") == SNOMED), None)
            pid = str(c.get("subject", {}).get("reference", "")).rsplit("/", 1)[-1]
            if coding is None or not pid:
                continue
            out.setdefault(pid, []).append((coding.get("code"), coding.get("display", ""), _status(c, "clinicalStatus"),
                                            _status(c, "verificationStatus"), c.get("onsetDateTime")))
        return out
    return view.cached("records.conditions", compute)


def _status(resource: dict, element: str) -> str | None:
    return next((x.get("code") for x in (resource.get(element) or {}).get("coding", [])), None)


def _plain(display: str) -> str:
    """'Essential hypertension (disorder)' -> 'essential hypertension' (proper nouns keep their capital)."""
    text = display.rsplit(" (", 1)[0] if display.endswith(")") else display
    first = text.split(" ", 1)[0]
    return text if "'" in first or first[1:2].isupper() else text[:1].lower() + text[1:]


CONDITION_ANSWER = AnswerSpec((Field("onset_date", "date", "the onset date recorded for that diagnosis"),))


def _condition_prompt(params: dict) -> str:
    return (f"When was {who(params['name'], params['birth_date'])} diagnosed with "
            f"{params['condition']} (SNOMED CT {params['code']})? I need the onset date on "
            f"{pronoun(params.get('gender'))} record.")


def _solve_condition(tools: Toolbox, params: dict) -> str:
    patient = find_patient(tools, params["name"], params["birth_date"])
    if patient is None:
        return answer_text(NOT_FOUND)
    out = call(tools, "searchResources", {"resourceType": "Condition", "params": {
        "patient": f"Patient/{patient['id']}", "code": f"{SNOMED}|{params['code']}",
        "_elements": "code,onsetDateTime,clinicalStatus,verificationStatus", "_sort": "onset-date"}})
    onsets = sorted(c["onsetDateTime"][:10] for c in out.get("resources", [])
                    if _status(c, "verificationStatus") != "entered-in-error" and c.get("onsetDateTime"))
    return answer_text({"onset_date": onsets[0]}) if onsets else answer_text(NOT_FOUND)


def _real(conds: list[tuple]) -> list[tuple]:
    return [c for c in conds if c[3] != "entered-in-error"]


@register("records.condition_onset", difficulty=2, touches=("Patient", "Condition"),
          sequences=(("searchResources", "searchResources"),))
class PatientCondition(Family):
    """When was the patient diagnosed with a given condition (onset date of an active diagnosis)

    One active diagnosis among a long chart; namesakes and entered-in-error records stand beside it."""

    answer = CONDITION_ANSWER

    def sample(self, view: View, rng: random.Random) -> dict | None:
        p = pick(rng, living_patients(view))
        real = _real(condition_index(view).get(p["id"], []))
        by_code: dict[str, list[tuple]] = {}
        for c in real:
            by_code.setdefault(c[0], []).append(c)
        fits = sorted(code for code, cs in by_code.items() if len(cs) == 1 and cs[0][1].endswith("(disorder)")
                      and cs[0][2] == "active" and cs[0][4])
        if not fits:
            return None
        code = pick(rng, fits)
        return {**_person_params(p), "code": code, "condition": _plain(by_code[code][0][1])}

    def prompt(self, params: dict) -> str:
        return _condition_prompt(params)

    def gold(self, view: View, params: dict) -> Gold:
        patient = unique_patient(view, params["name"], params["birth_date"])
        found = [c for c in _real(condition_index(view).get(patient["id"], [])) if c[0] == params["code"]]
        assert len(found) == 1 and found[0][4], f"{params}: {len(found)} records"
        return Gold(answer={"onset_date": found[0][4][:10]})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_condition(tools, params)


#: Chronic diagnoses to ask about when the chart has none: (SNOMED code, display, words of related
#: diagnoses that must be absent from the chart for "no such diagnosis" to be the only defensible answer).
CHRONIC = (
    ("59621000", "Essential hypertension (disorder)", ("hypertens", "blood pressure")),
    ("44054006", "Diabetes mellitus type 2 (disorder)", ("diabet", "glucose", "insulin")),
    ("195967001", "Asthma (disorder)", ("asthma",)),
    ("55822004", "Hyperlipidemia (disorder)", ("lipid", "cholesterol", "triglycerid")),
    ("64859006", "Osteoporosis (disorder)", ("osteopor", "osteopenia")),
    ("370143000", "Major depressive disorder (disorder)", ("depress",)),
    ("235595009", "Gastroesophageal reflux disease (disorder)", ("reflux",)),
    ("84757009", "Epilepsy (disorder)", ("epilep", "seizure")),
    ("37796009", "Migraine (disorder)", ("migraine",)),
    ("414545008", "Ischemic heart disease (disorder)", ("ischemic heart", "myocardial", "coronary", "angina")),
    ("49436004", "Atrial fibrillation (disorder)", ("atrial fib",)),
    ("69896004", "Rheumatoid arthritis (disorder)", ("rheumatoid",)),
    ("21897009", "Generalized anxiety disorder (disorder)", ("anxiety",)),
    ("13645005", "Chronic obstructive lung disease (disorder)", ("obstructive", "emphysema", "copd")),
)


@register("records.condition_not_recorded", difficulty=2, touches=("Patient", "Condition"),
          sequences=(("searchResources", "searchResources"),))
class NoCondition(EitherWay):
    """Onset of a diagnosis, or report that the patient has no record of it (voided entries, namesakes)

    Nothing to find: the asked diagnosis is absent — at most charted by mistake (entered-in-error) or
    on a namesake's record — and no related diagnosis is on file either."""

    answer = AnswerSpec(CONDITION_ANSWER.fields, none_allowed=True)
    found = PatientCondition

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        trapped = view.cached("records.condition_traps", lambda: [
            p for p in living_patients(view) if any(t for _, t in self._absent(view, p))])
        p = pick(rng, trapped) if trapped and rng.random() < 0.5 else pick(rng, living_patients(view))
        absent = self._absent(view, p)
        if not absent:
            return None
        traps = [a for a in absent if a[1]]
        chosen, trap = pick(rng, traps) if traps and rng.random() < 0.8 else pick(rng, absent)
        return {**_person_params(p), "code": chosen[0], "condition": _plain(chosen[1]), "trap": trap}

    @staticmethod
    def _absent(view: View, p: dict) -> list[tuple[tuple, str]]:
        """The CHRONIC diagnoses absent from ``p``'s chart, each with its trap: charted on ``p`` by mistake
        (entered-in-error), on a same-name patient's record, or none."""
        index = condition_index(view)
        chart = " ".join(c[1].lower() for c in _real(index.get(p["id"], [])))
        voided = {c[0] for c in index.get(p["id"], []) if c[3] == "entered-in-error"}
        namesakes = {c[0] for q in same_name(view, full_name(p)) if q["id"] != p["id"]
                     for c in _real(index.get(q["id"], []))}
        return [(c, "entered-in-error" if c[0] in voided else "namesake" if c[0] in namesakes else "")
                for c in CHRONIC if not any(w in chart for w in c[2])]

    def prompt(self, params: dict) -> str:
        return _condition_prompt(params)

    def gold_none(self, view: View, params: dict) -> Gold:
        patient = unique_patient(view, params["name"], params["birth_date"])
        words = next(c[2] for c in CHRONIC if c[0] == params["code"])
        for code, display, *_ in _real(condition_index(view).get(patient["id"], [])):
            assert code != params["code"], f"{params}: on record"
            assert not any(w in display.lower() for w in words), f"{params}: related diagnosis {display}"
        return Gold(answer=NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        return _solve_condition(tools, params)


# -- family history -----------------------------------------------------------------------------------------

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
