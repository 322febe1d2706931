"""The agent protocol: what the runner gives an agent, and what it expects back.

An agent is any object with a ``name`` and ``run(task: AgentTask) -> AgentResult``. It acts only
through ``task.tools`` (:class:`~fhirgym.env.AgentTools`: the tools its episode's configuration grants,
every call recorded) — or, for an external program, through the MCP endpoint ``task.tools.mcp_url()``
serving the same tools. Nothing it is given leads to the answer key. Third-party agents are loaded with
``--agent package.module:Class``: the class is called with ``backend=`` (a :class:`ChatBackend` or
None) and ``max_iterations=`` keyword arguments when its ``__init__`` accepts them. Such a class runs
in fhirgym's process and is trusted code; an untrusted agent runs out of process (``cmd:``).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ..env import AgentTools

#: ``crashed``: the agent's own code raised (a fail, with the reason); ``error``: infrastructure.
STOP_REASONS = ("answered", "gave_up", "max_iterations", "crashed", "error")


@dataclass(frozen=True)
class AgentTask:
    """One episode as an agent sees it: the request, the clock, the tools and nothing else."""

    prompt: str
    now: datetime  # the task's frozen clock (UTC)
    tools: AgentTools
    max_iterations: int = 15
    instructions: str = ""  # the configuration's additions to the system prompt (e.g. memory lessons)
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
    requests: int = 0  # requests sent to the model, retries included (``iterations`` counts the turns)
    error: str | None = None  # infrastructure failure (the episode is marked `error`, not `fail`)
    crash: str | None = None  # the agent's own exception (the episode fails with this reason)


class Agent(Protocol):
    name: str

    def run(self, task: AgentTask) -> AgentResult: ...


def clock_block(now: datetime) -> str:
    """The clock an agent is told: tasks say "today", "next Monday", "within 14 days"."""
    return (f"Current date and time: {now.strftime('%A')}, {now.strftime('%Y-%m-%d %H:%M')} UTC "
            f"(ISO {now.strftime('%Y-%m-%dT%H:%M:%SZ')}). All clinic times are UTC.")


def opening_turns(system_prompt: str, instructions: str | None, now: datetime, prompt: str,
                  nudge: str) -> tuple[str, str]:
    """The system text and the first user text of a model-driven episode: one home for what an evaluated
    agent and an RL text episode are told. The clock opens the user turn, not the system prompt, so that
    system prompt + tool schemas form the same prefix in every episode, which a local model reuses from
    its KV cache (no prefill); ``nudge`` closes the request."""
    system = system_prompt + ("\n\n" + instructions if instructions else "")
    return system, clock_block(now) + "\n\n" + prompt + "\n\n" + nudge


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
