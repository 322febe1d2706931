"""Free slots: the earliest or next ones for a specialty, a doctor, a weekday or a follow-up."""

from __future__ import annotations

import random
from bisect import bisect_left
from datetime import UTC, date, datetime, timedelta

from ....tools import Toolbox
from ... import AnswerSpec, Family, Field, Gold, View, answer_text, register
from ...checks import ref_id
from ...facts import (
    Slot,
    full_name,
)
from ...solve import call
from ._scheduling_common import (
    NUMBER_WORDS,
    WEEKDAY_NAMES,
    _Doc,
    _doc_of,
    _doctor_text,
    _Facts,
    _facts,
    _iso,
    _label,
    _midnight,
    _search,
    _total,
    _window,
)

SLOT_ANSWER = AnswerSpec((Field("slot_id", "id", "the Slot resource id"),
                          Field("start", "datetime", "the slot's start time")))


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


def _next_weekday(today: date, weekday: int) -> date:
    """The first such weekday strictly after today (a week later if today is that weekday)."""
    return today + timedelta(days=(weekday - today.weekday() - 1) % 7 + 1)


def _pick_doc(rng: random.Random, f: _Facts, docs: list[_Doc] | None = None) -> _Doc:
    """A doctor, members of same-name pairs three times as likely (they are the interesting cases)."""
    docs = f.docs if docs is None else docs
    weights = [3 if d.name in f.shared_names else 1 for d in docs]
    return rng.choices(docs, weights=weights)[0]


def _a(word: str) -> str:
    """The word with its indefinite article ("an oncology", "a cardiology")."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _name_alternatives(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in sorted(set(names)):
        out += [n, f"Dr. {n}"]
    return out


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
