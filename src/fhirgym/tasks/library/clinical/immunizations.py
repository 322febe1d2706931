"""Immunizations: record one given today."""

from __future__ import annotations

import random
from datetime import datetime

from ....spec.codes import (
    ACT_SITE,
    CVX,
)
from ....tools import Toolbox
from ... import Expect, Gold, View, register
from ...checks import (
    coded,
    eq,
    on_day,
    ref,
)
from ...draw import pick
from ...solve import create
from ._common import _adults, _cap, _Clinical, _iso, _locate, _patient_params, _who

#: (CVX code, display, how a nurse names it)
VACCINES = [
    ("140", "Influenza, seasonal, injectable, preservative free", "the seasonal flu shot"),
    ("115", "Tdap", "a Tdap booster"),
    ("43", "Hep B, adult", "an adult hepatitis B vaccine dose"),
    ("33", "pneumococcal polysaccharide vaccine, 23 valent",
     "the pneumococcal polysaccharide vaccine (PPSV23)"),
    ("187", "zoster vaccine recombinant", "the recombinant zoster vaccine"),
    ("208", "COVID-19, mRNA, LNP-S, PF, 30 mcg/0.3 mL dose", "a COVID-19 mRNA vaccine dose"),
]


@register("clinical.record_immunization", difficulty=2, writes=True, touches=("Patient", "Immunization"),
          sequences=(("searchResources", "createResource"),))
class RecordImmunization(_Clinical):
    """Record a vaccine given today (CVX, lot number, site)"""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        lot = "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ") for _ in range(2)) + str(rng.randint(1000, 99999))
        return {**_patient_params(pick(rng, _adults(view)), rng), "vaccine": rng.randrange(len(VACCINES)),
                "lot": lot, "site": rng.choice(("LA", "RA"))}

    def prompt(self, params: dict) -> str:
        code, _, spoken = VACCINES[params["vaccine"]]
        arm = "left" if params["site"] == "LA" else "right"
        return (f"{_cap(_who(params))} was given {spoken} (CVX {code}) here today, lot number "
                f"{params['lot']}, in the {arm} arm. Please record the immunization with status completed, "
                f"today's date, that lot number and the site coded as HL7 ActSite {params['site']}.")

    def gold(self, view: View, params: dict) -> Gold:
        code, _, _ = VACCINES[params["vaccine"]]
        return Gold(expects=[Expect("create", "Immunization", checks=(
            ref("patient", f"Patient/{params['pid']}"), coded("vaccineCode", CVX, code),
            eq("status", "completed"),
            on_day("occurrenceDateTime", view.now.date().isoformat()), eq("lotNumber", params["lot"]),
            coded("site", ACT_SITE, params["site"])))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        code, display, _ = VACCINES[params["vaccine"]]
        create(tools, {"resourceType": "Immunization", "status": "completed",
                        "vaccineCode": {"coding": [{"system": CVX, "code": code, "display": display}]},
                        "patient": {"reference": f"Patient/{pid}"}, "occurrenceDateTime": _iso(now),
                        "primarySource": True, "lotNumber": params["lot"],
                        "site": {"coding": [{"system": ACT_SITE, "code": params["site"]}]}})
        return "Recorded the immunization."
