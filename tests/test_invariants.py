"""Spec rules on write (issue 23, requirements 4 and 6): string length and characters, narrative XHTML,
the error-level FHIRPath invariants, and a built world that obeys all of them."""

from __future__ import annotations

import pytest

from conftest import new_client
from fhirgym.fhir import ServerConfig
from fhirgym.fhir._invariants import Invariants, shortcut
from fhirgym.spec import load_spec

XHTML = 'xmlns="http://www.w3.org/1999/xhtml"'
AMB = {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"}


def _encounter(start: str, end: str) -> dict:
    return {"resourceType": "Encounter", "status": "finished", "class": AMB, "period": {"start": start, "end": end}}


def _narrative(div: str) -> dict:
    return {"resourceType": "Patient", "text": {"status": "generated", "div": div}}


def _refused(client, resource: dict) -> str:
    resp = client.create(resource)
    assert resp.status == 422, resp.body
    return " | ".join(i["diagnostics"] for i in resp.body["issue"])


def test_an_encounter_ending_before_it_starts_is_refused():
    client = new_client()
    msg = _refused(client, _encounter("2020-01-02", "2020-01-01"))
    assert "Encounter.period: constraint per-1 failed" in msg
    assert client.create(_encounter("2020-01-01", "2020-01-01T10:00:00Z")).status == 201  # same day: not before
    assert client.create(_encounter("2020-01-01T10:00:00Z", "2020-01-01T10:00:00Z")).status == 201
    assert "per-1" in _refused(client, _encounter("2020-01-01T10:00:00.500Z", "2020-01-01T10:00:00Z"))


def test_a_booked_appointment_needs_a_start():
    client = new_client()
    appt = {"resourceType": "Appointment", "status": "booked",
            "participant": [{"status": "accepted", "actor": {"display": "Dr X"}}]}
    assert "constraint app-3 failed" in _refused(client, appt)
    assert client.create({**appt, "status": "proposed"}).status == 201


def test_invariants_in_nested_elements_and_contained_resources():
    client = new_client()
    obs = {"resourceType": "Observation", "status": "final", "code": {"text": "x"},
           "referenceRange": [{"low": {"value": 1}}, {"type": {"text": "no bound"}}]}
    assert "Observation.referenceRange[1]: constraint obs-3 failed" in _refused(client, obs)
    quantity = {"resourceType": "Observation", "status": "final", "code": {"text": "x"},
                "valueQuantity": {"value": 1, "code": "mg"}}
    assert "Observation.valueQuantity: constraint qty-3 failed" in _refused(client, quantity)
    holder = {"resourceType": "Patient", "contained": [_encounter("2020-01-02", "2020-01-01") | {"id": "e"}],
              "extension": [{"url": "http://example.org/e", "valueReference": {"reference": "#e"}}]}
    assert "Patient.contained[0].period: constraint per-1 failed" in _refused(client, holder)


def test_invariants_inside_extensions_of_primitives():
    bad = {"url": "http://example.org/when", "valuePeriod": {"start": "2020-01-02", "end": "2020-01-01"}}
    client = new_client()
    msg = _refused(client, {"resourceType": "Patient", "birthDate": "2000-01-01", "_birthDate": {"extension": [bad]}})
    assert "Patient.birthDate.extension[0].valuePeriod: constraint per-1 failed" in msg
    msg = _refused(client, {"resourceType": "Patient", "name": [{"given": ["a", "b"], "_given": [None, {"extension": [bad]}]}]})
    assert "Patient.name[0].given[1].extension[0].valuePeriod: constraint per-1" in msg


def test_strings_are_at_most_one_megabyte_and_hold_no_control_characters():
    client = new_client()
    limit = 1024 * 1024
    assert client.create({"resourceType": "Patient", "name": [{"family": "a" * limit}]}).status == 201
    assert "exceeds FHIR's limit" in _refused(client, {"resourceType": "Patient", "name": [{"family": "a" * (limit + 1)}]})
    for bad in ("a\x00b", "\x07", "x\x1b[31m"):
        assert "control character" in _refused(client, {"resourceType": "Patient", "name": [{"family": bad}]})
    assert client.create({"resourceType": "Patient", "name": [{"text": "tab\there\r\nnewline"}]}).status == 201


@pytest.mark.parametrize("div, why", [
    (f"<div {XHTML}><script>alert(1)</script>x</div>", "<script> is not allowed"),
    (f'<div {XHTML}><p onclick="steal()">hi</p></div>', "event attribute 'onclick'"),
    (f'<div {XHTML}><a href="javascript:steal()">hi</a></div>', "must not run script"),
    (f"<div {XHTML}><iframe src=\"http://x\"/>hi</div>", "<iframe> is not allowed"),
    (f"<div {XHTML}><form><input/></form>hi</div>", "<form> is not allowed"),
    ("<div>no namespace</div>", "XHTML namespace"),
    (f"<div {XHTML}>  <p> </p></div>", "non-whitespace content (txt-2)"),
    (f"<div {XHTML}><p>unclosed</div>", "not well-formed"),
    (f'<!DOCTYPE d [<!ENTITY x "y">]><div {XHTML}>&x;</div>', "document type declaration"),
    (f"<span {XHTML}>x</span>", "must be a <div>"),
])
def test_narrative_xhtml_is_restricted_to_what_r4_allows(div, why):
    assert why in _refused(new_client(), _narrative(div))


def test_allowed_narrative_passes():
    div = (f'<div {XHTML}><h1 class="t">Title</h1><p style="color:red">A <b>bold</b> <a href="#x">link</a></p>'
           '<table border="1"><tr><td colspan="2">cell</td></tr></table><img src="#pic" alt="pic"/></div>')
    assert new_client().create(_narrative(div)).status == 201


def test_invariants_can_be_switched_off_but_structural_rules_cannot():
    client = new_client(ServerConfig(invariants=False))
    assert client.create(_encounter("2020-01-02", "2020-01-01")).status == 201
    assert "control character" in _refused(client, {"resourceType": "Patient", "name": [{"family": "a\x00"}]})


def test_validate_operation_reports_invariants():
    resp = new_client().request("POST", "Encounter/$validate", body=_encounter("2020-01-02", "2020-01-01"))
    assert any("per-1" in i["diagnostics"] for i in resp.body["issue"])


# -- the shortcuts agree with fhirpathpy ---------------------------------------------------------------
CASES = {
    "Quantity": [{}, {"value": 1}, {"value": 1, "code": "mg"}, {"code": "mg", "system": "http://u"},
                 {"_code": {"extension": [{"url": "http://x", "valueString": "y"}]}}],
    "Observation": [
        {"resourceType": "Observation", "status": "final", "code": {"text": "x"}},
        {"resourceType": "Observation", "status": "final", "code": {"text": "x"}, "valueString": "v",
         "dataAbsentReason": {"text": "gone"}},
        {"resourceType": "Observation", "status": "final", "code": {"text": "x"}, "dataAbsentReason": {"text": "d"}},
        {"resourceType": "Observation", "status": "final", "code": {"coding": [{"system": "s", "code": "c"}]},
         "valueQuantity": {"value": 1}, "component": [{"code": {"coding": [{"system": "s", "code": "c"}]}}]},
        {"resourceType": "Observation", "status": "final", "code": {"coding": [{"system": "s", "code": "c"}]},
         "valueQuantity": {"value": 1}, "component": [{"code": {"coding": [{"system": "s", "code": "d"}]}}]},
    ],
    "Condition": [
        {"resourceType": "Condition", "subject": {"reference": "Patient/1"}, "abatementDateTime": "2020"},
        {"resourceType": "Condition", "subject": {"reference": "Patient/1"}, "abatementDateTime": "2020",
         "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                                        "code": "resolved"}]}},
        {"resourceType": "Condition", "subject": {"reference": "Patient/1"},
         "clinicalStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-clinical",
                                        "code": "active"}]},
         "verificationStatus": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-ver-status",
                                            "code": "entered-in-error"}]}},
    ],
}

#: per-1 by the FHIRPath spec (§6.2: dateTimes are compared at each precision from the year down; one
#: stopping before the other while equal so far gives empty, and the constraint holds). fhirpathpy 2.2
#: answers false for ("2020-01-20", "2020-01"), hence these are spelled out instead of asked of it.
PER_1 = [
    ("2020", "2019", False), ("2020", "2020-05", True), ("2020-02", "2020-01-15", False),
    ("2020-01", "2020-01-15", True), ("2020-01-20", "2020-01", True), ("2020-01-02", "2020-01-01", False),
    ("2020-01-01", "2020-01-01T10:00:00Z", True), ("2020-01-01T10:00:00Z", "2020-01-01T09:59:59Z", False),
    ("2020-01-01T10:00:00.5Z", "2020-01-01T10:00:00Z", False), ("2020-01-01T10:00:00+02:00", "2020-01-01T09:00:00Z", True),
    ("2020-01-01T10:00:00Z", "2020-01-01T10:00:00.000Z", True), ("2020-01-01T12:00:00+02:00", "2020-01-01T09:00:00Z", False),
]


@pytest.mark.parametrize("start, end, holds", PER_1)
def test_per_1_follows_fhirpath_on_partial_dates(start, end, holds):
    from fhirgym.fhir._invariants import NATIVE

    assert NATIVE["per-1"]({"start": start, "end": end}) is holds
    assert NATIVE["per-1"]({"start": start}) is True


def _fhirpath(invs: Invariants, inv, node: dict, type_path: str) -> bool:
    target = node if "resourceType" in node else invs._fhirpath()[1].create_node(node, type_path)
    return inv.fn(target, {"resource": node, "rootResource": node}) != [False]


@pytest.mark.parametrize("type_path", sorted(CASES))
def test_shortcuts_agree_with_fhirpathpy(type_path):
    invs = Invariants(load_spec())
    decided = 0
    for inv in invs.at(type_path):
        for node in CASES[type_path]:
            quick = inv.quick(node) if inv.quick else None
            if quick is not None:
                decided += 1
                assert quick == _fhirpath(invs, inv, node, type_path), (inv.key, node)
    assert decided >= len(CASES[type_path])


def test_shortcut_shapes():
    children = load_spec().child_elements("Observation")
    assert shortcut("dataAbsentReason.empty() or value.empty()", children)({"valueString": "x"}) is True
    assert shortcut("dataAbsentReason.empty() or value.empty()", children)(
        {"valueString": "x", "dataAbsentReason": {}}) is False
    assert shortcut("value.exists() implies code.exists()", children)({}) is True
    assert shortcut("value.exists() implies code.exists()", children)({"valueString": "x"}) is None
    assert shortcut("status.exists()", children)({"statusHistory": 1}) is False  # not a choice: exact name
    assert shortcut("unknownName.exists() or code.exists()", children)({}) is None


def test_the_built_world_obeys_every_rule_and_the_shortcuts_agree(small_world_path, monkeypatch):
    """Requirement 6: the invariant check over a built world finds nothing; meanwhile every decision a
    shortcut takes there is held against fhirpathpy's."""
    from fhirgym.world import check_world

    disagreements: list = []
    checked = {"n": 0}
    original = Invariants.check

    def check(self, invariants, node, type_path, root, where, issues, render=str, stop=None):
        for inv in invariants:
            quick = inv.quick(node) if inv.quick else None
            if quick is not None and checked["n"] < 20_000:
                checked["n"] += 1
                target = node if node is root else self._fhirpath()[1].create_node(node, type_path)
                if quick != (inv.fn(target, {"resource": root, "rootResource": root}) != [False]):
                    disagreements.append((inv.key, where, node))
        original(self, invariants, node, type_path, root, where, issues, render, stop)

    monkeypatch.setattr(Invariants, "check", check)
    report = check_world(small_world_path)
    assert report.checked > 20_000
    assert report.ok, report.summary(limit=20)
    assert checked["n"] == 20_000 and not disagreements, disagreements[:5]


def test_synthea_repairs_periods_and_placeholder_reasons():
    from fhirgym.world import repair_bundle

    period = {"start": "1995-12-21T22:07:46.239422+00:00", "end": "1995-12-15T11:02:02.431725+00:00"}
    bundle = {"entry": [
        {"resource": {"resourceType": "Encounter", "period": dict(period),
                      "reasonCode": [{"text": "dental_referral"}, {"text": "Chest pain (finding)"}]}},
        {"resource": {"resourceType": "DocumentReference", "context": {"period": dict(period)}}},
        {"resource": {"resourceType": "Procedure", "reasonCode": [{"text": "mdd"}]}},
        {"resource": {"resourceType": "Procedure", "reasonCode": [
            {"text": "asthma", "coding": [{"system": "http://snomed.info/sct", "code": "195967001"}]}]}},
    ]}
    enc, doc, proc, coded = (e["resource"] for e in repair_bundle(bundle)["entry"])
    assert enc["period"] == {"start": period["start"], "end": period["start"]}
    assert doc["context"]["period"] == enc["period"]
    assert enc["reasonCode"] == [{"text": "Chest pain (finding)"}]
    assert "reasonCode" not in proc
    assert coded["reasonCode"][0]["text"] == "asthma"  # coded: a real reason, kept


# -- Questionnaire: que-7 as R5 corrected it, and no trace() output ---------------------------------------
def _item(link: str, kind: str, text: str, **extra) -> dict:
    return {"linkId": link, "type": kind, "text": text, **extra}


LOINC = "http://loinc.org"
#: Questionnaires in the shapes of R4's own examples (family history, lifelines, Glasgow coma score, a
#: Zika exposure screen): nested groups, display items, answer options, initial values, and every kind of
#: enableWhen (the R4 examples package itself cannot be fetched here; the core package has no examples)
QUESTIONNAIRES = [
    {"resourceType": "Questionnaire", "id": "family-history", "status": "active", "item": [
        _item("1", "group", "Family member health history", repeats=True, item=[
            _item("1.1", "boolean", "Is this person living?"),
            _item("1.2", "integer", "Current age", enableWhen=[
                {"question": "1.1", "operator": "exists", "answerBoolean": True}]),
            _item("1.3", "string", "Cause of death", enableWhen=[
                {"question": "1.1", "operator": "=", "answerBoolean": False}]),
            _item("1.4", "display", "Conditions this person had"),
        ])]},
    {"resourceType": "Questionnaire", "id": "zika", "status": "active", "subjectType": ["Patient"], "item": [
        _item("residence", "boolean", "Do you live in an area with Zika?"),
        _item("travel", "boolean", "Have you travelled to such an area?", enableWhen=[
            {"question": "residence", "operator": "exists", "answerBoolean": False}]),
        _item("when", "date", "When did you return?", enableWhen=[
            {"question": "travel", "operator": "=", "answerBoolean": True},
            {"question": "residence", "operator": "!=", "answerBoolean": True},
            {"question": "travel", "operator": "exists", "answerBoolean": True}], enableBehavior="all"),
        _item("recent", "boolean", "Within the last 8 weeks?", enableWhen=[
            {"question": "when", "operator": ">", "answerDate": "2016-01-01"}]),
    ]},
    {"resourceType": "Questionnaire", "id": "gcs", "status": "draft", "item": [
        _item("eye", "choice", "Eye opening", answerOption=[
            {"valueCoding": {"system": LOINC, "code": "LA6553-5", "display": "Eyes open spontaneously"}},
            {"valueCoding": {"system": LOINC, "code": "LA6554-3", "display": "Eyes open to verbal command"}}]),
        _item("score", "decimal", "Score", readOnly=True, enableWhen=[
            {"question": "eye", "operator": "=", "answerCoding": {"system": LOINC, "code": "LA6553-5"}}]),
        _item("weight", "quantity", "Weight", enableWhen=[
            {"question": "score", "operator": ">=", "answerDecimal": 3.5}]),
        _item("notes", "text", "Notes", initial=[{"valueString": "none"}], maxLength=200),
    ]},
]


@pytest.mark.parametrize("questionnaire", QUESTIONNAIRES, ids=lambda q: q["id"])
def test_valid_questionnaires_are_accepted_without_trace_output(questionnaire, capsys):
    """An ``exists`` enableWhen was refused (que-7's ``is Boolean`` matches no FHIR boolean), and que-1's
    ``trace()`` printed two lines per item to stdout."""
    client = new_client()
    resp = client.create(questionnaire)
    assert resp.status == 201, resp.body
    assert capsys.readouterr().out == ""


def test_que_7_still_refuses_an_exists_condition_without_a_boolean():
    client = new_client()
    bad = {**QUESTIONNAIRES[0], "item": [_item("a", "boolean", "A"), _item("b", "string", "B", enableWhen=[
        {"question": "a", "operator": "exists", "answerCoding": {"system": LOINC, "code": "x"}}])]}
    assert "que-7" in _refused(client, bad)
    from fhirgym.fhir._invariants import NATIVE

    assert NATIVE["que-7"]({"operator": "exists", "answerBoolean": True}) is True
    assert NATIVE["que-7"]({"operator": "exists", "answerString": "y"}) is False
    assert NATIVE["que-7"]({"operator": "=", "answerString": "y"}) is True
