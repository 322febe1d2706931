"""A negative answer needs evidence: "nothing found" (action) and "no answer" (QA) pass strictly only after
a successful search or read of a type the claim is about, in the validator and in ``Episode.verdict()``."""

from __future__ import annotations

import pytest

from fhirgym.env import Episode
from fhirgym.tasks import NOT_FOUND, TaskWorld, answer_text, make_instance
from fhirgym.tasks._evidence import looked_at
from fhirgym.tools import ToolCall

NOTHING = answer_text(NOT_FOUND)


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def _negative(world, family: str):
    for seed in range(10):
        inst = make_instance(family, seed, world)
        if inst.gold.answer is NOT_FOUND:
            return inst
    raise AssertionError(f"{family} has no negative seed in 0-9")


def _call(name: str, error: str | None = None, **arguments) -> ToolCall:
    return ToolCall(name, arguments, {}, error, arguments.get("resourceType"), 0.0)


def test_what_a_run_looked_at():
    calls = [_call("searchResources", resourceType="Patient", params={"_revinclude": "Coverage:beneficiary"}),
             _call("getResourceById", resourceType="Account", resourceId="a"),
             _call("getResourceById", "404: not found", resourceType="Condition", resourceId="x"),
             _call("fhir_query", resource_type="Observation", patient_id="p"),
             _call("fhir_get", query="ServiceRequest?patient=p&_revinclude=Provenance:target"),
             _call("createResource", resourceType="Basic", body={}),
             _call("getStructureDefinition", resourceType="Encounter")]
    assert looked_at(calls) == {"Patient", "Coverage", "Account", "Observation", "ServiceRequest", "Provenance"}
    assert looked_at([c.to_json() for c in calls]) == looked_at(calls)  # a transcript's JSON too


@pytest.mark.parametrize("family", ["billing.no_coverage", "records.patient_not_found", "clinical.last_hba1c"])
def test_nothing_found_passes_only_after_a_look(world, family):
    inst = _negative(world, family)
    about = inst.evidence_types
    assert "Patient" not in about or about == ("Patient",)
    with inst.open() as fork:
        blind = fork.finish(NOTHING)
        assert not blind.success and blind.unsupported_negative and blind.answer_ok
        assert any("needs a look at the record" in r for r in blind.reasons)
        if about != ("Patient",):  # finding the patient is not looking at what the claim is about
            assert not fork.finish(NOTHING, calls=[_call("searchResources", resourceType="Patient")]).success
        failed = _call("searchResources", "400: unknown parameter", resourceType=about[0])
        assert not fork.finish(NOTHING, calls=[failed]).success
        looked = fork.finish(NOTHING, calls=[_call("searchResources", resourceType=about[0], params={})])
        assert looked.success and not looked.unsupported_negative


def test_the_episode_verdict_applies_the_rule(world):
    inst = _negative(world, "billing.no_coverage")
    with Episode(inst) as ep:
        ep.reset()
        assert not ep.submit(NOTHING).success and ep.floor() is False
    with Episode(inst) as ep:
        ep.reset()
        ep.step({"name": "searchResources", "arguments": {"resourceType": "Coverage",
                                                          "params": {"beneficiary": f"Patient/{inst.params['patient_id']}"}}})
        assert ep.submit(NOTHING).success
    assert inst.reference.verdict.success  # the reference solution looks before it says so


def test_a_no_answer_question_needs_a_retrieval_of_its_kind(world):
    from fhirgym.tasks.qa import build_questions, qa_instance

    question = next(q for q in build_questions(world, per_template=5, seed=0) if q.no_answer)
    inst = qa_instance(question, world)
    kind = inst.evidence_types
    with inst.open() as fork:
        assert not fork.finish("The final answer is: no answer").success
        call = _call("searchResources", resourceType=kind[0], params={"patient": question.patient_id})
        assert fork.finish("The final answer is: no answer", calls=[call]).success
