"""Agents and the model backends they run on.

An agent has ``name`` and ``run(AgentTask) -> AgentResult`` (see ``_agent.py``). Built in: ``react``
(tool-calling loop over any :class:`ChatBackend`), ``codeact`` (the model writes Python that runs in the
episode's sandbox: docs/CODEACT.md), ``reference``, the floors ``null``, ``nothing-found``
and ``guess``, ``cmd:PROGRAM`` (an external program talking MCP) and any ``package.module:Class``. Backends: OpenAI(-compatible) endpoints, the
embedded llama.cpp models, and a scripted backend for tests (``make_backend("local/qwen2.5-coder-1.5b")``).
"""

from ._agent import (
    STOP_REASONS,
    Agent,
    AgentResult,
    AgentTask,
    clock_block,
    instantiate,
    load_class,
    opening_turns,
)
from ._backend import (
    LOCAL_MODELS,
    BackendError,
    ChatBackend,
    ChatResult,
    ContextLengthExceeded,
    RequestedCall,
)
from ._builtin import CommandAgent, GuessAgent, NothingFoundAgent, NullAgent, ReferenceAgent
from ._codeact import CODE_BLOCK, CODEACT_SYSTEM_PROMPT, CodeActAgent
from ._factory import (
    BUILTIN_AGENTS,
    DEFAULT_MODEL,
    INFRASTRUCTURE_ERRORS,
    MODEL_AGENTS,
    default_iterations,
    make_agent,
    make_backend,
    needs_model,
)
from ._local import LocalBackend, Sampled
from ._prompt import worked_example
from ._react import OBSERVATION, SYSTEM_PROMPT, ReactAgent
from ._scripted import ScriptedBackend
from ._template import ChatTemplate
from ._toolcalls import parse_tool_calls
from ._weights import ModelUnavailable, model_path

__all__ = [
    "BUILTIN_AGENTS",
    "CODEACT_SYSTEM_PROMPT",
    "CODE_BLOCK",
    "DEFAULT_MODEL",
    "INFRASTRUCTURE_ERRORS",
    "LOCAL_MODELS",
    "MODEL_AGENTS",
    "OBSERVATION",
    "STOP_REASONS",
    "SYSTEM_PROMPT",
    "Agent",
    "AgentResult",
    "AgentTask",
    "BackendError",
    "ChatBackend",
    "ChatResult",
    "ChatTemplate",
    "CodeActAgent",
    "CommandAgent",
    "ContextLengthExceeded",
    "GuessAgent",
    "LocalBackend",
    "ModelUnavailable",
    "NothingFoundAgent",
    "NullAgent",
    "ReactAgent",
    "ReferenceAgent",
    "RequestedCall",
    "Sampled",
    "ScriptedBackend",
    "clock_block",
    "default_iterations",
    "instantiate",
    "load_class",
    "make_agent",
    "make_backend",
    "model_path",
    "needs_model",
    "opening_turns",
    "parse_tool_calls",
    "worked_example",
]


def __getattr__(name: str):
    """``ToolCall``, this layer's old name for :class:`RequestedCall`, still resolves, with a warning (the
    tools layer's ``ToolCall`` is the record of a call made; one name per concept)."""
    if name == "ToolCall":
        import warnings

        warnings.warn("fhirgym.agents.ToolCall is now fhirgym.agents.RequestedCall", DeprecationWarning,
                      stacklevel=2)
        return RequestedCall
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
