"""OpenAI chat completions, and any server that speaks the same API (vLLM, Ollama, llama.cpp server, ...).

Native tool calling when the endpoint supports it; when a served small model writes its call as text
instead, the lenient parser recovers it. Transient failures (connection, timeout, 408/409/429/5xx) are
retried with exponential backoff and jitter; everything else that is the endpoint's fault becomes a
:class:`BackendError`, so the runner can tell "the model failed" from "the model could not be asked".
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

from ._backend import BackendError, ChatResult, ToolCall
from ._grammar import ANSWER_TOOL, answer_from_call, answer_tool, looked_up, seen_ids, turn_grammar
from ._toolcalls import parse_tool_calls

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
#: ``constrain=`` values: the endpoint's own means of holding a model to calls and the answer format.
#: ``tool_choice``: every turn must call a function (the final answer is one more, ``final_answer``) —
#: OpenAI, vLLM, llama.cpp's server; ``grammar``: our GBNF turn grammar in llama.cpp server's ``grammar``
#: field; ``structured_outputs``: the same grammar as vLLM's ``structured_outputs.grammar``.
CONSTRAIN_MODES = ("tool_choice", "grammar", "structured_outputs")
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id"}


class OpenAIBackend:
    """Chat backend over the ``openai`` client.

    ``compatible=True`` is for self-hosted endpoints: ``base_url`` (or ``OPENAI_BASE_URL``) is required and
    the key defaults to ``"none"``. ``http_client`` (an ``httpx.Client``) is passed to the SDK, which is how
    the tests plug in a fake server. The SDK's own retries are off: we retry, so attempts are countable.
    ``constrain`` (off by default; else from ``FHIRGYM_CONSTRAIN``) is one of :data:`CONSTRAIN_MODES`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        compatible: bool = False,
        timeout: float = 120.0,
        max_attempts: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        http_client: Any = None,
        extra_body: dict[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        constrain: str | None = None,
    ) -> None:
        import openai

        constrain = constrain or os.environ.get("FHIRGYM_CONSTRAIN") or None  # reachable from the CLI
        if constrain is not None and constrain not in CONSTRAIN_MODES:
            raise ValueError(f"constrain={constrain!r}: use one of {', '.join(CONSTRAIN_MODES)}")
        self.constrain = constrain

        self.model = model
        self.name = f"{'openai-compatible' if compatible else 'openai'}/{model}"
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        if compatible:
            if not base_url:
                raise ValueError(f"{self.name} needs base_url= or the OPENAI_BASE_URL environment variable")
            api_key = api_key or os.environ.get("OPENAI_API_KEY") or "none"
        else:
            api_key = api_key or os.environ.get("OPENAI_API_KEY")
            if not api_key:
                raise BackendError(f"{self.name}: no API key; set OPENAI_API_KEY or pass api_key=")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.base_url = base_url
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.extra_body = extra_body
        self._sleep = sleep
        self._openai = openai
        self._client = openai.OpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout, max_retries=0, http_client=http_client
        )
        self.attempts = 0  # total HTTP attempts made, for tests and diagnostics

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        answer_schema: dict | None = None,
    ) -> ChatResult:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_openai_message(m) for m in messages],
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
        if seed is not None:
            kwargs["seed"] = seed
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        if self.constrain and tools:
            self._constrain(kwargs, messages, tools, answer_schema)
        response = self._create(kwargs)
        return self._result(response, tools)

    def _constrain(self, kwargs: dict[str, Any], messages: list[dict], tools: list[dict],
                   answer_schema: dict | None) -> None:
        """Hold the turn to calls of ``tools`` or the final answer (none before the first tool result)."""
        looked = looked_up(messages)
        if self.constrain == "tool_choice":
            kwargs["tools"] = [*tools, answer_tool(answer_schema)] if looked else list(tools)
            kwargs["tool_choice"] = "required"
            return
        grammar = turn_grammar(tools, answer_schema, allow_answer=looked, ids=seen_ids(messages))
        field = {"grammar": grammar} if self.constrain == "grammar" else {"structured_outputs": {"grammar": grammar}}
        kwargs["extra_body"] = {**(self.extra_body or {}), **field}

    def _create(self, kwargs: dict[str, Any]) -> Any:
        openai = self._openai
        where = f"{self.name} at {self.base_url or 'api.openai.com'}"
        for attempt in range(1, self.max_attempts + 1):
            self.attempts += 1
            try:
                return self._client.chat.completions.create(**kwargs, timeout=self.timeout)
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status not in RETRYABLE_STATUS:
                    hint = " (check the API key)" if status in (401, 403) else ""
                    raise BackendError(f"{where}: HTTP {status}{hint}: {_brief(exc)}") from exc
                if attempt == self.max_attempts:
                    raise BackendError(
                        f"{where}: HTTP {status} on all {self.max_attempts} attempts: {_brief(exc)}"
                    ) from exc
                self._sleep(self._delay(attempt, _retry_after(exc)))
            except openai.APIConnectionError as exc:  # includes APITimeoutError
                if attempt == self.max_attempts:
                    kind = "timed out" if isinstance(exc, openai.APITimeoutError) else "unreachable"
                    raise BackendError(f"{where}: {kind} on all {self.max_attempts} attempts: {exc}") from exc
                self._sleep(self._delay(attempt, None))
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(self.max_backoff, retry_after)
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)  # jitter: concurrent runners do not retry in lockstep

    def _result(self, response: Any, tools: list[dict] | None) -> ChatResult:
        choices = getattr(response, "choices", None)
        if not choices:
            raise BackendError(f"{self.name}: response has no choices: {str(response)[:300]}")
        choice = choices[0]
        message = choice.message
        text = message.content or ""
        calls: list[ToolCall] = []
        for i, tc in enumerate(message.tool_calls or []):
            function = getattr(tc, "function", None)
            if function is None:
                continue
            args = _decode_args(function.arguments)
            calls.append(ToolCall(id=tc.id or f"call_{i}", name=function.name, arguments=args))
        finish = choice.finish_reason
        answers = [c for c in calls if c.name == ANSWER_TOOL] if self.constrain == "tool_choice" else []
        if answers:
            calls = [c for c in calls if c.name != ANSWER_TOOL]
            if not calls:  # the answer "call" is the final reply
                text, finish = answer_from_call(answers[0].arguments), "stop"
        elif not calls and tools and text:
            names = {t.get("function", {}).get("name") for t in tools}
            calls, text = parse_tool_calls(text, names)
            if calls and finish == "stop":
                finish = "tool_calls"
        usage = getattr(response, "usage", None)
        return ChatResult(
            text=text,
            tool_calls=calls,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            finish_reason=finish,
        )


def _to_openai_message(message: dict) -> dict:
    """Keep only the keys the API accepts; tool-call arguments become JSON strings, tool results strings."""
    out = {k: v for k, v in message.items() if k in _MESSAGE_KEYS}
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            function = dict(call.get("function", {}))
            if not isinstance(function.get("arguments"), str):
                function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
            calls.append({"id": call.get("id"), "type": call.get("type", "function"), "function": function})
        out["tool_calls"] = calls
    elif "tool_calls" in out:
        del out["tool_calls"]
    if out.get("role") == "tool":
        out.pop("name", None)  # not part of the tool message schema
        if not isinstance(out.get("content"), str):
            out["content"] = json.dumps(out.get("content"), ensure_ascii=False)
    return out


def _decode_args(raw: Any) -> dict[str, Any]:
    """Native arguments are a JSON string; one that does not decode to an object is kept under
    ``_raw_arguments`` so the tool layer reports it to the model instead of silently calling with {}."""
    if isinstance(raw, dict):
        return raw
    if not raw or not str(raw).strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return {"_raw_arguments": raw}
    return value if isinstance(value, dict) else {"_raw_arguments": raw}


def _retry_after(exc: Any) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, ValueError):
        return None


def _brief(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
    return str(exc)[:500]
