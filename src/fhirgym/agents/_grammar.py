"""The grammar a local model's turn is generated under: tool calls that exist, or a final answer.

Small models given free rein rewrote the tool definitions as XML, wrapped calls in Markdown fences or
answered before looking anything up. Under this GBNF grammar a turn is an optional bounded line of
reasoning, then calls in Qwen's native ``<tool_call>`` form of the episode's tools with arguments valid
against their schema, or (with ``python``) one fenced code block, or the final ``<answer>`` in the task's
format; only an end-of-turn token may follow. A ``resourceId`` must be an id the episode has shown
(:func:`seen_ids`): without that the 1.5B made ids up in 31 of 65 episodes. The argument grammars come from
llama-cpp-python's own JSON-schema converter. docs/LOCAL-AGENT.md has the options and what they bought.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Characters a reasoning line may not contain: the ones that open markup, JSON or a fence.
_PLAIN = r"[^<>{}\n\r`]"
#: The tool a fenced code block stands for (the CodeAct agent runs each block through it).
CODE_TOOL = "python"
CODE_FENCE = "```python\n"
#: The argument that names an existing resource; grounded in the ids the episode has shown.
ID_ARGUMENT = "resourceId"
#: An id in a tool result (``"id": "…"``) or a reference in any text (``Patient/…``); FHIR id syntax.
_SHOWN_ID = re.compile(r'"id"\s*:\s*"([A-Za-z0-9\-.]{1,64})"|\b[A-Z][A-Za-z]+/([A-Za-z0-9\-.]{1,64})\b')
#: At most this many ids (the most recent) in a grammar, so it stays small.
MAX_GROUNDED_IDS = 256


def tool_parameters(tools: list[dict]) -> list[tuple[str, dict]]:
    """(name, parameters schema) of OpenAI tool schemas, in order."""
    out = []
    for tool in tools:
        function = tool.get("function", tool)
        out.append((function["name"], function.get("parameters") or {"type": "object", "properties": {}}))
    return out


def seen_ids(messages: list[dict]) -> list[str]:
    """The resource ids the task and the tool results have shown, oldest first, each once (the model's own
    turns do not count: an id it wrote is not evidence that the resource exists)."""
    ids: dict[str, None] = {}
    for message in messages:
        if message.get("role") in ("user", "tool") and isinstance(message.get("content"), str):
            for match in _SHOWN_ID.finditer(message["content"]):
                ids.pop(found := match.group(1) or match.group(2), None)
                ids[found] = None
    return list(ids)[-MAX_GROUNDED_IDS:]


def ground(tools: list[dict], ids: list[str]) -> list[dict]:
    """The tools with their ``resourceId`` argument restricted to ``ids``; tools that require one are left
    out while there is none (they could only name a made-up resource)."""
    out = []
    for tool in tools:
        function = tool.get("function", tool)
        params = function.get("parameters") or {}
        if ID_ARGUMENT not in params.get("properties", {}):
            out.append(tool)
            continue
        if not ids:
            if ID_ARGUMENT in params.get("required", ()):
                continue
            properties = {k: v for k, v in params["properties"].items() if k != ID_ARGUMENT}
        else:
            properties = {**params["properties"], ID_ARGUMENT: {"enum": list(ids)}}
        grounded = {**function, "parameters": {**params, "properties": properties}}
        out.append({**tool, "function": grounded} if "function" in tool else grounded)
    return out


def turn_grammar(
    tools: list[dict],
    answer_schema: dict | None = None,
    *,
    reasoning: int = 0,
    max_calls: int = 3,
    allow_answer: bool = True,
    plain_answer: bool | None = None,
    ids: list[str] | None = None,
) -> str:
    """GBNF for one assistant turn (see the module docstring).

    ``reasoning``: at most this many characters of plain text before the call or answer (0: none).
    ``max_calls``: calls per turn. ``allow_answer=False``: the turn must call a tool (e.g. the first turn,
    so an answer is never given without a look-up). ``plain_answer``: a final plain sentence is allowed
    (default: only when there is no answer schema). ``ids``: ground ``resourceId`` arguments in these
    (:func:`ground`; ``None``: any id).
    """
    if ids is not None:
        tools = ground(tools, ids)
    from llama_cpp.llama_grammar import SchemaConverter  # loads llama.cpp: only when a grammar is built

    if not tools and not allow_answer:
        raise ValueError("a turn with no tools must be allowed to answer")
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    branches = []
    for name, params in tool_parameters(tools):
        schema = converter.resolve_refs(json.loads(json.dumps(params)), name)
        rule = converter.visit(schema, f"tool-{name}")
        head = json.dumps(name) + ", " + json.dumps("arguments") + ": "
        branches.append(f"{_literal(head)} {rule}")
    lines = []
    alternatives = []
    if branches:
        lines.append('turn-call ::= "<tool_call>\\n{\\"name\\": " (' + " | ".join(branches) + ') "}\\n</tool_call>"')
        lines.append(f'turn-calls ::= turn-call ("\\n" turn-call){{0,{max(0, max_calls - 1)}}}')
        alternatives.append("turn-calls")
    if any(name == CODE_TOOL for name, _ in tool_parameters(tools)):
        # code up to a closing fence; the reply's token limit bounds its length
        lines.append(f'turn-code ::= {_literal(CODE_FENCE)} [^`]+ "```"')
        alternatives.append("turn-code")
    if allow_answer:
        rule = converter.visit(json.loads(json.dumps(answer_schema or {"type": "object"})), "answer")
        finals = [f'"<answer>" {rule} "</answer>"']
        if plain_answer or (plain_answer is None and answer_schema is None):
            finals.append(f"{_PLAIN}{{1,300}}")
        lines.append("turn-final ::= " + " | ".join(finals))
        alternatives.append("turn-final")
    root = "(" + " | ".join(alternatives) + ")"
    if reasoning > 0:
        lines.append(f'turn-reason ::= {_PLAIN}{{1,{reasoning}}} "\\n"')
        root = "turn-reason? " + root
    return "\n".join([f"root ::= {root}", *lines, converter.format_grammar()]) + "\n"


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def answer_tags(value: Any) -> str:
    """An answer object as the grammar writes it (for worked examples)."""
    return "<answer>" + json.dumps(value, ensure_ascii=False) + "</answer>"


def looked_up(messages: list[dict]) -> bool:
    """Whether the chat already holds a tool result or ran a code block (before that, a turn must act)."""
    return any(m.get("role") == "tool" or (m.get("role") == "assistant" and CODE_FENCE in (m.get("content") or ""))
               for m in messages)


#: The function an endpoint without grammars is made to call for its final answer (``tool_choice``).
ANSWER_TOOL = "final_answer"


def answer_tool(answer_schema: dict | None) -> dict:
    """The final answer as one more tool, so ``tool_choice="required"`` still lets a model finish."""
    value = answer_schema if answer_schema is not None else {"type": "string", "description": "what you did"}
    return {"type": "function", "function": {
        "name": ANSWER_TOOL, "description": "Give your final answer; this ends the task.",
        "parameters": {"type": "object", "properties": {"answer": value}, "required": ["answer"]}}}


def answer_from_call(arguments: dict) -> str:
    """The final text an ``final_answer`` call stands for (tags around an object, a sentence as is)."""
    value = arguments.get("answer", arguments)
    return value if isinstance(value, str) else answer_tags(value)
