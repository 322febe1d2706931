"""Index rows by kind, hand-written: string, token, reference, date, number, quantity, uri and
composite rows of typical resources."""

from __future__ import annotations

import orjson

from _extract_cases import OBSERVATION, PATIENT, UCUM, rows, ts
from fhirgym.fhir._values import MAX_TIME, MIN_TIME


def test_patient_demographics(ex):
    assert rows(ex, PATIENT, "ix_string", "name") == sorted(
        [
            ("muller", "Müller"),
            ("anna", "Anna"),
            ("b.", "B."),
            ("dr.", "Dr."),
            ("dr. anna muller", "Dr. Anna Müller"),
        ],
        key=repr,
    )
    assert rows(ex, PATIENT, "ix_string", "family") == [("muller", "Müller")]
    assert rows(ex, PATIENT, "ix_string", "given") == [("anna", "Anna"), ("b.", "B.")]
    assert rows(ex, PATIENT, "ix_date", "birthdate") == [(ts(1980, 2, 3), ts(1980, 2, 4))]
    assert rows(ex, PATIENT, "ix_token", "gender") == [
        ("http://hl7.org/fhir/administrative-gender", "female", None)
    ]
    assert rows(ex, PATIENT, "ix_token", "identifier") == [("http://hospital/mrn", "123", "medical record")]
    assert rows(ex, PATIENT, "ix_token", "telecom") == [
        ("email", "anna@example.org", None),
        ("phone", "555-1234", None),
    ]
    assert rows(ex, PATIENT, "ix_token", "phone") == [("phone", "555-1234", None)]
    assert rows(ex, PATIENT, "ix_token", "email") == [("email", "anna@example.org", None)]
    assert rows(ex, PATIENT, "ix_string", "mothersMaidenName") == [("smith", "Smith")]


def test_resource_level_params(ex):
    assert rows(ex, PATIENT, "ix_token", "_id") == [(None, "p1", None)]
    assert rows(ex, PATIENT, "ix_date", "_lastUpdated") == [
        (ts(2024, 5, 6, 7, 8, 9), ts(2024, 5, 6, 7, 8, 10))
    ]
    assert rows(ex, PATIENT, "ix_token", "_tag") == [("http://example.org/tags", "vip", "very important")]
    assert rows(ex, PATIENT, "ix_uri", "_profile") == [
        ("http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient",)
    ]
    assert rows(ex, {**PATIENT, "meta": {"source": "http://src#a"}}, "ix_uri", "_source") == [
        ("http://src#a",)
    ]


def test_observation_code_value_date(ex):
    # the coding (text: its display) and the concept's own text, so code:text=hr finds it
    assert rows(ex, OBSERVATION, "ix_token", "code") == [
        ("http://loinc.org", "8867-4", "heart rate"),
        (None, None, "hr"),
    ]
    no_display = {
        **OBSERVATION,
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}], "text": "HR"},
    }
    assert rows(ex, no_display, "ix_token", "code") == [("http://loinc.org", "8867-4", "hr")]
    text_only = {**OBSERVATION, "code": {"text": "Pulse"}}
    assert rows(ex, text_only, "ix_token", "code") == [(None, None, "pulse")]
    assert rows(ex, OBSERVATION, "ix_token", "status") == [
        ("http://hl7.org/fhir/observation-status", "final", None)
    ]
    assert rows(ex, OBSERVATION, "ix_quantity", "value-quantity") == [
        (72.0, 71.5, 72.5, UCUM, "/min", "beats/min")
    ]
    assert rows(ex, OBSERVATION, "ix_date", "date") == [(ts(2024, 1, 2, 3, 4, 5), ts(2024, 1, 2, 3, 4, 6))]
    period = {k: v for k, v in OBSERVATION.items() if k != "effectiveDateTime"}
    period["effectivePeriod"] = {"start": "2024-01-02", "end": "2024-01-03"}
    assert rows(ex, period, "ix_date", "date") == [(ts(2024, 1, 2), ts(2024, 1, 4))]
    period["effectivePeriod"] = {"start": "2024-01-02T10:00:00+02:00"}
    assert rows(ex, period, "ix_date", "date") == [(ts(2024, 1, 2, 8), MAX_TIME)]
    period["effectivePeriod"] = {"end": "2024"}
    assert rows(ex, period, "ix_date", "date") == [(MIN_TIME, ts(2025, 1, 1))]


def test_observation_composites(ex):
    [(comp,)] = rows(ex, OBSERVATION, "ix_composite", "code-value-quantity")
    assert orjson.loads(comp) == [
        [["http://loinc.org", "8867-4", "heart rate"], [None, None, "hr"]],
        [[72.0, 71.5, 72.5, UCUM, "/min", "beats/min"]],
    ]
    assert rows(ex, OBSERVATION, "ix_composite", "code-value-concept") == []  # no valueCodeableConcept
    bp = {
        "resourceType": "Observation",
        "id": "bp",
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "85354-9"}]},
        "component": [
            {
                "code": {"coding": [{"system": "http://loinc.org", "code": "8480-6"}]},
                "valueQuantity": {"value": 120, "system": UCUM, "code": "mm[Hg]"},
            },
            {
                "code": {"coding": [{"system": "http://loinc.org", "code": "8462-4"}]},
                "valueQuantity": {"value": 80.5, "system": UCUM, "code": "mm[Hg]"},
            },
        ],
    }
    comps = [orjson.loads(c) for (c,) in rows(ex, bp, "ix_composite", "component-code-value-quantity")]
    assert sorted(comps) == [
        [[["http://loinc.org", "8462-4", None]], [[80.5, 80.45, 80.55, UCUM, "mm[Hg]", None]]],
        [[["http://loinc.org", "8480-6", None]], [[120.0, 119.5, 120.5, UCUM, "mm[Hg]", None]]],
    ]
    assert rows(ex, bp, "ix_composite", "code-value-quantity") == []  # the panel itself has no value
    assert len(rows(ex, bp, "ix_composite", "combo-code-value-quantity")) == 2


def test_subject_and_patient_depend_on_the_reference_type(ex):
    patient_row = ("Patient", "p1", "Patient/p1", None, None)
    assert rows(ex, OBSERVATION, "ix_reference", "subject") == [patient_row]
    assert rows(ex, OBSERVATION, "ix_reference", "patient") == [patient_row]
    group = {**OBSERVATION, "subject": {"reference": "Group/g1"}}
    assert rows(ex, group, "ix_reference", "subject") == [("Group", "g1", "Group/g1", None, None)]
    assert rows(ex, group, "ix_reference", "patient") == []
    absolute = {**OBSERVATION, "subject": {"reference": "http://other.org/fhir/Patient/9/_history/2"}}
    assert rows(ex, absolute, "ix_reference", "patient") == [
        ("Patient", "9", "http://other.org/fhir/Patient/9/_history/2", None, None)
    ]
    contained = {
        **OBSERVATION,
        "subject": {"reference": "#c1", "identifier": {"system": "http://mrn", "value": "7"}},
    }
    assert rows(ex, contained, "ix_reference", "subject") == [(None, None, None, "http://mrn", "7")]
    not_a_type = {**OBSERVATION, "subject": {"reference": "Foo/1"}}
    assert rows(ex, not_a_type, "ix_reference", "subject") == [(None, None, "Foo/1", None, None)]


def test_encounter_period(ex):
    enc = {
        "resourceType": "Encounter",
        "id": "e1",
        "status": "finished",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
        "subject": {"reference": "Patient/p1"},
        "period": {"start": "2024-03-04T09:00:00Z", "end": "2024-03-04T09:30:00Z"},
    }
    assert rows(ex, enc, "ix_date", "date") == [(ts(2024, 3, 4, 9), ts(2024, 3, 4, 9, 30, 1))]
    assert rows(ex, enc, "ix_token", "class") == [
        ("http://terminology.hl7.org/CodeSystem/v3-ActCode", "AMB", None)
    ]
    assert rows(ex, enc, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]


def test_appointment_and_slot(ex):
    appt = {
        "resourceType": "Appointment",
        "id": "a1",
        "status": "booked",
        "start": "2024-06-03T14:00:00Z",
        "end": "2024-06-03T14:30:00Z",
        "slot": [{"reference": "Slot/s1"}],
        "participant": [
            {"actor": {"reference": "Patient/p1"}, "status": "accepted"},
            {"actor": {"reference": "Practitioner/d1"}, "status": "accepted"},
        ],
    }
    assert rows(ex, appt, "ix_reference", "actor") == [
        ("Patient", "p1", "Patient/p1", None, None),
        ("Practitioner", "d1", "Practitioner/d1", None, None),
    ]
    assert rows(ex, appt, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]
    assert rows(ex, appt, "ix_reference", "practitioner") == [
        ("Practitioner", "d1", "Practitioner/d1", None, None)
    ]
    assert rows(ex, appt, "ix_date", "date") == [(ts(2024, 6, 3, 14), ts(2024, 6, 3, 14, 0, 1))]
    assert rows(ex, appt, "ix_token", "status") == [
        ("http://hl7.org/fhir/appointmentstatus", "booked", None)
    ]
    assert rows(ex, appt, "ix_reference", "slot") == [("Slot", "s1", "Slot/s1", None, None)]

    slot = {
        "resourceType": "Slot",
        "id": "s1",
        "schedule": {"reference": "Schedule/sch1"},
        "status": "free",
        "start": "2024-06-03T14:00:00Z",
        "end": "2024-06-03T14:30:00Z",
    }
    assert rows(ex, slot, "ix_date", "start") == [(ts(2024, 6, 3, 14), ts(2024, 6, 3, 14, 0, 1))]
    assert rows(ex, slot, "ix_reference", "schedule") == [("Schedule", "sch1", "Schedule/sch1", None, None)]
    assert rows(ex, slot, "ix_token", "status") == [("http://hl7.org/fhir/slotstatus", "free", None)]


def test_medication_request_medication_choice(ex):
    base = {
        "resourceType": "MedicationRequest",
        "id": "m1",
        "status": "active",
        "intent": "order",
        "subject": {"reference": "Patient/p1"},
    }
    rxnorm = {
        "system": "http://www.nlm.nih.gov/research/umls/rxnorm",
        "code": "1049630",
        "display": "Diphenhydramine",
    }
    as_cc = {**base, "medicationCodeableConcept": {"coding": [rxnorm]}}
    assert rows(ex, as_cc, "ix_token", "code") == [(rxnorm["system"], "1049630", "diphenhydramine")]
    assert rows(ex, as_cc, "ix_reference", "medication") == []
    as_ref = {**base, "medicationReference": {"reference": "Medication/med1"}}
    assert rows(ex, as_ref, "ix_reference", "medication") == [
        ("Medication", "med1", "Medication/med1", None, None)
    ]
    assert rows(ex, as_ref, "ix_token", "code") == []


def test_coverage_and_account(ex):
    cov = {
        "resourceType": "Coverage",
        "id": "c1",
        "status": "active",
        "beneficiary": {"reference": "Patient/p1"},
        "payor": [{"reference": "Organization/o1"}],
    }
    assert rows(ex, cov, "ix_reference", "beneficiary") == [("Patient", "p1", "Patient/p1", None, None)]
    assert rows(ex, cov, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]
    assert rows(ex, cov, "ix_reference", "payor") == [("Organization", "o1", "Organization/o1", None, None)]
    acct = {
        "resourceType": "Account",
        "id": "a1",
        "status": "active",
        "owner": {"reference": "Organization/o1"},
        "subject": [{"reference": "Patient/p1"}, {"reference": "Device/d1"}],
    }
    assert rows(ex, acct, "ix_reference", "owner") == [("Organization", "o1", "Organization/o1", None, None)]
    assert rows(ex, acct, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]
    assert len(rows(ex, acct, "ix_reference", "subject")) == 2


def test_quantity_shapes_money_range_and_inline_resource(ex):
    invoice = {
        "resourceType": "Invoice",
        "id": "i1",
        "status": "draft",
        "totalNet": {"value": 100.5, "currency": "USD"},
    }
    assert rows(ex, invoice, "ix_quantity", "totalnet") == [
        (100.5, 100.45, 100.55, "urn:iso:std:iso:4217", "USD", "USD")
    ]
    cond = {
        "resourceType": "Condition",
        "id": "c1",
        "subject": {"reference": "Patient/p1"},
        "onsetRange": {
            "low": {"value": 10, "unit": "a", "system": UCUM, "code": "a"},
            "high": {"value": 20, "unit": "a"},
        },
    }
    assert rows(ex, cond, "ix_quantity", "onset-age") == [
        (10.0, 9.5, 10.5, UCUM, "a", "a"),
        (20.0, 19.5, 20.5, None, None, "a"),
    ]
    assert rows(ex, cond, "ix_date", "onset-date") == []  # a Range is not a date
    bundle = {
        "resourceType": "Bundle",
        "id": "b1",
        "type": "document",
        "entry": [
            {"resource": {"resourceType": "Composition", "id": "comp1"}},
            {"resource": {"resourceType": "Patient", "id": "p"}},
        ],
    }
    assert rows(ex, bundle, "ix_reference", "composition") == [("Composition", "comp1", None, None, None)]


def test_timing_events_and_bounds(ex):
    plan = {
        "resourceType": "CarePlan",
        "id": "cp",
        "status": "active",
        "intent": "plan",
        "subject": {"reference": "Patient/p1"},
        "activity": [
            {
                "detail": {
                    "status": "scheduled",
                    "scheduledTiming": {
                        "event": ["2024-02-01", "not a date"],
                        "repeat": {"boundsPeriod": {"start": "2024-03-01", "end": "2024-03-31"}},
                    },
                }
            }
        ],
    }
    assert rows(ex, plan, "ix_date", "activity-date") == [
        (ts(2024, 2, 1), ts(2024, 2, 2)),
        (ts(2024, 3, 1), ts(2024, 4, 1)),
    ]
