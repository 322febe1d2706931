"""``--agent`` / ``--model`` strings → agent objects (the CLI and the runner share this)."""

from __future__ import annotations

import inspect
from typing import Any

from ..fhir import TransportError
from ._agent import instantiate, load_class
from ._backend import DEFAULT_LOCAL_MODEL, LOCAL_MODELS, BackendError, ChatBackend
from ._builtin import CommandAgent, GuessAgent, NothingFoundAgent, NullAgent, ReferenceAgent
from ._codeact import DEFAULT_TURNS, CodeActAgent
from ._react import ReactAgent

DEFAULT_MODEL = f"local/{DEFAULT_LOCAL_MODEL}"
#: Exceptions that mean the infrastructure failed (the model's backend, the FHIR transport), not the agent:
#: an episode that ends in one is ``error`` and leaves the success rate; any other exception is a fail.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (BackendError, TransportError)
#: The agents that need no model, by name.
BUILTIN_AGENTS = {"reference": ReferenceAgent, "null": NullAgent, "nothing-found": NothingFoundAgent,
                  "guess": GuessAgent}
#: The model-driven agents built in, and their turn caps when ``--max-iterations`` is not given.
MODEL_AGENTS = {"react": ReactAgent, "codeact": CodeActAgent}
DEFAULT_ITERATIONS = 15


def default_iterations(agent: str) -> int:
    """The turn cap of ``agent`` when none is given: 12 for codeact, else 15."""
    return DEFAULT_TURNS if agent == "codeact" else DEFAULT_ITERATIONS

ACCEPTED_FORMS = (
    "openai/NAME (key from OPENAI_API_KEY or api_key=; optional base_url=)",
    "openai-compatible/NAME (base_url= or OPENAI_BASE_URL required; key optional)",
    f"local/{LOCAL_MODELS[0]} (default local model)",
    f"local/{LOCAL_MODELS[1]}",
    "local/PATH.gguf (any llama.cpp GGUF file)",
    "local/MODEL+ADAPTER.gguf (a model above with a LoRA adapter GGUF applied at load)",
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

        target, lora = _local_target(rest or DEFAULT_LOCAL_MODEL)
        if lora and options.get("lora"):
            raise ValueError(f"{model!r} names an adapter and lora= names another: give one")
        if target in LOCAL_MODELS or target.endswith(".gguf"):
            return LocalBackend(target, **((options | {"lora": lora}) if lora else options))
        raise ValueError(
            f"unknown local model {target!r}: use one of {', '.join(LOCAL_MODELS)} or a path ending in .gguf, "
            "optionally +ADAPTER.gguf"
        )
    raise ValueError(f"unknown model string {model!r}; accepted forms: " + "; ".join(ACCEPTED_FORMS))


def _local_target(text: str) -> tuple[str, str | None]:
    """``BASE+ADAPTER.gguf`` → (base, adapter) where BASE is a known model or a ``.gguf`` path (so a file
    whose own name holds a ``+`` still names one model); anything else → (text, None)."""
    base, plus, adapter = text.rpartition("+")
    if plus and adapter.endswith(".gguf") and (base in LOCAL_MODELS or base.endswith(".gguf")):
        return base, adapter
    return text, None


def needs_model(agent: str) -> bool:
    return agent in MODEL_AGENTS or (":" in agent and not agent.startswith("cmd:"))


def make_agent(agent: str, model: str | None = None, base_url: str | None = None,
               max_iterations: int | None = None, **backend_options):
    """``react`` or ``codeact`` (with ``model``, default the local 1.5B), ``reference``, ``null``,
    ``nothing-found``, ``guess``, ``cmd:PROGRAM ARGS`` or ``package.module:Class``. ``max_iterations``:
    the turn cap (default :func:`default_iterations`)."""
    max_iterations = max_iterations or default_iterations(agent)
    if agent in BUILTIN_AGENTS:
        return BUILTIN_AGENTS[agent]()
    if agent.startswith("cmd:"):
        command = agent[4:].strip()
        if not command:
            raise ValueError("--agent cmd: needs a program, e.g. cmd:\"python my_agent.py\"")
        return CommandAgent(command)
    if agent in MODEL_AGENTS:
        return MODEL_AGENTS[agent](make_backend(model or DEFAULT_MODEL, base_url=base_url, **backend_options),
                                   max_iterations=max_iterations)
    if ":" in agent:
        cls = load_class(agent)
        backend = (make_backend(model or DEFAULT_MODEL, base_url=base_url, **backend_options)
                   if "backend" in inspect.signature(cls).parameters else None)
        obj = instantiate(cls, backend=backend, max_iterations=max_iterations)
        if not callable(getattr(obj, "run", None)):
            raise ValueError(f"agent {agent!r} has no run(task) method")
        if not getattr(obj, "name", None):
            obj.name = agent
        return obj
    raise ValueError(f"unknown agent {agent!r}: use react, codeact, {', '.join(BUILTIN_AGENTS)}, cmd:PROGRAM or "
                     "package.module:Class")
