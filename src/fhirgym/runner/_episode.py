"""One episode of an evaluation: drive the agent through an :class:`~fhirgym.env.Episode`, describe it.

The result line and the transcript follow docs/RESULTS.md. Everything the sandbox does (fork, tools,
diff, validation) is timed apart from the model (``sandbox_s``), because the sandbox must stay a small
share of an episode's wall time. Only infrastructure failures (the model's backend, the FHIR transport,
the code sandbox) make an episode ``error``; an exception from the agent's own code is its ``fail``.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

from ..agents import INFRASTRUCTURE_ERRORS, AgentResult, AgentTask, GuessAgent, ReferenceAgent
from ..env import Config, Episode, solve_reference
from ..tasks import Instance, Verdict, failure_modes_of, paraphrase_source, proximity, render
from ..tasks.qa import QaFamily, qa_fields
from ..tools import ToolCall


@dataclass(frozen=True)
class EpisodeKey:
    config: str
    task_id: str
    seed: int
    paraphrase: int
    run: int

    @property
    def id(self) -> str:
        return f"{self.config}/{self.task_id}/s{self.seed}/p{self.paraphrase}/r{self.run}"

    @property
    def file_name(self) -> str:
        return self.id.replace("/", "__") + ".json"


def _act(agent, task: AgentTask, episode: Episode) -> tuple[AgentResult, str | None]:
    """The agent's result and, when it raised, the traceback. The built-in reference agent gets the
    family's solver here (never through the task), and a plug-in subclass of it does not."""
    try:
        if type(agent) is ReferenceAgent:
            text = solve_reference(episode)
            return AgentResult(text, "answered", iterations=len(episode.calls), messages=[
                {"role": "user", "content": task.prompt}, {"role": "assistant", "content": text}]), None
        return agent.run(task), None
    except INFRASTRUCTURE_ERRORS as exc:
        return AgentResult(None, "error", error=f"{type(exc).__name__}: {exc}"), traceback.format_exc(limit=8)
    except Exception as exc:  # the agent's own bug: its failure, with the reason recorded
        return (AgentResult(None, "crashed", crash=f"{type(exc).__name__}: {exc}"),
                traceback.format_exc(limit=8))


_GUESSED: dict[tuple, bool] = {}


def guess_floor(inst: Instance) -> bool:
    """Whether the ``guess`` agent (one search of the type the request names, its first hit as the answer)
    passes this instance strictly: the floor that looks once, beside the blind one (a "nothing found"
    without a look passes nothing). Computed once per instance and process."""
    key = (str(inst.world.path), inst.task_id, inst.seed, inst.paraphrase, inst.prompt_id)
    if key not in _GUESSED:
        with Episode(inst, "baseline") as ep:
            obs = ep.reset()
            result = GuessAgent().run(AgentTask(obs.prompt, obs.now, ep.tools))
            _GUESSED[key] = ep.submit(result.final_answer).success
    return _GUESSED[key]


#: Tool calls one episode may make, the FHIR functions its python code calls included: a bound on what a
#: run holds in memory and logs, far above what any family's reference solution needs.
DEFAULT_MAX_STEPS = 1_000


def verdict_fields(inst: Instance, verdict: Verdict, calls: list[ToolCall], floor: bool,
                   crash: str | None = None) -> dict:
    """The verdict's part of a result line (docs/RESULTS.md): strict and light success, the nothing-found
    and guess floors, the reasons, failure modes, proximity and, for a question, the QA fields. One home for every
    runner of episodes (``fhirgym eval``, the inspect tasks); an agent's own crash fails the episode."""
    reasons = list(verdict.reasons)
    if crash:
        reasons.insert(0, f"agent crashed: {crash}")
    out = {
        "success": verdict.success and not crash,
        "light_success": verdict.light_success if inst.writes else None,
        "floor_nothing_found": floor, "floor_guess": guess_floor(inst), "reasons": reasons,
        "failure_modes": [] if verdict.success else failure_modes_of(inst, calls, bool(verdict.collateral)),
        "proximity": proximity([c.name for c in calls], inst.sequences),
        "expected_min_calls": inst.expected_min_calls,
    }
    if isinstance(inst.family, QaFamily):  # the QA track: shape, gold types, retrieval P/R
        out["qa"] = qa_fields(inst.family.question, [c.output for c in calls])
    return out


def run_episode(key: EpisodeKey, inst: Instance, agent, config: Config | str = "baseline", *,
                setting: str = "default", model: str | None = None, budget: int | None = None,
                max_iterations: int = 15, unsafe_python: bool = False,
                max_steps: int | None = DEFAULT_MAX_STEPS) -> tuple[dict, dict]:
    """Run ``agent`` on ``inst`` in a fresh episode; returns (result line, transcript)."""
    t0 = time.perf_counter()
    fam = inst.family
    with Episode(inst, config, budget=budget, unsafe_python=unsafe_python, max_steps=max_steps) as ep:
        memory = ep.config.labels.get("memory") or None
        obs = ep.reset()
        task = AgentTask(obs.prompt, obs.now, ep.tools, max_iterations=max_iterations,
                         instructions=obs.instructions, answer_schema=obs.answer_schema)
        result, trace = _act(agent, task, ep)
        verdict = ep.submit(result.final_answer)
        floor = ep.floor()
        calls = ep.calls
    duration = time.perf_counter() - t0
    status = "error" if result.error else ("pass" if verdict.success else "fail")
    judged = verdict_fields(inst, verdict, calls, floor, result.crash)
    if status == "error":  # infrastructure: no verdict to report
        judged.update(success=None, light_success=None, failure_modes=[])
    line = {
        "episode_id": key.id, "task_id": fam.id, "task_version": fam.version, "category": fam.category, "difficulty": fam.difficulty,
        "writes": inst.writes, "seed": key.seed, "paraphrase": key.paraphrase,
        "paraphrase_source": paraphrase_source(inst), "prompt_id": inst.prompt_id,
        "run": key.run, "config": key.config, "setting": setting, "memory": memory, "agent": getattr(agent, "name", str(agent)),
        "model": model, "status": status, **judged,
        "tool_calls": [c.to_json() for c in calls],
        "tokens": {"prompt": result.prompt_tokens, "completion": result.completion_tokens},
        "iterations": result.iterations, "stop_reason": result.stop_reason, "final_answer": result.final_answer,
        "duration_s": round(duration, 4), "sandbox_s": round(max(0.0, duration - result.model_s), 4),
        "error": result.error, "transcript": f"transcripts/{key.file_name}",
    }
    transcript = {
        **line, "prompt": inst.prompt, "now": inst.now.isoformat(), "params": render(inst.params),
        "system": next((m["content"] for m in result.messages if m.get("role") == "system"), None),
        "gold_answer": None if inst.gold.answer is None else render(
            inst.gold.answer.answer if isinstance(fam, QaFamily) else inst.gold.answer),
        "expected_changes": [e.describe() for e in inst.gold.expects],
        "messages": result.messages, "tool_calls": [c.to_json(full=True) for c in calls],
        "diff": [c.to_json() for c in verdict.changes], "verdict": verdict.to_json(),
        "model_requests": result.requests, "traceback": trace,
    }
    return line, transcript
