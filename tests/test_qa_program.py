"""The reference CodeAct programs of the QA track: a third implementation of every template's gold.

Every question of the 10-patient build is answered by its program over what the real ``fhir_query`` /
``fhir_get`` tools fetch (run through a CodeAct ``Episode``, cached per call), executed in process; its
answer must equal the generator's gold, pass the matcher as the documented reply, and equal the SQL
oracle's (tests/_qa_oracle.py). A handful run end to end: the fetches, the ``python`` tool in the
sandbox, and the reply submitted to the episode for a strict verdict.
"""

from __future__ import annotations

import ast
import json
import os
from collections import defaultdict

import pytest

from _qa_oracle import Oracle
from fhirgym.env import Episode
from fhirgym.tasks import TaskWorld
from fhirgym.tasks.qa import (
    TEMPLATES,
    QaFamily,
    build_questions,
    program_reply,
    qa_instance,
    read_facts,
    reference_program,
    render_answer,
    score_answer,
)
from fhirgym.tasks.qa._templates import BY_ID
from fhirgym.tools import sandbox_probe
from test_qa_generate import _same

PER_TEMPLATE = 8


@pytest.fixture(scope="module")
def world(small_world_path) -> TaskWorld:
    return TaskWorld.open(small_world_path)


@pytest.fixture(scope="module")
def questions(world):
    return build_questions(world, per_template=PER_TEMPLATE, seed=0)


@pytest.fixture(scope="module")
def fetch(world, questions):
    """``fetch(question, program)`` -> ``retrieved_resources`` as the CodeAct tools build it: each fetch
    is a real tool call in a fresh codeact episode (cached per call: the world is read-only), merged
    by type and id as the workspace merges them."""
    instance = qa_instance(questions[0], world)
    cache: dict[str, dict[str, list[dict]]] = {}

    def retrieved(program) -> dict[str, list[dict]]:
        merged: dict[str, dict[str, dict]] = {}
        for call in program.fetches:
            key = json.dumps(call, sort_keys=True)
            if key not in cache:
                with Episode(instance, "codeact") as ep:
                    ep.reset()
                    result = ep.step(call)
                    assert result.error is None, result.output
                    cache[key] = ep.workspace.retrieved()
            for rtype, resources in cache[key].items():
                merged.setdefault(rtype, {}).update((r["id"], r) for r in resources)
        return {rtype: list(by_id.values()) for rtype, by_id in merged.items()}

    return retrieved


def _run(program, retrieved_resources: dict) -> object:
    """The program in plain Python: its source exec'd with only ``retrieved_resources`` given."""
    namespace = {"retrieved_resources": retrieved_resources}
    exec(compile(program.code, f"<program {program.template}>", "exec"), namespace)
    return namespace.get("answer")


@pytest.fixture(scope="module")
def answers(questions, fetch) -> dict[str, object]:
    return {q.id: _run(reference_program(q), fetch(reference_program(q))) for q in questions}


def test_every_template_has_a_program_that_reproduces_the_gold(world, questions, answers):
    wrong = [(q.template, q.params, q.anchor, q.answer, answers[q.id]) for q in questions
             if not _same(answers[q.id], q.answer) or not score_answer(q, program_reply(answers[q.id])).correct]
    assert not wrong, wrong[:5]
    patients, answered = defaultdict(set), set()
    for q in questions:
        patients[q.template].add(q.patient_id)
        if not q.no_answer:
            answered.add(q.template)
    assert set(patients) == set(BY_ID) and len(BY_ID) >= 40  # every template, ...
    assert min(len(p) for p in patients.values()) >= 3  # ... on several patients ...
    assert len(answered) >= len(TEMPLATES) - 3  # ... nearly all with a real answer too
    assert {q.patient_id for q in questions} == {f.id for f in read_facts(world)}  # and every patient


def test_programs_agree_with_the_sql_oracle(questions, answers, small_world_path):
    oracle = Oracle(small_world_path)
    wrong = []
    for q in questions:
        template = BY_ID[q.template]
        value, _ = oracle.answer(template.kind, template.op, q)
        if not _same(answers[q.id], value):
            wrong.append((q.template, q.params, q.anchor, value, answers[q.id]))
    assert not wrong, wrong[:5]


def test_programs_compute_from_the_records_not_from_the_gold(questions):
    """Without the fetched records no answered question comes out right: the answer is in the data."""
    answered = [q for q in questions if not q.no_answer]
    assert len(answered) > 0.6 * len(questions)
    assert not [q.template for q in answered if score_answer(q, program_reply(_run(reference_program(q), {}))).correct]


def test_a_program_is_stdlib_python_with_the_question_as_literals(questions):
    for q in questions:
        program = reference_program(q)
        assert program == reference_program(q)  # deterministic
        tree = ast.parse(program.code)
        imports = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        imports |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert imports <= {"datetime"}, imports
        assert "fhirgym" not in program.code
        if q.template not in ("gender", "marital_status"):
            assert f'NOW = when("{q.anchor}")' in program.code
        for name in q.params.get("names") or [q.params.get("name")] * ("name" in q.params):
            assert json.dumps(name, ensure_ascii=False) in program.code
        assert len(program.code.splitlines()) <= 70
        assert all(c["arguments"].get("patient_id", q.patient_id) == q.patient_id for c in program.fetches)


def test_the_first_fetch_is_of_the_questions_kind(questions):
    """A "no answer" passes only after a look at the question's kind: the program's first fetch is one."""
    from fhirgym.tasks._evidence import looked_at

    for q in questions:
        first = reference_program(q).fetches[0]
        assert looked_at([first]) & set(QaFamily(q).negative_evidence), (q.template, first)
    assert any(q.no_answer for q in questions)


def test_the_reply_renders_the_answer_the_way_the_matcher_reads_it():
    assert program_reply(None) == "The final answer is: no answer"
    assert [render_answer(a) for a in (True, False, 0, [], ["Home"], ["A", "B"], [1.5, 2.0], 12.3456, 1e-05)] == [
        "yes", "no", "0", "no answer", "Home", "A, B", "1.5, 2.0", "12.3456", "0.00001"]
    with pytest.raises(ValueError, match="unknown template"):
        reference_program(type("Q", (), {"template": "nope"})())


@pytest.fixture(scope="module")
def sandboxed():
    p = sandbox_probe()
    if not p.available and os.geteuid() != 0:
        pytest.skip(f"python sandbox unavailable and not root: {'; '.join(p.missing)}")
    assert p.available, p.missing  # as root (CI) it must work: scripts/test.sh installs bubblewrap


# one question each: a Location include, a referenced Medication, a current visit, a grouped list, and two
# without answer (a "no" and a "no answer"): each needs its look at the record to pass strictly
END_TO_END = {
    "careunit": lambda q: q.template == "careunit" and "Location" in q.gold_ids,
    "drug_name-medication": lambda q: q.template == "drug_name" and "Medication" in q.gold_ids,
    "since_admission": lambda q: q.template == "since_admission" and not q.no_answer,
    "vital_by_period": lambda q: q.template == "vital_by_period" and not q.no_answer,
    "lab_tested-no": lambda q: q.template == "lab_tested" and q.no_answer,
    "lab_value-no-answer": lambda q: q.template == "lab_value" and q.no_answer,
}


@pytest.mark.parametrize("case", END_TO_END)
def test_a_program_passes_strictly_in_a_codeact_episode(case, world, questions, answers, sandboxed):
    q = next(q for q in questions if END_TO_END[case](q))
    program = reference_program(q)
    with Episode(qa_instance(q, world), "codeact") as ep:
        ep.reset()
        for call in program.tool_calls():
            result = ep.step(call)
            assert result.error is None, (call["name"], result.output)
        out = result.output
        assert not out.get("error") and not out.get("answer_truncated"), out
        assert out.get("answer") == answers[q.id]  # the sandbox computes what plain Python computed
        verdict = ep.submit(program_reply(out.get("answer")))
        assert verdict.success, verdict.reasons
        assert [c.name for c in ep.calls] == [c["name"] for c in program.tool_calls()]
