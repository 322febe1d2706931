"""The task framework's parts on hand-built cases: answers, diffs, expectations, failure modes, instances."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from fhirgym.fhir import FhirServer, InProcessClient, Store
from fhirgym.tasks import (
    NOT_FOUND,
    AnswerSpec,
    Change,
    Expect,
    Field,
    TaskWorld,
    diff,
    failure_modes,
    frozen_now,
    make_instance,
    mark,
    match,
    proximity,
    select,
)
from fhirgym.tasks._diff import fhir_equal
from fhirgym.tasks.checks import coded, eq, instant, on_day, one_of, ref, refs_exactly, values

SPEC = AnswerSpec((Field("slot_id", "id"), Field("start", "datetime")), none_allowed=True)


# -- answers ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '<answer>{"slot_id": "Slot/s1", "start": "2025-06-09T10:00:00Z"}</answer>',
    "Sure.\n<answer>{'SLOT_ID': 's1', 'Start': '2025-06-09 10:00'}</answer>",
    'the slot is {"slot_id": "http://x/fhir/Slot/s1/_history/2", "start": "2025-06-09T12:00:00+02:00"}',
    '<answer>\n```json\n{"slot_id": "s1", "start": "June 9, 2025 10:00 UTC"}\n```\n</answer>',
])
def test_answers_parse_leniently_and_compare_by_meaning(text):
    gold = {"slot_id": "s1", "start": "2025-06-09T10:00:00Z"}
    assert SPEC.compare(SPEC.parse(text), gold) == []


def test_wrong_values_are_reported_field_by_field():
    got = SPEC.parse('<answer>{"slot_id": "s2", "start": "2025-06-09T10:30:00Z"}</answer>')
    reasons = SPEC.compare(got, {"slot_id": "s1", "start": "2025-06-09T10:00:00Z"})
    assert len(reasons) == 2 and "slot_id" in reasons[0] and "start" in reasons[1]


@pytest.mark.parametrize("text", ['<answer>{"found": false}</answer>', "<answer>none</answer>",
                                  "<answer>Not found.</answer>", "<answer>null</answer>", '{"found": "false"}'])
def test_nothing_found_is_a_structured_answer(text):
    assert SPEC.parse(text) is NOT_FOUND
    assert SPEC.compare(SPEC.parse(text), NOT_FOUND) == []
    assert SPEC.compare(SPEC.parse(text), {"slot_id": "s1", "start": "2025-06-09T10:00:00Z"})


@pytest.mark.parametrize("text", [None, "", "   ", "I could not find anything, sorry"])
def test_no_answer_is_not_the_nothing_found_answer(text):
    assert SPEC.parse(text) is None
    assert SPEC.compare(SPEC.parse(text), NOT_FOUND) == ["expected the 'nothing found' answer"]


@pytest.mark.parametrize(("field", "text", "gold"), [
    (Field("hba1c", "number"), '{"hba1c": "7.0 %"}', 7.0),
    (Field("hba1c", "number"), '{"hba1c": "HbA1c 7.0%"}', 7.0),
    (Field("hba1c", "number"), '{"hba1c": {"value": 7.0, "unit": "%"}}', 7.0),
    (Field("slots", "int"), '{"slots": "39 slots"}', 39),
    (Field("slots", "int"), '{"slots": "1,204 slots"}', 1204),
    (Field("slots", "int"), '{"slots": [39]}', 39),
    (Field("patient_id", "id"), '{"patient_id": {"reference": "Patient/a"}}', "a"),
    (Field("patient_id", "id"), '{"patient_id": {"resourceType": "Patient", "id": "a"}}', "a"),
    (Field("patient_id", "id"), '{"patient_id": ["Patient/a"]}', "a"),
    (Field("patient_id", "id"), '{"patient_id": "http://x/fhir/Patient/a/_history/3"}', "a"),
    (Field("name", "text"), '{"name": ["Aetna"]}', "Aetna"),
    (Field("day", "date"), '{"day": ["2025-06-09"]}', date(2025, 6, 9)),
    (Field("at", "datetime"), '{"at": "2025-06-09T10:00:00+00:00"}', "2025-06-09T10:00:00Z"),
    (Field("ok", "bool"), '{"ok": ["yes"]}', True),
])
def test_answers_are_read_generously(field, text, gold):
    spec = AnswerSpec((field,), none_allowed=True)
    assert spec.compare(spec.parse(f"<answer>{text}</answer>"), {field.name: gold}) == []


@pytest.mark.parametrize(("field", "text", "gold"), [
    (Field("patient_id", "id"), '{"patient_id": "Patient/a, Patient/b"}', "a"),
    (Field("patient_id", "id"), '{"patient_id": "Patient/b, Patient/a"}', "a"),
    (Field("patient_id", "id"), '{"patient_id": "a or b"}', "a"),
    (Field("patient_id", "id"), '{"patient_id": ["a", "b"]}', "a"),
    (Field("patient_id", "id"), '{"patient_id": [{"reference": "Patient/a"}, {"reference": "Patient/b"}]}', "a"),
    (Field("slots", "int"), '{"slots": "39 or 40"}', 39),
    (Field("hba1c", "number"), '{"hba1c": "7.0 % (earlier 6.5 %)"}', 7.0),
    (Field("name", "text"), '{"name": ["Aetna", "Cigna"]}', "Aetna"),
    (Field("day", "date"), '{"day": ["2025-06-09", "2025-06-10"]}', date(2025, 6, 9)),
    (Field("ok", "bool"), '{"ok": [true, false]}', True),
])
def test_answers_that_name_several_candidates_fail(field, text, gold):
    spec = AnswerSpec((field,), none_allowed=True)
    assert spec.compare(spec.parse(f"<answer>{text}</answer>"), {field.name: gold})


@pytest.mark.parametrize("text", ['<answer>{"slot_id": null, "start": null}</answer>',
                                  '<answer>{"slot_id": "", "start": []}</answer>', '<answer>{"slot_id": null}</answer>'])
def test_all_null_fields_read_as_nothing_found(text):
    assert SPEC.parse(text) is NOT_FOUND and SPEC.compare(SPEC.parse(text), NOT_FOUND) == []


@pytest.mark.parametrize("text", [
    '<answer>{"found": false, "slot_id": "s1"}</answer>',  # nothing found, and yet a value
    '<answer>{"slot_id": "s1", "start": "2025-06-09T10:00:00Z"}</answer> or maybe <answer>{"found": false}</answer>',
    '<answer>{"slot_id": "s1", "start": "2025-06-09T10:00:00Z"}</answer><answer>{"slot_id": "s2", '
    '"start": "2025-06-09T10:00:00Z"}</answer>',
])
def test_answers_that_contradict_themselves_fail_whatever_the_gold(text):
    for gold in (NOT_FOUND, {"slot_id": "s1", "start": "2025-06-09T10:00:00Z"}):
        assert SPEC.compare(SPEC.parse(text), gold)


def test_a_restated_answer_is_one_answer():
    text = '<answer>{"slot_id": "s1", "start": "2025-06-09T10:00:00Z"}</answer> again: <answer>{"slot_id": "Slot/s1", "start": "2025-06-09T10:00:00Z"}</answer>'
    assert SPEC.compare(SPEC.parse(text), {"slot_id": "s1", "start": "2025-06-09T10:00:00Z"}) == []


def test_kinds():
    ids = AnswerSpec((Field("ids", "ids"),))
    assert ids.compare(ids.parse('<answer>{"ids": ["Slot/b", "a"]}</answer>'), {"ids": ["a", "b"]}) == []
    assert ids.compare(ids.parse('<answer>{"ids": "a, b"}</answer>'), {"ids": ["a", "b"]}) == []
    assert ids.compare(ids.parse('<answer>{"ids": ["a"]}</answer>'), {"ids": ["a", "b"]})
    count = AnswerSpec((Field("count", "int"),))
    assert count.compare(count.parse("<answer>3</answer>"), {"count": 3}) == []
    assert count.compare(count.parse('<answer>{"count": "3"}</answer>'), {"count": 3}) == []
    assert count.compare(count.parse('<answer>{"count": 4}</answer>'), {"count": 3})
    num = AnswerSpec((Field("mean", "number", tolerance=0.05),))
    assert num.compare(num.parse('<answer>{"mean": 5.43}</answer>'), {"mean": 5.4333}) == []
    assert num.compare(num.parse('<answer>{"mean": 5.6}</answer>'), {"mean": 5.4333})
    day = AnswerSpec((Field("day", "date"),))
    for text in ("2025-06-09", "June 9, 2025", "9 June 2025"):
        assert day.compare(day.parse(f'<answer>{{"day": "{text}"}}</answer>'), {"day": date(2025, 6, 9)}) == []
    name = AnswerSpec((Field("name", "text"),))
    assert name.compare(name.parse('<answer>{"name": "  aetna. "}</answer>'), {"name": "Aetna"}) == []
    assert name.compare(name.parse('<answer>{"name": "Dr. Ann Lee"}</answer>'), {"name": ["Ann Lee", "Dr. Ann Lee"]}) == []
    flag = AnswerSpec((Field("ok", "bool"),))
    assert flag.compare(flag.parse('<answer>{"ok": "yes"}</answer>'), {"ok": True}) == []
    assert "Finish with" in SPEC.instructions() and '{"found": false}' in SPEC.instructions()


# -- diff and expectations ----------------------------------------------------------------------------

def _client() -> tuple[Store, InProcessClient]:
    store = Store()
    return store, InProcessClient(FhirServer(store))


def test_diff_sees_creates_updates_deletes_and_transient_writes():
    store, c = _client()
    c.update({"resourceType": "Patient", "id": "p1", "gender": "female"})
    c.update({"resourceType": "Patient", "id": "p2", "gender": "male"})
    start = mark(store)
    c.update({"resourceType": "Patient", "id": "p1", "gender": "other"})
    c.update({"resourceType": "Patient", "id": "p1", "gender": "unknown"})  # two versions: one change
    c.delete("Patient", "p2")
    c.create({"resourceType": "Patient", "id": "x", "gender": "male"})
    tmp = c.create({"resourceType": "Basic", "code": {"text": "scratch"}}).body
    c.delete("Basic", tmp["id"])  # created and deleted inside the episode: a transient write
    changes = diff(store, start)
    ops = {(ch.op, ch.rtype) for ch in changes}
    assert ops == {("update", "Patient"), ("delete", "Patient"), ("create", "Patient"), ("transient", "Basic")}
    transient = next(ch for ch in changes if ch.op == "transient")
    assert transient.after["code"] == {"text": "scratch"} and transient.before is None
    assert [c.key for c in match([], changes).collateral] == [ch.key for ch in changes]
    upd = next(ch for ch in changes if ch.op == "update")
    assert upd.before["gender"] == "female" and upd.after["gender"] == "unknown"


def _change(op, rtype, rid, before, after) -> Change:
    return Change(op, rtype, rid, before, after)


APPT = {"resourceType": "Appointment", "id": "a1", "status": "booked", "slot": [{"reference": "Slot/s1"}],
        "start": "2025-06-09T10:00:00Z", "participant": [{"actor": {"reference": "Patient/p1"}, "status": "accepted"}]}


def test_match_requires_every_expectation_and_reports_collateral():
    exp = [Expect("create", "Appointment", checks=(eq("status", "booked"), ref("slot", "Slot/s1"),
                                                   instant("start", "2025-06-09T12:00:00+02:00"),
                                                   ref("participant.actor", "Patient/p1"))),
           Expect("update", "Slot", id="s1", checks=(eq("status", "busy"),))]
    slot_before = {"resourceType": "Slot", "id": "s1", "status": "free", "start": "x"}
    good = [_change("create", "Appointment", "a1", None, APPT),
            _change("update", "Slot", "s1", slot_before, {**slot_before, "status": "busy"})]
    assert match(exp, good).ok and match(exp, good).light_ok
    extra = [*good, _change("create", "Basic", "b", None, {"resourceType": "Basic"})]
    m = match(exp, extra)
    assert not m.ok and [c.key for c in m.collateral] == ["Basic/b"]
    dropped = [good[0], _change("update", "Slot", "s1", slot_before, {"resourceType": "Slot", "id": "s1", "status": "busy"})]
    m = match(exp, dropped)
    assert not m.ok and "start changed" in m.unmet[0][1][0] and m.light_ok
    wrong = [_change("create", "Appointment", "a1", None, {**APPT, "slot": [{"reference": "Slot/s2"}]}), good[1]]
    m = match(exp, wrong)
    assert not m.ok and "Slot/s2" in m.unmet[0][1][0] and not m.collateral and m.light_ok
    assert not match(exp, good[:1]).light_ok


def test_checks_read_paths_through_lists_and_codings():
    res = {"code": {"coding": [{"system": "s", "code": "1"}, {"system": "t", "code": "2"}]},
           "supportingInfo": [{"reference": "DiagnosticReport/a"}, {"reference": "http://h/fhir/DiagnosticReport/b"}]}
    assert values(res, "code.coding.code") == ["1", "2"]
    assert coded("code", "s", "2")(res, None)
    assert refs_exactly("supportingInfo", ["DiagnosticReport/a", "DiagnosticReport/b"])(res, None) is None
    assert refs_exactly("supportingInfo", ["DiagnosticReport/a"])(res, None)


def test_a_coded_element_is_exactly_its_concept():
    """Strict: the expected coding (any display) and nothing else in the same CodeableConcept, but the
    translations a family declares; with extras, one exact concept among others is enough."""
    right = {"system": "http://loinc.org", "code": "29463-7", "display": "Body weight"}
    mi = {"system": "http://snomed.info/sct", "code": "22298006"}
    check = coded("code", "http://loinc.org", "29463-7")
    assert check({"code": {"coding": [right]}}, None) is None
    assert check({"code": {"coding": [{**right, "display": "weight as I wrote it"}]}}, None) is None
    assert check({"code": {"coding": [right, mi]}}, None)  # a second concept in another system
    assert check({"code": {"coding": [right, {"system": "http://loinc.org", "code": "2345-7"}]}}, None)
    assert check({"code": {"coding": [mi]}}, None) and check({"code": {"text": "weight"}}, None)
    assert check({"code": right}, None) is None  # a Coding itself
    translated = coded("code", "http://loinc.org", "29463-7",
                       translations=[("http://snomed.info/sct", "27113001")])
    assert translated({"code": {"coding": [right, {"system": "http://snomed.info/sct", "code": "27113001"}]}},
                      None) is None
    assert translated({"code": {"coding": [right, mi]}}, None)
    many = coded("category", "s", "a", extras=True)
    assert many({"category": [{"coding": [{"system": "s", "code": "a"}]}, {"coding": [mi]}]}, None) is None
    assert many({"category": [{"coding": [{"system": "s", "code": "a"}, mi]}]}, None)
    assert coded("code", None, "7")({"code": {"coding": [{"system": "any", "code": "7"}]}}, None) is None
    assert coded("code", None, "7")({"code": {"coding": [{"system": "any", "code": "7"}, mi]}}, None)


def test_an_update_that_changes_nothing_is_no_change_whatever_its_serialisation():
    store, c = _client()
    c.update({"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "x"},
              "effectiveDateTime": "2025-06-02T10:00:00Z", "valueQuantity": {"value": 5, "unit": "mg"}})
    start = mark(store)
    c.update({"resourceType": "Observation", "id": "o1", "valueQuantity": {"unit": "mg", "value": 5.0},
              "effectiveDateTime": "2025-06-02T10:00:00+00:00", "code": {"text": "x"}, "status": "final"})
    assert diff(store, start) == []
    c.update({"resourceType": "Observation", "id": "o1", "status": "final", "code": {"text": "x"},
              "effectiveDateTime": "2025-06-02T10:00:00+01:00", "valueQuantity": {"value": 5, "unit": "mg"}})
    assert [ch.op for ch in diff(store, start)] == ["update"]  # another moment is a change


@pytest.mark.parametrize(("a", "b", "same"), [
    ("2025-06-02T10:00:00Z", "2025-06-02T10:00:00+00:00", True),
    ("2025-06-02T10:00:00Z", "2025-06-02T12:00:00.000+02:00", True),
    ("2025-06-02T10:00:00Z", "2025-06-02T10:00:01Z", False),
    ("2025-06-02", "2025-06-02T00:00:00Z", False),  # a date is not a moment
    (5, 5.0, True), (5, "5", False), (True, 1, False), ("final", "Final", False),
    ({"a": [1, {"b": "2025-01-01T00:00:00Z"}]}, {"a": [1.0, {"b": "2025-01-01T01:00:00+01:00"}]}, True),
    ([1, 2], [2, 1], False),
])
def test_fhir_equality_is_by_type(a, b, same):
    assert fhir_equal(a, b) is same and fhir_equal(b, a) is same


HTN, MI, SCT, ICD = "59621000", "22298006", "http://snomed.info/sct", "http://hl7.org/fhir/sid/icd-10-cm"


def _cc(*codings: tuple[str, str]) -> dict:
    return {"coding": [{"system": s, "code": c} for s, c in codings]}


def test_strict_checks_are_exact_where_the_meaning_is_single():
    assert coded("code", SCT, HTN)({"code": _cc((SCT, HTN))}, None) is None
    assert coded("code", SCT, HTN)({"code": _cc((SCT, HTN), (ICD, "I10"))}, None)  # undeclared: another concept
    assert coded("code", SCT, HTN, translations=[(ICD, "I10")])({"code": _cc((SCT, HTN), (ICD, "I10"))},
                                                                None) is None  # a declared translation
    assert coded("code", SCT, HTN)({"code": _cc((SCT, HTN), (SCT, MI))}, None)  # two concepts
    assert coded("code", SCT, HTN, extras=True)({"code": [_cc((SCT, HTN)), _cc((SCT, MI))]}, None) is None
    assert coded("code", SCT, HTN, extras=True)({"code": _cc((SCT, HTN), (SCT, MI))}, None)  # one says two things
    two_categories = {"category": [_cc(("c", "vital-signs")), _cc(("c", "laboratory"))]}
    assert coded("category", "c", "vital-signs")(two_categories, None)
    assert coded("category", "c", "vital-signs", extras=True)(two_categories, None) is None
    account = {"subject": [{"reference": "Patient/a"}, {"reference": "Patient/b"}]}
    assert ref("subject", "Patient/a")(account, None) and ref("subject", "Patient/a", extras=True)(account, None) is None
    assert ref("subject", "Patient/a")({"subject": [{"reference": "http://h/fhir/Patient/a"}]}, None) is None
    assert eq("status", "active")({"status": "active"}, None) is None
    assert eq("name.given", "Ann")({"name": [{"given": ["Ann", "Bea"]}]}, None)
    assert eq("valueQuantity.value", 5)({"valueQuantity": {"value": 5.0}}, None) is None
    assert one_of("address.state", ("MA", "Massachusetts"))({"address": [{"state": "MA"}, {"state": "NY"}]}, None)
    assert on_day("period.start", "2025-06-02")({"period": {"start": "2025-06-02T09:00:00Z"}}, None) is None
    assert instant("start", "2025-06-02T09:00:00Z")({"start": ["2025-06-02T09:00:00Z", "2025-06-03T09:00:00Z"]}, None)


ORDER = {"resourceType": "ServiceRequest", "status": "active", "intent": "order", "subject": {"reference": "Patient/p"}}


@pytest.mark.parametrize(("extra", "why"), [
    ({"doNotPerform": True}, "doNotPerform"),
    ({"status": "revoked"}, "status"),
    ({"status": "entered-in-error"}, "status"),
    ({"modifierExtension": [{"url": "http://x/negated", "valueBoolean": True}]}, "modifierExtension"),
])
def test_a_modifier_that_negates_a_created_resource_fails_it(extra, why):
    exp = Expect("create", "ServiceRequest", checks=(ref("subject", "Patient/p"), eq("intent", "order")))
    assert match([exp], [_change("create", "ServiceRequest", "s", None, ORDER)]).ok
    m = match([exp], [_change("create", "ServiceRequest", "s", None, {**ORDER, **extra})])
    assert not m.ok and why in m.unmet[0][1][0]
    patient = Expect("create", "Patient", checks=(eq("gender", "female"),))
    assert not match([patient], [_change("create", "Patient", "p", None, {"gender": "female", "active": False})]).ok


def test_a_modifier_the_task_asks_for_or_the_record_already_had_is_no_contradiction():
    cancel = Expect("update", "Appointment", id="a1", checks=(eq("status", "cancelled"),))
    assert match([cancel], [_change("update", "Appointment", "a1", APPT, {**APPT, "status": "cancelled"})]).ok
    old = {**ORDER, "doNotPerform": True, "note": [{"text": "x"}]}
    note = Expect("update", "ServiceRequest", id="s", checks=(eq("note.text", "y"),))
    assert match([note], [_change("update", "ServiceRequest", "s", old, {**old, "note": [{"text": "y"}]})]).ok


@pytest.mark.parametrize(("after", "ok"), [
    ({"meta": {"versionId": "2", "lastUpdated": "2025-06-03T00:00:00Z"}}, True),
    ({"effectiveDateTime": "2025-06-02T12:00:00+02:00"}, True),
    ({"text": {"status": "generated", "div": "<div>rewritten</div>"}}, False),
    ({"meta": {"versionId": "2", "security": [{"system": "s", "code": "R"}]}}, False),
    ({"meta": {"versionId": "2", "tag": [{"system": "s", "code": "t"}]}}, False),
    ({"meta": {"versionId": "2", "profile": ["http://x/p"]}}, False),
])
def test_preserve_covers_text_and_meta_but_not_what_the_server_manages(after, ok):
    before = {"resourceType": "Observation", "id": "o", "status": "final", "effectiveDateTime": "2025-06-02T10:00:00Z",
              "text": {"status": "generated", "div": "<div>5 mg</div>"},
              "meta": {"versionId": "1", "lastUpdated": "2025-06-02T00:00:00Z"}}
    exp = Expect("update", "Observation", id="o", checks=(eq("status", "amended"),))
    change = _change("update", "Observation", "o", before, {**before, "status": "amended", **after})
    assert match([exp], [change]).ok is ok


# -- failure modes ------------------------------------------------------------------------------------

def test_failure_modes_on_hand_built_runs():
    gold = [("searchResources", "createResource")]
    args = dict(sequences=gold, required_types=["Patient", "Condition"], prohibited=["deleteResource"])
    assert failure_modes(True, [], [], [], **args, collateral=False) == []
    assert failure_modes(False, ["getResourceById"], ["Patient"], [False], **args, collateral=False) == [
        "incorrect_tool_selection", "incorrect_resource_type"]
    assert failure_modes(False, ["createResource", "searchResources"], ["Condition", "Patient"], [False, False],
                         **args, collateral=False) == ["incorrect_tool_order"]
    assert failure_modes(False, ["searchResources", "createResource", "deleteResource"],
                         ["Patient", "Condition", "Condition"], [False, True, False], **args, collateral=True) == [
        "prohibited_tool", "tool_errors", "collateral_writes"]
    assert failure_modes(False, ["searchResources", "createResource"], ["Patient", "Condition"], [False, False],
                         **args, collateral=False) == ["other"]


def test_proximity():
    assert proximity(["a", "b"], [("a", "b")]) == {"lcs": 1.0, "jaccard": 1.0}
    assert proximity(["a", "x", "b"], [("a", "b"), ("z",)]) == {"lcs": round(2 / 3, 4), "jaccard": round(2 / 3, 4)}
    assert proximity([], [("a",)]) == {"lcs": 0.0, "jaccard": 0.0}


# -- instances ----------------------------------------------------------------------------------------

def test_frozen_now_covers_every_weekday_weekends_and_late_evenings():
    import random

    nows = [frozen_now(date(2025, 6, 2), random.Random(s)) for s in range(200)]
    assert {n.weekday() for n in nows} == set(range(7))
    assert any(n.hour >= 21 for n in nows) and any(n.hour < 6 for n in nows)
    assert all(n.tzinfo is UTC for n in nows)


def test_selectors():
    ids = {f.id for f in select("records.*")}
    assert "records.find_patient" in ids and all(i.startswith("records.") for i in ids)
    assert all(f.writes for f in select("writes")) and not any(f.writes for f in select("reads"))
    assert {f.id for f in select("records,-records.find_patient")} == ids - {"records.find_patient"}
    assert all(f.difficulty == 1 for f in select("d1"))
    from fhirgym.tasks import heldout_split

    split = heldout_split()
    assert [f.id for f in select("split:train")] == sorted(split["train"], key=[f.id for f in select("all")].index)
    assert {f.id for f in select("split:eval,-scheduling.*")} == {i for i in split["eval"] if not i.startswith("scheduling.")}
    with pytest.raises(KeyError):
        select("nonexistent.task")


def test_instances_are_deterministic_and_gold_is_fixed_before_the_agent_acts(small_world_path):
    world = TaskWorld.open(small_world_path)
    a = make_instance("records.record_condition", 5, world)
    b = make_instance("records.record_condition", 5, world)
    assert (a.prompt, a.params, a.now) == (b.prompt, b.params, b.now)
    assert [e.describe() for e in a.gold.expects] == [e.describe() for e in b.gold.expects]
    assert isinstance(a.now, datetime) and a.now.tzinfo is UTC
    find = make_instance("records.find_patient", 1, world)
    gold = find.gold.answer
    with find.open() as ep:  # the agent deletes the patient it was asked about: the gold does not move
        ep.client.delete("Patient", gold["patient_id"], cascade=True)
        assert find.gold.answer == gold
        verdict = ep.finish(f'<answer>{{"patient_id": "{gold["patient_id"]}"}}</answer>')
    assert not verdict.success and any("collateral" in r for r in verdict.reasons)
    with find.open() as ep:  # and each episode starts from the pre-run state again
        assert ep.client.read("Patient", gold["patient_id"]).status == 200
