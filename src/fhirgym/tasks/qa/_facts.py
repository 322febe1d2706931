"""A patient's record as the generator sees it: events per kind, read through the FHIR API.

The generator reads each patient exactly as an agent could (``{type}?patient=`` searches over the
embedded server, Medication and Location read by id) and flattens the resources into
:class:`Event` rows, so the gold answer is computed from what the API serves. The tests recompute
every answer from the raw world file with SQL instead (a second, independent path).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from ...fhir import FhirClient
from .._answer import parse_instant

#: Event kinds and the resource types their gold ids come from.
KINDS = {
    "lab": ("Observation",), "vital": ("Observation",), "drug": ("MedicationRequest", "Medication"),
    "procedure": ("Procedure",), "diagnosis": ("Condition",), "specimen": ("Specimen",),
    "admission": ("Encounter",), "icu": ("Encounter",), "ed": ("Encounter",),
    "transfer": ("Encounter", "Location"), "admit_source": ("Encounter",), "discharge": ("Encounter",),
    "disposition": ("Encounter",),
    "patient": ("Patient",),
}
#: Encounter class code -> event kind (IMP = a hospital admission; ACUTE = an ICU stay nested in one).
ENCOUNTER_KINDS = {"IMP": "admission", "ACUTE": "icu", "EMER": "ed"}
ERROR = "entered-in-error"


@dataclass(frozen=True)
class Event:
    """One fact: ``name`` at ``time`` (``end`` for stays), with a numeric ``value`` where it has one."""

    rtype: str
    id: str
    name: str
    time: datetime
    value: float | None = None
    unit: str | None = None
    encounter: str | None = None
    end: datetime | None = None
    extra: tuple[tuple[str, str], ...] = ()  # further gold ids: (Medication, id), (Location, id)

    def ids(self) -> list[tuple[str, str]]:
        return [(self.rtype, self.id), *self.extra]


@dataclass
class PatientFacts:
    """Everything templates ask about one patient."""

    patient: dict
    events: dict[str, list[Event]] = field(default_factory=dict)  # kind -> events sorted by (time, id)
    visit_of: dict[str, str] = field(default_factory=dict)  # encounter id -> its admission's id

    @property
    def id(self) -> str:
        return self.patient["id"]

    @property
    def label(self) -> str:
        """How questions name the patient: the medical record number (the FHIR id when there is none)."""
        for ident in self.patient.get("identifier", []):
            if any(c.get("code") == "MR" for c in ident.get("type", {}).get("coding", [])):
                return ident["value"]
        return self.id

    def of(self, kind: str) -> list[Event]:
        return self.events.get(kind, [])


def _display(concept: dict | None) -> str | None:
    concept = concept or {}
    for c in concept.get("coding", []):
        if c.get("display"):
            return c["display"]
    return concept.get("text")


def _ref_id(reference: dict | None) -> str | None:
    value = (reference or {}).get("reference", "")
    return value.split("/", 1)[1] if "/" in value else None


def _when(value: str | None) -> datetime | None:
    return parse_instant(value) if value else None


class FactReader:
    """Reads patients through a client; Medications and Locations are read once per world."""

    def __init__(self, client: FhirClient) -> None:
        self.client = client
        self._shared: dict[tuple[str, str], dict | None] = {}

    def _get(self, rtype: str, rid: str) -> dict | None:
        key = (rtype, rid)
        if key not in self._shared:
            resp = self.client.read(rtype, rid)
            self._shared[key] = resp.body if resp.status == 200 else None
        return self._shared[key]

    def _all(self, rtype: str, pid: str) -> list[dict]:
        return self.client.search_all(rtype, {"patient": pid, "_count": "1000"}, max_pages=10_000, strict=True)

    def patients(self) -> list[dict]:
        return sorted(self.client.search_all("Patient", {"_count": "1000"}, max_pages=10_000, strict=True),
                      key=lambda p: p["id"])

    def read(self, patient: dict) -> PatientFacts:
        pid = patient["id"]
        ev: dict[str, list[Event]] = defaultdict(list)
        for obs in self._all("Observation", pid):
            cats = {c.get("code") for cat in obs.get("category", []) for c in cat.get("coding", [])}
            kind = "lab" if "laboratory" in cats else "vital" if "vital-signs" in cats else None
            qty, t, name = obs.get("valueQuantity"), _when(obs.get("effectiveDateTime")), _display(obs.get("code"))
            if kind and qty and "value" in qty and t and name and obs.get("status") != ERROR:
                ev[kind].append(Event("Observation", obs["id"], name, t, float(qty["value"]), qty.get("unit"),
                                      _ref_id(obs.get("encounter"))))
        for req in self._all("MedicationRequest", pid):
            t = _when(req.get("authoredOn"))
            med_id = _ref_id(req.get("medicationReference"))
            med = self._get("Medication", med_id) if med_id else None
            name = _display((med or {}).get("code") if med_id else req.get("medicationCodeableConcept"))
            if not t or not name or req.get("status") == ERROR:
                continue
            dose = next((dr["doseQuantity"] for d in req.get("dosageInstruction", [])
                         for dr in d.get("doseAndRate", []) if "doseQuantity" in dr), {})
            ev["drug"].append(Event("MedicationRequest", req["id"], name, t, dose.get("value"), dose.get("unit"),
                                    _ref_id(req.get("encounter")), extra=(("Medication", med_id),) if med_id else ()))
        for proc in self._all("Procedure", pid):
            t = _when(proc.get("performedDateTime") or proc.get("performedPeriod", {}).get("start"))
            name = _display(proc.get("code"))
            if t and name and proc.get("status") != ERROR:
                ev["procedure"].append(Event("Procedure", proc["id"], name, t, encounter=_ref_id(proc.get("encounter"))))
        for cond in self._all("Condition", pid):
            t = _when(cond.get("onsetDateTime") or cond.get("recordedDate"))
            name = _display(cond.get("code"))
            status = {c.get("code") for c in cond.get("verificationStatus", {}).get("coding", [])}
            if t and name and ERROR not in status:
                ev["diagnosis"].append(Event("Condition", cond["id"], name, t, encounter=_ref_id(cond.get("encounter"))))
        for spec in self._all("Specimen", pid):
            t = _when(spec.get("collection", {}).get("collectedDateTime"))
            name = _display(spec.get("type"))
            qty = spec.get("collection", {}).get("quantity", {})
            if t and name and spec.get("status") != ERROR:
                ev["specimen"].append(Event("Specimen", spec["id"], name, t, qty.get("value"), qty.get("unit")))
        visit_of: dict[str, str] = {}
        for enc in self._all("Encounter", pid):
            kind = ENCOUNTER_KINDS.get(enc.get("class", {}).get("code"))
            period = enc.get("period", {})
            start = _when(period.get("start"))
            if not kind or not start or enc.get("status") == ERROR:
                continue
            end = _when(period.get("end"))
            days = (end - start).total_seconds() / 86400 if end else None
            ev[kind].append(Event("Encounter", enc["id"], _display((enc.get("type") or [{}])[0]) or kind, start,
                                  days, "days", enc["id"], end))
            if kind == "admission":
                visit_of[enc["id"]] = enc["id"]
                hosp = enc.get("hospitalization", {})
                source, disposition = _display(hosp.get("admitSource")), _display(hosp.get("dischargeDisposition"))
                if source:
                    ev["admit_source"].append(Event("Encounter", enc["id"], source, start, encounter=enc["id"]))
                if end:
                    ev["discharge"].append(Event("Encounter", enc["id"], "discharge", end, encounter=enc["id"]))
                if end and disposition:
                    ev["disposition"].append(Event("Encounter", enc["id"], disposition, end, encounter=enc["id"]))
                for stay in enc.get("location", []):
                    loc_id, p = _ref_id(stay.get("location")), stay.get("period", {})
                    loc = self._get("Location", loc_id) if loc_id else None
                    t = _when(p.get("start"))
                    if loc and t:
                        ev["transfer"].append(Event("Encounter", enc["id"], loc.get("name", loc_id), t,
                                                    encounter=enc["id"], end=_when(p.get("end")),
                                                    extra=(("Location", loc_id),)))
            elif enc.get("partOf"):
                visit_of[enc["id"]] = _ref_id(enc["partOf"]) or enc["id"]
        for events in ev.values():
            events.sort(key=lambda e: (e.time, e.id))
        return PatientFacts(patient, dict(ev), visit_of)
