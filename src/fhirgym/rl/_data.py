"""RL datasets in SkyRL's row layout, and the instances behind their rows.

A row names its instance (track, task, seed, split) and the world it comes from (world seed and patient
count: worlds are built deterministically, so a GPU machine rebuilds the same one; the sha256 is there
to check). It never carries the gold: the environment rebuilds the instance and judges the episode.
Splits are disjoint seed ranges, so train, valid and test never share a (family, seed).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

from ..tasks import Instance, TaskInfeasible, TaskWorld, make_instance, select
from ..world import DEFAULT_PATIENTS, DEFAULT_SEED, build_world, world_sha256
from ._text import TextEpisode

#: Seeds of each split (per family): disjoint ranges.
SPLITS = {"train": range(0, 10_000), "valid": range(10_000, 11_000), "test": range(11_000, 12_000)}
ENV_CLASSES = {"action": "fhirgym-action", "qa": "fhirgym-qa"}
DEFAULT_WORLD = {"seed": DEFAULT_SEED, "patients": DEFAULT_PATIENTS}

_INSTANCES: OrderedDict[tuple, Instance] = OrderedDict()
_LOCK = threading.Lock()
_CACHED = 256


def world_of(spec: dict | None) -> TaskWorld:
    """The TaskWorld a row names (``{"seed", "patients"}`` or ``{"path"}``), built and cached on first use."""
    spec = spec or DEFAULT_WORLD
    if spec.get("path"):
        return TaskWorld.open(spec["path"])
    return TaskWorld.open(build_world(seed=int(spec["seed"]), patients=int(spec["patients"])).path)


def instance_for(extra: dict) -> Instance:
    """The instance a row's ``extra_info`` names; the last few hundred are kept, so a reset stays cheap."""
    if extra.get("track", "action") != "action":
        raise ValueError(f"track {extra.get('track')!r} has no environment yet (only 'action')")
    world = world_of(extra.get("world"))
    key = (str(world.path), extra["task_id"], int(extra["seed"]))
    with _LOCK:
        if key in _INSTANCES:
            _INSTANCES.move_to_end(key)
            return _INSTANCES[key]
    inst = make_instance(extra["task_id"], int(extra["seed"]), world)
    with _LOCK:
        _INSTANCES[key] = inst
        while len(_INSTANCES) > _CACHED:
            _INSTANCES.popitem(last=False)
    return inst


def dataset_rows(track: str = "action", split: str = "train", *, tasks: str = "all", per_family: int = 8,
                 world: dict | None = None, max_turns: int = 12) -> list[dict[str, Any]]:
    """Rows for ``per_family`` instances of every selected family, from the split's seed range."""
    if track != "action":
        raise ValueError("only the action track has RL rows so far (QA rows are not built yet)")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use {', '.join(SPLITS)}")
    world = world or DEFAULT_WORLD
    tw = world_of(world)
    sha = world_sha256(tw.path)
    rows = []
    for fam in select(tasks):
        taken = 0
        for seed in SPLITS[split]:
            if taken >= per_family:
                break
            try:
                inst = instance_for({"task_id": fam.id, "seed": seed, "world": world})
            except TaskInfeasible:
                continue
            text = TextEpisode(inst, max_turns=max_turns)
            try:
                prompt = text.reset()
            finally:
                text.close()
            rows.append({"data_source": f"fhirgym/{track}", "prompt": prompt, "env_class": ENV_CLASSES[track],
                         "reward_spec": {"method": "rule", "ground_truth": None},
                         "extra_info": {"track": track, "task_id": fam.id, "seed": seed, "split": split,
                                        "category": fam.category, "difficulty": fam.difficulty,
                                        "writes": inst.writes, "world": {**world, "sha256": sha},
                                        "max_turns": max_turns}})
            taken += 1
    return rows


def write_rows(rows: list[dict], out: Path, name: str, formats: tuple[str, ...] = ("jsonl", "parquet")) -> list[Path]:
    """``name.jsonl`` always; ``name.parquet`` when pyarrow is installed (``pip install fhirgym[rl]``)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if "jsonl" in formats:
        path = out / f"{name}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        written.append(path)
    if "parquet" in formats:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise RuntimeError("parquet needs pyarrow: pip install 'fhirgym[rl]' (or ask for jsonl only)") from exc
        path = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        written.append(path)
    return written
