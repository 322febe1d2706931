"""Realistic searches over Synthea patients, checked against answers computed from the raw bundles.

The Synthea bundles are loaded through ``transaction``; every expected answer is computed here with
plain dict walking over the bundle JSON (never with the server's extractor or search code), and compared
as sets of server ids (or exact order, where the search sorts).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
CVX = "http://hl7.org/fhir/sid/cvx"
UCUM = "http://unitsofmeasure.org"
HBA1C = "4548-4"


@pytest.fixture(scope="module")
def world(synthea_world):
    return synthea_world


# ---------------------------------------------------------------------------------------------------
# independent helpers over raw JSON
# ---------------------------------------------------------------------------------------------------
def has_coding(concept: dict | None, system: str | None, code: str) -> bool:
    return any(
        c.get("code") == code and (system is None or c.get("system") == system)
        for c in (concept or {}).get("coding", [])
    )


def fold(text: str) -> str:
    """Lower case without accents, for FHIR's default string matching."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn").lower()


def starts_with(values, prefix: str) -> bool:
    return any(fold(v).startswith(fold(prefix)) for v in values if isinstance(v, str))


def name_parts(names: list[dict]) -> list[str]:
    out = []
    for n in names:
        out += [n.get("family", ""), n.get("text", ""), *n.get("given", []), *n.get("prefix", []), *n.get("suffix", [])]
    return [x for x in out if x]


def span(value: str) -> tuple[datetime, datetime]:
    """[start, end) of a FHIR date/dateTime at the precision it was written with (UTC when no zone)."""
    if len(value) == 4:
        y = int(value)
        return datetime(y, 1, 1, tzinfo=UTC), datetime(y + 1, 1, 1, tzinfo=UTC)
    if len(value) == 10:
        start = datetime.fromisoformat(value).replace(tzinfo=UTC)
        return start, start + timedelta(days=1)
    start = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    time = value[11:].split("+")[0].split("Z")[0].rsplit("-", 1)[0]
    digits = len(time.split(".")[1]) if "." in time else 0
    return start, start + timedelta(seconds=10.0**-digits)


def period_span(period: dict) -> tuple[datetime, datetime]:
    lo = span(period["start"])[0] if "start" in period else datetime.min.replace(tzinfo=UTC)
    hi = span(period["end"])[1] if "end" in period else datetime.max.replace(tzinfo=UTC)
    return lo, hi


def date_matches(prefix: str, target: tuple[datetime, datetime], search: str) -> bool:
    """R4 date prefix semantics, written from the specification's table."""
    lo, hi = target
    slo, shi = span(search)
    contained = slo <= lo and hi <= shi
    return {
        "eq": contained,
        "ne": not contained,
        "gt": hi > shi,
        "lt": lo < slo,
        "ge": hi > shi or contained,
        "le": lo < slo or contained,
        "sa": lo >= shi,
        "eb": hi <= slo,
    }[prefix]


def effective(res: dict) -> tuple[datetime, datetime] | None:
    if "effectiveDateTime" in res:
        return span(res["effectiveDateTime"])
    if "effectivePeriod" in res:
        return period_span(res["effectivePeriod"])
    return None


# ---------------------------------------------------------------------------------------------------
# server side
# ---------------------------------------------------------------------------------------------------
def search(world, rtype: str, params) -> dict:
    """All pages of a search: {'match': [ids in order], 'include': [(type, id)], 'total': n}."""
    resp = world.client.search(rtype, params)
    assert resp.status == 200, resp.body
    total = resp.body.get("total")
    match: list[str] = []
    include: list[tuple[str, str]] = []
    pages = 0
    while True:
        pages += 1
        for e in resp.body.get("entry", []):
            res = e["resource"]
            if e["search"]["mode"] == "match":
                assert res["resourceType"] == rtype
                match.append(res["id"])
            else:
                assert e["search"]["mode"] == "include"
                include.append((res["resourceType"], res["id"]))
        nxt = next((x["url"] for x in resp.body["link"] if x["relation"] == "next"), None)
        if nxt is None:
            break
        assert pages < 100
        resp = world.client.follow(nxt)
        assert resp.status == 200, resp.body
    assert len(match) == len(set(match)), "a resource matched twice"
    if total is not None:
        assert total == len(match)
    return {"match": match, "include": include, "total": total}


def found(world, rtype: str, params) -> set[str]:
    return set(search(world, rtype, params)["match"])


def ids(entries) -> set[str]:
    return {e.server_id for e in entries}


def subject_is(world, entry, patient, key: str = "subject") -> bool:
    return world.target(entry, entry.resource.get(key)) is patient


@pytest.fixture(scope="module")
def patients(world):
    pts = world.of_type("Patient")
    assert len(pts) == 3
    return pts


# ---------------------------------------------------------------------------------------------------
# the battery
# ---------------------------------------------------------------------------------------------------
def test_load_counts_match_the_bundles(world):
    expected = Counter(e.rtype for e in world.entries)
    assert len(expected) > 20
    for rtype, n in expected.items():
        resp = world.client.search(rtype, {"_summary": "count"})
        assert resp.status == 200, resp.body
        assert resp.body["total"] == n, rtype
        assert "entry" not in resp.body


@pytest.mark.parametrize("index", [0, 1, 2])
def test_patient_observations_by_loinc_code(world, patients, index):
    patient = patients[index]
    expected = ids(
        e for e in world.of_type("Observation")
        if subject_is(world, e, patient) and has_coding(e.resource["code"], LOINC, "8302-2")
    )
    assert expected  # every Synthea patient has body heights
    assert found(world, "Observation", {"patient": patient.server_id, "code": f"{LOINC}|8302-2"}) == expected


def test_patient_observations_sorted_by_date(world, patients):
    patient = patients[2]
    obs = {
        e.server_id: span(e.resource["effectiveDateTime"])[0] for e in world.of_type("Observation")
        if subject_is(world, e, patient) and has_coding(e.resource["code"], LOINC, "29463-7")
    }
    assert len(obs) > 5
    # Synthea records some weights twice at the same instant, so compare the dates of the returned order
    query = {"subject": f"Patient/{patient.server_id}", "code": f"{LOINC}|29463-7", "_sort": "date", "_count": "7"}
    got = search(world, "Observation", query)["match"]
    assert set(got) == set(obs)
    assert [obs[i] for i in got] == sorted(obs.values())
    got = search(world, "Observation", {**query, "_sort": "-date"})["match"]
    assert set(got) == set(obs)
    assert [obs[i] for i in got] == sorted(obs.values(), reverse=True)


def test_latest_hba1c(world, patients):
    with_a1c = 0
    for patient in patients:
        obs = [
            e for e in world.of_type("Observation")
            if subject_is(world, e, patient) and has_coding(e.resource["code"], LOINC, HBA1C)
        ]
        bundle = world.client.search("Observation", {"patient": patient.server_id, "code": f"{LOINC}|{HBA1C}",
                                                     "_sort": "-date", "_count": "1"}).body
        assert bundle["total"] == len(obs)
        if not obs:
            assert "entry" not in bundle
            continue
        with_a1c += 1
        latest = max(obs, key=lambda e: span(e.resource["effectiveDateTime"])[0])
        assert [e["resource"]["id"] for e in bundle["entry"]] == [latest.server_id]
        assert bundle["entry"][0]["resource"]["valueQuantity"] == latest.resource["valueQuantity"]
    assert with_a1c >= 1


def test_observations_in_a_date_window(world, patients):
    patient = patients[2]
    expected = ids(
        e for e in world.of_type("Observation")
        if subject_is(world, e, patient) and has_coding(e.resource["code"], LOINC, "29463-7")
        and date_matches("ge", effective(e.resource), "2015-01-01")
    )
    assert expected
    got = found(world, "Observation", {"subject": f"Patient/{patient.server_id}", "code": f"{LOINC}|29463-7",
                                       "date": "ge2015-01-01"})
    assert got == expected


def test_conditions_by_snomed_code(world):
    expected = ids(e for e in world.of_type("Condition") if has_coding(e.resource["code"], SNOMED, "444814009"))
    assert len(expected) > 3
    assert found(world, "Condition", {"code": f"{SNOMED}|444814009"}) == expected


def test_active_conditions_of_a_patient(world, patients):
    patient = patients[2]
    expected = ids(
        e for e in world.of_type("Condition")
        if subject_is(world, e, patient) and has_coding(e.resource.get("clinicalStatus"), None, "active")
    )
    assert expected
    assert found(world, "Condition", {"patient": patient.server_id, "clinical-status": "active"}) == expected


def test_condition_onset_year(world):
    expected = ids(
        e for e in world.of_type("Condition")
        if "onsetDateTime" in e.resource and date_matches("eq", span(e.resource["onsetDateTime"]), "2020")
    )
    assert expected
    assert found(world, "Condition", {"onset-date": "2020"}) == expected


def test_encounters_in_a_date_range(world):
    expected = ids(
        e for e in world.of_type("Encounter")
        if date_matches("ge", period_span(e.resource["period"]), "2015-01-01")
        and date_matches("lt", period_span(e.resource["period"]), "2017-01-01")
    )
    assert expected
    assert found(world, "Encounter", [("date", "ge2015-01-01"), ("date", "lt2017-01-01")]) == expected


def test_encounters_of_a_patient_in_a_year(world, patients):
    patient = patients[2]
    expected = ids(
        e for e in world.of_type("Encounter")
        if subject_is(world, e, patient) and date_matches("eq", period_span(e.resource["period"]), "2020")
    )
    assert expected
    assert found(world, "Encounter", {"patient": patient.server_id, "date": "2020"}) == expected


def test_latest_encounter_of_each_patient(world, patients):
    for patient in patients:
        encs = [e for e in world.of_type("Encounter") if subject_is(world, e, patient)]
        ends = [period_span(e.resource["period"])[1] for e in encs]
        assert ends.count(max(ends)) == 1
        latest = max(encs, key=lambda e: period_span(e.resource["period"])[1])
        got = world.client.search("Encounter", {"subject": patient.server_id, "_sort": "-date", "_count": "1"}).body
        assert [x["resource"]["id"] for x in got["entry"]] == [latest.server_id]
        assert got["total"] == len(encs)


def test_emergency_encounters(world):
    expected = ids(e for e in world.of_type("Encounter") if e.resource["class"].get("code") == "EMER")
    assert expected
    assert found(world, "Encounter", {"class": "EMER"}) == expected
    act = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
    assert found(world, "Encounter", {"class": f"{act}|EMER"}) == expected
    expected_pts = ids(world.target(e, e.resource["subject"]) for e in world.of_type("Encounter")
                       if e.resource["class"].get("code") == "EMER")
    assert found(world, "Patient", {"_has:Encounter:patient:class": "EMER"}) == expected_pts


def test_medication_requests_by_status(world, patients):
    for status in ("active", "stopped"):
        expected = ids(e for e in world.of_type("MedicationRequest") if e.resource["status"] == status)
        assert expected
        assert found(world, "MedicationRequest", {"status": status}) == expected
    patient = patients[0]
    expected = ids(
        e for e in world.of_type("MedicationRequest")
        if subject_is(world, e, patient) and e.resource["status"] == "stopped"
    )
    assert expected
    assert found(world, "MedicationRequest", {"status": "stopped", "patient": patient.server_id}) == expected


def test_medication_requests_by_rxnorm_code(world):
    codes = Counter(
        c["code"] for e in world.of_type("MedicationRequest") for c in e.resource["medicationCodeableConcept"]["coding"]
    )
    code = codes.most_common(1)[0][0]
    expected = ids(
        e for e in world.of_type("MedicationRequest") if has_coding(e.resource["medicationCodeableConcept"], RXNORM, code)
    )
    assert len(expected) == codes[code] > 1
    assert found(world, "MedicationRequest", {"code": f"{RXNORM}|{code}"}) == expected


def test_chained_patient_family(world, patients):
    for patient in patients:
        families = [n["family"] for n in patient.resource["name"]]
        for family in families:  # official and maiden names both match
            expected = ids(
                e for e in world.of_type("Observation")
                if has_coding(e.resource["code"], LOINC, "8867-4")
                and starts_with([n.get("family") for n in world.target(e, e.resource["subject"]).resource["name"]],
                                family)
            )
            assert expected
            got = found(world, "Observation", {"patient.family": family, "code": f"{LOINC}|8867-4"})
            assert got == expected, family
    assert any(len(p.resource["name"]) > 1 for p in patients)  # the maiden-name case was exercised


def test_chain_with_type_modifier_and_category(world, patients):
    patient = patients[1]
    given = patient.resource["name"][0]["given"][0]
    expected = ids(
        e for e in world.of_type("Observation")
        if starts_with(name_parts(world.target(e, e.resource["subject"]).resource["name"]), given)
        and any(has_coding(c, None, "social-history") for c in e.resource.get("category", []))
    )
    assert expected
    got = found(world, "Observation", {"subject:Patient.given": given, "category": "social-history"})
    assert got == expected


def test_has_condition(world):
    code = "714628002"  # prediabetes
    expected = ids(
        world.target(e, e.resource["subject"]) for e in world.of_type("Condition")
        if has_coding(e.resource["code"], SNOMED, code)
    )
    assert len(expected) == 1
    assert found(world, "Patient", {"_has:Condition:subject:code": f"{SNOMED}|{code}"}) == expected
    assert found(world, "Patient", {"_has:Observation:patient:code": f"{LOINC}|{HBA1C}"}) == ids(
        world.target(e, e.resource["subject"]) for e in world.of_type("Observation")
        if has_coding(e.resource["code"], LOINC, HBA1C)
    )


def test_revinclude_encounters_and_provenance(world, patients):
    patient = patients[1]
    result = search(world, "Patient", [("_id", patient.server_id), ("_revinclude", "Encounter:subject"),
                                       ("_revinclude", "Provenance:target")])
    assert result["match"] == [patient.server_id]
    expected = {("Encounter", e.server_id) for e in world.of_type("Encounter") if subject_is(world, e, patient)}
    expected |= {
        ("Provenance", e.server_id) for e in world.of_type("Provenance")
        if any(world.target(e, t) is patient for t in e.resource["target"])
    }
    assert len(result["include"]) == len(expected)
    assert set(result["include"]) == expected


def test_include_encounter_participants_and_provider(world):
    enc = world.of_type("Encounter")[0]
    expected = {("Organization", world.target(enc, enc.resource["serviceProvider"]).server_id)}
    expected |= {("Practitioner", world.target(enc, p["individual"]).server_id) for p in enc.resource["participant"]}
    result = search(world, "Encounter", [("_id", enc.server_id), ("_include", "Encounter:participant"),
                                         ("_include", "Encounter:service-provider")])
    assert result["match"] == [enc.server_id]
    assert set(result["include"]) == expected


def test_practitioner_by_name(world):
    pracs = world.of_type("Practitioner")
    family = Counter(n["family"] for e in pracs for n in e.resource["name"]).most_common(1)[0][0]
    expected = ids(e for e in pracs if starts_with(name_parts(e.resource["name"]), family))
    assert len(expected) > 1
    assert found(world, "Practitioner", {"name": family.lower()}) == expected
    one = next(e for e in pracs if e.server_id in expected)
    given = one.resource["name"][0]["given"][0]
    expected = ids(
        e for e in pracs
        if starts_with([n["family"] for n in e.resource["name"]], family)
        and starts_with([g for n in e.resource["name"] for g in n.get("given", [])], given)
    )
    assert one.server_id in expected
    assert found(world, "Practitioner", {"family": family, "given": given.upper()}) == expected


def test_organization_name_and_encounter_provider_chain(world):
    orgs = world.of_type("Organization")
    expected = ids(e for e in orgs if starts_with([e.resource["name"]], "boston"))
    assert len(expected) >= 2
    assert found(world, "Organization", {"name": "Boston"}) == expected
    expected = ids(
        e for e in world.of_type("Encounter")
        if starts_with([world.target(e, e.resource["serviceProvider"]).resource["name"]], "boston")
    )
    assert expected
    assert found(world, "Encounter", {"service-provider.name": "boston"}) == expected


def test_body_weight_above_80kg(world):
    expected = ids(
        e for e in world.of_type("Observation")
        if has_coding(e.resource["code"], LOINC, "29463-7")
        and e.resource["valueQuantity"]["code"] == "kg" and e.resource["valueQuantity"]["value"] > 80
    )
    assert expected
    assert found(world, "Observation", {"code": f"{LOINC}|29463-7", "value-quantity": f"gt80|{UCUM}|kg"}) == expected


def test_blood_pressure_components_do_not_mix(world):
    def bp_with(code: str, above: float) -> set[str]:
        return ids(
            e for e in world.of_type("Observation")
            if any(has_coding(c["code"], LOINC, code) and c.get("valueQuantity", {}).get("value", -1) > above
                   for c in e.resource.get("component", []))
        )

    systolic = bp_with("8480-6", 130)
    assert systolic
    assert found(world, "Observation", {"component-code-value-quantity": f"{LOINC}|8480-6$gt130"}) == systolic
    diastolic = bp_with("8462-4", 130)  # no diastolic that high: a systolic value must not leak across
    assert diastolic == set()
    assert found(world, "Observation", {"component-code-value-quantity": f"{LOINC}|8462-4$gt130"}) == set()


def test_smoking_status_value_concept(world):
    expected = ids(
        e for e in world.of_type("Observation")
        if has_coding(e.resource["code"], LOINC, "72166-2")
        and has_coding(e.resource.get("valueCodeableConcept"), SNOMED, "8517006")
    )
    assert expected
    got = found(world, "Observation", {"code": f"{LOINC}|72166-2", "value-concept": f"{SNOMED}|8517006"})
    assert got == expected


def test_immunizations_of_a_patient(world, patients):
    patient = patients[0]
    expected = ids(
        e for e in world.of_type("Immunization")
        if subject_is(world, e, patient, "patient") and has_coding(e.resource["vaccineCode"], CVX, "140")
    )
    assert len(expected) > 5
    assert found(world, "Immunization", {"patient": patient.server_id, "vaccine-code": f"{CVX}|140"}) == expected


def test_diagnostic_reports_chained_to_results(world, patients):
    patient = patients[2]
    hemoglobin = "718-7"  # a CBC result
    expected = ids(
        e for e in world.of_type("DiagnosticReport")
        if subject_is(world, e, patient)
        and any(has_coding(world.target(e, r).resource["code"], LOINC, hemoglobin) for r in e.resource.get("result", []))
    )
    assert len(expected) > 1
    got = found(world, "DiagnosticReport", {"patient": patient.server_id, "result.code": f"{LOINC}|{hemoglobin}"})
    assert got == expected
    # the reverse direction: observations that some report of this patient lists as a result
    expected = ids(
        world.target(e, r) for e in world.of_type("DiagnosticReport") if subject_is(world, e, patient)
        for r in e.resource.get("result", []) if has_coding(world.target(e, r).resource["code"], LOINC, hemoglobin)
    )
    got = found(world, "Observation", {"code": f"{LOINC}|{hemoglobin}",
                                       "_has:DiagnosticReport:result:patient": patient.server_id})
    assert got == expected


def test_procedures_since_2020(world, patients):
    patient = patients[2]

    def performed(res):
        if "performedDateTime" in res:
            return span(res["performedDateTime"])
        return period_span(res["performedPeriod"])

    expected = ids(
        e for e in world.of_type("Procedure")
        if subject_is(world, e, patient) and date_matches("ge", performed(e.resource), "2020")
    )
    assert expected
    assert found(world, "Procedure", {"subject": patient.server_id, "date": "ge2020"}) == expected


def test_patient_demographics(world, patients):
    assert found(world, "Patient", {"gender": "female"}) == ids(p for p in patients if p.resource["gender"] == "female")
    expected = ids(p for p in patients if date_matches("lt", span(p.resource["birthDate"]), "1990-01-01"))
    assert len(expected) == 1
    assert found(world, "Patient", {"birthdate": "lt1990-01-01"}) == expected
    assert found(world, "Patient", {"address-city": "boston"}) == ids(
        p for p in patients if starts_with([a.get("city") for a in p.resource["address"]], "boston")
    )
    ssn = patients[1].resource["identifier"][2]
    assert ssn["system"] == "http://hl7.org/fhir/sid/us-ssn"
    assert found(world, "Patient", {"identifier": f"{ssn['system']}|{ssn['value']}"}) == {patients[1].server_id}


def test_paging_through_a_large_result(world, patients):
    patient = patients[2]
    expected = ids(e for e in world.of_type("Observation") if subject_is(world, e, patient))
    assert len(expected) > 600
    result = search(world, "Observation", {"patient": patient.server_id, "_count": "150"})
    assert set(result["match"]) == expected
    assert result["total"] == len(expected)


NEGATIVE = [
    ("Observation", {"code": f"{LOINC}|0000-0"}),
    ("Observation", {"code": f"{SNOMED}|{HBA1C}"}),  # right code, wrong system
    ("Observation", {"patient.family": "Nonexistentname"}),
    ("Encounter", {"date": "1800"}),
    ("MedicationRequest", {"status": "draft"}),
    ("Patient", {"_has:Condition:subject:code": f"{SNOMED}|0000000"}),
    ("Practitioner", {"name": "zzzz"}),
    ("Observation", {"component-code-value-quantity": f"{LOINC}|8480-6$gt400"}),
]


@pytest.mark.parametrize(("rtype", "params"), NEGATIVE, ids=[f"{r}-{p}" for r, p in NEGATIVE])
def test_negative_searches(world, rtype, params):
    result = search(world, rtype, params)
    assert result["match"] == [] and result["total"] == 0


def test_negative_patient_scoped(world, patients):
    patient = patients[0]
    assert not any(
        subject_is(world, e, patient) and has_coding(e.resource["code"], LOINC, HBA1C) for e in world.of_type("Observation")
    )
    assert found(world, "Observation", {"patient": patient.server_id, "code": f"{LOINC}|{HBA1C}"}) == set()
    assert not any(
        subject_is(world, e, patient) and e.resource["status"] == "active" for e in world.of_type("MedicationRequest")
    )
    assert found(world, "MedicationRequest", {"patient": patient.server_id, "status": "active"}) == set()
