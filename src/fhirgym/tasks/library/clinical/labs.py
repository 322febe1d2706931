"""Lab results: the last 24 hours, a mean, the latest glucose, the last HbA1c."""

from __future__ import annotations

import copy
import random
from datetime import date, datetime, timedelta

from ....spec.codes import (
    LOINC,
)
from ....tools import Toolbox
from ... import NOT_FOUND, AnswerSpec, Field, Gold, View, answer_text, register
from ...draw import deal, deal_positive, human_date, negative_seed, pick
from ...facts import moment, results
from ...solve import search_all
from ._common import (
    LABS,
    RELATED,
    VALID,
    _adults,
    _all_results,
    _Clinical,
    _draw_resources,
    _iso,
    _lab_value,
    _latest_valid,
    _locate,
    _patient_params,
    _people,
    _quiet_since,
    _results,
    _slip,
    _voided_first,
    _who,
    _world_results,
)

GLUCOSE = ("2339-0", "2345-7")


def _shadow(view: View, rng: random.Random, pid: str, codes: tuple[str, ...]) -> dict | None:
    """An entered-in-error copy (a decimal slip) to chart minutes after the patient's latest valid result of
    these codes, the trap a plain newest-first search falls into; None when the chart already holds one
    or the latest result is too close to now."""
    rows = [r for r in results(view, codes).get(pid, []) if r.at <= view.now]
    valid = [r for r in rows if r.status in VALID and r.value is not None]
    if not valid or any(r.status == "entered-in-error" and r.at > valid[-1].at for r in rows):
        return None
    latest, minutes = valid[-1], rng.randint(3, 40)
    if latest.at + timedelta(minutes=minutes) > view.now:
        return None
    return {"of": latest.id, "id": view.new_id("shadow"), "minutes": minutes, "value": _slip(rng, latest.value)}


def _shadow_resources(view: View, shadow: dict | None) -> list[dict]:
    """The copy :func:`_shadow` describes, made as the world makes its own (``world._clinical``)."""
    if shadow is None:
        return []
    real = view.read("Observation", shadow["of"])
    assert real is not None
    wrong = {k: v for k, v in copy.deepcopy(real).items() if k not in ("meta", "interpretation", "referenceRange")}
    wrong.update(id=shadow["id"], status="entered-in-error",
                 effectiveDateTime=_iso(moment(real["effectiveDateTime"]) + timedelta(minutes=shadow["minutes"])),
                 note=[{"text": "Value keyed in with a misplaced decimal point; entered in error."}])
    wrong["valueQuantity"]["value"] = shadow["value"]
    return [wrong]


@register("clinical.lab_last_24h", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LabLast24h(_Clinical):
    """Latest value of a lab within the last 24 hours (or nothing found)

    A window filter, an entered-in-error copy more recent than the real result; often nothing qualifies."""

    answer = AnswerSpec((Field("value", "number", "the result in the unit the lab reports"),),
                        none_allowed=True)
    CODES = ("19123-9", "2823-3", "2951-2", "2160-0", "718-7")

    def sample(self, view: View, rng: random.Random) -> dict | None:
        code = rng.choice(self.CODES)
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], RELATED.get(code, (code,)), view.now - timedelta(days=5)):
            return None
        if not negative_seed(view):  # a result inside the window, often shadowed by a newer entered-in-error copy
            recent, value = rng.randint(30, 22 * 60), _lab_value(rng, code)
            draws = [[recent, value, "final"]]
            other = rng.random()
            if other < 0.5:
                draws.append([rng.randint(5, recent - 5), _slip(rng, value), "entered-in-error"])
            elif other < 0.8:
                draws.append([rng.randint(27 * 60, 70 * 60), _lab_value(rng, code), "final"])
        else:  # only an older result, and often an entered-in-error one inside the window
            draws = [[rng.randint(27 * 60, 70 * 60), _lab_value(rng, code), "final"]]
            if rng.random() < 0.7:
                wrong = _slip(rng, _lab_value(rng, code))
                draws.append([rng.randint(30, 22 * 60), wrong, "entered-in-error"])
        return {**_patient_params(person, rng), "code": code, "draws": draws}

    def prompt(self, params: dict) -> str:
        _, words, unit, *_ = LABS[params["code"]]
        return (f"What is the most recent {words} (LOINC {params['code']}) of {_who(params)} from the last "
                f"24 hours? Give the value in {unit}.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "lab", params["pid"], params["code"], params["draws"])

    def gold(self, view: View, params: dict) -> Gold:
        rows = _all_results(view, params["pid"], params["code"], params["draws"])
        latest = _latest_valid(rows, view.now, since=view.now - timedelta(hours=24))
        return Gold(answer={"value": latest[2]} if latest else NOT_FOUND)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], (params["code"],))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, params["code"], since=now - timedelta(hours=24))
                 if moment(o["effectiveDateTime"]) <= now]
        return answer_text({"value": found[0]["valueQuantity"]["value"]}) if found else answer_text(NOT_FOUND)


@register("clinical.lab_mean", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LabMean(_Clinical):
    """Mean of a lab's results between two dates

    Averaging needs every valid result of the window and none outside it (hospital stays chart labs
    daily; the world's entered-in-error copies sometimes fall inside)."""

    answer = AnswerSpec((Field("mean", "number", "the average, rounded to one decimal", tolerance=0.06),))
    CODES = ("2345-7", "2823-3", "2951-2", "2160-0", "718-7")

    def sample(self, view: View, rng: random.Random) -> dict | None:
        code = rng.choice(self.CODES)
        candidates = [p for p in _adults(view)
                      if sum(r[1] in VALID for r in _world_results(view, p["pid"], (code,))) >= 2]
        person = pick(rng, candidates)
        if person is None:
            return None
        rows = [r for r in _world_results(view, person["pid"], (code,)) if r[2] is not None]
        pivot = rng.choice([r for r in rows if r[1] in VALID])[0].date()
        first = pivot - timedelta(days=rng.randint(0, 2))
        last = pivot + timedelta(days=rng.randint(0, 3))
        inside = [r for r in rows if first <= r[0].date() <= last]
        if last >= view.now.date() or sum(r[1] in VALID for r in inside) < 2:
            return None
        return {**_patient_params(person, rng), "code": code, "first": first.isoformat(),
                "last": last.isoformat()}

    def prompt(self, params: dict) -> str:
        _, words, unit, *_ = LABS[params["code"]]
        return (f"What was the average {words} (LOINC {params['code']}, in {unit}) of {_who(params)} from "
                f"{human_date(params['first'])} through {human_date(params['last'])} (UTC dates, both days "
                "included)? Round to one decimal.")

    def gold(self, view: View, params: dict) -> Gold:
        first, last = date.fromisoformat(params["first"]), date.fromisoformat(params["last"])
        found = [r[2] for r in _world_results(view, params["pid"], (params["code"],))
                 if r[1] in VALID and r[2] is not None and first <= r[0].date() <= last]
        assert len(found) >= 2
        return Gold(answer={"mean": sum(found) / len(found)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        end = date.fromisoformat(params["last"]) + timedelta(days=1)
        query = {"patient": pid, "code": f"{LOINC}|{params['code']}",
                 "date": [f"ge{params['first']}", f"lt{end}"],
                 "_count": "15", "_elements": "status,effectiveDateTime,valueQuantity"}
        found = [o["valueQuantity"]["value"] for o in search_all(tools, "Observation", query)
                 if o["status"] in VALID]
        return answer_text({"mean": round(sum(found) / len(found), 1)})


@register("clinical.latest_glucose", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LatestGlucose(_Clinical):
    """Most recent glucose value and when it was taken

    Two glucose codes (blood, serum) to merge, and an entered-in-error copy (world or setup) just after the
    real latest. Always a patient with a result: "none on file" is last_hba1c's branch (each family offering
    it adds its negative seeds to what a blind "nothing found" reply scores)."""

    answer = AnswerSpec((Field("value", "number", "the glucose in mg/dL"),
                         Field("taken", "datetime", "when it was taken")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        tested = view.cached("clin_glucose_tested", lambda: [p for p in _people(view) if any(
            r.status in VALID and r.value is not None for r in _world_results(view, p["pid"], GLUCOSE))])
        person = deal(view, tested)  # by seed: no patient is the gold of many seeds
        if person is None:
            return None
        rows = _world_results(view, person["pid"], GLUCOSE)
        if not _quiet_since(view, person["pid"], GLUCOSE, view.now - timedelta(hours=2)):
            return None
        valid = [r for r in rows if r[1] in VALID and r[2] is not None and r[0] <= view.now]
        if not valid or (len(valid) > 1 and valid[-1][0] == valid[-2][0]):
            return None
        return {**_patient_params(person, rng), "shadow": _shadow(view, rng, person["pid"], GLUCOSE)}

    def setup(self, view: View, params: dict) -> list[dict]:
        return _shadow_resources(view, params["shadow"])

    def prompt(self, params: dict) -> str:
        return (f"What was the most recent glucose result (LOINC 2339-0 or 2345-7) of {_who(params)}, "
                "and when was it taken?")

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid([r[:3] for r in _world_results(view, params["pid"], GLUCOSE)], view.now)
        assert latest is not None, params
        return Gold(answer={"value": latest[2], "taken": latest[0]})

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], GLUCOSE)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, ",".join(GLUCOSE), newest=True)
                 if moment(o["effectiveDateTime"]) <= now]
        if not found:
            return answer_text(NOT_FOUND)
        return answer_text({"value": found[0]["valueQuantity"]["value"], "taken": found[0]["effectiveDateTime"]})


@register("clinical.last_hba1c", difficulty=2, touches=("Patient", "Observation"),
          sequences=(("searchResources", "searchResources"),))
class LastHba1c(_Clinical):
    """Last HbA1c value and its date (or none on file)

    An entered-in-error copy charted minutes after the real latest HbA1c, from the world or the setup
    (a world where no living patient has an HbA1c gets one, with such a copy, from the setup)."""

    answer = AnswerSpec((Field("value", "number", "the HbA1c in %"),
                         Field("date", "date", "the day it was taken")), none_allowed=True)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        tested = view.cached("clin_a1c_tested", lambda: [
            p for p in _people(view)
            if any(r[1] in VALID for r in _world_results(view, p["pid"], ("4548-4",)))])
        want = not negative_seed(view)
        untested = [p for p in _people(view) if p not in tested]
        person = (deal_positive(view, tested) if want and tested  # the few tested patients share the positives
                  else pick(rng, untested if not want and untested else _people(view)))
        if not _quiet_since(view, person["pid"], ("4548-4",), view.now - timedelta(days=1)):
            return None
        has = person in tested
        if has != want and tested:
            return None
        draws: list[list] = []
        if want and not has:
            days = rng.randint(30, 900)
            value = _lab_value(rng, "4548-4")
            draws = [[days * 1440, value, "final"],
                     [days * 1440 - 17, _slip(rng, value, up=True), "entered-in-error"]]
        params = _patient_params(person, rng)
        shadow = _shadow(view, rng, person["pid"], ("4548-4",)) if want and has else None
        return {**params, "draws": draws, "shadow": shadow}

    def setup(self, view: View, params: dict) -> list[dict]:
        return (_draw_resources(view, "a1c", params["pid"], "4548-4", params["draws"])
                + _shadow_resources(view, params.get("shadow")))

    def prompt(self, params: dict) -> str:
        return (f"What was the last hemoglobin A1c (LOINC 4548-4) of {_who(params)}, and on what date was "
                "it taken?")

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid(_all_results(view, params["pid"], "4548-4", params["draws"]), view.now)
        return Gold(answer={"value": latest[2], "date": latest[0].date()} if latest else NOT_FOUND)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("4548-4",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, "4548-4", newest=True) if moment(o["effectiveDateTime"]) <= now]
        if not found:
            return answer_text(NOT_FOUND)
        return answer_text({"value": found[0]["valueQuantity"]["value"], "date": found[0]["effectiveDateTime"][:10]})
