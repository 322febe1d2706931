"""Who booked a slot: a doctor's or a clinic's appointment at a stated time."""

from __future__ import annotations

import random
from datetime import datetime

from ....tools import Toolbox
from ... import NOT_FOUND, AnswerSpec, Family, Field, Gold, View, answer_text, register
from ...checks import ref_id
from ...draw import deal, deal_by_gold, negative_seed
from ...facts import (
    full_name,
    instant,
)
from ._scheduling_common import (
    _Appt,
    _doc_of,
    _doctor_text,
    _Facts,
    _facts,
    _iso,
    _label,
    _long_date,
    _search,
)

HOLDING = frozenset({"booked", "arrived", "fulfilled", "noshow", "checked-in"})


def _booking_params(view: View, rng: random.Random, f: _Facts, by_clinic: bool) -> dict | None:
    """A future appointment time of one doctor (or one specialty at one clinic): usually a booked one, on
    negative seeds a time nobody holds (answer: nothing found): a cancelled booking's, else a free slot's."""
    future = [a for a in f.appts if a.start > view.now and a.practitioner]
    cancelled = negative_seed(view)
    pool = [a for a in future if (a.status == "cancelled") == cancelled and (cancelled or a.status in HOLDING)]
    if cancelled and (not pool or rng.random() < 0.5):
        doc = rng.choice(f.docs)
        free = [s for s in f.slots.get(doc.schedule, []) if s.status == "free" and s.at > view.now]
        pool = [_Appt("", "free", s.at, "", doc.pid, doc.location, doc.specialty) for s in free[:200]]
    if not pool:
        return None
    # by seed: no patient (the gold) holds the booking of many seeds, however many bookings each one holds
    appt = deal(view, pool) if cancelled else deal_by_gold(view, rng, [(a.patient, a) for a in pool])
    docs = [d for d in f.docs if d.pid == appt.practitioner and d.location == appt.location]
    if len(docs) != 1:
        return None
    doc = docs[0]
    params: dict = {"day": appt.start.date().isoformat(), "time": appt.start.strftime("%H:%M"),
                    "start": _iso(appt.start)}
    if by_clinic:
        params |= {"clinic": doc.location_name, "specialty": doc.spec}
    else:
        params |= _label(f, doc)
    holders = _holders(f, params)
    if len(holders) > 1 or (cancelled and holders):
        return None
    return params


def _holders(f: _Facts, params: dict) -> set[str]:
    """Patients holding the appointment the prompt describes (at most one in a consistent world)."""
    start = instant(params["start"])
    if params.get("doctor"):
        doc = _doc_of(f, params)
        match = [a for a in f.appts if a.practitioner == doc.pid and a.location == doc.location]
    else:
        locs = {d.location for d in f.docs if d.location_name == params["clinic"]}
        match = [a for a in f.appts if a.location in locs and a.specialty.lower() == params["specialty"]]
    return {a.patient for a in match if a.start == start and a.status in HOLDING}


def _booking_answer(tools: Toolbox, query: dict) -> str:
    found = _search(tools, "Appointment", {**query, "_elements": "status,participant"})
    patients = {ref_id(p["actor"]) for a in found.get("resources", []) if a["status"] in HOLDING
                for p in a["participant"] if str(p.get("actor", {}).get("reference", "")).startswith("Patient/")}
    if not patients:
        return answer_text(NOT_FOUND)
    (pid,) = patients
    return answer_text({"patient_id": pid})


BOOKING_ANSWER = AnswerSpec((Field("patient_id", "id", "the Patient resource id"),), none_allowed=True)


@register("scheduling.who_booked_doctor_slot", difficulty=2, touches=("Appointment",),
          sequences=(("searchResources",),))
class WhoBookedDoctorSlot(Family):
    """Which patient holds a named doctor's appointment at a given time

    Cancelled bookings keep their slot reference and an entered-in-error duplicate exists: status matters."""

    answer = BOOKING_ANSWER

    def sample(self, view: View, rng: random.Random) -> dict | None:
        return _booking_params(view, rng, _facts(view), by_clinic=False)

    def prompt(self, params: dict) -> str:
        return (f"Which patient is currently booked with {_doctor_text(params)} on {_long_date(params['day'])} at "
                f"{params['time']}? Cancelled appointments don't count. Give me the patient's record id.")

    def gold(self, view: View, params: dict) -> Gold:
        holders = _holders(_facts(view), params)
        return Gold(answer={"patient_id": holders.pop()} if holders else NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        given, family = params["doctor"].split()[0], params["doctor"].split()[-1]
        pids = []
        for p in _search(tools, "Practitioner", {"given": given, "family": family,
                                                 "_elements": "name,address"}).get("resources", []):
            if full_name(p) != params["doctor"]:
                continue
            if params.get("doctor_city") and not any(a.get("city") == params["doctor_city"] for a in p.get("address", [])):
                continue
            if params.get("doctor_specialty"):
                scheds = _search(tools, "Schedule", {"actor": f"Practitioner/{p['id']}", "active": "true",
                                                     "specialty:text": params["doctor_specialty"], "_elements": "id"})
                if not scheds.get("resources"):
                    continue
            pids.append(p["id"])
        (pid,) = pids
        return _booking_answer(tools, {"practitioner": f"Practitioner/{pid}", "date": params["start"]})


@register("scheduling.who_booked_clinic_slot", difficulty=2, touches=("Appointment",),
          sequences=(("searchResources",),))
class WhoBookedClinicSlot(Family):
    """Which patient holds a specialty's appointment at a clinic at a given time

    No doctor is named: the clinic (a Location) and the specialty narrow the appointments at that time."""

    answer = BOOKING_ANSWER

    def sample(self, view: View, rng: random.Random) -> dict | None:
        return _booking_params(view, rng, _facts(view), by_clinic=True)

    def prompt(self, params: dict) -> str:
        return (f"Which patient is currently booked for the {params['specialty']} appointment at {params['clinic']} "
                f"on {_long_date(params['day'])} at {params['time']}? Cancelled appointments don't count. Give me the "
                "patient's record id.")

    def gold(self, view: View, params: dict) -> Gold:
        holders = _holders(_facts(view), params)
        return Gold(answer={"patient_id": holders.pop()} if holders else NOT_FOUND)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        locs = [loc for loc in _search(tools, "Location", {"name": params["clinic"], "_elements": "name"})["resources"]
                if loc.get("name") == params["clinic"]]
        (loc,) = locs
        return _booking_answer(tools, {"location": f"Location/{loc['id']}", "date": params["start"],
                                       "specialty:text": params["specialty"]})
