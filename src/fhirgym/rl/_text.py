"""Text in, text out: an :class:`~fhirgym.env.Episode` driven by what a policy model writes.

``reset()`` gives the chat messages a model starts from (system prompt with the tools in Qwen's native ``<tools>``
block, then the clock, the request and the agents' closing nudge: the prompt an evaluated agent sees); ``step(text)``
reads the tool calls in the model's reply (``<tool_call>`` JSON, fenced JSON, bare JSON; a fenced ```` ```python ````
block is a call of the ``python`` tool where the configuration grants one), runs them through the episode and returns
their results as ``tool`` messages. A reply without a call is the final answer, and so is the ``answer`` of a ``finish``
call: the episode is judged and the reward given. A reasoning model's thinking (``<think>…</think>``, Qwen3's) is
dropped before a reply is read (:func:`strip_reasoning`): a call written while thinking never runs and a draft answer
there is never judged. The adapters (SkyRL, Gymnasium-style, TRL) are thin shells over this (docs/RL.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..agents import (
    CODE_BLOCK,
    CODEACT_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    CodeActAgent,
    ReactAgent,
    opening_turns,
    parse_tool_calls,
    worked_example,
)
from ..env import Config, Episode
from ..fhir import json_default_str
from ..tasks import Instance, Verdict
from ..tools import final_answer_of
from ._reward import RewardSpec

#: The tool output bound of a text episode: a small model's context holds a few such results.
TEXT_BUDGET = 4_000
_CALL_MARKERS = ("<tool_call", "```json", '"arguments"')
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S)


def strip_reasoning(text: str) -> str:
    """``text`` without its reasoning: what is left is what the model said and called.

    Qwen3 writes ``<think>…</think>`` before its reply. The opening tag may be in the prompt rather than the
    reply (a template that opens the thinking for the model), so a ``</think>`` before any ``<think>``
    ends reasoning that began the reply. A ``<think>`` never closed (the turn hit its length limit while
    thinking) makes the rest of the reply reasoning. Text without the tags is returned as it is."""
    if _THINK_CLOSE not in text and _THINK_OPEN not in text:
        return text
    close, open_ = text.find(_THINK_CLOSE), text.find(_THINK_OPEN)
    if close >= 0 and (open_ < 0 or close < open_):
        text = text[close + len(_THINK_CLOSE):]
    text = _THINK_BLOCK.sub("", text)
    if _THINK_OPEN in text:
        text = text[:text.find(_THINK_OPEN)]
    return text.strip()


def tool_block(schemas: list[dict]) -> str:
    """The tools as Qwen2.5's chat template states them in the system prompt (one JSON schema a line)."""
    lines = "\n".join(orjson.dumps(s).decode() for s in schemas)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{lines}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


@dataclass
class TextStep:
    """What one model reply did: the observations to append, the reward, whether the episode ended."""

    observations: list[dict]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class TextEpisode:
    """One instance as a multi-turn text environment; ``max_turns`` model replies at most.

    Reaching ``max_turns`` with a tool call ends the episode with no final answer (a write the model
    finished still counts). The reward is :meth:`RewardSpec.reward` of the verdict and the transcript.
    ``example``: the opening messages carry the worked exchange the local agent shows a small model
    (a look-up in the native format, then an answer in the task's format) between system and request.
    """

    def __init__(self, instance: Instance, config: Config | str = "baseline", *, max_turns: int = 12,
                 budget: int = TEXT_BUDGET, reward: RewardSpec | None = None, example: bool = False) -> None:
        self.episode = Episode(instance, config, budget=budget)
        self.example = example
        self.max_turns = max_turns
        self.reward_spec = reward or RewardSpec()
        self.turns = 0
        self.malformed = 0
        self.verdict: Verdict | None = None
        self.last_reward: float | None = None
        self._names: set[str] = set()

    def reset(self) -> list[dict]:
        """Fork the instance again and return the opening messages (system, [worked example,] user)."""
        obs = self.episode.reset()
        self.turns, self.malformed, self.verdict, self.last_reward = 0, 0, None, None
        self._names = {s["function"]["name"] for s in obs.tools}
        code = "python" in self._names  # code blocks run there
        prompt, nudge = (CODEACT_SYSTEM_PROMPT, CodeActAgent.nudge) if code else (SYSTEM_PROMPT, ReactAgent.nudge)
        system, user = opening_turns(prompt, obs.instructions, obs.now, obs.prompt, nudge)
        shown = worked_example(obs.tools, obs.answer_schema is not None) if self.example else []
        return [{"role": "system", "content": system + "\n\n" + tool_block(obs.tools)}, *shown,
                {"role": "user", "content": user}]

    def step(self, action: str) -> TextStep:
        if self.verdict is not None:
            raise RuntimeError("the episode is over: reset() it")
        self.turns += 1
        reply = strip_reasoning(action or "")
        calls = self.parse(reply)
        if not calls:
            if any(m in reply for m in _CALL_MARKERS):
                self.malformed += 1
            return self._end(reply, "answered")
        observations = []
        for name, args in calls:
            done = self.episode.step({"name": name, "arguments": args})
            final = final_answer_of(done)
            if final is not None:
                return self._end(final, "finished")
            observations.append({"role": "tool", "name": name,
                                 "content": orjson.dumps(done.output, default=json_default_str).decode()})
        if self.turns >= self.max_turns:
            step = self._end(None, "max_turns")
            step.observations = []
            return step
        return TextStep(observations, 0.0, False, {"turn": self.turns, "tool_calls": len(calls)})

    def parse(self, text: str) -> list[tuple[str, dict]]:
        """The calls in one reply, in order: tool-call JSON, else ```python blocks for a python tool (none
        from its reasoning)."""
        text = strip_reasoning(text or "")
        calls, _ = parse_tool_calls(text, self._names)
        if calls:
            return [(c.name, c.arguments) for c in calls]
        if "python" in self._names:
            return [("python", {"code": code}) for code in CODE_BLOCK.findall(text)]
        return []

    def finish(self, answer: str | None) -> TextStep:
        """End the episode with ``answer`` as the final reply, whatever it contains (a trainer that stopped
        the rollout itself, e.g. at its length limit, hands over the last text this way)."""
        if self.verdict is not None:
            raise RuntimeError("the episode is over: reset() it")
        return self._end(None if answer is None else strip_reasoning(answer), "answered")

    def _end(self, answer: str | None, why: str) -> TextStep:
        self.verdict = self.episode.submit(answer)
        inst = self.episode.instance
        correct = self.reward_spec.correct(inst, self.verdict, answer)
        reward = self.reward_spec.reward(self.verdict, self.malformed, inst.writes, correct)
        self.last_reward = reward
        return TextStep([], reward, True, {"turn": self.turns, "stop": why, "success": correct,
                                           "light_success": self.verdict.light_success,
                                           "malformed_turns": self.malformed, "reasons": self.verdict.reasons})

    def close(self) -> None:
        self.episode.close()
