"""The administrative world: organisations, practitioners, schedules, slots, appointments, insurance.

Synthea gives patients and their clinical history; the scheduling and billing tasks need what a
practice-management system holds around them. ``generate(ctx)`` adds insurers, labs, practitioners with
roles, schedules and slots, appointments consistent with the slots, related persons, coverages and
accounts, under conventions chosen so every task's answer is well defined (UTC clinic hours, a fixed
horizon, slots and appointments that agree, deliberate ambiguity, every case in every world):
docs/WORLD.md lists them. Synthea's own lifelong Coverages are assumed dropped with its Claims by the
builder, so that Coverage here is the one truth about insurance.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta

import orjson

from .._gc import gc_paused
from ..spec.codes import (
    ACCOUNT_ID,
    ACT_CODE,
    APPOINTMENT_TYPE,
    CANCELLATION_REASON,
    COVERAGE_CLASS,
    IDENTIFIER_TYPE,
    LOCATION_PHYSICAL_TYPE,
    ORGANIZATION_TYPE,
    PARTICIPATION_TYPE,
    PRACTITIONER_ROLE,
    ROLE_CODE,
    SERVICE_CATEGORY,
    SERVICE_TYPE,
    SNOMED,
    SUBSCRIBER_RELATIONSHIP,
    US_NPI,
)
from ._context import WorldContext

BCP47 = "urn:ietf:bcp:47"

HISTORY_DAYS = 14  # slots from anchor - 14 ...
FUTURE_DAYS = 42  # ... to anchor + 41
SLOT_MINUTES = 30
LUNCH = 12 * 60
#: Appointment statuses that hold their slot (the slot is busy).
HOLDING = frozenset({"booked", "arrived", "fulfilled", "noshow", "checked-in"})
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri")


@dataclass(frozen=True)
class Specialty:
    key: str
    code: str  # SNOMED CT (c80-practice-codes where it has one)
    display: str
    text: str
    service: tuple[str, str]  # service-type code, display
    category: tuple[str, str]  # service-category code, display
    urgent_share: float  # share of these doctors who keep urgent slots


SPECIALTIES: dict[str, Specialty] = {s.key: s for s in (
    Specialty("general", "394814009", "General practice", "General Practice", ("124", "General Practice"),
              ("17", "General Practice"), 1.0),
    Specialty("pediatrics", "394537008", "Pediatric specialty", "Pediatrics", ("200", "Paediatric Medicine"),
              ("29", "Specialist Paediatric"), 1.0),
    Specialty("cardiology", "394579002", "Cardiology", "Cardiology", ("165", "Cardiology"),
              ("27", "Specialist Medical"), 0.5),
    Specialty("genetics", "394580004", "Clinical genetics", "Clinical Genetics", ("166", "Clinical Genetics"),
              ("27", "Specialist Medical"), 0.0),
    Specialty("orthopedics", "394801008", "Trauma and orthopedics", "Orthopedics", ("218", "Orthopaedic Surgery"),
              ("31", "Specialist Surgical"), 0.5),
    Specialty("dermatology", "394582007", "Dermatology", "Dermatology", ("168", "Dermatology"),
              ("27", "Specialist Medical"), 0.2),
    Specialty("oncology", "394593009", "Medical oncology", "Oncology", ("175", "Medical Oncology"),
              ("27", "Specialist Medical"), 0.2),
    Specialty("neurology", "394591006", "Neurology", "Neurology", ("177", "Neurology"),
              ("27", "Specialist Medical"), 0.2),
    Specialty("obgyn", "394585009", "Obstetrics and gynecology", "Obstetrics and Gynecology",
              ("186", "Obstetrics & Gynaecology"), ("28", "Specialist Obstetrics & Gynecology"), 0.2),
    Specialty("endocrinology", "394583002", "Endocrinology", "Endocrinology", ("169", "Endocrinology"),
              ("27", "Specialist Medical"), 0.0),
)}
#: Doctors per specialty in the smallest world (24); larger worlds draw the rest by EXTRA_WEIGHTS.
BASE_COUNTS = {"general": 5, "pediatrics": 3, "cardiology": 3, "genetics": 2, "orthopedics": 2, "dermatology": 2,
               "oncology": 2, "neurology": 2, "obgyn": 2, "endocrinology": 1}
EXTRA_WEIGHTS = {"general": 6, "pediatrics": 3, "cardiology": 2, "orthopedics": 2, "obgyn": 2, "dermatology": 1,
                 "oncology": 1, "neurology": 1, "endocrinology": 1, "genetics": 1}

LANGUAGES = {"en": "English", "es": "Spanish", "pt": "Portuguese", "zh": "Chinese", "vi": "Vietnamese",
             "ht": "Haitian Creole", "fr": "French", "ko": "Korean", "hi": "Hindi", "ar": "Arabic", "ru": "Russian"}

#: Name pools by origin: (female given, male given, family). The origin's language is spoken by most.
NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "en": (("Emily", "Sarah", "Katherine", "Rachel", "Laura", "Megan", "Elizabeth", "Anne", "Claire", "Julia"),
           ("Michael", "James", "Robert", "Daniel", "Thomas", "Andrew", "Matthew", "Patrick", "Christopher", "William"),
           ("Sullivan", "Murphy", "Walsh", "Kelly", "Anderson", "Thompson", "Campbell", "Bennett", "Hughes",
            "Fitzgerald", "Coleman", "Reed", "Palmer", "Gallagher", "Doyle", "Brennan", "Harper", "Whitman")),
    "es": (("Maria", "Ana", "Lucia", "Carmen", "Isabel", "Sofia", "Elena", "Gabriela"),
           ("Carlos", "Jose", "Luis", "Miguel", "Javier", "Alejandro", "Diego", "Rafael"),
           ("Garcia", "Rodriguez", "Martinez", "Hernandez", "Lopez", "Gonzalez", "Ramirez", "Torres", "Rivera",
            "Morales", "Ortiz", "Castillo")),
    "pt": (("Beatriz", "Juliana", "Fernanda", "Camila", "Leticia"), ("Joao", "Pedro", "Tiago", "Bruno", "Rodrigo"),
           ("Silva", "Santos", "Oliveira", "Souza", "Pereira", "Costa", "Almeida", "Ferreira")),
    "zh": (("Mei", "Lin", "Xin", "Hui", "Yan"), ("Wei", "Jun", "Hao", "Ming", "Lei"),
           ("Chen", "Wang", "Zhang", "Liu", "Huang", "Zhao", "Wu", "Zhou")),
    "vi": (("Linh", "Thao", "Mai", "Huong", "Ngoc"), ("Minh", "Duc", "Tuan", "Quang", "Hung"),
           ("Nguyen", "Tran", "Le", "Pham", "Hoang", "Vu", "Dang", "Bui")),
    "ht": (("Marie", "Nadege", "Fabienne", "Roseline", "Guerline"), ("Jean", "Jacques", "Frantz", "Ronald", "Wilner"),
           ("Joseph", "Pierre-Louis", "Jean-Baptiste", "Charles", "Etienne", "Toussaint", "Desir", "Celestin")),
    "ko": (("Ji-woo", "Soo-jin", "Min-ji", "Eun-ji"), ("Min-jun", "Seo-jun", "Jae-hyun", "Dong-hyun"),
           ("Kim", "Park", "Choi", "Jung", "Kang", "Yoon")),
    "hi": (("Priya", "Anjali", "Neha", "Kavita", "Deepa"), ("Rahul", "Arjun", "Vikram", "Sanjay", "Amit"),
           ("Patel", "Shah", "Gupta", "Sharma", "Reddy", "Iyer", "Mehta")),
    "ar": (("Layla", "Nadia", "Rania", "Yasmin"), ("Omar", "Karim", "Samir", "Tariq"),
           ("Haddad", "Khoury", "Nasser", "Saleh", "Mansour")),
}
GUARANTEED_LANGUAGES = ("pt", "ht", "zh", "vi", "es")
ORIGIN_WEIGHTS = {"en": 40, "es": 14, "zh": 8, "hi": 8, "vi": 6, "pt": 6, "ht": 6, "ko": 4, "ar": 4}


@dataclass(frozen=True)
class Site:
    """A care provider or lab: one Organization with one Location."""

    name: str
    city: str
    postal: str
    street: str
    phone: str
    specialties: frozenset[str]
    location_type: tuple[str, str]  # v3-RoleCode
    lab: bool = False


def _site(name: str, city: str, postal: str, street: str, phone: str, specialties: str,
          location_type: tuple[str, str] = ("OF", "Outpatient facility"), lab: bool = False) -> Site:
    return Site(name, city, postal, street, phone, frozenset(specialties.split()), location_type, lab)


CARE_SITES = (
    _site("Beacon Hill Primary Care", "Boston", "02114", "45 Cambridge Street", "617-555-0140",
          "general pediatrics dermatology endocrinology"),
    _site("Back Bay Heart and Vascular", "Boston", "02116", "300 Boylston Street", "617-555-0182", "cardiology",
          ("CARD", "Ambulatory Health Care Facilities; Clinic/Center; Rehabilitation: Cardiac Facilities")),
    _site("Longwood Specialty Associates", "Boston", "02115", "850 Huntington Avenue", "617-555-0117",
          "genetics oncology neurology dermatology cardiology obgyn endocrinology orthopedics"),
    _site("Charles River Family Health", "Cambridge", "02139", "1493 Cambridge Street", "617-555-0163",
          "general pediatrics obgyn orthopedics dermatology"),
    _site("Merrimack Valley Medical Group", "Lowell", "01852", "295 Varnum Avenue", "978-555-0121",
          "general pediatrics cardiology orthopedics"),
    _site("Central Massachusetts Specialty Clinic", "Worcester", "01605", "119 Belmont Street", "508-555-0109",
          "cardiology oncology neurology orthopedics genetics endocrinology"),
    _site("Pioneer Valley Health Center", "Springfield", "01107", "759 Chestnut Street", "413-555-0175",
          "general pediatrics obgyn cardiology dermatology"),
    _site("Quincy Bay Medical Associates", "Quincy", "02169", "500 Congress Street", "617-555-0198",
          "general orthopedics obgyn neurology"),
)
CLINICAL_LAB = _site("Longwood Clinical Laboratories", "Boston", "02115", "75 Francis Street", "617-555-0150", "",
                     ("MBL", "medical laboratory"), lab=True)
#: The genetic-testing lab (performer of genetic orders; ``_genetics`` may look it up by this name).
GENETICS_LAB = _site("Bay State Genomics Laboratory", "Cambridge", "02142", "320 Bent Street", "617-555-0133", "",
                     ("MBL", "medical laboratory"), lab=True)
#: City weights for practitioners: most of the world lives in and around Boston.
CITY_WEIGHTS = {"Boston": 6, "Cambridge": 2, "Lowell": 1, "Worcester": 2, "Springfield": 1, "Quincy": 1}


@dataclass(frozen=True)
class Plan:
    code: str
    name: str
    kind: str  # v3-ActCode coverage type


@dataclass(frozen=True)
class Insurer:
    name: str  # Synthea's payer names, so that its Organization is reused rather than duplicated
    public: bool
    phone: str
    member_format: str  # '#' a digit, '@' a letter, '*' either; anything else is literal
    plans: tuple[Plan, ...]
    supplemental: Plan | None = None


INSURERS = (
    Insurer("Aetna", False, "800-555-0101", "W#########",
            (Plan("AET-POS2", "Aetna Choice POS II", "POS"), Plan("AET-HMO", "Aetna HMO", "HMO")),
            Plan("AET-MSG", "Aetna Medicare Supplement Plan G", "HIP")),
    Insurer("Blue Cross Blue Shield", False, "800-555-0102", "XYZ#########",
            (Plan("BCBS-PPO", "Blue Care Elect PPO", "PPO"), Plan("BCBS-HMO", "HMO Blue New England", "HMO")),
            Plan("BCBS-MEDEX", "Medex Core", "HIP")),
    Insurer("UnitedHealthcare", False, "800-555-0103", "9########",
            (Plan("UHC-CP", "UnitedHealthcare Choice Plus", "PPO"), Plan("UHC-NAV", "UnitedHealthcare Navigate HMO", "HMO"))),
    Insurer("Cigna Health", False, "800-555-0104", "U########01", (Plan("CIG-OAP", "Cigna Open Access Plus", "POS"),)),
    Insurer("Medicare", True, "800-555-0105", "#@*#@*#@@##", (Plan("MCR-AB", "Original Medicare Parts A and B", "PUBLICPOL"),)),
    Insurer("Medicaid", True, "800-555-0106", "1##########", (Plan("MH-STD", "MassHealth Standard", "PUBLICPOL"),)),
)
PRIVATE_WEIGHTS = {"Aetna": 3, "Blue Cross Blue Shield": 4, "UnitedHealthcare": 2, "Cigna Health": 2}
COVERAGE_KIND = {"POS": "point of service policy", "HMO": "health maintenance organization policy",
                 "PPO": "preferred provider organization policy", "HIP": "health insurance plan policy",
                 "PUBLICPOL": "public healthcare"}
EMPLOYERS = ("Harborside Logistics", "Commonwealth Teachers Association", "Bay State Biotech", "Mystic River Builders",
             "Fenway Financial Group", "North Shore Hospitality", "Pioneer Valley Manufacturing",
             "Boston Harbor Transit Workers", "Cambridge Software Collective", "Quabbin Retail Partners")
CANCEL_REASONS = (("pat-crs", "Patient: Canceled via automated reminder system"),
                  ("pat-cpp", "Patient: Canceled via Patient Portal"), ("pat-fb", "Patient: Feeling Better"),
                  ("pat-lt", "Patient: Lack of Transportation"), ("prov-pers", "Provider: Personal"),
                  ("prov-edu", "Provider: Edu/Meeting"), ("oth-weath", "Other: Weather"))


# ---------------------------------------------------------------------------------------------------
# small builders
# ---------------------------------------------------------------------------------------------------
def _cc(system: str, code: str, display: str, text: str | None = None) -> dict:
    concept: dict = {"coding": [{"system": system, "code": code, "display": display}]}
    if text:
        concept["text"] = text
    return concept


def _ref(resource: dict, display: str | None = None) -> dict:
    ref = {"reference": f"{resource['resourceType']}/{resource['id']}"}
    if display:
        ref["display"] = display
    return ref


def _specialty_cc(s: Specialty) -> dict:
    return _cc(SNOMED, s.code, s.display, s.text)


def _service_cc(s: Specialty) -> dict:
    return _cc(SERVICE_TYPE, *s.service)


def _appt_type(code: str) -> dict:
    display = {"ROUTINE": "Routine appointment - default if not valued", "EMERGENCY": "Emergency appointment",
               "FOLLOWUP": "A follow up visit from a previous appointment",
               "CHECKUP": "A routine check-up, such as an annual physical"}[code]
    return _cc(APPOINTMENT_TYPE, code, display, "Urgent" if code == "EMERGENCY" else None)


def _format(rng: random.Random, pattern: str) -> str:
    letters = "ACDEFGHJKMNPQRTUVWXY"  # no look-alikes, as payers do
    out = []
    for ch in pattern:
        if ch == "#":
            out.append(str(rng.randrange(10)))
        elif ch == "@":
            out.append(rng.choice(letters))
        elif ch == "*":
            out.append(rng.choice(letters + "0123456789"))
        else:
            out.append(ch)
    return "".join(out)


def _npi(rng: random.Random) -> str:
    """A 10-digit US_NPI with a valid Luhn check digit (computed over the 80840 prefix, as CMS does)."""
    base = str(rng.randint(1, 2)) + "".join(str(rng.randrange(10)) for _ in range(8))
    total = 0
    for i, ch in enumerate(reversed("80840" + base)):
        d = int(ch) * (2 if i % 2 == 0 else 1)
        total += d - 9 if d > 9 else d
    return base + str((10 - total % 10) % 10)


def _domain(site: Site) -> str:
    """``bhpc.org`` for Beacon Hill Primary Care."""
    return "".join(w[0] for w in site.name.split() if w[0].isupper()).lower() + ".org"


def _age(birth: date, on: date) -> int:
    return on.year - birth.year - ((on.month, on.day) < (birth.month, birth.day))


def _years_before(d: date, years: int) -> date:
    try:
        return d.replace(year=d.year - years)
    except ValueError:  # 29 February
        return d.replace(year=d.year - years, day=28)


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _person_name(resource: dict) -> tuple[str, str]:
    names = resource.get("name") or [{}]
    name = next((n for n in names if n.get("use") == "official"), names[0])
    return " ".join(name.get("given", [])[:1]) or "", name.get("family", "")


# ---------------------------------------------------------------------------------------------------
# the generator's working state
# ---------------------------------------------------------------------------------------------------
@dataclass
class _Doctor:
    practitioner: dict
    role: dict
    schedule: dict | None
    specialty: Specialty
    site: Site
    location: dict
    name: str  # "Dr. Maria Garcia"
    days: tuple[int, ...] = ()  # weekday numbers worked
    am: tuple[int, int] | None = None  # session (start, end) in minutes after midnight
    pm: tuple[int, int] | None = None
    admin_day: int | None = None
    urgent: bool = False
    out_of_office: date | None = None
    slots: list[_Slot] = field(default_factory=list)


@dataclass
class _Slot:
    resource: dict
    day: date
    offset: int  # days from the anchor
    minute: int
    urgent: bool
    bookable: bool


@dataclass
class _Patient:
    resource: dict
    display: str
    given: str
    family: str
    gender: str
    birth: date
    age: int
    living: bool
    married: bool
    city: str
    home: _Doctor | None = None
    busy_days: set[date] = field(default_factory=set)


@dataclass
class _Person:
    """A patient's spouse or parent (a RelatedPerson once built)."""

    resource: dict | None = None


@dataclass
class _InsurancePlan:
    patient: _Patient
    insured: bool = False
    insurer: Insurer | None = None
    subscriber: str = "self"  # "self" | "spouse" | "parent"
    relatives: dict[str, _Person] = field(default_factory=dict)  # by kind: "spouse" | "parent"
    previous: bool = False  # a cancelled coverage it replaced
    secondary: bool = False
    account: bool = False
    guarantor: str | None = None  # "patient" | "spouse" | "parent" | None


class _Builder:
    def __init__(self, ctx: WorldContext) -> None:
        self.ctx = ctx
        self.out: dict[str, list[dict]] = defaultdict(list)
        self._instants: dict[tuple[date, int], str] = {}

    def at(self, day: date, minute: int) -> str:
        """``ctx.instant`` for a minute of the day, memoised: every doctor shares the same grid."""
        key = (day, minute)
        if key not in self._instants:
            self._instants[key] = self.ctx.instant(day, minute // 60, minute % 60)
        return self._instants[key]

    def new(self, rtype: str, **fields: object) -> dict:
        resource = {"resourceType": rtype, "id": self.ctx.new_id(f"admin.{rtype}"), **fields}
        self.out[rtype].append(resource)
        return resource


ORDER = ("Organization", "Location", "Practitioner", "PractitionerRole", "Schedule", "Slot", "RelatedPerson",
         "Coverage", "Account", "Appointment")


def generate(ctx: WorldContext) -> list[dict]:
    """Organisations, practitioners, schedules, slots, appointments and insurance for ``ctx``'s patients.

    Deterministic in (``ctx.seed``, ``ctx.anchor``, the resources already in ``ctx``). Amends only the
    type of Synthea's insurer Organizations (adds ``pay``). See the module docstring for conventions.
    """
    with gc_paused():  # ~15k new dicts would trigger full collections over the whole (large) Synthea heap
        return _generate(ctx)


def _generate(ctx: WorldContext) -> list[dict]:
    b = _Builder(ctx)
    patients = _patients(ctx)
    sites = _organizations(ctx, b)
    insurers = _insurers(ctx, b)
    doctors = _practitioners(ctx, b, sites, len(patients))
    for doc in doctors:
        _schedule(ctx, b, doc)
    active = [d for d in doctors if d.role["active"] and d.practitioner["active"]]
    _assign_home_doctors(ctx, patients, active)
    _appointments(ctx, b, patients, active)
    _insurance(ctx, b, patients, insurers)
    return [r for rtype in ORDER for r in b.out[rtype]]


# ---------------------------------------------------------------------------------------------------
# patients (read from ctx)
# ---------------------------------------------------------------------------------------------------
def _patients(ctx: WorldContext) -> list[_Patient]:
    out = []
    for p in ctx.patients():
        if not p.get("birthDate"):
            continue
        birth = date.fromisoformat(p["birthDate"][:10])
        dead = p.get("deceasedBoolean") is True or (
            "deceasedDateTime" in p and p["deceasedDateTime"][:10] <= ctx.anchor.isoformat())
        given, family = _person_name(p)
        marital = {c.get("code") for c in (p.get("maritalStatus") or {}).get("coding", [])}
        city = next((a.get("city") for a in p.get("address", []) if a.get("city")), "Boston")
        out.append(_Patient(p, f"{given} {family}".strip(), given, family, p.get("gender", "unknown"), birth,
                            _age(birth, ctx.anchor), not dead and birth <= ctx.anchor, "M" in marital, city))
    return out


# ---------------------------------------------------------------------------------------------------
# organisations, locations, insurers
# ---------------------------------------------------------------------------------------------------
def _organizations(ctx: WorldContext, b: _Builder) -> dict[str, tuple[Site, dict, dict]]:
    rng = ctx.rng("admin.organizations")
    taken = {str(o.get("name", "")).casefold() for o in ctx.of_type("Organization")}
    sites: dict[str, tuple[Site, dict, dict]] = {}
    for site in (*CARE_SITES, CLINICAL_LAB, GENETICS_LAB):
        name = site.name if site.name.casefold() not in taken else f"{site.name} ({site.city})"
        address = {"use": "work", "line": [site.street], "city": site.city, "state": "MA",
                   "postalCode": site.postal, "country": "US"}
        org_types = [_cc(ORGANIZATION_TYPE, "prov", "Healthcare Provider")]
        if site.lab:
            org_types.append(_cc(ORGANIZATION_TYPE, "other", "Other", "Laboratory"))
        org = b.new("Organization", active=True,
                    identifier=[{"system": US_NPI, "value": _npi(rng)}], type=org_types, name=name,
                    telecom=[{"system": "phone", "value": site.phone, "use": "work"}], address=[address])
        loc = b.new("Location", status="active", name=name, mode="instance",
                    type=[_cc(ROLE_CODE, *site.location_type)],
                    telecom=[{"system": "phone", "value": site.phone, "use": "work"}],
                    address=copy.deepcopy(address),
                    physicalType=_cc(LOCATION_PHYSICAL_TYPE, "bu", "Building"),
                    managingOrganization=_ref(org, name))
        sites[site.name] = (site, org, loc)
    return sites


def _insurers(ctx: WorldContext, b: _Builder) -> dict[str, dict]:
    """Insurer name -> Organization; Synthea's payer of the same name is reused (and typed ``pay``)."""
    existing: dict[str, list[dict]] = defaultdict(list)
    for org in ctx.of_type("Organization"):
        codes = {c.get("code") for t in org.get("type", []) for c in t.get("coding", [])}
        if codes & {"ins", "pay"}:
            existing[str(org.get("name", "")).casefold()].append(org)
    out = {}
    for ins in INSURERS:
        same = existing.get(ins.name.casefold())
        if same:
            for org in same:  # every copy, in case the caller kept duplicates
                codes = {c.get("code") for t in org.get("type", []) for c in t.get("coding", [])}
                if "pay" not in codes:
                    org.setdefault("type", []).append(_cc(ORGANIZATION_TYPE, "pay", "Payer"))
            out[ins.name] = same[0]
            continue
        out[ins.name] = b.new("Organization", active=True,
                              type=[_cc(ORGANIZATION_TYPE, "ins", "Insurance Company"), _cc(ORGANIZATION_TYPE, "pay", "Payer")],
                              name=ins.name, telecom=[{"system": "phone", "value": ins.phone, "use": "work"}])
    return out


# ---------------------------------------------------------------------------------------------------
# practitioners and roles
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    """What a practitioner must be; None fields are drawn at random."""

    specialty: str
    gender: str | None = None
    city: str | None = None
    name: tuple[str, str] | None = None
    languages: tuple[str, ...] | None = None
    origin: str | None = None


#: The same-name pairs: (candidate names, (gender, specialty, city, languages) of each member). The
#: first candidate name Synthea does not already use is taken.
PAIRS = (
    ((("Maria", "Garcia"), ("Ana", "Rodriguez"), ("Lucia", "Martinez")),  # differ by specialty only
     (("female", "cardiology", "Boston", ("en", "es")), ("female", "dermatology", "Boston", ("en", "es")))),
    ((("David", "Nguyen"), ("Michael", "Tran"), ("Daniel", "Pham")),  # differ by city only
     (("male", "general", "Boston", ("en", "vi")), ("male", "general", "Lowell", ("en",)))),
    ((("Jordan", "Lee"), ("Taylor", "Kim"), ("Morgan", "Chen")),  # differ by specialty, city and gender
     (("female", "pediatrics", "Cambridge", ("en", "zh")), ("male", "orthopedics", "Worcester", ("en",)))),
)
#: Distractors around "a female Spanish-speaking cardiologist in Boston" (the first pair's cardiologist).
DISTRACTORS = (
    _Spec("cardiology", "male", "Boston", languages=("en", "es"), origin="es"),
    _Spec("cardiology", "female", "Worcester", languages=("en", "es"), origin="es"),
)


def _practitioners(ctx: WorldContext, b: _Builder, sites: dict[str, tuple[Site, dict, dict]],
                   n_patients: int) -> list[_Doctor]:
    rng = ctx.rng("admin.practitioners")
    n_active = max(24, round(0.3 * n_patients))
    used: set[tuple[str, str]] = set()
    for pr in ctx.of_type("Practitioner"):
        used.add(tuple(s.casefold() for s in _person_name(pr)))  # type: ignore[arg-type]
    specs: list[_Spec] = []
    for candidates, members in PAIRS:
        name = next((n for n in candidates if (n[0].casefold(), n[1].casefold()) not in used), None)
        if name is None:  # every candidate taken by Synthea: the pair is skipped rather than tripled
            continue
        used.add((name[0].casefold(), name[1].casefold()))
        specs += [_Spec(spec, gender, city, name, langs) for gender, spec, city, langs in members]
    specs += DISTRACTORS
    quota = dict(BASE_COUNTS)
    for extra in rng.choices(list(EXTRA_WEIGHTS), weights=list(EXTRA_WEIGHTS.values()), k=n_active - 24):
        quota[extra] += 1
    for s in specs:
        quota[s.specialty] -= 1
    drawn = [_Spec(key) for key in SPECIALTIES for _ in range(max(0, quota[key]))]
    rng.shuffle(drawn)
    # every language a task may ask for is spoken by someone (and by more than one, in larger worlds)
    for n, lang in enumerate(GUARANTEED_LANGUAGES[:len(drawn)]):
        langs = ("en", lang, "fr") if lang == "ht" else ("en", lang)
        drawn[n] = _Spec(drawn[n].specialty, languages=langs, origin=lang)
    specs += drawn
    retired = [_Spec(rng.choice(("cardiology", "general", "pediatrics")), city="Boston")
               for _ in range(max(1, n_active // 30))]
    movers = max(1, n_active // 30)

    care = [sites[s.name] for s in CARE_SITES]
    doctors: list[_Doctor] = []
    for n, spec in enumerate([*specs, *retired]):
        is_retired = n >= len(specs)
        doctors.append(_doctor(ctx, b, rng, spec, care, used, retired=is_retired))
    # a few active doctors moved: their role at a previous site ended last year
    for doc in rng.sample([d for d in doctors if d.role["active"]], movers):
        options = [e for e in care if doc.specialty.key in e[0].specialties and e[0].name != doc.site.name]
        if not options:
            continue
        site, org, loc = rng.choice(options)
        end = ctx.anchor - timedelta(days=rng.randint(200, 500))
        role = b.new("PractitionerRole", active=False,
                     period={"start": _years_before(end, rng.randint(3, 9)).isoformat(), "end": end.isoformat()},
                     practitioner=_ref(doc.practitioner, doc.name), organization=_ref(org, org["name"]),
                     location=[_ref(loc, loc["name"])], code=[_cc(PRACTITIONER_ROLE, "doctor", "Doctor")],
                     specialty=[_specialty_cc(doc.specialty)])
        doc.role["period"]["start"] = (end + timedelta(days=rng.randint(1, 60))).isoformat()
        doctors.append(_Doctor(doc.practitioner, role, None, doc.specialty, site, loc, doc.name))
    return doctors


def _doctor(ctx: WorldContext, b: _Builder, rng: random.Random, spec: _Spec,
            care: list[tuple[Site, dict, dict]], used: set[tuple[str, str]], retired: bool) -> _Doctor:
    specialty = SPECIALTIES[spec.specialty]
    female_share = {"pediatrics": 0.7, "obgyn": 0.8, "orthopedics": 0.3}.get(spec.specialty, 0.5)
    gender = spec.gender or ("female" if rng.random() < female_share else "male")
    origin = spec.origin or rng.choices(list(ORIGIN_WEIGHTS), weights=list(ORIGIN_WEIGHTS.values()))[0]
    if spec.name:
        given, family = spec.name
    else:
        females, males, families = NAMES[origin]
        for _ in range(200):
            given, family = rng.choice(females if gender == "female" else males), rng.choice(families)
            if (given.casefold(), family.casefold()) not in used:
                break
        used.add((given.casefold(), family.casefold()))
    if spec.languages:
        languages = list(spec.languages)
    else:
        languages = ["en"]
        if origin != "en" and rng.random() < 0.7:
            languages.append(origin)
        if origin == "ht" and rng.random() < 0.6:
            languages.append("fr")
        if rng.random() < 0.12:
            extra = rng.choice(("es", "fr", "pt", "zh", "ru"))
            if extra not in languages:
                languages.append(extra)
    options = [e for e in care if spec.specialty in e[0].specialties and (spec.city is None or e[0].city == spec.city)]
    site, org, loc = rng.choices(options, weights=[CITY_WEIGHTS[e[0].city] for e in options])[0]
    display = f"Dr. {given} {family}"
    birth = ctx.anchor - timedelta(days=rng.randint(33 * 365, 66 * 365))
    practitioner = b.new(
        "Practitioner", active=not retired,
        identifier=[{"system": US_NPI, "value": _npi(rng)}],
        name=[{"use": "official", "family": family, "given": [given], "prefix": ["Dr."]}],
        telecom=[{"system": "phone", "value": site.phone, "use": "work"},
                 {"system": "email", "use": "work",
                  "value": f"{given[0].lower()}.{family.lower().replace(' ', '')}@{_domain(site)}"}],
        address=[copy.deepcopy(loc["address"])], gender=gender, birthDate=birth.isoformat(),
        communication=[_cc(BCP47, code, LANGUAGES[code], LANGUAGES[code]) for code in languages],
    )
    start = _years_before(ctx.anchor, rng.randint(1, 15)).replace(day=1)
    period = {"start": start.isoformat()}
    if retired:
        period["end"] = (ctx.anchor - timedelta(days=rng.randint(60, 300))).isoformat()
    role = b.new("PractitionerRole", active=not retired, period=period,
                 practitioner=_ref(practitioner, display), organization=_ref(org, org["name"]),
                 location=[_ref(loc, loc["name"])], code=[_cc(PRACTITIONER_ROLE, "doctor", "Doctor")],
                 specialty=[_specialty_cc(specialty)],
                 telecom=[{"system": "phone", "value": site.phone, "use": "work"}])
    doc = _Doctor(practitioner, role, None, specialty, site, loc, display)
    _template(ctx, rng, doc)
    if retired:
        role.pop("telecom")
        return doc
    role["availableTime"] = _available_time(doc)
    if doc.out_of_office:
        role["notAvailable"] = [{"description": "Out of office",
                                 "during": {"start": doc.out_of_office.isoformat(),
                                            "end": doc.out_of_office.isoformat()}}]
    return doc


def _template(ctx: WorldContext, rng: random.Random, doc: _Doctor) -> None:
    """The doctor's weekly pattern: days, sessions, admin hour, urgent slots, one possible day off."""
    doc.days = tuple(range(5)) if rng.random() < 0.65 else tuple(sorted(rng.sample(range(5), rng.choice((3, 4)))))
    shape = rng.random()
    if shape < 0.65 or (doc.specialty.key in ("general", "pediatrics") and shape < 0.8):
        doc.am, doc.pm = (rng.choice((480, 510, 540)), LUNCH), (rng.choice((780, 810)), rng.choice((960, 990, 1020)))
    elif shape < 0.9:
        doc.am = (rng.choice((480, 510, 540)), LUNCH)
    else:
        doc.pm = (rng.choice((780, 810)), rng.choice((960, 990, 1020)))
    if doc.am and doc.pm and rng.random() < 0.5:
        doc.admin_day = rng.choice(doc.days)
    doc.urgent = rng.random() < doc.specialty.urgent_share
    if rng.random() < 0.3:
        days = [ctx.day(o) for o in range(5, 36) if ctx.day(o).weekday() in doc.days]
        doc.out_of_office = rng.choice(days)


def _available_time(doc: _Doctor) -> list[dict]:
    start = (doc.am or doc.pm)[0]  # type: ignore[index]
    end = (doc.pm or doc.am)[1]  # type: ignore[index]
    return [{"daysOfWeek": [WEEKDAYS[d] for d in doc.days], "availableStartTime": _hhmm(start),
             "availableEndTime": _hhmm(end)}]


# ---------------------------------------------------------------------------------------------------
# schedules and slots
# ---------------------------------------------------------------------------------------------------
def _schedule(ctx: WorldContext, b: _Builder, doc: _Doctor) -> None:
    s = doc.specialty
    active = bool(doc.role["active"] and doc.practitioner["active"])
    if active:
        horizon = {"start": ctx.instant(ctx.day(-HISTORY_DAYS), 0), "end": ctx.instant(ctx.day(FUTURE_DAYS), 0)}
    else:  # an ended role: its schedule ended with it and has no slots
        end = date.fromisoformat(doc.role["period"]["end"])
        horizon = {"start": ctx.instant(end - timedelta(days=FUTURE_DAYS), 0), "end": ctx.instant(end, 0)}
    sched = b.new("Schedule", active=active, serviceCategory=[_cc(SERVICE_CATEGORY, *s.category)],
                  serviceType=[_service_cc(s)], specialty=[_specialty_cc(s)],
                  actor=[_ref(doc.role, f"{doc.name} ({s.text})"), _ref(doc.practitioner, doc.name)],
                  planningHorizon=horizon, comment=f"{s.text} clinic of {doc.name} at {doc.location['name']}")
    doc.schedule = sched
    if not active:
        return
    templates = {}
    for urgent in (False, True):
        template = {"resourceType": "Slot", "id": "", "schedule": _ref(sched), "status": "free", "start": "",
                    "end": "", "serviceType": [_service_cc(s)], "specialty": [_specialty_cc(s)],
                    "appointmentType": _appt_type("EMERGENCY" if urgent else "ROUTINE")}
        if urgent:
            template["comment"] = "Reserved for urgent same-day visits"
        templates[urgent] = orjson.dumps(template)
    for offset in range(-HISTORY_DAYS, FUTURE_DAYS):
        day = ctx.day(offset)
        if day.weekday() not in doc.days:
            continue
        if day == doc.out_of_office:
            first = (doc.am or doc.pm)[0]  # type: ignore[index]
            last = (doc.pm or doc.am)[1]  # type: ignore[index]
            _block(ctx, b, doc, day, offset, first, last, "Out of office")
            continue
        for part, session in (("am", doc.am), ("pm", doc.pm)):
            if session is None:
                continue
            start, end = session
            admin = part == "pm" and day.weekday() == doc.admin_day
            if admin:
                end -= 60
            for n, minute in enumerate(range(start, end, SLOT_MINUTES)):
                urgent = doc.urgent and n == 0
                slot = orjson.loads(templates[urgent])  # a fresh copy: no two slots share a sub-object
                slot["id"] = ctx.new_id("admin.Slot")
                slot["start"], slot["end"] = b.at(day, minute), b.at(day, minute + SLOT_MINUTES)
                b.out["Slot"].append(slot)
                doc.slots.append(_Slot(slot, day, offset, minute, urgent, True))
            if part == "am" and doc.pm:
                _block(ctx, b, doc, day, offset, LUNCH, doc.pm[0], "Lunch break")
            if admin:
                _block(ctx, b, doc, day, offset, end, end + 60, "Administrative time")


def _block(ctx: WorldContext, b: _Builder, doc: _Doctor, day: date, offset: int, start: int, end: int,
           why: str) -> None:
    slot = b.new("Slot", schedule=_ref(doc.schedule), status="busy-unavailable",  # type: ignore[arg-type]
                 start=b.at(day, start), end=b.at(day, end), comment=why)
    doc.slots.append(_Slot(slot, day, offset, start, False, False))


# ---------------------------------------------------------------------------------------------------
# appointments
# ---------------------------------------------------------------------------------------------------
def _assign_home_doctors(ctx: WorldContext, patients: list[_Patient], doctors: list[_Doctor]) -> None:
    """Each patient's GP (adults) or paediatrician (children), in their city when there is one."""
    rng = ctx.rng("admin.patients")
    for p in patients:
        key = "pediatrics" if p.age < 18 else "general"
        pool = [d for d in doctors if d.specialty.key == key]
        local = [d for d in pool if d.site.city.casefold() == p.city.casefold()]
        p.home = rng.choice(local or pool)


def _specialist_weights(p: _Patient) -> dict[str, float]:
    if p.age < 18:
        return {"pediatrics": 4, "genetics": 1, "dermatology": 1, "orthopedics": 1}
    weights = {"cardiology": 3 if p.age >= 50 else 1, "orthopedics": 2, "dermatology": 2, "endocrinology": 1,
               "neurology": 1, "oncology": 1 if p.age >= 40 else 0.2, "genetics": 1}
    if p.gender == "female" and p.age < 70:
        weights["obgyn"] = 2
    return weights


class _Booker:
    """Books appointments into free slots, keeping slots, appointments and patients consistent."""

    def __init__(self, ctx: WorldContext, b: _Builder, doctors: list[_Doctor]) -> None:
        self.ctx, self.b = ctx, b
        self.rng = ctx.rng("admin.appointments")
        self.by_specialty: dict[str, list[_Doctor]] = defaultdict(list)
        for d in doctors:
            self.by_specialty[d.specialty.key].append(d)

    def pick_doctor(self, p: _Patient) -> _Doctor:
        weights = _specialist_weights(p)
        keys = [k for k in weights if self.by_specialty.get(k)]
        key = self.rng.choices(keys, weights=[weights[k] for k in keys])[0]
        pool = self.by_specialty[key]
        local = [d for d in pool if d.site.city.casefold() == p.city.casefold()]
        return self.rng.choice(local if local and self.rng.random() < 0.8 else pool)

    def free(self, doc: _Doctor, p: _Patient, lo: int, hi: int, urgent: bool = False,
             weekday: int | None = None, avoid_weekday: int | None = None) -> list[_Slot]:
        return [s for s in doc.slots
                if s.bookable and s.resource["status"] == "free" and lo <= s.offset <= hi and s.urgent == urgent
                and s.day not in p.busy_days and (weekday is None or s.day.weekday() == weekday)
                and (avoid_weekday is None or s.day.weekday() != avoid_weekday)]

    def book(self, p: _Patient, doc: _Doctor, lo: int, hi: int, status: str = "booked", urgent: bool = False,
             weekday: int | None = None, avoid_weekday: int | None = None, kind: str | None = None) -> dict | None:
        options = self.free(doc, p, lo, hi, urgent, weekday, avoid_weekday)
        if not options:
            return None
        slot = options[min(int(self.rng.expovariate(1 / 6)), len(options) - 1)]  # sooner is likelier
        return self.appointment(p, doc, slot, status, kind)

    def appointment(self, p: _Patient, doc: _Doctor, slot: _Slot, status: str, kind: str | None = None) -> dict:
        s, rng = doc.specialty, self.rng
        if kind is None:
            if slot.urgent:
                kind = "EMERGENCY"
            elif s.key in ("general", "pediatrics"):
                kind = rng.choice(("CHECKUP", "ROUTINE", "FOLLOWUP"))
            else:
                kind = rng.choice(("ROUTINE", "FOLLOWUP"))
        description = {
            "EMERGENCY": f"Urgent same-day {s.text.lower()} visit",
            "CHECKUP": "Annual check-up" if p.age >= 18 else "Well-child visit",
            "FOLLOWUP": f"{s.text} follow-up",
            "ROUTINE": "Genetic counseling consultation" if s.key == "genetics" else f"{s.text} consultation",
        }[kind]
        created = self.ctx.day(min(0, slot.offset - rng.randint(1, 30)))
        res = self.b.new(
            "Appointment", status=status, serviceCategory=[_cc(SERVICE_CATEGORY, *s.category)],
            serviceType=[_service_cc(s)], specialty=[_specialty_cc(s)], appointmentType=_appt_type(kind),
            description=description, start=slot.resource["start"], end=slot.resource["end"],
            minutesDuration=SLOT_MINUTES, slot=[_ref(slot.resource)], created=created.isoformat(),
            participant=[
                {"actor": _ref(p.resource, p.display), "required": "required", "status": "accepted"},
                {"type": [_cc(PARTICIPATION_TYPE, "PPRF", "primary performer")],
                 "actor": _ref(doc.practitioner, doc.name), "required": "required", "status": "accepted"},
                {"actor": _ref(doc.location, doc.location["name"]), "required": "required", "status": "accepted"},
            ],
        )
        if status == "cancelled":
            code, display = rng.choice(CANCEL_REASONS)
            res["cancelationReason"] = _cc(CANCELLATION_REASON, code, display)
            res["participant"][0 if code.startswith("pat") else 1]["status"] = "declined"
            slot.bookable = False  # free again, but not re-booked here: one slot, one story
        else:
            slot.resource["status"] = "busy"
            p.busy_days.add(slot.day)
        return res

    def waitlist(self, p: _Patient, doc: _Doctor) -> dict:
        s, rng = doc.specialty, self.rng
        lo = rng.randint(2, 7)
        hi = lo + rng.randint(7, 20)
        return self.b.new(
            "Appointment", status="waitlist", serviceCategory=[_cc(SERVICE_CATEGORY, *s.category)],
            serviceType=[_service_cc(s)], specialty=[_specialty_cc(s)], appointmentType=_appt_type("ROUTINE"),
            description=f"Waitlist for an earlier {s.text.lower()} appointment",
            created=self.ctx.day(-rng.randint(1, 20)).isoformat(),
            participant=[
                {"actor": _ref(p.resource, p.display), "required": "required", "status": "accepted"},
                {"type": [_cc(PARTICIPATION_TYPE, "PPRF", "primary performer")],
                 "actor": _ref(doc.practitioner, doc.name), "required": "required", "status": "needs-action"},
            ],
            requestedPeriod=[{"start": self.ctx.day(lo).isoformat(), "end": self.ctx.day(hi).isoformat()}],
        )


def _appointments(ctx: WorldContext, b: _Builder, patients: list[_Patient], doctors: list[_Doctor]) -> None:
    bk = _Booker(ctx, b, doctors)
    rng = bk.rng
    living = [p for p in patients if p.living]
    # several patients with 2-3 future appointments (different doctors, exactly one on a Monday),
    # so "cancel the nearest / the Monday one / the one with Dr X" each name a single appointment
    multi = set(map(id, rng.sample(living, min(len(living), max(7, round(0.15 * len(living)))))))
    for p in living:
        home = p.home
        assert home is not None
        for _ in range(rng.choice((0, 0, 1, 1, 1, 2))):  # the last two weeks
            roll = rng.random()
            status = "fulfilled" if roll < 0.8 else "noshow" if roll < 0.87 else "cancelled"
            bk.book(p, home if rng.random() < 0.6 else bk.pick_doctor(p), -HISTORY_DAYS, -1, status)
        if id(p) in multi:
            seen: list[_Doctor] = []  # each appointment with a different doctor
            for doc in [bk.pick_doctor(p) for _ in range(6)] + [home]:
                if bk.book(p, doc, 1, 27, weekday=0):
                    seen.append(doc)
                    break
            target = rng.choice((2, 3))
            for doc in [home, *(bk.pick_doctor(p) for _ in range(5))]:
                if len(seen) < target and doc not in seen and bk.book(p, doc, 0, FUTURE_DAYS - 1, avoid_weekday=0):
                    seen.append(doc)
        else:
            for _ in range(rng.choice((0, 1, 1, 1, 2))):
                doc = home if rng.random() < 0.5 else bk.pick_doctor(p)
                bk.book(p, doc, 0, FUTURE_DAYS - 1)
            if rng.random() < 0.25:  # an urgent visit with the home doctor in the next days
                bk.book(p, home, 0, 3, urgent=True)
        if rng.random() < 0.15:
            bk.book(p, bk.pick_doctor(p), 0, FUTURE_DAYS - 1, status="cancelled")
    if living and not any(a["status"] == "cancelled" for a in b.out["Appointment"]):
        for p in rng.sample(living, len(living)):  # at least one cancellation whose slot is free again
            if bk.book(p, bk.pick_doctor(p), 0, FUTURE_DAYS - 1, status="cancelled"):
                break
    # the last clinic day's visits are not all closed yet: some still say "arrived"
    done = [a for a in b.out["Appointment"] if a["status"] == "fulfilled"]
    if done:
        last = max(a["start"][:10] for a in done)
        recent = [a for a in done if a["start"][:10] == last]
        for a in [a for a in recent if rng.random() < 0.4] or [max(recent, key=lambda a: a["start"])]:
            a["status"] = "arrived"
    waiting = rng.sample(living, min(len(living), max(5, round(0.1 * len(living)))))
    for p in waiting:
        bk.waitlist(p, bk.pick_doctor(p))
    # one duplicate entry, marked entered-in-error (same patient, same slot as a real booking)
    booked = [a for a in b.out["Appointment"] if a["status"] == "booked"]
    if booked:
        dup = copy.deepcopy(rng.choice(booked))
        dup["id"] = ctx.new_id("admin.Appointment")
        dup["status"] = "entered-in-error"
        dup["comment"] = "Duplicate entry; see the other booking for this slot"
        b.out["Appointment"].append(dup)


# ---------------------------------------------------------------------------------------------------
# insurance & billing
# ---------------------------------------------------------------------------------------------------
def _insurance(ctx: WorldContext, b: _Builder, patients: list[_Patient], insurers: dict[str, dict]) -> None:
    rng = ctx.rng("admin.insurance")
    plans = [_plan(rng, p) for p in patients if p.living]
    _ensure_variety(plans)
    for plan in plans:
        p = plan.patient
        for kind, person in plan.relatives.items():
            person.resource = _related_person(ctx, b, rng, p, kind)
        coverages: list[dict] = []
        if plan.insured:
            ins = plan.insurer
            assert ins is not None
            start = _coverage_start(ctx, rng, p, ins)
            if plan.previous:
                old = rng.choice([i for i in INSURERS if not i.public and i is not ins])
                old_start = _years_before(start, rng.randint(2, 6))
                _coverage(ctx, b, rng, plan, old, insurers[old.name], old_start, "cancelled",
                          end=start - timedelta(days=1))
            coverages.append(_coverage(ctx, b, rng, plan, ins, insurers[ins.name], start, "active"))
            if plan.secondary:
                sup = rng.choice([i for i in INSURERS if i.supplemental])
                coverages.append(_coverage(ctx, b, rng, plan, sup, insurers[sup.name], start, "active",
                                           order=2, chosen=sup.supplemental))
        if plan.account:
            _account(ctx, b, rng, plan, coverages)
    # one coverage keyed in against the wrong payer, then voided
    active = [c for c in b.out["Coverage"] if c["status"] == "active" and c.get("order") == 1]
    if active:
        wrong = copy.deepcopy(rng.choice(active))
        right = wrong["payor"][0]["display"]
        other = rng.choice([i for i in INSURERS if not i.public and i.name != right])
        wrong["id"] = ctx.new_id("admin.Coverage")
        wrong["status"] = "entered-in-error"
        wrong["payor"] = [_ref(insurers[other.name], other.name)]
        b.out["Coverage"].append(wrong)


def _plan(rng: random.Random, p: _Patient) -> _InsurancePlan:
    plan = _InsurancePlan(p, insured=rng.random() < 0.85)
    if p.age < 18:
        plan.relatives["parent"] = _Person()
    elif p.married and rng.random() < 0.7:
        plan.relatives["spouse"] = _Person()
    elif p.age < 26 and rng.random() < 0.5:
        plan.relatives["parent"] = _Person()
    if p.age >= 65:
        plan.insurer = next(i for i in INSURERS if i.name == "Medicare")
        plan.secondary = rng.random() < 0.3
    elif rng.random() < 0.2:
        plan.insurer = next(i for i in INSURERS if i.name == "Medicaid")
    else:
        names = list(PRIVATE_WEIGHTS)
        choice = rng.choices(names, weights=[PRIVATE_WEIGHTS[n] for n in names])[0]
        plan.insurer = next(i for i in INSURERS if i.name == choice)
        if "parent" in plan.relatives:
            plan.subscriber = "parent"
        elif "spouse" in plan.relatives and rng.random() < 0.5:
            plan.subscriber = "spouse"
        plan.previous = rng.random() < 0.2
    plan.account = rng.random() < (0.65 if plan.insured else 0.4)
    if plan.account:
        roll = rng.random()
        if plan.subscriber != "self" and roll < 0.7:
            plan.guarantor = plan.subscriber
        elif p.age < 18 and roll < 0.8:
            plan.guarantor = "parent"
        elif p.age >= 18 and roll < 0.6:
            plan.guarantor = "patient"
    return plan


def _ensure_variety(plans: list[_InsurancePlan]) -> None:
    """Make the insurance & billing tasks possible in any world with a few living patients.

    Needed: someone uninsured, a coverage whose subscriber is a RelatedPerson, an insured patient
    without an account, and accounts guaranteed by a RelatedPerson, by nobody (for a patient who has a
    RelatedPerson to name) and by the patient. Each need is met by an existing plan when one fits,
    else by changing a plan that no earlier need has claimed.
    """
    if len(plans) < 3:
        return
    claimed: set[int] = set()

    def claim(fits: Callable[[_InsurancePlan], bool], fallback: list[_InsurancePlan],
              change: Callable[[_InsurancePlan], None]) -> None:
        found = next((pl for pl in plans if id(pl) not in claimed and fits(pl)), None)
        if found is None:
            found = next((pl for pl in fallback if id(pl) not in claimed), None)
            if found is None:
                return
            change(found)
        claimed.add(id(found))

    def related_guarantor(pl: _InsurancePlan) -> None:
        pl.account = True
        pl.guarantor = pl.subscriber if pl.subscriber != "self" else next(iter(pl.relatives))

    def set_account(guarantor: str | None) -> Callable[[_InsurancePlan], None]:
        def change(pl: _InsurancePlan) -> None:
            pl.account, pl.guarantor = True, guarantor
        return change

    def drop_account(pl: _InsurancePlan) -> None:
        pl.account, pl.guarantor = False, None

    def uninsure(pl: _InsurancePlan) -> None:
        pl.insured = False

    def add_relative(pl: _InsurancePlan) -> None:
        pl.relatives["spouse" if pl.patient.married else "parent"] = _Person()

    def could_depend(pl: _InsurancePlan) -> bool:  # on a spouse's plan, or on a parent's until 26
        return pl.insured and pl.patient.age < 65 and (pl.patient.married or pl.patient.age < 26)

    for pl in sorted((pl for pl in plans if not pl.relatives), key=lambda pl: (not pl.patient.married, pl.patient.age)):
        if sum(bool(q.relatives) for q in plans) >= 4:  # the needs below want four with a RelatedPerson
            break
        add_relative(pl)
    if not any(pl.insured and pl.subscriber != "self" for pl in plans):
        pick = next((pl for pl in plans if could_depend(pl) and pl.relatives), None) or next(
            (pl for pl in plans if could_depend(pl)), None)
        if pick:  # a dependant on a family member's employer plan
            if not pick.relatives:
                add_relative(pick)
            pick.insurer = next(i for i in INSURERS if i.name == "Blue Cross Blue Shield")
            pick.subscriber = next(iter(pick.relatives))
    plain = sorted(plans, key=lambda pl: (pl.patient.age < 18, bool(pl.relatives), pl.subscriber != "self"))
    with_relatives = [pl for pl in plans if pl.relatives]
    adults = [pl for pl in plain if pl.patient.age >= 18]
    claim(lambda pl: not pl.insured and not pl.relatives, [pl for pl in plain if pl.subscriber == "self"], uninsure)
    claim(lambda pl: pl.insured and not pl.account and not pl.relatives, [pl for pl in plain if pl.insured],
          drop_account)
    related = (lambda pl: pl.account and pl.guarantor in pl.relatives, with_relatives, related_guarantor)
    unguaranteed = (lambda pl: pl.account and pl.guarantor is None and bool(pl.relatives), with_relatives,
                    set_account(None))
    patient = (lambda pl: pl.account and pl.guarantor == "patient", adults, set_account("patient"))
    # more than once, so that even the smallest world has four accounts with one guarantor (and two without)
    for need in (related, unguaranteed, patient, related, unguaranteed, patient):
        claim(*need)


def _related_person(ctx: WorldContext, b: _Builder, rng: random.Random, p: _Patient, kind: str) -> dict:
    if kind == "spouse":
        gender = {"male": "female", "female": "male"}.get(p.gender, "female") if rng.random() < 0.92 else p.gender
        birth = p.birth + timedelta(days=rng.randint(-6 * 365, 6 * 365))
        relation = _cc(ROLE_CODE, "SPS", "spouse")
        family = p.family if rng.random() < 0.7 else rng.choice(NAMES["en"][2])
    else:
        gender = rng.choice(("female", "male"))
        birth = _years_before(p.birth, rng.randint(22, 40)) - timedelta(days=rng.randint(0, 300))
        relation = _cc(ROLE_CODE, "MTH", "mother") if gender == "female" else _cc(ROLE_CODE, "FTH", "father")
        family = p.family
    origin = rng.choices(list(ORIGIN_WEIGHTS), weights=list(ORIGIN_WEIGHTS.values()))[0]
    given = rng.choice(NAMES[origin][0 if gender == "female" else 1])
    res = b.new("RelatedPerson", active=True, patient=_ref(p.resource, p.display), relationship=[relation],
                name=[{"use": "official", "family": family, "given": [given]}],
                telecom=[{"system": "phone", "value": f"555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                          "use": "mobile"}],
                gender=gender, birthDate=min(birth, ctx.anchor - timedelta(days=18 * 365)).isoformat())
    if p.resource.get("address"):
        address = copy.deepcopy(p.resource["address"][0])
        address.pop("extension", None)
        res["address"] = [address]
    return res


def _coverage_start(ctx: WorldContext, rng: random.Random, p: _Patient, ins: Insurer) -> date:
    if ins.name == "Medicare":
        sixty_five = _years_before(p.birth, -65)
        start = sixty_five.replace(day=1)
    else:
        start = date(ctx.anchor.year - rng.randint(0, 5), rng.choice((1, 1, 1, 4, 7, 10)), 1)
    start = max(start, p.birth)
    return min(start, ctx.anchor - timedelta(days=30))


def _coverage(ctx: WorldContext, b: _Builder, rng: random.Random, plan: _InsurancePlan, ins: Insurer, payor: dict,
              start: date, status: str, end: date | None = None, order: int = 1, chosen: Plan | None = None) -> dict:
    p = plan.patient
    product = chosen or rng.choice(ins.plans)
    subscriber_kind = plan.subscriber if not ins.public and chosen is None else "self"
    if subscriber_kind == "self":
        subscriber, relationship, dependent = p.resource, ("self", "Self"), None
        holder = p.display
    else:
        subscriber = plan.relatives[subscriber_kind].resource
        relationship = ("spouse", "Spouse") if subscriber_kind == "spouse" else ("child", "Child")
        dependent = "01" if subscriber_kind == "spouse" else "02"
        given, family = _person_name(subscriber)  # type: ignore[arg-type]
        holder = f"{given} {family}"
    assert subscriber is not None
    member = _format(rng, ins.member_format)
    if ins.public:
        group = ("MEDICARE-FFS", "Medicare Fee-for-Service") if ins.name == "Medicare" else ("MASSHEALTH", "MassHealth")
    elif chosen is not None:
        group = (f"{rng.randint(100000, 999999)}", "Individual Medicare Supplement")
    else:
        group = (f"{rng.randint(100000, 999999)}", f"{rng.choice(EMPLOYERS)} Employee Plan")
    res = b.new(
        "Coverage", identifier=[{"type": _cc(IDENTIFIER_TYPE, "MB", "Member Number"),
                                 "value": f"{member}-{dependent or '00'}"}],
        status=status, type=_cc(ACT_CODE, product.kind, COVERAGE_KIND[product.kind]),
        subscriber=_ref(subscriber, holder), subscriberId=member, beneficiary=_ref(p.resource, p.display),
        relationship=_cc(SUBSCRIBER_RELATIONSHIP, *relationship),
        period={"start": start.isoformat(), **({"end": end.isoformat()} if end else {})},
        payor=[_ref(payor, ins.name)],
        **{"class": [
            {"type": _cc(COVERAGE_CLASS, "group", "Group"), "value": group[0], "name": group[1]},
            {"type": _cc(COVERAGE_CLASS, "plan", "Plan"), "value": product.code, "name": product.name},
        ]},
        order=order,
    )
    if dependent:
        res["dependent"] = dependent
    return res


def _account(ctx: WorldContext, b: _Builder, rng: random.Random, plan: _InsurancePlan, coverages: list[dict]) -> None:
    p = plan.patient
    home = p.home
    since = min((date.fromisoformat(c["period"]["start"]) for c in coverages),
                default=ctx.anchor - timedelta(days=rng.randint(60, 1500)))
    since = max(since, p.birth)
    res = b.new("Account", identifier=[{"system": ACCOUNT_ID, "value": f"AC{rng.randint(1000000, 9999999)}"}],
                status="active", type=_cc(ACT_CODE, "PBILLACCT", "patient billing account"),
                name=f"{p.display} - patient billing account", subject=[_ref(p.resource, p.display)],
                servicePeriod={"start": since.isoformat()})
    if coverages:
        res["coverage"] = [{"coverage": _ref(c), "priority": c["order"]} for c in coverages]
    if home is not None:
        res["owner"] = dict(home.role["organization"])
    res["description"] = "Self-pay patient account" if not coverages else "Patient account for professional services"
    if plan.guarantor == "patient":
        party = _ref(p.resource, p.display)
    elif plan.guarantor in plan.relatives:
        person = plan.relatives[plan.guarantor].resource
        assert person is not None
        given, family = _person_name(person)
        party = _ref(person, f"{given} {family}")
    else:
        return
    res["guarantor"] = [{"party": party, "onHold": False, "period": {"start": since.isoformat()}}]

