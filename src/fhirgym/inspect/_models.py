"""Model providers: ``--model fhirgym/reference``, ``fhirgym/nothing-found``, ``fhirgym/local-<model>``.

``reference`` replays the family's reference solution as model turns: the solution runs in a thread of its own, each
tool call it makes becomes the model's next turn, the agent executes it through the episode's tools, and its final text
is a call of the agent's submit tool (plain content for a solver without one). Like ``fhirgym eval --agent reference``
it is the one model that reads the instance (through the sample's episode); nothing it does passes the episode's tools
by. ``nothing-found`` submits the constant "nothing found" answer at once: the blind floor. ``local-qwen2.5-coder-0.5b``
(``-1.5b``, or ``local/PATH.gguf``; ``-M`` options go to ``LocalBackend``) is ``fhirgym eval``'s embedded llama.cpp
model in process. What each does, why a native provider rather than a server, and why no token counts are made up (the
replays report zero usage): docs/INSPECT.md, section "Models".
"""

from __future__ import annotations

import functools
import queue
import threading
from typing import Any

import anyio
import anyio.to_thread
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    modelapi,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from ..agents import LOCAL_MODELS, make_backend
from ..env import solve_reference
from ..tasks import NOT_FOUND, answer_text
from ..tools import ToolCall
from ._episodes import EpisodeHandle, current
from ._messages import output_of, schemas_of, to_openai
from ._threads import waits

REPLAYS = ("reference", "nothing-found")
_NO_USAGE = ModelUsage(input_tokens=0, output_tokens=0, total_tokens=0)


@modelapi(name="fhirgym")
class FhirgymModel(ModelAPI):
    """``fhirgym/<name>``: the offline replays and the embedded local models."""

    def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None,
                 config: GenerateConfig | None = None, **model_args: Any) -> None:
        super().__init__(model_name, base_url, api_key, [], config or GenerateConfig())
        self.backend = None
        #: which replay this is (None: a local model); the default agent's turn cap spares the reference
        self.replay = model_name if model_name in REPLAYS else None
        if model_name in REPLAYS:
            if model_args:
                raise ValueError(f"fhirgym/{model_name} takes no model arguments (got {', '.join(model_args)})")
        elif model_name.startswith(("local-", "local/")):
            target = model_name[len("local-"):]
            if target not in LOCAL_MODELS and not target.endswith(".gguf"):
                raise ValueError(f"unknown local model fhirgym/{model_name}: use "
                                 + ", ".join(f"fhirgym/local-{m}" for m in LOCAL_MODELS) + " or fhirgym/local/PATH.gguf")
            self.backend = make_backend(f"local/{target}", **model_args)
        else:
            raise ValueError(f"unknown model fhirgym/{model_name}: fhirgym/reference, fhirgym/nothing-found, "
                             + ", ".join(f"fhirgym/local-{m}" for m in LOCAL_MODELS) + " or fhirgym/local/PATH.gguf")

    @property
    def tool_budget(self) -> int | None:
        """Characters per tool output this model can afford (the sample's episode adopts it)."""
        return getattr(self.backend, "tool_budget", None)

    def max_connections(self) -> int:
        # the replays answer at once (as many samples at a time as inspect runs); a local model is one
        # llama.cpp context that takes turns anyway
        return 1 if self.backend is not None else 256

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice,
                       config: GenerateConfig) -> ModelOutput:
        model = f"fhirgym/{self.model_name}"
        handle = current()
        if self.model_name == "nothing-found":
            return _final(model, answer_text(NOT_FOUND), tools, handle, _turn(input))
        if self.model_name == "reference":
            if handle is None:
                raise RuntimeError("fhirgym/reference replays a fhirgym sample's reference solution: run it on "
                                   "fhirgym/action or fhirgym/qa")
            return await _Replay.of(handle).turn(model, input, tools)
        return await self._local(model, input, tools, config, handle)

    async def _local(self, model: str, input: list[ChatMessage], tools: list[ToolInfo], config: GenerateConfig,
                     handle: EpisodeHandle | None) -> ModelOutput:
        backend = self.backend
        assert backend is not None
        obs = handle.observation if handle is not None else None
        cap = backend.max_reply_tokens
        chat = functools.partial(backend.chat, to_openai(input), schemas_of(tools) or None,
                                 temperature=config.temperature or 0.0,
                                 max_tokens=min(config.max_tokens or cap, cap), seed=config.seed,
                                 answer_schema=obs.answer_schema if obs is not None else None)
        result = await anyio.to_thread.run_sync(chat, limiter=waits())
        if not result.tool_calls and result.text.strip():
            submit = _submit_tool(tools, handle)
            if submit is not None:  # the final answer turn, as the agent's submit call
                return _call(model, submit, {"answer": result.text.strip()}, f"local_{_turn(input)}",
                             usage=output_of(result, model).usage)
        return output_of(result, model)


def _turn(input: list[ChatMessage]) -> int:
    return sum(isinstance(m, ChatMessageAssistant) for m in input)


def _submit_tool(tools: list[ToolInfo], handle: EpisodeHandle | None) -> str | None:
    names = {t.name for t in tools}
    wanted = (handle.submit_name,) if handle is not None else ("submit", "finish")
    return next((n for n in wanted if n in names), None)


def _call(model: str, name: str, arguments: dict, call_id: str, usage: ModelUsage | None = None) -> ModelOutput:
    out = ModelOutput.for_tool_call(model, name, arguments, tool_call_id=call_id, content="")
    out.usage = usage or _NO_USAGE
    return out


def _final(model: str, text: str, tools: list[ToolInfo], handle: EpisodeHandle | None, turn: int) -> ModelOutput:
    """The final answer: a call of the agent's submit tool, or the reply's content where it has none."""
    submit = _submit_tool(tools, handle)
    if submit is not None:
        return _call(model, submit, {"answer": text}, f"answer_{turn}")
    out = ModelOutput.from_content(model, text)
    out.usage = _NO_USAGE
    return out


class _Stopped(BaseException):
    """The sample ended before its reference solution did (never caught by a family's own code)."""


class _Replay:
    """The reference solution of one sample, running in its own thread: ``call`` is its tool interface."""

    def __init__(self, handle: EpisodeHandle) -> None:
        self.handle = handle
        self.actions: queue.Queue = queue.Queue()  # what the solution does next: call, answer or error
        self.results: queue.Queue = queue.Queue()  # the record of each call it asked for (None: stop)
        self.pending: tuple[str, dict, int, str] | None = None  # name, arguments, calls before it, call id
        self.turns = 0
        self.thread = threading.Thread(target=self._solve, name=f"fhirgym-reference-{handle.key}", daemon=True)

    @classmethod
    def of(cls, handle: EpisodeHandle) -> _Replay:
        replay = handle.extras.get("reference")
        if replay is None:
            replay = handle.extras["reference"] = cls(handle)
            handle.on_close(replay.stop)
            replay.thread.start()
        return replay

    # -- the solution's side (its thread) ---------------------------------------------------------------
    def _solve(self) -> None:
        try:
            text = solve_reference(self.handle.episode, tools=self)
        except _Stopped:
            return
        except BaseException as exc:
            self.actions.put(("error", exc))
            return
        self.actions.put(("answer", text))

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        self.actions.put(("call", (name, arguments or {})))
        record = self.results.get()
        if record is None:
            raise _Stopped
        return record

    def stop(self) -> None:
        self.results.put(None)

    # -- the model's side (the event loop) --------------------------------------------------------------
    async def turn(self, model: str, input: list[ChatMessage], tools: list[ToolInfo]) -> ModelOutput:
        if self.pending is not None:
            self.results.put(self._outcome(input))
            self.pending = None
        kind, payload = await anyio.to_thread.run_sync(self.actions.get, limiter=waits())
        self.turns += 1
        if kind == "error":
            raise RuntimeError(f"the reference solution failed: {type(payload).__name__}: {payload}") from payload
        if kind == "answer":
            return _final(model, payload, tools, self.handle, self.turns)
        name, arguments = payload
        if name not in {t.name for t in tools}:
            self.stop()
            raise RuntimeError(f"the reference solution calls {name!r}, a tool this agent did not offer the model "
                               f"(it offered {', '.join(sorted(t.name for t in tools)) or 'none'})")
        call_id = f"reference_{self.turns}"
        self.pending = (name, arguments, len(self.handle.episode.calls), call_id)
        return _call(model, name, arguments, call_id)

    def _outcome(self, input: list[ChatMessage]) -> ToolCall:
        """The record of the pending call: the episode's, once the agent ran it; else the tool error the
        agent reported (the solution then finds nothing, as with any failed call)."""
        assert self.pending is not None
        name, arguments, before, call_id = self.pending
        calls = self.handle.episode.calls
        if len(calls) > before and calls[before].name == name:
            return calls[before]
        reply = next((m for m in input if isinstance(m, ChatMessageTool) and m.tool_call_id == call_id), None)
        text = reply.error.message if reply is not None and reply.error is not None else "the tool call was not run"
        return ToolCall(name, arguments, {"error": {"message": text}}, text, None, 0.0)
