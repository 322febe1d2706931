"""The QA question generator on the 10-patient world: coverage, splits, determinism, and every gold
answer recomputed by an independent SQL implementation (tests/_qa_oracle.py)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from _qa_oracle import Oracle
from fhirgym.tasks import TaskWorld
from fhirgym.tasks.qa import (
    SHAPES,
    TEMPLATES,
    build_questions,
    count_table,
    read_questions,
    reference_reply,
    score_answer,
    write_questions,
)
from fhirgym.tasks.qa._templates import BY_ID

PER_TEMPLATE = 8


@pytest.fixture(scope="module")
def world(small_world_path) -> TaskWorld:
    return TaskWorld.open(small_world_path)


@pytest.fixture(scope="module")
def questions(world):
    return build_questions(world, per_template=PER_TEMPLATE, seed=0)


def _same(a, b) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(a - b) <= 1e-3 * max(1.0, abs(b))  # the generator rounds to 4 decimals
    return a == b


def test_gold_answers_agree_with_an_independent_sql_recomputation(questions, small_world_path):
    oracle = Oracle(small_world_path)
    mismatches = []
    for q in questions:
        template = BY_ID[q.template]
        value, ids = oracle.answer(template.kind, template.op, q)
        if not _same(q.answer, value) or ids != q.gold_ids:
            mismatches.append((q.template, q.params, q.anchor, q.answer, value))
    assert not mismatches, mismatches[:5]
    patients = defaultdict(set)
    for q in questions:
        patients[q.template].add(q.patient_id)
    assert set(patients) == set(BY_ID)  # every template is checked ...
    assert min(len(p) for p in patients.values()) >= 3  # ... on several patients
    answered = {q.template for q in questions if not q.no_answer}
    assert len(answered) >= len(TEMPLATES) - 3  # and nearly every template with a real answer


def test_templates_cover_every_answer_shape_and_resource_type(questions):
    assert len(TEMPLATES) >= 40
    assert {t.shape for t in TEMPLATES} == set(SHAPES)
    types = {rtype for q in questions for rtype in q.gold_ids}
    assert {"Patient", "Encounter", "Observation", "Condition", "Procedure", "MedicationRequest", "Medication",
            "Location", "Specimen"} <= types


def test_splits_never_share_a_patient_and_follow_the_quota(questions):
    split_of = {}
    for q in questions:
        assert split_of.setdefault(q.patient_id, q.split) == q.split
    per = Counter((q.template, q.split) for q in questions)
    assert per[("lab_tested", "train")] == 4 and per[("lab_tested", "valid")] == per[("lab_tested", "test")] == 2
    assert len({q.id for q in questions}) == len(questions)


def test_about_a_quarter_of_questions_have_no_answer(questions):
    share = sum(q.no_answer for q in questions) / len(questions)
    assert 0.18 <= share <= 0.32, share
    for q in questions:  # no answer means no gold ids; only yes/no "no" and count 0 still carry a value
        if q.no_answer:
            assert q.answer is None or q.answer in (False, 0)
        else:
            assert q.answer is not None


def test_same_seed_same_questions_other_seed_other_questions(world):
    some = ["lab_value", "drug_name", "since_lab", "vital_by_period", "careunit"]
    a = build_questions(world, per_template=6, seed=3, templates=some)
    b = build_questions(world, per_template=6, seed=3, templates=some)
    c = build_questions(world, per_template=6, seed=4, templates=some)
    assert [q.to_json() for q in a] == [q.to_json() for q in b]
    assert [q.id for q in a] != [q.id for q in c]


def test_questions_round_trip_and_read_like_fhir_agentbench(questions, tmp_path):
    path = tmp_path / "qa.jsonl"
    assert write_questions(questions, path) == len(questions)
    back = read_questions(path)
    assert [q.to_json() for q in back] == [q.to_json() for q in questions]
    q = next(q for q in questions if q.template == "since_lab" and not q.no_answer)
    prompt = q.prompt()
    assert prompt.startswith(f"Question: {q.question}\nContext:\nPatient FHIR ID is {q.patient_id}.\n")
    assert f"Assume the current time is {q.anchor}." in prompt and "on the current hospital visit" in q.question
    assert "| lab_tested | yesno | 4 | 2 | 2 |" in count_table(questions)


def test_the_reference_reply_scores_right_and_a_wrong_one_scores_wrong(questions):
    for q in questions:
        assert score_answer(q, reference_reply(q)).correct, (q.template, q.answer, reference_reply(q))
        wrong = "The final answer is: no answer" if not q.no_answer else _wrong_reply(q)
        assert not score_answer(q, wrong).correct, (q.template, q.answer, wrong)


def _wrong_reply(q) -> str:
    """A real answer to a question that has none (for yes/no "no" and count 0 the opposite value)."""
    if q.shape == "yesno":
        return "The final answer is: Yes"
    if q.shape == "count":
        return "The final answer is: 3"
    return "The final answer is: 2024-01-01 10:00:00" if "datetime" in q.shape else "The final answer is: 42"


def test_cli_builds_a_question_file_and_scores_answers(small_world_path, tmp_path):
    import json

    from click.testing import CliRunner

    from fhirgym.cli import main

    out = tmp_path / "qa.jsonl"
    run = CliRunner().invoke(main, ["qa", "build", "--world", str(small_world_path), "--per-template", "6",
                                    "--templates", "lab_value,gender", "--out", str(out)])
    assert run.exit_code == 0, run.output
    assert "| lab_value | value | 4 | 1 | 1 |" in run.output and "questions/s" in run.output  # 6 → 4/1/1
    questions = read_questions(out)
    answers = tmp_path / "answers.jsonl"
    answers.write_text("\n".join(json.dumps({"id": q.id, "answer": reference_reply(q),
                                             "retrieved": q.gold_ids}) for q in questions))
    run = CliRunner().invoke(main, ["qa", "score", str(answers), "--questions", str(out)])
    assert run.exit_code == 0, run.output
    assert f"all            {len(questions):5}/{len(questions):<5} 100.0 %" in run.output
    assert "retrieval precision 1.000, recall 1.000" in run.output
