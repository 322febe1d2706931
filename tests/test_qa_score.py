"""The deterministic QA matcher, shape by shape in both directions, and FHIR-AgentBench's retrieval P/R."""

from __future__ import annotations

import math

import pytest

from fhirgym.tasks.qa import final_answer, match_answer, retrieval_scores, says_no_answer


def ok(shape, gold, reply, **kw) -> bool:
    return match_answer(shape, gold, reply, **kw).correct


def test_the_answer_is_what_follows_the_last_marker_or_sits_in_answer_tags():
    assert final_answer("I looked.\nThe final answer is: 42 mg") == "42 mg"
    assert final_answer("final answer: yes") == "yes"
    assert final_answer("blah <answer>No</answer> more") == "No"
    assert final_answer("just 7") == "just 7"


@pytest.mark.parametrize("reply, right", [
    ("The final answer is: Yes", True), ("The final answer is: yes, twice in 2019.", True),
    ("The final answer is: True", True), ("The final answer is: 1", True),
    ("The final answer is: No", False), ("The final answer is: 0", False), ("The final answer is: maybe", False),
])
def test_yes_no(reply, right):
    assert ok("yesno", True, reply) is right
    assert ok("yesno", False, reply, no_answer=False) is (right is False and "maybe" not in reply)


def test_a_question_without_gold_ids_takes_a_no_answer_reply_and_its_zero_value():
    for reply in ("no answer", "None.", "There is no record of it.", "Not found", "[]", "No data found", "N/A"):
        assert says_no_answer(reply), reply
        assert ok("datetime", None, f"The final answer is: {reply}")
        assert ok("yesno", False, f"The final answer is: {reply}", no_answer=True)
        assert not ok("yesno", True, f"The final answer is: {reply}", no_answer=False)
        assert not ok("value", 4.2, f"The final answer is: {reply}")
    assert not says_no_answer("No") and not says_no_answer("0") and not says_no_answer("None of 3 values, it was 5")
    assert ok("yesno", False, "The final answer is: No", no_answer=True)
    assert ok("count", 0, "The final answer is: 0", no_answer=True)
    assert not ok("count", 0, "The final answer is: 2", no_answer=True)
    assert not ok("sum", None, "The final answer is: 12")
    assert not ok("value", 1.0, "") and not ok("value", 1.0, None)


def test_datetimes_match_to_the_minute():
    gold = "2024-03-05 14:07:33"
    assert ok("datetime", gold, "The final answer is: 2024-03-05 14:07:00")
    assert ok("datetime", gold, "The final answer is: 2024-03-05T14:07:59Z")
    assert ok("datetime", gold, "It was at 2024-03-05T15:07:10+01:00")
    assert not ok("datetime", gold, "The final answer is: 2024-03-05 14:08:00")
    assert not ok("datetime", gold, "The final answer is: 2024-03-05")
    assert not ok("datetime", gold, "The final answer is: no answer")


def test_datetime_lists_are_sets_to_the_minute():
    gold = ["2021-01-02 03:04:05", "2022-06-07 08:09:10"]
    assert ok("datetime_list", gold, "2022-06-07 08:09, 2021-01-02 03:04")
    assert not ok("datetime_list", gold, "2021-01-02 03:04:05")
    assert not ok("datetime_list", gold, "2021-01-02 03:04:05, 2022-06-07 08:09:10, 2023-01-01 00:00:00")


def test_categorical_strings_need_every_gold_phrase():
    assert ok("text", ["Metformin 500 MG Oral Tablet"], "The final answer is: metformin 500 mg oral tablet.")
    assert ok("text", ["A", "Bcd"], "The final answer is: bcd and a")
    assert not ok("text", ["A", "Bcd"], "The final answer is: bcd")
    assert ok("text", ["female"], "The final answer is: F")
    assert not ok("text", ["male"], "The final answer is: female")
    assert ok("text", ["male"], "The final answer is: Male")
    assert not ok("text", ["Medicine"], "The final answer is: Surgery")


def test_numbers_with_tolerance_and_units():
    assert ok("value", 7.46, "The final answer is: 7.46 mg/dL", tolerance=0.05)
    assert ok("value", 7.46, "The final answer is: 7.5", tolerance=0.05)
    assert not ok("value", 7.46, "The final answer is: 7.6", tolerance=0.05)
    assert ok("value", 1234.5, "The final answer is: 1,234.5 mL", tolerance=0.05)
    assert ok("aggregate", 2000.0, "The average was 2000 mg in 2019", tolerance=0.05)
    assert ok("difference", -1.2, "The final answer is: −1.2", tolerance=0.05)
    assert not ok("difference", -1.2, "The final answer is: 1.2", tolerance=0.05)
    # elapsed time and lengths of stay: whole units, other time units converted
    assert ok("elapsed", 49.6, "The final answer is: 49 hours", unit="hours", tolerance=1.0)
    assert ok("elapsed", 49.6, "The final answer is: 2.07 days", unit="hours", tolerance=1.0)
    assert not ok("elapsed", 49.6, "The final answer is: 2 hours", unit="hours", tolerance=1.0)
    assert ok("duration", 2.49, "The final answer is: 2.5 days", unit="days", tolerance=0.5)
    assert ok("duration", 2.49, "The final answer is: 60 hours", unit="days", tolerance=0.5)
    assert not ok("duration", 2.49, "The final answer is: 3.5 days", unit="days", tolerance=0.5)
    assert ok("value", 80.0, "The final answer is: 176.4 lb", unit="kg", tolerance=0.05)
    # the first number once dates are removed
    assert ok("count", 3, "Since 2019-01-01 there were 3 visits (in 2020 and 2021).")
    assert not ok("count", 3, "The final answer is: 4")
    assert not ok("count", 3, "The final answer is: three")


def test_grouped_lists_in_order_each_within_tolerance():
    gold = [5.1, 6.0, 7.25]
    assert ok("grouped", gold, "2021-03: 5.1; 2021-04: 6; 2021-05: 7.25", tolerance=0.05)
    assert ok("grouped", gold, "The final answer is: [5.1, 6.0, 7.3]", tolerance=0.05)
    assert not ok("grouped", gold, "The final answer is: [6.0, 5.1, 7.25]", tolerance=0.05)
    assert not ok("grouped", gold, "The final answer is: [5.1, 6.0]", tolerance=0.05)
    assert not ok("grouped", gold, "The final answer is: [5.1, 6.0, 7.25, 8]", tolerance=0.05)


def test_retrieval_precision_and_recall_follow_fhir_agentbench():
    gold = {"Observation": ["o1", "o2"], "Medication": ["m1"]}
    # only the gold's types count; recall is binary, precision continuous
    assert retrieval_scores(gold, {"Observation": ["o1", "o2", "o3"], "Medication": ["m1"], "Patient": ["p"]}) \
        == (0.75, 1.0)
    assert retrieval_scores(gold, {"Observation": ["Observation/o1"], "Medication": ["m1"]}) == (1.0, 0.0)
    assert retrieval_scores(gold, {"Observation": ["o1", "o1", "o2", "x"], "Medication": ["m1"]}) == (0.8, 1.0)
    # the edge-case table: gold empty & predicted empty -> (1, 1); gold but nothing predicted -> (NaN, 0)
    assert retrieval_scores({}, {}) == (1.0, 1.0)
    assert retrieval_scores({}, {"Observation": ["o1"]}) == (1.0, 1.0)  # other types never count
    p, r = retrieval_scores(gold, {"Patient": ["p"]})
    assert math.isnan(p) and r == 0.0
    p, r = retrieval_scores({"Observation": []}, {"Observation": ["o1"]})  # gold type, no gold id
    assert p == 0.0 and math.isnan(r)
