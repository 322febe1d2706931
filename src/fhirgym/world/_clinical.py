"""Clinical post-processing of the Synthea records: the shapes real EHR data has and Synthea lacks.

Question answering over MIMIC-shaped FHIR and the FHIR-AgentEval tasks need medication references to
shared ``Medication`` resources, hospital stays with nested ED and ICU encounters, unit locations,
transfers and phase-linked vitals and labs (the last one still in progress), and deliberate ambiguity
(name-sharing second patients, entered-in-error records placed to catch a naive "latest value" read, an
inactive living patient); docs/WORLD.md says how much of each. Every feature draws from its own
``ctx.rng`` stream and id stream, so changing one never moves the others; nothing reads the wall clock.
"""

from __future__ import annotations

import bisect
import copy
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from random import Random

from ..spec.codes import (
    ACT_CODE,
    ADMIT_SOURCE,
    CONDITION_CATEGORY,
    CONDITION_CLINICAL,
    CONDITION_VERIFICATION,
    DIAGNOSIS_ROLE,
    DISCHARGE_DISPOSITION,
    IDENTIFIER_TYPE,
    LOCATION_PHYSICAL_TYPE,
    LOINC,
    MRN,
    OBSERVATION_CATEGORY,
    ORGANIZATION_TYPE,
    PARTICIPATION_TYPE,
    ROLE_CODE,
    RXNORM,
    SNOMED,
    SYNTHEA_ID,
    UCUM,
    US_SSN,
)
from ._context import WorldContext

#: Share of MedicationRequests switched to ``medicationReference``.
MEDICATION_REFERENCE_SHARE = 0.4
#: Share of (living, adult) patients given a hospital stay.
HOSPITAL_STAY_SHARE = 0.2


# ------------------------------------------------------------------------------------------------
# small helpers shared with the genetics generator
# ------------------------------------------------------------------------------------------------
def coding(system: str, code: str, display: str | None = None) -> dict:
    out = {"system": system, "code": code}
    if display:
        out["display"] = display
    return out


def concept(system: str, code: str, display: str | None = None, text: str | None = None) -> dict:
    out: dict = {"coding": [coding(system, code, display)]}
    if text:
        out["text"] = text
    return out


def ref(resource: dict) -> dict:
    return {"reference": f"{resource['resourceType']}/{resource['id']}"}


def ref_id(reference: dict | None) -> str | None:
    """The id of a ``Type/id`` reference (None for anything else)."""
    value = (reference or {}).get("reference", "")
    return value.split("/", 1)[1] if "/" in value and "?" not in value else None


def iso(moment: datetime) -> str:
    """FHIR instant in UTC, to the second (the form ``ctx.instant`` writes)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(value: str) -> datetime:
    moment = datetime.fromisoformat(value) if "T" in value else datetime.combine(date.fromisoformat(value), time())
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def at(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=UTC)


def birth_date(patient: dict) -> date | None:
    value = patient.get("birthDate")
    return date.fromisoformat(value[:10]) if isinstance(value, str) and len(value) >= 10 else None


def age_on(patient: dict, day: date) -> int:
    born = birth_date(patient)
    if born is None:
        return -1
    return day.year - born.year - ((day.month, day.day) < (born.month, born.day))


def alive_on(patient: dict, day: date) -> bool:
    if patient.get("deceasedBoolean") is True:
        return False
    died = patient.get("deceasedDateTime")
    return not (isinstance(died, str) and parse_instant(died).date() <= day)


def first_code(cc: dict | None) -> str | None:
    codings = (cc or {}).get("coding") or [{}]
    return codings[0].get("code")


def official_name(patient: dict) -> dict | None:
    names = patient.get("name") or []
    return next((n for n in names if n.get("use") == "official"), names[0] if names else None)


def display_name(patient: dict) -> str:
    name = official_name(patient) or {}
    return " ".join([*name.get("given", []), name.get("family", "")]).strip()


@dataclass
class Directory:
    """Who works where: Organizations, their Locations and practitioners, built once from ``ctx``."""

    orgs: list[dict]  # one per id, in ctx order
    location_of: dict[str, dict]  # organization id -> its first top-level Location
    copies: dict[str, list[dict]]  # Location id -> every copy in ctx (Synthea repeats shared resources)
    practitioners: dict[str, dict]  # id -> active Practitioner
    #: (practitioner id, organization id, lower-cased specialty and code texts) per PractitionerRole
    roles: list[tuple[str, str | None, str]]
    _found: dict[tuple, list[dict]] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: WorldContext) -> Directory:
        location_of: dict[str, dict] = {}
        copies: dict[str, list[dict]] = defaultdict(list)
        for loc in ctx.of_type("Location"):
            copies[loc["id"]].append(loc)
            org_id = ref_id(loc.get("managingOrganization"))
            if org_id and org_id not in location_of and not loc.get("partOf"):
                location_of[org_id] = loc
        orgs = list({o["id"]: o for o in reversed(ctx.of_type("Organization"))}.values())[::-1]
        # only people in post at the anchor: retired doctors and ended roles stay on file but order nothing
        practitioners = {p["id"]: p for p in ctx.of_type("Practitioner") if p.get("active", True)}
        today = ctx.anchor.isoformat()
        roles = []
        for role in ctx.of_type("PractitionerRole"):
            pid = ref_id(role.get("practitioner"))
            ended = role.get("period", {}).get("end", "9999")[:10] < today
            if pid in practitioners and role.get("active", True) and not ended:
                concepts = [*role.get("specialty", []), *role.get("code", [])]
                texts = [c.get("text", "") for c in concepts]
                texts += [cd.get("display", "") for c in concepts for cd in c.get("coding", [])]
                roles.append((pid, ref_id(role.get("organization")), " | ".join(texts).lower()))
        return cls(orgs, location_of, copies, practitioners, roles)

    def hospitals(self) -> list[dict]:
        """Organizations Synthea marks as hospitals (identifier ``hospital-…``) or typed as such."""
        return [o for o in self.orgs if _is_hospital(o)]

    def practitioners_where(self, words: Iterable[str], org_id: str | None = None) -> list[dict]:
        """Practitioners whose role's specialty or code mentions one of ``words`` (case-insensitive)."""
        key = (tuple(w.lower() for w in words), org_id)
        if key not in self._found:
            found: dict[str, dict] = {}
            for pid, org, text in self.roles:
                if (org_id is None or org == org_id) and any(w in text for w in key[0]):
                    found.setdefault(pid, self.practitioners[pid])
            self._found[key] = list(found.values())
        return self._found[key]

    def pick_practitioner(self, rng: Random, words: Iterable[str] = (), org_id: str | None = None) -> dict | None:
        """A practitioner with a matching role (at ``org_id`` if possible), else any; None if there are none."""
        words = list(words)
        for pool in (self.practitioners_where(words, org_id) if words and org_id else [],
                     self.practitioners_where(words) if words else [],
                     self.practitioners_where(("",))):  # "" matches every role: anyone with a role
            if pool:
                return rng.choice(pool)
        return rng.choice(list(self.practitioners.values())) if self.practitioners else None


def _is_hospital(org: dict) -> bool:
    if any(str(i.get("value", "")).startswith("hospital") for i in org.get("identifier", [])):
        return True
    return any(cd.get("code") == "HOSP" for t in org.get("type", []) for cd in t.get("coding", []))


@dataclass
class PatientIndex:
    """Each patient's Synthea resources by type, in ctx order (one pass over the world)."""

    by_patient: dict[str, dict[str, list[dict]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))

    @classmethod
    def of(cls, ctx: WorldContext, types: Iterable[str]) -> PatientIndex:
        index = cls()
        for rtype in types:
            for r in ctx.of_type(rtype):
                subject = r.get("subject") or r.get("patient") or {}
                value = subject.get("reference", "")
                if value.startswith("Patient/"):
                    index.by_patient[value[8:]][rtype].append(r)
        return index

    def get(self, patient_id: str, rtype: str) -> list[dict]:
        return self.by_patient.get(patient_id, {}).get(rtype, [])


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------
def generate(ctx: WorldContext) -> list[dict]:
    """Amend Synthea resources in ``ctx`` in place and return the new ones (Medications, stays, ambiguity)."""
    out = medication_references(ctx)
    directory = Directory.of(ctx)
    index = PatientIndex.of(ctx, ("Encounter", "Condition", "MedicationRequest"))
    stays = hospital_stays(ctx, directory, index)
    admitted = {r["subject"]["reference"].split("/", 1)[1] for r in stays if r["resourceType"] == "Encounter"}
    return out + stays + ambiguity(ctx, directory, index, avoid=admitted)


# ------------------------------------------------------------------------------------------------
# Medication references
# ------------------------------------------------------------------------------------------------
#: RxNorm dose form (the tail of a clinical drug name) -> SNOMED CT dose form, where the code is certain.
DOSE_FORMS = {
    "Oral Tablet": ("385055001", "Tablet"),
    "Chewable Tablet": ("66076007", "Chewable tablet"),
    "Oral Capsule": ("385049006", "Capsule"),
    "Oral Solution": ("385023001", "Oral solution"),
    "Injectable Solution": ("385219001", "Solution for injection"),
}
_UCUM_UNITS = {"MG": "mg", "MCG": "ug", "UNT": "[U]", "MEQ": "meq", "ML": "mL"}
_PER_UNITS = {"ML": "mL", "ACTUAT": "{actuat}", "HR": "h"}
_NAME_PREFIX = re.compile(r"^(?:NDA\d+ )?(?:Abuse-Deterrent )?(?:\d+(?:\.\d+)? (?:HR|ML|ACTUAT) )?")
_DRUG_NAME = re.compile(r"(?P<ings>.+ (?:MG|MCG|UNT|MEQ)(?:/(?:ML|ACTUAT|HR))?) (?P<form>[A-Z][A-Za-z \-]+)")
_INGREDIENT = re.compile(r"(?P<name>.+?) (?P<value>\d+(?:\.\d+)?) (?P<unit>MG|MCG|UNT|MEQ)(?:/(?P<per>ML|ACTUAT|HR))?")


def medication_references(ctx: WorldContext) -> list[dict]:
    """Switch a seeded 40 % of RxNorm-coded MedicationRequests to ``medicationReference`` (in place)."""
    rng = ctx.rng("clinical:medications")
    candidates = [m for m in ctx.of_type("MedicationRequest") if _rxnorm(m.get("medicationCodeableConcept"))]
    chosen = {id(m) for m in rng.sample(candidates, round(MEDICATION_REFERENCE_SHARE * len(candidates)))}
    medications: dict[str, dict] = {}
    for request in candidates:
        if id(request) not in chosen:
            continue
        rx = _rxnorm(request["medicationCodeableConcept"])
        assert rx is not None
        med = medications.get(rx["code"])
        if med is None:
            med = medications[rx["code"]] = medication(ctx.new_id("clinical:medications"), rx)
        request["medicationReference"] = ref(med)
        del request["medicationCodeableConcept"]
    return list(medications.values())


def _rxnorm(cc: dict | None) -> dict | None:
    return next((c for c in (cc or {}).get("coding", []) if c.get("system") == RXNORM and c.get("code")), None)


def medication(med_id: str, rx: dict) -> dict:
    """A Medication for one RxNorm clinical drug, with dose form and ingredients read from its name."""
    name = rx.get("display", "")
    med: dict = {"resourceType": "Medication", "id": med_id, "code": {"coding": [dict(rx)], "text": name},
                 "status": "active"}
    core = _NAME_PREFIX.sub("", re.sub(r" \[[^\]]+\]$", "", name))
    match = _DRUG_NAME.fullmatch(core)
    if not match:
        return med  # packs ("28 Day Pack"), devices and combinations without strengths: code only
    form = match["form"]
    med["form"] = concept(SNOMED, *DOSE_FORMS[form], text=form) if form in DOSE_FORMS else {"text": form}
    ingredients = []
    for part in match["ings"].split(" / "):
        ing = _INGREDIENT.fullmatch(part)
        if not ing:
            continue
        unit = _UCUM_UNITS[ing["unit"]]
        per = ing["per"]
        denominator = ({"value": 1, "unit": _PER_UNITS[per], "system": UCUM, "code": _PER_UNITS[per]} if per
                       else {"value": 1, "unit": "1", "system": UCUM, "code": "1"})
        ingredients.append({
            "itemCodeableConcept": {"text": ing["name"]},
            "isActive": True,
            "strength": {"numerator": {"value": _number(ing["value"]), "unit": unit, "system": UCUM, "code": unit},
                         "denominator": denominator},
        })
    if ingredients:
        med["ingredient"] = ingredients
    return med


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() else value


# ------------------------------------------------------------------------------------------------
# Hospital stays
# ------------------------------------------------------------------------------------------------
#: key -> (name, alias, v3-RoleCode type, its display)
UNITS = {
    "ED": ("Emergency Department", "ED", "ER", "Emergency room"),
    "MICU": ("Medical Intensive Care Unit (MICU)", "MICU", "ICU", "Intensive care unit"),
    "SICU": ("Surgical Intensive Care Unit (SICU)", "SICU", "ICU", "Intensive care unit"),
    "CVICU": ("Cardiac Vascular Intensive Care Unit (CVICU)", "CVICU", "ICU", "Intensive care unit"),
    "MED": ("Medicine", "Medicine ward", "HU", "Hospital unit"),
    "SURG": ("Surgery", "Surgical ward", "HU", "Hospital unit"),
    "CARD": ("Cardiology", "Cardiology ward", "HU", "Hospital unit"),
}

#: Admission reason (SNOMED CT) -> ICU and ward it goes through.
REASONS = [
    ("91302008", "Sepsis (disorder)", "MICU", "MED"),
    ("233604007", "Pneumonia (disorder)", "MICU", "MED"),
    ("195951007", "Acute exacerbation of chronic obstructive airways disease (disorder)", "MICU", "MED"),
    ("74474003", "Gastrointestinal hemorrhage (disorder)", "MICU", "MED"),
    ("230690007", "Cerebrovascular accident (disorder)", "MICU", "MED"),
    ("22298006", "Myocardial infarction (disorder)", "CVICU", "CARD"),
    ("42343007", "Congestive heart failure (disorder)", "CVICU", "CARD"),
    ("85189001", "Acute appendicitis (disorder)", "SICU", "SURG"),
]

DISPOSITIONS = [("home", "Home", 6), ("alt-home", "Alternative home", 1), ("snf", "Skilled nursing facility", 2),
                ("rehab", "Rehabilitation", 1), ("other-hcf", "Other healthcare facility", 1)]

#: LOINC code -> (display, category, UCUM unit, mean when sick, mean when recovered, sd, decimals, min, max);
#: codes and units as Synthea writes them, so Synthea's and the stays' charting search alike.
VITALS = {
    "8867-4": ("Heart rate", "/min", 108, 78, 7, 0, 40, 180),
    "9279-1": ("Respiratory rate", "/min", 24, 16, 2.5, 0, 8, 40),
    "2708-6": ("Oxygen saturation in Arterial blood", "%", 91, 97, 1.5, 0, 80, 100),
    "8310-5": ("Body temperature", "Cel", 38.3, 36.9, 0.3, 1, 35, 41),
}
BLOOD_PRESSURE = ("85354-9", "Blood pressure panel with all children optional")
SYSTOLIC = ("8480-6", "Systolic blood pressure", 98, 122, 9)
DIASTOLIC = ("8462-4", "Diastolic blood pressure", 56, 76, 6)
LABS = {
    "2345-7": ("Glucose [Mass/volume] in Serum or Plasma", "mg/dL", 168, 108, 22, 0, 40, 500),
    "2160-0": ("Creatinine [Mass/volume] in Serum or Plasma", "mg/dL", 1.7, 1.0, 0.2, 1, 0.3, 8),
    "2951-2": ("Sodium [Moles/volume] in Serum or Plasma", "mmol/L", 133, 139, 2, 0, 120, 155),
    "2823-3": ("Potassium [Moles/volume] in Serum or Plasma", "mmol/L", 4.9, 4.1, 0.3, 1, 2.5, 6.5),
    "19123-9": ("Magnesium [Mass/volume] in Serum or Plasma", "mg/dL", 1.6, 2.0, 0.15, 1, 0.8, 3.5),
    "718-7": ("Hemoglobin [Mass/volume] in Blood", "g/dL", 10.4, 12.2, 0.5, 1, 5, 18),
    "6690-2": ("Leukocytes [#/volume] in Blood by Automated count", "10*3/uL", 14.5, 8.0, 1.8, 1, 1, 40),
    "2524-7": ("Lactate [Moles/volume] in Serum or Plasma", "mmol/L", 3.1, 1.2, 0.4, 1, 0.4, 12),
}
#: Reason-specific lab means (sick, recovered) where the diagnosis shows in the numbers.
LAB_OVERRIDES = {
    "91302008": {"2524-7": (4.2, 1.4), "6690-2": (19.0, 9.0)},
    "74474003": {"718-7": (7.6, 9.4)},
    "42343007": {"2951-2": (130, 136), "2160-0": (2.1, 1.4)},
}
ICU_ONLY_LABS = {"2524-7"}


def hospital_stays(ctx: WorldContext, directory: Directory, index: PatientIndex) -> list[dict]:
    """Admissions (IMP) with nested ED and ICU encounters for ~20 % of living adult patients."""
    rng = ctx.rng("clinical:stays")
    eligible = [p for p in ctx.patients() if alive_on(p, ctx.anchor) and age_on(p, ctx.anchor) >= 18
                and p.get("active", True)]
    if not eligible:
        return []
    count = min(len(eligible), max(2, round(HOSPITAL_STAY_SHARE * len(ctx.patients()))))
    chosen = sorted(rng.sample(eligible, count), key=eligible.index)
    builder = _StayBuilder(ctx, rng, directory, index)
    out: list[dict] = []
    for n, patient in enumerate(chosen):
        # the first stay surely has ED + ICU (tests and tasks can rely on one); the last is ongoing
        out += builder.stay(patient, full=(n == 0), ongoing=(n == len(chosen) - 1 and n > 0))
    return builder.locations + out


class _StayBuilder:
    def __init__(self, ctx: WorldContext, rng: Random, directory: Directory, index: PatientIndex) -> None:
        self.ctx, self.rng, self.dir, self.index = ctx, rng, directory, index
        self.units: dict[str, dict[str, dict]] = {}  # hospital org id -> unit key -> Location
        self.locations: list[dict] = []  # new Locations (and a new hospital, if the world had none)
        self._fallback: dict | None = None

    def new_id(self) -> str:
        return self.ctx.new_id("clinical:stays")

    # -- places --------------------------------------------------------------------------------
    def hospital_for(self, patient: dict) -> dict:
        """The hospital of the patient's latest Synthea emergency/inpatient encounter, else a seeded one."""
        hospitals = self.dir.hospitals()
        by_id = {o["id"]: o for o in hospitals}
        for enc in reversed(self.index.get(patient["id"], "Encounter")):
            org_id = ref_id(enc.get("serviceProvider"))
            if enc.get("class", {}).get("code") in ("EMER", "IMP") and org_id in by_id:
                return by_id[org_id]
        if hospitals:
            return self.rng.choice(hospitals)
        if self._fallback is None:
            self._fallback = self._new_hospital()
        return self._fallback

    def _new_hospital(self) -> dict:
        """A hospital for worlds without one (no Synthea data): stays need a provider and a building."""
        org = {"resourceType": "Organization", "id": self.new_id(), "active": True,
               "type": [concept(ORGANIZATION_TYPE, "prov",
                                "Healthcare Provider")],
               "name": "Commonwealth General Hospital",
               "address": [{"line": ["1 Hospital Drive"], "city": "Boston", "state": "MA", "postalCode": "02114",
                            "country": "US"}]}
        self.locations.append(org)
        return org

    def unit(self, hospital: dict, key: str) -> dict:
        units = self.units.get(hospital["id"])
        if units is None:
            units = self.units[hospital["id"]] = self._units(hospital)
        return units[key]

    def _units(self, hospital: dict) -> dict[str, dict]:
        site = self.dir.location_of.get(hospital["id"])
        if site is None:
            site = {"resourceType": "Location", "id": self.new_id(), "status": "active", "name": hospital["name"],
                    "managingOrganization": ref(hospital)}
            if hospital.get("address"):
                site["address"] = copy.deepcopy(hospital["address"][0])
            self.dir.location_of[hospital["id"]] = site
            self.locations.append(site)
        # the hospital's own Location is the building the units are part of (amend every copy alike:
        # a bulk load keeps the last one)
        for same in self.dir.copies.get(site["id"], [site]):
            same.setdefault("physicalType", concept(LOCATION_PHYSICAL_TYPE, "bu", "Building"))
            same.setdefault("type", [concept(ROLE_CODE, "HOSP", "Hospital")])
        units = {}
        for key, (name, alias, type_code, type_display) in UNITS.items():
            loc = {"resourceType": "Location", "id": self.new_id(), "status": "active", "name": name,
                   "alias": [alias], "description": f"{name}, {hospital.get('name', 'hospital')}", "mode": "instance",
                   "type": [concept(ROLE_CODE, type_code, type_display)],
                   "physicalType": concept(LOCATION_PHYSICAL_TYPE, "wa", "Ward"),
                   "managingOrganization": ref(hospital), "partOf": ref(site)}
            if site.get("address"):
                loc["address"] = copy.deepcopy(site["address"])
            units[key] = loc
            self.locations.append(loc)
        return units

    # -- one stay ------------------------------------------------------------------------------
    def stay(self, patient: dict, full: bool, ongoing: bool) -> list[dict]:
        rng = self.rng
        code, display, icu_key, ward_key = rng.choice(REASONS)
        via_ed = full or rng.random() < 0.75
        has_icu = full or rng.random() < 0.8
        ed_hours = rng.uniform(2.5, 8) if via_ed else 0.0
        icu_hours = rng.uniform(20, 110) if has_icu else 0.0
        ward_hours = rng.uniform(30, 140)
        total = ed_hours + 1 + icu_hours + ward_hours
        if ongoing:  # admitted 1–3 days ago, still in hospital at the anchor (00:00)
            start = at(self.ctx.day(-rng.randint(1, 3)), rng.randint(6, 21), rng.randint(0, 59))
        else:
            start = self._free_start(patient, total)
        hospital = self.hospital_for(patient)
        now = at(self.ctx.anchor, 0)

        # phases: (unit key, start, end) in the order the patient went through them
        phases = []
        t = start
        if via_ed:
            phases.append(("ED", t, t + timedelta(hours=ed_hours)))
            t += timedelta(hours=ed_hours + rng.uniform(0.2, 1.5))
        if has_icu:
            phases.append((icu_key, t, t + timedelta(hours=icu_hours)))
            t += timedelta(hours=icu_hours)
        phases.append((ward_key, t, t + timedelta(hours=ward_hours)))
        if ongoing:  # cut at the anchor: later phases have not happened yet, the current one is still open
            phases = [p for p in phases if p[1] < now - timedelta(hours=2)]
            phases[-1] = (phases[-1][0], phases[-1][1], now - timedelta(minutes=5))
        end = None if ongoing else phases[-1][2]

        attending = self.dir.pick_practitioner(rng, ("Internal Medicine", "General Practice"), hospital["id"])
        emergency_doc = self.dir.pick_practitioner(rng, ("Emergency",), hospital["id"])
        subject = {"reference": f"Patient/{patient['id']}", "display": display_name(patient)}
        out: list[dict] = []

        condition = {
            "resourceType": "Condition", "id": self.new_id(),
            "clinicalStatus": concept(CONDITION_CLINICAL, "active" if ongoing else "resolved"),
            "verificationStatus": concept(CONDITION_VERIFICATION, "confirmed"),
            "category": [concept(CONDITION_CATEGORY, "encounter-diagnosis", "Encounter Diagnosis")],
            "code": concept(SNOMED, code, display), "subject": {"reference": subject["reference"]},
            "onsetDateTime": iso(start), "recordedDate": iso(start + timedelta(hours=1)),
        }
        if end is not None:
            condition["abatementDateTime"] = iso(end)
        admission: dict = {
            "resourceType": "Encounter", "id": self.new_id(), "status": "in-progress" if ongoing else "finished",
            "class": coding(ACT_CODE, "IMP", "inpatient encounter"),
            "type": [concept(SNOMED, "32485007", "Hospital admission (procedure)")],
            "subject": subject,
            "participant": _participants(attending, "ATND", "attender"),
            "period": {"start": iso(start), **({"end": iso(end)} if end else {})},
            "reasonCode": [concept(SNOMED, code, display)],
            "diagnosis": [{"condition": ref(condition),
                           "use": concept(DIAGNOSIS_ROLE, "AD",
                                          "Admission diagnosis"), "rank": 1}],
            "hospitalization": {"admitSource": concept(ADMIT_SOURCE, *(("emd", "From accident/emergency department")
                                                                      if via_ed else ("gp", "General Practitioner referral")))},
            "location": [],
            "serviceProvider": ref(hospital),
        }
        if not admission["participant"]:
            del admission["participant"]
        if end is not None:
            disp = rng.choices(DISPOSITIONS, weights=[w for *_, w in DISPOSITIONS])[0]
            admission["hospitalization"]["dischargeDisposition"] = concept(DISCHARGE_DISPOSITION, disp[0], disp[1])
        condition["encounter"] = ref(admission)
        out += [admission, condition]

        for n, (key, p_start, p_end) in enumerate(phases):
            is_open = ongoing and n == len(phases) - 1
            unit = self.unit(hospital, key)
            period = {"start": iso(p_start), **({} if is_open else {"end": iso(p_end)})}
            admission["location"].append({"location": ref(unit), "status": "active" if is_open else "completed",
                                          "physicalType": concept(LOCATION_PHYSICAL_TYPE, "wa", "Ward"), "period": period})
            target = admission
            if key == "ED":
                target = self._nested(admission, subject, unit, period, hospital, is_open, emergency_doc or attending,
                                      ("EMER", "emergency"), ("50849002", "Emergency room admission (procedure)"))
                out.append(target)
            elif UNITS[key][2] == "ICU":
                target = self._nested(admission, subject, unit, period, hospital, is_open, attending,
                                      ("ACUTE", "inpatient acute"), ("305351004", "Admission to intensive care unit (procedure)"))
                out.append(target)
            out += self._charting(subject, target, key, code, start, end or now, p_start, p_end)
        return out

    def _free_start(self, patient: dict, hours: float) -> datetime:
        """A start 3 weeks to 3 years before the anchor, adult, clear of the patient's Synthea encounters."""
        starts = sorted(parse_instant(e["period"]["start"]) for e in self.index.get(patient["id"], "Encounter")
                        if e.get("period", {}).get("start"))
        born = birth_date(patient) or date(1900, 1, 1)
        earliest = max(-3 * 365, (date(born.year + 18, 12, 31) - self.ctx.anchor).days)
        latest = -21
        candidate = at(self.ctx.day(latest), 12)
        for _ in range(25):
            day = self.ctx.day(self.rng.randint(min(earliest, latest), latest))
            candidate = at(day, self.rng.randint(0, 23), self.rng.randint(0, 59))
            lo = bisect.bisect_left(starts, candidate - timedelta(days=1))
            if lo == len(starts) or starts[lo] > candidate + timedelta(hours=hours + 24):
                break
        return candidate

    def _nested(self, admission: dict, subject: dict, unit: dict, period: dict, hospital: dict, is_open: bool,
                doctor: dict | None, klass: tuple[str, str], etype: tuple[str, str]) -> dict:
        enc = {
            "resourceType": "Encounter", "id": self.new_id(), "status": "in-progress" if is_open else "finished",
            "class": coding(ACT_CODE, *klass), "type": [concept(SNOMED, *etype)], "subject": subject,
            "participant": _participants(doctor, "PPRF", "primary performer"), "period": dict(period),
            "reasonCode": copy.deepcopy(admission["reasonCode"]),
            "location": [{"location": ref(unit), "status": "active" if is_open else "completed",
                          "physicalType": concept(LOCATION_PHYSICAL_TYPE, "wa", "Ward"), "period": dict(period)}],
            "serviceProvider": ref(hospital), "partOf": ref(admission),
        }
        if not enc["participant"]:
            del enc["participant"]
        return enc

    def _charting(self, subject: dict, encounter: dict, unit_key: str, reason: str, stay_start: datetime,
                  stay_end: datetime, p_start: datetime, p_end: datetime) -> list[dict]:
        """Vitals (ED once, ICU every 4 h, ward every 8 h) and morning labs, linked to the phase's encounter."""
        rng = self.rng
        is_icu = UNITS[unit_key][2] == "ICU"
        out = []
        span = max((stay_end - stay_start).total_seconds(), 1.0)

        def progress(moment: datetime) -> float:
            return min(1.0, max(0.0, (moment - stay_start).total_seconds() / span))

        step = None if unit_key == "ED" else timedelta(hours=4 if is_icu else 8)
        t = p_start + timedelta(minutes=rng.randint(10, 40))
        while t < p_end:
            out += self._vitals(subject, encounter, t, progress(t))
            if step is None:
                break
            t += step + timedelta(minutes=rng.randint(-20, 20))
        # labs: on arrival in the ED, then every morning at ~05:00
        draws = [p_start + timedelta(minutes=rng.randint(20, 60))] if unit_key == "ED" else []
        day = p_start.date() + timedelta(days=0 if p_start.hour < 5 else 1)
        while unit_key != "ED" and at(day, 5) < p_end:
            draws.append(at(day, 5, rng.randint(0, 45)))
            day += timedelta(days=1)
        for drawn in draws:
            if drawn >= p_end:
                continue
            for loinc in LABS:
                if loinc in ICU_ONLY_LABS and not is_icu:
                    continue
                out.append(self._lab(subject, encounter, loinc, reason, drawn, progress(drawn)))
        return out

    def _value(self, mean_sick: float, mean_well: float, sd: float, decimals: int, lo: float, hi: float,
               progress: float) -> int | float:
        value = mean_sick + (mean_well - mean_sick) * progress + self.rng.gauss(0, sd)
        value = round(min(hi, max(lo, value)), decimals)
        return int(value) if decimals == 0 else value

    def _observation(self, subject: dict, encounter: dict, category: str, loinc: str, display: str,
                     moment: datetime) -> dict:
        return {"resourceType": "Observation", "id": self.new_id(), "status": "final",
                "category": [concept(OBSERVATION_CATEGORY, category, "Vital Signs" if category == "vital-signs" else "Laboratory")],
                "code": concept(LOINC, loinc, display), "subject": {"reference": subject["reference"]},
                "encounter": ref(encounter), "effectiveDateTime": iso(moment)}

    def _vitals(self, subject: dict, encounter: dict, moment: datetime, progress: float) -> list[dict]:
        out = []
        for loinc, (display, unit, sick, well, sd, dec, lo, hi) in VITALS.items():
            obs = self._observation(subject, encounter, "vital-signs", loinc, display, moment)
            obs["valueQuantity"] = _quantity(self._value(sick, well, sd, dec, lo, hi, progress), unit)
            out.append(obs)
        bp = self._observation(subject, encounter, "vital-signs", *BLOOD_PRESSURE, moment)
        bp["component"] = [
            {"code": concept(LOINC, c, d),
             "valueQuantity": _quantity(self._value(sick, well, sd, 0, 40, 240, progress), "mm[Hg]")}
            for c, d, sick, well, sd in (SYSTOLIC, DIASTOLIC)
        ]
        out.append(bp)
        return out

    def _lab(self, subject: dict, encounter: dict, loinc: str, reason: str, drawn: datetime, progress: float) -> dict:
        display, unit, sick, well, sd, dec, lo, hi = LABS[loinc]
        sick, well = LAB_OVERRIDES.get(reason, {}).get(loinc, (sick, well))
        obs = self._observation(subject, encounter, "laboratory", loinc, display, drawn)
        obs["issued"] = iso(drawn + timedelta(minutes=self.rng.randint(40, 120)))
        obs["valueQuantity"] = _quantity(self._value(sick, well, sd, dec, lo, hi, progress), unit)
        return obs


def _quantity(value: float, unit: str) -> dict:
    return {"value": value, "unit": unit, "system": UCUM, "code": unit}


def _participants(practitioner: dict | None, code: str, display: str) -> list[dict]:
    if practitioner is None:
        return []
    return [{"type": [concept(PARTICIPATION_TYPE, code, display)], "individual": ref(practitioner)}]


# ------------------------------------------------------------------------------------------------
# Ambiguity: same-name patients, entered-in-error records, an inactive patient
# ------------------------------------------------------------------------------------------------
#: Massachusetts towns with a real ZIP code, for the second patient of a same-name pair.
TOWNS = [("Worcester", "01608"), ("Springfield", "01103"), ("Lowell", "01852"), ("Cambridge", "02139"),
         ("New Bedford", "02740"), ("Brockton", "02301"), ("Quincy", "02169"), ("Lynn", "01901"),
         ("Fall River", "02720"), ("Newton", "02458"), ("Somerville", "02143"), ("Framingham", "01702")]
STREETS = ["Maple Street", "Oak Avenue", "Pleasant Street", "Washington Street", "Highland Avenue", "Elm Street",
           "Summer Street", "Central Street", "Prospect Street", "Chestnut Street"]
#: Chronic diagnoses (SNOMED CT, as Synthea codes them) for small records and wrong-chart errors.
CHRONIC = [("59621000", "Essential hypertension (disorder)"), ("44054006", "Diabetes mellitus type 2 (disorder)"),
           ("195967001", "Asthma (disorder)"), ("55822004", "Hyperlipidemia (disorder)"),
           ("49436004", "Atrial fibrillation (disorder)"), ("271737000", "Anemia (disorder)")]
#: Codes whose latest value a question is likely to ask for: the entered-in-error copies shadow these.
SHADOWED = ["29463-7", "8867-4", "2339-0", "4548-4", "8480-6", "2345-7", "718-7", "39156-5", "9279-1"]


def ambiguity(ctx: WorldContext, directory: Directory, index: PatientIndex,
              avoid: frozenset[str] | set[str] = frozenset()) -> list[dict]:
    """Same-name patient pairs, entered-in-error copies of real records, and one inactive patient
    (never one of ``avoid``: patients given a hospital stay keep an active record)."""
    rng = ctx.rng("clinical:ambiguity")
    patients = list(ctx.patients())
    n = len(patients)
    living = [p for p in patients if alive_on(p, ctx.anchor) and official_name(p) and birth_date(p)
              and p.get("active", True)]
    out: list[dict] = []
    pairs = min(len(living), max(2, round(0.03 * n)))
    originals = sorted(rng.sample(living, pairs), key=patients.index) if pairs else []
    for original in originals:
        out += _namesake(ctx, rng, directory, original)

    errors = max(2, round(0.05 * n))
    out += _wrong_values(ctx, rng, index, patients, errors)
    out += _wrong_chart(ctx, rng, index, patients, errors)
    out += _duplicate_orders(ctx, rng, index, patients, errors)

    # one living patient whose record is no longer in use (Synthea already closes the records of the dead)
    taken = {p["id"] for p in originals} | set(avoid)
    pool = [p for p in living if p["id"] not in taken]
    if pool:
        rng.choice(pool)["active"] = False
    return out


def _namesake(ctx: WorldContext, rng: Random, directory: Directory, original: dict) -> list[dict]:
    """A different person with the same given and family name: new birth date, address, identifiers."""
    def new_id() -> str:
        return ctx.new_id("clinical:ambiguity")

    name = official_name(original) or {}
    born = birth_date(original)
    assert born is not None
    for _ in range(20):
        age = rng.randint(19, 88)
        other = ctx.anchor - timedelta(days=age * 365 + rng.randint(0, 364))
        if abs((other - born).days) > 400:
            break
    city, zip_code = rng.choice(TOWNS)
    patient = {
        "resourceType": "Patient", "id": new_id(),
        "identifier": [
            {"system": SYNTHEA_ID, "value": f"{rng.getrandbits(64):016x}"},
            {"type": concept(IDENTIFIER_TYPE, "MR", "Medical Record Number"), "system": MRN,
             "value": str(rng.randint(1_000_000, 9_999_999))},
            {"type": concept(IDENTIFIER_TYPE, "SS", "Social Security Number"), "system": US_SSN,
             "value": f"999-{rng.randint(10, 99)}-{rng.randint(1000, 9999)}"},
        ],
        "active": True,
        "name": [{k: copy.deepcopy(v) for k, v in name.items() if k in ("use", "family", "given", "prefix")}],
        "telecom": [{"system": "phone", "value": f"555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                     "use": "home"}],
        "gender": original.get("gender", "unknown"),
        "birthDate": other.isoformat(),
        "address": [{"use": "home", "line": [f"{rng.randint(10, 999)} {rng.choice(STREETS)}"], "city": city,
                     "state": "Massachusetts", "postalCode": zip_code, "country": "US"}],
    }
    if original.get("meta"):
        patient["meta"] = copy.deepcopy(original["meta"])
    clinics = [o for o in directory.orgs if not _is_hospital(o) and o["id"] in directory.location_of] or \
              [o for o in directory.orgs if o["id"] in directory.location_of]
    org = rng.choice(clinics) if clinics else None
    doctor = directory.pick_practitioner(rng, ("General Practice", "Internal Medicine"), org["id"] if org else None)
    if doctor:
        patient["generalPractitioner"] = [ref(doctor)]

    start = at(ctx.day(-rng.randint(30, 400)), rng.randint(8, 16), rng.choice((0, 15, 30, 45)))
    end = start + timedelta(minutes=rng.choice((15, 20, 30)))
    subject = {"reference": f"Patient/{patient['id']}", "display": display_name(patient)}
    visit = {
        "resourceType": "Encounter", "id": new_id(), "status": "finished",
        "class": coding(ACT_CODE, "AMB", "ambulatory"),
        "type": [concept(SNOMED, "162673000", "General examination of patient (procedure)")],
        "subject": subject, "period": {"start": iso(start), "end": iso(end)},
    }
    if doctor:
        visit["participant"] = _participants(doctor, "PPRF", "primary performer")
    if org:
        visit["serviceProvider"] = ref(org)
        visit["location"] = [{"location": ref(directory.location_of[org["id"]])}]
    cond_code, cond_display = rng.choice(CHRONIC)
    condition = {
        "resourceType": "Condition", "id": new_id(),
        "clinicalStatus": concept(CONDITION_CLINICAL, "active"), "verificationStatus": concept(CONDITION_VERIFICATION, "confirmed"),
        "category": [concept(CONDITION_CATEGORY, "encounter-diagnosis", "Encounter Diagnosis")],
        "code": concept(SNOMED, cond_code, cond_display), "subject": {"reference": subject["reference"]},
        "encounter": ref(visit), "onsetDateTime": iso(start), "recordedDate": iso(start),
    }
    weight = {
        "resourceType": "Observation", "id": new_id(), "status": "final",
        "category": [concept(OBSERVATION_CATEGORY, "vital-signs", "Vital Signs")],
        "code": concept(LOINC, "29463-7", "Body Weight"), "subject": {"reference": subject["reference"]},
        "encounter": ref(visit), "effectiveDateTime": iso(start + timedelta(minutes=5)),
        "valueQuantity": _quantity(round(rng.uniform(52, 110), 1), "kg"),
    }
    return [patient, visit, condition, weight]


def _pick_patients(rng: Random, patients: list[dict], has: dict[str, list[dict]], count: int) -> list[dict]:
    pool = [p for p in patients if has.get(p["id"])]
    return sorted(rng.sample(pool, min(count, len(pool))), key=patients.index) if pool else []


def _wrong_values(ctx: WorldContext, rng: Random, index: PatientIndex, patients: list[dict], count: int) -> list[dict]:
    """A mistyped copy (decimal slip) of a patient's latest common measurement, charted minutes later."""
    shadowed = set(SHADOWED)
    best: dict[str, dict[str, tuple[str, dict]]] = defaultdict(dict)  # patient -> code -> (time key, obs)
    for obs in ctx.of_type("Observation"):
        if "valueQuantity" not in obs or obs.get("status") != "final":
            continue
        loinc = first_code(obs.get("code"))
        if loinc not in shadowed:
            continue
        subject, when = obs.get("subject", {}).get("reference", ""), obs.get("effectiveDateTime")
        if not subject.startswith("Patient/") or not when:
            continue
        key = _time_key(when)
        mine = best[subject[8:]]
        if loinc not in mine or key >= mine[loinc][0]:
            mine[loinc] = (key, obs)
    latest = {pid: [codes[c][1] for c in SHADOWED if c in codes] for pid, codes in best.items()}
    out = []
    for patient in _pick_patients(rng, patients, latest, count):
        real = rng.choice(latest[patient["id"]])
        wrong = copy.deepcopy(real)
        wrong["id"] = ctx.new_id("clinical:ambiguity")
        wrong["status"] = "entered-in-error"
        wrong.pop("interpretation", None)
        wrong.pop("referenceRange", None)
        value = real["valueQuantity"]["value"]
        wrong["valueQuantity"]["value"] = round(value * 10 if rng.random() < 0.5 else value / 10, 2)
        wrong["effectiveDateTime"] = iso(parse_instant(real["effectiveDateTime"]) + timedelta(minutes=rng.randint(3, 40)))
        wrong["note"] = [{"text": "Value keyed in with a misplaced decimal point; entered in error."}]
        out.append(wrong)
    return out


def _time_key(value: str) -> str:
    """A string that sorts like the instant: UTC values as written (to the second), others converted."""
    if value.endswith(("Z", "+00:00")) or len(value) == 10:
        return value[:19]
    return iso(parse_instant(value))[:19]


def _wrong_chart(ctx: WorldContext, rng: Random, index: PatientIndex, patients: list[dict], count: int) -> list[dict]:
    """A chronic diagnosis the patient does not have, recorded on their chart by mistake."""
    encounters = {p["id"]: index.get(p["id"], "Encounter") for p in patients}
    out = []
    for patient in _pick_patients(rng, patients, encounters, count):
        has = {first_code(c.get("code")) for c in index.get(patient["id"], "Condition")}
        options = [c for c in CHRONIC if c[0] not in has] or CHRONIC
        code, display = rng.choice(options)
        visit = max(encounters[patient["id"]], key=lambda e: parse_instant(e.get("period", {}).get("start", "1900-01-01")))
        when = visit.get("period", {}).get("start") or iso(at(ctx.day(-30), 9))
        out.append({
            "resourceType": "Condition", "id": ctx.new_id("clinical:ambiguity"),
            "verificationStatus": concept(CONDITION_VERIFICATION, "entered-in-error", "Entered in Error"),
            "category": [concept(CONDITION_CATEGORY, "problem-list-item", "Problem List Item")],
            "code": concept(SNOMED, code, display), "subject": {"reference": f"Patient/{patient['id']}"},
            "encounter": ref(visit), "onsetDateTime": when, "recordedDate": when,
            "note": [{"text": "Charted on the wrong patient's record; entered in error."}],
        })
    return out


def _duplicate_orders(ctx: WorldContext, rng: Random, index: PatientIndex, patients: list[dict],
                      count: int) -> list[dict]:
    """A duplicate of the patient's latest MedicationRequest, voided as entered-in-error."""
    requests = {p["id"]: index.get(p["id"], "MedicationRequest") for p in patients}
    out = []
    for patient in _pick_patients(rng, patients, requests, count):
        real = max(requests[patient["id"]], key=lambda m: m.get("authoredOn", ""))
        dup = copy.deepcopy(real)
        dup["id"] = ctx.new_id("clinical:ambiguity")
        dup["status"] = "entered-in-error"
        if real.get("authoredOn"):
            dup["authoredOn"] = iso(parse_instant(real["authoredOn"]) + timedelta(minutes=rng.randint(2, 20)))
        dup["note"] = [{"text": "Duplicate order; entered in error."}]
        out.append(dup)
    return out
