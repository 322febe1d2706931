"""Cancelling: the nearest appointment, one with a provider, Monday's."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from ....spec.codes import CANCELLATION_REASON
from ....tools import Toolbox
from ... import Expect, Family, Gold, View, register
from ...checks import (
    Check,
    coded,
    eq,
    may_set,
)
from ...draw import deal, who
from ...facts import (
    Appointment,
    instant,
)
from ...solve import read, update
from ._appointments_common import (
    _doctor_params,
    _find_doctor,
    _find_patient,
    _id,
    _participants,
    _patient_appointments,
    _patient_params,
    _slot_to,
    _upcoming,
    _with,
    _World,
    _world,
)

T = TypeVar("T")


#: Cancellation reasons a caller would give (code, display).
PATIENT_REASONS = (("pat-fb", "Patient: Feeling Better"), ("pat-lt", "Patient: Lack of Transportation"),
                   ("pat-cpp", "Patient: Canceled via Patient Portal"))


FREE_SHAPE = ("set the appointment's status to cancelled (leave the rest of it as it is) and set its "
              "slot's status back to free")


def _prefer(view: View, options: list[tuple[T, int]]) -> T | None:
    """An option whose patient has other upcoming appointments too (the distractors) if there are enough of
    them to vary the gold, else any option; dealt by seed (no option is the gold of many seeds)."""
    rich = [o for o, n in options if n >= 2]
    return deal(view, rich if len(rich) >= 4 else [o for o, _ in options])


def _cancel_gold(w: _World, appt: Appointment, reason: str | None) -> Gold:
    checks: tuple[Check, ...] = (eq("status", "cancelled"), _participants(None, None, False),
                                 coded("cancelationReason", CANCELLATION_REASON, reason) if reason
                                 else may_set("cancelationReason"))
    slot = w.slot_by_id.get(appt.slot or "")
    assert slot is not None and slot.status == "busy", appt.id
    return Gold(expects=[Expect("update", "Appointment", id=appt.id, checks=checks),
                         _slot_to(slot.id, "free")])


def _cancel(tools: Toolbox, appt_id: str, reason: list[str] | None) -> None:
    appt = read(tools, "Appointment", appt_id)
    appt["status"] = "cancelled"
    if reason:
        appt["cancelationReason"] = {"coding": [{"system": CANCELLATION_REASON, "code": reason[0],
                                                 "display": reason[1]}]}
    update(tools, appt)
    slot_id = _id(appt["slot"][0], "Slot") or ""
    update(tools, {**read(tools, "Slot", slot_id), "status": "free"})


def _reason_phrase(reason: list[str]) -> str:
    return (f"Record the cancellation reason as code {reason[0]} ('{reason[1]}') from the HL7 "
            "appointment-cancellation-reason code system.")


def _booked_first_hit_is_not(view: View, patient: str, target: str | None) -> bool | None:
    """The distractor probe of the cancel families: None when the patient has one booked appointment only,
    else whether the first hit of ``Appointment?patient&status=booked&_sort=date`` (earliest first, stale
    bookings before now included) is another one than the target."""
    hits = view.search("Appointment", {"patient": f"Patient/{patient}", "status": "booked", "_sort": "date",
                                       "_elements": "id"})
    return None if len(hits) < 2 else hits[0]["id"] != target


@register("scheduling.cancel_nearest_appointment", difficulty=2, writes=True, touches=("Appointment", "Slot"),
          sequences=(("searchResources", "updateResource", "updateResource"),))
class CancelNearestAppointment(Family):
    """Cancel a patient's next upcoming appointment and free its slot

    The patient's next appointment among several; stale 'booked' ones before now and the
    entered-in-error duplicate do not count."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = [(p, len(up)) for pid, p in sorted(w.patients.items())
                   if (up := _upcoming(w, pid, view.now))]
        p = _prefer(view, options)
        if p is None:
            return None
        return {**_patient_params(p), "reason": list(rng.choice(PATIENT_REASONS))}

    def prompt(self, params: dict) -> str:
        return (f"{who(params['name'], params['birth'])} asked us to cancel the next appointment they have coming up with us. Please "
                f"cancel that appointment: {FREE_SHAPE}. {_reason_phrase(params['reason'])}")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        up = _upcoming(w, params["patient_id"], view.now)
        assert up
        return _cancel_gold(w, up[0], params["reason"][0])

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        up = _upcoming(_world(view), params["patient_id"], view.now) or []
        return _booked_first_hit_is_not(view, params["patient_id"], up[0].id if up else None)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        appt = _patient_appointments(tools, patient, "booked", now)[0]
        _cancel(tools, appt["id"], params["reason"])
        return f"Cancelled the appointment of {appt['start']} and freed its slot."


@register("scheduling.cancel_with_provider", difficulty=2, writes=True, touches=("Appointment", "Slot"),
          sequences=(("searchResources", "updateResource", "updateResource"),))
class CancelWithProvider(Family):
    """Cancel a patient's upcoming appointment with a given doctor

    One of the patient's upcoming appointments, picked by its doctor (possibly one of a same-name pair)."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = []
        for pid in sorted(w.patients):
            up = _upcoming(w, pid, view.now) or []
            docs = [a.practitioner for a in up]
            options += [(a, len(up)) for a in up if a.practitioner in w.doctors and docs.count(a.practitioner) == 1]
        a = _prefer(view, options)
        if a is None or a.patient is None or a.practitioner is None:
            return None
        return {**_patient_params(w.patients[a.patient]), **_doctor_params(w.doctors[a.practitioner]),
                "appointment_id": a.id, "reason": list(rng.choice(PATIENT_REASONS))}

    def prompt(self, params: dict) -> str:
        return (f"Please cancel the upcoming appointment of {who(params['name'], params['birth'])} with {params['doc']}: "
                f"{FREE_SHAPE}. Their other appointments stay as they are. "
                f"{_reason_phrase(params['reason'])}")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        up = _upcoming(w, params["patient_id"], view.now) or []
        match = [a for a in up if a.practitioner == params["doc_id"]]
        assert len(match) == 1 and match[0].id == params["appointment_id"]
        return _cancel_gold(w, match[0], params["reason"][0])

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        return _booked_first_hit_is_not(view, params["patient_id"], params["appointment_id"])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, _ = _find_doctor(tools, params)
        appt = _with(_patient_appointments(tools, patient, "booked", now), prac)[0]
        _cancel(tools, appt["id"], params["reason"])
        return f"Cancelled the appointment of {appt['start']} with {params['doc']} and freed its slot."


@register("scheduling.cancel_monday_appointment", difficulty=2, writes=True, touches=("Appointment", "Slot"),
          sequences=(("searchResources", "updateResource", "updateResource"),))
class CancelMondayAppointment(Family):
    """Cancel a patient's upcoming Monday appointment

    The one upcoming appointment that falls on a Monday, among the patient's others (weekdays)."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        def fits(pid: str, now: datetime) -> bool:
            up = _upcoming(w, pid, now)
            return bool(up) and sum(a.at.weekday() == 0 for a in up if a.at) == 1

        # dealt over the patients that fit all week (every clock falls in the anchor's week), not over those
        # that fit this clock (a list that changes with the clock upsets the deal); a misfit is a redraw
        first = datetime.combine(view.anchor, datetime.min.time(), tzinfo=UTC)
        week = [pid for pid in sorted(w.patients) if fits(pid, first) and fits(pid, first + timedelta(days=7))]
        pid = deal(view, week)
        return _patient_params(w.patients[pid]) if pid and fits(pid, view.now) else None

    def prompt(self, params: dict) -> str:
        return (f"{who(params['name'], params['birth'])} can no longer come on Mondays. Please cancel their upcoming appointment "
                f"that falls on a Monday: {FREE_SHAPE}. Leave their other appointments alone.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        up = _upcoming(w, params["patient_id"], view.now) or []
        monday = [a for a in up if a.at and a.at.weekday() == 0]
        assert len(monday) == 1
        return _cancel_gold(w, monday[0], None)

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        up = _upcoming(_world(view), params["patient_id"], view.now) or []
        monday = next((a.id for a in up if a.at and a.at.weekday() == 0), None)
        return _booked_first_hit_is_not(view, params["patient_id"], monday)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        appt = next(a for a in _patient_appointments(tools, patient, "booked", now)
                    if instant(a["start"]).weekday() == 0)
        _cancel(tools, appt["id"], None)
        return f"Cancelled the Monday appointment of {appt['start']} and freed its slot."
