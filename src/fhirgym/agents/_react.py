"""The ReAct tool-calling agent: a chat model, the episode's tools, at most ``max_iterations`` turns.

System prompt, then the clock block (the task's frozen now) and the task prompt as the user turn; each turn
the model either calls tools (every call runs through the episode's toolbox and its JSON result goes back
as a ``tool`` message) or replies without a call, which ends the episode (so does a ``finish`` call, where
granted). When the context fills up, the oldest tool results are elided (with a note saying so) rather
than failing the episode outright.
"""

from __future__ import annotations

import inspect
import re
import time

import orjson

from .._gate import waiting
from ..fhir import json_default_str
from ..tools import final_answer_of
from ._agent import AgentResult, AgentTask, opening_turns
from ._backend import BackendError, ChatBackend, ContextLengthExceeded

SYSTEM_PROMPT = """You are a careful health-IT assistant working on an HL7 FHIR R4 server through tools.
- Use the tools to look things up and to make changes; never invent ids, codes or values.
- Search with FHIR search parameters (e.g. Patient by family/given/birthdate; Slot by schedule/status/start).
- Change only what the request asks for. To update a resource, read it, change what is needed and send
  the whole resource back.
- When you are done, reply without calling a tool, in the answer format the request asks for."""

_GAVE_UP = re.compile(r"\b(i can(?:no|')t|i am unable|i'm unable|unable to (?:find|complete|help)|i'm sorry)\b", re.I)
ELIDED = "[earlier tool output elided to fit the context window]"
#: Closes the first user turn. Small local models otherwise jump straight to the answer format the task
#: prompt ends with, without looking anything up (measured on Qwen2.5-Coder-1.5B).
NUDGE = "Start by calling a tool to look up what you need."
#: Opens the user message that carries the result of a code block (CodeAct), so elision can find it.
OBSERVATION = "Execution result:\n"
#: Tools whose call blocks on another process (the code sandbox): other episodes run meanwhile.
BLOCKING_TOOLS = frozenset({"python"})


def call_tool(task: AgentTask, name: str, arguments: dict):
    """One tool call of the episode; a blocking one lets other episodes' harness work run meanwhile."""
    if name in BLOCKING_TOOLS:
        with waiting():
            return task.tools.call(name, arguments)
    return task.tools.call(name, arguments)


class ReactAgent:
    """Tool-calling loop over any :class:`ChatBackend`."""

    nudge = NUDGE  # closes the first user turn

    def __init__(self, backend: ChatBackend, max_iterations: int = 15, temperature: float = 0.0,
                 max_tokens: int = 1024, system_prompt: str = SYSTEM_PROMPT, seed: int | None = 0) -> None:
        self.backend = backend
        self.name = "react"
        self.max_iterations = max_iterations
        self.temperature = temperature
        # a backend may cap replies below the agent's default (a CPU model decodes ~8 tokens/s)
        self.max_tokens = min(max_tokens, getattr(backend, "max_reply_tokens", None) or max_tokens)
        self.system_prompt = system_prompt
        self.seed = seed

    @property
    def cooperative(self) -> bool:
        """Whether every wait of an episode is a model call that lets other episodes run (``_gate.py``)."""
        return bool(getattr(self.backend, "cooperative", False))

    def run(self, task: AgentTask) -> AgentResult:
        system, user = opening_turns(self.system_prompt, task.instructions, task.now, task.prompt, self.nudge)
        messages: list[dict] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        result = AgentResult(None, "max_iterations", messages=messages)
        schemas = task.tools.schemas()
        limit = min(task.max_iterations, self.max_iterations)
        # the answer's shape, for backends that constrain decoding with it (keyword only where accepted)
        shape = ({"answer_schema": task.answer_schema}
                 if task.answer_schema is not None and _accepts(self.backend.chat, "answer_schema") else {})
        while result.iterations < limit:
            result.iterations += 1
            reply = self._chat(messages, schemas, result, shape)
            if reply is None or self._turn(task, reply, messages, result):
                return result
        return result

    def _turn(self, task: AgentTask, reply, messages: list[dict], result: AgentResult) -> bool:
        """Act on one model reply (its tool calls, or its final answer); True when the episode ends."""
        call_msgs = self._record(reply, result, messages)
        if not reply.tool_calls:
            _answer(reply.text, result)
            return True
        return self._call_tools(task, reply, call_msgs, messages, result)

    @staticmethod
    def _record(reply, result: AgentResult, messages: list[dict]) -> list[dict]:
        """Append the model's reply as an assistant message; returns its tool calls in OpenAI form."""
        call_msgs = [{"id": f"call_{result.iterations}_{i}" if not c.id or c.id.startswith("call_") else c.id,
                      "type": "function",
                      "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()}}
                     for i, c in enumerate(reply.tool_calls)]
        assistant: dict = {"role": "assistant", "content": reply.text or ""}
        if call_msgs:
            assistant["tool_calls"] = call_msgs
        messages.append(assistant)
        return call_msgs

    @staticmethod
    def _call_tools(task: AgentTask, reply, call_msgs: list[dict], messages: list[dict],
                    result: AgentResult) -> bool:
        """Run the reply's tool calls, appending their results; True when a ``finish`` call ended the episode."""
        for call, msg in zip(reply.tool_calls, call_msgs, strict=True):
            done = call_tool(task, call.name, call.arguments)
            messages.append({"role": "tool", "tool_call_id": msg["id"], "name": call.name,
                             "content": orjson.dumps(done.output, default=json_default_str).decode()})
            final = final_answer_of(done)
            if final is not None:
                result.final_answer, result.stop_reason = final, "answered"
                return True
        return False

    def _chat(self, messages: list[dict], schemas: list[dict], result: AgentResult, shape: dict):
        """One model turn; None when the episode must stop (infrastructure error or no room left)."""
        for _ in range(4):
            t0 = time.perf_counter()
            try:
                reply = self.backend.chat(messages, schemas, temperature=self.temperature,
                                          max_tokens=self.max_tokens, seed=self.seed, **shape)
            except ContextLengthExceeded:
                result.model_s += time.perf_counter() - t0
                if not _elide_oldest(messages):
                    result.stop_reason = "error"
                    result.final_answer = None
                    return None
                continue
            except BackendError as exc:
                result.model_s += time.perf_counter() - t0
                result.requests += exc.attempts
                result.stop_reason, result.error = "error", str(exc)
                return None
            result.model_s += time.perf_counter() - t0
            result.requests += reply.attempts
            result.prompt_tokens += reply.prompt_tokens
            result.completion_tokens += reply.completion_tokens
            return reply
        result.stop_reason = "error"
        return None


def _accepts(method, keyword: str) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _answer(text: str | None, result: AgentResult) -> None:
    """A reply without a call is the final answer (``gave_up`` when it is empty or a refusal)."""
    text = (text or "").strip()
    result.final_answer = text or None
    gave_up = not text or ("<answer>" not in text.lower() and _GAVE_UP.search(text))
    result.stop_reason = "gave_up" if gave_up else "answered"


def _elide_oldest(messages: list[dict]) -> bool:
    """Elide the oldest tool result (a ``tool`` message, or a code observation a CodeAct agent sent as user)."""
    for msg in messages:
        observation = msg["role"] == "user" and str(msg.get("content")).startswith(OBSERVATION)
        if (msg["role"] == "tool" or observation) and msg["content"] != ELIDED:
            msg["content"] = ELIDED
            return True
    return False
