"""Prompting a small local model in its native tool format: compact tool descriptions, a worked example.

The GGUF's chat template puts the tools into the system prompt (Qwen: ``<tools>`` JSON lines) and renders
calls as ``<tool_call>`` and results as ``<tool_response>`` blocks; the backend keeps all of that and only
shortens what a 1.5B model has to read (every token is prefilled at ~40-150 tokens/s on two cores) and,
optionally, shows one complete exchange in that format before the task.
"""

from __future__ import annotations

import json
import re

from ._grammar import answer_tags

#: A sentence ends at ". " (not after "e.g."/"i.e.") before a letter.
_SENTENCE_END = re.compile(r"(?<![ei]\.[gex]\.)(?<=[.!?])\s+(?=[A-Za-z])")


def first_sentence(text: str, limit: int = 300) -> str:
    head = _SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    return head if len(head) <= limit else head[: limit - 1].rstrip() + "…"


def compact_tools(tools: list[dict]) -> list[dict]:
    """The same tools with descriptions cut to their first sentence (property ones to a short clause).

    Names, types, required lists and everything the grammar checks stay as they are.
    """
    return [_compact_tool(t) for t in tools]


def _compact_tool(tool: dict) -> dict:
    function = dict(tool.get("function", tool))
    if function.get("description"):
        function["description"] = first_sentence(function["description"])
    if isinstance(function.get("parameters"), dict):
        function["parameters"] = _compact_schema(function["parameters"])
    return {"type": "function", "function": function} if "function" in tool else function


def _compact_schema(schema: dict) -> dict:
    out = dict(schema)
    if isinstance(out.get("description"), str):
        out["description"] = re.split(r" \(|; ", first_sentence(out["description"], 100))[0]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _compact_schema(v) if isinstance(v, dict) else v for k, v in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _compact_schema(out["additionalProperties"])
    return out


EXAMPLE_TOOL = "searchResources"


def worked_example(tools: list[dict], tagged: bool = True) -> list[dict]:
    """One complete exchange in the native format (look up, then answer in the asked format), as chat
    messages to put between the system prompt and the task; empty when the tool it uses is absent.

    ``tagged``: the answer goes in answer tags as JSON (tasks with an answer schema); else it is a plain
    final sentence, as question answering asks for it (a small model copies the example's format: shown
    answer tags, it answered every question in them)."""
    names = {t.get("function", t).get("name") for t in tools}
    if EXAMPLE_TOOL not in names:
        return []
    if tagged:
        ask = ('Finish with your final answer as JSON inside answer tags, exactly like: '
               '<answer>{"birth_date":"<YYYY-MM-DD>"}</answer>. If nothing matches, answer <answer>{"found": false}</answer>.')
        final = answer_tags({"birth_date": "1961-04-02"})
    else:
        ask = ('When you have the answer, end your reply with "The final answer is: <answer>" '
               '("no answer" if the record holds none).')
        final = "Ada Example was born on 1961-04-02. The final answer is: 1961-04-02"
    question = f"Worked example. What is the birth date of the patient Ada Example?\n\n{ask}"
    arguments = {"resourceType": "Patient", "params": {"family": "Example", "given": "Ada"}}
    result = {"resourceType": "Patient", "total": 1, "returned": 1, "resources": [
        {"resourceType": "Patient", "id": "p-41", "name": [{"family": "Example", "given": ["Ada"]}],
         "gender": "female", "birthDate": "1961-04-02"}]}
    call = {"name": EXAMPLE_TOOL, "arguments": arguments}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"},
        {"role": "tool", "content": json.dumps(result)},
        {"role": "assistant", "content": final},
    ]
