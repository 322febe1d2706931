"""What more than one of the scheduling modules uses: world facts, phrasing, checks and reference steps."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from ....tools import Toolbox
from ... import View
from ...checks import ref_id
from ...draw import human_date
from ...facts import (
    Slot,
    active_schedules,
    appointments,
    full_name,
    locations,
    practitioners,
    roles,
    slots,
)
from ...solve import call

WEEKDAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 7: "seven", 10: "ten", 14: "fourteen",
                21: "twenty-one", 28: "twenty-eight"}


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


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _long_date(d: date | str) -> str:
    d = date.fromisoformat(d) if isinstance(d, str) else d
    return f"{WEEKDAY_NAMES[d.weekday()]}, {human_date(d)}"


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


def _doc_of(f: _Facts, params: dict) -> _Doc:
    """The doctor a prompt names (the gold side of :func:`_label`)."""
    found = [d for d in f.docs if d.name == params["doctor"]
             and (not params.get("doctor_specialty") or d.spec == params["doctor_specialty"])
             and (not params.get("doctor_city") or d.city == params["doctor_city"])]
    assert len(found) == 1, f"{params} names {len(found)} doctors"
    return found[0]


def _search(tools: Toolbox, rtype: str, params: dict) -> dict:
    return call(tools, "searchResources", {"resourceType": rtype, "params": params})


def _total(tools: Toolbox, rtype: str, params: dict) -> int:
    return int(_search(tools, rtype, {**params, "_summary": "count"})["total"])
