"""OpenAI chat completions, and any server that speaks the same API (vLLM, Ollama, llama.cpp server, ...).

Native tool calling when the endpoint supports it; when a served small model writes its call as text instead, the
lenient parser recovers it. Requests go over a pooled HTTP transport (``_http.py``: the SDK's own request path costs
more CPU per call than the rest of an episode). Backpressure loses nothing: connection failures, timeouts and
408/409/429/5xx are retried with exponential backoff and jitter, a ``Retry-After`` (or ``retry-after-ms``) is honoured,
until ``max_attempts`` or ``retry_budget`` seconds of waiting are spent; then, like every other failure that is the
endpoint's fault, it is a :class:`BackendError`, so the runner can tell "the model failed" from "the model could not be
asked". Each :class:`ChatResult` carries its number of attempts; tokens come only from the response that answered.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import orjson

from .._gate import waiting
from ._backend import BackendError, ChatResult, RequestedCall
from ._grammar import ANSWER_TOOL, answer_from_call, answer_tool, looked_up, seen_ids, turn_grammar
from ._http import PooledTransport, Reply, Transport
from ._toolcalls import parse_tool_calls

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
OPENAI_URL = "https://api.openai.com/v1"
#: ``constrain=`` values: the endpoint's own means of holding a model to calls and the answer format.
#: ``tool_choice``: every turn must call a function (the final answer is one more, ``final_answer``) —
#: OpenAI, vLLM, llama.cpp's server; ``grammar``: our GBNF turn grammar in llama.cpp server's ``grammar``
#: field; ``structured_outputs``: the same grammar as vLLM's ``structured_outputs.grammar``.
CONSTRAIN_MODES = ("tool_choice", "grammar", "structured_outputs")
#: How each mode holds a ``chat(json_schema=...)`` reply to its schema: ``response_format`` (a strict
#: ``json_schema``: OpenAI, vLLM and llama.cpp's server take it), the schema's GBNF in llama.cpp server's
#: ``grammar`` field, or vLLM's ``structured_outputs.json``.
SCHEMA_MODES = {"tool_choice": "response_format", "grammar": "grammar", "structured_outputs": "structured_outputs"}
#: Keywords OpenAI's strict schemas refuse; the reply is checked against them by the caller instead
_NOT_STRICT = frozenset({"minLength", "maxLength"})
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id"}
_SHARED: dict[int, PooledTransport] = {}


def shared_transport(max_connections: int = 1024) -> PooledTransport:
    """One pool per process and size: backends of the same process reuse each other's connections."""
    if max_connections not in _SHARED:
        _SHARED[max_connections] = PooledTransport(max_connections)
    return _SHARED[max_connections]


class OpenAIBackend:
    """Chat backend for the OpenAI chat-completions API.

    ``compatible=True`` is for self-hosted endpoints: ``base_url`` (or ``OPENAI_BASE_URL``) is required and
    the key defaults to ``"none"``. ``transport`` (see ``_http.py``) replaces the pooled HTTP transport,
    which is how tests plug in a scripted endpoint. ``max_attempts`` and ``retry_budget`` (seconds spent
    waiting between attempts of one call) bound the retries. ``constrain`` (off by default; else from
    ``FHIRGYM_CONSTRAIN``) is one of :data:`CONSTRAIN_MODES`; it also decides how ``chat(json_schema=...)``
    is held to the schema (:data:`SCHEMA_MODES`, the ``structured_output`` attribute); without it the
    schema is not sent (``structured_output`` None) and the caller, which asked for the JSON in its
    prompt, checks the reply. ``cooperative``: it lets other episodes' harness work run while it waits
    (``fhirgym/_gate.py``).
    """

    cooperative = True

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        compatible: bool = False,
        timeout: float = 120.0,
        max_attempts: int = 8,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        retry_budget: float = 600.0,
        transport: Transport | None = None,
        extra_body: dict[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        constrain: str | None = None,
    ) -> None:
        constrain = constrain or os.environ.get("FHIRGYM_CONSTRAIN") or None  # reachable from the CLI
        if constrain is not None and constrain not in CONSTRAIN_MODES:
            raise ValueError(f"constrain={constrain!r}: use one of {', '.join(CONSTRAIN_MODES)}")
        self.constrain = constrain
        self.structured_output = SCHEMA_MODES.get(constrain) if constrain else None

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
        if retry_budget < 0:
            raise ValueError("retry_budget must be >= 0 seconds")
        self.base_url = base_url
        self.url = (base_url or OPENAI_URL).rstrip("/") + "/chat/completions"
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_budget = retry_budget
        self.extra_body = extra_body
        self._sleep = sleep
        self._transport = transport or shared_transport()
        self._headers = {"content-type": "application/json", "accept": "application/json",
                         "authorization": f"Bearer {api_key}"}
        for env, header in (("OPENAI_ORG_ID", "openai-organization"), ("OPENAI_PROJECT_ID", "openai-project")):
            if os.environ.get(env) and not compatible:
                self._headers[header] = os.environ[env]
        self._count = threading.Lock()
        self.attempts = 0  # total HTTP attempts made by this backend, for tests and diagnostics

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
        if json_schema is not None and tools:
            raise ValueError("json_schema= holds the whole reply to a schema: it takes no tools")
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
        extra = self.extra_body
        if self.constrain and tools:
            extra = self._constrain(kwargs, messages, tools, answer_schema)
        if self.constrain and json_schema is not None:
            extra = self._hold_to(kwargs, json_schema)
        if extra:
            kwargs.update(extra)
        payload, attempts = self._create(kwargs)
        result = self._result(payload, tools)
        result.attempts = attempts
        return result

    def _constrain(self, kwargs: dict[str, Any], messages: list[dict], tools: list[dict],
                   answer_schema: dict | None) -> dict[str, Any] | None:
        """Hold the turn to calls of ``tools`` or the final answer (none before the first tool result);
        returns the request's extra fields."""
        looked = looked_up(messages)
        if self.constrain == "tool_choice":
            kwargs["tools"] = [*tools, answer_tool(answer_schema)] if looked else list(tools)
            kwargs["tool_choice"] = "required"
            return self.extra_body
        grammar = turn_grammar(tools, answer_schema, allow_answer=looked, ids=seen_ids(messages))
        field = {"grammar": grammar} if self.constrain == "grammar" else {"structured_outputs": {"grammar": grammar}}
        return {**(self.extra_body or {}), **field}

    def _hold_to(self, kwargs: dict[str, Any], schema: dict) -> dict[str, Any] | None:
        """Hold the reply to the JSON ``schema`` by this endpoint's means (:data:`SCHEMA_MODES`); returns the
        request's extra fields."""
        if self.constrain == "tool_choice":
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "reply", "strict": True, "schema": _strict(schema)}}
            return self.extra_body
        if self.constrain == "grammar":
            from llama_cpp.llama_grammar import json_schema_to_gbnf  # loads llama.cpp: only when asked

            field: dict[str, Any] = {"grammar": json_schema_to_gbnf(json.dumps(schema))}
        else:
            field = {"structured_outputs": {"json": schema}}
        return {**(self.extra_body or {}), **field}

    def _create(self, kwargs: dict[str, Any]) -> tuple[dict, int]:
        """POST the request until it is answered; returns (the decoded response, attempts made)."""
        where = f"{self.name} at {self.base_url or 'api.openai.com'}"
        body = orjson.dumps(kwargs)
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            with self._count:
                self.attempts += 1
            retry_after: float | None = None
            try:
                with waiting():
                    reply = self._transport.post(self.url, body, self._headers, self.timeout)
            except (TimeoutError, ConnectionError) as exc:
                failure = "timed out" if isinstance(exc, TimeoutError) else "unreachable"
                detail = str(exc)[:300]
            else:
                if 200 <= reply.status < 300:
                    try:
                        payload = orjson.loads(reply.data)
                    except orjson.JSONDecodeError:
                        raise _error(f"{where}: HTTP {reply.status} with a body that is not JSON: "
                                     f"{reply.data[:200]!r}", attempt) from None
                    if not isinstance(payload, dict):
                        raise _error(f"{where}: HTTP {reply.status} with a body that is not an object", attempt)
                    return payload, attempt
                if reply.status not in RETRYABLE_STATUS:
                    hint = " (check the API key)" if reply.status in (401, 403) else ""
                    raise _error(f"{where}: HTTP {reply.status}{hint}: {_brief(reply)}", attempt)
                failure, detail = f"HTTP {reply.status}", _brief(reply)
                retry_after = _retry_after(reply)
            if attempt >= self.max_attempts:
                raise _error(f"{where}: {failure} on all {self.max_attempts} attempts: {detail}", attempt)
            delay = self._delay(attempt, retry_after)
            if waited + delay > self.retry_budget:
                raise _error(f"{where}: {failure} after {attempt} attempts; the next wait ({delay:.1f} s) would "
                             f"pass the retry budget of {self.retry_budget:g} s: {detail}", attempt)
            with waiting():
                self._sleep(delay)
            waited += delay

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:  # never earlier than asked; a little later, so that waiters spread out
            return retry_after * (1 + random.random() / 10)
        base = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        return base * (0.5 + random.random() / 2)  # jitter: concurrent runners do not retry in lockstep

    def _result(self, response: dict, tools: list[dict] | None) -> ChatResult:
        choices = response.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise BackendError(f"{self.name}: response has no choices: {str(response)[:300]}")
        choice = choices[0]
        message = choice.get("message") or {}
        text = message.get("content") or ""
        if not isinstance(text, str):  # content parts
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        calls: list[RequestedCall] = []
        for i, tc in enumerate(message.get("tool_calls") or []):
            function = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(function, dict) or not function.get("name"):
                continue
            args = _decode_args(function.get("arguments"))
            calls.append(RequestedCall(id=tc.get("id") or f"call_{i}", name=function["name"], arguments=args))
        finish = choice.get("finish_reason")
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
        usage = response.get("usage") or {}
        return ChatResult(
            text=text,
            tool_calls=calls,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=finish,
        )


def _error(message: str, attempts: int) -> BackendError:
    exc = BackendError(message)
    exc.attempts = attempts
    return exc


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


def _strict(schema: Any) -> Any:
    """``schema`` without the keywords OpenAI's strict mode refuses (:data:`_NOT_STRICT`)."""
    if isinstance(schema, dict):
        return {k: ({n: _strict(s) for n, s in v.items()} if k == "properties" and isinstance(v, dict) else _strict(v))
                for k, v in schema.items() if k not in _NOT_STRICT}
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


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


def _retry_after(reply: Reply) -> float | None:
    """Seconds the endpoint asked us to wait: ``retry-after-ms``, or ``Retry-After`` in seconds or as a date."""
    try:
        if "retry-after-ms" in reply.headers:
            return max(0.0, float(reply.headers["retry-after-ms"]) / 1000)
        value = reply.headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def _brief(reply: Reply) -> str:
    try:
        body = orjson.loads(reply.data)
    except orjson.JSONDecodeError:
        return reply.data[:500].decode("utf-8", "replace")
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
    return str(body)[:500]
