"""Scheduling & appointments, the writing half (ANCHORS.md §1): book, cancel, waitlist and reschedule.

Every family here changes the server: an Appointment (created or updated) and, whenever a slot is taken
or given back, its Slot (updated in place, nothing else changed). The shapes are stated in each prompt:

- **booked**: Appointment ``status`` booked, ``slot`` → the Slot, ``start``/``end`` = the slot's, the
  patient and the practitioner as participants with status accepted; the Slot becomes ``busy``;
- **cancelled**: the Appointment's ``status`` becomes cancelled (``cancelationReason`` when the prompt
  gives one, tolerated otherwise) and its Slot becomes ``free``; participant statuses may change, the
  participants themselves may not;
- **waitlist**: Appointment ``status`` waitlist with a ``requestedPeriod``, no slot and no start.

The world's traps (``world._admin``): same-name practitioner pairs (the prompt qualifies such a doctor by
specialty or city), busy slots next to free slots of other doctors at the same instant, urgent-only slots,
an entered-in-error duplicate of a real booking, stale "booked" appointments earlier than now, and a clock
(``view.now``) that falls on weekdays, weekends and late evenings. Patients are named with their birth date
(a few patients share a name).
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TypeVar

from ...tools import Toolbox
from .._expect import Check, Expect, coded, custom, eq, instant, on_day, ref, ref_key
from .._family import Family, Gold, View, register
from ._common import SNOMED, full_name, human_date, official_name

T = TypeVar("T")
CANCEL_REASON = "http://terminology.hl7.org/CodeSystem/appointment-cancellation-reason"
APPOINTMENT_TYPE = "http://terminology.hl7.org/CodeSystem/v2-0276"
PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
STAGED = "appointments-staged-1"  # id of an Appointment a family stages when the world has no fitting one
HOLDING = frozenset({"booked", "arrived", "fulfilled", "noshow", "checked-in"})
#: Cancellation reasons a caller would give (code, display).
PATIENT_REASONS = (("pat-fb", "Patient: Feeling Better"), ("pat-lt", "Patient: Lack of Transportation"),
                   ("pat-cpp", "Patient: Canceled via Patient Portal"))
MARGIN = timedelta(hours=1)  # nothing the task hinges on lies within an hour of now
SOON = timedelta(minutes=15)  # a free slot starting sooner than this is not clearly "still ahead"

BOOKED_SHAPE = ("Record it as an Appointment with status booked that references the slot, with the slot's start "
                "and end, and with the patient and the doctor as participants, both with status accepted; then "
                "set that Slot's status to busy (leave the rest of the slot as it is).")
FREE_SHAPE = ("set the appointment's status to cancelled (leave the rest of it as it is) and set its slot's "
              "status back to free")


# -- world facts (cached per world file; the tasks add no setup, so the base is the pre-run state) ------------

@dataclass
class _Slot:
    id: str
    schedule: str
    start: str  # ISO instant, ...Z
    end: str
    status: str
    urgent: bool


@dataclass
class _World:
    doctors: dict[str, dict] = field(default_factory=dict)  # practitioner id -> facts (usable ones only)
    by_schedule: dict[str, str] = field(default_factory=dict)  # schedule id -> practitioner id (every doctor)
    sched_code: dict[str, str] = field(default_factory=dict)  # schedule id -> SNOMED specialty code
    slots: dict[str, list[_Slot]] = field(default_factory=dict)  # schedule id -> slots by start
    starts: dict[str, list[str]] = field(default_factory=dict)  # schedule id -> their starts (bisect)
    at: dict[str, list[_Slot]] = field(default_factory=dict)  # start -> every slot starting then
    slot_by_id: dict[str, _Slot] = field(default_factory=dict)
    appts: list[dict] = field(default_factory=list)
    by_patient: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    patients: dict[str, dict] = field(default_factory=dict)  # usable patients: id -> name, given, family, birth
    holding_days: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def _z(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dt(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _actor(appt: dict, rtype: str) -> str | None:
    for p in appt.get("participant", []):
        key = ref_key(p.get("actor"))
        if key and key.startswith(rtype + "/"):
            return key.split("/", 1)[1]
    return None


def _build(view: View) -> _World:
    w = _World()
    scheds = view.search("Schedule", {"active": "true", "_count": "1000"})
    pracs = view.search("Practitioner", {"_count": "1000", "_elements": "name,address,active"})
    by_name: dict[tuple[str, str], list[str]] = defaultdict(list)
    prac = {p["id"]: p for p in pracs}
    for p in pracs:
        n = official_name(p)
        by_name[((n.get("given") or [""])[0].casefold(), n.get("family", "").casefold())].append(p["id"])
    facts: dict[str, dict] = {}
    for s in scheds:
        pid = next((ref_key(a).split("/", 1)[1] for a in s.get("actor", [])
                    if (ref_key(a) or "").startswith("Practitioner/")), None)
        if pid is None or pid not in prac or not prac[pid].get("active", True):
            continue
        n = official_name(prac[pid])
        given, family = (n.get("given") or [""])[0], n.get("family", "")
        city = ((prac[pid].get("address") or [{}])[0]).get("city", "")
        facts[pid] = {"id": pid, "given": given, "family": family, "name": f"Dr. {given} {family}",
                      "specialty": s["specialty"][0]["text"], "code": s["specialty"][0]["coding"][0]["code"],
                      "city": city, "schedule": s["id"]}
    for pid, d in facts.items():
        others = [o for o in by_name[(d["given"].casefold(), d["family"].casefold())] if o != pid]
        if not others:
            d["label"], d["hint"] = d["name"], {}
        elif all(o in facts for o in others) and all(facts[o]["specialty"] != d["specialty"] for o in others):
            d["label"], d["hint"] = f"{d['name']} ({d['specialty']})", {"specialty": d["specialty"]}
        elif all(o in facts for o in others) and all(facts[o]["city"] != d["city"] for o in others) and d["city"]:
            d["label"], d["hint"] = f"{d['name']} in {d['city']}", {"city": d["city"]}
        else:
            continue  # a name the prompt could not make unique: never sampled
        w.doctors[pid] = d
    w.by_schedule = {d["schedule"]: pid for pid, d in facts.items()}
    w.sched_code = {d["schedule"]: d["code"] for d in facts.values()}
    for s in view.search("Slot", {"_count": "1000", "_elements": "schedule,status,start,end,appointmentType"}):
        sched = ref_key(s.get("schedule")).split("/", 1)[1]
        if sched not in w.by_schedule:
            continue
        urgent = any(c.get("code") == "EMERGENCY" for c in (s.get("appointmentType") or {}).get("coding", []))
        slot = _Slot(s["id"], sched, s["start"], s["end"], s["status"], urgent)
        w.slots.setdefault(sched, []).append(slot)
        w.at.setdefault(slot.start, []).append(slot)
        w.slot_by_id[slot.id] = slot
    for sched, items in w.slots.items():
        items.sort(key=lambda x: x.start)
        w.starts[sched] = [x.start for x in items]
    w.appts = view.search("Appointment", {"_count": "1000"})
    for a in w.appts:
        pat = _actor(a, "Patient")
        if pat:
            w.by_patient[pat].append(a)
            if a["status"] in HOLDING and a.get("start"):
                w.holding_days[pat].add(a["start"][:10])
    pats = view.search("Patient", {"_count": "1000", "_elements": "name,birthDate,deceased,active,gender"})
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for p in pats:
        seen[(full_name(p).casefold(), p.get("birthDate", ""))] += 1
    for p in pats:
        n = official_name(p)
        if (not p.get("birthDate") or not p.get("name") or "deceasedDateTime" in p or p.get("deceasedBoolean")
                or p.get("active") is False or seen[(full_name(p).casefold(), p["birthDate"])] != 1):
            continue
        w.patients[p["id"]] = {"id": p["id"], "name": full_name(p), "given": (n.get("given") or [""])[0],
                               "family": n.get("family", ""), "birth": p["birthDate"], "gender": p.get("gender")}
    return w


def _world(view: View) -> _World:
    return view.cached("appt_world", lambda: _build(view))


def _doctor_of(w: _World, appt: dict) -> dict | None:
    pid = _actor(appt, "Practitioner")
    return w.doctors.get(pid) if pid else None


def _upcoming(w: _World, pid: str, now: datetime) -> list[dict] | None:
    """The patient's booked appointments after now, by start; None if one is too close to now to be clear."""
    booked = [a for a in w.by_patient.get(pid, []) if a["status"] == "booked"]
    if any(abs(_dt(a["start"]) - now) <= MARGIN for a in booked):
        return None
    return sorted((a for a in booked if _dt(a["start"]) > now), key=lambda a: a["start"])


def _free_after(w: _World, sched: str, after: str, urgent_ok: bool = False) -> list[_Slot]:
    items = w.slots.get(sched, [])
    i = bisect_left(w.starts.get(sched, []), after)
    return [s for s in items[i:] if s.status == "free" and (urgent_ok or not s.urgent)]


def _slot_of(w: _World, appt: dict) -> _Slot | None:
    key = ref_key((appt.get("slot") or [{}])[0])
    return w.slot_by_id.get(key.split("/", 1)[1]) if key else None


def _patient_params(p: dict) -> dict:
    return {"patient_id": p["id"], "name": p["name"], "given": p["given"], "family": p["family"],
            "birth": p["birth"]}


def _doctor_params(d: dict, prefix: str = "doc") -> dict:
    return {f"{prefix}_id": d["id"], f"{prefix}": d["label"], f"{prefix}_given": d["given"],
            f"{prefix}_family": d["family"], f"{prefix}_hint": d["hint"], f"{prefix}_schedule": d["schedule"]}


def _who(params: dict) -> str:
    return f"{params['name']} (born {human_date(params['birth'])})"


def _when(start: str) -> str:
    t = _dt(start)
    return f"{t.strftime('%A')}, {human_date(t.date())} at {t.strftime('%H:%M')}"


def _next_monday(now: datetime) -> tuple[date, str]:
    """The Monday a clerk means by "next Monday" at ``now``, and how to say it without ambiguity."""
    ahead = (7 - now.weekday()) % 7 or 7
    phrase = "this coming Monday" if now.weekday() >= 5 else "next Monday"
    return now.date() + timedelta(days=ahead), phrase


# -- checks ----------------------------------------------------------------------------------------------

def _refs_of(resource: dict, rtype: str) -> set[str]:
    out = set()
    for p in resource.get("participant", []) or []:
        key = ref_key(p.get("actor")) if isinstance(p, dict) else None
        if key and key.startswith(rtype + "/"):
            out.add(key)
    return out


def _participants(patient: str | None, practitioner: str | None, accepted: bool, new: bool = False) -> Check:
    """Patient and Practitioner participants are exactly these (None: as before the change, i.e. none for a
    ``new`` resource); ``accepted``: both with status accepted. Other participants (the location) and other
    statuses are left free."""
    def fn(after: dict, before: dict | None) -> str | None:
        problems = []
        for rtype, want in (("Patient", patient), ("Practitioner", practitioner)):
            expected = {want} if want else _refs_of(before or {}, rtype)
            got = _refs_of(after, rtype)
            if got != expected:
                problems.append(f"{rtype} participants are {sorted(got) or 'none'}, expected {sorted(expected)}")
            elif accepted:
                stats = [p.get("status") for p in after.get("participant", [])
                         if ref_key(p.get("actor")) in expected]
                if "accepted" not in stats:
                    problems.append(f"{rtype} participant status is {stats}, expected accepted")
        return "; ".join(problems) or None
    what = ", ".join(f"{t} {w or ('none' if new else 'unchanged')}" for t, w in (("patient", patient), ("practitioner", practitioner)))
    return custom("participant", f"participants: {what}" + (", accepted" if accepted else ""), fn)


def _may_set(path: str) -> Check:
    """The element may be added or changed (e.g. a cancellation reason nobody asked for)."""
    return Check(path, f"{path} may be set", lambda after, before: None, light=False)


def _absent(*paths: str) -> Check:
    def fn(after: dict, before: dict | None) -> str | None:
        there = [p for p in paths if after.get(p)]
        return f"{', '.join(there)} should not be set" if there else None
    return Check(paths[0], f"no {', '.join(paths)}", fn, light=False)


def _booked(slot: _Slot, patient: str, practitioner: str) -> tuple[Check, ...]:
    return (eq("status", "booked"), ref("slot", f"Slot/{slot.id}"), instant("start", slot.start),
            instant("end", slot.end), _participants(f"Patient/{patient}", f"Practitioner/{practitioner}", True))


def _slot_to(slot_id: str, status: str) -> Expect:
    return Expect("update", "Slot", id=slot_id, checks=(eq("status", status),))


# -- the reference solution's steps (tools only, from what the prompt says) -------------------------------

def _out(tools: Toolbox, name: str, args: dict) -> dict:
    call = tools.call(name, args)
    return call.output if isinstance(call.output, dict) else {}


def _search(tools: Toolbox, rtype: str, params: dict) -> list[dict]:
    return _out(tools, "searchResources", {"resourceType": rtype, "params": params}).get("resources", [])


def _read(tools: Toolbox, rtype: str, rid: str) -> dict:
    return _out(tools, "getResourceById", {"resourceType": rtype, "resourceId": rid})


def _update(tools: Toolbox, resource: dict) -> None:
    tools.call("updateResource", {"resourceType": resource["resourceType"], "resourceId": resource["id"],
                                  "body": resource})


def _find_patient(tools: Toolbox, params: dict) -> str:
    found = _search(tools, "Patient", {"family": params["family"], "given": params["given"],
                                       "birthdate": params["birth"]})
    return next(p["id"] for p in found if full_name(p) == params["name"])


def _find_doctor(tools: Toolbox, params: dict, prefix: str = "doc") -> tuple[str, str]:
    """(practitioner id, active schedule id) of the doctor the prompt names (qualified if the name is shared)."""
    given, family, hint = params[f"{prefix}_given"], params[f"{prefix}_family"], params[f"{prefix}_hint"]
    found = [p for p in _search(tools, "Practitioner", {"given": given, "family": family, "active": "true"})
             if (official_name(p).get("given") or [""])[0] == given and official_name(p).get("family") == family]
    if "city" in hint:
        found = [p for p in found if any(a.get("city") == hint["city"] for a in p.get("address", []))]
    for p in found:
        scheds = _search(tools, "Schedule", {"actor": f"Practitioner/{p['id']}", "active": "true"})
        for s in scheds:
            if "specialty" not in hint or any(c.get("text") == hint["specialty"] for c in s.get("specialty", [])):
                return p["id"], s["id"]
    raise LookupError(f"doctor {given} {family} not found")


def _first_free(tools: Toolbox, schedule: str, at_or_after: str, before: str | None = None,
                skip_days: frozenset[str] = frozenset()) -> dict | None:
    """The doctor's earliest free routine slot in [at_or_after, before), not on ``skip_days`` (YYYY-MM-DD)."""
    params: dict = {"schedule": f"Schedule/{schedule}", "status": "free", "start": [f"ge{at_or_after}"],
                    "_sort": "start", "_count": "40", "_elements": "start,end,appointmentType"}
    if before:
        params["start"].append(f"lt{before}")
    for s in _search(tools, "Slot", params):
        urgent = any(c.get("code") == "EMERGENCY" for c in (s.get("appointmentType") or {}).get("coding", []))
        if not urgent and s["start"][:10] not in skip_days:
            return s
    return None


def _patient_appointments(tools: Toolbox, patient: str, status: str, since: datetime | None) -> list[dict]:
    params: dict = {"patient": f"Patient/{patient}", "status": status, "_sort": "date", "_count": "50",
                    "_elements": "status,start,end,slot,participant"}
    if since is not None:
        params["date"] = f"gt{_z(since)}"
    return _search(tools, "Appointment", params)


def _book(tools: Toolbox, slot_id: str, patient: str, practitioner: str) -> None:
    slot = _read(tools, "Slot", slot_id)
    tools.call("createResource", {"resourceType": "Appointment", "body": {
        "resourceType": "Appointment", "status": "booked", "slot": [{"reference": f"Slot/{slot_id}"}],
        "start": slot["start"], "end": slot["end"], "minutesDuration": 30,
        "participant": [{"actor": {"reference": f"Patient/{patient}"}, "status": "accepted"},
                        {"actor": {"reference": f"Practitioner/{practitioner}"}, "status": "accepted"}]}})
    _update(tools, {**slot, "status": "busy"})


def _cancel(tools: Toolbox, appt_id: str, reason: tuple[str, str] | None) -> None:
    appt = _read(tools, "Appointment", appt_id)
    appt["status"] = "cancelled"
    if reason:
        appt["cancelationReason"] = {"coding": [{"system": CANCEL_REASON, "code": reason[0], "display": reason[1]}]}
    _update(tools, appt)
    slot_id = ref_key(appt["slot"][0]).split("/", 1)[1]
    _update(tools, {**_read(tools, "Slot", slot_id), "status": "free"})


def _cancel_gold(w: _World, appt: dict, reason: str | None) -> Gold:
    checks: tuple[Check, ...] = (eq("status", "cancelled"), _participants(None, None, False),
                                 coded("cancelationReason", CANCEL_REASON, reason) if reason
                                 else _may_set("cancelationReason"))
    slot = _slot_of(w, appt)
    assert slot is not None and slot.status == "busy", appt["id"]
    return Gold(expects=[Expect("update", "Appointment", id=appt["id"], checks=checks), _slot_to(slot.id, "free")])


def _suits(doc: dict, p: dict, today: date) -> bool:
    """A plausible patient for this doctor: children see paediatricians, adults GPs, women gynaecologists."""
    birth = date.fromisoformat(p["birth"])
    child = (today.year - birth.year - ((today.month, today.day) < (birth.month, birth.day))) < 18
    if doc["code"] == "394537008":  # Pediatric specialty
        return child
    if doc["code"] == "394814009":  # General practice
        return not child
    if doc["code"] == "394585009":  # Obstetrics and gynecology
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


def _prefer(rng: random.Random, options: list[tuple[T, int]]) -> T | None:
    """One of the options whose patient has other upcoming appointments too (the distractors), if any such
    option exists; else any option (the smallest worlds, late in the week)."""
    rich = [o for o, n in options if n >= 2]
    pool = rich or [o for o, _ in options]
    return rng.choice(pool) if pool else None


def _usable_doctors(w: _World) -> list[dict]:
    return [w.doctors[k] for k in sorted(w.doctors)]


# -- booking -----------------------------------------------------------------------------------------------

@register
class BookFirstFreeSlot(Family):
    """First free routine slot of a named doctor at/after a stated time: urgent-only slots and busy ones are skipped."""

    id = "scheduling.book_first_free_slot"
    title = "Book a patient into a doctor's first free routine slot at or after a given time"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Patient", "Slot", "Appointment")
    sequences = (("searchResources", "createResource", "updateResource"),
                 ("searchResources", "updateResource", "createResource"))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        doc = rng.choice(_usable_doctors(w))
        day = view.now.date() + timedelta(days=rng.randint(1, 10))
        minute = rng.randrange(8 * 60, 16 * 60 + 1, 30)
        stated = datetime(day.year, day.month, day.day, minute // 60, minute % 60, tzinfo=UTC)
        slots = _free_after(w, doc["schedule"], _z(stated))
        if not slots or stated - view.now < MARGIN:
            return None
        slot = slots[0]
        p = _pick_patient(w, rng, lambda p: slot.start[:10] not in w.holding_days[p["id"]], doc, view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(doc), "from": _z(stated), "slot_id": slot.id}

    def prompt(self, params: dict) -> str:
        return (f"Please book {_who(params)} with {params['doc']} in the first free slot at or after "
                f"{_when(params['from'])}. Use a regular slot, not one reserved for urgent visits. {BOOKED_SHAPE}")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        slot = _free_after(w, params["doc_schedule"], params["from"])[0]
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


@register
class BookStatedSlot(Family):
    """A stated doctor and time while another doctor (same name or same specialty) is free at that very time."""

    id = "scheduling.book_stated_slot"
    title = "Book a stated doctor and time when another doctor is free at the same time"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Patient", "Slot", "Appointment")
    sequences = (("searchResources", "createResource", "updateResource"),
                 ("searchResources", "updateResource", "createResource"))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        docs = _usable_doctors(w)
        twins = [d for d in docs if d["hint"]]
        doc = rng.choice(twins) if twins and rng.random() < 0.5 else rng.choice(docs)
        lo = _z(view.now + MARGIN)
        hi = _z(view.now + timedelta(days=14))
        twins_of = {d["id"] for d in docs if d["name"] == doc["name"] and d["id"] != doc["id"]}
        options = []
        for s in _free_after(w, doc["schedule"], lo):
            if s.start > hi:
                break
            rivals = [o for o in w.at.get(s.start, []) if o.schedule != doc["schedule"] and o.status == "free"
                      and (w.sched_code[o.schedule] == doc["code"] or w.by_schedule[o.schedule] in twins_of)]
            if rivals:
                options.append(s)
        if not options:
            return None
        slot = rng.choice(options)
        p = _pick_patient(w, rng, lambda p: slot.start[:10] not in w.holding_days[p["id"]], doc, view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(doc), "at": slot.start, "slot_id": slot.id}

    def prompt(self, params: dict) -> str:
        return f"Please book {_who(params)} with {params['doc']} on {_when(params['at'])}. {BOOKED_SHAPE}"

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
        end = _z(_dt(params["at"]) + timedelta(minutes=1))
        slot = next(s for s in _search(tools, "Slot", {"schedule": f"Schedule/{sched}", "status": "free",
                                                          "start": [f"ge{params['at']}", f"lt{end}"]}))
        _book(tools, slot["id"], patient, prac)
        return f"Booked the slot at {slot['start']}."


# -- cancelling --------------------------------------------------------------------------------------------

def _reason_phrase(reason: tuple[str, str]) -> str:
    return (f"Record the cancellation reason as code {reason[0]} ('{reason[1]}') from the HL7 "
            "appointment-cancellation-reason code system.")


@register
class CancelNearestAppointment(Family):
    """The patient's next appointment among several; stale 'booked' ones before now and the entered-in-error
    duplicate do not count."""

    id = "scheduling.cancel_nearest_appointment"
    title = "Cancel a patient's next upcoming appointment and free its slot"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Appointment", "Slot")
    sequences = (("searchResources", "updateResource", "updateResource"),)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = [(p, len(up)) for pid, p in sorted(w.patients.items()) if (up := _upcoming(w, pid, view.now))]
        p = _prefer(rng, options)
        if p is None:
            return None
        reason = rng.choice(PATIENT_REASONS)
        return {**_patient_params(p), "reason": list(reason)}

    def prompt(self, params: dict) -> str:
        return (f"{_who(params)} asked us to cancel the next appointment they have coming up with us. Please cancel "
                f"that appointment: {FREE_SHAPE}. {_reason_phrase(params['reason'])}")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        up = _upcoming(w, params["patient_id"], view.now)
        assert up
        return _cancel_gold(w, up[0], params["reason"][0])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        appt = _patient_appointments(tools, patient, "booked", now)[0]
        _cancel(tools, appt["id"], tuple(params["reason"]))
        return f"Cancelled the appointment of {appt['start']} and freed its slot."


@register
class CancelWithProvider(Family):
    """One of the patient's upcoming appointments, picked by its doctor (possibly one of a same-name pair)."""

    id = "scheduling.cancel_with_provider"
    title = "Cancel a patient's upcoming appointment with a given doctor"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Appointment", "Slot")
    sequences = (("searchResources", "updateResource", "updateResource"),)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = []
        for pid, p in sorted(w.patients.items()):
            up = _upcoming(w, pid, view.now) or []
            docs = [_actor(a, "Practitioner") for a in up]
            for a in up:
                d = _doctor_of(w, a)
                if d and docs.count(d["id"]) == 1:
                    options.append(((p, a, d), len(up)))
        choice = _prefer(rng, options)
        if choice is None:
            return None
        p, a, d = choice
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": a["id"],
                "reason": list(rng.choice(PATIENT_REASONS))}

    def prompt(self, params: dict) -> str:
        return (f"Please cancel the upcoming appointment of {_who(params)} with {params['doc']}: {FREE_SHAPE}. "
                f"Their other appointments stay as they are. {_reason_phrase(params['reason'])}")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        up = _upcoming(w, params["patient_id"], view.now) or []
        match = [a for a in up if _actor(a, "Practitioner") == params["doc_id"]]
        assert len(match) == 1 and match[0]["id"] == params["appointment_id"]
        return _cancel_gold(w, match[0], params["reason"][0])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, _ = _find_doctor(tools, params)
        appt = next(a for a in _patient_appointments(tools, patient, "booked", now)
                    if f"Practitioner/{prac}" in {ref_key(p.get("actor")) for p in a["participant"]})
        _cancel(tools, appt["id"], tuple(params["reason"]))
        return f"Cancelled the appointment of {appt['start']} with {params['doc']} and freed its slot."


@register
class CancelMondayAppointment(Family):
    """The one upcoming appointment that falls on a Monday, among the patient's others (weekday arithmetic)."""

    id = "scheduling.cancel_monday_appointment"
    title = "Cancel a patient's upcoming Monday appointment"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Appointment", "Slot")
    sequences = (("searchResources", "updateResource", "updateResource"),)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = []
        for pid, p in sorted(w.patients.items()):
            up = _upcoming(w, pid, view.now)
            if up and sum(_dt(a["start"]).weekday() == 0 for a in up) == 1:
                options.append((p, len(up)))
        p = _prefer(rng, options)
        return _patient_params(p) if p else None

    def prompt(self, params: dict) -> str:
        return (f"{_who(params)} can no longer come on Mondays. Please cancel their upcoming appointment that falls "
                f"on a Monday: {FREE_SHAPE}. Leave their other appointments alone.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        up = _upcoming(w, params["patient_id"], view.now) or []
        monday = [a for a in up if _dt(a["start"]).weekday() == 0]
        assert len(monday) == 1
        return _cancel_gold(w, monday[0], None)

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        appt = next(a for a in _patient_appointments(tools, patient, "booked", now) if _dt(a["start"]).weekday() == 0)
        _cancel(tools, appt["id"], None)
        return f"Cancelled the Monday appointment of {appt['start']} and freed its slot."


# -- waitlist ----------------------------------------------------------------------------------------------

def _waitlisted(w: _World) -> list[tuple[dict, dict, dict]]:
    """(patient, waitlist appointment, doctor) for every usable waitlist entry."""
    out = []
    for a in w.appts:
        if a["status"] != "waitlist":
            continue
        pid, d = _actor(a, "Patient"), _doctor_of(w, a)
        if pid in w.patients and d is not None:
            same = [b for b in w.by_patient[pid] if b["status"] == "waitlist" and _actor(b, "Practitioner") == d["id"]]
            if len(same) == 1:
                out.append((w.patients[pid], a, d))
    return out


@register
class AddToWaitlist(Family):
    """A new waitlist Appointment (status, requestedPeriod, participants, no slot), for a named doctor or, in a
    third of the instances, for a specialty with no doctor yet."""

    id = "scheduling.add_to_waitlist"
    title = "Put a patient on a doctor's (or a specialty's) waitlist for a date window"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Patient", "Appointment")
    sequences = (("searchResources", "createResource"),)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        doc = rng.choice(_usable_doctors(w))
        by_specialty = rng.random() < 0.35
        p = _pick_patient(w, rng, lambda p: not any(
            a["status"] == "waitlist" and (by_specialty or _actor(a, "Practitioner") == doc["id"])
            for a in w.by_patient[p["id"]]), doc, view.now.date())
        if p is None:
            return None
        start = view.now.date() + timedelta(days=rng.randint(3, 10))
        end = start + timedelta(days=rng.randint(7, 21))
        who = ({"specialty": doc["specialty"], "specialty_code": doc["code"]} if by_specialty
               else _doctor_params(doc))
        return {**_patient_params(p), **who, "start": start.isoformat(), "end": end.isoformat()}

    def prompt(self, params: dict) -> str:
        period = (f"they can come any day from {human_date(params['start'])} to {human_date(params['end'])}. "
                  f"Record it as an Appointment with status waitlist, a requested period from {params['start']} to "
                  f"{params['end']}, ")
        tail = "No slot has been chosen yet, so give it no slot, start or end."
        if "specialty" in params:
            return (f"Please put {_who(params)} on the waitlist for a {params['specialty']} appointment with whichever "
                    f"of our {params['specialty']} doctors frees up first; {period}the specialty SNOMED CT "
                    f"{params['specialty_code']} ({params['specialty']}), and the patient as the only participant "
                    f"(no doctor yet). {tail}")
        return (f"Please put {_who(params)} on the waitlist for {params['doc']}; {period}and the patient and the "
                f"doctor as participants. {tail}")

    def gold(self, view: View, params: dict) -> Gold:
        patient = f"Patient/{params['patient_id']}"
        if "specialty" in params:
            who: tuple[Check, ...] = (coded("specialty", SNOMED, params["specialty_code"]),
                                      _participants(patient, None, False, new=True))
        else:
            who = (_participants(patient, f"Practitioner/{params['doc_id']}", False),)
        return Gold(expects=[Expect("create", "Appointment", checks=(
            eq("status", "waitlist"), on_day("requestedPeriod.start", params["start"]),
            on_day("requestedPeriod.end", params["end"]), ref("participant.actor", patient), *who,
            _absent("slot", "start", "end")))])

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
            body["participant"].append({"actor": {"reference": f"Practitioner/{prac}"}, "status": "needs-action"})
        tools.call("createResource", {"resourceType": "Appointment", "body": body})
        return "Added the patient to the waitlist."


def _window_slot(w: _World, a: dict, d: dict, now: datetime) -> _Slot | None:
    """The doctor's earliest free routine slot inside the entry's requested period, after now, on a day the
    patient holds no other booking; None when that answer would sit on a boundary (within minutes of now, on
    or after the period's last day, whose inclusion a reader may doubt)."""
    period = a["requestedPeriod"][0]
    lo = max(_z(now), period["start"][:10] + "T00:00:00Z")
    taken = w.holding_days[_actor(a, "Patient") or ""]
    for s in _free_after(w, d["schedule"], lo):
        if s.start[:10] >= period["end"][:10] or _dt(s.start) - now < SOON:
            return None
        if s.start[:10] not in taken:
            return s
    return None


@register
class WaitlistToSlot(Family):
    """Window arithmetic (requested period ∩ after now), the earliest free routine slot, and an update of the
    waitlist entry itself into a booking."""

    id = "scheduling.waitlist_to_slot"
    title = "Move a waitlisted patient into the earliest free slot inside the requested window"
    category = "scheduling"
    difficulty = 3
    writes = True
    resource_types = ("Appointment", "Slot")
    sequences = (("searchResources", "updateResource", "updateResource"),)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = [(p, a, d) for p, a, d in _waitlisted(w) if _window_slot(w, a, d, view.now)]
        if not options:
            return None
        p, a, d = rng.choice(options)
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": a["id"]}

    def prompt(self, params: dict) -> str:
        return (f"{_who(params)} is on the waitlist for {params['doc']}. Please book them into the doctor's earliest "
                "free slot that lies within the period they asked for, is still ahead of us and falls on a day "
                "when they have no other booked appointment (a regular slot, not one reserved for urgent visits). Turn the waitlist appointment itself into the booking: "
                "status booked, a reference to the slot, the slot's start and end, both participants with status "
                "accepted, the rest left as it is. Then set that Slot's status to busy.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        a = next(x for x in w.appts if x["id"] == params["appointment_id"])
        slot = _window_slot(w, a, w.doctors[params["doc_id"]], view.now)
        assert slot is not None
        checks = _booked(slot, params["patient_id"], params["doc_id"])
        return Gold(expects=[Expect("update", "Appointment", id=a["id"], checks=checks), _slot_to(slot.id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        entry = next(a for a in _patient_appointments(tools, patient, "waitlist", None)
                     if f"Practitioner/{prac}" in {ref_key(p.get("actor")) for p in a["participant"]})
        appt = _read(tools, "Appointment", entry["id"])
        period = appt["requestedPeriod"][0]
        lo = max(_z(now), period["start"][:10] + "T00:00:00Z")
        hi = (date.fromisoformat(period["end"][:10]) + timedelta(days=1)).isoformat()
        taken = frozenset(a["start"][:10] for a in _patient_appointments(tools, patient, "booked", None))
        slot = _first_free(tools, sched, lo, hi, taken)
        assert slot is not None
        slot = _read(tools, "Slot", slot["id"])
        appt.update(status="booked", slot=[{"reference": f"Slot/{slot['id']}"}], start=slot["start"], end=slot["end"])
        for p in appt["participant"]:
            p["status"] = "accepted"
        _update(tools, appt)
        _update(tools, {**slot, "status": "busy"})
        return f"Booked the waitlisted appointment into the slot at {slot['start']}."


@register
class RemoveFromWaitlist(Family):
    """Find the waitlist entry (not the patient's booked appointments) and cancel it rather than delete it."""

    id = "scheduling.remove_from_waitlist"
    title = "Take a patient off a doctor's waitlist (status cancelled)"
    category = "scheduling"
    difficulty = 2
    writes = True
    resource_types = ("Appointment",)
    sequences = (("searchResources", "updateResource"),)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        options = _waitlisted(_world(view))
        if not options:
            return None
        p, a, d = rng.choice(options)
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": a["id"]}

    def prompt(self, params: dict) -> str:
        return (f"{_who(params)} no longer needs to be on the waitlist for {params['doc']}. Please take them off it "
                "by setting that waitlist appointment's status to cancelled (do not delete it, and leave the rest of "
                "it as it is).")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(expects=[Expect("update", "Appointment", id=params["appointment_id"], checks=(
            eq("status", "cancelled"), _participants(None, None, False), _may_set("cancelationReason")))])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, _ = _find_doctor(tools, params)
        entry = next(a for a in _patient_appointments(tools, patient, "waitlist", None)
                     if f"Practitioner/{prac}" in {ref_key(p.get("actor")) for p in a["participant"]})
        appt = _read(tools, "Appointment", entry["id"])
        appt["status"] = "cancelled"
        _update(tools, appt)
        return "Took the patient off the waitlist."


# -- rescheduling ------------------------------------------------------------------------------------------

def _routine(a: dict) -> bool:
    return not any(c.get("code") == "EMERGENCY" for c in (a.get("appointmentType") or {}).get("coding", []))


def _movable(w: _World, now: datetime) -> list[tuple[dict, dict, dict, _Slot]]:
    """(patient, appointment, doctor, slot) for upcoming routine bookings with a usable patient and doctor,
    the doctor's only upcoming appointment with that patient."""
    out = []
    for pid, p in sorted(w.patients.items()):
        up = _upcoming(w, pid, now) or []
        docs = [_actor(a, "Practitioner") for a in up]
        for a in up:
            d, slot = _doctor_of(w, a), _slot_of(w, a)
            if d and slot and _routine(a) and docs.count(d["id"]) == 1:
                out.append((p, a, d, slot))
    return out


@register
class RescheduleNextMonday(Family):
    """Weekday arithmetic from the clock ("next Monday" on a weekend is the coming one), the same time of day,
    three coordinated updates."""

    id = "scheduling.reschedule_next_monday"
    title = "Reschedule an appointment to next Monday, same doctor and time"
    category = "scheduling"
    difficulty = 3
    writes = True
    resource_types = ("Appointment", "Slot")
    sequences = (("searchResources", "updateResource", "updateResource", "updateResource"),)

    @staticmethod
    def _target(w: _World, d: dict, slot: _Slot, now: datetime) -> _Slot | None:
        monday, _ = _next_monday(now)
        start = _z(datetime.combine(monday, _dt(slot.start).time(), tzinfo=UTC))
        return next((s for s in w.at.get(start, []) if s.schedule == d["schedule"]), None)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        monday, _ = _next_monday(view.now)
        options = []
        for p, a, d, slot in _movable(w, view.now):
            new = self._target(w, d, slot, view.now)
            if (new and new.status == "free" and not new.urgent and a["start"][:10] != monday.isoformat()
                    and monday.isoformat() not in w.holding_days[p["id"]] and _dt(new.start) - view.now > MARGIN):
                options.append((p, a, d))
        if not options:
            return self._staged(w, view, rng)
        p, a, d = rng.choice(options)
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": a["id"], "day": a["start"][:10],
                "monday_phrase": _next_monday(view.now)[1]}

    def _staged(self, w: _World, view: View, rng: random.Random) -> dict | None:
        """No booking of the world fits this clock (the smallest worlds, late in the week): stage one, in a
        free slot of a doctor whose same-time slot next Monday is free, for a patient free on both days."""
        monday = _next_monday(view.now)[0].isoformat()
        d = rng.choice(_usable_doctors(w))
        hi = _z(view.now + timedelta(days=14))
        olds = [s for s in _free_after(w, d["schedule"], _z(view.now + 2 * MARGIN))
                if s.start <= hi and s.start[:10] != monday
                and (t := self._target(w, d, s, view.now)) is not None and t.status == "free" and not t.urgent]
        if not olds:
            return None
        old = rng.choice(olds)
        p = _pick_patient(w, rng, lambda p: not {old.start[:10], monday} & w.holding_days[p["id"]], d,
                          view.now.date())
        if p is None:
            return None
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": STAGED, "staged_slot": old.id,
                "day": old.start[:10], "monday_phrase": _next_monday(view.now)[1]}

    def setup(self, view: View, params: dict) -> list[dict]:
        if "staged_slot" not in params:
            return []
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
                    {"type": [{"coding": [{"system": PARTICIPATION, "code": "PPRF", "display": "primary performer"}]}],
                     "actor": {"reference": f"Practitioner/{doc['id']}", "display": doc["name"]},
                     "required": "required", "status": "accepted"}]}
        return [appt, {**slot, "status": "busy"}]

    def prompt(self, params: dict) -> str:
        day = date.fromisoformat(params["day"])
        return (f"{_who(params)} wants to move their appointment with {params['doc']} on {day.strftime('%A')}, "
                f"{human_date(day)} to {params['monday_phrase']}, same doctor, same time of day. Please update the "
                "existing appointment (do not create a new one): point it at the new slot and set its start and end "
                "to the new slot's, leaving the rest as it is. Set the old slot's status back to free and the new "
                "slot's status to busy.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        if "staged_slot" in params:  # the cached facts are the world's: the staged booking is in params
            old: _Slot | None = w.slot_by_id[params["staged_slot"]]
        else:
            old = _slot_of(w, next(x for x in w.appts if x["id"] == params["appointment_id"]))
        assert old is not None
        new = self._target(w, w.doctors[params["doc_id"]], old, view.now)
        assert new is not None and new.status == "free"
        checks = (eq("status", "booked"), ref("slot", f"Slot/{new.id}"), instant("start", new.start),
                  instant("end", new.end), _participants(None, None, False))
        return Gold(expects=[Expect("update", "Appointment", id=params["appointment_id"], checks=checks),
                             _slot_to(old.id, "free"), _slot_to(new.id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        entry = next(a for a in _patient_appointments(tools, patient, "booked", now)
                     if a["start"][:10] == params["day"]
                     and f"Practitioner/{prac}" in {ref_key(p.get("actor")) for p in a["participant"]})
        appt = _read(tools, "Appointment", entry["id"])
        monday, _ = _next_monday(now)
        start = datetime.combine(monday, _dt(appt["start"]).time(), tzinfo=UTC)
        new = _search(tools, "Slot", {"schedule": f"Schedule/{sched}", "status": "free",
                                      "start": [f"ge{_z(start)}", f"lt{_z(start + timedelta(minutes=1))}"]})[0]
        new = _read(tools, "Slot", new["id"])
        old_id = ref_key(appt["slot"][0]).split("/", 1)[1]
        appt.update(slot=[{"reference": f"Slot/{new['id']}"}], start=new["start"], end=new["end"])
        _update(tools, appt)
        _update(tools, {**_read(tools, "Slot", old_id), "status": "free"})
        _update(tools, {**new, "status": "busy"})
        return f"Moved the appointment to {new['start']}."


@register
class RescheduleOtherProvider(Family):
    """Find the one other doctor of the same specialty free at that exact instant, then swap practitioner and
    slot on the existing appointment and flip both slots."""

    id = "scheduling.reschedule_other_provider"
    title = "Move an appointment to another same-specialty doctor free at the same time"
    category = "scheduling"
    difficulty = 3
    writes = True
    resource_types = ("Appointment", "Slot")
    sequences = (("searchResources", "updateResource", "updateResource", "updateResource"),)

    @staticmethod
    def _alternatives(w: _World, d: dict, slot: _Slot) -> list[_Slot]:
        return [s for s in w.at.get(slot.start, []) if s.schedule != d["schedule"] and s.status == "free"
                and s.end == slot.end and w.sched_code[s.schedule] == d["code"]]

    def sample(self, view: View, rng: random.Random) -> dict | None:
        w = _world(view)
        options = []
        for p, a, d, slot in _movable(w, view.now):
            alt = self._alternatives(w, d, slot)
            if len(alt) == 1 and not alt[0].urgent and _dt(a["start"]) - view.now > 2 * MARGIN:
                options.append((p, a, d))
        if not options:
            return None
        p, a, d = rng.choice(options)
        return {**_patient_params(p), **_doctor_params(d), "appointment_id": a["id"], "at": a["start"],
                "specialty": d["specialty"]}

    def prompt(self, params: dict) -> str:
        return (f"{params['doc']} cannot see {_who(params)} on {_when(params['at'])} after all. Please move the "
                f"appointment to the other {params['specialty']} doctor who has a free slot at exactly that time. "
                "Update the existing appointment (do not create a new one): point it at the new doctor's slot and "
                f"replace {params['doc']} with the new doctor as the practitioner participant (status accepted); "
                "the time stays the same. Set the old slot's status back to free and the new slot's status to busy.")

    def gold(self, view: View, params: dict) -> Gold:
        w = _world(view)
        a = next(x for x in w.appts if x["id"] == params["appointment_id"])
        old = _slot_of(w, a)
        assert old is not None
        alt = self._alternatives(w, w.doctors[params["doc_id"]], old)
        assert len(alt) == 1
        new_doc = w.by_schedule[alt[0].schedule]
        checks = (eq("status", "booked"), ref("slot", f"Slot/{alt[0].id}"),
                  _participants(f"Patient/{params['patient_id']}", f"Practitioner/{new_doc}", True))
        return Gold(expects=[Expect("update", "Appointment", id=a["id"], checks=checks),
                             _slot_to(old.id, "free"), _slot_to(alt[0].id, "busy")])

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        patient = _find_patient(tools, params)
        prac, sched = _find_doctor(tools, params)
        entry = next(a for a in _patient_appointments(tools, patient, "booked", now) if a["start"] == params["at"]
                     and f"Practitioner/{prac}" in {ref_key(p.get("actor")) for p in a["participant"]})
        appt = _read(tools, "Appointment", entry["id"])
        old_id = ref_key(appt["slot"][0]).split("/", 1)[1]
        end = _z(_dt(params["at"]) + timedelta(minutes=1))
        candidates = _search(tools, "Slot", {"specialty": appt["specialty"][0]["coding"][0]["code"], "status": "free",
                                             "start": [f"ge{params['at']}", f"lt{end}"]})
        new = _read(tools, "Slot", next(s["id"] for s in candidates if ref_key(s["schedule"]) != f"Schedule/{sched}"))
        schedule = _read(tools, "Schedule", ref_key(new["schedule"]).split("/", 1)[1])
        new_prac = next(ref_key(a) for a in schedule["actor"] if ref_key(a).startswith("Practitioner/"))
        for p in appt["participant"]:
            if ref_key(p.get("actor")) == f"Practitioner/{prac}":
                p["actor"] = {"reference": new_prac}
                p["status"] = "accepted"
        appt["slot"] = [{"reference": f"Slot/{new['id']}"}]
        _update(tools, appt)
        _update(tools, {**_read(tools, "Slot", old_id), "status": "free"})
        _update(tools, {**new, "status": "busy"})
        return f"Moved the appointment to {new_prac}."
