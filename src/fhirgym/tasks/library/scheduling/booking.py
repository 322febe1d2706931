"""Booking: the first free slot, or the slot the request states."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from ....tools import Toolbox
from ... import Expect, Family, Gold, View, register
from ...draw import who
from ...facts import Slot
from ...solve import create, read, update
from ._appointments_common import (
    MARGIN,
    _booked,
    _doctor_params,
    _find_doctor,
    _find_patient,
    _first_free,
    _free,
    _patient_params,
    _pick_patient,
    _slot_at,
    _slot_to,
    _usable_doctors,
    _when,
    _world,
    _z,
)

BOOKED_SHAPE = ("Record it as an Appointment with status booked that references the slot, with the "
                "slot's start and end, and with the patient and the doctor as participants, both with "
                "status accepted; then set that Slot's status to busy (leave the rest of the slot as it is).")


def _booking_gold(slot: Slot, params: dict) -> Gold:
    """The booking of ``slot`` for the patient with the doctor: a new Appointment, the slot busy."""
    return Gold(expects=[Expect("create", "Appointment", checks=_booked(slot, params["patient_id"], params["doc_id"])),
                         _slot_to(slot.id, "busy")])


def _book(tools: Toolbox, slot_id: str, patient: str, practitioner: str) -> None:
    slot = read(tools, "Slot", slot_id)
    create(tools, {
        "resourceType": "Appointment", "status": "booked", "slot": [{"reference": f"Slot/{slot_id}"}],
        "start": slot["start"], "end": slot["end"], "minutesDuration": 30,
        "participant": [{"actor": {"reference": f"Patient/{patient}"}, "status": "accepted"},
                        {"actor": {"reference": f"Practitioner/{practitioner}"}, "status": "accepted"}]})
    update(tools, {**slot, "status": "busy"})


@register("scheduling.book_first_free_slot", difficulty=2, writes=True,
          touches=("Patient", "Slot", "Appointment"),
          sequences=(("searchResources", "createResource", "updateResource"), ("searchResources", "updateResource", "createResource")))
class BookFirstFreeSlot(Family):
    """Book a patient into a doctor's first free routine slot at or after a given time

    First free routine slot of a named doctor at/after a stated time: urgent and busy slots are skipped."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        doc = rng.choice(_usable_doctors(w))
        day = view.now.date() + timedelta(days=rng.randint(1, 10))
        minute = rng.randrange(8 * 60, 16 * 60 + 1, 30)
        stated = datetime(day.year, day.month, day.day, minute // 60, minute % 60, tzinfo=UTC)
        slot = next(_free(w, doc["schedule"], _z(stated)), None)
        if slot is None or stated - view.now < MARGIN:
            return None
        p = _pick_patient(w, rng, lambda p: slot.start[:10] not in w.holding_days[p["id"]], doc,
                          view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(doc), "from": _z(stated), "slot_id": slot.id}

    def prompt(self, params: dict) -> str:
        return (f"Please book {who(params['name'], params['birth'])} with {params['doc']} in the first free slot at or after "
                f"{_when(params['from'])}. Use a regular slot, not one reserved for urgent visits. "
                f"{BOOKED_SHAPE}")

    def gold(self, view: View, params: dict) -> Gold:
        slot = next(_free(_world(view), params["doc_schedule"], params["from"]))
        return _booking_gold(slot, params)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        slot = _first_free(tools, sched, params["from"])
        assert slot is not None
        _book(tools, slot["id"], patient, prac)
        return f"Booked the slot at {slot['start']}."


@register("scheduling.book_stated_slot", difficulty=2, writes=True,
          touches=("Patient", "Slot", "Appointment"),
          sequences=(("searchResources", "createResource", "updateResource"), ("searchResources", "updateResource", "createResource")))
class BookStatedSlot(Family):
    """Book a stated doctor and time when another doctor is free at the same time

    A stated doctor and time while another doctor (same name or same specialty) is free at that time."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        docs = _usable_doctors(w)
        twins = [d for d in docs if d["hint"]]
        doc = rng.choice(twins) if twins and rng.random() < 0.5 else rng.choice(docs)
        hi = _z(view.now + timedelta(days=14))
        options = []
        for s in _free(w, doc["schedule"], _z(view.now + MARGIN)):
            if s.start > hi:
                break
            if s.id in w.rivalled:
                options.append(s)
        if not options:
            return None
        slot = rng.choice(options)
        p = _pick_patient(w, rng, lambda p: slot.start[:10] not in w.holding_days[p["id"]], doc,
                          view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(doc), "at": slot.start, "slot_id": slot.id}

    def prompt(self, params: dict) -> str:
        return f"Please book {who(params['name'], params['birth'])} with {params['doc']} on {_when(params['at'])}. {BOOKED_SHAPE}"

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        slot = next(s for s in w.at[params["at"]] if s.schedule == params["doc_schedule"])
        assert slot.status == "free" and slot.id == params["slot_id"]
        return _booking_gold(slot, params)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        slot = _slot_at(tools, sched, params["at"])
        _book(tools, slot["id"], patient, prac)
        return f"Booked the slot at {slot['start']}."
