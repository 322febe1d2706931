"""Resources and helpers the search-index extraction tests share."""

from __future__ import annotations

from datetime import UTC, datetime

from fhirgym.fhir._extract import Extractor
from fhirgym.spec import load_spec

SPEC = load_spec()


def ts(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()


def rows(ex: Extractor, resource: dict, table: str, code: str) -> list[tuple]:
    """Rows of one param in one table, code column dropped, sorted for comparison."""
    return sorted((r[1:] for r in ex.extract(resource).get(table, []) if r[0] == code), key=repr)


MMN = "http://hl7.org/fhir/StructureDefinition/patient-extensions-Patient-mothersMaidenName"

PATIENT = {
    "resourceType": "Patient",
    "id": "p1",
    "meta": {
        "lastUpdated": "2024-05-06T07:08:09Z",
        "tag": [{"system": "http://example.org/tags", "code": "vip", "display": "Very Important"}],
        "profile": ["http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient"],
    },
    "extension": [{"url": MMN, "valueString": "Smith"}],
    "identifier": [{"system": "http://hospital/mrn", "value": "123", "type": {"text": "Medical Record"}}],
    "name": [{"family": "Müller", "given": ["Anna", "B."], "prefix": ["Dr."], "text": "Dr. Anna Müller"}],
    "telecom": [{"system": "phone", "value": "555-1234"}, {"system": "email", "value": "anna@example.org"}],
    "gender": "female",
    "birthDate": "1980-02-03",
}


LOINC_HR = {"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}
UCUM = "http://unitsofmeasure.org"
OBSERVATION = {
    "resourceType": "Observation",
    "id": "o1",
    "status": "final",
    "code": {"coding": [LOINC_HR], "text": "HR"},
    "subject": {"reference": "Patient/p1"},
    "effectiveDateTime": "2024-01-02T03:04:05Z",
    "valueQuantity": {"value": 72, "unit": "beats/min", "system": UCUM, "code": "/min"},
}
