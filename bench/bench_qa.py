"""Question generation speed: reading a world's patients through the FHIR API, then questions/s.

Prints the seconds spent reading every patient (once per world and process), the questions
generated per second once the patients are read, the end-to-end rate, and the deterministic
matcher's answers scored per second. Usage: ``python bench/bench_qa.py [--patients 10]
[--per-template 20] [--runs 3]``
"""

from __future__ import annotations

import argparse
import statistics
import time

from fhirgym.tasks import TaskWorld
from fhirgym.tasks.qa import build_questions, read_facts, reference_reply, score_answer
from fhirgym.world import build_world


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=10)
    ap.add_argument("--per-template", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    world = TaskWorld(build_world(seed=42, patients=args.patients).path)  # a fresh cache: reading is measured
    t = time.perf_counter()
    facts = read_facts(world)
    read_s = time.perf_counter() - t
    rates, n = [], 0
    for run in range(args.runs):
        t = time.perf_counter()
        questions = build_questions(world, per_template=args.per_template, seed=run)
        rates.append(len(questions) / (time.perf_counter() - t))
        n = len(questions)
    t = time.perf_counter()
    replies = [(q, reference_reply(q)) for q in questions]
    assert all(score_answer(q, r).correct for q, r in replies)
    score_rate = len(replies) / (time.perf_counter() - t)
    per_q = 1 / statistics.median(rates)
    print(f"world: {args.patients} patients ({len(facts)} Patient resources)")
    print(f"reading every patient through the FHIR API: {read_s:.1f} s")
    print(f"generation ({n} questions per run, {args.runs} runs): median {statistics.median(rates):.0f} questions/s "
          f"(min {min(rates):.0f}, max {max(rates):.0f})")
    print(f"end to end for one run: {n / (read_s + n * per_q):.0f} questions/s")
    print(f"matcher: {score_rate:.0f} answers scored/s")


if __name__ == "__main__":
    main()
