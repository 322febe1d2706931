"""The waitlist: add a patient, book one from it into a slot, remove one."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta

from ....spec.codes import SNOMED
from ....tools import Toolbox
from ... import Expect, Family, Gold, View, register
from ...checks import (
    Check,
    absent,
    coded,
    eq,
    may_set,
    on_day,
    ref,
)
from ...draw import deal, human_date, who
from ...facts import (
    Appointment,
    Slot,
    instant,
)
from ...solve import call, read, update
from ._appointments_common import (
    _booked,
    _doctor_params,
    _find_doctor,
    _find_patient,
    _first_free,
    _free,
    _participants,
    _patient_appointments,
    _patient_params,
    _pick_patient,
    _slot_to,
    _usable_doctors,
    _with,
    _World,
    _world,
    _z,
)

SOON = timedelta(minutes=15)  # a free slot starting sooner than this is not clearly "still ahead"


def _draw_waitlisted(view: View, w: _World, options: list[Appointment]) -> dict | None:
    """One of the waitlist appointments ``options``, dealt by seed (no option is the gold of many seeds)."""
    if not options:
        return None
    a = deal(view, options)
    assert a.patient is not None and a.practitioner is not None
    return {**_patient_params(w.patients[a.patient]), **_doctor_params(w.doctors[a.practitioner]),
            "appointment_id": a.id}


def _duration_ok() -> Check:
    """``minutesDuration`` may be added to a booking made from a waitlist entry, if it is the slot's 30."""
    def fn(after: dict, before: dict | None) -> str | None:
        got = after.get("minutesDuration")
        return None if got in (None, 30) or got == (before or {}).get("minutesDuration") else (
            f"minutesDuration is {got}, the slot lasts 30 minutes")
    return Check("minutesDuration", "minutesDuration absent or 30", fn, light=False)


def _waitlisted(w: _World) -> list[Appointment]:
    """Every waitlist entry of a promptable patient and doctor, the patient's only one with that doctor."""
    out = []
    for a in w.appts.values():
        if a.status == "waitlist" and a.patient in w.patients and a.practitioner in w.doctors and a.requested:
            same = [b for b in w.by_patient[a.patient] if b.status == "waitlist" and b.practitioner == a.practitioner]
            if len(same) == 1:
                out.append(a)
    return sorted(out, key=lambda a: a.id)


@register("scheduling.add_to_waitlist", difficulty=2, writes=True, touches=("Patient", "Appointment"),
          sequences=(("searchResources", "createResource"),))
class AddToWaitlist(Family):
    """Put a patient on a doctor's (or a specialty's) waitlist for a date window

    A new waitlist Appointment (status, requestedPeriod, participants, no slot), for a named doctor or,
    in about a third of the instances, for a specialty with no doctor yet."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        doc = rng.choice(_usable_doctors(w))
        by_specialty = rng.random() < 0.35
        def free_of(p: dict) -> bool:  # not on a waitlist this request would duplicate
            return not any(a.status == "waitlist" and (by_specialty or a.practitioner == doc["id"])
                           for a in w.by_patient[p["id"]])

        p = _pick_patient(w, rng, free_of, doc, view.now.date())
        if p is None:
            return None
        start = view.now.date() + timedelta(days=rng.randint(3, 10))
        end = start + timedelta(days=rng.randint(7, 21))
        who = ({"specialty": doc["specialty"], "specialty_code": doc["code"]} if by_specialty
               else _doctor_params(doc))
        return {**_patient_params(p), **who, "start": start.isoformat(), "end": end.isoformat()}

    def prompt(self, params: dict) -> str:
        period = (f"they can come any day from {human_date(params['start'])} to {human_date(params['end'])}. "
                  f"Record it as an Appointment with status waitlist, a requested period from "
                  f"{params['start']} to {params['end']}, ")
        tail = "No slot has been chosen yet, so give it no slot, start or end."
        if "specialty" in params:
            return (f"Please put {who(params['name'], params['birth'])} on the waitlist for a {params['specialty']} appointment "
                    f"with whichever of our {params['specialty']} doctors frees up first; {period}the "
                    f"specialty SNOMED CT {params['specialty_code']} ({params['specialty']}), and the "
                    f"patient as the only participant (no doctor yet). {tail}")
        return (f"Please put {who(params['name'], params['birth'])} on the waitlist for {params['doc']}; {period}and the patient and "
                f"the doctor as participants. {tail}")

    def gold(self, view: View, params: dict) -> Gold:
        patient = f"Patient/{params['patient_id']}"
        if "specialty" in params:
            who: tuple[Check, ...] = (coded("specialty", SNOMED, params["specialty_code"]),
                                      _participants(patient, None, False, new=True))
        else:
            who = (_participants(patient, f"Practitioner/{params['doc_id']}", False, new=True),)
        return Gold(expects=[Expect("create", "Appointment", checks=(
            eq("status", "waitlist"), on_day("requestedPeriod.start", params["start"]),
            on_day("requestedPeriod.end", params["end"]), ref("participant.actor", patient, extras=True), *who,
            absent("slot", "start", "end")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        body: dict = {"resourceType": "Appointment", "status": "waitlist",
                      "requestedPeriod": [{"start": params["start"], "end": params["end"]}],
                      "participant": [{"actor": {"reference": f"Patient/{patient}"}, "status": "accepted"}]}
        if "specialty" in params:
            body["specialty"] = [{"coding": [{"system": SNOMED, "code": params["specialty_code"]}],
                                  "text": params["specialty"]}]
        else:
            prac, _ = _find_doctor(tools, params)
            body["participant"].append({"actor": {"reference": f"Practitioner/{prac}"},
                                        "status": "needs-action"})
        call(tools, "createResource", {"resourceType": "Appointment", "body": body})
        return "Added the patient to the waitlist."


def _window_slot(w: _World, a: Appointment, now: datetime) -> Slot | None:
    """The doctor's earliest free routine slot inside the entry's requested period, after now, on a day the
    patient holds no other booking; None when that answer would sit on a boundary (within minutes of now,
    or on/after the period's last day, whose inclusion a reader may doubt)."""
    if a.requested is None or a.practitioner not in w.doctors or a.patient is None:
        return None
    first, last = a.requested
    taken = w.holding_days[a.patient]
    for s in _free(w, w.doctors[a.practitioner]["schedule"], max(_z(now), first + "T00:00:00Z")):
        if s.start[:10] >= last or instant(s.start) - now < SOON:
            return None
        if s.start[:10] not in taken:
            return s
    return None


@register("scheduling.waitlist_to_slot", difficulty=3, writes=True, touches=("Appointment", "Slot"),
          sequences=(("searchResources", "updateResource", "updateResource"),))
class WaitlistToSlot(Family):
    """Move a waitlisted patient into the earliest free slot inside the requested window

    Window arithmetic (requested period, after now, a day without another booking), the earliest free
    routine slot, and an update of the waitlist entry itself into a booking."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        return _draw_waitlisted(view, w, [a for a in _waitlisted(w) if _window_slot(w, a, view.now)])

    def prompt(self, params: dict) -> str:
        return (f"{who(params['name'], params['birth'])} is on the waitlist for {params['doc']}. Please book them into the "
                "doctor's earliest free slot that lies within the period they asked for, is still ahead of "
                "us and falls on a day when they have no other booked appointment (a regular slot, not one "
                "reserved for urgent visits). Turn the waitlist appointment itself into the booking: status "
                "booked, a reference to the slot, the slot's start and end, both participants with status "
                "accepted, the rest left as it is. Then set that Slot's status to busy.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        slot = _window_slot(w, w.appts[params["appointment_id"]], view.now)
        assert slot is not None
        checks = (*_booked(slot, params["patient_id"], params["doc_id"]), _duration_ok())
        return Gold(expects=[Expect("update", "Appointment", id=params["appointment_id"], checks=checks),
                             _slot_to(slot.id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        entry = _with(_patient_appointments(tools, patient, "waitlist", None), prac)[0]
        appt = read(tools, "Appointment", entry["id"])
        period = appt["requestedPeriod"][0]
        lo = max(_z(now), period["start"][:10] + "T00:00:00Z")
        hi = (date.fromisoformat(period["end"][:10]) + timedelta(days=1)).isoformat()
        taken = frozenset(a["start"][:10] for a in _patient_appointments(tools, patient, "booked", None))
        found = _first_free(tools, sched, lo, hi, taken)
        assert found is not None
        slot = read(tools, "Slot", found["id"])
        appt.update(status="booked", slot=[{"reference": f"Slot/{slot['id']}"}], start=slot["start"],
                    end=slot["end"])
        for p in appt["participant"]:
            p["status"] = "accepted"
        update(tools, appt)
        update(tools, {**slot, "status": "busy"})
        return f"Booked the waitlisted appointment into the slot at {slot['start']}."


@register("scheduling.remove_from_waitlist", difficulty=2, writes=True, touches=("Appointment",),
          sequences=(("searchResources", "updateResource"),))
class RemoveFromWaitlist(Family):
    """Take a patient off a doctor's waitlist (status cancelled)

    Find the waitlist entry (not the patient's booked appointments) and cancel it rather than delete it."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        return _draw_waitlisted(view, w, _waitlisted(w))

    def prompt(self, params: dict) -> str:
        return (f"{who(params['name'], params['birth'])} no longer needs to be on the waitlist for {params['doc']}. Please take "
                "them off it by setting that waitlist appointment's status to cancelled (do not delete it, "
                "and leave the rest of it as it is).")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(expects=[Expect("update", "Appointment", id=params["appointment_id"], checks=(
            eq("status", "cancelled"), _participants(None, None, False), may_set("cancelationReason")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, _ = _find_doctor(tools, params)
        entry = _with(_patient_appointments(tools, patient, "waitlist", None), prac)[0]
        appt = read(tools, "Appointment", entry["id"])
        appt["status"] = "cancelled"
        update(tools, appt)
        return "Took the patient off the waitlist."
