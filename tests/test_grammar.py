"""The turn grammar of constrained decoding, checked by llama.cpp's own grammar engine without a model.

Acceptance is decided exactly as during generation: llama.cpp's grammar sampler (``llama_sampler_init_grammar``)
over the Qwen2.5 tokenizer, fed the text's tokens one by one — a token the grammar forbids gets logit -inf —
and at the end asked whether the end-of-turn token is allowed. Only the GGUF's vocabulary is loaded
(``vocab_only``, ~0.2 s); no weights, no inference. Valid calls are generated from every tool schema we ship
(FHIR_TOOLS + SPEC_TOOLS), valid answers from every task family's answer spec.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import re
from typing import Any

import pytest

from fhirgym.agents._grammar import ground, seen_ids, turn_grammar
from fhirgym.agents._prompt import compact_tools, worked_example
from fhirgym.agents._toolcalls import parse_tool_calls
from fhirgym.tasks import families
from fhirgym.tools import FHIR_TOOLS, SPEC_TOOLS

TOOLS = [t.openai_schema() for t in (*FHIR_TOOLS, *SPEC_TOOLS)]
NAMES = {t["function"]["name"] for t in TOOLS}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


# ---------------------------------------------------------------------------------- llama.cpp's matcher


class Matcher:
    """Runs llama.cpp's grammar sampler over a text's tokens (the Qwen vocabulary, no weights)."""

    def __init__(self) -> None:
        import llama_cpp

        from fhirgym.agents._weights import model_path

        self.lib = llama_cpp
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(model_path("qwen2.5-coder-0.5b")).encode(), params)
        assert self.model, "could not load the vocabulary"
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.eot = llama_cpp.llama_vocab_eot(self.vocab)
        if self.eot < 0:
            self.eot = llama_cpp.llama_vocab_eos(self.vocab)

    def tokens(self, text: str) -> list[int]:
        data = text.encode()
        buf = (llama_cpp_token := self.lib.llama_token * (len(data) + 8))()
        del llama_cpp_token
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, True)
        assert n >= 0
        return list(buf[:n])

    def sampler(self, grammar: str) -> Any:
        smpl = self.lib.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not smpl:
            raise ValueError("llama.cpp rejected the grammar")
        return smpl

    def _allowed(self, smpl: Any, token: int) -> bool:
        data = (self.lib.llama_token_data * 1)()
        data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
        arr = self.lib.llama_token_data_array(data, 1, -1, False)
        self.lib.llama_sampler_apply(smpl, ctypes.byref(arr))
        return not math.isinf(data[0].logit)

    def accepts(self, grammar: str, text: str) -> bool:
        """The whole text is a complete turn: every token allowed in order, then the end of turn."""
        smpl = self.sampler(grammar)
        try:
            for token in self.tokens(text):
                if not self._allowed(smpl, token):
                    return False
                self.lib.llama_sampler_accept(smpl, token)
            return self._allowed(smpl, self.eot)
        finally:
            self.lib.llama_sampler_free(smpl)

    def close(self) -> None:
        self.lib.llama_model_free(self.model)


@pytest.fixture(scope="module")
def matcher():
    m = Matcher()
    yield m
    m.close()


@pytest.fixture(scope="module")
def grammar() -> str:
    """All shipped tools; a turn after a look-up (answers allowed), no answer schema."""
    return turn_grammar(TOOLS, None)


# ------------------------------------------------------------------------ valid values from a JSON schema

STRINGS = ["Patient", "", 'say "hi" \\ back', "ge2025-06-09", "Müller – 東京", "</tool_call>", "a\nb"]


def values(schema: dict) -> list[Any]:
    """Several values valid against ``schema`` (the subset of JSON schema our tools and answers use)."""
    if "anyOf" in schema:
        return [v for alt in schema["anyOf"] for v in values(alt)]
    if "const" in schema:
        return [schema["const"]]
    kind = schema.get("type")
    if isinstance(kind, list):
        return [v for k in kind for v in values({**schema, "type": k})]
    if kind == "string":
        fmt = schema.get("format")
        if fmt == "date":
            return ["2025-06-09"]
        if fmt == "date-time":
            return ["2025-06-09T09:30:00Z", "2025-06-09T09:30:00.000+02:00"]
        return [v for v in STRINGS if re.search(schema["pattern"], v)] if "pattern" in schema else STRINGS
    if kind == "integer":
        return [0, 7, -3, 1234567]
    if kind == "number":
        return [0, 7.25, -0.5, 1e-3, 120]
    if kind == "boolean":
        return [True, False]
    if kind == "array":
        items = schema.get("items")
        return [[], ["a", "b"]] if items is None else [[], values(items)[:2]]
    if kind == "object" or "properties" in schema:
        return objects(schema)
    raise AssertionError(f"schema kind not covered: {schema}")


def objects(schema: dict) -> list[dict]:
    # as the toolbox checks arguments: listed properties only (no listing and no additionalProperties: any)
    props = schema.get("properties", {})
    if "properties" not in schema and "additionalProperties" not in schema:
        return [{}, {"resourceType": "Patient", "name": [{"family": "Ng", "given": ["Al"]}], "active": True}]
    required = [k for k in props if k in schema.get("required", [])]
    optional = [k for k in props if k not in required]
    out = []
    # each property's every value once, with the required ones at their first value
    base = {k: values(props[k])[0] for k in required}
    out.append(dict(base))
    for key in props:
        for value in values(props[key]):
            obj = {k: (value if k == key else v) for k, v in base.items()}
            if key in optional:
                obj = {**base, key: value}
                obj = {k: obj[k] for k in [*required, *[o for o in optional if o in obj]]}
            out.append(obj)
    if optional:  # all optional ones at once
        out.append({**base, **{k: values(props[k])[0] for k in optional}})
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        out.append({"patient": "Patient/1", "status": "free", "_count": 10, "start": ["ge2025-06-09", "lt2025"],
                    "active": True})
    return out


def call_text(name: str, arguments: Any, *, ensure_ascii: bool = False) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=ensure_ascii)
    return f"<tool_call>\n{body}\n</tool_call>"


VALID_CALLS = [(name, args) for name, schema in SCHEMAS.items() for args in objects(schema)]


# --------------------------------------------------------------------------------------------- accepted


def test_llama_cpp_parses_the_grammars(matcher):
    for answer in [None, *(f.answer.json_schema() for f in families() if f.answer is not None)]:
        for allow in (True, False):
            matcher.lib.llama_sampler_free(matcher.sampler(turn_grammar(TOOLS, answer, allow_answer=allow)))


def test_accepts_every_valid_call_of_every_shipped_tool(matcher, grammar):
    assert len(VALID_CALLS) > 100 and {n for n, _ in VALID_CALLS} == NAMES
    rejected = [(n, a) for n, a in VALID_CALLS if not matcher.accepts(grammar, call_text(n, a))]
    assert not rejected, rejected[:5]
    # the same with \\u escapes (ASCII-only JSON), and what the parser makes of an accepted call
    for name, args in VALID_CALLS[::7]:
        assert matcher.accepts(grammar, call_text(name, args, ensure_ascii=True))
        if "</tool_call>" in json.dumps(args):
            continue  # the lenient parser's tag regex stops at the first closing tag (grammar accepts it)
        calls, rest = parse_tool_calls(call_text(name, args), NAMES)
        assert [(c.name, c.arguments) for c in calls] == [(name, args)] and rest == ""


def test_several_calls_and_bounded_reasoning(matcher, grammar):
    read = call_text("getResourceById", {"resourceType": "Patient", "resourceId": "7"})
    search = call_text("searchResources", {"resourceType": "Slot", "params": {"status": "free"}})
    assert matcher.accepts(grammar, read + "\n" + search)
    assert not matcher.accepts(grammar, "First I find the free slots.\n" + search)  # no reasoning by default
    thinking = turn_grammar(TOOLS, None, reasoning=160)
    assert matcher.accepts(thinking, "First I find the free slots.\n" + search)
    assert not matcher.accepts(thinking, "x" * 161 + "\n" + search)  # reasoning is bounded
    assert not matcher.accepts(thinking, "I call <b>it</b> now\n" + search)  # and plain
    assert not matcher.accepts(grammar, "\n".join([read] * 4))  # at most three calls a turn
    assert not matcher.accepts(grammar, read + search)  # calls on their own lines


def test_accepts_every_family_answer_format(matcher):
    specs = {f.id: f.answer for f in families() if f.answer is not None}
    assert len(specs) > 20
    for family, spec in specs.items():
        g = turn_grammar(TOOLS, spec.json_schema())
        schema = spec.json_schema()
        for value in values(schema)[:12]:
            text = "<answer>" + json.dumps(value, ensure_ascii=False) + "</answer>"
            assert matcher.accepts(g, text), (family, text)
            assert spec.parse(text) is not None
        if spec.none_allowed:
            assert matcher.accepts(g, '<answer>{"found": false}</answer>')
        placeholder = {f.name: "<text>" for f in spec.fields}  # copied from the format statement
        assert not matcher.accepts(g, "<answer>" + json.dumps(placeholder) + "</answer>"), family
        wrong = {f.name: {"nested": 1} for f in spec.fields}
        assert not matcher.accepts(g, "<answer>" + json.dumps(wrong) + "</answer>"), family


def test_tasks_without_answer_format_end_with_a_sentence(matcher, grammar):
    assert matcher.accepts(grammar, "I booked the appointment and cancelled the old one.")
    assert matcher.accepts(grammar, '<answer>{"done": true}</answer>')
    with_spec = turn_grammar(TOOLS, {"type": "object", "properties": {"count": {"type": "integer"}},
                                     "required": ["count"]})
    assert not matcher.accepts(with_spec, "There are 3.")  # a format was asked for: only that


def test_worked_example_turns_are_valid(matcher, grammar):
    example = worked_example(TOOLS)
    assert example and matcher.accepts(grammar, example[1]["content"])
    assert matcher.accepts(turn_grammar(TOOLS, {"type": "object", "properties": {
        "birth_date": {"type": "string", "format": "date"}}, "required": ["birth_date"]}), example[3]["content"])


def test_a_task_without_answer_schema_is_shown_a_plain_final_answer(matcher, grammar):
    """QA asks for "The final answer is: …": shown answer tags, the 1.5B answered every question in them."""
    plain = worked_example(TOOLS, tagged=False)
    assert plain[1] == worked_example(TOOLS)[1]  # the same look-up
    assert plain[3]["content"].endswith("The final answer is: 1961-04-02") and "<answer>" not in plain[3]["content"]
    assert '"The final answer is: <answer>"' in plain[0]["content"]
    assert matcher.accepts(grammar, plain[3]["content"])


def test_with_a_python_tool_a_turn_may_be_one_code_block(matcher):
    from fhirgym.agents._grammar import looked_up
    from fhirgym.tools import CODEACT_TOOLS

    code_tools = [*TOOLS, *(t.openai_schema() for t in CODEACT_TOOLS)]
    block = '```python\nrows = search("Observation", {"patient": "p-1"})\nanswer = len(rows)\n```'
    first = turn_grammar(code_tools, None, allow_answer=False)
    assert matcher.accepts(first, block)  # code is a look-up: allowed before any tool result
    assert not matcher.accepts(first, "The final answer is: 3")
    assert not matcher.accepts(first, "```python\nx = 1")  # the fence must close
    assert not matcher.accepts(turn_grammar(TOOLS, None), block)  # no python tool: no code turn
    assert looked_up([{"role": "assistant", "content": block}, {"role": "user", "content": "Execution result: 3"}])
    assert not looked_up([{"role": "user", "content": "How many?"}])


# --------------------------------------------------------------------------------------------- rejected

READ = {"resourceType": "Patient", "resourceId": "7"}
MALFORMED = {
    "unknown tool": call_text("deletePatient", READ),
    "missing required argument": call_text("getResourceById", {"resourceType": "Patient"}),
    "wrong type": call_text("getResourceById", {"resourceType": 5, "resourceId": "7"}),
    "integer as string": call_text("searchResources", {"resourceType": "Slot", "page_limit": "5"}),
    "unknown argument": call_text("getResourceById", {**READ, "verbose": True}),
    "trailing garbage": call_text("getResourceById", READ) + " thanks!",
    "text after the call": call_text("getResourceById", READ) + "\nNow I wait.",
    "unclosed call": call_text("getResourceById", READ)[: -len("</tool_call>")],
    "broken JSON": "<tool_call>\n{\"name\": \"getResourceById\", \"arguments\": {\"resourceType\": \"Patient\",}}\n</tool_call>",
    "fenced call": "```json\n" + json.dumps({"name": "getResourceById", "arguments": READ}) + "\n```",
    "bare JSON call": json.dumps({"name": "getResourceById", "arguments": READ}),
    "parameters instead of arguments": "<tool_call>\n" + json.dumps(
        {"name": "getResourceById", "parameters": READ}) + "\n</tool_call>",
    "schema echo as a call": "<tool_call>\n" + json.dumps(
        {"name": "searchResources", "arguments": SCHEMAS["searchResources"]}) + "\n</tool_call>",
    "schema echo as JSON": json.dumps(TOOLS[:2]),
    "schema echo as XML, then an answer": "<tools><function><name>searchResources</name><parameters><type>object"
    "</type></parameters></function></tools>\n<answer>{\"found\": false}</answer>",
    "XML call": "<function><name>getResourceById</name><arguments><resourceType>Patient</resourceType>"
    "<resourceId>7</resourceId></arguments></function>",
    "reasoning with markup": "I call <b>it</b> now\n" + call_text("getResourceById", READ),
    "empty turn": "",
    "two answers": '<answer>{"a": 1}</answer><answer>{"a": 2}</answer>',
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_rejects_malformed_turns(matcher, grammar, case):
    assert not matcher.accepts(grammar, MALFORMED[case])


def test_first_turn_must_call_a_tool(matcher):
    first = turn_grammar(TOOLS, None, allow_answer=False)
    assert matcher.accepts(first, call_text("listResourceTypes", {}))
    assert not matcher.accepts(first, '<answer>{"found": false}</answer>')
    assert not matcher.accepts(first, "Nothing to do.")


def test_only_the_episode_tools_exist(matcher):
    read_only = [t for t in TOOLS if t["function"]["name"] in ("getResourceById", "searchResources")]
    g = turn_grammar(read_only, None)
    assert matcher.accepts(g, call_text("getResourceById", READ))
    assert not matcher.accepts(g, call_text("deleteResource", READ))


def test_seen_ids_come_from_the_task_and_tool_results_only():
    messages = [{"role": "system", "content": "e.g. Patient/sys-1"},
                {"role": "user", "content": "Cancel Appointment/ap-9 for Mrs Diaz."},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "getResourceById",
                                                                               "arguments": {"resourceId": "made-up"}}}]},
                {"role": "assistant", "content": "Patient/made-up-2"},
                {"role": "tool", "content": json.dumps({"resources": [{"resourceType": "Patient", "id": "p.7",
                                                                       "generalPractitioner": [{"reference": "Practitioner/pr-3"}]}]})},
                {"role": "tool", "content": json.dumps({"id": "ap-9"})}]
    assert seen_ids(messages) == ["p.7", "pr-3", "ap-9"]  # each once, latest last


def test_resource_ids_are_grounded_in_what_the_episode_showed(matcher):
    none_yet = turn_grammar(TOOLS, None, allow_answer=False, ids=[])
    assert not matcher.accepts(none_yet, call_text("getResourceById", READ))  # nothing shown: nothing to read
    assert not matcher.accepts(none_yet, call_text("deleteResource", READ))
    assert matcher.accepts(none_yet, call_text("searchResources", {"resourceType": "Patient", "params": {"family": "Ng"}}))
    shown = turn_grammar(TOOLS, None, ids=["p.7", "ap-9"])
    assert matcher.accepts(shown, call_text("getResourceById", {"resourceType": "Appointment", "resourceId": "ap-9"}))
    assert not matcher.accepts(shown, call_text("getResourceById", {"resourceType": "Patient", "resourceId": "p-41"}))
    assert turn_grammar(TOOLS, None) == turn_grammar(TOOLS, None, ids=None)  # ids=None: not grounded
    names = [t["function"]["name"] for t in ground(TOOLS, [])]
    assert "searchResources" in names and not {"getResourceById", "updateResource", "deleteResource"} & set(names)


def test_compact_tools_keep_what_the_grammar_checks():
    compact = compact_tools(TOOLS)
    assert [t["function"]["name"] for t in compact] == [t["function"]["name"] for t in TOOLS]
    for full, short in zip(TOOLS, compact):
        f, s = full["function"], short["function"]
        assert s["parameters"].get("required") == f["parameters"].get("required")
        assert set(s["parameters"].get("properties", {})) == set(f["parameters"].get("properties", {}))
        assert len(s["description"]) <= len(f["description"])
    assert len(json.dumps(compact)) < 0.9 * len(json.dumps(TOOLS))
    search = next(t for t in compact if t["function"]["name"] == "searchResources")["function"]
    assert "e.g. resourceType 'Slot'" in search["description"]  # the example survives


def test_answer_schema_of_each_kind():
    spec = next(f.answer for f in families() if f.answer is not None and f.answer.none_allowed)
    schema = spec.json_schema()
    assert schema["anyOf"][1] == {"type": "object", "properties": {"found": {"const": False}},
                                  "required": ["found"]}
    assert list(itertools.chain.from_iterable(s.get("required", []) for s in schema["anyOf"]))
