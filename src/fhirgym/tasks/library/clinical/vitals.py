"""Vital signs: blood pressure, body weight, heart rate and temperature as Observations."""

from __future__ import annotations

import random
from datetime import datetime

from ....spec.codes import (
    LOINC,
    OBSERVATION_CATEGORY,
    UCUM,
)
from ....tools import Toolbox
from ... import Expect, Gold, View, register
from ...checks import (
    Check,
    coded,
    custom,
    eq,
    instant,
    number_near,
    ref,
    unit_is,
)
from ...draw import pick
from ...solve import create
from ._common import _adults, _cap, _Clinical, _iso, _locate, _patient_params, _who


def _vital_checks(pid: str, code: str, now: datetime) -> tuple[Check, ...]:
    return (ref("subject", f"Patient/{pid}"), eq("status", "final"),
            coded("category", OBSERVATION_CATEGORY, "vital-signs"), coded("code", LOINC, code),
            instant("effectiveDateTime", _iso(now), tolerance_s=300))


def _new_vital(pid: str, code: str, display: str, now: datetime) -> dict:
    return {"resourceType": "Observation", "status": "final",
            "category": [{"coding": [{"system": OBSERVATION_CATEGORY, "code": "vital-signs",
                                      "display": "Vital Signs"}]}],
            "code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
            "subject": {"reference": f"Patient/{pid}"}, "effectiveDateTime": _iso(now)}


class _RecordVital(_Clinical):
    writes = True
    resource_types = ("Patient", "Observation")
    sequences = (("searchResources", "createResource"),)
    CODE: str
    DISPLAY: str

    def measure(self, rng: random.Random) -> dict:
        raise NotImplementedError

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        raise NotImplementedError

    def value_body(self, params: dict) -> dict:
        raise NotImplementedError

    def sample(self, view: View, rng: random.Random) -> dict | None:
        return {**_patient_params(pick(rng, _adults(view)), rng), **self.measure(rng)}

    def gold(self, view: View, params: dict) -> Gold:
        checks = _vital_checks(params["pid"], self.CODE, view.now) + self.value_checks(params)
        return Gold(expects=[Expect("create", "Observation", checks=checks)])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        create(tools, {**_new_vital(pid, self.CODE, self.DISPLAY, now), **self.value_body(params)})
        return "Charted the measurement."


@register("clinical.record_blood_pressure", difficulty=2)
class RecordBloodPressure(_RecordVital):
    """Chart a blood pressure reading (LOINC panel with systolic and diastolic components)

    A panel with two coded components, each with its own value and unit."""

    CODE, DISPLAY = "85354-9", "Blood pressure panel with all children optional"

    def measure(self, rng: random.Random) -> dict:
        systolic = rng.randint(96, 176)
        return {"systolic": systolic, "diastolic": rng.randint(54, min(108, systolic - 25))}

    def prompt(self, params: dict) -> str:
        reading = f"{params['systolic']}/{params['diastolic']}"
        return (f"Record a blood pressure of {reading} mmHg for {_who(params)}, taken just now. Chart it as "
                "a vital-signs Observation with status final, LOINC 85354-9 (blood pressure panel), a "
                "systolic component (LOINC 8480-6) and a diastolic component (LOINC 8462-4), both in mm[Hg] "
                "(UCUM), effective now.")

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        want = (("8480-6", params["systolic"]), ("8462-4", params["diastolic"]))

        def fn(after: dict, before: dict | None) -> str | None:
            missing = []
            for code, value in want:
                ok = any(any(c.get("code") == code and c.get("system") == LOINC
                             for c in comp.get("code", {}).get("coding", []))
                         and (comp.get("valueQuantity") or {}).get("value") == value
                         and (comp.get("valueQuantity") or {}).get("code") == "mm[Hg]"
                         for comp in after.get("component", []) if isinstance(comp, dict))
                if not ok:
                    missing.append(f"{code}={value} mm[Hg]")
            return f"component lacks {missing}" if missing else None
        return (custom("component", f"components 8480-6={want[0][1]}, 8462-4={want[1][1]} mm[Hg]", fn),)

    def value_body(self, params: dict) -> dict:
        def comp(code: str, display: str, value: int) -> dict:
            return {"code": {"coding": [{"system": LOINC, "code": code, "display": display}]},
                    "valueQuantity": {"value": value, "unit": "mm[Hg]", "system": UCUM, "code": "mm[Hg]"}}
        return {"component": [comp("8480-6", "Systolic blood pressure", params["systolic"]),
                               comp("8462-4", "Diastolic blood pressure", params["diastolic"])]}


class _SimpleVital(_RecordVital):
    UNIT: str

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        return (eq("valueQuantity.value", params["value"]), unit_is("valueQuantity", self.UNIT))

    def value_body(self, params: dict) -> dict:
        return {"valueQuantity": {"value": params["value"], "unit": self.UNIT, "system": UCUM,
                                  "code": self.UNIT}}


@register("clinical.record_body_weight", difficulty=2)
class RecordBodyWeight(_SimpleVital):
    """Chart a body weight in kg"""

    CODE, DISPLAY, UNIT = "29463-7", "Body weight", "kg"

    def measure(self, rng: random.Random) -> dict:
        return {"value": round(rng.uniform(48, 125), 1)}

    def prompt(self, params: dict) -> str:
        return (f"{_cap(_who(params))} was just weighed at {params['value']} kg. Chart it as a vital-signs "
                "Observation with status final, LOINC 29463-7 (body weight), the value in kg (UCUM kg), "
                "effective now.")


@register("clinical.record_heart_rate", difficulty=2)
class RecordHeartRate(_SimpleVital):
    """Chart a heart rate in beats per minute"""

    CODE, DISPLAY, UNIT = "8867-4", "Heart rate", "/min"

    def measure(self, rng: random.Random) -> dict:
        return {"value": rng.randint(46, 132)}

    def prompt(self, params: dict) -> str:
        return (f"The heart rate of {_who(params)} is {params['value']} beats per minute, measured just now. "
                "Chart it as a vital-signs Observation with status final, LOINC 8867-4 (heart rate), the "
                "value in /min (UCUM), effective now.")


@register("clinical.record_temperature", difficulty=2)
class RecordTemperature(_RecordVital):
    """Chart a body temperature given in °F as °C

    The reading is given in °F and must be charted in °C (converted and rounded)."""

    CODE, DISPLAY = "8310-5", "Body temperature"

    def measure(self, rng: random.Random) -> dict:
        return {"fahrenheit": round(rng.uniform(96.8, 104.0), 1)}

    def prompt(self, params: dict) -> str:
        return (f"{_cap(_who(params))} has a temperature of {params['fahrenheit']} °F, measured just now. "
                "Chart it as a vital-signs Observation with status final, LOINC 8310-5 (body temperature), "
                "effective now, with the value converted to degrees Celsius (UCUM Cel) and rounded to one "
                "decimal.")

    @staticmethod
    def celsius(params: dict) -> float:
        return (params["fahrenheit"] - 32) * 5 / 9

    def value_checks(self, params: dict) -> tuple[Check, ...]:
        return (number_near("valueQuantity.value", self.celsius(params), 0.06),
                unit_is("valueQuantity", "Cel"))

    def value_body(self, params: dict) -> dict:
        return {"valueQuantity": {"value": round(self.celsius(params), 1), "unit": "Cel", "system": UCUM,
                                  "code": "Cel"}}
