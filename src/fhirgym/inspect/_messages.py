"""fhirgym's chat format (OpenAI messages and tool schemas, :class:`~fhirgym.agents.ChatResult`) ↔ inspect's.

Both directions are needed: a fhirgym model provider gets inspect messages and answers with a
``ModelOutput``; a fhirgym agent run as an inspect solver talks to inspect's model through a
``ChatBackend``. Text and tool calls (ids, names, arguments) cross unchanged; a tool error is its message.
"""

from __future__ import annotations

import orjson
from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    ModelOutput,
    ModelUsage,
)
from inspect_ai.tool import ToolCall, ToolInfo, ToolParams

from ..agents import ChatResult
from ..agents import RequestedCall as AgentCall


def to_openai(messages: list[ChatMessage]) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if isinstance(m, ChatMessageAssistant):
            msg: dict = {"role": "assistant", "content": m.text or ""}
            if m.tool_calls:
                msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function, "arguments": orjson.dumps(c.arguments).decode()}} for c in m.tool_calls]
            out.append(msg)
        elif isinstance(m, ChatMessageTool):
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "name": m.function,
                        "content": m.error.message if m.error is not None else m.text})
        else:
            out.append({"role": m.role, "content": m.text})
    return out


def from_openai(messages: list[dict]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system":
            out.append(ChatMessageSystem(content=content))
        elif role == "assistant":
            calls = [ToolCall(id=c.get("id") or f"call_{i}", function=c["function"]["name"],
                              arguments=_arguments(c["function"].get("arguments")))
                     for i, c in enumerate(m.get("tool_calls") or [])]
            out.append(ChatMessageAssistant(content=content, tool_calls=calls or None))
        elif role == "tool":
            out.append(ChatMessageTool(content=content, tool_call_id=m.get("tool_call_id"), function=m.get("name")))
        else:  # user (and any other role a fhirgym agent records, e.g. an external program's stderr)
            out.append(ChatMessageUser(content=content if role == "user" else f"[{role}]\n{content}"))
    return out


def _arguments(raw) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        value = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": value}


def schemas_of(tools: list[ToolInfo]) -> list[dict]:
    """inspect's tool infos as OpenAI function schemas."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters.model_dump(exclude_none=True)}}
            for t in tools]


def infos_of(schemas: list[dict] | None) -> list[ToolInfo]:
    return [ToolInfo(name=s["function"]["name"], description=s["function"].get("description", ""),
                     parameters=ToolParams.model_validate(s["function"].get("parameters") or {}))
            for s in schemas or []]


def output_of(result: ChatResult, model: str) -> ModelOutput:
    calls = [ToolCall(id=c.id or f"call_{i}", function=c.name, arguments=c.arguments)
             for i, c in enumerate(result.tool_calls)]
    message = ChatMessageAssistant(content=result.text or "", tool_calls=calls or None, model=model, source="generate")
    usage = ModelUsage(input_tokens=result.prompt_tokens, output_tokens=result.completion_tokens,
                       total_tokens=result.prompt_tokens + result.completion_tokens)
    return ModelOutput(model=model, choices=[ChatCompletionChoice(
        message=message, stop_reason="tool_calls" if calls else "stop")], usage=usage)


def result_of(output: ModelOutput) -> ChatResult:
    message = output.message
    calls = [AgentCall(c.id, c.function, dict(c.arguments)) for c in message.tool_calls or []]
    usage = output.usage
    return ChatResult(text=message.text or "", tool_calls=calls,
                      prompt_tokens=usage.input_tokens if usage else 0,
                      completion_tokens=usage.output_tokens if usage else 0,
                      finish_reason=output.stop_reason)
