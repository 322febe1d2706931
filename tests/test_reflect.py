"""Structured reflections: the evaluator's and reflector's replies are generated under their JSON schema on
every backend (scripted; llama.cpp's grammar sampler on a tiny random-weight model; an OpenAI-compatible
fake endpoint under each FHIRGYM_CONSTRAIN mode), parse, and are checked; without a structured output the
prompt-only reply is checked and retried, never accepted as it comes; lessons are checked for content."""

from __future__ import annotations

import json

import jsonschema
import orjson
import pytest

from fhirgym.agents import ChatResult, LocalBackend, ReactAgent, RequestedCall, ScriptedBackend
from fhirgym.memory import (
    CRITIQUE_SCHEMA,
    Malformed,
    TrainSpec,
    evaluate,
    lesson_problem,
    lessons_schema,
    reflect,
    train_memory,
)
from fhirgym.memory._reflect import Usage, _check_critique, _check_lessons, prompt_passages, screen_lessons
from fhirgym.tasks import TaskWorld
from test_backends import FakeEndpoint, _completion

DIGEST = "## Task request\nFind the patient.\n\n## Validator verdict\n{\"success\": false}"
CRITIQUE = {"score": 3, "critique": "The agent answered without searching.", "failure_tags": ["incorrect_tool_selection"],
            "advice": "Search Patient by name and birth date first."}
LESSONS = {"macro": "Search Patient by family name and birth date before answering with its id.",
           "micro": [{"resource_type": "Patient", "operation": "search",
                      "tip": "Pass family and birthdate as separate search parameters."}]}


def _json(value: dict) -> str:
    return orjson.dumps(value).decode()


@pytest.mark.parametrize("claimed", ["scripted", None])
def test_the_scripted_backend_is_sent_each_schema_and_the_replies_parse(claimed):
    jsonschema.validate(CRITIQUE, CRITIQUE_SCHEMA)
    jsonschema.validate(LESSONS, lessons_schema(False))
    backend = ScriptedBackend([_json(CRITIQUE), _json(LESSONS)], structured_output=claimed)
    usage = Usage()
    critique = evaluate(backend, DIGEST, usage)
    lessons = reflect(backend, DIGEST, critique, usage, with_specs=False)
    assert critique == CRITIQUE and lessons["macro"] == LESSONS["macro"] and lessons["rejected"] == []
    sent = [r.json_schema for r in backend.requests]
    assert sent == ([CRITIQUE_SCHEMA, lessons_schema(False)] if claimed else [None, None])
    assert usage.calls == 2 and usage.seconds >= 0


def test_with_specs_the_json_comes_from_a_constrained_call_after_the_look_ups():
    lookup = ChatResult("", [RequestedCall("c1", "getStructureDefinition", {"resourceType": "Patient",
                                                                      "path": "Patient.birthDate"})], 10, 5)
    final = {**LESSONS, "micro": [{**LESSONS["micro"][0], "spec_paths": ["Patient.birthDate"]}]}
    jsonschema.validate(final, lessons_schema(True))
    backend = ScriptedBackend([lookup, "I have checked the specification.", _json(final)], structured_output="scripted")
    lessons = reflect(backend, DIGEST, CRITIQUE, Usage(), with_specs=True)
    assert lessons["micro"][0]["spec_paths"] == ["Patient.birthDate"] and len(lessons["consulted"]) == 1
    first, prose, constrained = backend.requests
    assert first.tools and first.json_schema is None and prose.tools  # the tool rounds: free, with tools
    assert constrained.tools is None and constrained.json_schema == lessons_schema(True)
    # the prose reply that was no JSON is not in the conversation the constrained call continues
    assert all(m.get("content") != "I have checked the specification." for m in constrained.messages)


def test_a_malformed_reply_is_retried_with_the_error_then_raises():
    backend = ScriptedBackend(["Sure! The score is 3.", _json(CRITIQUE)], structured_output="scripted")
    assert evaluate(backend, DIGEST, Usage()) == CRITIQUE
    retry = backend.requests[1]
    assert "no JSON object in the reply" in retry.messages[-1]["content"] and retry.json_schema == CRITIQUE_SCHEMA
    cut = ChatResult('{"score": 3, "critique": "The agent', [], 10, 2048, "length")
    with pytest.raises(Malformed, match="cut off at the token limit"):
        evaluate(ScriptedBackend([cut, cut], structured_output="scripted"), DIGEST, Usage())


PROMPT = prompt_passages("evaluator", "reflector")


@pytest.mark.parametrize(("text", "reason"), [
    ("The macro lesson, 1-4 sentences", "restates the prompt: 3 of its 3 content words"),  # the field description
    ("Strategy for this kind of task as a whole: planning, which tools in which order.", "restates the prompt"),
    ("For Observation codes mind the JSON structure of a resource, search parameters that work with LOINC.",
     "restates the prompt: copies"),
    ("Search the patient, then read the patient, then search the patient, then read the patient again.",
     "repeats itself"),
    ("Search first.", "too short: 2 word(s)"),
    ("   ", "too short: 0 word(s)"),
    ("VԺuwT^~gМgМgМgМפwinۨ雗7̊䑗7̊ search Patient by name", "not written text"),
    ("Search Patient by family name and birthdate, then answer with the id of the single match.", None),
    ("Call the right tools in the right order and check the answer format.", None),
    ("Search before you answer.", None),
])
def test_lesson_content_check(text, reason):
    problem = lesson_problem(text, PROMPT)
    assert problem == reason if reason is None else problem.startswith(reason), problem


def test_screening_drops_what_is_no_lesson_and_says_why():
    good = {"resource_type": "Appointment", "operation": "update", "tip": "Cancel by setting status to cancelled."}
    other = {**good, "tip": "Read the appointment again after the update to see its new status."}
    lessons = _check_lessons({"macro": "the macro lesson, 1-4 sentences", "micro": [
        good, {**good, "resource_type": "MRN", "tip": "Search by MRN."}, other, good, good]})
    rejected = screen_lessons(lessons, with_specs=False)
    assert lessons["macro"] is None and lessons["micro"] == [{**t, "spec_paths": []} for t in (good, other)]
    assert [r["reason"].split(":")[0] for r in rejected] == [
        "restates the prompt", "not an R4 resource type", "beyond the 3 tips asked for", "beyond the 3 tips asked for"]


def test_screening_drops_the_task_request_restated_and_one_tip_written_for_several_pairs():
    request = ("Record a blood pressure of 128/82 mmHg for Ana Diaz (born May 2, 1961), taken just now. Chart it "
               "as a vital-signs Observation with status final, LOINC 85354-9 (blood pressure panel).")
    same = "The agent should read the {} resource to find the correct patient's ID and name."
    lessons = _check_lessons({"macro": "Record a blood pressure of <VALUE> mmHg for <VALUE> (born <DATE>), taken "
                                       "just now, as a vital-signs Observation with status final.",
                              "micro": [{"resource_type": t, "operation": "read", "tip": same.format(t)}
                                        for t in ("Account", "ActivityDefinition")]
                              + [{"resource_type": "Observation", "operation": "create",
                                  "tip": "Put systolic and diastolic in two components, each with its own LOINC code."}]})
    rejected = screen_lessons(lessons, with_specs=False, request=request)
    assert lessons["macro"] is None and [t["resource_type"] for t in lessons["micro"]] == ["Observation"]
    assert [r["reason"] for r in rejected][1:] == ["the same tip for 2 pairs: about none of them"] * 2
    assert rejected[0]["reason"].startswith("restates the prompt")
    kept = _check_lessons({"macro": "Chart the two pressures as components of one panel Observation.", "micro": []})
    assert screen_lessons(kept, with_specs=False, request=request) == [] and kept["macro"]


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def test_training_stores_only_checked_lessons_and_counts_what_it_dropped(world, tmp_path):
    restated = {"macro": "The macro lesson, 1-4 sentences", "micro": [
        {"resource_type": "Patient", "operation": "search", "tip": "Search Patient by family and birthdate together."},
        {"resource_type": "MRN", "operation": "search", "tip": "Search the identifier with the MRN system."}]}
    evaluator = ScriptedBackend([_json(CRITIQUE), "no", "still no"], structured_output="scripted")
    reflector = ScriptedBackend([_json(restated)], structured_output="scripted")
    actor = ReactAgent(ScriptedBackend(['<answer>{"patient_id": "0000"}</answer>'] * 4))
    out = tmp_path / "mem"
    store = train_memory(TrainSpec(out=out, tasks="records.find_patient", seeds=[0], trials=2, model="scripted"),
                         world, actor=actor, evaluator=evaluator, reflector=reflector)
    assert [x.text for x in store.lessons] == ["Search Patient by family and birthdate together."]
    first, second = (orjson.loads(x) for x in (out / "training.jsonl").read_bytes().splitlines())
    assert first["lessons"] == 1 and [r["reason"].split(":")[0] for r in first["rejected"]] == [
        "restates the prompt", "not an R4 resource type"]
    assert second["skipped"] == {"stage": "evaluator", "reason": "no JSON object in the reply", "structured": "scripted"}
    summary = json.loads((out / "training.json").read_text())
    assert summary["reflections"] == {"runs": 2, "malformed": {"evaluator": 1, "reflector": 0}, "lessons": 1,
                                      "rejected": 2, "rejected_by_reason": {"restates the prompt": 1,
                                                                            "not an R4 resource type": 1}}
    assert summary["structured"] == {"evaluator": "scripted", "reflector": "scripted"}
    assert summary["evaluator"]["calls"] == 3 and summary["reflector"]["calls"] == 1
    assert summary["reflection_calls"] == 4 and summary["actor_seconds"] > 0


def test_local_grammar_from_the_schema_makes_random_weights_write_schema_valid_json(tmp_path):
    """llama.cpp's grammar sampler over a random-weight model: whatever the weights, the reply is the schema's
    JSON (a real model differs only in what it writes inside the strings)."""
    pytest.importorskip("gguf")
    from _tiny_gguf import tiny_qwen2_gguf

    backend = LocalBackend(str(tiny_qwen2_gguf(tmp_path / "tiny.gguf")), n_ctx=8192, n_threads=1)
    usage = Usage()
    critique = evaluate(backend, DIGEST, usage)  # the production path: schema, cap, parse, check
    assert usage.calls == 1 and 0 <= critique["score"] <= 10 and critique["critique"][0].isalpha()
    schema = lessons_schema(True)
    reply = backend.chat([{"role": "system", "content": "Reflect."}, {"role": "user", "content": DIGEST}],
                         json_schema=schema, max_tokens=8192)  # random text: more tokens per character
    assert reply.finish_reason == "stop"
    value = json.loads(reply.text)
    jsonschema.validate(value, schema)
    lessons = _check_lessons(value)
    rejected = screen_lessons(lessons, with_specs=True)
    assert all(r["reason"] for r in rejected)  # random text is no lesson, and is said to be none
    kept = ([lessons["macro"]] if lessons["macro"] else []) + [t["tip"] for t in lessons["micro"]]
    assert all(lesson_problem(t, prompt_passages("evaluator", "reflector", "reflector_specs")) is None for t in kept)
    with pytest.raises(ValueError, match="takes no tools"):
        backend.chat([{"role": "user", "content": "x"}], [{"type": "function", "function": {"name": "f"}}],
                      json_schema=schema)


@pytest.mark.parametrize("mode", ["tool_choice", "grammar", "structured_outputs", None])
def test_openai_compatible_reflections_follow_the_agents_constrain_flag(mode):
    endpoint = FakeEndpoint([(200, _completion(_json(CRITIQUE)), {})])
    backend = endpoint.backend(constrain=mode)
    assert evaluate(backend, DIGEST, Usage()) == CRITIQUE
    body = endpoint.bodies[0]
    held = {k for k in ("response_format", "grammar", "structured_outputs") if k in body}
    assert held == ({backend.structured_output} if mode else set()) and "tools" not in body
    if mode == "tool_choice":
        assert body["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "reply", "strict": True, "schema": CRITIQUE_SCHEMA}}
    elif mode == "grammar":
        assert "\nroot ::= " in body["grammar"] and 'score-kv ::= "\\"score\\""' in body["grammar"]
    elif mode == "structured_outputs":
        assert body["structured_outputs"] == {"json": CRITIQUE_SCHEMA}


def test_openai_strict_schema_drops_what_strict_mode_refuses():
    endpoint = FakeEndpoint([(200, _completion('{"maxLength": "ab"}'), {})])
    schema = {"type": "object", "properties": {"maxLength": {"type": "string", "maxLength": 5}},
              "required": ["maxLength"], "additionalProperties": False}
    endpoint.backend(constrain="tool_choice").chat([{"role": "user", "content": "x"}], json_schema=schema)
    sent = endpoint.bodies[0]["response_format"]["json_schema"]["schema"]
    assert sent["properties"] == {"maxLength": {"type": "string"}}  # the keyword goes, the property stays


def test_openai_without_structured_outputs_checks_the_prompt_json_and_retries():
    garbage = (200, _completion("Here is my critique: the agent did fine."), {})
    endpoint = FakeEndpoint([garbage, (200, _completion("```json\n" + _json(CRITIQUE) + "\n```"), {})])
    assert evaluate(endpoint.backend(), DIGEST, Usage()) == CRITIQUE
    assert "no JSON object" in endpoint.bodies[1]["messages"][-1]["content"]
    bad_tags = {**CRITIQUE, "failure_tags": ["made_up"]}
    endpoint = FakeEndpoint([(200, _completion(_json(bad_tags)), {})])
    with pytest.raises(Malformed, match="failure_tags must be a list of"):
        evaluate(endpoint.backend(), DIGEST, Usage())
    assert len(endpoint.bodies) == 2  # asked twice, accepted never
    with pytest.raises(ValueError):
        _check_critique({**CRITIQUE, "critique": "  "})
