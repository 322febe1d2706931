"""Scheduling & appointments, read-only (FHIR-AgentEval, 10 tasks): free slots and who holds a booking.

Every question is about the 30-minute Slots of the practitioners' Schedules: earliest free slots by
specialty, doctor traits or name, counts in a window, the free slots of a stated day or morning, and who
holds a booking. The conventions the prompts state ("free", bookable, "routine", "next Tuesday",
same-name doctors) are in docs/TASKS.md, "The built-in library".
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from ...tools import Toolbox
from .. import NOT_FOUND, AnswerSpec, Family, Field, Gold, View, answer_text, register
from ..checks import ref_id
from ..draw import deal, deal_by_gold, human_date, negative_seed
from ..facts import (
    Slot,
    active_schedules,
    appointments,
    full_name,
    instant,
    locations,
    practitioners,
    roles,
    slots,
)
from ..solve import call

HOLDING = frozenset({"booked", "arrived", "fulfilled", "noshow", "checked-in"})
WEEKDAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 7: "seven", 10: "ten", 14: "fourteen",
                21: "twenty-one", 28: "twenty-eight"}

SLOT_ANSWER = AnswerSpec((Field("slot_id", "id", "the Slot resource id"),
                          Field("start", "datetime", "the slot's start time")))


# -- world facts (cached per world file) ----------------------------------------------------------------

@dataclass(frozen=True)
class _Doc:
    """An active doctor with an active schedule (the only schedules that hold slots)."""

    pid: str
    name: str  # "Maria Garcia"
    gender: str
    city: str
    langs: tuple[str, ...]  # BCP-47 codes
    schedule: str
    role: str
    specialty: str  # Schedule.specialty.text, e.g. "Cardiology"
    location: str
    location_name: str

    @property
    def spec(self) -> str:
        return self.specialty.lower()


@dataclass(frozen=True)
class _Appt:
    id: str
    status: str
    start: datetime
    patient: str
    practitioner: str
    location: str
    specialty: str


@dataclass
class _Facts:
    docs: list[_Doc]
    by_schedule: dict[str, _Doc]
    slots: dict[str, list[Slot]]  # schedule -> slots sorted by start
    starts: dict[str, list[datetime]]  # schedule -> the starts of ``slots`` (for bisect)
    appts: list[_Appt]
    name_counts: Counter  # "Given Family" over every Practitioner on file (retired, Synthea's included)
    lang_names: dict[str, str]
    shared_names: set[str] = field(default_factory=set)
    urgent_free: list[Slot] = field(default_factory=list)  # every free urgent slot, sorted by start
    urgent_starts: list[datetime] = field(default_factory=list)




def _facts(view: View) -> _Facts:
    def compute() -> _Facts:
        pracs, role_of, places = practitioners(view), roles(view), locations(view)
        lang_names: dict[str, str] = {}
        docs: list[_Doc] = []
        for sched in active_schedules(view):
            actors = [a.get("reference", "") for a in sched.get("actor", [])]
            pid = next((ref_id({"reference": a}) for a in actors if a.startswith("Practitioner/")), None)
            rid = next((ref_id({"reference": a}) for a in actors if a.startswith("PractitionerRole/")), None)
            if pid not in pracs or rid not in role_of:
                continue
            p, role = pracs[pid], role_of[rid]
            if not (p.get("active") and role.get("active")):
                continue
            langs = []
            for c in p.get("communication", []):
                for coding in c.get("coding", []):
                    langs.append(coding["code"])
                    lang_names[coding["code"]] = coding.get("display") or c.get("text") or coding["code"]
            loc_id = ref_id((role.get("location") or [{}])[0])
            city = next((a.get("city") for a in p.get("address", []) if a.get("city")), "")
            docs.append(_Doc(pid, full_name(p), p.get("gender", ""), city, tuple(langs), sched["id"], rid,
                             sched["specialty"][0]["text"], loc_id, places.get(loc_id, {}).get("name", "")))
        docs.sort(key=lambda d: (d.specialty, d.name, d.schedule))
        by_schedule = {d.schedule: d for d in docs}
        by_sched: dict[str, list[Slot]] = {d.schedule: [] for d in docs}
        for s in slots(view):
            if s.schedule in by_sched:
                by_sched[s.schedule].append(s)
        for lst in by_sched.values():
            lst.sort(key=lambda s: (s.at, s.id))
        appts = []
        for a in appointments(view):
            if a.start is None:
                continue
            who = dict(a.participants)  # the last participant of a type, as the prompts name them
            appts.append(_Appt(a.id, a.status, a.at, who.get("Patient", ""), who.get("Practitioner", ""),
                               who.get("Location", ""), a.specialty))
        names = Counter(full_name(p) for p in pracs.values())
        facts = _Facts(docs, by_schedule, by_sched, {k: [s.at for s in v] for k, v in by_sched.items()}, appts,
                       names, lang_names)
        facts.shared_names = {n for n, c in names.items() if c > 1}
        facts.urgent_free = sorted((s for lst in by_sched.values() for s in lst if s.urgent and s.status == "free"),
                                   key=lambda s: (s.at, s.id))
        facts.urgent_starts = [s.at for s in facts.urgent_free]
        return facts
    return view.cached("sched_facts", compute)


def _window(f: _Facts, docs: list[_Doc], lo: datetime, hi: datetime, status: str = "free",
            routine: bool = False) -> list[Slot]:
    """Slots of ``docs`` with ``lo <= start < hi`` and this status (``routine``: urgent ones left out),
    sorted by start."""
    out: list[Slot] = []
    for d in docs:
        starts, slots = f.starts[d.schedule], f.slots[d.schedule]
        for s in slots[bisect_left(starts, lo):bisect_left(starts, hi)]:
            if s.status == status and not (routine and s.urgent):
                out.append(s)
    out.sort(key=lambda s: (s.at, s.id))
    return out


def _first_free(f: _Facts, docs: list[_Doc], lo: datetime) -> list[Slot]:
    """The earliest free routine slots of ``docs`` starting at or after ``lo`` (several when tied)."""
    firsts: list[Slot] = []
    for d in docs:
        slots = f.slots[d.schedule]
        for s in slots[bisect_left(f.starts[d.schedule], lo):]:
            if s.status == "free" and not s.urgent:
                firsts.append(s)
                break
    if not firsts:
        return []
    first = min(s.at for s in firsts)
    return sorted((s for s in firsts if s.at == first), key=lambda s: s.id)


def _urgent(f: _Facts, lo: datetime, hi: datetime, specialty: str | None) -> list[Slot]:
    """Free urgent slots with ``lo <= start < hi`` (of one specialty, or all)."""
    out = f.urgent_free[bisect_left(f.urgent_starts, lo):bisect_left(f.urgent_starts, hi)]
    return [s for s in out if specialty is None or f.by_schedule[s.schedule].spec == specialty]


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _long_date(d: date | str) -> str:
    d = date.fromisoformat(d) if isinstance(d, str) else d
    return f"{WEEKDAY_NAMES[d.weekday()]}, {human_date(d)}"


def _next_weekday(today: date, weekday: int) -> date:
    """The first such weekday strictly after today (a week later if today is that weekday)."""
    return today + timedelta(days=(weekday - today.weekday() - 1) % 7 + 1)


def _label(f: _Facts, doc: _Doc) -> dict:
    """How the prompt names a doctor: name, plus specialty (and city) when another doctor shares it."""
    twins = [d for d in f.docs if d.name == doc.name and d is not doc]
    if doc.name not in f.shared_names and not twins:
        return {"doctor": doc.name, "doctor_specialty": None, "doctor_city": None}
    if all(d.spec != doc.spec for d in twins):
        return {"doctor": doc.name, "doctor_specialty": doc.spec, "doctor_city": None}
    return {"doctor": doc.name, "doctor_specialty": doc.spec, "doctor_city": doc.city}


def _doctor_text(params: dict) -> str:
    extra = [x for x in (params.get("doctor_specialty"), params.get("doctor_city")) if x]
    return f"Dr. {params['doctor']}" + (f" ({', '.join(extra)})" if extra else "")


def _pick_doc(rng: random.Random, f: _Facts, docs: list[_Doc] | None = None) -> _Doc:
    """A doctor, members of same-name pairs three times as likely (they are the interesting cases)."""
    docs = f.docs if docs is None else docs
    weights = [3 if d.name in f.shared_names else 1 for d in docs]
    return rng.choices(docs, weights=weights)[0]


def _doc_of(f: _Facts, params: dict) -> _Doc:
    """The doctor a prompt names (the gold side of :func:`_label`)."""
    found = [d for d in f.docs if d.name == params["doctor"]
             and (not params.get("doctor_specialty") or d.spec == params["doctor_specialty"])
             and (not params.get("doctor_city") or d.city == params["doctor_city"])]
    assert len(found) == 1, f"{params} names {len(found)} doctors"
    return found[0]


def _a(word: str) -> str:
    """The word with its indefinite article ("an oncology", "a cardiology")."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _name_alternatives(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in sorted(set(names)):
        out += [n, f"Dr. {n}"]
    return out


# -- reference-solution helpers (tools only) -------------------------------------------------------------

def _search(tools: Toolbox, rtype: str, params: dict) -> dict:
    return call(tools, "searchResources", {"resourceType": rtype, "params": params})


def _total(tools: Toolbox, rtype: str, params: dict) -> int:
    return int(_search(tools, rtype, {**params, "_summary": "count"})["total"])


def _doctor_schedules(tools: Toolbox, name: str, specialty: str | None = None, city: str | None = None) -> list[str]:
    """Active schedules of the doctor called ``name`` (narrowed by specialty and city when given)."""
    given, family = name.split()[0], name.split()[-1]
    found = _search(tools, "Practitioner", {"given": given, "family": family, "_elements": "name,address,active"})
    out = []
    for p in found.get("resources", []):
        if full_name(p) != name:
            continue
        if city and not any(a.get("city") == city for a in p.get("address", [])):
            continue
        scheds = _search(tools, "Schedule", {"actor": f"Practitioner/{p['id']}", "active": "true",
                                             "_elements": "specialty,actor"})
        for s in scheds.get("resources", []):
            texts = {str(c.get("text", "")).lower() for c in s.get("specialty", [])}
            if specialty is None or specialty in texts:
                out.append(s["id"])
    return out


def _slots(tools: Toolbox, params: dict) -> list[dict]:
    """Every matching slot (pages followed), as returned by the tool."""
    out = call(tools, "searchResources", {"resourceType": "Slot", "all_pages": True, "page_limit": 20,
                                         "params": {"_count": "40", "_elements": "start,status", **params}})
    return out.get("resources", [])


def _first_slot(tools: Toolbox, params: dict) -> dict | None:
    found = _search(tools, "Slot", {"status": "free", "_sort": "start", "_count": "1", **params})
    return (found.get("resources") or [None])[0]


def _schedules_at(tools: Toolbox, location_name: str, specialty: str) -> list[str]:
    """Active schedules of the active roles of ``specialty`` at the clinic called ``location_name``."""
    locs = [loc for loc in _search(tools, "Location", {"name": location_name, "_elements": "name"})["resources"]
            if loc.get("name") == location_name]
    out = []
    for loc in locs:
        roles = _search(tools, "PractitionerRole", {"location": f"Location/{loc['id']}", "active": "true",
                                                    "specialty:text": specialty, "_elements": "id"})
        for role in roles.get("resources", []):
            scheds = _search(tools, "Schedule", {"actor": f"PractitionerRole/{role['id']}", "active": "true",
                                                 "_elements": "id"})
            out += [s["id"] for s in scheds.get("resources", [])]
    return out


# -- families ---------------------------------------------------------------------------------------------

@register("scheduling.earliest_specialty_slot", difficulty=2, touches=("Slot",),
          sequences=(("searchResources",),))
class EarliestSpecialtySlot(Family):
    """Earliest free routine slot of a specialty, across its doctors

    Several doctors share a specialty and often the same earliest time: any of them is right."""

    answer = AnswerSpec((Field("start", "datetime", "the slot's start time"),
                         Field("doctor", "text", "the doctor's first and last name")))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        specs = sorted({d.spec for d in f.docs})
        return {"specialty": rng.choice(specs)}

    def prompt(self, params: dict) -> str:
        return (f"A patient wants the earliest possible {params['specialty']} appointment, with any "
                f"{params['specialty']} doctor. Find the earliest free slot for a routine visit (not one of the "
                "slots reserved for urgent visits) that starts at or after the current time. When does it start "
                "and which doctor is it with?")

    def gold(self, view: View, params: dict) -> Gold:
        f = _facts(view)
        docs = [d for d in f.docs if d.spec == params["specialty"]]
        firsts = _first_free(f, docs, view.now)
        names = [f.by_schedule[s.schedule].name for s in firsts]
        return Gold(answer={"start": firsts[0].at, "doctor": _name_alternatives(names)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        slot = _first_slot(tools, {"specialty:text": params["specialty"], "appointment-type": "ROUTINE",
                                   "start": f"ge{_iso(now)}"})
        assert slot is not None
        sched = call(tools, "getResourceById", {"resourceType": "Schedule",
                                               "resourceId": ref_id(slot["schedule"])})
        pid = next(ref_id(a) for a in sched["actor"] if a["reference"].startswith("Practitioner/"))
        doc = call(tools, "getResourceById", {"resourceType": "Practitioner", "resourceId": pid})
        return answer_text({"start": slot["start"], "doctor": full_name(doc)})


@register("scheduling.earliest_matching_doctor_slot", difficulty=3, touches=("Slot",),
          sequences=(("searchResources",),))
class EarliestMatchingDoctorSlot(Family):
    """Earliest free slot of the doctor matching a specialty, language, gender and/or city

    The doctor is described, not named: language, gender and city filters with near-miss distractors."""

    answer = SLOT_ANSWER

    @staticmethod
    def _matches(d: _Doc, c: dict) -> bool:
        return (d.spec == c["specialty"] and c["language"] in d.langs
                and (c["gender"] is None or d.gender == c["gender"]) and (c["city"] is None or d.city == c["city"]))

    def _options(self, view: View) -> list[tuple[dict, int]]:
        """Every (criteria, weight) that exactly one doctor meets; weight 3 when each criterion matters."""
        def compute() -> list[tuple[dict, int]]:
            f = _facts(view)
            out = []
            for d in f.docs:
                for lang in d.langs:
                    if lang == "en":
                        continue
                    for gender in (None, d.gender):
                        for city in (None, d.city):
                            c = {"specialty": d.spec, "language": lang, "gender": gender, "city": city}
                            if [x for x in f.docs if self._matches(x, c)] != [d]:
                                continue
                            loose = [{**c, k: None} for k in ("gender", "city") if c[k] is not None]
                            tight = all(sum(self._matches(x, lc) for x in f.docs) > 1 for lc in loose)
                            out.append((c, 3 if tight and loose else 1))
            return out
        return view.cached("sched_matching_options", compute)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        options = self._options(view)
        c, _ = rng.choices(options, weights=[w for _, w in options])[0]
        return {**c, "language_name": f.lang_names[c["language"]]}

    def prompt(self, params: dict) -> str:
        who = "doctor" if params["gender"] is None else f"{params['gender']} doctor"
        where = f" working in {params['city']}" if params["city"] else ""
        return (f"A patient needs {_a(params['specialty'])} appointment with a {who} who speaks "
                f"{params['language_name']}{where}. Find that doctor's earliest free slot for a routine visit "
                "(not one reserved for urgent visits) starting at or after the current time.")

    def gold(self, view: View, params: dict) -> Gold:
        f = _facts(view)
        docs = [d for d in f.docs if self._matches(d, params)]
        assert len(docs) == 1
        (slot,) = _first_free(f, docs, view.now)
        return Gold(answer={"slot_id": slot.id, "start": slot.at})

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        """Whether the first doctor of the plain search by language (``Practitioner?communication:text``) is a
        near miss rather than the doctor meeting every criterion (None: the language alone picks one)."""
        hits = view.search("Practitioner", {"communication:text": params["language_name"], "active": "true",
                                            "_elements": "id"})
        target = next(d.pid for d in _facts(view).docs if self._matches(d, params))
        return None if len(hits) < 2 else hits[0]["id"] != target

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        query = {"communication:text": params["language_name"], "active": "true", "_elements": "name,communication"}
        if params["gender"]:
            query["gender"] = params["gender"]
        if params["city"]:
            query["address-city"] = params["city"]
        best: dict | None = None
        for p in _search(tools, "Practitioner", query).get("resources", []):
            spoken = {str(c.get("text", "")).lower() for c in p.get("communication", [])}
            if params["language_name"].lower() not in spoken:
                continue
            scheds = _search(tools, "Schedule", {"actor": f"Practitioner/{p['id']}", "active": "true",
                                                 "specialty:text": params["specialty"], "_elements": "id"})
            for s in scheds.get("resources", []):
                slot = _first_slot(tools, {"schedule": f"Schedule/{s['id']}", "appointment-type": "ROUTINE",
                                           "start": f"ge{_iso(now)}"})
                if slot and (best is None or slot["start"] < best["start"]):
                    best = slot
        assert best is not None
        return answer_text({"slot_id": best["id"], "start": best["start"]})


@register("scheduling.count_specialty_slots", difficulty=2, touches=("Slot",),
          sequences=(("searchResources",),))
class CountSpecialtySlots(Family):
    """Count the free slots of a specialty between two dates

    A count over several doctors and days: needs a server-side count or careful paging."""

    answer = AnswerSpec((Field("count", "int", "the number of free slots"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        today = view.now.date()
        first = today + timedelta(days=rng.randint(1, 10))
        while first.weekday() >= 5:
            first += timedelta(days=1)
        last = first + timedelta(days=rng.choice((0, 0, 1, 2, 4)))
        params = {"specialty": rng.choice(sorted({d.spec for d in f.docs})), "first": first.isoformat(),
                  "last": last.isoformat(), "urgent_included": rng.random() < 0.5}
        return params if self._count(f, params) else None

    @staticmethod
    def _count(f: _Facts, params: dict) -> int:
        docs = [d for d in f.docs if d.spec == params["specialty"]]
        lo = _midnight(date.fromisoformat(params["first"]))
        hi = _midnight(date.fromisoformat(params["last"]) + timedelta(days=1))
        return len(_window(f, docs, lo, hi, routine=not params["urgent_included"]))

    def prompt(self, params: dict) -> str:
        when = (f"on {_long_date(params['first'])}" if params["first"] == params["last"] else
                f"from {_long_date(params['first'])} through {_long_date(params['last'])} (both days included)")
        kind = ("Count every free slot, including the ones reserved for urgent visits." if params["urgent_included"]
                else "Count only slots for routine visits: leave out the ones reserved for urgent visits.")
        return (f"For capacity planning: how many free {params['specialty']} appointment slots do we have {when}, "
                f"across all our {params['specialty']} doctors? {kind}")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(answer={"count": self._count(_facts(view), params)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        after = (date.fromisoformat(params["last"]) + timedelta(days=1)).isoformat()
        query = {"specialty:text": params["specialty"], "status": "free",
                 "start": [f"ge{params['first']}", f"lt{after}"]}
        if not params["urgent_included"]:
            query["appointment-type"] = "ROUTINE"
        return answer_text({"count": _total(tools, "Slot", query)})


@register("scheduling.first_doctor_slot", difficulty=2, touches=("Slot",), sequences=(("searchResources",),))
class FirstDoctorSlot(Family):
    """First free routine slot of a named doctor

    Same-name doctors exist: the prompt's specialty (or city) picks the right one."""

    answer = SLOT_ANSWER

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        return _label(f, _pick_doc(rng, f))

    def prompt(self, params: dict) -> str:
        return (f"When is the first free slot with {_doctor_text(params)} for a routine visit? Skip slots that "
                "are reserved for urgent visits, and only consider slots starting at or after the current time.")

    def gold(self, view: View, params: dict) -> Gold:
        f = _facts(view)
        (slot,) = _first_free(f, [_doc_of(f, params)], view.now)
        return Gold(answer={"slot_id": slot.id, "start": slot.at})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        (sched,) = _doctor_schedules(tools, params["doctor"], params.get("doctor_specialty"), params.get("doctor_city"))
        slot = _first_slot(tools, {"schedule": f"Schedule/{sched}", "appointment-type": "ROUTINE",
                                   "start": f"ge{_iso(now)}"})
        assert slot is not None
        return answer_text({"slot_id": slot["id"], "start": slot["start"]})


@register("scheduling.count_urgent_slots", difficulty=2, touches=("Slot",), sequences=(("searchResources",),))
class CountUrgentSlots(Family):
    """Count the free urgent-visit slots at a given time of day over the next days

    Urgent slots are marked by appointmentType EMERGENCY; the window starts now, not at midnight."""

    answer = AnswerSpec((Field("count", "int", "the number of free urgent-visit slots"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        candidates = []  # (count, params): the counts are dealt by seed, so no count is the gold of many seeds
        for days in (2, 3, 4, 5, 7):
            for specialty in [None, *sorted({d.spec for d in f.docs})]:
                urgent = _urgent(f, view.now, _midnight(view.now.date() + timedelta(days=days + 1)), specialty)
                for time in sorted({s.at.strftime("%H:%M") for s in urgent}):
                    count = sum(1 for s in urgent if s.at.strftime("%H:%M") == time)
                    candidates.append((count, {"specialty": specialty, "days": days, "time": time}))
        return deal_by_gold(view, rng, candidates)

    def prompt(self, params: dict) -> str:
        scope = f"{params['specialty']} " if params["specialty"] else ""
        across = f"all our {params['specialty']} doctors" if params["specialty"] else "all doctors and specialties"
        n = params["days"]
        return (f"How many {scope}slots reserved for urgent visits, starting at {params['time']}, are still free "
                f"today or within the next {NUMBER_WORDS[n]} days (up to and including the day {n} days from today), "
                f"across {across}? Only count slots that start at or after the current time.")

    def gold(self, view: View, params: dict) -> Gold:
        hi = _midnight(view.now.date() + timedelta(days=params["days"] + 1))
        count = sum(1 for s in _urgent(_facts(view), view.now, hi, params["specialty"])
                    if s.at.strftime("%H:%M") == params["time"])
        return Gold(answer={"count": count})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        count = 0
        hh, mm = (int(x) for x in params["time"].split(":"))
        for n in range(params["days"] + 1):
            day = now.date() + timedelta(days=n)
            start = datetime(day.year, day.month, day.day, hh, mm, tzinfo=UTC)
            if start < now:
                continue
            query = {"appointment-type": "EMERGENCY", "status": "free", "start": _iso(start)}
            if params["specialty"]:
                query["specialty:text"] = params["specialty"]
            count += _total(tools, "Slot", query)
        return answer_text({"count": count})


@register("scheduling.next_weekday_slots", difficulty=2, touches=("Slot",), sequences=(("searchResources",),))
class NextWeekdaySlots(Family):
    """All free slots on next <weekday> of a doctor or a specialty (optionally at one clinic)

    "Next Tuesday" must be resolved from the clock; the clinic variant needs location → roles → schedules."""

    answer = AnswerSpec((Field("slot_ids", "ids", "the Slot resource ids"),))

    @staticmethod
    def _docs(f: _Facts, params: dict) -> list[_Doc]:
        if params.get("doctor"):
            return [_doc_of(f, params)]
        return [d for d in f.docs if d.spec == params["specialty"]
                and (params["clinic"] is None or d.location_name == params["clinic"])]

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        weekday = rng.randrange(5)
        day = _next_weekday(view.now.date(), weekday)
        variant = rng.choice(("doctor", "doctor", "clinic", "specialty"))
        if variant == "doctor":
            params: dict = {"weekday": weekday, "clinic": None, "specialty": None, **_label(f, _pick_doc(rng, f))}
        else:
            d = rng.choice(f.docs)
            params = {"weekday": weekday, "clinic": d.location_name if variant == "clinic" else None,
                      "specialty": d.spec, "doctor": None, "doctor_specialty": None, "doctor_city": None}
        n = len(_window(f, self._docs(f, params), _midnight(day), _midnight(day + timedelta(days=1))))
        return params if 1 <= n <= 25 else None

    def prompt(self, params: dict) -> str:
        wd = WEEKDAY_NAMES[params["weekday"]]
        if params["doctor"]:
            whose = _doctor_text(params)
        elif params["clinic"]:
            whose = f"the {params['specialty']} doctors at {params['clinic']}"
        else:
            whose = f"all our {params['specialty']} doctors (every clinic)"
        return (f"List all free slots of {whose} on next {wd} (the first {wd} after today), including any slots "
                "reserved for urgent visits.")

    def gold(self, view: View, params: dict) -> Gold:
        f = _facts(view)
        day = _next_weekday(view.now.date(), params["weekday"])
        slots = _window(f, self._docs(f, params), _midnight(day), _midnight(day + timedelta(days=1)))
        return Gold(answer={"slot_ids": [s.id for s in slots]})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        scheds: list[str] = []
        if params["doctor"]:
            scheds = _doctor_schedules(tools, params["doctor"], params.get("doctor_specialty"),
                                       params.get("doctor_city"))
        elif params["clinic"]:
            scheds = _schedules_at(tools, params["clinic"], params["specialty"])
        day = _next_weekday(now.date(), params["weekday"])
        query = {"status": "free", "start": [f"ge{day.isoformat()}", f"lt{(day + timedelta(days=1)).isoformat()}"]}
        if params["doctor"] or params["clinic"]:
            query["schedule"] = ",".join(f"Schedule/{s}" for s in scheds)
        else:
            query["specialty:text"] = params["specialty"]
        slots = _slots(tools, query)
        return answer_text({"slot_ids": [s["id"] for s in slots]})


@register("scheduling.follow_up_slots", difficulty=2, touches=("Slot",), sequences=(("searchResources",),))
class FollowUpSlots(Family):
    """Free routine slots of a doctor in a follow-up window about N days ahead

    A fuzzy "in about N days" turned into a date window; a count and the first slot of it."""

    answer = AnswerSpec((Field("count", "int", "how many free routine slots the doctor has in the window"),
                         Field("first_slot_id", "id", "the Slot resource id of the earliest of them")))

    @staticmethod
    def _slots(f: _Facts, params: dict, today: date) -> list[Slot]:
        lo = _midnight(today + timedelta(days=params["days"] - params["slack"]))
        hi = _midnight(today + timedelta(days=params["days"] + params["slack"] + 1))
        return _window(f, [_doc_of(f, params)], lo, hi, routine=True)

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        params = {"days": rng.choice((7, 10, 14, 21, 28)), "slack": rng.choice((1, 2, 3)),
                  **_label(f, _pick_doc(rng, f))}
        return params if self._slots(f, params, view.now.date()) else None

    def prompt(self, params: dict) -> str:
        n, k = params["days"], params["slack"]
        return (f"{_doctor_text(params)} wants to see a patient again for a follow-up in about {NUMBER_WORDS[n]} "
                f"days: any day from {n - k} to {n + k} days from today is fine (both ends included). How many free "
                "routine slots (not the ones reserved for urgent visits) does the doctor have in that window, and "
                "which one is the earliest?")

    def gold(self, view: View, params: dict) -> Gold:
        slots = self._slots(_facts(view), params, view.now.date())
        return Gold(answer={"count": len(slots), "first_slot_id": slots[0].id})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        (sched,) = _doctor_schedules(tools, params["doctor"], params.get("doctor_specialty"), params.get("doctor_city"))
        lo = now.date() + timedelta(days=params["days"] - params["slack"])
        hi = now.date() + timedelta(days=params["days"] + params["slack"] + 1)
        query = {"schedule": f"Schedule/{sched}", "appointment-type": "ROUTINE",
                 "start": [f"ge{lo.isoformat()}", f"lt{hi.isoformat()}"]}
        count = _total(tools, "Slot", {**query, "status": "free"})
        first = _first_slot(tools, query)
        assert first is not None
        return answer_text({"count": count, "first_slot_id": first["id"]})


@register("scheduling.weekday_morning_slots", difficulty=2, touches=("Slot",),
          sequences=(("searchResources",),))
class WeekdayMorningSlots(Family):
    """A doctor's free routine <weekday> morning slots before an hour, within N days

    Three filters at once: a weekday, a time-of-day cut-off and a horizon of N days."""

    answer = AnswerSpec((Field("slot_ids", "ids", "the Slot resource ids"),))

    @staticmethod
    def _slots(f: _Facts, params: dict, today: date) -> list[Slot]:
        doc = _doc_of(f, params)
        out: list[Slot] = []
        for n in range(1, params["days"] + 1):
            day = today + timedelta(days=n)
            if day.weekday() == params["weekday"]:
                out += _window(f, [doc], _midnight(day), _midnight(day) + timedelta(hours=params["hour"]),
                               routine=True)
        return out

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        params = {"weekday": rng.randrange(5), "hour": rng.choice((10, 11)), "days": rng.choice((14, 21, 28)),
                  **_label(f, _pick_doc(rng, f))}
        return params if 1 <= len(self._slots(f, params, view.now.date())) <= 20 else None

    def prompt(self, params: dict) -> str:
        wd = WEEKDAY_NAMES[params["weekday"]]
        return (f"A patient can only come on {wd} mornings. Which free routine slots (not the ones reserved for "
                f"urgent visits) does {_doctor_text(params)} have on a {wd}, starting before {params['hour']}:00, "
                f"from tomorrow up to and including the day {params['days']} days from today?")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(answer={"slot_ids": [s.id for s in self._slots(_facts(view), params, view.now.date())]})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        (sched,) = _doctor_schedules(tools, params["doctor"], params.get("doctor_specialty"), params.get("doctor_city"))
        ids: list[str] = []
        for n in range(1, params["days"] + 1):
            day = now.date() + timedelta(days=n)
            if day.weekday() != params["weekday"]:
                continue
            cutoff = datetime(day.year, day.month, day.day, params["hour"], tzinfo=UTC)
            ids += [s["id"] for s in _slots(tools, {"schedule": f"Schedule/{sched}", "status": "free",
                                                    "appointment-type": "ROUTINE",
                                                    "start": [f"ge{day.isoformat()}", f"lt{_iso(cutoff)}"]})]
        return answer_text({"slot_ids": ids})


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
