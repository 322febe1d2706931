"""Per-episode sandbox cost of the task framework (issue 4, requirement 9: ≤ 10 ms p50 on the 100-patient world).

For every family × seed: instance creation (sample, setup, gold, pre-run snapshot), opening the
episode (fork), and validation (diff + verdict) after the reference solution ran — the reference's own
tool calls are the agent's work and are timed apart. Prints p50/p95 per stage and per category.

    .venv/bin/python bench/bench_tasks.py [--world FILE | --patients 100] [--seeds 10] [--tasks all]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from fhirgym.tasks import TaskWorld, make_instance, select
from fhirgym.world import build_world


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world")
    ap.add_argument("--patients", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--tasks", default="all")
    args = ap.parse_args()
    path = args.world or build_world(seed=42, patients=args.patients).path
    world = TaskWorld.open(path)
    fams = select(args.tasks)
    t = time.perf_counter()
    for f in fams:  # warm the per-world caches once (not part of an episode's cost)
        make_instance(f, 10_000, world)
    print(f"world {path}: cache warm-up {time.perf_counter() - t:.1f} s for {len(fams)} families")
    stages: dict[str, list[float]] = defaultdict(list)
    by_cat: dict[str, list[float]] = defaultdict(list)
    for f in fams:
        for seed in range(args.seeds):
            t0 = time.perf_counter()
            inst = make_instance(f, seed, world)
            t1 = time.perf_counter()
            ep = inst.open()
            t2 = time.perf_counter()
            text = f.solve(ep.toolbox(), inst.params, inst.now)
            t3 = time.perf_counter()
            verdict = ep.finish(text)
            t4 = time.perf_counter()
            ep.close()
            assert verdict.success, (f.id, seed, verdict.reasons)
            sandbox = (t1 - t0) + (t2 - t1) + (t4 - t3)
            for name, value in (("create instance", t1 - t0), ("fork episode", t2 - t1),
                                ("validate", t4 - t3), ("sandbox total", sandbox), ("reference tools", t3 - t2)):
                stages[name].append(value * 1000)
            by_cat[f.category].append(sandbox * 1000)
    n = len(stages["sandbox total"])
    print(f"{len(fams)} families × {args.seeds} seeds = {n} episodes")
    print(f"{'stage':18} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for name, vals in stages.items():
        print(f"{name:18} {pct(vals, 0.5):8.2f} {pct(vals, 0.95):8.2f} {statistics.mean(vals):8.2f}")
    print(f"\n{'category (sandbox)':18} {'p50 ms':>8} {'p95 ms':>8}")
    for cat, vals in sorted(by_cat.items()):
        print(f"{cat:18} {pct(vals, 0.5):8.2f} {pct(vals, 0.95):8.2f}")
    p50 = pct(stages["sandbox total"], 0.5)
    print(f"\ntarget: sandbox total ≤ 10 ms p50 — {'MET' if p50 <= 10 else 'NOT MET'} ({p50:.2f} ms)")


if __name__ == "__main__":
    main()
