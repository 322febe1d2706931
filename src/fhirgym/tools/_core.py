"""What a tool is, and the one place tools are called.

A :class:`Tool` is defined once (name, description, JSON schema, handler) and served three ways: in
process through a :class:`Toolbox` (reference solutions, agents, RL envs), over MCP (``fhirgym.mcp``),
and as OpenAI function schemas for model backends. The handler gets a :class:`ToolContext` (the FHIR
client of the episode and the output budget) and the arguments as a JSON object.

Tools never raise at the caller: a handler signals a problem the model should see by raising
:class:`ToolError` (or returning ``{"error": ...}``); the toolbox turns that, bad arguments and any
unexpected exception into a compact structured error result, and records every call with its timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..fhir import FhirClient, json_default_str

#: Default bound on one tool output, in characters of JSON (~4 characters a token): a 8k-token context
#: holds a prompt, a few calls and one such result.
DEFAULT_BUDGET = 12_000


class ToolError(Exception):
    """A failure the model should see as the tool's result (bad argument, HTTP 4xx, ...)."""

    def __init__(self, message: str, status: int | None = None, issues: list[dict] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.issues = issues or []

    def to_json(self) -> dict:
        out: dict[str, Any] = {"message": self.message}
        if self.status is not None:
            out["status"] = self.status
        if self.issues:
            out["issues"] = self.issues
        return {"error": out}


@dataclass
class ToolContext:
    """What a handler may use: the episode's FHIR client and the output budget (characters)."""

    client: FhirClient | None = None
    budget: int = DEFAULT_BUDGET
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. a memory store for memory tools


Handler = Callable[[ToolContext, dict], Any]


@dataclass(frozen=True)
class Tool:
    """One agent-facing tool. ``writes``: it can change server state (read-only modes drop it)."""

    name: str
    description: str
    parameters: dict
    handler: Handler
    writes: bool = False
    group: str = "fhir"

    def openai_schema(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class ToolCall:
    """The record of one call, as logs, failure modes and the report see it."""

    name: str
    arguments: dict
    output: Any
    error: str | None
    resource_type: str | None
    ms: float

    def summary(self, limit: int = 200) -> str:
        text = orjson.dumps(self.output, default=json_default_str).decode()
        return text if len(text) <= limit else text[: limit - 1] + "…"

    def to_json(self, full: bool = False) -> dict:
        out = {"name": self.name, "arguments": self.arguments, "output_summary": self.summary(),
               "error": self.error, "resource_type": self.resource_type, "ms": round(self.ms, 3)}
        if full:
            out["output"] = self.output
        return out


def _check_arguments(tool: Tool, args: dict) -> None:
    """Required properties present, no unknown ones, JSON types right: the checks a model needs told."""
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in args]
    if missing:
        raise ToolError(f"missing required argument(s): {', '.join(missing)}")
    unknown = [k for k in args if k not in props]
    if unknown:
        raise ToolError(f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(props)}")
    kinds = {"string": str, "object": dict, "array": list, "boolean": bool, "integer": int, "number": (int, float)}
    for key, value in list(args.items()):
        want = props[key].get("type")
        types = want if isinstance(want, list) else [want]
        if value is None or want is None:
            continue
        value = args[key] = _coerce(value, types)
        ok = any(isinstance(value, kinds[t]) and not (t in ("integer", "number") and isinstance(value, bool))
                 for t in types if t in kinds)
        if not ok:
            raise ToolError(f"argument {key!r} must be of type {want}, got {type(value).__name__}")


def _coerce(value: Any, types: list[str]) -> Any:
    """Exact, lossless conversions models get wrong all the time: 5 ↔ "5", "true" → True."""
    if "string" in types and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        if "integer" in types and text.lstrip("-").isdigit():
            return int(text)
        if "boolean" in types and text.lower() in ("true", "false"):
            return text.lower() == "true"
    return value


class Toolbox:
    """A set of tools bound to one context; :meth:`call` never raises and records every call."""

    def __init__(self, tools: Iterable[Tool], context: ToolContext) -> None:
        self.tools = {t.name: t for t in tools}
        self.context = context
        self.calls: list[ToolCall] = []

    def schemas(self) -> list[dict]:
        return [t.openai_schema() for t in self.tools.values()]

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        args = arguments if arguments is not None else {}
        start = time.perf_counter()
        tool = self.tools.get(name)
        error: str | None = None
        try:
            if tool is None:
                raise ToolError(f"unknown tool {name!r}; available: {', '.join(self.tools)}")
            if not isinstance(args, dict):
                raise ToolError("arguments must be a JSON object")
            _check_arguments(tool, args)
            output = tool.handler(self.context, args)
            if isinstance(output, dict) and "error" in output:
                error = _error_text(output["error"])
        except ToolError as exc:
            output, error = exc.to_json(), exc.message
        except Exception as exc:  # a bug in a handler must not kill the episode: the model sees it
            output = {"error": {"message": f"internal tool error: {type(exc).__name__}: {exc}"}}
            error = output["error"]["message"]
        rtype = args.get("resourceType") if isinstance(args, dict) else None
        call = ToolCall(name, args if isinstance(args, dict) else {"_raw": args}, output, error,
                        rtype if isinstance(rtype, str) else None, (time.perf_counter() - start) * 1000)
        self.calls.append(call)
        return call


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        status = err.get("status")
        msg = err.get("message") or ""
        return f"{status}: {msg}" if status else str(msg)
    return str(err)
