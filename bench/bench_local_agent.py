"""Seconds per episode of the ReAct agent on an embedded local model, per prompting setting (issue 17).

Runs the tasks (default: three of the default subset, seed 0) once per setting and prints, per
setting: episodes passed (strict), episodes with ≥ 1 valid tool call, mean turns, mean completion tokens,
inference seconds per episode (without waiting for the machine-wide inference lock) and wall seconds. Settings are ``grammar``/``example`` on or off (the 2 × 2
ablation); ``--settings plain`` is the pre-issue-17 behaviour as far as the current backend can reproduce
it (no grammar, no example, full tool descriptions). Run against an older checkout (``PYTHONPATH=that/src``)
the backend's missing options are dropped and the row is labelled ``as-is``.

    .venv/bin/python bench/bench_local_agent.py --model local/qwen2.5-coder-1.5b \\
        --tasks records.find_patient,clinical.last_hba1c,clinical.record_blood_pressure --settings ge,g,e,-
"""

from __future__ import annotations

import argparse
import inspect
import tempfile
import time
from pathlib import Path

from fhirgym.agents import ReactAgent, make_backend
from fhirgym.runner import EvalSpec, run_eval
from fhirgym.tasks import TaskWorld
from fhirgym.world import build_world

#: Setting codes: g = grammar, e = worked example, r = a line of reasoning before each call; "-" = neither;
#: "plain" also drops compact descriptions.
SETTINGS = {"ge": dict(grammar=True, example=True), "g": dict(grammar=True, example=False),
            "e": dict(grammar=False, example=True), "-": dict(grammar=False, example=False),
            "plain": dict(grammar=False, example=False, compact=False),
            "ger": dict(grammar=True, example=True, reasoning=160)}


def backend_options(model: str, setting: str) -> tuple[dict, str]:
    """The options this checkout's local backend accepts for ``setting`` (and a label saying so)."""
    from fhirgym.agents._local import LocalBackend

    accepted = inspect.signature(LocalBackend).parameters
    wanted = SETTINGS[setting]
    options = {k: v for k, v in wanted.items() if k in accepted}
    return options, setting if options == wanted else "as-is"


class Timed:
    """The backend, adding up its inference seconds (``last_stats.seconds``: without the wait for the
    machine-wide inference lock, which other processes' models hold on a shared machine)."""

    def __init__(self, backend) -> None:
        self.backend, self.name, self.seconds = backend, backend.name, 0.0
        self.max_reply_tokens = backend.max_reply_tokens
        self.tool_budget = backend.tool_budget
        self.takes = set(inspect.signature(backend.chat).parameters)

    def chat(self, messages, tools=None, **kwargs):
        try:
            return self.backend.chat(messages, tools, **{k: v for k, v in kwargs.items() if k in self.takes})
        finally:
            self.seconds += self.backend.last_stats.seconds


def run(world: TaskWorld, model: str, tasks: str, setting: str, seeds: list[int]) -> None:
    options, label = backend_options(model, setting)
    backend = Timed(make_backend(model, **options))
    spent: dict[str, float] = {}

    def progress(line: dict, finished: int, total: int) -> None:
        spent[line["episode_id"]] = backend.seconds - sum(spent.values())
        print(f"  [{label}] {line['task_id']}: {line['status']}, {line['iterations']} turns, "
              f"{len(line['tool_calls'])} calls, inference {spent[line['episode_id']]:.1f} s, "
              f"episode {line['duration_s']:.1f} s, answer {str(line['final_answer'])[:70]!r}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        lines = run_eval(EvalSpec(out=Path(tmp), agent="react", model=model, tasks=tasks, seeds=seeds),
                         world, progress=progress, agent=ReactAgent(backend))
        wall = time.perf_counter() - t0
    n = len(lines)
    strict = sum(r["status"] == "pass" for r in lines)
    called = sum(any(not c.get("error") for c in r.get("tool_calls") or []) for r in lines)
    turns = sum(r.get("iterations", 0) for r in lines) / n
    completion = sum(r["tokens"]["completion"] for r in lines) / n
    seconds = sum(r["duration_s"] for r in lines) / n
    inference = backend.seconds / n
    print(f"| {model} | {label} | {strict}/{n} | {called}/{n} | {turns:.1f} | {completion:.0f} | "
          f"{inference:.1f} | {seconds:.1f} | {wall:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="local/qwen2.5-coder-1.5b")
    ap.add_argument("--tasks", default="records.find_patient,clinical.last_hba1c,clinical.record_blood_pressure")
    ap.add_argument("--settings", default="ge,-", help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--world")
    args = ap.parse_args()
    world = TaskWorld.open(args.world or build_world(seed=42, patients=10).path)
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| model | setting | strict | ≥1 valid call | mean turns | mean completion tok | "
          "inference s/episode | s/episode incl. lock wait | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for setting in args.settings.split(","):
        run(world, args.model, args.tasks, setting, seeds)


if __name__ == "__main__":
    main()
