"""Scheduling & appointments, the writing half (FHIR-AgentEval): book, cancel, waitlist and reschedule.

Every family here changes an Appointment and, when a slot is taken or given back, its Slot, in the shapes
each prompt states (booked, cancelled, waitlist; rescheduling updates the existing Appointment). The
world's traps (same-name doctors, simultaneous free slots of other doctors, urgent slots, an
entered-in-error duplicate, stale bookings, any clock) are what the families test; gold comes from world
facts cached per world file, and two reschedule families stage one booking of their own
(docs/TASKS.md, "The built-in library").
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TypeVar

from ...spec.codes import APPOINTMENT_TYPE, CANCELLATION_REASON, PARTICIPATION_TYPE, SNOMED
from ...tools import Toolbox
from .. import Expect, Family, Gold, View, register
from ..checks import Check, absent, at, coded, custom, eq, may_set, on_day, ref, ref_id, ref_key, refs_exactly
from ..draw import deal, human_date, who
from ..facts import (
    Appointment,
    Slot,
    active_schedules,
    appointments,
    full_name,
    identifiable_patients,
    instant,
    official_name,
    practitioners,
    slots,
)
from ..solve import call, create, read, search, update

T = TypeVar("T")
PEDIATRICS, GENERAL, OBGYN = "394537008", "394814009", "394585009"  # SNOMED specialty codes
HOLDING = frozenset({"booked", "arrived", "fulfilled", "noshow", "checked-in"})
#: Cancellation reasons a caller would give (code, display).
PATIENT_REASONS = (("pat-fb", "Patient: Feeling Better"), ("pat-lt", "Patient: Lack of Transportation"),
                   ("pat-cpp", "Patient: Canceled via Patient Portal"))
MARGIN = timedelta(hours=1)  # no booking a task hinges on lies within an hour of now
SOON = timedelta(minutes=15)  # a free slot starting sooner than this is not clearly "still ahead"

BOOKED_SHAPE = ("Record it as an Appointment with status booked that references the slot, with the "
                "slot's start and end, and with the patient and the doctor as participants, both with "
                "status accepted; then set that Slot's status to busy (leave the rest of the slot as it is).")
FREE_SHAPE = ("set the appointment's status to cancelled (leave the rest of it as it is) and set its "
              "slot's status back to free")


# -- world facts (cached per world file) -----------------------------------------------------------------

@dataclass
class _World:
    doctors: dict[str, dict] = field(default_factory=dict)  # practitioner id -> facts (promptable ones)
    by_schedule: dict[str, str] = field(default_factory=dict)  # schedule id -> practitioner id (all)
    sched_code: dict[str, str] = field(default_factory=dict)  # schedule id -> SNOMED specialty code
    slots: dict[str, list[Slot]] = field(default_factory=dict)  # schedule id -> its slots by start
    starts: dict[str, list[str]] = field(default_factory=dict)  # schedule id -> their starts (bisect)
    at: dict[str, list[Slot]] = field(default_factory=dict)  # start -> every slot starting then
    slot_by_id: dict[str, Slot] = field(default_factory=dict)
    appts: dict[str, Appointment] = field(default_factory=dict)
    by_patient: dict[str, list[Appointment]] = field(default_factory=lambda: defaultdict(list))
    booked: dict[str, list[Appointment]] = field(default_factory=dict)  # patient -> booked, by start
    patients: dict[str, dict] = field(default_factory=dict)  # promptable patients: id -> name, birth ...
    holding_days: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    rivalled: set[str] = field(default_factory=set)  # free slots beside a same-time free slot of a rival
    movable: list[Appointment] = field(default_factory=list)  # booked routine visits, promptable people


def _z(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _id(reference: object, rtype: str) -> str | None:
    return ref_id(reference, rtype) or None


def _urgent(resource: dict) -> bool:
    codings = (resource.get("appointmentType") or {}).get("coding", [])
    return any(c.get("code") == "EMERGENCY" for c in codings)


def _build_doctors(view: View, w: _World) -> None:
    scheds = active_schedules(view)
    pracs = practitioners(view)
    by_name: dict[tuple[str, str], list[str]] = defaultdict(list)
    for p in pracs.values():
        n = official_name(p)
        by_name[((n.get("given") or [""])[0].casefold(), n.get("family", "").casefold())].append(p["id"])
    facts: dict[str, dict] = {}
    for s in scheds:
        pid = next((i for a in s.get("actor", []) if (i := _id(a, "Practitioner"))), None)
        if pid is None or pid not in pracs or not pracs[pid].get("active", True):
            continue
        n = official_name(pracs[pid])
        given, family = (n.get("given") or [""])[0], n.get("family", "")
        facts[pid] = {"id": pid, "given": given, "family": family, "name": f"Dr. {given} {family}",
                      "specialty": s["specialty"][0]["text"], "code": s["specialty"][0]["coding"][0]["code"],
                      "city": ((pracs[pid].get("address") or [{}])[0]).get("city", ""), "schedule": s["id"]}
    for pid, d in facts.items():
        others = [o for o in by_name[(d["given"].casefold(), d["family"].casefold())] if o != pid]
        scheduled = all(o in facts for o in others)
        if not others:
            d["label"], d["hint"] = d["name"], {}
        elif scheduled and all(facts[o]["specialty"] != d["specialty"] for o in others):
            d["label"], d["hint"] = f"{d['name']} ({d['specialty']})", {"specialty": d["specialty"]}
        elif scheduled and d["city"] and all(facts[o]["city"] != d["city"] for o in others):
            d["label"], d["hint"] = f"{d['name']} in {d['city']}", {"city": d["city"]}
        else:
            continue  # a name no prompt could make unique: never sampled
        w.doctors[pid] = d
    w.by_schedule = {d["schedule"]: pid for pid, d in facts.items()}
    w.sched_code = {d["schedule"]: d["code"] for d in facts.values()}


def _build_slots(view: View, w: _World) -> None:
    for slot in slots(view):
        if slot.schedule not in w.by_schedule:
            continue
        w.slots.setdefault(slot.schedule, []).append(slot)
        w.at.setdefault(slot.start, []).append(slot)
        w.slot_by_id[slot.id] = slot
    for sched, items in w.slots.items():
        items.sort(key=lambda x: x.start)
        w.starts[sched] = [x.start for x in items]
    name = {d["schedule"]: d["name"] for d in w.doctors.values()}

    def rivals(a: Slot, b: Slot) -> bool:  # b's doctor could be mistaken for a's
        same_name = a.schedule in name and name.get(b.schedule) == name[a.schedule]
        same_specialty = w.sched_code[b.schedule] == w.sched_code[a.schedule]
        return b.schedule != a.schedule and (same_specialty or same_name)

    for same in w.at.values():
        free = [s for s in same if s.status == "free"]
        w.rivalled.update(s.id for s in free if not s.urgent and any(rivals(s, o) for o in free))


def _build_people(view: View, w: _World) -> None:
    for p in identifiable_patients(view):
        n = official_name(p)
        w.patients[p["id"]] = {"id": p["id"], "name": full_name(p), "given": (n.get("given") or [""])[0],
                               "family": n.get("family", ""), "birth": p["birthDate"],
                               "gender": p.get("gender")}
    for appt in appointments(view):
        w.appts[appt.id] = appt
        if appt.patient:
            w.by_patient[appt.patient].append(appt)
            if appt.status in HOLDING and appt.start:
                w.holding_days[appt.patient].add(appt.start[:10])
    for pid, items in w.by_patient.items():
        w.booked[pid] = sorted((a for a in items if a.status == "booked" and a.at),
                               key=lambda a: a.start or "")
        w.movable += [a for a in w.booked[pid] if pid in w.patients and a.practitioner in w.doctors and a.routine
                      and a.slot in w.slot_by_id]
    w.movable.sort(key=lambda a: (a.patient or "", a.start or ""))


def _build(view: View) -> _World:
    w = _World()
    _build_doctors(view, w)
    _build_slots(view, w)
    _build_people(view, w)
    return w


def _world(view: View) -> _World:
    return view.cached("appt_world", lambda: _build(view))


def _upcoming(w: _World, pid: str, now: datetime) -> list[Appointment] | None:
    """The patient's booked appointments after now, by start; None if one is too close to now to be clear."""
    booked = w.booked.get(pid, [])
    if any(abs(a.at - now) <= MARGIN for a in booked if a.at):
        return None
    return [a for a in booked if a.at and a.at > now]


def _free(w: _World, sched: str, after: str) -> Iterator[Slot]:
    """The schedule's free routine slots starting at or after ``after``, by start."""
    items = w.slots.get(sched, [])
    for s in items[bisect_left(w.starts.get(sched, []), after):]:
        if s.status == "free" and not s.urgent:
            yield s


def _patient_params(p: dict) -> dict:
    return {"patient_id": p["id"], "name": p["name"], "given": p["given"], "family": p["family"],
            "birth": p["birth"]}


def _doctor_params(d: dict) -> dict:
    return {"doc_id": d["id"], "doc": d["label"], "doc_given": d["given"], "doc_family": d["family"],
            "doc_hint": d["hint"], "doc_schedule": d["schedule"]}


def _when(start: str) -> str:
    t = instant(start)
    return f"{t.strftime('%A')}, {human_date(t.date())} at {t.strftime('%H:%M')}"


def _next_monday(now: datetime) -> tuple[date, str]:
    """The Monday a clerk means by "next Monday" at ``now``, and how to say it without ambiguity."""
    ahead = (7 - now.weekday()) % 7 or 7
    phrase = "this coming Monday" if now.weekday() >= 5 else "next Monday"
    return now.date() + timedelta(days=ahead), phrase


def _suits(doc: dict, p: dict, today: date) -> bool:
    """A plausible patient for this doctor: children see paediatricians, adults GPs, women gynaecologists."""
    birth = date.fromisoformat(p["birth"])
    child = (today.year - birth.year - ((today.month, today.day) < (birth.month, birth.day))) < 18
    if doc["code"] == PEDIATRICS:
        return child
    if doc["code"] == GENERAL:
        return not child
    if doc["code"] == OBGYN:
        return not child and p.get("gender") == "female"
    return True


def _pick_patient(w: _World, rng: random.Random, fits: Callable[[dict], bool], doc: dict | None = None,
                  today: date | None = None) -> dict | None:
    ids = sorted(w.patients)
    for _ in range(8):
        p = w.patients[ids[rng.randrange(len(ids))]]
        if fits(p) and (doc is None or today is None or _suits(doc, p, today)):
            return p
    return None


def _prefer(view: View, options: list[tuple[T, int]]) -> T | None:
    """An option whose patient has other upcoming appointments too (the distractors) if there are enough of
    them to vary the gold, else any option; dealt by seed (no option is the gold of many seeds)."""
    rich = [o for o, n in options if n >= 2]
    return deal(view, rich if len(rich) >= 4 else [o for o, _ in options])


def _usable_doctors(w: _World) -> list[dict]:
    return [w.doctors[k] for k in sorted(w.doctors)]


# -- checks ----------------------------------------------------------------------------------------------

def _refs_of(resource: dict, rtype: str) -> set[str]:
    out = set()
    for p in resource.get("participant", []) or []:
        key = ref_key(p.get("actor")) if isinstance(p, dict) else None
        if key and key.startswith(rtype + "/"):
            out.add(key)
    return out


def _participants(patient: str | None, practitioner: str | None, accepted: bool, new: bool = False) -> Check:
    """Patient and Practitioner participants are exactly these (None: as before the change, i.e. none for
    a ``new`` resource); ``accepted``: both with status accepted. Other participants (the location) and
    other statuses are left free."""
    def fn(after: dict, before: dict | None) -> str | None:
        problems = []
        for rtype, want in (("Patient", patient), ("Practitioner", practitioner)):
            expected = {want} if want else _refs_of(before or {}, rtype)
            got = _refs_of(after, rtype)
            if got != expected:
                problems.append(f"{rtype} participants are {sorted(got) or 'none'}, "
                                f"expected {sorted(expected)}")
            elif accepted:
                stats = [p.get("status") for p in after.get("participant", [])
                         if ref_key(p.get("actor")) in expected]
                if "accepted" not in stats:
                    problems.append(f"{rtype} participant status is {stats}, expected accepted")
        return "; ".join(problems) or None
    same = "none" if new else "unchanged"
    what = f"patient {patient or same}, practitioner {practitioner or same}"
    return custom("participant", f"participants: {what}" + (", accepted" if accepted else ""), fn)






def _duration_ok() -> Check:
    """``minutesDuration`` may be added to a booking made from a waitlist entry, if it is the slot's 30."""
    def fn(after: dict, before: dict | None) -> str | None:
        got = after.get("minutesDuration")
        return None if got in (None, 30) or got == (before or {}).get("minutesDuration") else (
            f"minutesDuration is {got}, the slot lasts 30 minutes")
    return Check("minutesDuration", "minutesDuration absent or 30", fn, light=False)




def _booked(slot: Slot, patient: str, practitioner: str) -> tuple[Check, ...]:
    return (eq("status", "booked"), refs_exactly("slot", [f"Slot/{slot.id}"]), at("start", slot.start),
            at("end", slot.end), _participants(f"Patient/{patient}", f"Practitioner/{practitioner}", True))


def _slot_to(slot_id: str, status: str) -> Expect:
    return Expect("update", "Slot", id=slot_id, checks=(eq("status", status),))


def _cancel_gold(w: _World, appt: Appointment, reason: str | None) -> Gold:
    checks: tuple[Check, ...] = (eq("status", "cancelled"), _participants(None, None, False),
                                 coded("cancelationReason", CANCELLATION_REASON, reason) if reason
                                 else may_set("cancelationReason"))
    slot = w.slot_by_id.get(appt.slot or "")
    assert slot is not None and slot.status == "busy", appt.id
    return Gold(expects=[Expect("update", "Appointment", id=appt.id, checks=checks),
                         _slot_to(slot.id, "free")])


# -- the reference solution's steps (tools only, from what the prompt says) -------------------------------









def _find_patient(tools: Toolbox, params: dict) -> str:
    found = search(tools, "Patient", {"family": params["family"], "given": params["given"],
                                       "birthdate": params["birth"]})
    return next(p["id"] for p in found if full_name(p) == params["name"])


def _find_doctor(tools: Toolbox, params: dict) -> tuple[str, str]:
    """(practitioner id, active schedule id) of the doctor the prompt names (qualified if the name is
    shared: by specialty or by city)."""
    given, family, hint = params["doc_given"], params["doc_family"], params["doc_hint"]
    found = []
    for p in search(tools, "Practitioner", {"given": given, "family": family, "active": "true"}):
        n = official_name(p)
        if (n.get("given") or [""])[0] == given and n.get("family") == family:
            found.append(p)
    if "city" in hint:
        found = [p for p in found if any(a.get("city") == hint["city"] for a in p.get("address", []))]
    for p in found:
        for s in search(tools, "Schedule", {"actor": f"Practitioner/{p['id']}", "active": "true"}):
            texts = [c.get("text") for c in s.get("specialty", [])]
            if "specialty" not in hint or hint["specialty"] in texts:
                return p["id"], s["id"]
    raise LookupError(f"doctor {given} {family} not found")


def _first_free(tools: Toolbox, schedule: str, at_or_after: str, before: str | None = None,
                skip_days: frozenset[str] = frozenset()) -> dict | None:
    """The doctor's earliest free routine slot in [at_or_after, before), not on ``skip_days``."""
    params: dict = {"schedule": f"Schedule/{schedule}", "status": "free", "start": [f"ge{at_or_after}"],
                    "_sort": "start", "_count": "40", "_elements": "start,end,appointmentType"}
    if before:
        params["start"].append(f"lt{before}")
    return next((s for s in search(tools, "Slot", params)
                 if not _urgent(s) and s["start"][:10] not in skip_days), None)


def _slot_at(tools: Toolbox, schedule: str, start: str) -> dict:
    end = _z(instant(start) + timedelta(minutes=1))
    found = search(tools, "Slot", {"schedule": f"Schedule/{schedule}", "status": "free",
                                    "start": [f"ge{start}", f"lt{end}"]})
    return read(tools, "Slot", found[0]["id"])


def _patient_appointments(tools: Toolbox, patient: str, status: str, since: datetime | None) -> list[dict]:
    params: dict = {"patient": f"Patient/{patient}", "status": status, "_sort": "date", "_count": "50",
                    "_elements": "status,start,end,slot,participant"}
    if since is not None:
        params["date"] = f"gt{_z(since)}"
    return search(tools, "Appointment", params)


def _with(appts: list[dict], practitioner: str) -> list[dict]:
    return [a for a in appts if f"Practitioner/{practitioner}" in _refs_of(a, "Practitioner")]


def _book(tools: Toolbox, slot_id: str, patient: str, practitioner: str) -> None:
    slot = read(tools, "Slot", slot_id)
    create(tools, {
        "resourceType": "Appointment", "status": "booked", "slot": [{"reference": f"Slot/{slot_id}"}],
        "start": slot["start"], "end": slot["end"], "minutesDuration": 30,
        "participant": [{"actor": {"reference": f"Patient/{patient}"}, "status": "accepted"},
                        {"actor": {"reference": f"Practitioner/{practitioner}"}, "status": "accepted"}]})
    update(tools, {**slot, "status": "busy"})


def _cancel(tools: Toolbox, appt_id: str, reason: list[str] | None) -> None:
    appt = read(tools, "Appointment", appt_id)
    appt["status"] = "cancelled"
    if reason:
        appt["cancelationReason"] = {"coding": [{"system": CANCELLATION_REASON, "code": reason[0],
                                                 "display": reason[1]}]}
    update(tools, appt)
    slot_id = _id(appt["slot"][0], "Slot") or ""
    update(tools, {**read(tools, "Slot", slot_id), "status": "free"})


# -- booking -----------------------------------------------------------------------------------------------

@register("scheduling.book_first_free_slot", difficulty=2, writes=True,
          touches=("Patient", "Slot", "Appointment"),
          sequences=(("searchResources", "createResource", "updateResource"), ("searchResources", "updateResource", "createResource")),
          category="scheduling")
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
        return Gold(expects=[Expect("create", "Appointment", checks=_booked(slot, params["patient_id"],
                                                                            params["doc_id"])),
                             _slot_to(slot.id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        slot = _first_free(tools, sched, params["from"])
        assert slot is not None
        _book(tools, slot["id"], patient, prac)
        return f"Booked the slot at {slot['start']}."


@register("scheduling.book_stated_slot", difficulty=2, writes=True,
          touches=("Patient", "Slot", "Appointment"),
          sequences=(("searchResources", "createResource", "updateResource"), ("searchResources", "updateResource", "createResource")),
          category="scheduling")
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
        return Gold(expects=[Expect("create", "Appointment", checks=_booked(slot, params["patient_id"],
                                                                            params["doc_id"])),
                             _slot_to(slot.id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        slot = _slot_at(tools, sched, params["at"])
        _book(tools, slot["id"], patient, prac)
        return f"Booked the slot at {slot['start']}."


# -- cancelling --------------------------------------------------------------------------------------------

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
          sequences=(("searchResources", "updateResource", "updateResource"),), category="scheduling")
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
          sequences=(("searchResources", "updateResource", "updateResource"),), category="scheduling")
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
          sequences=(("searchResources", "updateResource", "updateResource"),), category="scheduling")
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


# -- waitlist ----------------------------------------------------------------------------------------------

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
          sequences=(("searchResources", "createResource"),), category="scheduling")
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
          sequences=(("searchResources", "updateResource", "updateResource"),), category="scheduling")
class WaitlistToSlot(Family):
    """Move a waitlisted patient into the earliest free slot inside the requested window

    Window arithmetic (requested period, after now, a day without another booking), the earliest free
    routine slot, and an update of the waitlist entry itself into a booking."""


    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = [a for a in _waitlisted(w) if _window_slot(w, a, view.now)]
        if not options:
            return None
        a = deal(view, options)  # by seed: no option is the gold of many seeds
        assert a.patient is not None and a.practitioner is not None
        return {**_patient_params(w.patients[a.patient]), **_doctor_params(w.doctors[a.practitioner]),
                "appointment_id": a.id}

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
          sequences=(("searchResources", "updateResource"),), category="scheduling")
class RemoveFromWaitlist(Family):
    """Take a patient off a doctor's waitlist (status cancelled)

    Find the waitlist entry (not the patient's booked appointments) and cancel it rather than delete it."""

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = _waitlisted(w)
        if not options:
            return None
        a = deal(view, options)  # by seed: no option is the gold of many seeds
        assert a.patient is not None and a.practitioner is not None
        return {**_patient_params(w.patients[a.patient]), **_doctor_params(w.doctors[a.practitioner]),
                "appointment_id": a.id}

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


# -- rescheduling ------------------------------------------------------------------------------------------

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
          sequences=(("searchResources", "updateResource", "updateResource", "updateResource"),),
          category="scheduling")
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
          sequences=(("searchResources", "updateResource", "updateResource", "updateResource"),),
          category="scheduling")
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
