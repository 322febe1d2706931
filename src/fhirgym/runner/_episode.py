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

from ..agents import INFRASTRUCTURE_ERRORS, AgentResult, AgentTask, ReferenceAgent
from ..env import Config, Episode, solve_reference
from ..tasks import Instance, failure_modes_of, paraphrase_source, proximity, render
from ..tasks.qa import QaFamily, qa_fields


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


def run_episode(key: EpisodeKey, inst: Instance, agent, config: Config | str = "baseline", *,
                setting: str = "default", model: str | None = None, budget: int | None = None,
                max_iterations: int = 15, unsafe_python: bool = False) -> tuple[dict, dict]:
    """Run ``agent`` on ``inst`` in a fresh episode; returns (result line, transcript)."""
    t0 = time.perf_counter()
    fam = inst.family
    with Episode(inst, config, budget=budget, unsafe_python=unsafe_python) as ep:
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
    reasons = list(verdict.reasons)
    if result.crash:
        reasons.insert(0, f"agent crashed: {result.crash}")
    names = [c.name for c in calls]
    modes = failure_modes_of(inst, calls, bool(verdict.collateral)) if status == "fail" else []
    line = {
        "episode_id": key.id, "task_id": fam.id, "category": fam.category, "difficulty": fam.difficulty,
        "writes": inst.writes, "seed": key.seed, "paraphrase": key.paraphrase,
        "paraphrase_source": paraphrase_source(inst), "prompt_id": inst.prompt_id,
        "run": key.run, "config": key.config, "setting": setting, "memory": memory, "agent": getattr(agent, "name", str(agent)),
        "model": model, "status": status,
        "success": None if status == "error" else verdict.success and not result.crash,
        "light_success": None if status == "error" or not inst.writes else verdict.light_success,
        "floor_nothing_found": floor,
        "reasons": reasons, "failure_modes": modes,
        "proximity": proximity(names, inst.sequences), "expected_min_calls": inst.expected_min_calls,
        "tool_calls": [c.to_json() for c in calls],
        "tokens": {"prompt": result.prompt_tokens, "completion": result.completion_tokens},
        "iterations": result.iterations, "stop_reason": result.stop_reason, "final_answer": result.final_answer,
        "duration_s": round(duration, 4), "sandbox_s": round(max(0.0, duration - result.model_s), 4),
        "error": result.error, "transcript": f"transcripts/{key.file_name}",
    }
    if isinstance(fam, QaFamily):  # the QA track: shape, gold types, retrieval P/R (docs/RESULTS.md)
        line["qa"] = qa_fields(fam.question, [c.output for c in calls])
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
