"""Two evaluation runs on the same instances, side by side: what docs/TRAINING.md's tables report.

For each result directory: episodes, strict and light success, the writing families passed, the share
of episodes with at least one valid tool call (a call that returned no error), mean turns, seconds per
episode, the two floors on the same instances (nothing-found, guess), then the paired comparison of the
second run against the first on the instances both ran (both-right, only-first, only-second, neither)
with the exact McNemar p-value.
Prints a Markdown table. Asserts nothing.

Usage: ``python bench/compare_runs.py BASE_DIR TUNED_DIR [--label base --label tuned] [--tasks SELECTOR]``
(``--tasks``: only the action families a selector names, e.g. ``split:eval`` or ``default``, so one run
of every family gives the tables of each subset.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fhirgym.analysis._stats import mcnemar_exact
from fhirgym.runner import read_results
from fhirgym.tasks import select


def _key(r: dict) -> tuple:
    return r["task_id"], r["seed"], r.get("paraphrase", 0), r.get("run", 1), r.get("qa", {}).get("question_id")


def _pct(values: list[bool]) -> str:
    return f"{100 * sum(values) / len(values):.1f} %" if values else "–"


def row(label: str, lines: list[dict]) -> str:
    scored = [r for r in lines if r["status"] != "error"]
    writes = [r for r in scored if r.get("light_success") is not None]
    valid = [any(c.get("error") is None for c in r["tool_calls"]) for r in scored]
    turns = sum(r["iterations"] for r in scored) / max(1, len(scored))
    secs = sum(r["duration_s"] for r in lines) / max(1, len(lines))
    passing_writes = len({r["task_id"] for r in writes if r["success"]})
    floors = [_pct([bool(r.get(f)) for r in scored if r.get(f) is not None])
              for f in ("floor_nothing_found", "floor_guess")]
    return (f"| {label} | {len(lines)} | {len(lines) - len(scored)} | {_pct([bool(r['success']) for r in scored])} | "
            f"{_pct([bool(r['light_success']) for r in writes])} | {passing_writes} | {_pct(valid)} | {turns:.1f} | {secs:.1f} | "
            f"{floors[0]} | {floors[1]} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs=2, type=Path)
    ap.add_argument("--label", action="append", default=None)
    ap.add_argument("--tasks", default=None, help="only these action families (a fhirgym task selector)")
    args = ap.parse_args()
    labels = args.label or [d.name for d in args.dirs]
    runs = [read_results(d) for d in args.dirs]
    if args.tasks:
        keep = {f.id for f in select(args.tasks)}
        runs = [[r for r in lines if r["task_id"] in keep] for lines in runs]
    print("| run | episodes | errors | strict | light (writes) | writing families passed | ≥ 1 valid call | mean turns | s/episode | "
          "nothing-found floor | guess floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, lines in zip(labels, runs, strict=True):
        print(row(label, lines))
    first = {_key(r): bool(r["success"]) for r in runs[0] if r["status"] != "error"}
    second = {_key(r): bool(r["success"]) for r in runs[1] if r["status"] != "error"}
    both = sorted(set(first) & set(second))
    cells = {(a, b): sum(1 for k in both if (first[k], second[k]) == (a, b)) for a in (True, False) for b in (True, False)}
    p = mcnemar_exact(cells[(True, False)], cells[(False, True)])
    print(f"\npaired on {len(both)} instances: both right {cells[(True, True)]}, only {labels[0]} "
          f"{cells[(True, False)]}, only {labels[1]} {cells[(False, True)]}, neither {cells[(False, False)]}; "
          f"exact McNemar p = {p:.4g}")


if __name__ == "__main__":
    main()
