"""The fhirpathpy fallback: the parameters it serves, and that it leaves the resource alone."""

from __future__ import annotations

import copy

from _extract_cases import PATIENT, rows, ts


def test_patient_deceased_uses_the_fhirpath_fallback(ex):
    assert not ex.plan_info("Patient")[0].count("deceased")
    assert "deceased" in ex.plan_info("Patient")[1]
    assert rows(ex, {**PATIENT, "deceasedDateTime": "2020-01-01"}, "ix_token", "deceased") == [
        (None, "true", None)
    ]
    assert rows(ex, {**PATIENT, "deceasedBoolean": False}, "ix_token", "deceased") == [(None, "false", None)]
    assert rows(ex, {**PATIENT, "deceasedDateTime": "2020-01-01"}, "ix_date", "death-date") == [
        (ts(2020, 1, 1), ts(2020, 1, 2))
    ]


def test_fallback_does_not_modify_the_resource(ex):
    patient = copy.deepcopy({**PATIENT, "deceasedDateTime": "2020-01-01T10:00:00Z"})
    before = copy.deepcopy(patient)
    ex.extract(patient)
    assert patient == before


def test_has_extension_filter_matches_fhirpathpy(ex):
    is_subject = "http://hl7.org/fhir/StructureDefinition/questionnaireresponse-isSubject"
    qr = {
        "resourceType": "QuestionnaireResponse",
        "id": "qr1",
        "status": "completed",
        "item": [
            {
                "linkId": "1",
                "extension": [{"url": is_subject, "valueBoolean": True}],
                "answer": [{"valueReference": {"reference": "Patient/p1"}}],
            },
            {"linkId": "2", "answer": [{"valueReference": {"reference": "Patient/p2"}}]},
        ],
    }
    expected = [("Patient", "p1", "Patient/p1", None, None)]
    assert rows(ex, qr, "ix_reference", "item-subject") == expected
    assert ex.evaluate(qr, codes=["item-subject"], use_fhirpath=True) == {"item-subject": expected}
