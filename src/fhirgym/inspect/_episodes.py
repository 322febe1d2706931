"""One fhirgym :class:`~fhirgym.env.Episode` per inspect sample, and its tools as inspect tools.

inspect runs many samples at once in one event loop; an episode's calls are synchronous (SQLite, the code sandbox), so
every one of them runs in a worker thread (``anyio.to_thread``) and the loop never waits on a store. Live episodes are
keyed by the sample's ``TaskState.uuid`` (one per sample and epoch) under a lock; code that has no ``TaskState`` (a
model provider, a tool source) finds its sample's episode through the sample's ``store()``, which holds the uuid. Each
episode takes its calls one at a time (its own lock; its inspect tools are not ``parallel``), in the order the model
made them. A tool is built from the episode's own OpenAI schema; its result is the episode's JSON, and a failed call
raises ``ToolError`` with that JSON, so the sample goes on. ``finish`` is left out: an inspect agent ends with its own
submit tool (docs/INSPECT.md, section "How a sample runs").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import orjson
from inspect_ai.tool import Tool, ToolDef, ToolError, ToolParams
from inspect_ai.util import store

from ..env import Config, Episode, Observation, get_config
from ..fhir import json_default_str
from ..runner import DEFAULT_MAX_STEPS, verdict_fields
from ..tasks import Instance, Verdict
from ..tools import FINISH, ToolCall

#: The sample store's key for the uuid of the sample's episode (recorded in the log: it is only a key).
STORE_KEY = "fhirgym_episode"


def submit_name(config: Config | str) -> str:
    """The name of the submit tool an inspect agent ends with: ``finish`` where the configuration grants
    fhirgym's ``finish`` (same name, same description), else inspect's ``submit``."""
    return FINISH.name if any(t.name == FINISH.name for t in get_config(config).tools) else "submit"


class EpisodeHandle:
    """A sample's episode: opened by the task's setup, scored by its scorer, closed by its cleanup."""

    def __init__(self, key: str, instance: Instance, config: Config | str, *, budget: int | None = None,
                 unsafe_python: bool = False) -> None:
        self.key = key
        # the runner's bound on tool calls (the python code's FHIR functions included)
        self.episode = Episode(instance, config, budget=budget, unsafe_python=unsafe_python,
                               max_steps=DEFAULT_MAX_STEPS)
        self.submit_name = submit_name(config)
        self.observation: Observation | None = None
        self.crash: str | None = None  # a fhirgym agent's own exception (the sample fails with it)
        self.extras: dict[str, Any] = {}  # per-sample state of model providers (e.g. the reference replay)
        self._lock = threading.Lock()
        self._tools: list[Tool] | None = None
        self._closers: list[Callable[[], None]] = []

    @property
    def instance(self) -> Instance:
        return self.episode.instance

    def open(self) -> Observation:
        with self._lock:
            self.observation = self.episode.reset()
            return self.observation

    def step(self, name: str, arguments: dict | None) -> ToolCall:
        with self._lock:
            return self.episode.step({"name": name, "arguments": arguments})

    def submit(self, answer: str | None) -> Verdict:
        with self._lock:
            return self.episode.submit(answer)

    def on_close(self, fn: Callable[[], None]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        for fn in self._closers:
            fn()
        self._closers.clear()
        with self._lock:
            self.episode.close()

    def inspect_tools(self) -> list[Tool]:
        """The configuration's tools as inspect tools bound to this episode (``finish`` aside)."""
        if self.observation is None:
            raise RuntimeError("the episode is not open")
        if self._tools is None:
            self._tools = [_bind(self, s["function"]) for s in self.observation.tools
                           if s["function"]["name"] != FINISH.name]
        return self._tools

    def describe(self, verdict: Verdict, answer: str | None) -> dict:
        """The scorer's metadata: the verdict's parts as ``fhirgym eval``'s result line has them."""
        ep = self.episode
        return {**verdict_fields(self.instance, verdict, ep.calls, ep.floor(), self.crash),
                "tool_calls": len(ep.calls), "final_answer": answer, "config": ep.config.name,
                "verdict": verdict.to_json()}


def _bind(handle: EpisodeHandle, schema: dict) -> Tool:
    name = schema["name"]

    async def call(**arguments: Any) -> str:
        record = await anyio.to_thread.run_sync(handle.step, name, arguments)
        text = orjson.dumps(record.output, default=json_default_str).decode()
        if record.error is not None:
            raise ToolError(text)
        return text

    # max_output=0: the episode bounds its outputs itself (--budget), as for every fhirgym agent
    return ToolDef(call, name=name, description=schema["description"],
                   parameters=ToolParams.model_validate(schema["parameters"]), parallel=False,
                   max_output=0).as_tool()


_HANDLES: dict[str, EpisodeHandle] = {}
_LOCK = threading.Lock()


def register(handle: EpisodeHandle) -> None:
    with _LOCK:
        if handle.key in _HANDLES:
            raise RuntimeError(f"sample {handle.key} already has an episode")
        _HANDLES[handle.key] = handle
    store().set(STORE_KEY, handle.key)


def handle_of(key: str) -> EpisodeHandle:
    with _LOCK:
        handle = _HANDLES.get(key)
    if handle is None:
        raise RuntimeError(f"sample {key} has no fhirgym episode: run it in a fhirgym task "
                           "(inspect eval fhirgym/action, fhirgym/qa), whose setup opens one")
    return handle


def current() -> EpisodeHandle | None:
    """The episode of the sample this code runs in (None outside a fhirgym sample)."""
    key = store().get(STORE_KEY)
    if key is None:
        return None
    with _LOCK:
        return _HANDLES.get(key)


def release(key: str) -> EpisodeHandle | None:
    with _LOCK:
        return _HANDLES.pop(key, None)


def live() -> int:
    """How many episodes are open (0 once every sample has been cleaned up)."""
    with _LOCK:
        return len(_HANDLES)


class EpisodeTools:
    """A ``ToolSource``: the current sample's episode tools, for an agent built before any sample runs
    (``react(tools=[episode_tools()])``)."""

    async def tools(self) -> list[Tool]:
        handle = current()
        if handle is None:
            raise RuntimeError("episode_tools() used outside a fhirgym sample")
        return handle.inspect_tools()


def episode_tools() -> EpisodeTools:
    return EpisodeTools()
