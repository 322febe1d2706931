"""Visits: the last outpatient encounter."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import datetime, timedelta

from ....spec.codes import (
    SNOMED,
)
from ....tools import Toolbox
from ... import AnswerSpec, Field, Gold, View, answer_text, register
from ...checks import (
    ref_id,
)
from ...draw import pick
from ...facts import moment
from ...solve import search_all
from ._common import _Clinical, _locate, _patient_params, _people, _who


def _visits(view: View) -> dict[str, list[tuple]]:
    """Patient id -> sorted [(start, SNOMED type code, type display)] of ambulatory encounters."""
    def compute() -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = defaultdict(list)
        query = {"class": "AMB", "_count": "1000", "_elements": "subject,period,type"}
        for e in view.search("Encounter", query):
            pid, start = ref_id(e.get("subject"), "Patient") or None, (e.get("period") or {}).get("start")
            coding = next((c for t in e.get("type", []) for c in t.get("coding", [])
                           if c.get("system") == SNOMED), None)
            if pid and start and coding:
                out[pid].append((moment(start), coding["code"], coding.get("display", "")))
        for rows in out.values():
            rows.sort()
        return dict(out)
    return view.cached("clin_visits", compute)


@register("clinical.last_outpatient_visit", difficulty=2, touches=("Patient", "Encounter"),
          sequences=(("searchResources", "searchResources"),))
class LastOutpatientVisit(_Clinical):
    """Date and type of the most recent outpatient visit

    Outpatient means class AMB: emergency and inpatient encounters (often more recent) do not count."""

    answer = AnswerSpec((Field("date", "date", "the day the visit started"),
                         Field("type_code", "text", "the SNOMED CT code of the visit type")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _people(view))
        visits = _visits(view).get(person["pid"], [])
        if not visits or visits[-1][0] > view.now - timedelta(hours=2):
            return None
        return _patient_params(person, rng)

    def prompt(self, params: dict) -> str:
        return (f"When was the most recent outpatient (ambulatory) visit of {_who(params)}, and what type of "
                "visit was it?")

    def gold(self, view: View, params: dict) -> Gold:
        visits = [v for v in _visits(view)[params["pid"]] if v[0] <= view.now]
        last = visits[-1][0]
        kinds = sorted({x for v in visits if v[0] == last for x in (v[1], v[2])})
        return Gold(answer={"date": last.date(), "type_code": kinds})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        query = {"patient": pid, "class": "AMB", "_sort": "-date", "_count": "5"}
        found = [e for e in search_all(tools, "Encounter", query, all_pages=False)
                 if moment(e["period"]["start"]) <= now]
        first = found[0]
        code = next(c["code"] for t in first["type"] for c in t["coding"] if c.get("system") == SNOMED)
        return answer_text({"date": first["period"]["start"][:10], "type_code": code})
