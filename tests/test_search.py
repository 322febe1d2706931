"""FHIR R4 search semantics of the embedded server, on small hand-built data with known answers.

Every case asserts the exact set (or order) of matching resources. The data set is built once per module
on a server whose clock is frozen (``ap`` measures its tolerance from "now"); tests that write build
their own server.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import pytest

from conftest import FROZEN_NOW, new_client
from fhirgym.fhir import FhirServer, InProcessClient, ServerConfig, Snapshot, Store

BASE = "http://localhost:8080/fhir"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
MRN = "http://example.org/mrn"
TAGS = "http://example.org/tags"
PROFILE = "http://example.org/fhir/StructureDefinition/special-patient"
VS = "http://example.org/fhir/ValueSet"
SUBSETTED = {"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED"}


def _coding(system: str | None, code: str, display: str | None = None) -> dict:
    c = {"code": code}
    if system:
        c["system"] = system
    if display:
        c["display"] = display
    return c


def _qty(value: float, unit: str, code: str | None = None) -> dict:
    q: dict = {"value": value, "unit": unit}
    if code:
        q.update(system=UCUM, code=code)
    return q


def _bp(systolic: float, diastolic: float) -> list[dict]:
    return [
        {"code": {"coding": [_coding(LOINC, "8480-6")]}, "valueQuantity": _qty(systolic, "mmHg", "mm[Hg]")},
        {"code": {"coding": [_coding(LOINC, "8462-4")]}, "valueQuantity": _qty(diastolic, "mmHg", "mm[Hg]")},
    ]


class Clinic:
    """Named resources on one server; queries answer with names, so expectations read as data."""

    def __init__(self, client: InProcessClient) -> None:
        self.client = client
        self.ids: dict[str, str] = {}
        self.types: dict[str, str] = {}
        self.names: dict[tuple[str, str], str] = {}

    def add(self, name: str, resource: dict) -> str:
        resp = self.client.create(resource)
        assert resp.status == 201, resp.body
        rid = resp.body["id"]
        self.ids[name] = rid
        self.types[name] = resource["resourceType"]
        self.names[(resource["resourceType"], rid)] = name
        return rid

    def ref(self, name: str) -> dict:
        return {"reference": f"{self.types[name]}/{self.ids[name]}"}

    def search(self, rtype: str, params, **kw) -> dict:
        resp = self.client.search(rtype, params, **kw)
        assert resp.status == 200, resp.body
        assert resp.body["resourceType"] == "Bundle" and resp.body["type"] == "searchset"
        return resp.body

    def named(self, bundle: dict, mode: str = "match") -> list[str]:
        return [
            self.names[(e["resource"]["resourceType"], e["resource"]["id"])]
            for e in bundle.get("entry", [])
            if e["search"]["mode"] == mode
        ]

    def find(self, rtype: str, params, **kw) -> set[str]:
        bundle = self.search(rtype, params, **kw)
        found = self.named(bundle)
        assert len(found) == len(set(found)), f"duplicate matches: {found}"
        assert bundle["total"] == len(found)
        return set(found)

    def ordered(self, rtype: str, params) -> list[str]:
        return self.named(self.search(rtype, params))


def build_clinic(client: InProcessClient) -> Clinic:
    k = Clinic(client)
    k.add("org_parent", {"resourceType": "Organization", "name": "Northwind Health System"})
    k.add("org_acme", {"resourceType": "Organization", "name": "Acme Clinic", "partOf": k.ref("org_parent")})
    k.add("org_beta", {"resourceType": "Organization", "name": "Beta Hospital"})
    k.add("p_muller", {
        "resourceType": "Patient",
        "meta": {"tag": [{"system": TAGS, "code": "vip"}], "profile": [PROFILE]},
        "identifier": [{"system": MRN, "value": "MRN-1"}],
        "active": True,
        "name": [{"family": "Müller", "given": ["Jörg"]}],
        "gender": "male",
        "birthDate": "1970-05-02",
        "address": [{"city": "São Paulo"}],
        "managingOrganization": k.ref("org_acme"),
    })
    k.add("p_mullins", {
        "resourceType": "Patient", "identifier": [{"value": "MRN-1"}], "active": False,
        "name": [{"family": "Mullins", "given": ["Ann"]}], "gender": "female", "birthDate": "1970",
        "managingOrganization": k.ref("org_beta"),
    })
    k.add("p_smith_jr", {"resourceType": "Patient", "name": [{"family": "Smith, Jr", "given": ["Bob"]}],
                         "gender": "male", "birthDate": "1985-12-31"})
    k.add("p_smith", {"resourceType": "Patient", "name": [{"family": "Smith", "given": ["Alice"]}],
                      "gender": "female", "birthDate": "1971-01-01"})
    k.add("p_jr", {"resourceType": "Patient", "name": [{"family": "Jr"}]})
    k.add("pr_house", {"resourceType": "Practitioner", "name": [{"family": "House", "given": ["Gregory"]}]})
    k.add("pr_wilson", {"resourceType": "Practitioner", "name": [{"family": "Wilson", "given": ["James"]}]})

    def obs(name: str, **kw) -> None:
        k.add(name, {"resourceType": "Observation", "status": "final", **kw})

    lab = [{"coding": [_coding("http://terminology.hl7.org/CodeSystem/observation-category", "laboratory")]}]
    vital = [{"coding": [_coding("http://terminology.hl7.org/CodeSystem/observation-category", "vital-signs")]}]
    obs("o_glu_a", category=lab, code={"coding": [_coding(LOINC, "2345-7", "Glucose")], "text": "Glucose serum"},
        subject=k.ref("p_muller"), effectiveDateTime="2024-03-15T10:30:00Z", valueQuantity=_qty(5.4, "mg", "mg"),
        performer=[k.ref("pr_house")])
    obs("o_glu_b", code={"coding": [_coding(LOINC, "2345-7")]}, subject=k.ref("p_muller"),
        effectiveDateTime="2024-03-01T10:30:45+02:00", valueQuantity=_qty(6.1, "mg", "mg"))
    obs("o_glu_nosys", code={"coding": [_coding(None, "2345-7")]}, subject=k.ref("p_mullins"),
        effectiveDateTime="2024-02-29", valueQuantity=_qty(5.4, "mg"))
    k.add("o_other_sys", {
        "resourceType": "Observation", "status": "preliminary",
        "code": {"coding": [_coding("http://example.org/codes", "2345-7")]}, "subject": k.ref("p_smith"),
        "effectivePeriod": {"start": "2024-01-01", "end": "2024-06-30"},
    })
    obs("o_bp", category=vital, code={"coding": [_coding(LOINC, "85354-9")]}, subject=k.ref("p_muller"),
        effectiveDateTime="2023-11-05T08:00:00Z", performer=[k.ref("pr_wilson")], component=_bp(120, 80))
    obs("o_bp2", code={"coding": [_coding(LOINC, "85354-9")]}, subject=k.ref("p_smith"),
        effectiveDateTime="2023-11-06T08:00:00Z", component=_bp(140, 95))
    obs("o_text", code={"text": "Free text finding"}, subject=k.ref("p_jr"), valueString="n/a")
    obs("o_ident", code={"coding": [_coding(LOINC, "29463-7")]}, subject={"identifier": {"system": MRN, "value": "MRN-9"}},
        valueQuantity=_qty(70, "kg", "kg"))
    k.add("dr_1", {"resourceType": "DiagnosticReport", "status": "final", "code": {"coding": [_coding(LOINC, "24323-8")]},
                   "subject": k.ref("p_muller"), "result": [k.ref("o_glu_a"), k.ref("o_glu_b")]})
    k.add("med_asp", {"resourceType": "Medication", "code": {"coding": [_coding(RXNORM, "1191", "Aspirin")]}})
    k.add("mr_1", {"resourceType": "MedicationRequest", "status": "active", "intent": "order",
                   "medicationReference": k.ref("med_asp"), "subject": k.ref("p_muller"), "requester": k.ref("pr_house")})
    k.add("mr_2", {"resourceType": "MedicationRequest", "status": "stopped", "intent": "order",
                   "medicationCodeableConcept": {"text": "Ibuprofen"}, "subject": k.ref("p_smith")})
    act = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
    k.add("enc_1", {"resourceType": "Encounter", "status": "finished", "class": _coding(act, "IMP"),
                    "subject": k.ref("p_muller"), "serviceProvider": k.ref("org_acme"),
                    "period": {"start": "2024-01-10T09:00:00Z", "end": "2024-01-20T17:00:00Z"}})
    k.add("enc_2", {"resourceType": "Encounter", "status": "in-progress", "class": _coding(act, "AMB"),
                    "subject": k.ref("p_muller"), "period": {"start": "2024-01-15T09:00:00Z"}, "partOf": k.ref("enc_1")})
    k.add("enc_3", {"resourceType": "Encounter", "status": "finished", "class": _coding(act, "AMB"),
                    "subject": k.ref("p_muller"), "partOf": k.ref("enc_2"),
                    "period": {"start": "2024-01-15T10:00:00Z", "end": "2024-01-15T11:00:00Z"}})
    # probabilities at most 100 (invariant ras-2): precision is tested around 50
    for name, p in [("ra_50_4", 50.4), ("ra_50_6", 50.6), ("ra_49_5", 49.5), ("ra_50", 50), ("ra_0_004", 0.004)]:
        k.add(name, {"resourceType": "RiskAssessment", "status": "final", "subject": k.ref("p_smith"),
                     "prediction": [{"probabilityDecimal": p}]})
    k.add("ra_none", {"resourceType": "RiskAssessment", "status": "final", "subject": k.ref("p_smith")})
    for name, url in [("vs_a", f"{VS}/a"), ("vs_a_b", f"{VS}/a/b"), ("vs_ab", f"{VS}/ab")]:
        k.add(name, {"resourceType": "ValueSet", "status": "active", "url": url})
    return k


@pytest.fixture(scope="module")
def clinic() -> Clinic:
    return build_clinic(new_client(ServerConfig(clock=lambda: FROZEN_NOW)))


def _error(resp, status: int, *fragments: str) -> str:
    """Assert an OperationOutcome error with ``status``; returns the diagnostics (which name the problem)."""
    assert resp.status == status, resp.body
    assert resp.body["resourceType"] == "OperationOutcome"
    issue = resp.body["issue"][0]
    assert issue["severity"] in ("error", "fatal")
    diag = issue.get("diagnostics", "")
    for f in fragments:
        assert f in diag, diag
    return diag


PATIENTS = {"p_muller", "p_mullins", "p_smith_jr", "p_smith", "p_jr"}
OBSERVATIONS = {"o_glu_a", "o_glu_b", "o_glu_nosys", "o_other_sys", "o_bp", "o_bp2", "o_text", "o_ident"}
MULLER_OBS = {"o_glu_a", "o_glu_b", "o_bp"}

# ---------------------------------------------------------------------------------------------------
# string
# ---------------------------------------------------------------------------------------------------
STRING_CASES = [
    ({"name": "mul"}, {"p_muller", "p_mullins"}),
    ({"name": "MUL"}, {"p_muller", "p_mullins"}),  # case-insensitive
    ({"family": "muller"}, {"p_muller"}),  # accent-insensitive
    ({"family": "MÜLLER"}, {"p_muller"}),
    ({"given": "jorg"}, {"p_muller"}),
    ({"family": "ller"}, set()),  # default is starts-with, not contains
    ({"family:exact": "Müller"}, {"p_muller"}),
    ({"family:exact": "müller"}, set()),  # exact is case- and accent-sensitive
    ({"family:exact": "Mül"}, set()),  # ... and whole-string
    ({"family:contains": "LLIN"}, {"p_mullins"}),
    ({"family:contains": "ulle"}, {"p_muller"}),
    ({"name:contains": "ith"}, {"p_smith", "p_smith_jr"}),
    ({"address-city": "sao"}, {"p_muller"}),
    ({"address-city:exact": "São Paulo"}, {"p_muller"}),
    ({"family": "smi"}, {"p_smith", "p_smith_jr"}),
    ({"family": "zzz"}, set()),
    # OR with a comma; an escaped comma is part of the value
    ({"given": "ann,alice"}, {"p_mullins", "p_smith"}),
    ({"family": "Smith\\, Jr"}, {"p_smith_jr"}),
    ({"family": "Smith, Jr"}, {"p_smith", "p_smith_jr", "p_jr"}),  # "Smith" OR " Jr"
    # AND with repeated parameters
    ([("family", "mul"), ("given", "ann")], {"p_mullins"}),
    ([("name", "smith"), ("name", "bob")], {"p_smith_jr"}),
    ({"name:missing": "true"}, set()),
]


@pytest.mark.parametrize(("params", "expected"), STRING_CASES, ids=[str(c[0]) for c in STRING_CASES])
def test_string(clinic, params, expected):
    assert clinic.find("Patient", params) == expected


# ---------------------------------------------------------------------------------------------------
# token
# ---------------------------------------------------------------------------------------------------
TOKEN_CASES = [
    ("Observation", {"code": "2345-7"}, {"o_glu_a", "o_glu_b", "o_glu_nosys", "o_other_sys"}),
    ("Observation", {"code": f"{LOINC}|2345-7"}, {"o_glu_a", "o_glu_b"}),
    ("Observation", {"code": "|2345-7"}, {"o_glu_nosys"}),  # explicitly no system
    ("Observation", {"code": f"{LOINC}|"}, {"o_glu_a", "o_glu_b", "o_bp", "o_bp2", "o_ident"}),
    ("Observation", {"code": f"{LOINC}|2345-7,{LOINC}|85354-9"}, {"o_glu_a", "o_glu_b", "o_bp", "o_bp2"}),
    ("Observation", {"code": "http://other.org|2345-7"}, set()),
    # :not includes resources that have no value at all (o_text has no coding)
    ("Observation", {"code:not": f"{LOINC}|2345-7"}, OBSERVATIONS - {"o_glu_a", "o_glu_b"}),
    ("Observation", {"code:text": "glucose"}, {"o_glu_a"}),  # Coding.display
    ("Observation", {"code:text": "free"}, {"o_text"}),  # CodeableConcept.text
    ("Observation", {"code:text": "finding"}, {"o_text"}),  # any word of it
    ("Observation", {"code:in": "http://hl7.org/fhir/ValueSet/observation-vitalsignresult"},
     {"o_bp", "o_bp2", "o_ident"}),
    ("Observation", {"code:not-in": "http://hl7.org/fhir/ValueSet/observation-vitalsignresult"},
     {"o_glu_a", "o_glu_b", "o_glu_nosys", "o_other_sys", "o_text"}),
    ("Observation", {"status": "preliminary"}, {"o_other_sys"}),
    ("Observation", {"category": "vital-signs"}, {"o_bp"}),
    ("Observation", {"category:missing": "true"}, OBSERVATIONS - {"o_bp", "o_glu_a"}),
    ("Patient", {"gender": "male"}, {"p_muller", "p_smith_jr"}),
    ("Patient", {"gender": "male,female"}, PATIENTS - {"p_jr"}),
    ("Patient", {"gender:not": "male"}, {"p_mullins", "p_smith", "p_jr"}),
    ("Patient", {"gender:missing": "true"}, {"p_jr"}),
    ("Patient", {"gender:missing": "false"}, PATIENTS - {"p_jr"}),
    ("Patient", {"gender:in": "http://hl7.org/fhir/ValueSet/administrative-gender"}, PATIENTS - {"p_jr"}),
    ("Patient", {"active": "true"}, {"p_muller"}),
    ("Patient", {"active": "false"}, {"p_mullins"}),
    ("Patient", {"active:not": "true"}, PATIENTS - {"p_muller"}),
    ("Patient", {"identifier": f"{MRN}|MRN-1"}, {"p_muller"}),
    ("Patient", {"identifier": "MRN-1"}, {"p_muller", "p_mullins"}),
    ("Patient", {"identifier": "|MRN-1"}, {"p_mullins"}),
    ("Patient", {"identifier": f"{MRN}|"}, {"p_muller"}),
    ("Patient", {"identifier": "mrn-1"}, set()),  # tokens are case-sensitive
]


@pytest.mark.parametrize(("rtype", "params", "expected"), TOKEN_CASES, ids=[f"{c[0]}-{c[1]}" for c in TOKEN_CASES])
def test_token(clinic, rtype, params, expected):
    assert clinic.find(rtype, params) == expected


def test_token_text_searches_codeableconcept_text_even_when_codings_have_a_display(clinic):
    # o_glu_a: code.text = "Glucose serum", code.coding[0].display = "Glucose"
    assert clinic.find("Observation", {"code:text": "serum"}) == {"o_glu_a"}
    assert clinic.find("Observation", {"code:text": "glucose serum"}) == {"o_glu_a"}
    assert clinic.find("Observation", {"code:text": "glucose,free"}) == {"o_glu_a", "o_text"}


# ---------------------------------------------------------------------------------------------------
# reference
# ---------------------------------------------------------------------------------------------------
def test_reference_forms(clinic):
    pid = clinic.ids["p_muller"]
    for value in (pid, f"Patient/{pid}", f"{BASE}/Patient/{pid}", f"Patient/{pid}/_history/1"):
        assert clinic.find("Observation", {"subject": value}) == MULLER_OBS, value
    assert clinic.find("Observation", {"patient": pid}) == MULLER_OBS
    assert clinic.find("Observation", {"subject:Patient": pid}) == MULLER_OBS
    assert clinic.find("Observation", {"subject:Group": pid}) == set()
    assert clinic.find("Observation", {"subject": f"Patient/{pid},Patient/{clinic.ids['p_mullins']}"}) == (
        MULLER_OBS | {"o_glu_nosys"}
    )
    assert clinic.find("Observation", {"subject": f"Group/{pid}"}) == set()
    assert clinic.find("Observation", {"subject": "http://elsewhere.org/fhir/Patient/1"}) == set()
    assert clinic.find("Observation", {"performer:Practitioner": clinic.ids["pr_house"]}) == {"o_glu_a"}
    assert clinic.find("Encounter", {"part-of": clinic.ids["enc_1"]}) == {"enc_2"}


def test_reference_identifier_and_missing(clinic):
    assert clinic.find("Observation", {"subject:identifier": f"{MRN}|MRN-9"}) == {"o_ident"}
    assert clinic.find("Observation", {"subject:identifier": "MRN-9"}) == {"o_ident"}
    assert clinic.find("Observation", {"subject:identifier": f"{MRN}|MRN-1"}) == set()
    assert clinic.find("Observation", {"subject:missing": "true"}) == set()
    assert clinic.find("Observation", {"performer:missing": "true"}) == OBSERVATIONS - {"o_glu_a", "o_bp"}
    assert clinic.find("Observation", {"performer:missing": "false"}) == {"o_glu_a", "o_bp"}
    assert clinic.find("Encounter", {"part-of:missing": "true"}) == {"enc_1"}


def test_reference_errors(clinic):
    c = clinic.client
    _error(c.search("Observation", {"subject": "Foo/1"}), 400, "Foo/1")
    _error(c.search("Observation", {"subject:Practitioner": "x"}), 400, "Practitioner")
    _error(c.search("Observation", {"subject:missing": "yes"}), 400, "true or false")


# ---------------------------------------------------------------------------------------------------
# date
# ---------------------------------------------------------------------------------------------------
DATE_CASES = [
    # birthdate: date at day precision (p_muller 1970-05-02, p_smith 1971-01-01, p_smith_jr 1985-12-31) and
    # year precision (p_mullins 1970)
    ("Patient", {"birthdate": "1970"}, {"p_muller", "p_mullins"}),
    ("Patient", {"birthdate": "1970-05"}, {"p_muller"}),
    ("Patient", {"birthdate": "eq1970-05-02"}, {"p_muller"}),
    ("Patient", {"birthdate": "gt1970"}, {"p_smith", "p_smith_jr"}),
    ("Patient", {"birthdate": "ge1970"}, {"p_muller", "p_mullins", "p_smith", "p_smith_jr"}),
    ("Patient", {"birthdate": "lt1970"}, set()),
    ("Patient", {"birthdate": "lt1970-05-02"}, {"p_mullins"}),  # the year 1970 reaches below May 2nd
    ("Patient", {"birthdate": "le1970-05-02"}, {"p_muller", "p_mullins"}),
    ("Patient", {"birthdate": "ne1970"}, {"p_smith", "p_smith_jr"}),
    ("Patient", {"birthdate": "sa1970"}, {"p_smith", "p_smith_jr"}),
    ("Patient", {"birthdate": "eb1971"}, {"p_muller", "p_mullins"}),
    ("Patient", {"birthdate": "eb1970-05-02"}, set()),
    # now = 2024-06-01: 10 % of ~54 years is ~5.4 years either side
    ("Patient", {"birthdate": "ap1970-05-01"}, {"p_muller", "p_mullins", "p_smith"}),
    ("Patient", [("birthdate", "ge1970"), ("birthdate", "lt1971")], {"p_muller", "p_mullins"}),
    ("Patient", {"birthdate:missing": "true"}, {"p_jr"}),
    # Observation.effective: dateTimes (one with a +02:00 offset and seconds), a date, a Period Jan..Jun 2024
    ("Observation", {"date": "2024-03"}, {"o_glu_a", "o_glu_b"}),
    ("Observation", {"date": "2024-03-01"}, {"o_glu_b"}),
    ("Observation", {"date": "eq2024-03-01"}, {"o_glu_b"}),
    ("Observation", {"date": "2024-03-01T08:30:45Z"}, {"o_glu_b"}),  # 10:30:45+02:00
    ("Observation", {"date": "2024-03-01T10:30:45+02:00"}, {"o_glu_b"}),
    ("Observation", {"date": "2024-03-01T10:30:45Z"}, set()),
    ("Observation", {"date": "2024-03-01T08:30Z"}, {"o_glu_b"}),  # minute precision contains the second
    ("Observation", {"date": "2024-02-29"}, {"o_glu_nosys"}),
    ("Observation", {"date": "2024-02"}, {"o_glu_nosys"}),  # the Period is not contained in February
    ("Observation", {"date": "2024"}, {"o_glu_a", "o_glu_b", "o_glu_nosys", "o_other_sys"}),
    ("Observation", {"date": "lt2024-02-01"}, {"o_other_sys", "o_bp", "o_bp2"}),
    ("Observation", {"date": "gt2024-03-15"}, {"o_other_sys"}),
    ("Observation", {"date": "ap2024-03-14"}, {"o_glu_a", "o_other_sys"}),  # +-8 days; the Period overlaps
    ("Observation", {"date:missing": "true"}, {"o_text", "o_ident"}),
    # Encounter.period: enc_1 01-10..01-20, enc_2 from 01-15T09:00 (open end), enc_3 01-15 10:00..11:00
    ("Encounter", {"date": "2024-01-15"}, {"enc_3"}),
    ("Encounter", {"date": "ne2024-01-15"}, {"enc_1", "enc_2"}),
    ("Encounter", {"date": "ge2024-01-16"}, {"enc_1", "enc_2"}),
    ("Encounter", {"date": "gt2024-01-20"}, {"enc_2"}),
    ("Encounter", {"date": "lt2024-01-15"}, {"enc_1"}),
    ("Encounter", {"date": "le2024-01-14"}, {"enc_1"}),
    ("Encounter", {"date": "sa2024-01-14"}, {"enc_2", "enc_3"}),
    ("Encounter", {"date": "eb2024-01-16"}, {"enc_3"}),
    ("Encounter", {"date": "2024-01"}, {"enc_1", "enc_3"}),
]


@pytest.mark.parametrize(("rtype", "params", "expected"), DATE_CASES, ids=[f"{c[0]}-{c[1]}" for c in DATE_CASES])
def test_date(clinic, rtype, params, expected):
    assert clinic.find(rtype, params) == expected


def test_last_updated(frozen_client):
    k = Clinic(frozen_client)
    for name in ("a", "b", "c"):  # the frozen clock still advances 1 ms per write
        k.add(name, {"resourceType": "Patient", "name": [{"family": name}]})
    metas = [frozen_client.read("Patient", k.ids[n]).body["meta"]["lastUpdated"] for n in "abc"]
    assert metas == ["2024-06-01T12:00:00.000Z", "2024-06-01T12:00:00.001Z", "2024-06-01T12:00:00.002Z"]
    assert k.find("Patient", {"_lastUpdated": "2024-06-01T12:00:00Z"}) == {"a", "b", "c"}
    assert k.find("Patient", {"_lastUpdated": "2024-06-01T12:00:00.001Z"}) == {"b"}
    assert k.find("Patient", {"_lastUpdated": "gt2024-06-01T12:00:00.000Z"}) == {"b", "c"}
    assert k.find("Patient", {"_lastUpdated": "lt2024-06-01T12:00:00.002Z"}) == {"a", "b"}
    assert k.find("Patient", {"_lastUpdated": "2024-06"}) == {"a", "b", "c"}
    assert k.find("Patient", {"_lastUpdated": "lt2024-06-01"}) == set()
    assert k.ordered("Patient", {"_sort": "-_lastUpdated"}) == ["c", "b", "a"]


def test_last_updated_is_strictly_increasing_on_a_frozen_clock(frozen_client):
    """Each write gets its own millisecond (float steps of 0.001 used to repeat one, e.g. .006 twice)."""
    k = Clinic(frozen_client)
    names = [f"p{i:02d}" for i in range(20)]
    for name in names:
        k.add(name, {"resourceType": "Patient", "name": [{"family": name}]})
    stamps = [frozen_client.read("Patient", k.ids[n]).body["meta"]["lastUpdated"] for n in names]
    assert stamps == [f"2024-06-01T12:00:00.{i:03d}Z" for i in range(20)]
    assert k.ordered("Patient", {"_sort": "-_lastUpdated"}) == names[::-1]
    assert k.find("Patient", {"_lastUpdated": "2024-06-01T12:00:00.006Z"}) == {"p06"}


# ---------------------------------------------------------------------------------------------------
# number and quantity
# ---------------------------------------------------------------------------------------------------
NUMBER_CASES = [
    ("50", {"ra_50_4", "ra_49_5", "ra_50"}),  # implicit precision: [49.5, 50.5)
    ("50.0", {"ra_50"}),  # [49.95, 50.05)
    ("50.4", {"ra_50_4"}),
    ("50.40", {"ra_50_4"}),
    ("0.004", {"ra_0_004"}),
    ("gt50", {"ra_50_4", "ra_50_6"}),
    ("ge50", {"ra_50_4", "ra_50_6", "ra_50"}),
    ("lt50", {"ra_49_5", "ra_0_004"}),
    ("le50", {"ra_49_5", "ra_0_004", "ra_50"}),
    ("ne50", {"ra_50_6", "ra_0_004"}),
    ("sa50", {"ra_50_4", "ra_50_6"}),
    ("eb50", {"ra_49_5", "ra_0_004"}),
    ("ap50", {"ra_50_4", "ra_50_6", "ra_49_5", "ra_50"}),  # +-10 %
    ("50,0.004", {"ra_50_4", "ra_49_5", "ra_50", "ra_0_004"}),
    ("70", set()),
]


@pytest.mark.parametrize(("value", "expected"), NUMBER_CASES, ids=[c[0] for c in NUMBER_CASES])
def test_number(clinic, value, expected):
    assert clinic.find("RiskAssessment", {"probability": value}) == expected


def test_number_missing(clinic):
    assert clinic.find("RiskAssessment", {"probability:missing": "true"}) == {"ra_none"}


QUANTITY_CASES = [
    ("5.4", {"o_glu_a", "o_glu_nosys"}),
    (f"5.4|{UCUM}|mg", {"o_glu_a"}),
    ("5.4||mg", {"o_glu_a", "o_glu_nosys"}),  # code or unit
    (f"gt5.4|{UCUM}|mg", {"o_glu_b"}),
    ("lt6", {"o_glu_a", "o_glu_nosys"}),
    ("le5.4", {"o_glu_a", "o_glu_nosys"}),
    ("ge6.1", {"o_glu_b", "o_ident"}),
    ("ne5.4", {"o_glu_b", "o_ident"}),
    ("ap6.1", {"o_glu_b"}),
    (f"70|{UCUM}|kg", {"o_ident"}),
    (f"70|{UCUM}|mg", set()),
    ("120", set()),  # blood pressure values live in components, not Observation.value
]


@pytest.mark.parametrize(("value", "expected"), QUANTITY_CASES, ids=[c[0] for c in QUANTITY_CASES])
def test_quantity(clinic, value, expected):
    assert clinic.find("Observation", {"value-quantity": value}) == expected


def test_quantity_missing_and_components(clinic):
    assert clinic.find("Observation", {"value-quantity:missing": "true"}) == {"o_other_sys", "o_bp", "o_bp2", "o_text"}
    assert clinic.find("Observation", {"component-value-quantity": "120"}) == {"o_bp"}
    assert clinic.find("Observation", {"component-value-quantity": "gt90"}) == {"o_bp", "o_bp2"}


# ---------------------------------------------------------------------------------------------------
# uri
# ---------------------------------------------------------------------------------------------------
URI_CASES = [
    ({"url": f"{VS}/a"}, {"vs_a"}),
    ({"url": f"{VS}/A"}, set()),
    ({"url": f"{VS}/a/"}, set()),
    ({"url:below": f"{VS}/a"}, {"vs_a", "vs_a_b"}),  # not vs_ab: below works on path segments
    ({"url:below": VS}, {"vs_a", "vs_a_b", "vs_ab"}),
    ({"url:above": f"{VS}/a/b/c"}, {"vs_a", "vs_a_b"}),
    ({"url:above": f"{VS}/ab"}, {"vs_ab"}),
]


@pytest.mark.parametrize(("params", "expected"), URI_CASES, ids=[str(c[0]) for c in URI_CASES])
def test_uri(clinic, params, expected):
    assert clinic.find("ValueSet", params) == expected


# ---------------------------------------------------------------------------------------------------
# composite
# ---------------------------------------------------------------------------------------------------
COMPOSITE_CASES = [
    ("code-value-quantity", f"{LOINC}|2345-7$gt6", {"o_glu_b"}),
    ("code-value-quantity", "2345-7$5.4", {"o_glu_a", "o_glu_nosys"}),
    ("code-value-quantity", f"2345-7$5.4|{UCUM}|mg", {"o_glu_a"}),
    ("code-value-quantity", f"{LOINC}|85354-9$120", set()),
    # o_bp: systolic 120 / diastolic 80; o_bp2: 140 / 95. Components must not mix.
    ("component-code-value-quantity", f"{LOINC}|8480-6$120", {"o_bp"}),
    ("component-code-value-quantity", f"{LOINC}|8480-6$80", set()),
    ("component-code-value-quantity", f"{LOINC}|8462-4$80", {"o_bp"}),
    ("component-code-value-quantity", f"8480-6$120|{UCUM}|mm[Hg]", {"o_bp"}),
    ("component-code-value-quantity", "8480-6$gt130", {"o_bp2"}),
    ("component-code-value-quantity", "8462-4$gt100", set()),
    ("component-code-value-quantity", "8480-6$lt100", set()),
    ("component-code-value-quantity", "8480-6$120,8462-4$95", {"o_bp", "o_bp2"}),
    ("combo-code-value-quantity", "8462-4$95", {"o_bp2"}),
    ("combo-code-value-quantity", "2345-7$6.1", {"o_glu_b"}),
]


@pytest.mark.parametrize(("param", "value", "expected"), COMPOSITE_CASES,
                         ids=[f"{c[0]}={c[1]}" for c in COMPOSITE_CASES])
def test_composite(clinic, param, value, expected):
    assert clinic.find("Observation", {param: value}) == expected


def test_composite_needs_every_component(clinic):
    _error(clinic.client.search("Observation", {"component-code-value-quantity": "8480-6"}), 400,
           "component-code-value-quantity", "$")


# ---------------------------------------------------------------------------------------------------
# special parameters: _id, _tag, _profile
# ---------------------------------------------------------------------------------------------------
def test_id_tag_profile(clinic):
    a, b = clinic.ids["p_muller"], clinic.ids["p_smith"]
    assert clinic.find("Patient", {"_id": a}) == {"p_muller"}
    assert clinic.find("Patient", {"_id": f"{a},{b}"}) == {"p_muller", "p_smith"}
    assert clinic.find("Patient", {"_id": "no-such-id"}) == set()
    assert clinic.find("Observation", {"_id": a}) == set()  # ids are per type
    assert clinic.find("Patient", {"_tag": f"{TAGS}|vip"}) == {"p_muller"}
    assert clinic.find("Patient", {"_tag": "vip"}) == {"p_muller"}
    assert clinic.find("Patient", {"_tag": "http://other.org|vip"}) == set()
    assert clinic.find("Patient", {"_tag:not": "vip"}) == PATIENTS - {"p_muller"}
    assert clinic.find("Patient", {"_profile": PROFILE}) == {"p_muller"}
    assert clinic.find("Patient", {"_profile": PROFILE + "-x"}) == set()


# ---------------------------------------------------------------------------------------------------
# chains and reverse chains
# ---------------------------------------------------------------------------------------------------
CHAIN_CASES = [
    ("Observation", {"subject:Patient.name": "müller"}, MULLER_OBS),
    ("Observation", {"subject.name": "muller"}, MULLER_OBS),
    ("Observation", {"subject.family": "mullins"}, {"o_glu_nosys"}),
    ("Observation", {"performer.family": "house"}, {"o_glu_a"}),
    ("Observation", {"performer:Practitioner.given": "james"}, {"o_bp"}),
    ("Observation", {"performer:Patient.given": "james"}, set()),
    ("Observation", {"subject.gender": "female"}, {"o_glu_nosys", "o_other_sys", "o_bp2"}),
    ("Observation", {"patient.organization.name": "acme"}, MULLER_OBS),
    ("Observation", {"patient.organization.name": "beta"}, {"o_glu_nosys"}),
    ("Observation", {"patient.organization.name": "nowhere"}, set()),
    # three levels, with and without type modifiers
    ("Observation", {"patient.organization.partof.name": "northwind"}, MULLER_OBS),
    ("Observation", {"subject:Patient.organization:Organization.partof:Organization.name": "northwind"}, MULLER_OBS),
    ("Observation", {"patient.organization.partof.name": "acme"}, set()),
    ("Encounter", {"service-provider.partof.name": "northwind"}, {"enc_1"}),
    ("Encounter", {"part-of.part-of.status": "finished"}, {"enc_3"}),
    ("MedicationRequest", {"medication.code": f"{RXNORM}|1191"}, {"mr_1"}),
    ("DiagnosticReport", {"result.code": f"{LOINC}|2345-7"}, {"dr_1"}),
    # _has, nested _has
    ("Patient", {"_has:Observation:subject:code": "85354-9"}, {"p_muller", "p_smith"}),
    ("Patient", {"_has:Observation:patient:code": f"{LOINC}|2345-7"}, {"p_muller"}),
    ("Patient", {"_has:Observation:subject:code": "2345-7"}, {"p_muller", "p_mullins", "p_smith"}),
    ("Patient", {"_has:Observation:subject:value-quantity": "gt100"}, set()),
    ("Patient", {"_has:Observation:subject:_has:DiagnosticReport:result:code": "24323-8"}, {"p_muller"}),
    ("Patient", {"_has:Observation:subject:performer.family": "wilson"}, {"p_muller"}),
    ("Practitioner", {"_has:MedicationRequest:requester:status": "active"}, {"pr_house"}),
    ("Organization", {"_has:Patient:organization:_has:Observation:subject:code": "85354-9"}, {"org_acme"}),
    ("Organization", {"_has:Organization:partof:_has:Patient:organization:_has:Observation:subject:code": "85354-9"},
     {"org_parent"}),
    ("Patient", [("_has:Observation:subject:code", "85354-9"), ("_has:Observation:subject:code", "2345-7")],
     {"p_muller", "p_smith"}),
    ("Patient", [("_has:Observation:subject:code", "85354-9"), ("gender", "male")], {"p_muller"}),
]


@pytest.mark.parametrize(("rtype", "params", "expected"), CHAIN_CASES, ids=[f"{c[0]}-{c[1]}" for c in CHAIN_CASES])
def test_chain_and_has(clinic, rtype, params, expected):
    assert clinic.find(rtype, params) == expected


def test_chain_and_has_errors(clinic):
    c = clinic.client
    _error(c.search("Observation", {"code.name": "x"}), 400, "non-reference", "code")
    _error(c.search("Observation", {"subject:Patient.nope": "x"}), 400, "nope")
    _error(c.search("Observation", {"subject.nope": "x"}), 400, "nope")
    # a chain over several target types reports the real problem, not "exists on none of ..."
    _error(c.search("Observation", {"subject.birthdate": "2024-13"}), 400, "'2024-13' is not a valid date")
    _error(c.search("Observation", {"subject.name:bogus": "x"}), 400, "Modifier ':bogus'")
    _error(c.search("Patient", {"_has:Observation:subject": "x"}), 400, "_has")
    _error(c.search("Patient", {"_has:Nope:subject:code": "x"}), 400, "Nope")
    _error(c.search("Patient", {"_has:Observation:code:code": "x"}), 400, "not a reference")


# ---------------------------------------------------------------------------------------------------
# _include / _revinclude
# ---------------------------------------------------------------------------------------------------
INCLUDE_CASES = [
    ("MedicationRequest", {"_id": "mr_1", "_include": "MedicationRequest:medication"}, {"mr_1"}, {"med_asp"}),
    ("MedicationRequest", {"_id": "mr_1", "_include": "MedicationRequest:medication:Medication"}, {"mr_1"}, {"med_asp"}),
    ("MedicationRequest", {"_include": "MedicationRequest:subject:Group"}, {"mr_1", "mr_2"}, set()),
    ("MedicationRequest", {"_include": "MedicationRequest:subject"}, {"mr_1", "mr_2"}, {"p_muller", "p_smith"}),
    ("MedicationRequest", {"_id": "mr_1", "_include": "*"}, {"mr_1"}, {"med_asp", "p_muller", "pr_house"}),
    ("MedicationRequest", {"_id": "mr_1", "_include": "MedicationRequest:*"}, {"mr_1"},
     {"med_asp", "p_muller", "pr_house"}),
    ("Medication", {"_revinclude": "MedicationRequest:medication"}, {"med_asp"}, {"mr_1"}),
    ("Medication", [("_revinclude", "MedicationRequest:medication"), ("_include", "MedicationRequest:requester")],
     {"med_asp"}, {"mr_1"}),
    ("Medication", [("_revinclude", "MedicationRequest:medication"),
                    ("_include:iterate", "MedicationRequest:requester")], {"med_asp"}, {"mr_1", "pr_house"}),
    ("Encounter", {"_id": "enc_3", "_include": "Encounter:part-of"}, {"enc_3"}, {"enc_2"}),
    ("Encounter", {"_id": "enc_3", "_include:iterate": "Encounter:part-of"}, {"enc_3"}, {"enc_2", "enc_1"}),
    ("Encounter", {"_id": "enc_1", "_revinclude": "Encounter:part-of"}, {"enc_1"}, {"enc_2"}),
    ("Encounter", {"_id": "enc_1", "_revinclude:iterate": "Encounter:part-of"}, {"enc_1"}, {"enc_2", "enc_3"}),
    ("Patient", [("_id", "p_muller"), ("_revinclude", "Observation:subject"), ("_revinclude", "DiagnosticReport:subject")],
     {"p_muller"}, MULLER_OBS | {"dr_1"}),
    ("Patient", {"_id": "p_smith", "_revinclude": "RiskAssessment:*"}, {"p_smith"},
     {"ra_50_4", "ra_50_6", "ra_49_5", "ra_50", "ra_0_004", "ra_none"}),
    ("Observation", {"_id": "o_glu_a", "_include": "Observation:subject", "_revinclude": "DiagnosticReport:result"},
     {"o_glu_a"}, {"p_muller", "dr_1"}),
]


@pytest.mark.parametrize(("rtype", "params", "matches", "included"), INCLUDE_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in INCLUDE_CASES])
def test_include_revinclude(clinic, rtype, params, matches, included):
    pairs = params.items() if isinstance(params, dict) else params
    query = [(k, clinic.ids[v] if k == "_id" else v) for k, v in pairs]
    bundle = clinic.search(rtype, query)
    assert set(clinic.named(bundle)) == matches
    found = clinic.named(bundle, "include")
    assert len(found) == len(set(found))
    assert set(found) == included
    assert bundle["total"] == len(matches)  # included resources are not counted
    for e in bundle["entry"]:
        assert e["fullUrl"] == f"{BASE}/{e['resource']['resourceType']}/{e['resource']['id']}"


def test_include_errors(clinic):
    c = clinic.client
    _error(c.search("Patient", {"_revinclude": "*"}), 400, "_revinclude=*")
    _error(c.search("Observation", {"_include": "Observation:code"}), 400, "not a reference")
    _error(c.search("Observation", {"_include": "Nope:subject"}), 400, "Nope")
    _error(c.search("Observation", {"_include:bogus": "Observation:subject"}), 400, ":bogus")
    _error(c.search("Observation", {"_include": "Observation:subject:iterate"}), 400, "_include:iterate")


def test_include_only_for_the_page(clinic):
    bundle = clinic.search("Observation", {"_sort": "date", "_count": "1", "_include": "Observation:subject"})
    assert clinic.named(bundle) == ["o_bp"]
    assert clinic.named(bundle, "include") == ["p_muller"]
    assert bundle["total"] == len(OBSERVATIONS)


# ---------------------------------------------------------------------------------------------------
# _sort
# ---------------------------------------------------------------------------------------------------
SORT_CASES = [
    ("Patient", "gender,-birthdate", ["p_smith", "p_mullins", "p_smith_jr", "p_muller", "p_jr"]),
    ("Patient", "-gender,birthdate", ["p_muller", "p_smith_jr", "p_mullins", "p_smith", "p_jr"]),
    ("Patient", "birthdate", ["p_mullins", "p_muller", "p_smith", "p_smith_jr", "p_jr"]),  # missing values last
    ("Patient", "family", ["p_jr", "p_muller", "p_mullins", "p_smith", "p_smith_jr"]),
    ("Patient", "-family", ["p_smith_jr", "p_smith", "p_mullins", "p_muller", "p_jr"]),
    ("Patient", "-_lastUpdated", ["p_jr", "p_smith", "p_smith_jr", "p_mullins", "p_muller"]),
    ("Encounter", "date", ["enc_1", "enc_2", "enc_3"]),
    ("Encounter", "-date", ["enc_2", "enc_1", "enc_3"]),  # enc_2's period is open-ended
    ("RiskAssessment", "-probability", ["ra_50_6", "ra_50_4", "ra_50", "ra_49_5", "ra_0_004", "ra_none"]),
    ("RiskAssessment", "probability", ["ra_0_004", "ra_49_5", "ra_50", "ra_50_4", "ra_50_6", "ra_none"]),
]


@pytest.mark.parametrize(("rtype", "sort", "expected"), SORT_CASES, ids=[f"{c[0]}-{c[1]}" for c in SORT_CASES])
def test_sort(clinic, rtype, sort, expected):
    assert clinic.ordered(rtype, {"_sort": sort}) == expected


def test_sort_by_id_and_latest_first(clinic):
    assert clinic.ordered("Patient", {"_sort": "_id"}) == sorted(PATIENTS, key=lambda n: clinic.ids[n])
    assert clinic.ordered("Observation", {"code": "2345-7", "_sort": "-date", "_count": "1"}) == ["o_other_sys"]
    assert clinic.ordered("Observation", {"code": f"{LOINC}|2345-7", "_sort": "-date", "_count": "1"}) == ["o_glu_a"]
    _error(clinic.client.search("Patient", {"_sort": "nope"}), 400, "nope")
    _error(clinic.client.search("Observation", {"_sort": "code-value-quantity"}), 400, "composite")


# ---------------------------------------------------------------------------------------------------
# paging
# ---------------------------------------------------------------------------------------------------
def _link(bundle: dict, relation: str) -> str | None:
    return next((x["url"] for x in bundle.get("link", []) if x["relation"] == relation), None)


def test_paging_is_stable_across_writes(client):
    k = Clinic(client)
    families = ["Baker", "Carter", "Davis", "Evans", "Foster", "Garcia", "Harris"]
    for f in families:
        k.add(f, {"resourceType": "Patient", "name": [{"family": f}]})
    page1 = k.search("Patient", {"_sort": "family", "_count": "3"})
    assert k.named(page1) == families[:3]
    assert page1["total"] == 7
    assert _link(page1, "previous") is None
    assert _link(page1, "self").startswith(f"{BASE}/Patient?")
    next1 = _link(page1, "next")
    assert next1 is not None

    # writes between page fetches: a patient sorting first, and one matching page 1
    k.add("Aaron", {"resourceType": "Patient", "name": [{"family": "Aaron"}]})
    assert client.delete("Patient", k.ids["Baker"]).status == 200

    page2 = client.follow(next1)
    assert page2.status == 200, page2.body
    assert k.named(page2.body) == families[3:6]  # continues the original list
    assert page2.body["total"] == 7
    page3 = client.follow(_link(page2.body, "next"))
    assert k.named(page3.body) == families[6:]
    assert _link(page3.body, "next") is None
    back = client.follow(_link(page3.body, "previous"))
    assert k.named(back.body) == families[3:6]

    fresh = k.search("Patient", {"_sort": "family", "_count": "3"})  # a new search sees the writes
    assert k.named(fresh) == ["Aaron", "Carter", "Davis"]
    assert fresh["total"] == 7


def test_paging_page_size_and_count_zero(client):
    k = Clinic(client)
    for i in range(5):
        k.add(f"p{i}", {"resourceType": "Patient", "name": [{"family": f"F{i}"}]})
    bundle = k.search("Patient", {"_count": "0"})
    assert bundle["total"] == 5 and "entry" not in bundle
    bundle = k.search("Patient", {"_sort": "family", "_count": "2"})
    seen = k.named(bundle)
    while (nxt := _link(bundle, "next")) is not None:
        resp = client.follow(nxt)
        assert resp.status == 200
        bundle = resp.body
        seen += k.named(bundle)
    assert seen == [f"p{i}" for i in range(5)]
    _error(client.search("Patient", {"_count": "-1"}), 400, "_count")
    _error(client.search("Patient", {"_count": "ten"}), 400, "_count")


def test_bad_paging_token(client):
    client.create({"resourceType": "Patient"})
    client.create({"resourceType": "Patient"})
    bundle = client.search("Patient", {"_count": "1"}).body
    nxt = _link(bundle, "next")
    parts = urlsplit(nxt)
    q = dict(parse_qsl(parts.query))
    resp = client.request("GET", "", {**q, "_getpages": "not-a-token"})
    assert 400 <= resp.status < 500
    _error(resp, resp.status, "not-a-token")
    _error(client.request("GET", "", {**q, "_getpagesoffset": "x"}), 400, "_getpagesoffset")
    _error(client.request("GET", "", {**q, "_getpagesoffset": "-3"}), 400, "negative")


# ---------------------------------------------------------------------------------------------------
# _summary, _elements, _total
# ---------------------------------------------------------------------------------------------------
def test_summary_count_and_total_none(clinic):
    bundle = clinic.search("Patient", {"gender": "male", "_summary": "count"})
    assert bundle["total"] == 2 and "entry" not in bundle
    bundle = clinic.search("Patient", {"gender": "male", "_total": "none"})
    assert "total" not in bundle
    assert set(clinic.named(bundle)) == {"p_muller", "p_smith_jr"}
    _error(clinic.client.search("Patient", {"_summary": "all"}), 400, "_summary")
    _error(clinic.client.search("Patient", {"_total": "some"}), 400, "_total")


def test_summary_true_and_elements(client):
    k = Clinic(client)
    k.add("p", {"resourceType": "Patient", "name": [{"family": "Kent"}], "gender": "male", "birthDate": "1980-01-01",
                "maritalStatus": {"text": "married"}, "communication": [{"language": {"text": "English"}}]})
    res = k.search("Patient", {"_summary": "true"})["entry"][0]["resource"]
    assert set(res) == {"resourceType", "id", "meta", "name", "gender", "birthDate"}
    assert SUBSETTED in res["meta"]["tag"]
    res = k.search("Patient", {"_elements": "birthDate,maritalStatus"})["entry"][0]["resource"]
    assert set(res) == {"resourceType", "id", "meta", "birthDate", "maritalStatus"}
    assert SUBSETTED in res["meta"]["tag"]
    res = k.search("Patient", {})["entry"][0]["resource"]
    assert "tag" not in res["meta"] and res["communication"] == [{"language": {"text": "English"}}]
    # the stored resource is untouched
    assert "tag" not in client.read("Patient", k.ids["p"]).body["meta"]


def test_elements_on_choice_types(clinic):
    bundle = clinic.search("Observation", {"_id": clinic.ids["o_glu_a"], "_elements": "value"})
    res = bundle["entry"][0]["resource"]
    # Observation.status and .code are mandatory (1..1), so they are kept as the specification asks
    assert set(res) == {"resourceType", "id", "meta", "valueQuantity", "status", "code"}


# ---------------------------------------------------------------------------------------------------
# GET vs POST, unknown parameters, lenient handling, invalid values
# ---------------------------------------------------------------------------------------------------
def test_get_and_post_search_agree(clinic):
    params = [("code", "2345-7"), ("_sort", "-date"), ("_include", "Observation:subject"), ("_count", "2")]
    get = clinic.search("Observation", params)
    body = "&".join(f"{k}={v}" for k, v in params).encode()
    post = clinic.client.request("POST", "Observation/_search", body=body,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert post.status == 200, post.body
    assert clinic.named(get) == clinic.named(post.body) == ["o_other_sys", "o_glu_a"]
    assert clinic.named(get, "include") == clinic.named(post.body, "include")
    assert get["total"] == post.body["total"] == 4
    assert get["entry"] == post.body["entry"]
    # URL and form parameters combine
    mixed = clinic.client.request("POST", "Observation/_search?code=2345-7", body=b"subject.family=mullins",
                                  headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert set(clinic.named(mixed.body)) == {"o_glu_nosys"}


def test_unknown_parameter_strict_and_lenient(clinic):
    c = clinic.client
    _error(c.search("Patient", {"family": "mul", "shoe-size": "42"}), 400, "shoe-size")
    _error(c.request("GET", "Patient", {"shoe-size": "42"}, headers={"Prefer": "handling=strict"}), 400, "shoe-size")
    resp = c.search("Patient", {"family": "mul", "shoe-size": "42"}, lenient=True)
    assert resp.status == 200, resp.body
    assert set(clinic.named(resp.body)) == {"p_muller", "p_mullins"}
    assert resp.body["total"] == 2
    outcomes = [e for e in resp.body["entry"] if e["search"]["mode"] == "outcome"]
    assert len(outcomes) == 1
    oo = outcomes[0]["resource"]
    assert oo["resourceType"] == "OperationOutcome"
    assert [i["severity"] for i in oo["issue"]] == ["warning"]
    assert "shoe-size" in oo["issue"][0]["diagnostics"]
    # an unsupported modifier is ignored the same way; an invalid value is still an error
    resp = c.search("Patient", {"family:sounds-like": "mul"}, lenient=True)
    assert resp.status == 200 and resp.body["total"] == len(PATIENTS)
    assert ":sounds-like" in resp.body["entry"][-1]["resource"]["issue"][0]["diagnostics"]
    _error(c.search("Patient", {"birthdate": "2024-13"}, lenient=True), 400, "2024-13")
    # a count is only trustworthy with the warning too
    resp = c.search("Patient", {"gender": "male", "shoe-size": "42", "_summary": "count"}, lenient=True)
    assert resp.status == 200 and resp.body["total"] == 2
    assert [e["search"]["mode"] for e in resp.body["entry"]] == ["outcome"]
    assert "shoe-size" in resp.body["entry"][0]["resource"]["issue"][0]["diagnostics"]


INVALID_CASES = [
    ("Patient", {"birthdate": "2024-13"}, "2024-13"),
    ("Patient", {"birthdate": "2024-02-30"}, "2024-02-30"),
    ("Patient", {"birthdate": "1970-5"}, "1970-5"),
    ("Patient", {"birthdate": "GT1970"}, "GT1970"),  # prefixes are lower case
    ("Patient", {"birthdate": "gte1970"}, "gte1970"),
    ("Patient", {"birthdate": "gt"}, "'gt'"),
    ("Patient", {"birthdate": "2024-01-01T25:00Z"}, "25:00"),
    ("Patient", {"birthdate": "2024-01-01T10:00:00+25:00"}, "+25:00"),
    ("Patient", {"birthdate": ""}, "birthdate"),
    ("RiskAssessment", {"probability": "high"}, "not a number"),
    ("RiskAssessment", {"probability": "gte5"}, "gte5"),
    ("Observation", {"value-quantity": "abc|http://unitsofmeasure.org|mg"}, "number"),
    ("Observation", {"value-quantity": "5|mg"}, "5|mg"),
    ("Patient", {"gender": "|"}, "'|'"),
    ("Patient", {"name:below": "x"}, ":below"),
    ("Patient", {"birthdate:exact": "1970"}, ":exact"),
    ("Observation", {"code:above": "1"}, ":above"),
    ("Observation", {"code:in": "http://example.org/ValueSet/unknown"}, "unknown"),
    ("Patient", {"_text": "x"}, "_text"),
    ("Patient", {"_offset": "1"}, "_offset"),
]


@pytest.mark.parametrize(("rtype", "params", "fragment"), INVALID_CASES, ids=[f"{c[0]}-{c[1]}" for c in INVALID_CASES])
def test_invalid_values_are_400(clinic, rtype, params, fragment):
    _error(clinic.client.search(rtype, params), 400, fragment)


def test_deep_chains_are_answered_not_crashed(clinic):
    """Chains and _has nest into SQL subqueries; four levels used to overflow SQLite's parser (a 500)."""
    c = clinic.client
    resp = c.search("Observation", {"patient.organization.partof.partof.name": "x"})
    assert resp.status == 200 and resp.body["total"] == 0
    deep = "_has:Observation:subject:_has:DiagnosticReport:result:_has:Provenance:target:_has:AuditEvent:entity:agent"
    resp = c.search("Patient", {deep: "x"})
    assert resp.status == 200 and resp.body["total"] == 0
    _error(c.search("Observation", {"patient.organization.partof.partof.partof.partof.name": "x"}), 400, "too deep")


def test_pristine_world_searches_skip_the_resource_table_and_keep_the_order(tmp_path):
    """On a base loaded at one instant with an empty layer, ids come from the index alone, ordered by id:
    the same list, in the same order, as the general plan's (lastUpdated, id)."""
    obs = [{"resourceType": "Observation", "id": f"o{n:02d}", "status": "final" if n % 3 else "amended",
            "code": {"coding": [_coding("http://loinc.org", f"c{n % 4}")]},
            "subject": {"reference": f"Patient/p{n % 5}" if n != 7 else "Patient/ghost"}} for n in range(40)]
    patients = [{"resourceType": "Patient", "id": f"p{n}", "name": [{"family": f"Fam{n % 2}"}]} for n in range(5)]
    builder = Store()
    assert len(FhirServer(builder).load([*reversed(obs), *patients])) == 1  # Patient/ghost dangles
    builder.export(tmp_path / "w.db")
    store = Snapshot(tmp_path / "w.db").open()
    assert store.uniform_base and store.sides() == ("base",)
    engine = FhirServer(store).search_engine
    queries = [("Observation", [("code", "http://loinc.org|c1")]), ("Observation", [("subject", "Patient/p2")]),
               ("Observation", [("status:not", "final"), ("code", "c2,c3")]), ("Observation", [("subject.family", "fam1")]),
               ("Patient", [("_has:Observation:subject:status", "final")]), ("Patient", [("family", "fam0")]),
               ("Observation", [("status:missing", "false")]), ("Observation", []), ("Patient", []),
               ("Observation", [("_lastUpdated", "ge2000-01-01")])]
    for rtype, q in queries:
        fast = engine.ids(store, engine.parse(rtype, q, sides=store.sides()))
        general = engine.ids(store, engine.parse(rtype, q, sides=("main", "base")))
        assert fast == general and fast == sorted(fast) and len(fast) > 0, (rtype, q)
    assert "ghost" not in engine.ids(store, engine.parse("Patient", [("_has:Observation:subject:status", "final")],
                                                          sides=store.sides()))


# ---------------------------------------------------------------------------------------------------
# layered stores: a fork of a base sees base data and its own writes, never stale base index rows
# ---------------------------------------------------------------------------------------------------
def test_search_on_forked_store(tmp_path):
    base_client = new_client()
    k = Clinic(base_client)
    k.add("org", {"resourceType": "Organization", "name": "Acme"})
    k.add("a", {"resourceType": "Patient", "name": [{"family": "Oldname"}], "managingOrganization": k.ref("org")})
    k.add("b", {"resourceType": "Patient", "name": [{"family": "Gone"}]})
    k.add("d", {"resourceType": "Patient", "name": [{"family": "Keep"}]})
    k.add("o", {"resourceType": "Observation", "status": "final", "code": {"text": "x"}, "subject": k.ref("a")})
    path = tmp_path / "base.sqlite"
    base_client.server.store.export(path)

    fork = Snapshot(path).open()
    c = InProcessClient(FhirServer(fork))
    k.client = c
    assert k.find("Patient", {}) == {"a", "b", "d"}
    assert k.find("Patient", {"family": "oldname"}) == {"a"}

    a = c.read("Patient", k.ids["a"]).body
    a["name"] = [{"family": "Newname"}]
    assert c.update(a).status == 200
    assert c.delete("Patient", k.ids["b"]).status == 200
    k.add("e", {"resourceType": "Patient", "name": [{"family": "Fresh"}]})

    assert k.find("Patient", {"family": "oldname"}) == set()  # the base's index row is stale
    assert k.find("Patient", {"family": "newname"}) == {"a"}
    assert k.find("Patient", {"family": "gone"}) == set()
    assert k.find("Patient", {"_id": k.ids["b"]}) == set()
    assert k.find("Patient", {"family": "keep"}) == {"d"}
    assert k.find("Patient", {"family": "fresh"}) == {"e"}
    assert k.find("Patient", {}) == {"a", "d", "e"}
    assert k.find("Patient", {"name:missing": "false"}) == {"a", "d", "e"}
    assert k.ordered("Patient", {"_sort": "family"}) == ["e", "d", "a"]
    assert k.find("Observation", {"subject.name": "oldname"}) == set()
    assert k.find("Observation", {"subject.name": "newname"}) == {"o"}
    assert k.find("Patient", {"organization.name": "acme"}) == {"a"}  # base-only chain target

    org = c.read("Organization", k.ids["org"]).body
    org["name"] = "Zeta"
    assert c.update(org).status == 200
    assert k.find("Patient", {"organization.name": "acme"}) == set()
    assert k.find("Observation", {"patient.organization.name": "zeta"}) == {"o"}
    assert k.find("Patient", {"_has:Observation:subject:code:text": "x"}) == {"a"}
    assert c.delete("Observation", k.ids["o"]).status == 200
    assert k.find("Patient", {"_has:Observation:subject:code:text": "x"}) == set()
    bundle = k.search("Patient", {"_id": k.ids["a"], "_revinclude": "Observation:subject"})
    assert k.named(bundle, "include") == []

    # the base itself, and a second fork of it, are unaffected
    other = InProcessClient(FhirServer(Snapshot(path).open()))
    k.client = other
    assert k.find("Patient", {"family": "oldname"}) == {"a"}
    assert k.find("Patient", {}) == {"a", "b", "d"}
    # a snapshot of the fork (base + layer) reopens with the fork's view; reset returns to the base
    k.client = InProcessClient(FhirServer(fork.snapshot().open()))
    assert k.find("Patient", {"family": "newname"}) == {"a"}
    assert k.find("Patient", {"family": "oldname"}) == set()
    fork.reset()
    k.client = c
    assert k.find("Patient", {"family": "oldname"}) == {"a"}
    assert k.find("Patient", {}) == {"a", "b", "d"}


def test_store_without_base_behaves_like_a_fork():
    store = Store()
    c = InProcessClient(FhirServer(store))
    k = Clinic(c)
    k.add("a", {"resourceType": "Patient", "name": [{"family": "One"}]})
    snap = store.snapshot()
    body = c.read("Patient", k.ids["a"]).body
    body["name"] = [{"family": "Two"}]
    c.update(body)
    assert k.find("Patient", {"family": "one"}) == set()
    assert k.find("Patient", {"family": "two"}) == {"a"}
    store.reset(snap)
    assert k.find("Patient", {"family": "one"}) == {"a"}
    assert k.find("Patient", {"family": "two"}) == set()
