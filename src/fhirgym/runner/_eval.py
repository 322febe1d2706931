"""Evaluation runs: tasks × seeds × paraphrases × runs of one agent and configuration, into a directory.

``run_eval(EvalSpec(...))`` plans the episodes, skips those already in ``results.jsonl`` when resuming,
runs the rest (``parallel`` at a time, each on its own isolated store forked from the task instance's
pre-run snapshot) and appends one line per finished episode (docs/RESULTS.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import orjson

from ..agents import DEFAULT_MODEL, make_agent, needs_model
from ..tasks import Instance, TaskWorld, make_instance, select
from ..tools import FHIR_TOOLS, Tool
from ..world import world_sha256
from ._episode import EpisodeKey, run_episode
from ._results import RESULTS, append_result, read_results, write_atomic

CONFIGS = ("baseline", "specs")


def config_tools(config: str) -> tuple[Tool, ...]:
    """The tools an agent gets in a configuration (memory configurations add theirs in the memory layer)."""
    if config == "baseline":
        return FHIR_TOOLS
    if config == "specs":
        from ..tools import SPEC_TOOLS

        return FHIR_TOOLS + tuple(SPEC_TOOLS)
    raise EvalError(f"unknown --config {config!r}; known: {', '.join(CONFIGS)}")


class EvalError(RuntimeError):
    """A run that cannot start (bad settings, mismatched resume): printed without a traceback."""


@dataclass
class EvalSpec:
    out: Path
    agent: str = "react"
    model: str | None = None
    base_url: str | None = None
    tasks: str = "default"
    seeds: list[int] = field(default_factory=lambda: [0])
    runs: int = 1
    config: str = "baseline"
    setting: str = "default"
    parallel: int = 1
    resume: bool = False
    world: Path | None = None
    max_iterations: int = 15
    budget: int | None = None
    paraphrases: int = 0  # 0: template prompts only; k: also the first k cached paraphrases

    def identity(self) -> dict:
        """What must match for ``--resume`` to append to an existing directory."""
        return {k: v for k, v in asdict(self).items() if k in ("agent", "model", "config", "setting", "budget",
                                                                "max_iterations")}


def plan(spec: EvalSpec) -> list[EpisodeKey]:
    fams = select(spec.tasks)
    if not fams:
        raise EvalError(f"--tasks {spec.tasks!r} selects no task")
    return [EpisodeKey(spec.config, f.id, seed, p, run) for f in fams for seed in spec.seeds
            for p in range(spec.paraphrases + 1) for run in range(spec.runs)]


def _prepare_dir(spec: EvalSpec, world: TaskWorld) -> set[str]:
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    run_file = out / "run.json"
    existing = read_results(out, repair=spec.resume)
    if existing and not spec.resume:
        raise EvalError(f"{out} already holds {len(existing)} results: pass --resume to continue, or another --out")
    if run_file.exists() and spec.resume:
        before = orjson.loads(run_file.read_bytes()).get("identity", {})
        if before and before != spec.identity():
            diff = {k: (before.get(k), v) for k, v in spec.identity().items() if before.get(k) != v}
            raise EvalError(f"--resume into {out} with different settings {diff}: use another --out")
    if not run_file.exists() or not spec.resume:
        info = {"identity": spec.identity(), "spec": {k: str(v) if isinstance(v, Path) else v
                                                      for k, v in asdict(spec).items()},
                "fhirgym_version": version("fhirgym"), "world": str(world.path),
                "world_manifest": world.manifest, "world_sha256": world_sha256(world.path),
                "started": datetime.now(UTC).isoformat(timespec="seconds")}
        write_atomic(run_file, info)
    return {line["episode_id"] for line in existing}


def run_eval(spec: EvalSpec, world: TaskWorld, progress: Callable[[dict, int, int], None] | None = None,
             agent=None) -> list[dict]:
    """Run (or resume) the evaluation; returns every result line of the directory.

    ``agent``: an agent object to use instead of building one from ``spec.agent`` (tests, notebooks)."""
    tools = config_tools(spec.config)
    keys = plan(spec)
    done = _prepare_dir(spec, world)
    todo = [k for k in keys if k.id not in done]
    if agent is None:
        agent = make_agent(spec.agent, spec.model, spec.base_url, spec.max_iterations)
    model = spec.model if needs_model(spec.agent) else None
    if model is None and spec.agent == "react":
        model = DEFAULT_MODEL
    instances: dict[tuple[str, int, int], Instance] = {}
    lock = threading.Lock()

    def instance(key: EpisodeKey) -> Instance:
        ik = (key.task_id, key.seed, key.paraphrase)
        with lock:
            if ik in instances:
                return instances[ik]
            inst = make_instance(key.task_id, key.seed, world)
            if key.paraphrase:
                from ..tasks import cached_paraphrase

                inst = cached_paraphrase(inst, key.paraphrase)
            inst.reference  # noqa: B018  (computed once here, not in parallel episodes)
            instances[ik] = inst
            return inst

    serve = _mcp_server if spec.agent.startswith("cmd:") else None
    # --budget, else what the agent's model can afford (a local model: less), else the tools' default
    budget = spec.budget or getattr(getattr(agent, "backend", None), "tool_budget", None)

    def one(key: EpisodeKey) -> dict:
        line, transcript = run_episode(key, instance(key), agent, tools, setting=spec.setting, model=model,
                                       budget=budget, max_iterations=spec.max_iterations, serve_mcp=serve)
        write_atomic(spec.out / line["transcript"], transcript)
        append_result(spec.out, line)
        return line

    finished = 0
    total = len(todo)
    if spec.parallel <= 1:
        for key in todo:
            line = one(key)
            finished += 1
            if progress:
                progress(line, finished, total)
    else:
        with ThreadPoolExecutor(spec.parallel) as pool:
            pending = {pool.submit(one, k) for k in todo}
            while pending:
                ready, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    line = fut.result()
                    finished += 1
                    if progress:
                        progress(line, finished, total)
    return read_results(spec.out)


def _mcp_server(toolbox):
    from ..mcp import serve_http

    return serve_http(toolbox)


def summary(results: list[dict]) -> str:
    """The table printed at the end of ``fhirgym eval``: success by category and difficulty, tokens."""
    def row(label: str, group: list[dict]) -> str:
        scored = [r for r in group if r["status"] != "error"]
        ok = sum(bool(r["success"]) for r in scored)
        writes = [r for r in scored if r.get("light_success") is not None]
        light = f"{100 * sum(r['light_success'] for r in writes) / len(writes):5.1f}" if writes else "    -"
        tokens = sum(r["tokens"]["prompt"] + r["tokens"]["completion"] for r in group) / max(1, len(group))
        errors = len(group) - len(scored)
        rate = f"{100 * ok / len(scored):5.1f}" if scored else "    -"
        return f"{label:28} {len(group):5} {rate} % {light} % {errors:6} {tokens:9.0f}"

    head = f"{'':28} {'n':>5} {'strict':>7} {'light':>7} {'errors':>6} {'tokens/ep':>9}"
    lines = [head, "-" * len(head)]
    for cat in sorted({r["category"] for r in results}):
        lines.append(row(cat, [r for r in results if r["category"] == cat]))
    lines.append("-" * len(head))
    for d in sorted({r["difficulty"] for r in results}):
        lines.append(row(f"difficulty {d}", [r for r in results if r["difficulty"] == d]))
    lines.append("-" * len(head))
    lines.append(row("all", results))
    return "\n".join(lines)


def progress_line(line: dict, finished: int, total: int, started: float, counts: dict[str, int]) -> str:
    counts[line["status"]] = counts.get(line["status"], 0) + 1
    elapsed = time.perf_counter() - started
    eta = elapsed / finished * (total - finished) if finished else 0
    width = 24
    filled = int(width * finished / max(1, total))
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {finished}/{total}  pass {counts.get('pass', 0)} "
            f"fail {counts.get('fail', 0)} error {counts.get('error', 0)}  "
            f"{elapsed:5.0f}s elapsed, ~{eta:4.0f}s left  {line['task_id'][:40]:40}")


__all__ = ["CONFIGS", "RESULTS", "EvalError", "EvalSpec", "plan", "progress_line", "run_eval", "summary"]
