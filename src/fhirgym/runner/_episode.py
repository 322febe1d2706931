"""One episode: fork the instance's pre-run state, let the agent work, validate, describe the result.

The result line and the transcript follow docs/RESULTS.md. Everything the sandbox does (fork, tools,
diff, validation) is timed apart from the model (``sandbox_s``), because the sandbox must stay a small
share of an episode's wall time.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ..agents import AgentResult, AgentTask
from ..tasks import Instance, failure_modes_of, proximity
from ..tasks._answer import render
from ..tools import Tool, Toolbox


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


def run_episode(key: EpisodeKey, inst: Instance, agent, tools: tuple[Tool, ...], *, setting: str = "default",
                model: str | None = None, budget: int | None = None, max_iterations: int = 15,
                extra: dict | None = None, serve_mcp: Callable[[Toolbox], object] | None = None
                ) -> tuple[dict, dict]:
    """Run ``agent`` on ``inst``; returns (result line, transcript)."""
    t0 = time.perf_counter()
    fam = inst.family
    ep = inst.open()
    box = ep.toolbox(tools, budget)
    handles: list = []

    def mcp_url() -> str:
        if serve_mcp is None:
            raise RuntimeError("this runner was started without MCP support")
        handle = serve_mcp(box)
        handles.append(handle)
        return handle.url

    task = AgentTask(inst.prompt, inst.now, box, max_iterations=max_iterations, mcp_url=mcp_url,
                     reference=lambda tb: fam.solve(tb, inst.params, inst.now), extra=extra or {},
                     answer_schema=fam.answer.json_schema() if fam.answer is not None else None)
    error = None
    try:
        result = agent.run(task)
    except Exception as exc:  # an agent that crashes is an infrastructure error, recorded, not fatal
        result = AgentResult(None, "error", error=f"{type(exc).__name__}: {exc}")
        error = traceback.format_exc(limit=8)
    finally:
        for h in handles:
            h.close()
    try:
        verdict = ep.finish(result.final_answer)
    finally:
        ep.close()
    duration = time.perf_counter() - t0
    status = "error" if result.error else ("pass" if verdict.success else "fail")
    calls = box.calls
    names = [c.name for c in calls]
    modes = failure_modes_of(fam, calls, bool(verdict.collateral)) if status == "fail" else []
    line = {
        "episode_id": key.id, "task_id": fam.id, "category": fam.category, "difficulty": fam.difficulty,
        "writes": fam.writes, "seed": key.seed, "paraphrase": key.paraphrase, "prompt_id": inst.prompt_id,
        "run": key.run, "config": key.config, "setting": setting, "agent": getattr(agent, "name", str(agent)),
        "model": model, "status": status,
        "success": None if status == "error" else verdict.success,
        "light_success": None if status == "error" or not fam.writes else verdict.light_success,
        "reasons": verdict.reasons, "failure_modes": modes,
        "proximity": proximity(names, fam.sequences), "expected_min_calls": inst.expected_min_calls,
        "tool_calls": [c.to_json() for c in calls],
        "tokens": {"prompt": result.prompt_tokens, "completion": result.completion_tokens},
        "iterations": result.iterations, "stop_reason": result.stop_reason, "final_answer": result.final_answer,
        "duration_s": round(duration, 4), "sandbox_s": round(max(0.0, duration - result.model_s), 4),
        "error": result.error, "transcript": f"transcripts/{key.file_name}",
    }
    transcript = {
        **line, "prompt": inst.prompt, "now": inst.now.isoformat(), "params": render(inst.params),
        "system": next((m["content"] for m in result.messages if m.get("role") == "system"), None),
        "gold_answer": None if inst.gold.answer is None else render(inst.gold.answer),
        "expected_changes": [e.describe() for e in inst.gold.expects],
        "messages": result.messages, "tool_calls": [c.to_json(full=True) for c in calls],
        "diff": [c.to_json() for c in verdict.changes], "verdict": verdict.to_json(),
        "traceback": error,
    }
    return line, transcript
