"""The samples of a fhirgym inspect task: one per instance that ``fhirgym eval`` plans for the same
settings (``runner.plan`` and ``runner.instance_for``: the same selectors, seed grammar, QA splits).

A sample carries the request (the clock block, then the task's prompt: what fhirgym's agents are told)
and metadata for inspect's grouped metrics (``task_id``, ``category``, ``difficulty``, ``seed``,
``writes``, QA ``template`` and ``shape``); never the gold (``target`` stays empty). ``writes`` is the
instance's own, as in a result line: for a conditional family (write only if a value is low) it tells a
solver that reads it which branch the instance takes, so a solver must not read sample metadata. The
instances stay in this process (keyed by their source and sample), where the task's setup finds them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from inspect_ai.dataset import Sample

from .._defaults import DEFAULT_PATIENTS, DEFAULT_SEED
from ..agents import clock_block
from ..runner import EpisodeKey, EvalError, EvalSpec, instance_for, plan
from ..tasks import Instance, TaskWorld, get_track, parse_seeds
from ..tasks.qa import QaFamily

_INSTANCES: dict[tuple, Instance] = {}
_LOCK = threading.Lock()


def world_path(world: str | None, world_seed: int = DEFAULT_SEED, patients: int = DEFAULT_PATIENTS) -> str:
    """``world`` (a file), else the cached seeded world every fhirgym command defaults to."""
    from ..world import world_file

    return str(world_file(world, seed=world_seed, patients=patients))


def source(track: str, world: str, tasks: str | list[str], seeds, *, split: str = "valid",
           questions: str | None = None, per_template: int | None = None) -> dict:
    """Where a task's instances come from, as JSON (it is a solver argument, recorded in the log). inspect's
    CLI turns ``-T tasks=a,b`` into a list and ``-T seeds=3,5`` into one of ints: both are taken."""
    if isinstance(tasks, list | tuple):
        tasks = ",".join(str(t) for t in tasks)
    out = {"track": track, "world": world, "tasks": str(tasks), "seeds": parse_seeds(seeds)}
    if get_track(track).by_question:
        out.update(split=split, questions=questions, per_template=per_template)
    return out


def _spec(src: dict) -> EvalSpec:
    extra = {}
    if get_track(src["track"]).by_question:
        extra = {"split": src["split"], "questions": Path(src["questions"]) if src["questions"] else None}
        if src["per_template"] is not None:
            extra["per_template"] = src["per_template"]
    # plan() and instance_for() never touch the output directory
    return EvalSpec(out=Path("."), tasks=src["tasks"], seeds=src["seeds"], track=src["track"], **extra)


def _key(src: dict, task_id: str, seed: int) -> tuple:
    return (src["track"], src["world"], src.get("split"), src.get("questions"), src.get("per_template"),
            task_id, seed)


def instance(src: dict, task_id: str, seed: int) -> Instance:
    """The instance of one sample (built again if this process has not built it yet)."""
    key = _key(src, task_id, seed)
    with _LOCK:
        if key not in _INSTANCES:
            world = TaskWorld.open(src["world"])
            _INSTANCES[key] = instance_for(_spec(src), world, EpisodeKey("inspect", task_id, seed, 0, 0))
        return _INSTANCES[key]


def samples(src: dict) -> list[Sample]:
    world = TaskWorld.open(src["world"])
    try:
        keys = plan(_spec(src), world)
    except (EvalError, KeyError) as exc:  # a selector that selects nothing, an unknown family
        raise ValueError(exc.args[0] if exc.args else str(exc)) from None
    out = []
    for key in keys:
        inst = instance(src, key.task_id, key.seed)
        fam = inst.family
        meta = {"task_id": fam.id, "category": fam.category, "difficulty": fam.difficulty, "seed": key.seed,
                "writes": inst.writes, "track": src["track"]}
        if isinstance(fam, QaFamily):
            meta.update(template=fam.question.template, shape=fam.question.shape)
        out.append(Sample(input=clock_block(inst.now) + "\n\n" + inst.prompt, id=f"{fam.id}-s{key.seed}",
                          metadata=meta))
    return out
