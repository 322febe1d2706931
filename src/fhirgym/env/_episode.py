"""The episode: one task instance on its own forked store, driven by reset / step / submit.

Every consumer (the runner, memory training, RL adapters) drives episodes through this one class, so
fork → act → diff → verdict exists once. What an agent holds is :class:`AgentTools`: it can call the
tools the configuration grants, list their schemas, see its own calls and open an MCP endpoint. It
holds only an opaque number; the episode, its instance, gold, params, seed and world stay in this
module's table, out of reach of everything an agent is given (``tests/test_env.py`` walks it).
In-process agents share the process and are trusted code all the same: untrusted ones run out of
process (``cmd:``) and reach their episode through MCP only.
"""

from __future__ import annotations

import copy
import itertools
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..tasks import NOT_FOUND, Fork, Instance, Verdict, answer_text
from ..tools import Toolbox, ToolCall, Workspace, episode_toolbox
from ._config import Config, get_config


class EpisodeStateError(RuntimeError):
    """A call out of order: step before reset, step after submit, verdict before submit."""


@dataclass(frozen=True)
class Observation:
    """What an agent is told when the episode starts."""

    prompt: str
    now: datetime  # the instance's frozen clock (UTC)
    instructions: str  # the configuration's system-prompt additions ("" when none)
    tools: list[dict]  # the granted tools as OpenAI function schemas
    answer_schema: dict | None = None  # JSON schema of the final answer's object (its format, not its value)


_LIVE: dict[int, Episode] = {}
_KEYS = itertools.count(1)
_LOCK = threading.Lock()


def _episode(key: int) -> Episode:
    ep = _LIVE.get(key)
    if ep is None:
        raise EpisodeStateError("this episode is closed")
    return ep


class AgentTools:
    """An agent's handle on its episode's tools; every call goes through :meth:`Episode.step`."""

    __slots__ = ("_key",)

    def __init__(self, key: int) -> None:
        self._key = key

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        """Run one tool; never raises for a bad call (the record carries the error)."""
        return _episode(self._key).step({"name": name, "arguments": arguments})

    def schemas(self) -> list[dict]:
        return _episode(self._key)._toolbox().schemas()

    @property
    def names(self) -> list[str]:
        return list(_episode(self._key)._toolbox().tools)

    @property
    def calls(self) -> list[ToolCall]:
        """This episode's calls so far (copies: editing them changes nothing)."""
        return copy.deepcopy(_episode(self._key).calls)

    def mcp_url(self) -> str:
        """A streamable-HTTP MCP endpoint serving these tools (started on first use, closed with the episode)."""
        return _episode(self._key).mcp_url()

    def __repr__(self) -> str:
        return f"AgentTools(episode {self._key})"


class _SteppingToolbox(Toolbox):
    """The episode's toolbox as MCP serves it: calls go through :meth:`Episode.step` like in-process ones."""

    def __init__(self, episode: Episode, box: Toolbox) -> None:
        super().__init__(box.tools.values(), box.context)
        self.calls = box.calls
        self._step = episode.step

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        return self._step({"name": name, "arguments": arguments})


class Episode:
    """One instance on its own store: ``reset()``, ``step(call)``, ``submit(answer)``, ``verdict()``.

    The gold is copied when the episode is made, before any agent acts: validation uses that frozen
    copy, whatever happens to the instance later. ``budget`` bounds each tool output (characters);
    ``max_steps`` bounds tool calls (a call past it is refused and ends nothing by itself).
    ``unsafe_python``: the ``python`` tool may run code with only the sandbox layers that work here
    (``--unsafe-python``); without it, it refuses where the sandbox cannot be set up.
    """

    def __init__(self, instance: Instance, config: Config | str = "baseline", *, budget: int | None = None,
                 max_steps: int | None = None, unsafe_python: bool = False) -> None:
        self.instance = instance
        self.config = get_config(config)
        if self.config.requires:
            raise ValueError(f"configuration {self.config.name!r} cannot run as registered: {self.config.requires}")
        self.budget = budget
        self.max_steps = max_steps
        self.unsafe_python = unsafe_python
        self._gold = copy.deepcopy(instance.gold)
        self._fork: Fork | None = None
        self._box: Toolbox | None = None
        self._key: int | None = None
        self._verdict: Verdict | None = None
        self._answer: str | None = None
        self._mcp: list[Any] = []
        self._workspace: Workspace | None = None

    # -- the seam -------------------------------------------------------------------------------------
    def reset(self) -> Observation:
        """Fork the pre-run state (again, if this episode ran before) and describe the task."""
        self._release()
        inst = self.instance
        self._fork = inst.open()
        # CodeAct: fetched resources + a sandbox dir of this episode's own, whose FHIR calls are steps
        self._box, self._workspace = episode_toolbox(self.config.tools, self._fork.client, budget=self.budget,
                                                     extras=self.config.context, unsafe_python=self.unsafe_python,
                                                     dispatch=self._code_step)
        self._verdict, self._answer = None, None
        with _LOCK:
            self._key = next(_KEYS)
            _LIVE[self._key] = self
        extra = self.config.prepare(inst) if self.config.prepare else ""
        instructions = "\n\n".join(t for t in (self.config.system_suffix, extra) if t)
        answer = inst.family.answer
        return Observation(inst.prompt, inst.now, instructions, self._box.schemas(),
                           answer.json_schema() if answer is not None else None)

    @property
    def tools(self) -> AgentTools:
        """What an agent gets: the granted tools of this episode and nothing else."""
        self._toolbox()
        assert self._key is not None
        return AgentTools(self._key)

    def step(self, call: dict | Any) -> ToolCall:
        """Run one tool call (``{"name", "arguments"}`` or any object with those attributes)."""
        box = self._toolbox()
        if self._verdict is not None:
            raise EpisodeStateError("the episode has ended (submit was called)")
        name = call.get("name") if isinstance(call, dict) else getattr(call, "name", None)
        args = call.get("arguments") if isinstance(call, dict) else getattr(call, "arguments", None)
        if self.max_steps is not None and len(box.calls) >= self.max_steps:
            refused = ToolCall(str(name), args if isinstance(args, dict) else {}, {"error": {
                "message": f"step limit reached ({self.max_steps} tool calls); submit your answer"}},
                "step limit reached", None, 0.0)
            box.calls.append(refused)
            return refused
        return box.call(str(name), args)

    def submit(self, answer: str | None) -> Verdict:
        """End the episode with a final answer (None: no answer) and judge it on the store's final state."""
        if self._fork is None:
            raise EpisodeStateError("reset() the episode before submitting")
        if self._verdict is None:
            self._answer = answer
            self._verdict = self._fork.finish(answer, self._gold, self.calls)
            self._close_endpoints()
            if self.config.after:
                self.config.after(self)
        return self._verdict

    def verdict(self) -> Verdict:
        if self._verdict is None:
            raise EpisodeStateError("no verdict before submit()")
        return self._verdict

    def reward(self) -> float:
        """1.0 for a strict success, else 0.0."""
        return 1.0 if self.verdict().success else 0.0

    @property
    def done(self) -> bool:
        return self._verdict is not None

    @property
    def calls(self) -> list[ToolCall]:
        return self._box.calls if self._box is not None else []

    @property
    def answer(self) -> str | None:
        return self._answer

    @property
    def workspace(self) -> Workspace | None:
        """The CodeAct workspace (what ``fhir_query``/``fhir_get`` fetched), None when the tools need none;
        open until the episode is reset or closed."""
        return self._workspace

    def floor(self) -> bool:
        """Whether the constant "nothing found" reply, with no tool call, passes this instance strictly.

        Computed on the frozen gold without running anything: the blind floor reports put beside a score.
        A "nothing found" passes only after a look at the record, so it is False on every instance (the
        report shows it beside the ``guess`` agent's floor, which looks once).
        """
        return self.instance.validate(answer_text(NOT_FOUND), [], self._gold).success

    def mcp_url(self) -> str:
        box = self._toolbox()
        if not self._mcp:
            from ..mcp import serve_http

            self._mcp.append(serve_http(_SteppingToolbox(self, box)))
        return self._mcp[0].url

    def close(self) -> None:
        self._release()

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------------
    def _toolbox(self) -> Toolbox:
        if self._box is None:
            raise EpisodeStateError("reset() the episode first")
        return self._box

    def _code_step(self, name: str, arguments: dict) -> ToolCall:
        """A FHIR function called by code in the sandbox: one more call of this episode (checked, logged)."""
        return self.step({"name": name, "arguments": arguments})

    def _close_endpoints(self) -> None:
        for handle in self._mcp:
            handle.close()
        self._mcp.clear()

    def _release(self) -> None:
        """Close what the episode holds; the fork is released even when the workspace's cleanup fails
        (whose error then propagates: a leftover directory is worth knowing about)."""
        self._close_endpoints()
        if self._key is not None:
            with _LOCK:
                _LIVE.pop(self._key, None)
            self._key = None
        workspace, self._workspace = self._workspace, None
        try:
            if workspace is not None:
                workspace.close()
        finally:
            if self._fork is not None:
                self._fork.close()
                self._fork = None


def solve_reference(episode: Episode, tools: Any = None) -> str:
    """Run the family's reference solution through the episode's tools (the built-in reference agent).

    The runner calls this for ``--agent reference`` only; the solver is never handed to an agent.
    ``tools``: what the solution calls instead of ``episode.tools`` (anything with ``call(name,
    arguments) -> ToolCall`` that reaches this episode), e.g. inspect's reference model, whose calls
    become model turns that inspect runs through the episode's tools.
    """
    inst = episode.instance
    return inst.family.solve(episode.tools if tools is None else tools, copy.deepcopy(inst.params), inst.now)

