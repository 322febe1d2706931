"""Diagnoses: record one, read when it began, or report that the patient has none."""

from __future__ import annotations

import random
from datetime import datetime

from ....spec.codes import (
    CONDITION_CLINICAL,
    CONDITION_VERIFICATION,
    SNOMED,
)
from ....tools import Toolbox
from ... import NOT_FOUND, AnswerSpec, Expect, Family, Field, Gold, View, answer_text, register
from ...checks import coded, on_day, ref
from ...draw import (
    EitherWay,
    pick,
    pronoun,
    who,
)
from ...facts import (
    full_name,
    living_patients,
    same_name,
    unique_patient,
)
from ...solve import call, create, find_patient, find_patients
from ._common import _person_params, _plain, _status

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
