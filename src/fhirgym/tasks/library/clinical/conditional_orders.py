"""Conditional orders: order only when a lab result says so (magnesium, HbA1c, potassium)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from ....spec.codes import (
    LOINC,
    RXNORM,
    SNOMED,
)
from ....tools import Toolbox
from ... import AnswerSpec, Expect, Field, Gold, View, answer_text, register
from ...checks import (
    coded,
    eq,
    instant,
    ref,
    unit_is,
)
from ...draw import Branched, pick
from ...facts import moment
from ...solve import create
from ._common import (
    LABS,
    ORAL_ROUTE,
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
    _medication_request,
    _patient_params,
    _quiet_since,
    _results,
    _service_request,
    _slip,
    _voided_first,
    _who,
    _world_results,
)

IV_ROUTE = ("47625008", "Intravenous route")


MAGNESIUM_SULFATE = ("6585", "magnesium sulfate")


POTASSIUM_CHLORIDE = ("8591", "potassium chloride")


def _magnesium_dose(value: float) -> int:
    return 4 if value < 1.2 else 2 if value < 1.5 else 1


@register("clinical.magnesium_if_low", difficulty=3, writes=True,
          touches=("Patient", "Observation", "MedicationRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class MagnesiumIfLow(Branched, _Clinical):
    """Magnesium in the last 24 h: if low, order IV magnesium sulfate at the dose for its band

    One IV order at the dose of the band when the magnesium is low, nothing when it is normal: both
    branches in one family. The entered-in-error copy (more recent, decimal slip) and an older result lie on
    the other side of the threshold; the dose depends on the band the real value falls in.

    Seed 2k is seed k of the former ``clinical.magnesium_replacement`` (low), seed 2k+1 seed k of the
    former ``clinical.magnesium_no_order`` (normal): the same prompt, params, setup and gold."""

    read_resource_types = ("Patient", "Observation")
    read_sequences = (("searchResources", "searchResources"),)
    branches = ("clinical.magnesium_replacement", "clinical.magnesium_no_order")
    answer = AnswerSpec((Field("magnesium", "number", "the result you acted on, in mg/dL"),
                         Field("ordered", "bool", "whether you ordered magnesium sulfate")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], ("19123-9",), view.now - timedelta(days=5)):
            return None
        low = self.branch(view) == 0
        value = _lab_value(rng, "19123-9", 0.8, 1.7) if low else _lab_value(rng, "19123-9", 1.9, 2.5)
        recent = rng.randint(30, 20 * 60)
        draws = [[recent, value, "final"]]
        distractor = rng.random()
        if distractor < 0.45:  # a newer entered-in-error copy on the other side of the threshold
            draws.append([rng.randint(5, recent - 5), _slip(rng, value, up=low), "entered-in-error"])
        elif distractor < 0.8:  # an older (over 24 h) result on the other side
            other = _lab_value(rng, "19123-9", 1.9, 2.4) if low else _lab_value(rng, "19123-9", 1.0, 1.6)
            draws.append([rng.randint(26 * 60, 60 * 60), other, "final"])
        return {**_patient_params(person, rng), "draws": draws}

    def prompt(self, params: dict) -> str:
        return (f"Check the most recent serum magnesium (LOINC 19123-9) of {_who(params)} from the last 24 "
                "hours. If it is below 1.8 mg/dL, order IV magnesium sulfate (RxNorm 6585) as a "
                "MedicationRequest with status active and intent order, with a dosage instruction giving "
                "the route as intravenous (SNOMED CT 47625008) and the dose in grams (UCUM g) by this "
                "scale: below 1.2 mg/dL, 4 g; from 1.2 to below 1.5 mg/dL, 2 g; from 1.5 to below 1.8 "
                "mg/dL, 1 g. If it is 1.8 mg/dL or higher, do not order anything.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "mg", params["pid"], "19123-9", params["draws"])

    def gold(self, view: View, params: dict) -> Gold:
        rows = _all_results(view, params["pid"], "19123-9", params["draws"])
        latest = _latest_valid(rows, view.now, since=view.now - timedelta(hours=24))
        assert latest is not None
        low = latest[2] < 1.8
        assert low == (self.branch(view) == 0), params
        expects = []
        if low:
            expects.append(Expect("create", "MedicationRequest", checks=(
                ref("subject", f"Patient/{params['pid']}"), eq("status", "active"), eq("intent", "order"),
                coded("medicationCodeableConcept", RXNORM, MAGNESIUM_SULFATE[0]),
                eq("dosageInstruction.doseAndRate.doseQuantity.value", _magnesium_dose(latest[2])),
                unit_is("dosageInstruction.doseAndRate.doseQuantity", "g"),
                coded("dosageInstruction.route", SNOMED, IV_ROUTE[0]))))
        return Gold(answer={"magnesium": latest[2], "ordered": low}, expects=expects)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("19123-9",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, "19123-9", since=now - timedelta(hours=24))
                 if moment(o["effectiveDateTime"]) <= now]
        value = found[0]["valueQuantity"]["value"]
        if value < 1.8:
            dose = _magnesium_dose(value)
            create(tools, _medication_request(pid, MAGNESIUM_SULFATE, dose, "g", IV_ROUTE, now,
                                               f"{dose} g magnesium sulfate IV"))
        return answer_text({"magnesium": value, "ordered": value < 1.8})


@register("clinical.hba1c_if_due", difficulty=3, writes=True,
          touches=("Patient", "Observation", "ServiceRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class Hba1cIfDue(Branched, _Clinical):
    """Last HbA1c: if it is over a year old, order a new one

    Order a new HbA1c when the last valid one is over a year old, nothing when there is a recent one:
    both branches in one family. "Most recent" must skip an entered-in-error copy that would flip the
    one-year decision.

    Seed 2k is seed k of the former ``clinical.hba1c_reorder`` (due), seed 2k+1 seed k of the former
    ``clinical.hba1c_not_due`` (recent): the same prompt, params, setup and gold."""

    read_resource_types = ("Patient", "Observation")
    read_sequences = (("searchResources", "searchResources"),)
    branches = ("clinical.hba1c_reorder", "clinical.hba1c_not_due")
    answer = AnswerSpec((Field("hba1c", "number", "the most recent HbA1c in %"),
                         Field("date", "date", "the day it was taken"),
                         Field("ordered", "bool", "whether you ordered a new HbA1c")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        due = self.branch(view) == 0
        days = rng.randint(400, 1000) if due else rng.randint(20, 330)
        world = _world_results(view, person["pid"], ("4548-4",))
        if any(r[0] > view.now - timedelta(days=1)
               or (r[1] in VALID and r[0] > view.now - timedelta(days=days + 2)) for r in world):
            return None
        draws = [[days * 1440 + rng.randint(0, 600), _lab_value(rng, "4548-4"), "final"]]
        distractor = rng.random()
        if distractor < 0.5:  # a newer entered-in-error copy (inside the year when the real one is older)
            newer = rng.randint(20, 300) if due else rng.randint(1, days - 1)
            wrong = _slip(rng, draws[0][1], up=True)
            draws.append([newer * 1440 + rng.randint(0, 600), wrong, "entered-in-error"])
        elif distractor < 0.75:
            draws.append([(days + rng.randint(150, 500)) * 1440, _lab_value(rng, "4548-4"), "final"])
        return {**_patient_params(person, rng), "draws": draws}

    def prompt(self, params: dict) -> str:
        return (f"When did {_who(params)} last have a hemoglobin A1c (LOINC 4548-4)? If the most recent "
                "result is more than one year old, order a new HbA1c: a ServiceRequest coded LOINC 4548-4 "
                "with status active, intent order and priority routine. If there is a result from within "
                "the past year, do not order anything.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "a1c", params["pid"], "4548-4", params["draws"])

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid(_all_results(view, params["pid"], "4548-4", params["draws"]), view.now)
        assert latest is not None
        due = latest[0] < view.now - timedelta(days=365)
        assert due == (self.branch(view) == 0), params
        expects = []
        if due:
            expects.append(Expect("create", "ServiceRequest", checks=(
                ref("subject", f"Patient/{params['pid']}"), coded("code", LOINC, "4548-4"),
                eq("status", "active"), eq("intent", "order"), eq("priority", "routine"))))
        return Gold(answer={"hba1c": latest[2], "date": latest[0].date(), "ordered": due}, expects=expects)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("4548-4",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        found = [o for o in _results(tools, pid, "4548-4", newest=True) if moment(o["effectiveDateTime"]) <= now]
        last = found[0]
        due = moment(last["effectiveDateTime"]) < now - timedelta(days=365)
        if due:
            create(tools, _service_request(pid, LOINC, "4548-4", LABS["4548-4"][0], now, priority="routine"))
        return answer_text({"hba1c": last["valueQuantity"]["value"], "date": last["effectiveDateTime"][:10], "ordered": due})


@register("clinical.potassium_replacement", difficulty=3, writes=True,
          touches=("Patient", "Observation", "ServiceRequest"),
          sequences=(("searchResources", "searchResources", "createResource"),))
class PotassiumReplacement(_Clinical):
    """Replace potassium if low (dose from the value) and order a next-morning potassium

    Conditional replacement with a computed dose (both branches occur), a distractor result on the other
    side of 3.5, and a lab timed for tomorrow 08:00 UTC in every case."""

    answer = AnswerSpec((Field("potassium", "number", "the result you acted on, in mmol/L"),
                         Field("replacement_ordered", "bool", "whether you ordered potassium chloride")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        person = pick(rng, _adults(view))
        if not _quiet_since(view, person["pid"], RELATED["2823-3"], view.now - timedelta(days=30)):
            return None
        low = rng.random() < 0.55
        value = _lab_value(rng, "2823-3", 2.8, 3.4) if low else _lab_value(rng, "2823-3", 3.6, 5.0)
        recent = rng.randint(60, 20 * 60)
        draws = [[recent, value, "final"]]
        distractor = rng.random()
        if distractor < 0.4:  # a newer entered-in-error copy on the other side of 3.5
            draws.append([rng.randint(5, recent - 5), _slip(rng, value, up=low), "entered-in-error"])
        elif distractor < 0.75:  # an older result on the other side
            other = _lab_value(rng, "2823-3", 3.7, 4.8) if low else _lab_value(rng, "2823-3", 2.9, 3.3)
            draws.append([rng.randint(24 * 60, 72 * 60), other, "final"])
        return {**_patient_params(person, rng), "draws": draws}

    def prompt(self, params: dict) -> str:
        return (f"Review the most recent serum potassium (LOINC 2823-3) of {_who(params)}. If it is below "
                "3.5 mmol/L, order oral potassium chloride (RxNorm 8591): a MedicationRequest with status "
                "active and intent order, route oral (SNOMED CT 26643006) and a dose in mEq (UCUM meq) of "
                "10 mEq for every 0.1 mmol/L below 3.5 (for example, 3.2 mmol/L means 30 mEq). Whatever the "
                "result, also order a repeat serum potassium to be drawn tomorrow at 08:00 UTC: a "
                "ServiceRequest coded LOINC 2823-3 with status active, intent order and occurrenceDateTime "
                "tomorrow at 08:00 UTC.")

    def setup(self, view: View, params: dict) -> list[dict]:
        return _draw_resources(view, "k", params["pid"], "2823-3", params["draws"])

    @staticmethod
    def dose(value: float) -> int:
        return round((3.5 - value) * 100)

    @staticmethod
    def tomorrow_8(now: datetime) -> datetime:
        day = now.date() + timedelta(days=1)
        return datetime(day.year, day.month, day.day, 8, 0, tzinfo=UTC)

    def gold(self, view: View, params: dict) -> Gold:
        latest = _latest_valid(_all_results(view, params["pid"], "2823-3", params["draws"]), view.now)
        assert latest is not None
        subject = ref("subject", f"Patient/{params['pid']}")
        expects = [Expect("create", "ServiceRequest", checks=(
            subject, coded("code", LOINC, "2823-3"), eq("status", "active"), eq("intent", "order"),
            instant("occurrenceDateTime", _iso(self.tomorrow_8(view.now)))))]
        low = latest[2] < 3.5
        if low:
            expects.append(Expect("create", "MedicationRequest", checks=(
                subject, eq("status", "active"), eq("intent", "order"),
                coded("medicationCodeableConcept", RXNORM, POTASSIUM_CHLORIDE[0]),
                eq("dosageInstruction.doseAndRate.doseQuantity.value", self.dose(latest[2])),
                unit_is("dosageInstruction.doseAndRate.doseQuantity", "meq"),
                coded("dosageInstruction.route", SNOMED, ORAL_ROUTE[0]))))
        return Gold(answer={"potassium": latest[2], "replacement_ordered": low}, expects=expects)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _voided_first(view, params["pid"], ("2823-3",))

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        pid = _locate(tools, params)
        latest = next(o for o in _results(tools, pid, "2823-3", newest=True)
                      if moment(o["effectiveDateTime"]) <= now)
        value = latest["valueQuantity"]["value"]
        if value < 3.5:
            dose = self.dose(value)
            create(tools, _medication_request(pid, POTASSIUM_CHLORIDE, dose, "meq", ORAL_ROUTE, now,
                                               f"{dose} mEq potassium chloride by mouth"))
        create(tools, _service_request(pid, LOINC, "2823-3", LABS["2823-3"][0], now,
                                        occurrenceDateTime=_iso(self.tomorrow_8(now))))
        return answer_text({"potassium": value, "replacement_ordered": value < 3.5})
