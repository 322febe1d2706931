"""Benchmark of behaviour cloning on the CPU: making expert trajectories, and the SFT step.

Prints trajectories/min of ``fhirgym rl trajectories`` (the reference replayed through real episodes,
rendered and grammar-checked as the local model would see them) over the held-out split's train
families, and, on the 0.5B (``--steps`` > 0), the SFT step: seconds per trajectory, trajectories/min and
tokens/s (all tokens of the conversation, and the trained ones), with the load average beside them.
Asserts nothing.

Usage: ``python bench/bench_sft.py [--per-family 2] [--steps 4] [--dtype auto] [--threads 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from fhirgym.rl import Selection, SftSpec, read_trajectories, sft, write_trajectories


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-family", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="SFT optimiser steps to time (0: trajectories only)")
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        t0 = time.perf_counter()
        manifest = write_trajectories(data, Selection(per_family=args.per_family))
        took = time.perf_counter() - t0
        n = manifest["kept"] + manifest["skipped"]
        print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        print(f"trajectories: {n} instances ({manifest['kept']} kept, {manifest['skipped']} not expressible) in "
              f"{took:.1f} s = {60 * n / took:.0f} per min ({1000 / (60 * n / took):.1f} min per 1,000); "
              f"{manifest['tokens'] / max(1, manifest['kept']):.0f} tokens each, "
              f"{manifest['trained_tokens'] / max(1, manifest['kept']):.0f} trained")
        if args.steps <= 0:
            return
        kept = read_trajectories(data)
        t0 = time.perf_counter()
        summary = sft(SftSpec(out=Path(tmp) / "run", data=data, max_steps=args.steps, grad_accum=args.grad_accum,
                              dtype=args.dtype, threads=args.threads, save_steps=10_000))
        wall = time.perf_counter() - t0
        seen = args.steps * args.grad_accum
        mean = sum(len(t.input_ids) for t in kept) / len(kept)
        trained = sum(sum(1 for x in t.labels if x != -100) for t in kept) / len(kept)
        print(f"sft ({summary['dtype']}, {args.steps} steps × {args.grad_accum} trajectories, model load "
              f"included in {wall:.0f} s): {summary['wall_s'] / seen:.1f} s per trajectory = "
              f"{summary['trajectories_per_min']:.2f} trajectories/min, {summary['tokens_per_s']:.0f} tokens/s "
              f"({trained * seen / summary['wall_s']:.0f} trained tokens/s); mean {mean:.0f} tokens")
        walls = [json.loads(x)["wall_s"] for x in (Path(tmp) / "run" / "curve.jsonl").read_text().splitlines()
                 if '"loss"' in x]
        if len(walls) > 1:  # the first step pays the kernels' warm-up: steady state from the second on
            per = (walls[-1] - walls[0]) / ((len(walls) - 1) * args.grad_accum)
            print(f"  after the first step: {per:.1f} s per trajectory = {60 / per:.2f} trajectories/min, "
                  f"{mean / per:.0f} tokens/s ({trained / per:.0f} trained tokens/s)")
        print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
