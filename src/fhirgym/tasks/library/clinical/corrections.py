"""Corrections: mark an Observation entered in error without deleting it."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from ....spec.codes import (
    LOINC,
)
from ....tools import Toolbox
from ... import Expect, Gold, View, register
from ...checks import (
    eq,
    may_set,
)
from ...draw import human_date, pick
from ...facts import moment
from ...solve import call, search_all
from ._common import _adults, _Clinical, _iso, _locate, _observation, _patient_params, _quiet_since, _who

#: (LOINC, display, words, UCUM unit, how the unit is said, plausible range, implausible range, decimals)
VOIDABLE = [
    ("8867-4", "Heart rate", "heart rate", "/min", "/min", (62, 96), (132, 158), 0),
    ("29463-7", "Body weight", "body weight", "kg", "kg", (55, 105), (128, 160), 1),
    ("8310-5", "Body temperature", "body temperature", "Cel", "°C", (36.4, 37.3), (39.6, 40.6), 1),
]


@register("clinical.void_observation", difficulty=2, writes=True, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources", "updateResource"),))
class VoidObservation(_Clinical):
    """Mark a mis-charted vital sign as entered in error

    Another reading of the same vital that day: the one named by time and value must be marked
    entered-in-error by an update (not deleted), everything else on it kept."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        n = rng.randrange(len(VOIDABLE))
        code, _, _, _, _, (lo, hi), (bad_lo, bad_hi), decimals = VOIDABLE[n]
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], (code,), view.now - timedelta(days=2)):
            return None
        minutes = sorted(rng.sample(range(15, 16 * 60, 23), 2), reverse=True)
        wrong = rng.randrange(2)
        readings = []
        for i, m in enumerate(minutes):
            a, b = (bad_lo, bad_hi) if i == wrong else (lo, hi)
            value = round(rng.uniform(a, b), decimals)
            readings.append([_iso(view.now - timedelta(minutes=m)), int(value) if decimals == 0 else value])
        return {**_patient_params(person, rng), "vital": n, "readings": readings, "wrong": wrong}

    def prompt(self, params: dict) -> str:
        _, _, words, _, spoken, *_ = VOIDABLE[params["vital"]]
        at, value = params["readings"][params["wrong"]]
        when = moment(at)
        return (f"The {words} of {value} {spoken} charted for {_who(params)} on {human_date(when.date())} "
                f"at {when.strftime('%H:%M')} UTC was recorded on the wrong patient. Mark that observation "
                "as entered in error (do not delete it, and leave the rest of it unchanged).")

    def setup(self, view: View, params: dict) -> list[dict]:
        code, display, _, unit, *_ = VOIDABLE[params["vital"]]
        return [_observation(view.new_id(f"vital-{i}"), params["pid"], code, display, value, unit, moment(at),
                             category="vital-signs")
                for i, (at, value) in enumerate(params["readings"], 1)]

    def gold(self, view: View, params: dict) -> Gold:
        target = view.new_id(f"vital-{params['wrong'] + 1}")
        assert view.read("Observation", target) is not None
        return Gold(expects=[Expect("update", "Observation", id=target,
                                    checks=(eq("status", "entered-in-error"), may_set("note")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        code = VOIDABLE[params["vital"]][0]
        at, value = params["readings"][params["wrong"]]
        since = _iso(moment(at) - timedelta(minutes=1))
        query = {"patient": pid, "code": f"{LOINC}|{code}", "date": f"ge{since}", "_sort": "date"}
        found = search_all(tools, "Observation", query)
        target = next(o for o in found if moment(o["effectiveDateTime"]) == moment(at)
                      and o["valueQuantity"]["value"] == value)
        body = dict(target)  # meta too: tags, labels and profiles are kept
        body["status"] = "entered-in-error"
        call(tools, "updateResource", {"resourceType": "Observation", "resourceId": target["id"], "body": body})
        return "Marked the observation as entered in error."
