"""World facts for task families: who is in the world, read once per world file and cached.

Everything here reads the world through a :class:`~fhirgym.tasks.View` (the gold side, never agents) and
is cached per world file (``View.cached``), so sampling an instance costs microseconds after the first.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import NamedTuple

from ..spec.codes import LOINC
from ._answer import parse_instant
from ._family import View
from .checks import ref_id, ref_key


def official_name(resource: dict) -> dict:
    names = resource.get("name") or [{}]
    return next((n for n in names if n.get("use") == "official"), names[0])


def full_name(resource: dict) -> str:
    """'Given Family' without prefixes (what a clinician would type)."""
    n = official_name(resource)
    return " ".join([*(n.get("given") or [])[:1], n.get("family", "")]).strip()


def patient_ref(p: dict) -> str:
    return f"Patient/{p['id']}"


def patients(view: View) -> list[dict]:
    """Every Patient of the world (living or not), in id order: the one read the patient finders share."""
    return view.cached("facts.patients", lambda: view.search("Patient", {"_count": "1000"}))


def alive(p: dict) -> bool:
    return "deceasedDateTime" not in p and not p.get("deceasedBoolean")


def identifiable_patients(view: View) -> list[dict]:
    """Living patients with an active record whose name and birth date no other patient shares (a prompt
    names them by both), in id order."""
    def compute() -> list[dict]:
        every = patients(view)
        counts = Counter((full_name(p).casefold(), p.get("birthDate")) for p in every)
        return [p for p in sorted(every, key=lambda p: p["id"])
                if p.get("birthDate") and p.get("name") and p.get("active") is not False and alive(p)
                and counts[(full_name(p).casefold(), p["birthDate"])] == 1]
    return view.cached("facts.identifiable_patients", compute)


def living_patients(view: View) -> list[dict]:
    """Patients of the world (base only, cached), alive, with a name and birth date, sorted by id."""
    def compute() -> list[dict]:
        return sorted((p for p in patients(view) if p.get("birthDate") and p.get("name") and alive(p)),
                      key=lambda p: p["id"])
    return view.cached("living_patients", compute)


def unique_name_patients(view: View) -> list[dict]:
    """Living patients whose given+family name no other patient shares (a name alone identifies them)."""
    def compute() -> list[dict]:
        every = patients(view)
        counts: dict[str, int] = {}
        for p in every:
            counts[full_name(p).lower()] = counts.get(full_name(p).lower(), 0) + 1
        return [p for p in living_patients(view) if counts.get(full_name(p).lower()) == 1]
    return view.cached("unique_name_patients", compute)


def all_patients(view: View) -> list[dict]:
    """Every Patient of the world (living or not) with name and birth date, sorted by id (cached)."""
    def compute() -> list[dict]:
        return sorted((p for p in patients(view) if p.get("name")), key=lambda p: p["id"])
    return view.cached("records.all_patients", compute)


def same_name(view: View, name: str) -> list[dict]:
    """Every Patient whose full name (given family) is ``name`` (cached index)."""
    def compute() -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for p in all_patients(view):
            out.setdefault(full_name(p), []).append(p)
        return out
    return view.cached("records.by_name", compute).get(name, [])


def unique_patient(view: View, name: str, birth_date: str) -> dict:
    """The one Patient (living or not) with this full name and birth date, from the cached world facts."""
    found = [p for p in same_name(view, name) if p.get("birthDate") == birth_date]
    assert len(found) == 1, f"{name} {birth_date} matches {len(found)} patients"
    return found[0]


def name_pairs(resource: dict) -> set[tuple[str, str]]:
    """(given, family) of every name of a resource, casefolded (official, maiden, every given name)."""
    out = set()
    for n in resource.get("name") or []:
        for g in n.get("given") or []:
            out.add((g.casefold(), str(n.get("family", "")).casefold()))
    return out


def taken_names(view: View) -> set[tuple[str, str]]:
    """(given, family) pairs any Patient or RelatedPerson of the world already has (cached)."""
    def compute() -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for p in all_patients(view):
            out |= name_pairs(p)
        for rp in view.search("RelatedPerson", {"_count": "1000", "_elements": "name"}):
            out |= name_pairs(rp)
        return out
    return view.cached("records.taken_names", compute)


# -- practitioners, roles, schedules, slots and appointments ------------------------------------------------

def practitioners(view: View) -> dict[str, dict]:
    """Every Practitioner of the world by id (active or retired, in the search's id order)."""
    return view.cached("facts.practitioners", lambda: {p["id"]: p for p in view.search("Practitioner", {"_count": "1000"})})


def roles(view: View) -> dict[str, dict]:
    """Every PractitionerRole by id."""
    return view.cached("facts.roles", lambda: {r["id"]: r for r in view.search("PractitionerRole", {"_count": "1000"})})


def locations(view: View) -> dict[str, dict]:
    """Every Location by id."""
    return view.cached("facts.locations", lambda: {loc["id"]: loc for loc in view.search("Location", {"_count": "1000"})})


def active_schedules(view: View) -> list[dict]:
    """The active Schedules (the only ones that hold slots), in id order."""
    return view.cached("facts.schedules", lambda: view.search("Schedule", {"active": "true", "_count": "1000"}))


def instant(text: str) -> datetime:
    """A FHIR instant or dateTime of the world as an aware UTC datetime: the one parser of them the families use."""
    moment = parse_instant(text)
    if moment is None:
        raise ValueError(f"not a FHIR instant: {text!r}")
    return moment


def _urgent(resource: dict) -> bool:
    return any(c.get("code") == "EMERGENCY" for c in (resource.get("appointmentType") or {}).get("coding", []))


@dataclass(frozen=True)
class Slot:
    """A 30-minute Slot of a Schedule."""

    id: str
    schedule: str  # Schedule id
    start: str  # ISO instant as the world writes it (…Z): strings compare as times
    end: str
    status: str  # free, busy, busy-unavailable …
    urgent: bool  # kept for urgent visits (appointmentType v2-0276 EMERGENCY)

    @property
    def at(self) -> datetime:
        """``start`` as an aware UTC datetime."""
        return instant(self.start)


@dataclass(frozen=True)
class Appointment:
    """An Appointment, with its participants' actors in order."""

    id: str
    status: str
    start: str | None
    participants: tuple[tuple[str, str], ...]  # (resource type, id) of each participant's actor
    slot: str | None  # the first Slot id
    urgent: bool  # appointmentType EMERGENCY
    specialty: str  # specialty[0].text, "" if none
    requested: tuple[str, str] | None  # requestedPeriod[0] start and end dates (a waitlist entry)

    @property
    def at(self) -> datetime | None:
        return instant(self.start) if self.start else None

    def actor(self, rtype: str) -> str | None:
        """The first participant of this type."""
        return next((i for t, i in self.participants if t == rtype), None)

    @property
    def patient(self) -> str | None:
        return self.actor("Patient")

    @property
    def practitioner(self) -> str | None:
        return self.actor("Practitioner")

    @property
    def routine(self) -> bool:
        """Not an urgent visit."""
        return not self.urgent


def slots(view: View) -> list[Slot]:
    """Every Slot of the world, in id order (cached)."""
    def compute() -> list[Slot]:
        return [Slot(s["id"], ref_id(s.get("schedule"), "Schedule"), s["start"], s["end"], s["status"], _urgent(s))
                for s in view.search("Slot", {"_count": "1000", "_elements": "schedule,status,start,end,appointmentType"})]
    return view.cached("facts.slots", compute)


def appointments(view: View) -> list[Appointment]:
    """Every Appointment of the world, in id order (cached)."""
    def compute() -> list[Appointment]:
        out = []
        for a in view.search("Appointment", {"_count": "1000"}):
            keys = [ref_key(p.get("actor")) for p in a.get("participant", [])]
            period = (a.get("requestedPeriod") or [None])[0]
            out.append(Appointment(
                a["id"], a["status"], a.get("start"), tuple(tuple(k.split("/", 1)) for k in keys if k),
                ref_id((a.get("slot") or [None])[0], "Slot") or None, _urgent(a),
                ((a.get("specialty") or [{}])[0].get("text")) or "",
                (period["start"][:10], period["end"][:10]) if period else None))
        return out
    return view.cached("facts.appointments", compute)


# -- coverage, accounts, related persons, organisations --------------------------------------------------------

def _by_target(view: View, rtype: str, element: str) -> dict[str, list[dict]]:
    """Every resource of ``rtype`` under the id of each resource its ``element`` references (search order)."""
    def compute() -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for res in view.search(rtype, {"_count": "1000"}):
            target = res.get(element)
            for pid in {ref_id(t) for t in (target if isinstance(target, list) else [target])}:
                out.setdefault(pid, []).append(res)
        return out
    return view.cached(f"facts.{rtype}.{element}", compute)


def coverages(view: View) -> dict[str, list[dict]]:
    """Every Coverage under its beneficiary's id."""
    return _by_target(view, "Coverage", "beneficiary")


def accounts(view: View) -> dict[str, list[dict]]:
    """Every Account under each of its subjects' ids."""
    return _by_target(view, "Account", "subject")


def related_persons(view: View) -> dict[str, list[dict]]:
    """Every RelatedPerson under its patient's id."""
    return _by_target(view, "RelatedPerson", "patient")


def related_by_id(view: View) -> dict[str, dict]:
    """Every RelatedPerson by its own id."""
    return view.cached("facts.related_by_id",
                       lambda: {r["id"]: r for rs in related_persons(view).values() for r in rs})


def organizations(view: View) -> dict[str, dict]:
    """Every Organization by id."""
    return view.cached("facts.organizations",
                       lambda: {o["id"]: o for o in view.search("Organization", {"_count": "1000"})})


# -- orders and results ------------------------------------------------------------------------------------

def moment(value: str) -> datetime:
    """A FHIR date or dateTime as an aware UTC datetime (a date: its midnight UTC)."""
    when = datetime.fromisoformat(value.replace("Z", "+00:00")) if "T" in value else \
        datetime.combine(date.fromisoformat(value[:10]), datetime.min.time())
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


class Result(NamedTuple):
    """One Observation result of a patient."""

    at: datetime  # effectiveDateTime
    status: str | None
    value: float | None  # valueQuantity.value
    code: str | None  # the LOINC code it was found by
    id: str


def results(view: View, codes: tuple[str, ...]) -> dict[str, list[Result]]:
    """Patient id → the world's results of these LOINC codes, oldest first (ties by id)."""
    def compute() -> dict[str, list[Result]]:
        out: dict[str, list[Result]] = {}
        query = {"code": ",".join(f"{LOINC}|{c}" for c in codes), "_count": "1000",
                 "_elements": "subject,effectiveDateTime,status,valueQuantity,code"}
        for o in view.search("Observation", query):
            pid, when = ref_id(o.get("subject"), "Patient"), o.get("effectiveDateTime")
            if not pid or not when:
                continue
            code = next((c.get("code") for c in o.get("code", {}).get("coding", []) if c.get("code") in codes), None)
            out.setdefault(pid, []).append(
                Result(moment(when), o.get("status"), (o.get("valueQuantity") or {}).get("value"), code, o["id"]))
        for rows in out.values():
            rows.sort(key=lambda r: (r.at, r.id))
        return out
    return view.cached("facts.results." + "_".join(codes), compute)


def service_requests(view: View, category: str) -> list[dict]:
    """The ServiceRequests of a category (``system|code``), in id order."""
    return view.cached(f"facts.orders.{category}",
                       lambda: view.search("ServiceRequest", {"category": category, "_count": "1000"}))


def reports(view: View, code: str) -> list[dict]:
    """The DiagnosticReports coded ``system|code``, in id order."""
    return view.cached(f"facts.reports.{code}",
                       lambda: view.search("DiagnosticReport", {"code": code, "_count": "1000"}))


def family_histories(view: View) -> list[dict]:
    """Every FamilyMemberHistory, in id order."""
    return view.cached("facts.fmh", lambda: view.search("FamilyMemberHistory", {"_count": "1000"}))
