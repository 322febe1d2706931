"""Lenient extraction of tool calls that a model wrote as text.

Small local models (and many models behind vLLM/Ollama without a tool parser) do not return structured
``tool_calls``: Qwen2.5 is trained on ``<tool_call>{json}</tool_call>`` tags, the Coder variants prefer a
```` ```json ```` fence, others print a bare JSON object. We try those three forms in that order and accept
the usual object shapes, so one agent loop works with all of them. Anything that is not a well-formed call
stays in the text, where the agent (and the transcript) can see it.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from ._backend import RequestedCall

_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n?(.*?)```", re.DOTALL)
_FENCE_LANGS = {"", "json", "json5", "tool_call", "tool_code", "javascript", "js"}
_DECODER = json.JSONDecoder()


def parse_tool_calls(text: str, tool_names: set[str] | None = None) -> tuple[list[RequestedCall], str]:
    """Find tool calls in ``text``; return them (ids ``call_0``, ``call_1``, ...) and the remaining text.

    Forms, first that yields a call wins: ``<tool_call>`` tags, else fenced code blocks, else bare
    top-level JSON objects (or arrays of them). Shapes: ``{"name", "arguments"}``, ``{"name",
    "parameters"}``, ``{"function": {...}}``; string arguments are JSON-decoded. Last resort, the XML
    form small models sometimes copy from their template (``<function><name>N</name><arguments><k>v</k>
    </arguments></function>``), for known tool names only. Names not in
    ``tool_names`` are still returned (the agent tells the model), but outside tags a call must carry its
    arguments key unless its name is a known tool, so ordinary JSON with a ``name`` field is not a call.
    """
    if not text:
        return [], text or ""
    for finder in (_from_tags, _from_fences, _from_bare, _from_xml):
        found = finder(text, tool_names)
        if found:
            calls = [
                RequestedCall(id=f"call_{i}", name=name, arguments=args)
                for i, (name, args) in enumerate(_flat(found))
            ]
            return calls, _remove(text, [span for span, _ in found])
    return [], text


Found = list[tuple[tuple[int, int], list[tuple[str, dict[str, Any]]]]]


def _flat(found: Found) -> list[tuple[str, dict[str, Any]]]:
    return [call for _, calls in found for call in calls]


def _from_tags(text: str, tool_names: set[str] | None) -> Found:
    found: Found = []
    for match in _TAG.finditer(text):
        body = match.group(1)
        fenced = _FENCE.fullmatch(body.strip())
        if fenced:
            body = fenced.group(2)
        calls = _calls_in_json(body.strip(), tool_names, strict=False)
        if calls:
            found.append((match.span(), calls))
    return found


def _from_fences(text: str, tool_names: set[str] | None) -> Found:
    found: Found = []
    for match in _FENCE.finditer(text):
        if match.group(1).lower() not in _FENCE_LANGS:
            continue
        calls = _calls_in_json(match.group(2).strip(), tool_names, strict=True)
        if calls:
            found.append((match.span(), calls))
    return found


def _from_bare(text: str, tool_names: set[str] | None) -> Found:
    """Scan for top-level JSON values; a decoded value that is not a call is skipped whole (not searched)."""
    found: Found = []
    i = 0
    while True:
        starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
        if not starts:
            return found
        start = min(starts)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        calls = _calls_in_value(value, tool_names, strict=True)
        if calls:
            start, end = _unwrap_braces(text, start, end)
            found.append(((start, end), calls))
        i = end


_XML_CALL = re.compile(r"<function>\s*<name>\s*([A-Za-z_][\w]*)\s*</name>\s*<(arguments|parameters)>(.*?)</\2>"
                       r"\s*</function>", re.DOTALL)
_XML_ARG = re.compile(r"<([A-Za-z_][\w]*)>(.*?)</\1>", re.DOTALL)


def _xml_value(raw: str) -> Any:
    inner = _XML_ARG.findall(raw)
    if inner:
        return {k: _xml_value(v) for k, v in inner}
    text = raw.strip()
    if text[:1] in "{[" or text in ("true", "false", "null"):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(text)
    return text  # scalars stay text: the toolbox converts to the schema's type where that is exact


def _from_xml(text: str, tool_names: set[str] | None) -> Found:
    found: Found = []
    for match in _XML_CALL.finditer(text):
        name = match.group(1)
        if not tool_names or name not in tool_names:
            continue
        if match.group(2) == "parameters" and "<type>" in match.group(3):
            continue  # an echoed schema, not a call
        args = _xml_value(match.group(3))
        found.append(((match.start(), match.end()), [(name, args if isinstance(args, dict) else {})]))
    return found


def _unwrap_braces(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen a call's span over stray braces around it: Qwen sometimes writes ``{{"name": ...}}``."""
    while True:
        left = len(text[:start].rstrip())
        right = len(text) - len(text[end:].lstrip())
        if left > 0 and right < len(text) and text[left - 1] == "{" and text[right] == "}":
            start, end = left - 1, right + 1
        else:
            return start, end


def _calls_in_json(body: str, tool_names: set[str] | None, strict: bool) -> list[tuple[str, dict[str, Any]]]:
    """A block holds one JSON value (a call or a list of calls), or several calls one per line."""
    try:
        return _calls_in_value(json.loads(body), tool_names, strict)
    except json.JSONDecodeError:
        pass
    calls: list[tuple[str, dict[str, Any]]] = []
    pos = 0
    while pos < len(body):
        try:
            value, end = _DECODER.raw_decode(body, pos)
        except json.JSONDecodeError:
            return []
        found = _calls_in_value(value, tool_names, strict)
        if not found:
            return []
        calls.extend(found)
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n,;":
            pos += 1
    return calls


def _calls_in_value(
    value: Any, tool_names: set[str] | None, strict: bool
) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(value, list):  # a list counts only if every item is a call
        calls = [_call(item, tool_names, strict) for item in value]
        return [c for c in calls if c is not None] if value and None not in calls else []
    call = _call(value, tool_names, strict)
    return [call] if call else []


def _call(obj: Any, tool_names: set[str] | None, strict: bool) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None:
        if strict and not (tool_names and name in tool_names):
            return None
        return name.strip(), {}
    args = obj[key]
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    if key == "parameters" and args.get("type") == "object" and isinstance(args.get("properties"), dict):
        return None  # an echo of a tool's JSON-schema definition (small models copy the tool list), not a call
    return name.strip(), args


def _remove(text: str, spans: list[tuple[int, int]]) -> str:
    """Cut the call spans out, joining the prose around each with at most one space."""
    kept, last = [], 0
    for start, end in sorted(spans):
        kept.append(text[last:start])
        last = end
    kept.append(text[last:])
    remaining = kept[0]
    for piece in kept[1:]:
        left, right = remaining.rstrip(" \t"), piece.lstrip(" \t")
        glue = " " if left and right and left[-1] != "\n" and right[0] not in "\n.,;:!?" else ""
        remaining = left + glue + right
    remaining = re.sub(r"[ \t]+\n", "\n", remaining)
    return re.sub(r"\n{3,}", "\n\n", remaining).strip()
