"""A corpus of REST requests whose recorded responses pin the server's behaviour byte for byte.

Refactoring the server must not change what a client sees; this replays several hundred requests
(every interaction, operation, error path, bundle and paging link) against servers with a seeded id
generator and a frozen clock, so ids, versions and timestamps are reproducible. Only paging tokens
are normalised (numbered in order of appearance: the corpus was recorded with opaque tokens; ours now
carry their request). ``python tests/_replay.py`` records the corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import sys
from collections.abc import Callable, Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import orjson

from fhirgym.fhir import FhirServer, Request, Response, ServerConfig, Store

CORPUS = Path(__file__).parent / "data" / "replay_corpus.jsonl.gz"
NOW = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)
BASE = "http://localhost:8080/fhir"
MRN = "http://example.org/mrn"
LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"
#: bodies larger than this are stored as their sha256 (the CapabilityStatement, big pages)
INLINE = 20_000
#: paging tokens: ours, base64url of a JSON array (``[`` is "Wy") that carries the request (docs/SERVER.md),
#: and the 24 hex digits of the opaque tokens the corpus was recorded with (one request sends such a token)
_TOKEN_RE = re.compile(r"_getpages=(Wy[A-Za-z0-9_-]+|[0-9a-f]{24})")
_PAGE_ID_RE = re.compile(r'("type":"searchset","id":")[0-9a-f]{16}"')

Step = tuple[str, Request]


def make_servers() -> dict[str, FhirServer]:
    """A strict server, and a loose one (no validation or integrity, lenient search, small limits)."""
    clock = lambda: NOW  # noqa: E731
    return {
        "strict": FhirServer(Store(), config=ServerConfig(base_url=BASE, id_seed=7, clock=clock)),
        "loose": FhirServer(Store(), config=ServerConfig(
            base_url=BASE, id_seed=8, clock=clock, validate=False, referential_integrity=False,
            lenient_search=True, default_count=3, max_count=5, max_includes=2, max_body_bytes=2000)),
    }


# -- the data ----------------------------------------------------------------------------------------
def _patient(n: int) -> dict:
    return {
        "resourceType": "Patient", "id": f"p{n}", "active": n % 3 != 0,
        "identifier": [{"system": MRN, "value": f"MRN{n:03d}"}],
        "name": [{"use": "official", "family": ["Diaz", "Smith", "Okafor", "Nguyen"][n % 4],
                  "given": [["Ana", "Ben", "Chidi", "Dana", "Émile"][n % 5], "Lee"]}],
        "telecom": [{"system": "phone", "value": f"555-01{n:02d}", "use": "home"}],
        "gender": ["female", "male", "other", "unknown"][n % 4],
        "birthDate": f"{1940 + 5 * n}-0{1 + n % 9}-1{n % 10}",
        "address": [{"line": [f"{n} Main St"], "city": ["Boston", "Salem", "Lowell"][n % 3], "state": "MA",
                     "postalCode": f"0210{n % 10}"}],
        "managingOrganization": {"reference": f"Organization/o{n % 2}"},
        "generalPractitioner": [{"reference": f"Practitioner/d{n % 3}"}],
    }


def _observation(n: int, pid: int) -> dict:
    kind = n % 3
    obs: dict = {
        "resourceType": "Observation", "id": f"obs{n}", "status": ["final", "amended", "preliminary"][kind],
        "category": [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/observation-category",
                                  "code": "vital-signs"}]}],
        "subject": {"reference": f"Patient/p{pid}"},
        "effectiveDateTime": f"2024-0{1 + n % 5}-{10 + n % 18}T0{n % 10}:30:00Z",
        "performer": [{"reference": f"Practitioner/d{n % 3}"}],
    }
    if kind == 0:
        obs["code"] = {"coding": [{"system": LOINC, "code": "8867-4", "display": "Heart rate"}], "text": "HR"}
        obs["valueQuantity"] = {"value": 55 + 7 * n % 60, "unit": "beats/minute",
                                "system": "http://unitsofmeasure.org", "code": "/min"}
    elif kind == 1:
        obs["code"] = {"coding": [{"system": LOINC, "code": "85354-9", "display": "Blood pressure"}]}
        obs["component"] = [
            {"code": {"coding": [{"system": LOINC, "code": "8480-6"}]},
             "valueQuantity": {"value": 100 + 9 * n % 70, "unit": "mmHg", "system": "http://unitsofmeasure.org",
                               "code": "mm[Hg]"}},
            {"code": {"coding": [{"system": LOINC, "code": "8462-4"}]},
             "valueQuantity": {"value": 60 + 5 * n % 40, "unit": "mmHg", "system": "http://unitsofmeasure.org",
                               "code": "mm[Hg]"}},
        ]
    else:
        obs["code"] = {"coding": [{"system": LOINC, "code": "29463-7", "display": "Body weight"}]}
        obs["valueQuantity"] = {"value": 50.5 + n, "unit": "kg", "system": "http://unitsofmeasure.org",
                                "code": "kg"}
    return obs


def world() -> list[dict]:
    """The bulk-loaded data of the strict server."""
    out: list[dict] = [
        {"resourceType": "Organization", "id": f"o{n}", "name": f"Clinic {n}", "active": True,
         "identifier": [{"system": "http://example.org/org", "value": f"ORG{n}"}]} for n in range(2)
    ]
    out += [
        {"resourceType": "Practitioner", "id": f"d{n}", "name": [{"family": ["House", "Grey", "Who"][n],
                                                                  "prefix": ["Dr."]}],
         "qualification": [{"code": {"text": "MD"}}]} for n in range(3)
    ]
    out += [_patient(n) for n in range(12)]
    out += [_observation(n, n % 12) for n in range(30)]
    out += [
        {"resourceType": "Condition", "id": f"c{n}", "subject": {"reference": f"Patient/p{n % 6}"},
         "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                                        "code": ["active", "resolved"][n % 2]}]},
         "code": {"coding": [{"system": SNOMED, "code": ["44054006", "38341003", "195967001"][n % 3],
                              "display": ["Diabetes", "Hypertension", "Asthma"][n % 3]}]},
         "onsetDateTime": f"20{10 + n}-03-04"} for n in range(8)
    ]
    out += [
        {"resourceType": "Encounter", "id": f"e{n}", "status": "finished",
         "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
         "subject": {"reference": f"Patient/p{n % 4}"},
         "participant": [{"individual": {"reference": f"Practitioner/d{n % 3}"}}],
         "period": {"start": f"2023-1{n % 3}-01T09:00:00Z", "end": f"2023-1{n % 3}-01T09:30:00Z"},
         "serviceProvider": {"reference": f"Organization/o{n % 2}"}} for n in range(6)
    ]
    out += [
        {"resourceType": "MedicationRequest", "id": f"m{n}", "status": ["active", "stopped"][n % 2],
         "intent": "order", "subject": {"reference": f"Patient/p{n % 5}"},
         "medicationCodeableConcept": {"coding": [{"system": "http://www.nlm.nih.gov/research/umls/rxnorm",
                                                   "code": ["860975", "197361"][n % 2]}],
                                       "text": ["metformin", "amlodipine"][n % 2]},
         "authoredOn": f"2024-02-0{1 + n}", "requester": {"reference": f"Practitioner/d{n % 3}"},
         "encounter": {"reference": f"Encounter/e{n % 6}"}} for n in range(5)
    ]
    return out


# -- the requests ------------------------------------------------------------------------------------
def _json(body: dict | list) -> bytes:
    return orjson.dumps(body)


def _req(method: str, path: str, query: str | list = "", headers: dict | None = None,
         body: bytes | dict | None = None, raw: bool = False) -> Request:
    q = parse_qsl(query, keep_blank_values=True) if isinstance(query, str) else list(query)
    if isinstance(body, bytes) and headers is None:
        headers = {"content-type": "application/fhir+json"}
    return Request(method, path, q, dict(headers or {}), body, raw)


def _link(resp: Response, relation: str) -> Request | None:
    """The request a Bundle's link of this relation makes (None when the page has none)."""
    for link in (resp.body or {}).get("link", []):
        if link["relation"] == relation:
            parts = urlsplit(link["url"])
            path = parts.path.removeprefix(urlsplit(BASE).path).strip("/")
            return _req("GET", path, parts.query)
    return None


def _walk(server: str, first: Request) -> Generator[Step, Response, None]:
    """A search and every next page after it, then the previous link of the last page."""
    resp = yield server, first
    last = None
    for _ in range(12):
        nxt = _link(resp, "next")
        if nxt is None:
            break
        last = resp = yield server, nxt
    if last is not None and (prev := _link(last, "previous")) is not None:
        yield server, prev


def steps() -> Generator[Step, Response, None]:
    s = "strict"
    # capability, base URL, unknown paths and methods
    for q in ("", "mode=full", "mode=terminology", "_format=json", "_format=xml", "_format=application/fhir+json"):
        yield s, _req("GET", "metadata", q)
    for method in ("POST", "PUT", "DELETE"):
        yield s, _req(method, "metadata")
    for method, path in [("GET", ""), ("DELETE", ""), ("PUT", ""), ("GET", "$meta"), ("POST", "$export"),
                         ("GET", "Foo"), ("GET", "Foo/1"), ("GET", "patient/p1"), ("PATCH", "Patient/p1"),
                         ("POST", "Patient/p1"), ("PATCH", "Patient"), ("HEAD", "Patient"),
                         ("DELETE", "Patient/p1/_history"), ("POST", "Patient/_history"), ("GET", "Patient/_search"),
                         ("PUT", "Patient/_search"), ("GET", "Patient/$validate"), ("GET", "Patient/$foo"),
                         ("GET", "Patient/p1/$foo"), ("GET", "Patient/p1/x/y/z"), ("GET", "Patient/p1/_history/1/x"),
                         ("POST", "Patient/p1/_history"), ("PUT", "Patient/p1/_history/1"),
                         ("GET", "Observation/obs1/$everything"), ("DELETE", "Patient/p1/$everything"),
                         ("GET", "Patient/p1/$validate"), ("POST", "_history"), ("GET", "_history/1"),
                         ("GET", "Patient/bad!id"), ("GET", "Patient/" + "x" * 65), ("GET", "/Patient/p1/"),
                         ("GET", "Patient//p1"), ("GET", "_search"), ("GET", "Patient/p1/$validate/x")]:
        yield s, _req(method, path)
    yield s, _req("GET", "", "_getpages=0123456789abcdef01234567")
    yield s, _req("GET", "Patient", "_getpages=nope")
    yield s, _req("GET", "Patient", "_format=text/turtle")
    # a read of the empty server, then the bulk-loaded world (see replay())
    yield s, _req("GET", "Patient/p1")
    yield "load", _req("POST", "$load")
    # reads, conditional reads, shaped reads
    for rid in ("p1", "p2", "p404", "o1", "d2"):
        yield s, _req("GET", f"{'Organization' if rid[0] == 'o' else 'Practitioner' if rid[0] == 'd' else 'Patient'}"
                             f"/{rid}")
    for q in ("_summary=true", "_summary=text", "_summary=data", "_summary=false", "_summary=count",
              "_summary=bogus", "_elements=name,gender", "_elements=", "_elements=name&_summary=true", "_pretty=true"):
        yield s, _req("GET", "Patient/p3", q)
    yield s, _req("GET", "Observation/obs0", "_elements=value")
    yield s, _req("GET", "Observation/obs1", "_summary=true")
    first = yield s, _req("GET", "Patient/p4")
    etag, modified = first.headers.get("ETag", ""), first.headers.get("Last-Modified", "")
    for headers in ({"if-none-match": etag}, {"if-none-match": 'W/"9"'}, {"if-none-match": "*"},
                    {"if-none-match": f'W/"7", {etag}'}, {"if-modified-since": modified},
                    {"if-modified-since": "Mon, 01 Jan 2001 00:00:00 GMT"}, {"if-modified-since": "garbage"},
                    {"if-modified-since": "Sat, 01 Jun 2030 00:00:00 GMT"},
                    {"if-none-match": 'W/"9"', "if-modified-since": modified}):
        yield s, _req("GET", "Patient/p4", "", headers)
    # vread
    for vid in ("1", "2", "0", "abc", "²", "99999999999999999999", "-1"):
        yield s, _req("GET", "Patient/p1/_history/" + vid)
    yield s, _req("GET", "Patient/p404/_history/1")
    yield s, _req("GET", "Patient/p1/_history/1", "_summary=true")
    # searches
    searches = [
        ("Patient", ""), ("Patient", "name=diaz"), ("Patient", "name=DIA"), ("Patient", "family:exact=Diaz"),
        ("Patient", "name:contains=ka"), ("Patient", "given=emile"), ("Patient", "given:exact=Émile"),
        ("Patient", "gender=female"), ("Patient", "gender:not=female"), ("Patient", "gender=female,male"),
        ("Patient", "gender=http://hl7.org/fhir/administrative-gender|male"), ("Patient", "birthdate=ge1970"),
        ("Patient", "birthdate=lt1960-01-01"), ("Patient", "birthdate=1965"), ("Patient", "birthdate=eb1970&birthdate=sa1945"),
        ("Patient", f"identifier={MRN}|MRN003"), ("Patient", "identifier=MRN004"), ("Patient", "identifier=|MRN004"),
        ("Patient", "_id=p1,p2,p9"), ("Patient", "_id:not=p1"), ("Patient", "active=true"), ("Patient", "active=maybe"),
        ("Patient", "address-city=Boston"), ("Patient", "address=main"), ("Patient", "address-postalcode=02103"),
        ("Patient", "phone=555-0105"), ("Patient", "telecom=phone|555-0106"), ("Patient", "organization=o1"),
        ("Patient", "organization=Organization/o0"), ("Patient", "general-practitioner:Practitioner=d1"),
        ("Patient", "organization.name=Clinic 1"), ("Patient", "_has:Observation:subject:code=8867-4"),
        ("Patient", "_has:Condition:subject:code=http://snomed.info/sct|44054006"),
        ("Patient", "_sort=birthdate"), ("Patient", "_sort=-birthdate,family"), ("Patient", "_sort=family,-_id"),
        ("Patient", "_sort=bogus"), ("Patient", "_count=0"), ("Patient", "_count=-1"), ("Patient", "_count=abc"),
        ("Patient", "_count=3&_total=none"), ("Patient", "_total=accurate&_summary=count"),
        ("Patient", "_summary=count&bogus=1"), ("Patient", "bogus=1"), ("Patient", "name:bogus=x"),
        ("Patient", "birthdate=notadate"), ("Patient", "_elements=gender&_count=2"), ("Patient", "_summary=true&_count=2"),
        ("Patient", "_summary=text&_count=1"), ("Patient", "_lastUpdated=ge2024-01-01"), ("Patient", "_lastUpdated=lt2020"),
        ("Patient", "name:missing=true"), ("Patient", "deceased:missing=true"), ("Patient", "_format=json&gender=male"),
        ("Patient", "_include=Patient:organization"), ("Patient", "_include=Patient:general-practitioner&_count=4"),
        ("Patient", "_include=*&_id=p2"), ("Patient", "_revinclude=Observation:subject&_id=p1,p2"),
        ("Patient", "_revinclude=Condition:patient&_revinclude=Encounter:subject&_id=p0"),
        ("Patient", "_revinclude=*:subject"), ("Patient", "_include=Patient:bogus"),
        ("Observation", ""), ("Observation", "code=8867-4"), ("Observation", f"code={LOINC}|29463-7"),
        ("Observation", "code:text=heart"), ("Observation", "code:text=HR"), ("Observation", "code:not=8867-4"),
        ("Observation", "status=final,amended"), ("Observation", "value-quantity=gt60"),
        ("Observation", "value-quantity=le60|http://unitsofmeasure.org|kg"), ("Observation", "value-quantity=ap55"),
        ("Observation", "value-quantity=5.5e1"), ("Observation", "value-quantity=abc"),
        ("Observation", "component-code-value-quantity=8480-6$gt120"),
        ("Observation", "code-value-quantity=http://loinc.org|29463-7$ge60"),
        ("Observation", "combo-code=8462-4"), ("Observation", "date=ge2024-03"), ("Observation", "date=2024-02"),
        ("Observation", "date=ap2024-06-01"), ("Observation", "date=gt2024-01-10T03:00:00Z&date=lt2024-04"),
        ("Observation", "subject=Patient/p1"), ("Observation", "subject=p2"), ("Observation", "patient=p3"),
        ("Observation", "subject:Patient.name=smith"), ("Observation", "subject:Patient.organization.name=Clinic 0"),
        ("Observation", "patient.gender=female&_count=2"), ("Observation", "performer:Practitioner.family=Grey"),
        ("Observation", "subject:missing=false&_count=1"), ("Observation", "category=vital-signs&_count=4"),
        ("Observation", "_include=Observation:subject&_include=Observation:performer&_count=5"),
        ("Observation", "_include=Observation:subject&_include:iterate=Patient:organization&_count=3"),
        ("Observation", "_include=Observation:patient:Patient&_count=2"), ("Observation", "_sort=-date&_count=4"),
        ("Observation", "_sort=value-quantity&_count=4"), ("Observation", "_sort=code,-date&_count=6"),
        ("Observation", "code=8867-4&_summary=count"), ("Observation", "_elements=code,subject&_count=2"),
        ("Condition", "code=44054006"), ("Condition", "clinical-status=active"), ("Condition", "onset-date=ge2014"),
        ("Condition", "patient=p1&_revinclude=Condition:patient"), ("Condition", "subject.identifier=MRN001"),
        ("Encounter", "date=2023-11"), ("Encounter", "class=AMB"), ("Encounter", "participant=Practitioner/d1"),
        ("Encounter", "service-provider.name=Clinic 0"), ("Encounter", "_revinclude=MedicationRequest:encounter"),
        ("MedicationRequest", "code=860975"), ("MedicationRequest", "authoredon=ge2024-02-03"),
        ("MedicationRequest", "status:not=active"), ("MedicationRequest", "intent=order&_include=MedicationRequest:requester"),
        ("MedicationRequest", "medication.code=x"), ("Practitioner", "name=house"), ("Organization", "name=clinic"),
        ("Organization", "_revinclude=Patient:organization&_revinclude:iterate=Observation:subject"),
        ("Practitioner", "_revinclude=Observation:performer&_revinclude:iterate=Observation:subject"),
        ("Appointment", ""), ("Patient", "_has:Observation:bogus:code=x"), ("Patient", "_text=diaz"),
        ("Patient", "_content=x"), ("Patient", "_query=x"), ("Patient", "name=" + "x" * 300),
        ("Patient", "_sort=_lastUpdated"), ("Patient", "_id=p1&_id=p2"), ("Patient", "name=diaz&name=ana"),
    ]
    for rtype, q in searches:
        yield s, _req("GET", rtype, q)
    for rtype, q in searches[::9]:
        yield s, _req("GET", rtype, q, raw=True)
    for rtype, q in [("Patient", "bogus=1&gender=male"), ("Observation", "foo=bar&code=8867-4")]:
        for prefer in ("handling=lenient", "handling=strict"):
            yield s, _req("GET", rtype, q, {"prefer": prefer})
    # paging: every next link, and back
    yield from _walk(s, _req("GET", "Observation", "_count=7"))
    yield from _walk(s, _req("GET", "Patient", "_count=5&_sort=family&_include=Patient:organization"))
    yield from _walk(s, _req("GET", "Observation", "_count=4&_summary=true", raw=True))
    resp = yield s, _req("GET", "Patient", "_count=2")
    nxt = _link(resp, "next")
    assert nxt is not None
    token = dict(nxt.query)["_getpages"]
    for q in (f"_getpages={token}&_getpagesoffset=4&_count=3", f"_getpages={token}&_getpagesoffset=-1",
              f"_getpages={token}&_getpagesoffset=x", f"_getpages={token}&_count=2000", f"_getpages={token}",
              f"_getpages={token}&_getpagesoffset=100"):
        yield s, _req("GET", "", q)
        yield s, _req("GET", "Patient", q)
    yield s, _req("GET", "Observation", f"_getpages={token}")
    # POST _search
    form = {"content-type": "application/x-www-form-urlencoded"}
    yield s, _req("POST", "Patient/_search", "", form, b"gender=male&_count=2")
    yield s, _req("POST", "Patient/_search", "_count=1", form, b"name=diaz")
    yield s, _req("POST", "Patient/_search", "", {"content-type": "application/json"}, b"name=diaz")
    yield s, _req("POST", "Patient/_search", "", form, b"\xff\xfe")
    yield s, _req("POST", "Patient/_search", "", form, {"name": "x"})
    yield s, _req("POST", "Patient/_search")
    yield s, _req("POST", "Observation/_search", "", form, b"bogus=1")
    # creates
    new = {"resourceType": "Patient", "name": [{"family": "Zed"}], "identifier": [{"system": MRN, "value": "NEW1"}]}
    for headers in ({}, {"prefer": "return=minimal"}, {"prefer": "return=OperationOutcome"},
                    {"prefer": "return=representation"}):
        yield s, _req("POST", "Patient", "", {"content-type": "application/fhir+json", **headers}, _json(new))
    yield s, _req("POST", "Patient", "", {}, {"resourceType": "Patient", "id": "ignored", "gender": "male",
                                          "meta": {"versionId": "9", "tag": [{"code": "t"}]}})
    for cond in (f"identifier={MRN}|MRN001", "identifier=NOPE", f"identifier={MRN}|NEW1", "", "Patient?identifier=MRN002",
                 "family=diaz", "bogus=1"):
        yield s, _req("POST", "Patient", "", {"content-type": "application/fhir+json", "if-none-exist": cond},
                      _json({"resourceType": "Patient", "name": [{"family": "Cond"}]}))
    yield s, _req("POST", "Patient", "", {"content-type": "application/fhir+json", "if-none-exist": "identifier=MRN001",
                                          "prefer": "return=minimal"}, _json({"resourceType": "Patient"}))
    bad_bodies = [
        ({"content-type": "application/fhir+json"}, b""), ({"content-type": "application/fhir+json"}, b"{bad json"),
        ({"content-type": "application/fhir+json"}, b"[1,2]"), ({"content-type": "application/xml"}, b"<Patient/>"),
        ({"content-type": "application/json; charset=utf-8"}, _json({"resourceType": "Patient"})),
        ({}, _json({"resourceType": "Patient"})), ({"content-type": "application/fhir+json"}, _json({"name": []})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Observation"})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient", "gender": "robot"})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient", "birthDate": "2020-13-01",
                                                           "bogus": 1, "name": {"family": "x"}})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient",
                                                           "managingOrganization": {"reference": "Organization/nope"}})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient", "generalPractitioner": [
            {"reference": "Practitioner/d1/_history/1"}, {"reference": "Practitioner/d1/_history/7"},
            {"reference": "Practitioner/zz"}]})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient", "managingOrganization": {
            "reference": "Organization?identifier=ORG1"}})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient", "managingOrganization": {
            "reference": "Organization?name=clinic"}})),
        ({"content-type": "application/fhir+json"}, _json({"resourceType": "Patient", "managingOrganization": {
            "reference": f"{BASE}/Organization/o0"}, "link": [{"other": {"reference": "http://elsewhere/Patient/1"},
                                                              "type": "seealso"}]})),
    ]
    for headers, body in bad_bodies:
        yield s, _req("POST", "Patient", "", headers, body)
    yield s, _req("POST", "Patient", "", {}, {"resourceType": "Patient", "x": {1, 2}})
    yield s, _req("POST", "Patient", "", {}, {"resourceType": "Patient", "birthDate": 2 ** 70})
    yield s, _req("POST", "Observation", "", {}, _observation(99, 1) | {"id": None})
    yield s, _req("POST", "Patient", "_format=xml", {}, {"resourceType": "Patient"})
    # updates
    p1 = _patient(1)
    yield s, _req("PUT", "Patient/p1", "", {}, p1 | {"active": False})
    yield s, _req("PUT", "Patient/p1", "", {"prefer": "return=minimal"}, p1 | {"active": True})
    yield s, _req("PUT", "Patient/pnew", "", {}, {"resourceType": "Patient", "id": "pnew"})
    yield s, _req("PUT", "Patient/pnew", "", {}, {"resourceType": "Patient", "id": "other"})
    yield s, _req("PUT", "Patient/pnew", "", {}, {"resourceType": "Patient"})
    yield s, _req("PUT", "Patient/pnew", "", {}, {"resourceType": "Observation", "id": "pnew"})
    for if_match in ('W/"2"', 'W/"1"', '"3"', "3", "W/3", "bogus", 'W/"²"', " "):
        yield s, _req("PUT", "Patient/pnew", "", {"if-match": if_match},
                      {"resourceType": "Patient", "id": "pnew", "gender": "male"})
    yield s, _req("PUT", "Patient/nothere", "", {"if-match": 'W/"1"'}, {"resourceType": "Patient", "id": "nothere"})
    yield s, _req("PUT", "Patient/p2", "", {}, _patient(2) | {"gender": "robot"})
    yield s, _req("PUT", "Patient/p2", "", {}, _patient(2) | {"managingOrganization": {"reference": "Organization/x"}})
    # conditional updates
    yield s, _req("PUT", "Patient", "", {}, {"resourceType": "Patient"})
    yield s, _req("PUT", "Patient", f"identifier={MRN}|MRN005", {}, _patient(5) | {"active": False})
    yield s, _req("PUT", "Patient", f"identifier={MRN}|MRN005", {}, {"resourceType": "Patient", "id": "p6"})
    yield s, _req("PUT", "Patient", "identifier=NOMATCH", {}, {"resourceType": "Patient", "name": [{"text": "cu"}]})
    yield s, _req("PUT", "Patient", "identifier=NOMATCH2", {}, {"resourceType": "Patient", "id": "cu-id"})
    yield s, _req("PUT", "Patient", "identifier=NOMATCH3", {}, {"resourceType": "Patient", "id": "p7"})
    yield s, _req("PUT", "Patient", "family=diaz", {}, {"resourceType": "Patient"})
    yield s, _req("PUT", "Patient", f"identifier={MRN}|MRN008", {"if-match": 'W/"1"'}, _patient(8))
    yield s, _req("PUT", "Patient", f"identifier={MRN}|MRN008", {"if-match": 'W/"5"'}, _patient(8))
    # history
    for path, q in [("Patient/p1/_history", ""), ("Patient/pnew/_history", ""), ("Patient/_history", "_count=5"),
                    ("_history", "_count=4"), ("_history", "_since=2024-06-01T12:00:00.100Z"), ("_history", "_since=bad"),
                    ("Patient/p404/_history", ""), ("Patient/_history", "bogus=1"), ("_history", "_count=-3"),
                    ("Patient/p1/_history", "_format=json&_pretty=true"), ("_history", "_since=9999")]:
        yield s, _req("GET", path, q)
    yield from _walk(s, _req("GET", "_history", "_count=25"))
    # $validate
    val = {"content-type": "application/fhir+json"}
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Patient", "gender": "male"}))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Patient", "gender": "robot"}))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Observation"}))
    yield s, _req("POST", "Patient/$validate", "mode=update", val, _json({"resourceType": "Patient"}))
    yield s, _req("POST", "Patient/$validate", "mode=bogus", val, _json({"resourceType": "Patient"}))
    yield s, _req("POST", "Patient/$validate", "mode=delete", val, _json({"resourceType": "Patient"}))
    yield s, _req("POST", "Patient/$validate", "profile=http://x/p", val, _json({"resourceType": "Patient"}))
    yield s, _req("POST", "Patient/$validate", "", val, b"")
    params = {"resourceType": "Parameters", "parameter": [
        {"name": "resource", "resource": {"resourceType": "Patient", "id": "zz"}},
        {"name": "mode", "valueCode": "update"},
        {"name": "profile", "valueUri": "http://hl7.org/fhir/StructureDefinition/Patient"}]}
    yield s, _req("POST", "Patient/$validate", "", val, _json(params))
    yield s, _req("POST", "Patient/p1/$validate", "", val, _json(params))
    yield s, _req("POST", "Patient/zz/$validate", "", val, _json(params))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Parameters", "parameter": [
        {"name": "resource", "resource": {"resourceType": "Patient"}}, {"name": "resource", "resource": {}}]}))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Parameters", "parameter": [
        {"name": "mode", "valueCode": "create", "valueString": "x"}]}))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Parameters", "parameter": "x"}))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Parameters"}))
    yield s, _req("POST", "Patient/$validate", "", val, _json({"resourceType": "Parameters", "parameter": [
        {"name": "mode", "valueBoolean": True}, {"name": "resource", "resource": {"resourceType": "Patient"}}]}))
    for rid in ("p1", "p11", "p404", "o0"):
        yield s, _req("POST", f"{'Organization' if rid == 'o0' else 'Patient'}/{rid}/$validate", "mode=delete")
    yield s, _req("POST", "Patient/p1/$validate", "", val, _json({"resourceType": "Patient", "id": "p1"}))
    yield s, _req("POST", "Patient/p1/$validate")
    # $everything
    for q in ("", "_type=Observation", "_type=Observation,Condition&_type=Encounter", "_type=Bogus",
              "_since=2024-06-01T12:00:00.050Z", "_since=x", "_count=3", "_count=-1", "bogus=1", "_format=json"):
        yield s, _req("GET", "Patient/p1/$everything", q)
    yield from _walk(s, _req("GET", "Patient/p0/$everything", "_count=4"))
    for pid in ("p404", "p2", "p6"):
        yield s, _req("GET", f"Patient/{pid}/$everything")
    yield s, _req("POST", "Patient/p3/$everything", "", val, _json({"resourceType": "Parameters", "parameter": [
        {"name": "_type", "valueString": "Observation"}, {"name": "_count", "valueInteger": 2}]}))
    yield s, _req("POST", "Patient/p3/$everything", "", val, _json({"resourceType": "Patient"}))
    yield s, _req("POST", "Patient/p3/$everything", "", val, _json({"resourceType": "Parameters", "parameter": {
        "name": "_count", "valueInteger": 1}}))
    yield s, _req("POST", "Patient/p3/$everything")
    # deletes
    for path, q, headers in [
        ("Patient/p9", "", {}), ("Patient/p9", "_cascade=delete", {}), ("Patient/p9", "", {}),
        ("Patient/p10", "_cascade=bogus", {}), ("Patient/p10", "", {"if-match": 'W/"3"'}),
        ("Patient/p10", "", {"if-match": 'W/"1"'}), ("Patient/gone", "", {"if-match": 'W/"1"'}),
        ("Practitioner/d2", "", {}), ("Organization/o1", "_cascade=delete", {}), ("Condition/c7", "", {}),
        ("Observation", "code=29463-7", {}), ("Observation", "code=85354-9&_count=1", {}),
        ("Observation", "code=NOTHING", {}), ("Observation", "", {}), ("Observation", "_cascade=delete", {}),
        ("MedicationRequest", "_id=m0&_cascade=delete", {}), ("Patient/bad!", "", {}), ("Encounter", "bogus=1", {}),
    ]:
        yield s, _req("DELETE", path, q, headers)
    for path in ("Patient/p9", "Patient/p9/_history/1", "Patient/p9/_history/2", "Patient/p9/_history", "Condition/c7",
                 "Patient/p10/$everything", "Patient", "Organization/o1/_history"):
        yield s, _req("GET", path)
    yield s, _req("PUT", "Condition/c7", "", {}, {"resourceType": "Condition", "id": "c7",
                                                  "subject": {"reference": "Patient/p1"}})
    yield s, _req("GET", "Condition/c7/_history")
    # batch
    batch = {"resourceType": "Bundle", "type": "batch", "entry": [
        {"request": {"method": "GET", "url": "Patient/p1"}},
        {"request": {"method": "GET", "url": "Patient?gender=male&_count=2"}},
        {"request": {"method": "GET", "url": f"{BASE}/Patient/p404"}},
        {"resource": {"resourceType": "Patient", "name": [{"family": "Batch"}]},
         "request": {"method": "POST", "url": "Patient"}},
        {"resource": {"resourceType": "Patient", "gender": "robot"}, "request": {"method": "POST", "url": "Patient"}},
        {"resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Patient",
                                                            "ifNoneExist": f"identifier={MRN}|MRN002"}},
        {"resource": _patient(3) | {"active": True}, "request": {"method": "PUT", "url": "Patient/p3",
                                                                  "ifMatch": 'W/"9"'}},
        {"resource": _patient(3) | {"active": True}, "request": {"method": "PUT", "url": "Patient/p3"}},
        {"request": {"method": "DELETE", "url": "Encounter/e5"}},
        {"request": {"method": "DELETE", "url": "Practitioner/d0"}},
        {"request": {"method": "GET", "url": "Patient/p1/_history"}},
        {"request": {"method": "HEAD", "url": "Patient/p2"}},
        {"request": {"method": "GET", "url": "metadata"}},
        {"request": {"method": "GET", "url": "Bogus/1"}},
        {"request": {"method": "POST", "url": "Patient/$validate"}, "resource": {"resourceType": "Patient"}},
    ]}
    yield s, _req("POST", "", "", {}, batch)
    yield s, _req("POST", "", "", val, _json(batch | {"entry": batch["entry"][:4]}))
    # transactions
    tx = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:11111111-1111-1111-1111-111111111111",
         "resource": {"resourceType": "Patient", "name": [{"family": "Tx"}],
                      "managingOrganization": {"reference": "Organization?identifier=ORG0"}},
         "request": {"method": "POST", "url": "Patient"}},
        {"fullUrl": "urn:uuid:22222222-2222-2222-2222-222222222222",
         "resource": {"resourceType": "Observation", "status": "final", "code": {"text": "tx obs"},
                      "subject": {"reference": "urn:uuid:11111111-1111-1111-1111-111111111111"}},
         "request": {"method": "POST", "url": "Observation"}},
        {"resource": {"resourceType": "Patient", "id": "p4", "gender": "male",
                      "link": [{"other": {"reference": "urn:uuid:11111111-1111-1111-1111-111111111111"},
                                "type": "seealso"}]},
         "request": {"method": "PUT", "url": "Patient/p4"}},
        {"resource": {"resourceType": "Patient", "name": [{"family": "CondTx"}]},
         "request": {"method": "PUT", "url": f"Patient?identifier={MRN}|TXC"}},
        {"resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Patient",
                                                            "ifNoneExist": f"identifier={MRN}|MRN002"}},
        {"request": {"method": "DELETE", "url": "Condition/c6"}},
        {"request": {"method": "DELETE", "url": "Condition?code=38341003"}},
        {"request": {"method": "GET", "url": "Patient/p4"}},
        {"request": {"method": "GET", "url": "Observation?code:text=tx"}},
    ]}
    yield s, _req("POST", "", "", {}, tx)
    yield s, _req("GET", "Observation", "code:text=tx obs&_include=Observation:subject")
    broken = [
        {"resourceType": "Bundle", "type": "collection"}, {"resourceType": "Patient"},
        {"resourceType": "Bundle", "type": "transaction", "entry": "x"},
        {"resourceType": "Bundle", "type": "transaction", "entry": ["x"]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "GET"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "PATCH", "url": "Patient/p1"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "get", "url": "Patient/p1"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "POST", "url": "Patient"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "GET", "url": "Patient/p1", "ifNoneMatch": ""}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"fullUrl": "urn:uuid:a", "resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Patient"}},
            {"fullUrl": "urn:uuid:a", "resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Patient"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient", "managingOrganization": {"reference": "urn:uuid:missing"}},
             "request": {"method": "POST", "url": "Patient"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Patient"}},
            {"resource": {"resourceType": "Patient", "gender": "robot"}, "request": {"method": "POST", "url": "Patient"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Observation"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Bogus"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient", "id": "x"}, "request": {"method": "PUT", "url": "Patient/y"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Bogus"}, "request": {"method": "PUT", "url": "Bogus/y"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient"}, "request": {"method": "PUT", "url": "Patient"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "DELETE", "url": "Patient/p2"}}, {"request": {"method": "DELETE", "url": "Patient/p2"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "DELETE", "url": "Patient/p2"}},
            {"resource": _patient(2), "request": {"method": "PUT", "url": "Patient/p2"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "DELETE", "url": "Patient/p0"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "DELETE", "url": "Patient"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "DELETE", "url": "Bogus/1"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [{"request": {"method": "DELETE", "url": "Patient/b!"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "DELETE", "url": "Patient?family=diaz"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "DELETE", "url": "Patient/p11", "ifMatch": 'W/"4"'}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": _patient(11), "request": {"method": "PUT", "url": "Patient/p11", "ifMatch": "junk"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient"}, "request": {"method": "POST", "url": "Patient",
                                                                "ifNoneExist": "family=diaz"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient"}, "request": {"method": "PUT", "url": "Patient?family=diaz"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"resource": {"resourceType": "Patient", "id": "p8"}, "request": {"method": "PUT", "url": "Patient/p8"}},
            {"resource": {"resourceType": "Patient", "id": "p8"}, "request": {"method": "PUT", "url": "Patient/p8"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "DELETE", "url": "Organization/o0"}},
            {"resource": {"resourceType": "Patient", "id": "p0"}, "request": {"method": "PUT", "url": "Patient/p0"}}]},
        {"resourceType": "Bundle", "type": "transaction", "entry": [
            {"request": {"method": "GET", "url": "Patient/p404"}}, {"request": {"method": "GET", "url": "Patient/p1"}}]},
    ]
    for bundle in broken:
        yield s, _req("POST", "", "", {}, bundle)
    yield s, _req("POST", "", "", {}, {"resourceType": "Bundle", "type": "batch", "entry": [
        {"request": {"method": "POST", "url": "Patient"}, "resource": {"resourceType": "Patient", "id": "sent"}},
        {"request": {"method": "PUT", "url": "Patient?identifier=NOMATCH9"}, "resource": {"resourceType": "Patient"}},
        {"request": {"method": "DELETE", "url": "Patient?identifier=NOMATCH9"}},
        {"request": {"method": "DELETE", "url": "Patient/p11"}}]})
    yield s, _req("GET", "_history", "_count=6")
    yield s, _req("GET", "Patient", "_count=100&_sort=-_lastUpdated")
    # the loose server: no validation, no integrity, lenient search, small limits
    lo = "loose"
    for n in range(4):
        yield lo, _req("PUT", f"Patient/q{n}", "", {}, {"resourceType": "Patient", "id": f"q{n}", "gender": "robot",
                                                        "link": [{"other": {"reference": f"Patient/q{n + 1}"}}]})
    for n in range(6):
        yield lo, _req("POST", "Observation", "", {}, {"resourceType": "Observation", "status": "final",
                                                       "code": {"text": "x"}, "subject": {"reference": f"Patient/q{n}"},
                                                       "valueQuantity": {"value": n}})
    for path, q in [("Patient", ""), ("Patient", "bogus=1&gender=robot"), ("Patient", "_count=50"),
                    ("Observation", "_include=Observation:subject"), ("Patient", "_revinclude=Observation:subject"),
                    ("Patient", "_include=Patient:link&_include:iterate=Patient:link"), ("Observation", "_count=0"),
                    ("_history", ""), ("Patient/q1/$everything", ""), ("metadata", "")]:
        yield lo, _req("GET", path, q)
    yield from _walk(lo, _req("GET", "Observation", ""))
    yield lo, _req("GET", "Patient", "bogus=1", {"prefer": "handling=strict"})
    yield lo, _req("DELETE", "Patient/q2")
    yield lo, _req("POST", "Patient", "", {"content-type": "application/fhir+json"},
                   _json({"resourceType": "Patient", "text": {"div": "x" * 3000}}))
    yield lo, _req("POST", "", "", {}, {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:x", "resource": {"resourceType": "Patient", "gender": "robot"},
         "request": {"method": "POST", "url": "Patient"}},
        {"resource": {"resourceType": "Observation", "subject": {"reference": "urn:uuid:x"}},
         "request": {"method": "POST", "url": "Observation"}}]})
    yield lo, _req("POST", "Patient/$validate", "", {}, {"resourceType": "Patient", "gender": "robot"})


# -- recording and replaying -------------------------------------------------------------------------
def _normalise(text: str, tokens: dict[str, str]) -> str:
    """Paging tokens as their order of first appearance, and the page ids hashed from them as a mark."""
    def token(m: re.Match) -> str:
        return "_getpages=" + tokens.setdefault(m.group(1), f"T{len(tokens):04d}")

    return _PAGE_ID_RE.sub(r'\1<page-id>"', _TOKEN_RE.sub(token, text))


def _serialise(resp: Response) -> str:
    return orjson.dumps({"status": resp.status, "headers": resp.headers, "body": resp.body}).decode()


def replay() -> Iterator[dict]:
    """Run the corpus: one record per request (the normalised response, inline or as its sha256)."""
    servers = make_servers()
    tokens: dict[str, str] = {}
    gen = steps()
    resp: Response | None = None
    n = 0
    while True:
        try:
            name, req = gen.send(resp) if resp is not None else next(gen)
        except StopIteration:
            return
        label = f"{req.method} /{req.path}" + (f"?{urlencode(req.query)}" if req.query else "")
        if req.headers:
            label += " " + orjson.dumps(req.headers).decode()
        if name == "load":
            issues = servers["strict"].load(world())
            resp = Response(200, {"issues": [i.to_json() for i in issues]})
        else:
            resp = servers[name].handle(req)
        text = _normalise(_serialise(resp), tokens)
        record: dict = {"n": n, "server": name, "request": _normalise(label, tokens), "status": resp.status}
        if len(text) <= INLINE:
            record["response"] = text
        else:
            record["sha256"] = hashlib.sha256(text.encode()).hexdigest()
            record["size"] = len(text)
        yield record
        n += 1


def record(path: Path = CORPUS) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    records = list(replay())
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return len(records)


def recorded(path: Path = CORPUS) -> list[dict]:
    with gzip.open(path, "rb") as f:
        return [orjson.loads(line) for line in f]


def compare(expected: list[dict], actual: list[dict], show: Callable[[str], None] = print) -> int:
    """Print every differing record; the number of them."""
    bad = 0
    for e, a in zip(expected, actual, strict=False):
        if e != a:
            bad += 1
            show(f"#{e['n']} {e['server']} {e['request']}\n  recorded: {e.get('response', e.get('sha256'))}\n"
                 f"  now:      {a.get('response', a.get('sha256'))}")
    if len(expected) != len(actual):
        bad += 1
        show(f"{len(expected)} recorded requests, {len(actual)} now")
    return bad


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        sys.exit(1 if compare(recorded(), list(replay())) else 0)
    print(f"{record()} requests recorded in {CORPUS}")
