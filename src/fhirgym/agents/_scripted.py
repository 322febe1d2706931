"""A backend that plays back a script: agent loops, runners and token accounting testable without a model."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ._backend import BackendError, ChatResult
from ._toolcalls import parse_tool_calls

ScriptStep = ChatResult | str | Callable[[list[dict]], "ChatResult | str"]


@dataclass
class Request:
    """What the agent sent on one call (deep-copied, so later mutation by the agent does not show)."""

    messages: list[dict]
    tools: list[dict] | None
    temperature: float
    max_tokens: int
    seed: int | None
    answer_schema: dict | None = None
    json_schema: dict | None = None


def rough_tokens(value: Any) -> int:
    """Whitespace-token count of a string, a message or a message list (content plus tool-call names and
    arguments): cheap, deterministic and growing with the conversation, which is all tests need."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(rough_tokens(item) for item in value)
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        count = rough_tokens(content if isinstance(content, str) else None)
        for call in value.get("tool_calls") or []:
            function = call.get("function", call)
            args = function.get("arguments")
            count += 1 + rough_tokens(args if isinstance(args, str) else json.dumps(args))
        return count
    return len(str(value).split())


class ScriptedBackend:
    """Returns the scripted replies in order; records every request in ``.requests``.

    A ``str`` step is parsed with :func:`parse_tool_calls` (as a local model's output would be) and gets
    whitespace-token counts (prompt = the messages, completion = the reply). A callable step sees the
    messages so far and returns a ``ChatResult`` or ``str``. A ``ChatResult`` step is returned as given.
    Running past the end raises :class:`BackendError`, like an endpoint that went away.

    ``structured_output`` (default None) is what the backend claims for ``chat(json_schema=...)`` (the
    memory's evaluator and reflector then send their schema, recorded in the request); the replies are
    the script's either way.
    """

    def __init__(self, script: Sequence[ScriptStep], name: str = "scripted",
                 structured_output: str | None = None) -> None:
        self.script = list(script)
        self.name = name
        self.structured_output = structured_output
        self.requests: list[Request] = []

    @property
    def remaining(self) -> int:
        return len(self.script) - len(self.requests)

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        answer_schema: dict | None = None,
        json_schema: dict | None = None,
    ) -> ChatResult:
        index = len(self.requests)
        snapshot = copy.deepcopy(messages)
        self.requests.append(Request(snapshot, copy.deepcopy(tools), temperature, max_tokens, seed,
                                     copy.deepcopy(answer_schema), copy.deepcopy(json_schema)))
        if index >= len(self.script):
            raise BackendError(f"{self.name}: script exhausted after {len(self.script)} replies")
        step = self.script[index]
        if callable(step) and not isinstance(step, ChatResult):
            step = step(copy.deepcopy(messages))
        if isinstance(step, ChatResult):
            return replace(step, tool_calls=list(step.tool_calls))
        if not isinstance(step, str):
            raise TypeError(f"script step {index} produced {type(step).__name__}, expected ChatResult or str")
        names = {t.get("function", {}).get("name") for t in tools or []} or None
        calls, text = parse_tool_calls(step, names)
        return ChatResult(
            text=text,
            tool_calls=calls,
            prompt_tokens=rough_tokens(messages),
            completion_tokens=rough_tokens(step),
            finish_reason="tool_calls" if calls else "stop",
        )
