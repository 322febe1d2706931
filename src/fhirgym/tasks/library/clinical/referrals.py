"""Referrals: a ServiceRequest to a specialty."""

from __future__ import annotations

import random
from datetime import datetime

from ....spec.codes import (
    SNOMED,
)
from ....tools import Toolbox
from ... import Expect, Gold, View, register
from ...checks import (
    coded,
    eq,
    note_has,
    ref,
)
from ...draw import pick
from ...solve import create
from ._common import _adults, _Clinical, _locate, _patient_params, _service_request, _who

#: (service, SNOMED CT code, display, notes a referring clinician writes)
REFERRALS = [
    ("orthopedic surgery", "183545006", "Referral to orthopedic service (procedure)", (
        "Left knee pain and instability after a fall; MRI shows a complete ACL tear. Please evaluate "
        "for repair.",
        "Right hip osteoarthritis with pain at rest despite physiotherapy; please assess for joint "
        "replacement.")),
    ("cardiology", "183519002", "Referral to cardiology service (procedure)", (
        "Exertional chest tightness for three weeks with a normal resting ECG; please assess for stable "
        "angina.",
        "New atrial fibrillation, rate controlled; please advise on anticoagulation and rhythm strategy.")),
    ("physiotherapy", "306170007", "Referral to physiotherapy service (procedure)", (
        "Chronic low back pain without red flags; please start a graded exercise program.",)),
    ("gastroenterology", "183523005", "Referral to gastroenterology service (procedure)", (
        "Iron deficiency anemia with a positive fecal immunochemical test; please arrange a colonoscopy.",)),
    ("psychiatry", "183524004", "Referral to psychiatry service (procedure)", (
        "Moderate depression not improving after two SSRIs; please review the medication plan.",)),
    ("a dietitian", "103699006", "Referral to dietitian (procedure)", (
        "Newly diagnosed type 2 diabetes with a BMI of 34; please provide dietary counselling.",)),
]


@register("clinical.referral", difficulty=2, writes=True, touches=("Patient", "ServiceRequest"),
          sequences=(("searchResources", "createResource"),))
class Referral(_Clinical):
    """Refer a patient to a specialty (ServiceRequest with SNOMED code, priority and note)

    A referral order whose note must carry the clinician's free text."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        n = rng.randrange(len(REFERRALS))
        notes = REFERRALS[n][3]
        return {**_patient_params(pick(rng, _adults(view)), rng), "service": n,
                "note": notes[rng.randrange(len(notes))], "priority": rng.choice(("routine", "urgent"))}

    def prompt(self, params: dict) -> str:
        service, code, display, _ = REFERRALS[params["service"]]
        return (f"Please refer {_who(params)} to {service}. Place it as a ServiceRequest coded SNOMED CT "
                f"{code} ({display}) with status active, intent order and priority {params['priority']}, and "
                f"put this text in its note: \"{params['note']}\"")

    def gold(self, view: View, params: dict) -> Gold:
        _, code, _, _ = REFERRALS[params["service"]]
        return Gold(expects=[Expect("create", "ServiceRequest", checks=(
            ref("subject", f"Patient/{params['pid']}"), coded("code", SNOMED, code), eq("status", "active"),
            eq("intent", "order"), eq("priority", params["priority"]),
            note_has("note.text", params["note"])))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        _, code, display, _ = REFERRALS[params["service"]]
        create(tools, _service_request(pid, SNOMED, code, display, now, priority=params["priority"],
                                        note=[{"text": params["note"]}]))
        return "Placed the referral."
