"""The QA track through the same episode seam, runner and report as the action tasks.

A QA question is an Instance of its own family (``qa.<template>``): the reference reads exactly the gold
resources and replies the gold (100 %, perfect retrieval), the constant "nothing found" reply scores
exactly the share of no-answer questions (its recorded floor), a wrong answer fails, and the result
lines carry shape, gold types and FHIR-AgentBench's retrieval P/R, which the report breaks down.
"""

from __future__ import annotations

import orjson
import pytest

from fhirgym.agents import ReactAgent, ScriptedBackend
from fhirgym.env import Episode
from fhirgym.runner import EvalError, EvalSpec, run_eval
from fhirgym.tasks import TaskWorld
from fhirgym.tasks.qa import build_questions, qa_instance, retrieved_ids
from fhirgym.tasks.qa._instance import FINAL_ANSWER

TEMPLATES = "qa.lab_value,qa.count_drugs,qa.gender,qa.lab_tested"


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def test_reference_nothing_found_and_null_on_qa(world, tmp_path):
    lines = {a: run_eval(EvalSpec(out=tmp_path / a, agent=a, track="qa", tasks=TEMPLATES, seeds=[0, 1, 2]), world)
             for a in ("reference", "nothing-found", "null")}
    ref = lines["reference"]
    assert ref and all(r["status"] == "pass" for r in ref)
    assert {r["task_id"] for r in ref} == set(TEMPLATES.split(","))
    assert all(r["qa"]["retrieval"] == {"precision": 1.0, "recall": 1.0} for r in ref)
    assert all(r["category"] == "qa" and not r["writes"] for r in ref)
    from test_runner import FIELDS

    assert all(set(r) == FIELDS for r in ref)  # every documented field, qa included
    for nf in lines["nothing-found"]:  # the floor is what the constant reply actually scores
        assert nf["success"] == nf["floor_nothing_found"] == nf["qa"]["no_answer"]
    assert not any(r["success"] for r in lines["null"])
    run = orjson.loads((tmp_path / "reference" / "run.json").read_bytes())
    assert run["identity"]["track"] == "qa" and run["identity"]["split"] == "valid"

    from fhirgym.analysis import compute_metrics, load_results

    metrics = compute_metrics(load_results([tmp_path / "reference", tmp_path / "null"]), n_boot=50)
    rows = {(r["label"], r["by"], r["key"]): r for r in metrics["qa"]}
    assert rows[("reference · baseline", "all", "all")]["accuracy"] == 100.0
    assert rows[("reference · baseline", "all", "all")]["recall"] == 100.0
    assert rows[("null · baseline", "all", "all")]["accuracy"] == 0.0
    assert ("reference · baseline", "shape", "count") in rows and ("reference · baseline", "gold type", "Patient") in rows


def test_a_model_answer_is_judged_by_the_matcher(world, tmp_path):
    q = next(q for q in build_questions(world, 10) if q.split == "valid" and q.template == "gender")
    right = "The final answer is: " + ("female" if str(q.answer).lower().startswith("f") else "male")
    for text, ok in ((right, True), ("The final answer is: unknown", False)):
        agent = ReactAgent(ScriptedBackend([text]))
        [line] = run_eval(EvalSpec(out=tmp_path / str(ok), agent="react", model="scripted", track="qa",
                                   tasks="qa.gender", seeds=[0]), world, agent=agent)
        assert line["success"] is ok and line["qa"]["shape"] == q.shape


def test_qa_instances_keep_their_gold_from_agents(world):
    q = next(q for q in build_questions(world, 10) if q.split == "valid" and not q.no_answer)
    inst = qa_instance(q, world)
    with Episode(inst) as ep:
        obs = ep.reset()
        assert obs.prompt == q.prompt() + "\n\n" + FINAL_ANSWER  # the question and the format, nothing more
        inst.gold.answer.answer = "tampered"  # the episode judges on its frozen copy
        assert ep.submit("The final answer is: tampered").success is False


def test_retrieved_ids_read_searches_and_codeact_fetches():
    outputs = [{"resourceType": "Observation", "resources": [{"resourceType": "Observation", "id": "o1"}]},
               {"ids": {"Observation": ["o2"], "Patient": ["p1"]}, "fetched": {"Observation": 1}},
               {"resourceType": "Patient", "id": "p1", "name": [{"family": "x"}]}]
    assert retrieved_ids(outputs) == {"Observation": ["o1", "o2"], "Patient": ["p1", "p1"]}


def test_qa_track_errors_are_clear(world, tmp_path):
    with pytest.raises(EvalError, match="selects no QA template"):
        run_eval(EvalSpec(out=tmp_path / "a", agent="null", track="qa", tasks="qa.nope"), world)
    with pytest.raises(EvalError, match="sealed"):
        run_eval(EvalSpec(out=tmp_path / "b", agent="null", track="qa", tasks="qa.gender", sealed=True), world)


def test_a_codeact_episode_answers_a_question_end_to_end(world, tmp_path):
    """fhir_query fetches the patient into the workspace, code reads the answer there, the plain final
    answer is judged by the matcher and the fetch counts as retrieval."""
    from fhirgym.agents import CodeActAgent

    q = next(q for q in build_questions(world, 10) if q.split == "valid" and q.template == "gender")

    def final(messages):
        observed = orjson.loads(messages[-1]["content"].removeprefix("Execution result:\n"))
        return f"The patient is {observed['answer']}. The final answer is: {observed['answer']}"

    script = [f'<tool_call>{{"name": "fhir_query", "arguments": {{"resource_type": "Patient", '
              f'"patient_id": "{q.patient_id}"}}}}</tool_call>',
              "```python\nanswer = retrieved_resources['Patient'][0]['gender']\n```", final]
    [line] = run_eval(EvalSpec(out=tmp_path / "c", agent="codeact", model="scripted", config="codeact", track="qa",
                               tasks="qa.gender", seeds=[0]), world, agent=CodeActAgent(ScriptedBackend(script)))
    assert [c["name"] for c in line["tool_calls"]] == ["fhir_query", "python"]
    assert line["success"] is True and line["stop_reason"] == "answered", line["final_answer"]
    assert line["qa"]["retrieval"] == {"precision": 1.0, "recall": 1.0}
