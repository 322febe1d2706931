"""Allergies: record an AllergyIntolerance."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime

from ....spec.codes import (
    ALLERGY_CLINICAL,
    ALLERGY_VERIFICATION,
    RXNORM,
    SNOMED,
)
from ....tools import Toolbox
from ... import Expect, Gold, View, register
from ...checks import (
    coded,
    eq,
    ref,
    ref_id,
)
from ...draw import pick
from ...solve import create
from ._common import _cap, _Clinical, _iso, _locate, _patient_params, _people, _who


def _allergy_codes(view: View) -> dict[str, set[str]]:
    def compute() -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for a in view.search("AllergyIntolerance", {"_count": "1000", "_elements": "patient,code"}):
            pid = ref_id(a.get("patient"), "Patient") or None
            if pid:
                out[pid] |= {c.get("code") for c in a.get("code", {}).get("coding", [])}
        return dict(out)
    return view.cached("clin_allergies", compute)


#: (system, code, display, category, how the patient names it)
ALLERGENS = [
    (RXNORM, "7984", "Penicillin V", "medication", "penicillin V"),
    (RXNORM, "29046", "Lisinopril", "medication", "lisinopril"),
    (RXNORM, "10831", "Sulfamethoxazole / Trimethoprim", "medication", "sulfamethoxazole/trimethoprim"),
    (RXNORM, "1191", "Aspirin", "medication", "aspirin"),
    (RXNORM, "25037", "cefdinir", "medication", "cefdinir"),
    (SNOMED, "762952008", "Peanut (substance)", "food", "peanuts"),
    (SNOMED, "111088007", "Latex (substance)", "environment", "latex"),
    (SNOMED, "288328004", "Bee venom (substance)", "environment", "bee stings"),
]


#: (SNOMED CT code, display, criticality)
REACTIONS = [("247472004", "Hives", "low"), ("271807003", "Skin rash", "low"),
             ("39579001", "Anaphylaxis", "high"), ("267036007", "Dyspnea", "high")]


@register("clinical.record_allergy", difficulty=2, writes=True, touches=("Patient", "AllergyIntolerance"),
          sequences=(("searchResources", "createResource"),))
class RecordAllergy(_Clinical):
    """Record a new allergy with its reaction

    Several coded elements with their own code systems (clinical, verification status, manifestation)."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _people(view))
        n = rng.randrange(len(ALLERGENS))
        if ALLERGENS[n][1] in _allergy_codes(view).get(person["pid"], set()):
            return None
        return {**_patient_params(person, rng), "allergen": n, "reaction": rng.randrange(len(REACTIONS))}

    def prompt(self, params: dict) -> str:
        system, code, display, category, spoken = ALLERGENS[params["allergen"]]
        rcode, reaction, criticality = REACTIONS[params["reaction"]]
        coding = "RxNorm" if system == RXNORM else "SNOMED CT"
        return (f"{_cap(_who(params))} reacts to {spoken} ({reaction.lower()}). Please record the allergy: "
                f"an AllergyIntolerance coded {coding} {code} ({display}), type allergy, category "
                f"{category}, clinical status active, verification status confirmed, criticality "
                f"{criticality}, with a reaction whose manifestation is {reaction} (SNOMED CT {rcode}).")

    def gold(self, view: View, params: dict) -> Gold:
        system, code, _, category, _ = ALLERGENS[params["allergen"]]
        rcode, _, criticality = REACTIONS[params["reaction"]]
        return Gold(expects=[Expect("create", "AllergyIntolerance", checks=(
            ref("patient", f"Patient/{params['pid']}"), coded("code", system, code),
            coded("clinicalStatus", ALLERGY_CLINICAL, "active"),
            coded("verificationStatus", ALLERGY_VERIFICATION, "confirmed"), eq("type", "allergy"),
            eq("category", category), eq("criticality", criticality),
            coded("reaction.manifestation", SNOMED, rcode)))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        system, code, display, category, _ = ALLERGENS[params["allergen"]]
        rcode, reaction, criticality = REACTIONS[params["reaction"]]
        create(tools, {
            "resourceType": "AllergyIntolerance",
            "clinicalStatus": {"coding": [{"system": ALLERGY_CLINICAL, "code": "active"}]},
            "verificationStatus": {"coding": [{"system": ALLERGY_VERIFICATION, "code": "confirmed"}]},
            "type": "allergy", "category": [category], "criticality": criticality,
            "code": {"coding": [{"system": system, "code": code, "display": display}]},
            "patient": {"reference": f"Patient/{pid}"}, "recordedDate": _iso(now),
            "reaction": [{"manifestation": [{"coding": [{"system": SNOMED, "code": rcode,
                                                         "display": reaction}]}]}]})
        return "Recorded the allergy."
