"""Runner figures of issue 5, requirement 7.

1. 64 episodes at once in one process (``--parallel 64``) with a model that thinks for a while (a
   scripted ReAct model that sleeps ``--think`` seconds per turn and solves records.find_patient):
   peak RSS of the process and wall time against the serial time.
2. The sandbox's share of episode wall time in real result directories (``--results DIR ...``, e.g. a
   run with the local 1.5B model): sum(sandbox_s) / sum(duration_s), target ≤ 1 %.

    .venv/bin/python bench/bench_runner.py [--episodes 64] [--think 2.0] [--results runs/quickstart]
"""

from __future__ import annotations

import argparse
import re
import resource
import tempfile
import time
from datetime import datetime
from pathlib import Path

import orjson

from fhirgym.agents import ReactAgent, ScriptedBackend
from fhirgym.runner import EvalSpec, read_results, run_eval
from fhirgym.tasks import TaskWorld
from fhirgym.world import build_world


class ThinkingSolver:
    """A ReAct agent whose scripted model sleeps like a real one and solves records.find_patient."""

    name = "scripted-thinker"

    def __init__(self, think: float) -> None:
        self.think = think

    def run(self, task):
        name, born = re.search(r"Is (.+?), born (\w+ \d+, \d{4})", task.prompt).groups()
        birth = datetime.strptime(born, "%B %d, %Y").date().isoformat()
        call = {"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {
            "given": name.split()[0], "family": name.split()[-1], "birthdate": birth}}}

        def first(messages):
            time.sleep(self.think)
            return f"<tool_call>{orjson.dumps(call).decode()}</tool_call>"

        def answer(messages):
            time.sleep(self.think)
            found = re.search(r'"id":"([^"]+)"', messages[-1]["content"])
            return f'<answer>{{"patient_id": "{found.group(1)}"}}</answer>'

        return ReactAgent(ScriptedBackend([first, answer])).run(task)


def concurrency(world: TaskWorld, episodes: int, think: float) -> None:
    agent = ThinkingSolver(think)
    with tempfile.TemporaryDirectory() as tmp:
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        lines = run_eval(EvalSpec(out=Path(tmp), agent="scripted", tasks="records.find_patient",
                                  seeds=list(range(episodes)), parallel=episodes), world, agent=agent)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    passed = sum(r["status"] == "pass" for r in lines)
    serial = sum(r["duration_s"] for r in lines)
    print(f"{episodes} concurrent episodes (model think time {think} s/turn): {passed}/{len(lines)} pass, "
          f"wall {wall:.1f} s vs {serial:.1f} s of episode time (×{serial / wall:.1f} overlap)")
    print(f"peak RSS of the process: {rss:.0f} MiB (before the run {rss0:.0f} MiB); target ≤ 2048 MiB — "
          f"{'MET' if rss <= 2048 else 'NOT MET'}")


def sandbox_share(dirs: list[str]) -> None:
    lines = [r for d in dirs for r in read_results(Path(d)) if r["status"] != "error"]
    if not lines:
        print("no results")
        return
    sandbox = sum(r["sandbox_s"] for r in lines)
    total = sum(r["duration_s"] for r in lines)
    models = sorted({str(r["model"]) for r in lines})
    print(f"{len(lines)} episodes ({', '.join(models)}): sandbox {sandbox:.2f} s of {total:.0f} s = "
          f"{100 * sandbox / total:.3f} % of episode wall time; target ≤ 1 % — "
          f"{'MET' if sandbox <= 0.01 * total else 'NOT MET'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--think", type=float, default=2.0)
    ap.add_argument("--world")
    ap.add_argument("--results", nargs="*", default=[])
    args = ap.parse_args()
    world = TaskWorld.open(args.world or build_world(seed=42, patients=100).path)
    concurrency(world, args.episodes, args.think)
    if args.results:
        sandbox_share(args.results)


if __name__ == "__main__":
    main()
