"""What more than one of the scheduling modules uses: world facts, phrasing, checks and reference steps."""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from ....tools import Toolbox
from ... import Expect, View
from ...checks import (
    Check,
    at,
    custom,
    eq,
    ref_id,
    ref_key,
    refs_exactly,
)
from ...draw import human_date
from ...facts import (
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
from ...solve import read, search

PEDIATRICS, GENERAL, OBGYN = "394537008", "394814009", "394585009"  # SNOMED specialty codes


HOLDING = frozenset({"booked", "arrived", "fulfilled", "noshow", "checked-in"})


MARGIN = timedelta(hours=1)  # no booking a task hinges on lies within an hour of now


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


def _usable_doctors(w: _World) -> list[dict]:
    return [w.doctors[k] for k in sorted(w.doctors)]


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


def _booked(slot: Slot, patient: str, practitioner: str) -> tuple[Check, ...]:
    return (eq("status", "booked"), refs_exactly("slot", [f"Slot/{slot.id}"]), at("start", slot.start),
            at("end", slot.end), _participants(f"Patient/{patient}", f"Practitioner/{practitioner}", True))


def _slot_to(slot_id: str, status: str) -> Expect:
    return Expect("update", "Slot", id=slot_id, checks=(eq("status", status),))


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
