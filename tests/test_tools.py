"""Agent tools in process: the six FHIR CRUD tools and the four FHIR R4 spec tools.

What an agent relies on: happy paths work on an empty store and on the small world, every failure is a
structured result (HTTP status + OperationOutcome issues with their expressions), never an exception,
and outputs stay within the budget with an explicit note of what was left out and how to get it.
"""

from __future__ import annotations

import orjson
import pytest

from fhirgym.fhir import FhirServer, HttpClient, InProcessClient, Snapshot, Store
from fhirgym.tools import (
    DEFAULT_BUDGET,
    FHIR_TOOLS,
    SPEC_TOOLS,
    Toolbox,
    ToolContext,
)


def _size(output: object) -> int:
    return len(orjson.dumps(output, default=str))


@pytest.fixture()
def box() -> Toolbox:
    """FHIR tools on a new, empty in-memory server."""
    return Toolbox(FHIR_TOOLS, ToolContext(InProcessClient(FhirServer(Store()))))


@pytest.fixture(scope="module")
def world_snapshot(small_world_path) -> Snapshot:
    return Snapshot(small_world_path)


@pytest.fixture()
def world_box(world_snapshot) -> Toolbox:
    """FHIR tools on an isolated copy of the 10-patient world (writes vanish with the store)."""
    store = world_snapshot.open()
    yield Toolbox(FHIR_TOOLS, ToolContext(InProcessClient(FhirServer(store), world_snapshot)))
    store.close()


@pytest.fixture(scope="module")
def specs() -> Toolbox:
    return Toolbox(SPEC_TOOLS, ToolContext())


def ok(box: Toolbox, name: str, args: dict | None = None) -> dict:
    call = box.call(name, args or {})
    assert call.error is None, call.output
    return call.output


def err(box: Toolbox, name: str, args: dict | None = None) -> dict:
    call = box.call(name, args or {})
    assert call.error, call.output
    assert set(call.output) == {"error"}
    return call.output["error"]


# -- FHIR tools: happy paths ------------------------------------------------------------------------


def test_crud_round_trip_on_an_empty_store(box):
    assert "Patient" in ok(box, "listResourceTypes")["resourceTypes"]
    created = ok(box, "createResource", {"resourceType": "Patient",
                                         "body": {"name": [{"family": "Diaz", "given": ["Ana"]}]}})
    assert created["status"] == 201 and created["versionId"] == "1"
    pid = created["id"]
    read = ok(box, "getResourceById", {"resourceType": "Patient", "resourceId": pid})
    assert read["name"][0]["family"] == "Diaz"

    read["gender"] = "female"
    updated = ok(box, "updateResource", {"resourceType": "Patient", "resourceId": pid, "body": read,
                                         "ifMatchVersion": 1})
    assert updated["status"] == 200 and updated["versionId"] == "2"

    found = ok(box, "searchResources", {"resourceType": "Patient",
                                        "params": {"family": "diaz", "gender": "female"}})
    assert found["total"] == 1 and found["resources"][0]["id"] == pid and "omitted" not in found

    deleted = ok(box, "deleteResource", {"resourceType": "Patient", "resourceId": pid})
    assert deleted["deleted"] == f"Patient/{pid}"
    assert err(box, "getResourceById", {"resourceType": "Patient", "resourceId": pid})["status"] == 410

    assert [c.name for c in box.calls][:2] == ["listResourceTypes", "createResource"]
    assert all(c.ms >= 0 for c in box.calls) and box.calls[1].resource_type == "Patient"


def test_conditional_create_and_search_on_the_world(world_box):
    patients = ok(world_box, "searchResources", {"resourceType": "Patient", "params": {"_count": 3}})
    assert patients["total"] >= 10 and len(patients["resources"]) == 3 and "next_page_url" in patients
    assert all("text" not in p for p in patients["resources"])  # narratives are stripped
    pid = patients["resources"][0]["id"]

    obs = ok(world_box, "searchResources", {"resourceType": "Observation",
                                            "params": {"subject": f"Patient/{pid}", "_count": 2}})
    assert obs["total"] > 0 and all(o["subject"]["reference"] == f"Patient/{pid}" for o in obs["resources"])

    body = {"identifier": [{"system": "http://example.org/mrn", "value": "tool-test-1"}], "active": True}
    first = ok(world_box, "createResource", {"resourceType": "Patient", "body": body,
                                             "ifNoneExist": "identifier=http://example.org/mrn|tool-test-1"})
    again = ok(world_box, "createResource", {"resourceType": "Patient", "body": body,
                                             "ifNoneExist": "identifier=http://example.org/mrn|tool-test-1"})
    assert first["status"] == 201 and again["status"] == 200 and again["id"] == first["id"]


# -- FHIR tools: errors are results -----------------------------------------------------------------


def test_invalid_body_comes_back_with_status_and_issue_expressions(box):
    body = {"gender": "x", "birthDate": "1990-13-01"}
    e = err(box, "createResource", {"resourceType": "Patient", "body": body})
    assert e["status"] in (400, 422)
    assert {tuple(i["expression"]) for i in e["issues"]} == {("Patient.gender",), ("Patient.birthDate",)}
    assert all(i["severity"] == "error" and i["diagnostics"] for i in e["issues"])


def test_bad_json_and_mismatched_bodies(box):
    assert "body" in err(box, "createResource", {"resourceType": "Patient", "body": "{not json"})["message"]
    e = err(box, "createResource", {"resourceType": "Patient", "body": {"resourceType": "Observation"}})
    assert "does not match" in e["message"]
    e = err(box, "updateResource", {"resourceType": "Patient", "resourceId": "a", "body": {"id": "b"}})
    assert "does not match" in e["message"]


def test_unknown_search_parameter_is_a_400(box):
    e = err(box, "searchResources", {"resourceType": "Patient", "params": {"nickname": "Al"}})
    assert e["status"] == 400 and "nickname" in e["message"] and e["issues"][0]["code"] == "not-supported"
    bad_date = err(box, "searchResources", {"resourceType": "Patient", "params": {"birthdate": "soon"}})
    assert bad_date["status"] == 400
    nested = err(box, "searchResources", {"resourceType": "Patient", "params": {"a": {"b": 1}}})
    assert "must be strings" in nested["message"]


def test_unknown_id_is_a_404_and_an_unknown_type_is_refused_before_the_server(box):
    e = err(box, "getResourceById", {"resourceType": "Patient", "resourceId": "nope"})
    assert e["status"] == 404 and e["issues"][0]["code"] == "not-found"
    assert "not an R4 resource type" in err(box, "getResourceById", {"resourceType": "Patiant",
                                                                      "resourceId": "x"})["message"]


def test_arguments_cannot_turn_one_operation_into_another(box):
    """A type, id, parameter name or paging link that smuggles a path or a query is a tool error: a read
    never becomes a search, a delete never a conditional delete, a paging link never system history."""
    pid = ok(box, "createResource", {"resourceType": "Patient", "body": {"active": True}})["id"]
    allergy = ok(box, "createResource", {"resourceType": "AllergyIntolerance", "body": {
        "patient": {"reference": f"Patient/{pid}"}, "code": {"text": "peanut"},
        "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/allergyintolerance-clinical",
                                       "code": "active"}]}}})["id"]  # clinicalStatus: invariant ait-1
    attempts = [
        ("getResourceById", {"resourceType": f"AllergyIntolerance?patient={pid}", "resourceId": allergy}, "resource type"),
        ("deleteResource", {"resourceType": f"AllergyIntolerance?patient={pid}", "resourceId": "x"}, "resource type"),
        ("deleteResource", {"resourceType": "AllergyIntolerance", "resourceId": f"{allergy}?_cascade=delete"}, "FHIR id"),
        ("deleteResource", {"resourceType": "AllergyIntolerance", "resourceId": "../Patient/" + pid}, "FHIR id"),
        ("updateResource", {"resourceType": "Patient", "resourceId": "a/b", "body": {"active": False}}, "FHIR id"),
        ("createResource", {"resourceType": "Patient/_history", "body": {}}, "resource type"),
        ("searchResources", {"resourceType": "Patient", "params": {"_id=x&family": "y"}}, "parameter name"),
        ("searchResources", {"resourceType": "Patient", "page_url": "http://fhirgym.local/fhir/_history"}, "page_url"),
        ("searchResources", {"resourceType": "Patient", "page_url": "Patient/$everything?_getpages=x"}, "page_url"),
    ]
    for name, args, why in attempts:
        assert why in err(box, name, args)["message"], (name, args)
    assert ok(box, "getResourceById", {"resourceType": "AllergyIntolerance", "resourceId": allergy})["id"] == allergy
    page = ok(box, "searchResources", {"resourceType": "Patient", "params": {"_count": "1"}})
    assert page["total"] == 1 and "next_page_url" not in page


def test_version_conflict_and_broken_reference(box):
    pid = ok(box, "createResource", {"resourceType": "Patient", "body": {"active": True}})["id"]
    e = err(box, "updateResource", {"resourceType": "Patient", "resourceId": pid, "body": {"active": False},
                                    "ifMatchVersion": "7"})
    assert e["status"] in (409, 412)
    e = err(box, "createResource", {"resourceType": "Observation", "body": {
        "status": "final", "code": {"text": "x"}, "subject": {"reference": "Patient/nope"}}})
    assert e["status"] in (400, 404, 409, 422) and e["issues"][0]["expression"] == ["Observation.subject"]


def test_argument_errors_never_raise(box):
    wrong = err(box, "getResourceById", {"resourceType": ["Patient"], "resourceId": "x"})
    assert "must be of type string" in wrong["message"]
    coerced = box.call("getResourceById", {"resourceType": "Patient", "resourceId": 404404})  # exact: 5 → "5"
    assert coerced.arguments["resourceId"] == "404404" and coerced.output["error"]["status"] == 404
    box.calls.remove(coerced)
    assert "missing required argument" in err(box, "getResourceById", {"resourceType": "Patient"})["message"]
    assert "unknown argument" in err(box, "getResourceById", {"resourceType": "Patient", "resourceId": "x",
                                                               "version": 2})["message"]
    e = err(box, "dropTable", {})
    assert "unknown tool" in e["message"] and "searchResources" in e["message"]
    assert "JSON object" in box.call("searchResources", ["Patient"]).output["error"]["message"]  # type: ignore[arg-type]
    assert len(box.calls) == 5 and all(c.error for c in box.calls)


def test_unreachable_server_is_a_result():
    client = HttpClient("http://127.0.0.1:9/fhir", timeout=2)
    box = Toolbox(FHIR_TOOLS, ToolContext(client))
    down = err(box, "getResourceById", {"resourceType": "Patient", "resourceId": "x"})
    assert "unreachable" in down["message"]
    assert "no FHIR server" in err(Toolbox(FHIR_TOOLS, ToolContext()), "listResourceTypes")["message"]


# -- FHIR tools: bounded output ---------------------------------------------------------------------


def test_large_search_is_cut_with_omitted_and_a_working_next_page(world_box):
    first = ok(world_box, "searchResources", {"resourceType": "Observation"})
    assert first["total"] > 1000
    assert first["omitted"] > 0 and len(first["resources"]) + first["omitted"] == first["returned"]
    assert "next_page_url" in first["note"] and _size(first) <= DEFAULT_BUDGET
    second = ok(world_box, "searchResources", {"resourceType": "Observation",
                                               "page_url": first["next_page_url"]})
    assert second["resources"] and second["total"] == first["total"]
    assert not {o["id"] for o in first["resources"]} & {o["id"] for o in second["resources"]}
    assert second["next_page_url"] != first["next_page_url"]


def test_all_pages_follows_next_links_up_to_the_limit(world_box):
    out = ok(world_box, "searchResources", {"resourceType": "Patient",
                                            "params": {"_count": 2, "_elements": "id"},
                                            "all_pages": True, "page_limit": 3})
    assert out["returned"] == 6 and len({p["id"] for p in out["resources"]}) == 6 and "next_page_url" in out


def test_a_smaller_budget_cuts_earlier(world_box):
    world_box.context.budget = 3000
    out = ok(world_box, "searchResources", {"resourceType": "Patient"})
    assert out["omitted"] > 0 and _size(out) <= 3000


# -- spec tools -------------------------------------------------------------------------------------


def _element(out: dict, path: str) -> dict:
    return next(e for e in out["elements"] if e["path"] == path)


def test_spec_tools_are_a_read_only_group():
    assert [t.name for t in SPEC_TOOLS] == ["listResources", "getStructureDefinition", "getSearchParams",
                                             "getDataTypeDefinition"]
    assert all(t.group == "specs" and not t.writes for t in SPEC_TOOLS)


def test_list_resources(specs):
    out = ok(specs, "listResources")
    assert out["fhirVersion"] == "4.0.1" and out["count"] == 146 and _size(out) <= DEFAULT_BUDGET
    assert "administrative" in out["resources"]["Patient"].lower()
    assert set(ok(specs, "listResources", {"query": "schedul"})["resources"]) == {"Schedule", "Slot"}


def test_patient_structure_definition(specs):
    out = ok(specs, "getStructureDefinition", {"resourceType": "Patient"})
    assert out["kind"] == "resource" and out["base"] == "DomainResource" and "omitted" not in out
    gender = _element(out, "Patient.gender")
    assert gender["card"] == "0..1" and gender["type"] == "code"
    assert gender["binding"] == {"strength": "required", "valueSet": "AdministrativeGender",
                                 "codes": ["female", "male", "other", "unknown"]}
    name = _element(out, "Patient.name")
    assert (name["type"], name["card"]) == ("HumanName", "0..*")
    assert _element(out, "Patient.deceased[x]")["type"] == "boolean | dateTime"
    gp = _element(out, "Patient.generalPractitioner")["type"]
    assert gp == "Reference(Organization | Practitioner | PractitionerRole)"
    assert _element(out, "Patient.link.other")["card"] == "1..1"
    assert not [e for e in out["elements"] if e["path"].endswith(("extension", "Extension"))]
    assert "HumanName" in out["note"]


def test_appointment_structure_definition_and_path(specs):
    out = ok(specs, "getStructureDefinition", {"resourceType": "Appointment"})
    status = _element(out, "Appointment.status")
    assert status["card"] == "1..1" and status.get("modifier") is True
    assert {"booked", "cancelled", "proposed"} <= set(status["binding"]["codes"])
    part = ok(specs, "getStructureDefinition", {"resourceType": "Appointment", "path": "participant"})
    paths = {e["path"] for e in part["elements"]}
    assert paths >= {"Appointment.participant", "Appointment.participant.actor"}
    assert all(e["path"].startswith("Appointment.participant") for e in part["elements"])
    assert "Patient" in _element(part, "Appointment.participant.actor")["type"]
    value = ok(specs, "getStructureDefinition", {"resourceType": "Observation", "path": "value"})
    first = value["elements"][0]
    assert first["path"] == "Observation.value[x]" and "Quantity" in first["type"]


def test_human_name_and_primitive_data_types(specs):
    out = ok(specs, "getDataTypeDefinition", {"dataType": "HumanName"})
    assert out["kind"] == "complex-type" and _element(out, "HumanName.family")["card"] == "0..1"
    assert _element(out, "HumanName.given")["card"] == "0..*"
    assert "usual" in _element(out, "HumanName.use")["binding"]["codes"]
    assert not [e for e in out["elements"] if e["path"] == "HumanName.id"]
    date = ok(specs, "getDataTypeDefinition", {"dataType": "date"})
    assert date["kind"] == "primitive-type" and date["regex"].startswith("([0-9]")


def test_search_params(specs):
    out = ok(specs, "getSearchParams", {"resourceType": "Appointment"})
    params = {p["code"]: p for p in out["params"]}
    assert params["actor"]["type"] == "reference" and "Patient" in params["actor"]["targets"]
    assert (params["date"]["type"], params["date"]["expression"]) == ("date", "Appointment.start")
    assert "ge" in out["value_syntax"]["date"] and ":missing" in out["value_syntax"]["reference"]
    assert out["common"]["_id"] == "token" and "_count" in out["result_parameters"]
    fam = ok(specs, "getSearchParams", {"resourceType": "Patient", "code": "family"})["params"]
    assert fam == [{"code": "family", "type": "string", "expression": "Patient.name.family",
                    "description": "A portion of the family name of the patient"}]
    only_refs = ok(specs, "getSearchParams", {"resourceType": "Patient", "type": "reference"})["params"]
    assert {p["type"] for p in only_refs} == {"reference"}
    comp = ok(specs, "getSearchParams", {"resourceType": "Observation", "code": "code-value-quantity"})
    assert comp["params"][0]["components"] == ["code", "value-quantity"]


def test_unknown_names_suggest_close_matches(specs):
    assert "Patient" in err(specs, "getStructureDefinition", {"resourceType": "Patinet"})["message"]
    case = err(specs, "getStructureDefinition", {"resourceType": "patient"})
    assert "did you mean: Patient" in case["message"]
    assert "HumanName" in err(specs, "getDataTypeDefinition", {"dataType": "Humanname"})["message"]
    assert "family" in err(specs, "getSearchParams", {"resourceType": "Patient", "code": "famly"})["message"]
    assert "Appointment" in err(specs, "getSearchParams", {"resourceType": "Apointment"})["message"]
    assert "reference" in err(specs, "getSearchParams", {"resourceType": "Patient", "type": "ref"})["message"]
    assert "Appointment.participant" in err(specs, "getStructureDefinition",
                                            {"resourceType": "Appointment", "path": "particpant"})["message"]


def test_budget_marker_and_paging_cover_every_element():
    small = Toolbox(SPEC_TOOLS, ToolContext(budget=4000))
    seen: list[str] = []
    offset, pages = 0, 0
    while True:
        out = ok(small, "getStructureDefinition", {"resourceType": "ExplanationOfBenefit", "offset": offset})
        assert _size(out) <= 4000
        seen += [e["path"] for e in out["elements"]]
        pages += 1
        if "next_offset" not in out:
            break
        assert out["omitted"] == out["elementCount"] - out["next_offset"]
        assert f"offset={out['next_offset']}" in out["note"] and "path" in out["note"]
        offset = out["next_offset"]
    assert pages > 2 and len(seen) == len(set(seen)) == out["elementCount"]
    cut = ok(small, "getSearchParams", {"resourceType": "Observation"})
    assert cut["omitted"] > 0 and _size(cut) <= 4000 and "next_offset" in cut
