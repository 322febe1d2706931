"""Benchmark of the RL text environment: reset and step cost, the model excluded.

Prints p50/p95 of ``TextEpisode.reset()`` (fork the instance's pre-run state, grant the tools, build
the opening messages) and of one ``step`` with a search call, over the families of a selector on the
10-patient world; the target for reset is 5 ms p50. Asserts nothing.

Usage: ``python bench/bench_rl.py [--track action|qa] [--tasks default] [--rounds 50]`` (QA: one
question of each selected template, ``--tasks all`` meaning every template).
"""

from __future__ import annotations

import argparse
import statistics
import time

from fhirgym.rl import TextEpisode, dataset_rows, instance_for
from fhirgym.tasks import select
from fhirgym.world import build_world


def _pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--track", choices=["action", "qa"], default="action")
    ap.add_argument("--tasks", default="default")
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    world = {"path": str(build_world(seed=42, patients=10).path)}
    resets: list[float] = []
    steps: list[float] = []
    call = '<tool_call>{"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {"_count": "5"}}}</tool_call>'
    if args.track == "qa":
        extras = [r["extra_info"] for r in dataset_rows("qa", "train", tasks="all" if args.tasks == "default"
                                                        else args.tasks, per_family=1, world=world)]
    else:
        extras = [{"task_id": fam.id, "seed": 0, "world": world} for fam in select(args.tasks)]
    for extra in extras:
        text = TextEpisode(instance_for(extra))
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            text.reset()
            t1 = time.perf_counter()
            text.step(call)
            t2 = time.perf_counter()
            resets.append((t1 - t0) * 1000)
            steps.append((t2 - t1) * 1000)
        text.close()
    print(f"{len(resets)} resets over {len(extras)} {args.track} instances ({args.tasks}), model excluded")
    print(f"reset: p50 {statistics.median(resets):.2f} ms, p95 {_pct(resets, 0.95):.2f} ms (target: 5 ms p50)")
    print(f"step (one Patient search): p50 {statistics.median(steps):.2f} ms, p95 {_pct(steps, 0.95):.2f} ms")


if __name__ == "__main__":
    main()
