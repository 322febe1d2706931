"""The agent protocol: what the runner gives an agent, and what it expects back.

An agent is any object with a ``name`` and ``run(task: AgentTask) -> AgentResult``. It acts only
through ``task.tools`` (a :class:`~fhirgym.tools.Toolbox` bound to its episode's isolated store, which
records every call) — or, for an external program, through the MCP endpoint ``task.mcp_url`` serving
the same toolbox. Third-party agents are loaded with ``--agent package.module:Class``: the class is
called with ``backend=`` (a :class:`ChatBackend` or None) and ``max_iterations=`` keyword arguments
when its ``__init__`` accepts them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ..tools import Toolbox

STOP_REASONS = ("answered", "gave_up", "max_iterations", "error")


@dataclass
class AgentTask:
    """One episode as an agent sees it."""

    prompt: str
    now: datetime  # the task's frozen clock (UTC)
    tools: Toolbox
    max_iterations: int = 15
    mcp_url: Callable[[], str] | None = None  # starts the episode's MCP endpoint on first use
    reference: Callable[[Toolbox], str] | None = None  # only the built-in reference agent may use it
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. memory hints of a configuration
    answer_schema: dict | None = None  # JSON schema of the final answer object (for constrained decoding)


@dataclass
class AgentResult:
    final_answer: str | None
    stop_reason: str  # answered | gave_up | max_iterations | error
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    messages: list[dict] = field(default_factory=list)
    model_s: float = 0.0  # time spent waiting for the model (the rest of an episode is the sandbox's)
    error: str | None = None  # infrastructure failure (the episode is marked `error`, not `fail`)


class Agent(Protocol):
    name: str

    def run(self, task: AgentTask) -> AgentResult: ...


def clock_block(now: datetime) -> str:
    """The clock an agent is told: tasks say "today", "next Monday", "within 14 days"."""
    return (f"Current date and time: {now.strftime('%A')}, {now.strftime('%Y-%m-%d %H:%M')} UTC "
            f"(ISO {now.strftime('%Y-%m-%dT%H:%M:%SZ')}). All clinic times are UTC.")


def load_class(spec: str) -> type:
    """``package.module:Class`` → the class (clear errors for a typo'd path)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"agent {spec!r}: expected package.module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"agent {spec!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"agent {spec!r}: {module_name} has no {attr}")
    return cls


def instantiate(cls: type, **options: Any) -> Any:
    """Call ``cls`` with the options its ``__init__`` accepts."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return cls(**options)
    return cls(**{k: v for k, v in options.items() if k in params})
