"""Rescheduling: to next Monday, or to another provider."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

from ....spec.codes import APPOINTMENT_TYPE, PARTICIPATION_TYPE
from ....tools import Toolbox
from ... import Expect, Family, Gold, View, register
from ...checks import (
    at,
    eq,
    refs_exactly,
)
from ...draw import deal, human_date, who
from ...facts import (
    Appointment,
    Slot,
    instant,
)
from ...solve import read, search, update
from ._appointments_common import (
    MARGIN,
    _doctor_params,
    _find_doctor,
    _find_patient,
    _free,
    _id,
    _participants,
    _patient_appointments,
    _patient_params,
    _pick_patient,
    _slot_at,
    _slot_to,
    _upcoming,
    _usable_doctors,
    _when,
    _with,
    _World,
    _world,
    _z,
)


def _next_monday(now: datetime) -> tuple[date, str]:
    """The Monday a clerk means by "next Monday" at ``now``, and how to say it without ambiguity."""
    ahead = (7 - now.weekday()) % 7 or 7
    phrase = "this coming Monday" if now.weekday() >= 5 else "next Monday"
    return now.date() + timedelta(days=ahead), phrase


def _movable(w: _World, now: datetime) -> list[Appointment]:
    """Upcoming routine bookings of promptable patients with promptable doctors, clear of now."""
    clear: dict[str, bool] = {}
    out = []
    for a in w.movable:
        if a.at and a.at > now + MARGIN and a.patient:
            if a.patient not in clear:
                clear[a.patient] = _upcoming(w, a.patient, now) is not None
            if clear[a.patient]:
                out.append(a)
    return out


def _stage_booking(view: View, params: dict) -> list[dict]:
    """The setup of a staged booking: a booked follow-up of the params' patient with their doctor in the free
    slot ``staged_slot`` (id ``appointment_id``), and that slot made busy."""
    slot = view.read("Slot", params["staged_slot"])
    sched = view.read("Schedule", params["doc_schedule"])
    assert slot is not None and sched is not None and slot["status"] == "free"
    doc = _world(view).doctors[params["doc_id"]]
    appt = {"resourceType": "Appointment", "id": params["appointment_id"], "status": "booked",
            "serviceCategory": sched["serviceCategory"], "serviceType": sched["serviceType"],
            "specialty": sched["specialty"],
            "appointmentType": {"coding": [{"system": APPOINTMENT_TYPE, "code": "FOLLOWUP",
                                            "display": "A follow up visit from a previous appointment"}]},
            "description": f"{doc['specialty']} follow-up", "start": slot["start"], "end": slot["end"],
            "minutesDuration": 30, "slot": [{"reference": f"Slot/{slot['id']}"}],
            "created": (view.now.date() - timedelta(days=7)).isoformat(),
            "participant": [
                {"actor": {"reference": f"Patient/{params['patient_id']}", "display": params["name"]},
                 "required": "required", "status": "accepted"},
                {"type": [{"coding": [{"system": PARTICIPATION_TYPE, "code": "PPRF",
                                       "display": "primary performer"}]}],
                 "actor": {"reference": f"Practitioner/{doc['id']}", "display": doc["name"]},
                 "required": "required", "status": "accepted"}]}
    return [appt, {**slot, "status": "busy"}]


@register("scheduling.reschedule_next_monday", difficulty=3, writes=True, touches=("Appointment", "Slot"),
          sequences=(("searchResources", "updateResource", "updateResource", "updateResource"),))
class RescheduleNextMonday(Family):
    """Reschedule an appointment to next Monday, same doctor and time

    Weekday arithmetic from the clock ("next Monday"; on a weekend, "this coming Monday"), the same time
    of day, three coordinated updates."""


    @staticmethod
    def _target(w: _World, schedule: str, start: str, now: datetime) -> Slot | None:
        monday, _ = _next_monday(now)
        moment = _z(datetime.combine(monday, instant(start).time(), tzinfo=UTC))
        return next((s for s in w.at.get(moment, []) if s.schedule == schedule), None)

    def _fits(self, w: _World, schedule: str, start: str, patient: str, now: datetime) -> bool:
        monday = _next_monday(now)[0].isoformat()
        new = self._target(w, schedule, start, now)
        return (new is not None and new.status == "free" and not new.urgent and start[:10] != monday
                and monday not in w.holding_days[patient])

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        phrase = _next_monday(view.now)[1]
        options = [a for a in _movable(w, view.now) if a.practitioner and a.patient and a.start
                   and self._fits(w, w.doctors[a.practitioner]["schedule"], a.start, a.patient, view.now)]
        if len(options) < 4:  # too few to vary the gold (the smallest worlds, late in the week)
            return self._staged(w, view, rng)
        a = deal(view, options)  # by seed: no option is the gold of many seeds
        assert a.patient and a.practitioner and a.start
        return {**_patient_params(w.patients[a.patient]), **_doctor_params(w.doctors[a.practitioner]),
                "appointment_id": a.id, "day": a.start[:10], "monday_phrase": phrase}

    def _staged(self, w: _World, view: View, rng: random.Random) -> dict | None:
        """Too few bookings of the world fit this clock: stage one, in a
        free slot of a doctor whose same-time slot next Monday is free, for a patient free on both days."""
        monday, phrase = _next_monday(view.now)
        d = rng.choice(_usable_doctors(w))
        hi = _z(view.now + timedelta(days=14))
        olds = []
        for s in _free(w, d["schedule"], _z(view.now + 2 * MARGIN)):
            if s.start > hi:
                break
            new = self._target(w, d["schedule"], s.start, view.now)
            if s.start[:10] != monday.isoformat() and new and new.status == "free" and not new.urgent:
                olds.append(s)
        if not olds:
            return None
        old = rng.choice(olds)
        days = {old.start[:10], monday.isoformat()}
        p = _pick_patient(w, rng, lambda p: not days & w.holding_days[p["id"]], d, view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": view.new_id(f"appointment-{old.id}"),
                "staged_slot": old.id, "day": old.start[:10], "monday_phrase": phrase}

    def setup(self, view: View, params: dict) -> list[dict]:
        return _stage_booking(view, params) if "staged_slot" in params else []

    def prompt(self, params: dict) -> str:
        day = date.fromisoformat(params["day"])
        return (f"{who(params['name'], params['birth'])} wants to move their appointment with {params['doc']} on "
                f"{day.strftime('%A')}, {human_date(day)} to {params['monday_phrase']}, same doctor, same "
                "time of day. Please update the existing appointment (do not create a new one): point it at "
                "the new slot and set its start and end to the new slot's, leaving the rest as it is. Set "
                "the old slot's status back to free and the new slot's status to busy.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        if "staged_slot" in params:  # the cached facts are the world's; the staged booking is in params
            old_id = params["staged_slot"]
        else:
            old_id = w.appts[params["appointment_id"]].slot or ""
        old = w.slot_by_id[old_id]
        new = self._target(w, params["doc_schedule"], old.start, view.now)
        assert new is not None and new.status == "free"
        checks = (eq("status", "booked"), refs_exactly("slot", [f"Slot/{new.id}"]), at("start", new.start),
                  at("end", new.end), _participants(None, None, False))
        return Gold(expects=[Expect("update", "Appointment", id=params["appointment_id"], checks=checks),
                             _slot_to(old.id, "free"), _slot_to(new.id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        entry = next(a for a in _with(_patient_appointments(tools, patient, "booked", now), prac)
                     if a["start"][:10] == params["day"])
        appt = read(tools, "Appointment", entry["id"])
        monday, _ = _next_monday(now)
        new = _slot_at(tools, sched, _z(datetime.combine(monday, instant(appt["start"]).time(), tzinfo=UTC)))
        old_id = _id(appt["slot"][0], "Slot") or ""
        appt.update(slot=[{"reference": f"Slot/{new['id']}"}], start=new["start"], end=new["end"])
        update(tools, appt)
        update(tools, {**read(tools, "Slot", old_id), "status": "free"})
        update(tools, {**new, "status": "busy"})
        return f"Moved the appointment to {new['start']}."


@register("scheduling.reschedule_other_provider", difficulty=3, writes=True, touches=("Appointment", "Slot"),
          sequences=(("searchResources", "updateResource", "updateResource", "updateResource"),))
class RescheduleOtherProvider(Family):
    """Move an appointment to another same-specialty doctor free at the same time

    Find the one other doctor of the same specialty free at that exact instant, then swap practitioner
    and slot on the existing appointment and flip both slots."""


    @staticmethod
    def _alternatives(w: _World, slot: Slot) -> list[Slot]:
        """Free slots (any kind) of other doctors of the slot's specialty at the same instant."""
        return [s for s in w.at.get(slot.start, []) if s.schedule != slot.schedule and s.status == "free"
                and s.end == slot.end and w.sched_code[s.schedule] == w.sched_code[slot.schedule]]

    def _options(self, view: View) -> list[Slot]:
        """Free routine slots of the next two weeks beside exactly one free routine same-specialty slot: each
        can hold the staged booking (the world's own bookings with one alternative are too few to vary)."""
        def compute() -> list[Slot]:
            w = _world(view)
            lo, hi = _z(view.now + 2 * MARGIN), _z(view.now + timedelta(days=14))
            return [s for d in _usable_doctors(w) for s in _free(w, d["schedule"], lo) if s.start <= hi
                    and len(alt := self._alternatives(w, s)) == 1 and not alt[0].urgent]
        return view.cached(f"reschedule_other_options|{view.now.isoformat()}", compute)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        slot = deal(view, self._options(view))  # by seed: no slot is the gold of many seeds
        if slot is None:
            return None
        d = w.doctors[w.by_schedule[slot.schedule]]
        p = _pick_patient(w, rng, lambda p: slot.start[:10] not in w.holding_days[p["id"]], d, view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": view.new_id(f"appointment-{slot.id}"),
                "staged_slot": slot.id, "at": slot.start, "specialty": d["specialty"]}

    def setup(self, view: View, params: dict) -> list[dict]:
        return _stage_booking(view, params)

    def prompt(self, params: dict) -> str:
        return (f"{params['doc']} cannot see {who(params['name'], params['birth'])} on {_when(params['at'])} after all. Please "
                f"move the appointment to the other {params['specialty']} doctor who has a free slot at "
                "exactly that time. Update the existing appointment (do not create a new one): point it at "
                f"the new doctor's slot and replace {params['doc']} with the new doctor as the practitioner "
                "participant (status accepted); the time stays the same. Set the old slot's status back to "
                "free and the new slot's status to busy.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)  # the cached facts are the world's; the staged booking is in params
        old = w.slot_by_id[params["staged_slot"]]
        alt = self._alternatives(w, old)
        assert len(alt) == 1
        new_doc = w.by_schedule[alt[0].schedule]
        checks = (eq("status", "booked"), refs_exactly("slot", [f"Slot/{alt[0].id}"]),
                  _participants(f"Patient/{params['patient_id']}", f"Practitioner/{new_doc}", True))
        return Gold(expects=[Expect("update", "Appointment", id=params["appointment_id"], checks=checks),
                             _slot_to(old.id, "free"), _slot_to(alt[0].id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        entry = next(a for a in _with(_patient_appointments(tools, patient, "booked", now), prac)
                     if a["start"] == params["at"])
        appt = read(tools, "Appointment", entry["id"])
        old_id = _id(appt["slot"][0], "Slot") or ""
        end = _z(instant(params["at"]) + timedelta(minutes=1))
        candidates = search(tools, "Slot", {"specialty": appt["specialty"][0]["coding"][0]["code"],
                                             "status": "free", "start": [f"ge{params['at']}", f"lt{end}"]})
        new = read(tools, "Slot", next(s["id"] for s in candidates
                                        if _id(s["schedule"], "Schedule") != sched))
        schedule = read(tools, "Schedule", _id(new["schedule"], "Schedule") or "")
        new_prac = next(i for a in schedule["actor"] if (i := _id(a, "Practitioner")))
        for p in appt["participant"]:
            if _id(p.get("actor"), "Practitioner") == prac:
                p["actor"] = {"reference": f"Practitioner/{new_prac}"}
                p["status"] = "accepted"
        appt["slot"] = [{"reference": f"Slot/{new['id']}"}]
        update(tools, appt)
        update(tools, {**read(tools, "Slot", old_id), "status": "free"})
        update(tools, {**new, "status": "busy"})
        return f"Moved the appointment to Dr. (Practitioner/{new_prac}) at the same time."
