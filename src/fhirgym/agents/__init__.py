"""Agents and the model backends they run on.

An agent has ``name`` and ``run(AgentTask) -> AgentResult`` (see ``_agent.py``). Built in: ``react``
(tool-calling loop over any :class:`ChatBackend`), ``reference``, ``null``, ``cmd:PROGRAM`` (an external
program talking MCP) and any ``package.module:Class``. Backends: OpenAI(-compatible) endpoints, the
embedded llama.cpp models, and a scripted backend for tests (``make_backend("local/qwen2.5-coder-1.5b")``).
The code sandbox of the ``python`` tool (``Sandbox``: bubblewrap, seccomp, cgroups, rlimits) is in
``_sandbox.py``; docs/SANDBOX.md has its threat model.
"""

from ._agent import STOP_REASONS, Agent, AgentResult, AgentTask, clock_block, instantiate, load_class
from ._backend import BackendError, ChatBackend, ChatResult, ContextLengthExceeded, ToolCall, make_backend
from ._builtin import CommandAgent, NullAgent, ReferenceAgent
from ._factory import DEFAULT_MODEL, make_agent, needs_model
from ._react import SYSTEM_PROMPT, ReactAgent
from ._sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxProbe,
    SandboxResult,
    SandboxUnavailable,
    sandbox_available,
    sandbox_probe,
)
from ._scripted import ScriptedBackend
from ._toolcalls import parse_tool_calls
from ._weights import ModelUnavailable, model_path

__all__ = [
    "DEFAULT_MODEL",
    "STOP_REASONS",
    "SYSTEM_PROMPT",
    "Agent",
    "AgentResult",
    "AgentTask",
    "BackendError",
    "ChatBackend",
    "ChatResult",
    "CommandAgent",
    "ContextLengthExceeded",
    "ModelUnavailable",
    "NullAgent",
    "ReactAgent",
    "ReferenceAgent",
    "Sandbox",
    "SandboxLimits",
    "SandboxProbe",
    "SandboxResult",
    "SandboxUnavailable",
    "ScriptedBackend",
    "ToolCall",
    "clock_block",
    "instantiate",
    "load_class",
    "make_agent",
    "make_backend",
    "model_path",
    "needs_model",
    "parse_tool_calls",
    "sandbox_available",
    "sandbox_probe",
]
