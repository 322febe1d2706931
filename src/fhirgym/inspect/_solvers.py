"""Solvers: the task's setup (open the sample's episode), the default agent (inspect's ``react()`` on the
episode's tools) and fhirgym's own ReAct and CodeAct agents (``--solver fhirgym/react``, ``fhirgym/codeact``).

The setup always runs, ``--solver`` or not: it opens the episode, puts the configuration's instructions in a system
message and the episode's tools in ``state.tools``; an agent built before any sample runs takes them as
``tools=[episode_tools()]``. A fhirgym agent is synchronous: it runs in a worker thread, its tool calls go to the
episode as in ``fhirgym eval`` (``AgentTools``), and each model turn goes to inspect's model through
:class:`InspectBackend`, back on the event loop, so inspect logs it and applies its limits. Its messages become the
sample's; an exception of the agent's own is a fail with the reason, a model failure the sample's error
(docs/INSPECT.md, section "How a sample runs").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from inspect_ai.agent import Agent, AgentPrompt, AgentState, AgentSubmit, agent, react
from inspect_ai.model import ChatMessageSystem, GenerateConfig, Model, ModelOutput, get_model
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import LimitExceededError, sandbox, turn_limit

from ..agents import (
    INFRASTRUCTURE_ERRORS,
    SYSTEM_PROMPT,
    AgentTask,
    BackendError,
    ChatResult,
    CodeActAgent,
    ReactAgent,
    default_iterations,
)
from ..env import get_config
from ..tools import FINISH
from . import _dataset
from ._episodes import EpisodeHandle, episode_tools, handle_of, register, release, submit_name
from ._messages import from_openai, infos_of, result_of
from ._sandbox import BwrapSandboxEnvironment
from ._threads import waits

logger = logging.getLogger(__name__)

#: fhirgym's ReAct guidance without its "reply without calling a tool" ending: inspect's react() ends
#: with a submit tool, which its own prompt names.
GUIDANCE = "\n".join(line for line in SYSTEM_PROMPT.splitlines() if not line.startswith("- When you are done"))
SUBMIT_PROMPT = ("When you are done, call the {submit}() tool with your final answer, in the answer format the "
                 "request asks for.")


@solver(name="episode")
def episode(source: dict, config: str = "baseline", budget: int | None = None,
            unsafe_python: bool = False) -> Solver:
    """Open the sample's episode (the task's setup). ``budget``: characters per tool output (default: what
    the model can afford, e.g. 4,000 for a local model, else 12,000)."""
    get_config(config)  # an unknown configuration fails here, before any sample

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        meta = state.metadata
        inst = await anyio.to_thread.run_sync(_dataset.instance, source, meta["task_id"], meta["seed"])
        afford = budget or getattr(get_model().api, "tool_budget", None)
        handle = EpisodeHandle(state.uuid, inst, config, budget=afford, unsafe_python=unsafe_python)
        try:
            obs = await anyio.to_thread.run_sync(handle.open)
            register(handle)  # from here on the task's cleanup closes it
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(handle.close)
            raise
        if obs.instructions:
            state.messages.insert(0, ChatMessageSystem(content=obs.instructions))
        state.tools = list(handle.inspect_tools())
        _attach_sandbox(handle)
        return state

    return solve


def _attach_sandbox(handle: EpisodeHandle) -> None:
    """A CodeAct sample's fhirgym-bwrap environment runs in the episode's own sandbox (see _sandbox)."""
    workspace = handle.episode.workspace
    if workspace is None:
        return
    try:
        env = sandbox().as_type(BwrapSandboxEnvironment)
    except (ProcessLookupError, TypeError):  # no sandbox for this sample, or another type
        return
    if not env.attach(workspace.sandbox):
        logger.warning("sample %s: the fhirgym-bwrap sandbox was used before the episode opened; inspect's "
                       "tools and the python tool keep separate workspaces", handle.key)


async def close_episode(state: TaskState) -> None:
    """The task's cleanup: runs after the scorer, on success and on error alike."""
    handle = release(state.uuid)
    if handle is not None:
        await anyio.to_thread.run_sync(handle.close)


@agent(name="default")
def default_agent(config: str = "baseline", max_turns: int | None = default_iterations("react")) -> Agent:
    """inspect's ``react()`` on the episode's tools, its submit tool ``finish`` where the configuration
    grants one, within ``max_turns`` model turns (fhirgym's ReAct cap; None: none). The cap is a model's:
    the reference replay, which is not one, has none (``fhirgym eval --agent reference`` has none
    either). An agent stopped by a limit gave no answer, as in ``fhirgym eval``."""
    name = submit_name(config)
    inner = react(prompt=AgentPrompt(instructions=GUIDANCE, submit_prompt=SUBMIT_PROMPT),
                  tools=[episode_tools()],
                  submit=AgentSubmit(name=name, description=FINISH.description if name == FINISH.name else None,
                                     answer_only=True, keep_in_messages=True))

    async def execute(state: AgentState) -> AgentState:
        replay = getattr(get_model().api, "replay", None) == "reference"
        try:
            with turn_limit(None if replay else max_turns):
                return await inner(state)
        except LimitExceededError:
            state.output = ModelOutput.from_content(str(get_model()), "")
            raise

    return execute


class InspectBackend:
    """A fhirgym ``ChatBackend`` over inspect's model, called from a fhirgym agent's worker thread: every
    turn is inspect's (logged, retried, limited). A model failure is kept in ``error`` (the solver raises it:
    the sample's error) and the agent told of it as a ``BackendError``; a limit inspect raises passes
    through to end the sample."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.name = str(model)
        api = model.api
        self.tool_budget = getattr(api, "tool_budget", None)
        backend = getattr(api, "backend", None)
        self.max_reply_tokens = getattr(backend, "max_reply_tokens", None)
        self.error: BaseException | None = None
        self.last_messages: list[dict] = []

    def chat(self, messages: list[dict], tools: list[dict] | None = None, *, temperature: float = 0.0,
             max_tokens: int = 1024, seed: int | None = None) -> ChatResult:
        self.last_messages = messages
        generate = functools.partial(self.model.generate, from_openai(messages), infos_of(tools),
                                     config=GenerateConfig(temperature=temperature, max_tokens=max_tokens, seed=seed))
        try:
            return result_of(anyio.from_thread.run(generate))
        except LimitExceededError:
            raise
        except Exception as exc:
            self.error = exc
            raise BackendError(f"{self.name}: {type(exc).__name__}: {exc}") from exc


def _fhirgym_agent(make: Callable[[InspectBackend], Any]) -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        handle = handle_of(state.uuid)
        obs = handle.observation
        assert obs is not None
        backend = InspectBackend(get_model())
        agent = make(backend)
        task = AgentTask(obs.prompt, obs.now, handle.episode.tools, max_iterations=agent.max_iterations,
                         instructions=obs.instructions, answer_schema=obs.answer_schema)
        result = None
        try:
            result = await anyio.to_thread.run_sync(agent.run, task, limiter=waits())
        except (LimitExceededError, *INFRASTRUCTURE_ERRORS):
            raise
        except Exception as exc:  # the agent's own bug: its fail, with the reason (as in fhirgym eval)
            handle.crash = f"{type(exc).__name__}: {exc}"
        finally:
            state.messages = from_openai(result.messages if result is not None else backend.last_messages)
        if backend.error is not None:
            raise backend.error
        answer = result.final_answer if result is not None else None
        state.output = ModelOutput.from_content(str(state.model), answer or "")
        return state

    return solve


@solver(name="react")
def fhirgym_react(max_iterations: int = default_iterations("react"), temperature: float = 0.0,
                  seed: int = 0) -> Solver:
    """fhirgym's ReAct agent (``fhirgym eval --agent react``) on inspect's model."""
    return _fhirgym_agent(lambda backend: ReactAgent(backend, max_iterations, temperature, seed=seed))


@solver(name="codeact")
def fhirgym_codeact(max_iterations: int = default_iterations("codeact"), temperature: float = 0.0,
                    seed: int = 0) -> Solver:
    """fhirgym's CodeAct agent (``fhirgym eval --agent codeact``; needs ``-T config=codeact``)."""
    return _fhirgym_agent(lambda backend: CodeActAgent(backend, max_iterations, temperature, seed=seed))


__all__ = ["GUIDANCE", "InspectBackend", "close_episode", "default_agent", "episode", "fhirgym_codeact",
           "fhirgym_react"]
