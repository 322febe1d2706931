"""The spec-driven validator: every rule with a valid and an invalid case, exact element paths,
real Synthea output (which must be clean), and a fuzz test that it never raises.

Run this file directly (``python tests/test_validate.py [synthea-output-dir]``) to print throughput.
"""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fhirgym.fhir._errors import Issue
from fhirgym.fhir._validate import MAX_DEPTH, Validator
from fhirgym.spec import Spec, load_spec

GENDER_VS = "http://hl7.org/fhir/ValueSet/administrative-gender"
CLINICAL = "http://terminology.hl7.org/CodeSystem/condition-clinical"

PATIENT = {
    "resourceType": "Patient",
    "id": "p1",
    "active": True,
    "name": [{"family": "Chalmers", "given": ["Peter", "James"]}],
    "gender": "male",
    "birthDate": "1974-12-25",
}
OBSERVATION = {
    "resourceType": "Observation",
    "id": "o1",
    "status": "final",
    "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
    "subject": {"reference": "Patient/p1"},
    "effectiveDateTime": "2024-01-02T10:00:00Z",
    "valueQuantity": {"value": 72, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"},
}
#: Observation without a value, so tests can supply any value[x].
OBS_BARE = {k: val for k, val in OBSERVATION.items() if k != "valueQuantity"}
APPOINTMENT = {
    "resourceType": "Appointment",
    "status": "booked",
    "start": "2025-06-02T09:00:00Z",  # a booked appointment has a start and an end (invariant app-3)
    "end": "2025-06-02T09:30:00Z",
    "participant": [{"actor": {"reference": "Patient/p1"}, "status": "accepted"}],
}
CONDITION = {
    "resourceType": "Condition",
    "clinicalStatus": {"coding": [{"system": CLINICAL, "code": "active"}]},
    "subject": {"reference": "Patient/p1"},
}


@pytest.fixture(scope="module")
def spec() -> Spec:
    return load_spec()


@pytest.fixture(scope="module")
def v(spec: Spec) -> Validator:
    return Validator(spec)


def make(base: dict, **changes: object) -> dict:
    """A deep copy of ``base`` with top-level keys replaced (a value of ... deletes the key)."""
    out = copy.deepcopy(base)
    for k, val in changes.items():
        if val is ...:
            out.pop(k, None)
        else:
            out[k] = val
    return out


def found(v: Validator, resource: object) -> list[tuple[str, str]]:
    """(code, expression) of every issue, in order."""
    issues = v.validate(resource)
    assert all(isinstance(i, Issue) and i.severity == "error" for i in issues)
    return [(i.code, i.expression[0] if i.expression else "") for i in issues]


# -- baselines --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resource", [PATIENT, OBSERVATION, APPOINTMENT, CONDITION], ids=lambda r: r["resourceType"]
)
def test_valid_baselines(v: Validator, resource: dict) -> None:
    assert v.validate(resource) == []


# -- resourceType -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "code", "fragment"),
    [
        ({"id": "x"}, "required", "missing resourceType"),
        ({"resourceType": "Foo"}, "structure", "'Foo' is not a known R4 resource type"),
        ({"resourceType": "DomainResource"}, "structure", "not a known R4 resource type"),
        ({"resourceType": 7}, "structure", "resourceType must be a string"),
        ([PATIENT], "structure", "expected a resource (JSON object), got array"),
        ("Patient", "structure", "got string 'Patient'"),
        (None, "structure", "got null"),
    ],
)
def test_resource_type(v: Validator, resource: object, code: str, fragment: str) -> None:
    issues = v.validate(resource)
    assert [(i.code, i.expression) for i in issues] == [(code, ())]
    assert fragment in issues[0].diagnostics


# -- unknown elements -------------------------------------------------------------------------------


def test_unknown_element(v: Validator) -> None:
    issues = v.validate(make(PATIENT, foo=1))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Patient.foo",))]
    assert issues[0].diagnostics == "Unknown element 'foo' in Patient"


def test_unknown_nested_element(v: Validator) -> None:
    res = make(PATIENT, name=[{"family": "X"}, {"family": "Y", "nickname": "Z"}])
    issues = v.validate(res)
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Patient.name[1].nickname",))]
    assert issues[0].diagnostics == "Unknown element 'nickname' in Patient.name[1]"


def test_modifier_extensions_are_refused_as_not_understood(v: Validator) -> None:
    ext = [{"url": "http://example.org/reverses-meaning", "valueBoolean": True}]
    assert found(v, make(PATIENT, modifierExtension=ext)) == [("not-supported", "Patient.modifierExtension[0]")]
    nested = make(PATIENT, contact=[{"name": {"family": "X"}, "modifierExtension": ext}])
    assert found(v, nested) == [("not-supported", "Patient.contact[0].modifierExtension[0]")]
    assert found(v, make(PATIENT, extension=ext)) == []  # a plain extension may be ignored


def test_a_server_answers_an_unknown_modifier_extension_with_422() -> None:
    from fhirgym.fhir import FhirServer, InProcessClient, Store

    client = InProcessClient(FhirServer(Store()))
    resp = client.create({"resourceType": "Patient", "modifierExtension": [
        {"url": "http://example.org/reverses-meaning", "valueBoolean": True}]})
    assert resp.status == 422 and resp.body["resourceType"] == "OperationOutcome"
    assert resp.body["issue"][0]["code"] == "not-supported"


def test_resource_type_key_only_at_resource_root(v: Validator) -> None:
    assert found(v, make(PATIENT, name=[{"family": "X", "resourceType": "HumanName"}])) == [
        ("structure", "Patient.name[0].resourceType")
    ]


def test_fhir_comments_ignored(v: Validator) -> None:
    res = make(PATIENT, fhir_comments=["top"], name=[{"family": "X", "fhir_comments": ["nested"]}])
    assert v.validate(res) == []


# -- cardinality and JSON shape ---------------------------------------------------------------------


def test_appointment_without_participant(v: Validator) -> None:
    issues = v.validate(make(APPOINTMENT, participant=...))
    assert [(i.code, i.expression) for i in issues] == [("required", ("Appointment.participant",))]
    assert issues[0].diagnostics == "Appointment: missing required element 'participant'"


def test_missing_required_in_backbone_and_choice(v: Validator) -> None:
    res = make(APPOINTMENT, participant=[{"actor": {"reference": "Patient/p1"}}])
    assert found(v, res) == [("required", "Appointment.participant[0].status")]
    # MedicationRequest.medication[x] is 1..1: any of its type keys satisfies it.
    mr = {
        "resourceType": "MedicationRequest",
        "status": "active",
        "intent": "order",
        "subject": {"reference": "Patient/1"},
    }
    issues = v.validate(mr)
    assert [(i.code, i.expression) for i in issues] == [("required", ("MedicationRequest.medication",))]
    assert "'medication[x]'" in issues[0].diagnostics
    assert v.validate({**mr, "medicationCodeableConcept": {"text": "aspirin"}}) == []


def test_required_primitive_satisfied_by_extension_only(v: Validator) -> None:
    absent = {
        "extension": [
            {"url": "http://hl7.org/fhir/StructureDefinition/data-absent-reason", "valueCode": "unknown"}
        ]
    }
    assert v.validate(make(OBSERVATION, status=..., _status=absent)) == []
    assert found(v, make(OBSERVATION, status=...)) == [("required", "Observation.status")]


def test_single_element_given_as_array(v: Validator) -> None:
    issues = v.validate(make(PATIENT, gender=["male"]))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Patient.gender",))]
    assert "at most one value" in issues[0].diagnostics


def test_repeating_element_given_as_single_value(v: Validator) -> None:
    # Reported, and the value inside is still checked.
    assert found(v, make(PATIENT, name={"family": "X", "given": "Y"})) == [
        ("structure", "Patient.name"),
        ("structure", "Patient.name.given"),
    ]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"meta": {}}, [("structure", "Patient.meta")]),
        ({"telecom": []}, [("structure", "Patient.telecom")]),
        ({"birthDate": None}, [("structure", "Patient.birthDate")]),
        ({"name": [None]}, [("structure", "Patient.name[0]")]),
        ({"name": [{"given": ["A", None]}]}, [("structure", "Patient.name[0].given[1]")]),
        ({"managingOrganization": None}, [("structure", "Patient.managingOrganization")]),
    ],
)
def test_empty_and_null_values(v: Validator, changes: dict, expected: list) -> None:
    assert found(v, make(PATIENT, **changes)) == expected


def test_object_where_primitive_expected_and_vice_versa(v: Validator) -> None:
    assert found(v, make(PATIENT, birthDate={"value": "1974"})) == [("value", "Patient.birthDate")]
    issues = v.validate(make(PATIENT, managingOrganization="Organization/1"))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Patient.managingOrganization",))]
    assert "expected an object (Reference), got string" in issues[0].diagnostics


# -- primitives -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "key", "good", "bad"),
    [
        (PATIENT, "active", [True, False], ["true", 1, None]),
        (
            PATIENT,
            "birthDate",
            ["1974-12-25", "1974", "1974-02", "2024-02-29"],
            ["1974-13-45", "2023-02-30", "2023-02-29", "1974-1-5", "", 19741225],
        ),
        (
            OBSERVATION,
            "effectiveDateTime",
            ["2024-01-02", "2024-01-31T23:59:60.5+14:00"],
            ["2024-01-02T10:00", "2024-01-02T10:00:00", "2023-04-31", "2024-01-02 10:00:00Z"],
        ),
        (OBSERVATION, "issued", ["2024-01-02T10:00:00.123Z"], ["2024-01-02", "2024-06-31T10:00:00Z"]),
        (OBS_BARE, "valueTime", ["10:00:00", "23:59:59.999"], ["25:00:00", "10:00"]),
        (OBS_BARE, "valueInteger", [0, -(2**31), 2**31 - 1], [2**31, -(2**31) - 1, 1.5, 1.0, True, "5"]),
        (APPOINTMENT, "minutesDuration", [1, 15], [0, -5, 2**31, "15"]),
        (APPOINTMENT, "priority", [0, 9], [-1, 2**31, False]),
        (OBS_BARE, "valueString", ["x", " padded "], ["", "   ", "\n", "a\x0bb", 5]),
        (PATIENT, "id", ["p-1.2", "A" * 64], ["p_1", "A" * 65, "", "has space"]),
        (PATIENT, "implicitRules", ["http://example.org/rules", "urn:x"], ["has space", ""]),
        (PATIENT, "language", ["en-US", "a b"], [" en", "en ", "a  b", ""]),
    ],
    ids=lambda x: x["resourceType"] if isinstance(x, dict) else None,
)
def test_primitive_formats(v: Validator, base: dict, key: str, good: list, bad: list) -> None:
    for value in good:
        assert v.validate(make(base, **{key: value})) == [], value
    for value in bad:
        issues = found(v, make(base, **{key: value}))
        expected_code = "structure" if value is None else "value"
        assert issues == [(expected_code, f"{base['resourceType']}.{key}")], value


def test_decimal_must_be_json_number(v: Validator) -> None:
    for good in (72, 72.5, -0.001, 1e-3):
        assert v.validate(make(OBSERVATION, valueQuantity={"value": good})) == []
    for bad in ("72.5", float("nan"), float("inf"), True):
        assert found(v, make(OBSERVATION, valueQuantity={"value": bad})) == [
            ("value", "Observation.valueQuantity.value")
        ]


def test_string_values_in_nested_arrays(v: Validator) -> None:
    issues = v.validate(make(PATIENT, name=[{"family": "X"}, {"given": ["A", " "]}]))
    assert [(i.code, i.expression) for i in issues] == [("value", ("Patient.name[1].given[1]",))]
    assert "at least one non-whitespace character" in issues[0].diagnostics


def test_calendar_message(v: Validator) -> None:
    issues = v.validate(make(PATIENT, birthDate="1974-13-45"))
    assert [(i.code, i.expression) for i in issues] == [("value", ("Patient.birthDate",))]
    assert issues[0].diagnostics == "Patient.birthDate: '1974-13-45' is not a valid date"
    issues = v.validate(make(PATIENT, birthDate="2023-02-30"))
    assert (
        issues[0].diagnostics == "Patient.birthDate: '2023-02-30' is not a valid date (no such calendar day)"
    )


def test_string_type_wrong_json_type_message(v: Validator) -> None:
    issues = v.validate(make(PATIENT, active="true"))
    assert issues[0].diagnostics == "Patient.active: expected a JSON boolean, got string 'true'"


def test_cached_valid_strings_are_per_type(v: Validator) -> None:
    # "2023-02-30" is a fine string; being remembered as one must not make it a valid date.
    res = make(PATIENT, name=[{"family": "2023-02-30"}], birthDate="2023-02-30")
    assert found(v, res) == [("value", "Patient.birthDate")]
    assert found(v, res) == [("value", "Patient.birthDate")]


def test_base64_and_xhtml(v: Validator) -> None:
    good = make(PATIENT, photo=[{"contentType": "image/png", "data": "aGVsbG8gd29ybGQ="}])
    assert v.validate(good) == []
    assert v.validate(make(PATIENT, photo=[{"contentType": "image/png", "data": "aGVs\nbG8g\r\nd29y bGQ="}])) == []
    # data without a contentType breaks invariant att-1
    assert found(v, make(PATIENT, photo=[{"data": "aGVsbG8="}])) == [("invariant", "Patient.photo[0]")]
    assert found(v, make(PATIENT, photo=[{"contentType": "image/png", "data": "abc"}])) == [
        ("value", "Patient.photo[0].data")]
    # A pathological non-match must not backtrack for ages.
    start = time.perf_counter()
    assert found(v, make(PATIENT, photo=[{"contentType": "image/png", "data": "AAAA " * 2000 + "!"}])) == [
        ("value", "Patient.photo[0].data")
    ]
    assert time.perf_counter() - start < 1.0
    text = {"status": "generated", "div": '<div xmlns="http://www.w3.org/1999/xhtml">Hi</div>'}
    assert v.validate(make(PATIENT, text=text)) == []
    assert found(v, make(PATIENT, text={**text, "div": "Hi"})) == [("value", "Patient.text.div")]
    assert found(v, make(PATIENT, text={"status": "generated"})) == [("required", "Patient.text.div")]


# -- choice types -----------------------------------------------------------------------------------


def test_choice_types(v: Validator) -> None:
    assert v.validate(make(OBSERVATION, valueQuantity=..., valueCodeableConcept={"text": "high"})) == []
    issues = v.validate(make(OBSERVATION, valueQuantity=..., valueFoo=1))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Observation.valueFoo",))]
    assert issues[0].diagnostics.startswith(
        "Unknown element 'valueFoo' in Observation ('Foo' is not an allowed type"
    )
    issues = v.validate(make(OBSERVATION, valueQuantity=..., value=1))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Observation.value",))]
    assert "needs a type suffix" in issues[0].diagnostics
    # valueAddress is a real FHIR type but not one Observation.value[x] allows.
    assert found(v, make(OBSERVATION, valueQuantity=..., valueAddress={"city": "X"})) == [
        ("structure", "Observation.valueAddress")
    ]


def test_two_choices_of_one_element(v: Validator) -> None:
    issues = v.validate(make(OBSERVATION, valueString="72"))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Observation.valueString",))]
    assert issues[0].diagnostics == (
        "Observation.valueString: value[x] is given twice, as 'valueQuantity' and 'valueString'"
    )
    ext = {"extension": [{"url": "http://example.org/x", "valueBoolean": True}]}
    assert found(v, make(OBSERVATION, _valueString=ext)) == [("structure", "Observation.valueString")]
    # A primitive choice and its own extensions are one value, not two.
    assert v.validate(make(OBSERVATION, valueQuantity=..., valueString="72", _valueString=ext)) == []


# -- primitive extensions ---------------------------------------------------------------------------

EXT = {"url": "http://example.org/fhir/StructureDefinition/note", "valueString": "approximate"}


def test_primitive_extension_single(v: Validator) -> None:
    assert v.validate(make(PATIENT, _birthDate={"id": "b1", "extension": [EXT]})) == []
    assert v.validate(make(PATIENT, birthDate=..., _birthDate={"extension": [EXT]})) == []
    assert found(v, make(PATIENT, _birthDate=[{"extension": [EXT]}])) == [("structure", "Patient.birthDate")]
    assert found(v, make(PATIENT, _birthDate={"extension": [EXT], "value": "x"})) == [
        ("structure", "Patient.birthDate.value")
    ]
    assert found(v, make(PATIENT, _birthDate={"extension": [{"url": "http://x"}]})) == [
        ("structure", "Patient.birthDate.extension[0]")
    ]
    assert found(v, make(PATIENT, _birthDate={})) == [("structure", "Patient.birthDate")]
    assert found(v, make(PATIENT, _birthDate=None)) == [("structure", "Patient.birthDate")]


def test_primitive_extension_only_for_primitives(v: Validator) -> None:
    assert found(v, make(PATIENT, _name={"extension": [EXT]})) == [("structure", "Patient._name")]


def test_primitive_extension_arrays(v: Validator) -> None:
    ok = {"given": ["Peter", None], "_given": [None, {"extension": [EXT]}]}
    assert v.validate(make(PATIENT, name=[ok])) == []
    assert v.validate(make(PATIENT, name=[{"_given": [{"extension": [EXT]}]}])) == []
    assert found(v, make(PATIENT, name=[{"given": ["A", "B"], "_given": [None]}])) == [
        ("structure", "Patient.name[0].given")
    ]
    assert found(v, make(PATIENT, name=[{"given": ["A"], "_given": {"extension": [EXT]}}])) == [
        ("structure", "Patient.name[0].given")
    ]
    assert found(v, make(PATIENT, name=[{"given": [None, "B"], "_given": [None, None]}])) == [
        ("structure", "Patient.name[0].given[0]"),
        ("structure", "Patient.name[0].given[0]"),
    ]
    assert found(
        v, make(PATIENT, name=[{"given": ["A"], "_given": [{"extension": [{"url": "u", "valueFoo": 1}]}]}])
    ) == [
        ("structure", "Patient.name[0].given[0].extension[0].valueFoo"),
        ("structure", "Patient.name[0].given[0].extension[0]"),
    ]


# -- extensions -------------------------------------------------------------------------------------


def test_extension_structure(v: Validator) -> None:
    nested = {"url": "http://example.org/complex", "extension": [{"url": "part", "valueCode": "a"}]}
    assert v.validate(make(PATIENT, extension=[EXT, nested])) == []
    assert found(v, make(PATIENT, extension=[{"valueString": "x"}])) == [
        ("required", "Patient.extension[0].url")
    ]
    both = {"url": "http://x", "valueString": "x", "extension": [EXT]}
    issues = v.validate(make(PATIENT, extension=[EXT, both]))
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Patient.extension[1]",))]
    assert "either value[x] or nested extensions, not both" in issues[0].diagnostics
    assert found(v, make(PATIENT, modifierExtension=[{"url": "http://x"}])) == [
        ("structure", "Patient.modifierExtension[0]"), ("not-supported", "Patient.modifierExtension[0]")
    ]
    assert found(v, make(PATIENT, extension=[{"url": "http://x", "valueInteger": "1"}])) == [
        ("value", "Patient.extension[0].valueInteger")
    ]
    assert found(v, make(PATIENT, extension=EXT)) == [("structure", "Patient.extension")]


# -- nested resources -------------------------------------------------------------------------------


def test_valid_contained_resource(v: Validator) -> None:
    res = make(
        PATIENT,
        contained=[{"resourceType": "Organization", "id": "org1", "name": "Acme"}],
        managingOrganization={"reference": "#org1"},
    )
    assert v.validate(res) == []


def test_invalid_contained_resource(v: Validator) -> None:
    res = make(PATIENT, contained=[{"resourceType": "Practitioner", "id": "d", "gender": "robot"}, {"name": "no type"}],
               generalPractitioner=[{"reference": "#d"}])
    assert found(v, res) == [
        ("code-invalid", "Patient.contained[0].gender"),
        ("required", "Patient.contained[1]"),
    ]


def test_local_references_resolve_to_contained_resources(v: Validator) -> None:
    org = {"resourceType": "Organization", "id": "org1", "name": "Acme"}
    assert found(v, make(PATIENT, managingOrganization={"reference": "#org2"}, contained=[org],
                         generalPractitioner=[{"reference": "#org1"}])) == [
        ("not-found", "Patient.managingOrganization.reference")]
    # without any contained resource, and inside a contained resource (resolved by the container)
    assert found(v, make(PATIENT, managingOrganization={"reference": "#org1"})) == [
        ("not-found", "Patient.managingOrganization.reference")]
    pract = {"resourceType": "PractitionerRole", "id": "r", "organization": {"reference": "#nope"}}
    assert found(v, make(PATIENT, contained=[pract], generalPractitioner=[{"reference": "#r"}])) == [
        ("not-found", "Patient.contained[0].organization.reference")]
    pract["organization"] = {"reference": "#org1"}  # one contained resource referring to another
    assert v.validate(make(PATIENT, contained=[pract, org], generalPractitioner=[{"reference": "#r"}])) == []
    # "#" alone is the container itself; a Bundle entry is a container of its own
    assert v.validate(make(PATIENT, contained=[{"resourceType": "Provenance", "id": "p", "recorded": "2020-01-01T00:00:00Z",
                                                "agent": [{"who": {"display": "x"}}], "target": [{"reference": "#"}]}])) == []
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [
        {"fullUrl": "urn:uuid:3f0c3f5e-2b4a-4d7e-9a39-6f4f1f7b2c11",
         "resource": make(PATIENT, contained=[org], managingOrganization={"reference": "#org1"})},
        {"fullUrl": "urn:uuid:3f0c3f5e-2b4a-4d7e-9a39-6f4f1f7b2c12",
         "resource": make(PATIENT, managingOrganization={"reference": "#org1"})}]}
    assert found(v, bundle) == [("not-found", "Bundle.entry[1].resource.managingOrganization.reference")]


def test_contained_resource_invariants(v: Validator) -> None:
    org = {"resourceType": "Organization", "id": "org1", "name": "Acme"}
    ref = {"managingOrganization": {"reference": "#org1"}}
    # dom-3: referred to from the container (a canonical "#id" counts too), else an error
    assert found(v, make(PATIENT, contained=[org])) == [("invariant", "Patient.contained[0]")]
    assert found(v, make(PATIENT, contained=[{k: x for k, x in org.items() if k != "id"}])) == [
        ("invariant", "Patient.contained[0]")]
    q = {"resourceType": "Questionnaire", "status": "active", "contained": [
        {"resourceType": "ValueSet", "id": "vs", "status": "active"}],
        "item": [{"linkId": "1", "type": "choice", "answerValueSet": "#vs"}]}
    assert v.validate(q) == []
    # dom-2, dom-4, dom-5 and unique ids
    nested = dict(org, contained=[{"resourceType": "Organization", "id": "x"}])
    assert ("invariant", "Patient.contained[0].contained") in found(v, make(PATIENT, contained=[nested], **ref))
    versioned = dict(org, meta={"versionId": "1", "lastUpdated": "2020-01-01T00:00:00Z",
                                "security": [{"system": "http://x", "code": "R"}]})
    assert found(v, make(PATIENT, contained=[versioned], **ref)) == [
        ("invariant", "Patient.contained[0].meta.versionId"),
        ("invariant", "Patient.contained[0].meta.lastUpdated"),
        ("invariant", "Patient.contained[0].meta.security"),
    ]
    assert found(v, make(PATIENT, contained=[org, dict(org, name="Other")], **ref)) == [
        ("structure", "Patient.contained[1].id")]


def test_bundle_with_invalid_entry_resource(v: Validator) -> None:
    bundle = {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [
            {"fullUrl": "urn:uuid:3f0c3f5e-2b4a-4d7e-9a39-6f4f1f7b2c11", "resource": PATIENT},
            {"resource": make(APPOINTMENT, status="confirmed")},
        ],
    }
    issues = v.validate(bundle)
    assert [(i.code, i.expression) for i in issues] == [
        ("code-invalid", ("Bundle.entry[1].resource.status",))
    ]
    assert "appointmentstatus" in issues[0].diagnostics
    bundle["entry"][0]["resource"] = "Patient/1"
    assert found(v, bundle)[0] == ("structure", "Bundle.entry[0].resource")


def test_parameters_resource(v: Validator) -> None:
    params = {"resourceType": "Parameters", "parameter": [{"name": "p", "resource": PATIENT}]}
    assert v.validate(params) == []
    params["parameter"][0]["resource"] = make(PATIENT, foo=1)
    assert found(v, params) == [("structure", "Parameters.parameter[0].resource.foo")]


# -- required bindings ------------------------------------------------------------------------------


def test_gender_robot(v: Validator) -> None:
    issues = v.validate(make(PATIENT, gender="robot"))
    assert [(i.code, i.expression) for i in issues] == [("code-invalid", ("Patient.gender",))]
    assert issues[0].diagnostics == f"Patient.gender: 'robot' is not in required ValueSet {GENDER_VS}"


def test_appointment_status_confirmed(v: Validator) -> None:
    assert found(v, make(APPOINTMENT, status="confirmed")) == [("code-invalid", "Appointment.status")]
    assert v.validate(make(APPOINTMENT, status="fulfilled")) == []


def test_code_binding_in_backbone_and_datatype(v: Validator) -> None:
    assert found(
        v, make(APPOINTMENT, participant=[{"actor": {"reference": "Patient/1"}, "status": "maybe"}])
    ) == [("code-invalid", "Appointment.participant[0].status")]
    assert found(v, make(PATIENT, name=[{"use": "nickname"}, {"use": "alias"}])) == [
        ("code-invalid", "Patient.name[1].use")
    ]


def test_codeable_concept_binding(v: Validator) -> None:
    bogus = {"system": CLINICAL, "code": "bogus"}
    issues = v.validate(make(CONDITION, clinicalStatus={"coding": [bogus]}))
    assert [(i.code, i.expression) for i in issues] == [
        ("code-invalid", ("Condition.clinicalStatus.coding",))
    ]
    assert f"{CLINICAL}|bogus" in issues[0].diagnostics
    # The right code from the wrong system is still wrong.
    assert found(
        v, make(CONDITION, clinicalStatus={"coding": [{"system": "http://x", "code": "active"}]})
    ) == [("code-invalid", "Condition.clinicalStatus.coding")]
    # One matching coding is enough; text alone is not checked.
    assert (
        v.validate(
            make(CONDITION, clinicalStatus={"coding": [bogus, {"system": CLINICAL, "code": "resolved"}]})
        )
        == []
    )
    assert v.validate(make(CONDITION, clinicalStatus={"text": "active"})) == []


def test_coding_binding(spec: Spec) -> None:
    # No R4 core element binds a bare Coding as required, so bind Encounter.class to a known set.
    encounter = dict(spec.children["Encounter"])
    encounter["class"] = dataclasses.replace(
        encounter["class"], binding_strength="required", binding_valueset=GENDER_VS
    )
    patched = copy.copy(spec)
    patched.children = {**spec.children, "Encounter": encounter}
    v = Validator(patched)
    enc = {"resourceType": "Encounter", "status": "finished"}
    gender_system = "http://hl7.org/fhir/administrative-gender"
    assert v.validate({**enc, "class": {"system": gender_system, "code": "female"}}) == []
    assert v.validate({**enc, "class": {"code": "female"}}) == []
    issues = v.validate({**enc, "class": {"system": "http://x", "code": "female"}})
    assert [(i.code, i.expression) for i in issues] == [("code-invalid", ("Encounter.class",))]
    assert "http://x|female" in issues[0].diagnostics
    assert found(v, {**enc, "class": {"code": "robot"}}) == [("code-invalid", "Encounter.class")]


def test_value_sets_that_cannot_be_enumerated_are_skipped(v: Validator, spec: Spec) -> None:
    assert spec.valueset_codes("http://hl7.org/fhir/ValueSet/mimetypes") is None
    assert v.validate(make(PATIENT, photo=[{"contentType": "made/up", "url": "http://x/p.png"}])) == []


# -- references -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "Patient/p1",
        "Patient/p1/_history/2",
        "Group/g.1",
        "http://example.org/fhir/Patient/123",
        "http://example.org/fhir/Patient/123/_history/1",
        "https://example.org/anything?x=1",
        "urn:uuid:3f0c3f5e-2b4a-4d7e-9a39-6f4f1f7b2c11",
        "urn:oid:1.2.840.113619",
        "Patient?identifier=http://hospital.org|123",
    ],
)
def test_valid_references(v: Validator, ref: str) -> None:
    assert v.validate(make(OBSERVATION, subject={"reference": ref})) == []


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        (
            "Medication/m1",
            "a reference to Medication is not allowed here (allowed: Device, Group, Location, Patient)",
        ),
        ("http://example.org/fhir/Medication/m1", "a reference to Medication is not allowed here"),
        ("Medication?code=123", "a reference to Medication is not allowed here"),
        ("patient/p1", "is not a valid reference"),
        ("Patient/p_1", "is not a valid reference"),
        ("Patient/" + "a" * 65, "is not a valid reference"),
        ("Patient", "is not a valid reference"),
        ("Foo/1", "refers to unknown resource type 'Foo'"),
        ("urn:uuid:not-a-uuid", "not a valid urn:uuid: or urn:oid: reference"),
        ("urn:oid:abc", "not a valid urn:uuid: or urn:oid: reference"),
        ("urn:isbn:123", "not a valid urn:uuid: or urn:oid: reference"),
        ("#bad id", "not a valid local reference"),
    ],
)
def test_invalid_references(v: Validator, ref: str, fragment: str) -> None:
    issues = v.validate(make(OBSERVATION, subject={"reference": ref}))
    assert [(i.code, i.expression) for i in issues] == [("value", ("Observation.subject.reference",))]
    assert fragment in issues[0].diagnostics


def test_reference_targets_in_repeating_and_any_typed_elements(v: Validator) -> None:
    assert found(
        v, make(OBSERVATION, performer=[{"reference": "Practitioner/1"}, {"reference": "Medication/1"}])
    ) == [("value", "Observation.performer[1].reference")]
    # Extension.valueReference may point anywhere.
    assert (
        v.validate(
            make(PATIENT, extension=[{"url": "http://x", "valueReference": {"reference": "Medication/1"}}])
        )
        == []
    )
    # A bad reference is reported every time, not only before it is cached.
    for _ in range(2):
        assert found(v, make(OBSERVATION, subject={"reference": "Medication/m1"})) == [
            ("value", "Observation.subject.reference")
        ]


# -- robustness -------------------------------------------------------------------------------------


def test_deep_nesting_is_refused_not_crashed(v: Validator) -> None:
    ext: dict = {"url": "http://x", "valueString": "leaf"}
    for _ in range(MAX_DEPTH + 50):
        ext = {"url": "http://x", "extension": [ext]}
    issues = v.validate(make(PATIENT, extension=[ext]))
    assert [i.code for i in issues] == ["structure"]
    assert f"nested deeper than {MAX_DEPTH} levels" in issues[0].diagnostics
    # The slower paths (a repeating element given as an object, nested resources) too.
    slow: dict = {"url": "http://x", "valueString": "leaf"}
    for _ in range(MAX_DEPTH + 50):
        slow = {"url": "http://x", "extension": slow}
    res: dict = {"resourceType": "Patient"}
    for _ in range(MAX_DEPTH + 50):
        res = {"resourceType": "Patient", "contained": [res]}
    for deep in (make(PATIENT, extension=slow), res):
        issues = v.validate(deep)
        assert issues and all(i.code in ("structure", "invariant") for i in issues)
        assert any(f"nested deeper than {MAX_DEPTH} levels" in i.diagnostics for i in issues)


def test_non_string_keys_do_not_crash(v: Validator) -> None:
    issues = v.validate({"resourceType": "Patient", 1: "x"})
    assert [(i.code, i.expression) for i in issues] == [("structure", ("Patient.1",))]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "resourceType",
                    "id",
                    "name",
                    "given",
                    "_given",
                    "extension",
                    "url",
                    "valueString",
                    "valueQuantity",
                    "value",
                    "_birthDate",
                    "birthDate",
                    "gender",
                    "contained",
                    "entry",
                    "resource",
                    "reference",
                    "coding",
                    "system",
                    "code",
                    "status",
                    "subject",
                    "participant",
                    "actor",
                    "text",
                    "div",
                    "fhir_comments",
                ]
            )
            | st.text(max_size=8),
            children,
            max_size=5,
        )
    ),
    max_leaves=40,
)
resource_types = st.sampled_from(
    ["Patient", "Observation", "Bundle", "Appointment", "Condition", "Parameters", "Foo"]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values)
def test_fuzz_never_raises(v: Validator, value: object) -> None:
    issues = v.validate(value)
    assert isinstance(issues, list)
    assert all(isinstance(i, Issue) and i.code != "exception" for i in issues)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rt=resource_types,
    body=st.dictionaries(
        st.text(max_size=8) | st.sampled_from(list(PATIENT) + list(OBSERVATION)), json_values, max_size=6
    ),
)
def test_fuzz_resources_never_raise(v: Validator, rt: str, body: dict) -> None:
    issues = v.validate({**body, "resourceType": rt})
    assert all(isinstance(i, Issue) and i.code != "exception" for i in issues)
    assert all(i.expression and i.expression[0].split(".")[0] == rt for i in issues if rt != "Foo")


# -- real data --------------------------------------------------------------------------------------


def _synthea_executable() -> Path:
    return Path(sys.executable).with_name("synthea")


@pytest.fixture(scope="module")
def synthea_bundles(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    exe = _synthea_executable()
    if not exe.exists():
        pytest.skip(f"synthea is not installed at {exe} (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("synthea")
    cmd = [str(exe), "-s", "42", "-p", "1", "-r", "20250101", "-o", str(out), "Massachusetts"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    bundles = [orjson.loads(p.read_bytes()) for p in sorted((out / "fhir").glob("*.json"))]
    assert bundles, f"synthea wrote nothing to {out}"
    return bundles


def test_synthea_resources_are_valid(v: Validator, synthea_bundles: list[dict]) -> None:
    problems = []
    count = 0
    for bundle in synthea_bundles:
        for entry in bundle["entry"]:
            count += 1
            problems += [i.diagnostics for i in v.validate(entry["resource"])]
    assert count > 100
    assert problems == []


def test_synthea_bundles_are_valid(v: Validator, synthea_bundles: list[dict]) -> None:
    for bundle in synthea_bundles:
        assert v.validate(bundle) == []


def test_synthea_mutation_is_caught(v: Validator, synthea_bundles: list[dict]) -> None:
    entries = synthea_bundles[0]["entry"]
    obs = next(e["resource"] for e in entries if e["resource"]["resourceType"] == "Observation")
    broken = make(
        obs, status="done", effectiveDateTime="2023-02-30T10:00:00Z", valueQuantity=..., valueBoolean="yes"
    )
    assert found(v, broken) == [
        ("code-invalid", "Observation.status"),
        ("value", "Observation.effectiveDateTime"),
        ("value", "Observation.valueBoolean"),
    ]
