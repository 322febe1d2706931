"""RL datasets in SkyRL's row layout, and the instances behind their rows.

A row names its instance (track, task, seed, split), the world it comes from (world seed and patient count: worlds are
built deterministically, so a GPU machine rebuilds the same one; the sha256 is there to check) and the configuration
(tools) its prompt was written for, so an environment that rebuilds it (SkyRL passes no env config) grants those tools.
It never carries the gold: the environment rebuilds the instance and judges the episode. Action splits are disjoint seed
ranges, so train, valid and test never share a (family, seed); QA rows name a question (by its id) of the set
``build_questions(world, per_template, seed)`` makes, which is split by patient. Worlds, question sets and instances are
built once per process and key, also when several threads ask at once (SkyRL opens the eight samples of a prompt
together in its env threads): the first builds, the others wait for it (docs/RL.md, section "Datasets").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from .._defaults import RL_QA_PER_TEMPLATE
from ..tasks import QA, TRACKS, Instance, TaskInfeasible, TaskWorld, get_track, make_instance, select
from ..tasks.qa import QaFamily, QaQuestion, build_questions, qa_instance
from ..world import DEFAULT_PATIENTS, DEFAULT_SEED, world_file, world_sha256
from ._reward import RewardSpec
from ._text import TEXT_BUDGET, TextEpisode

#: Seeds of each split (per family): disjoint ranges.
SPLITS = {"train": range(0, 10_000), "valid": range(10_000, 11_000), "test": range(11_000, 12_000)}
ENV_CLASSES = {t.name: t.env_class for t in TRACKS.values()}
DEFAULT_WORLD = {"seed": DEFAULT_SEED, "patients": DEFAULT_PATIENTS}
#: The QA question set rows name by default: ``build_questions(world, per_template, seed)``.
DEFAULT_QA = {"per_template": RL_QA_PER_TEMPLATE, "seed": 0}

_INSTANCES: OrderedDict[tuple, Instance] = OrderedDict()
_WORLDS: dict[tuple, TaskWorld] = {}
_QUESTIONS: dict[tuple, dict[str, QaQuestion]] = {}
_LOCK = threading.Lock()  # guards the caches and _BUILDERS, never held while building
_BUILDERS: dict[tuple, list] = {}  # key -> [its lock, threads holding or waiting for it]
_CACHED = 256


@contextmanager
def _one_builder(key: tuple) -> Iterator[None]:
    """Hold ``key``'s own lock: threads building the same thing queue behind the first (which caches it)."""
    with _LOCK:
        entry = _BUILDERS.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _LOCK:
            entry[1] -= 1
            if not entry[1]:
                del _BUILDERS[key]


def world_of(spec: dict | None) -> TaskWorld:
    """The TaskWorld a row names (``{"seed", "patients"}`` or ``{"path"}``), built and cached on first use."""
    spec = spec or DEFAULT_WORLD
    key = ("path", str(spec["path"])) if spec.get("path") else ("built", int(spec["seed"]), int(spec["patients"]))
    if key in _WORLDS:
        return _WORLDS[key]
    with _one_builder(("world", *key)):
        if key not in _WORLDS:
            _WORLDS[key] = TaskWorld.open(world_file(spec.get("path") or None, seed=int(spec.get("seed", DEFAULT_SEED)),
                                                     patients=int(spec.get("patients", DEFAULT_PATIENTS))))
        return _WORLDS[key]


def qa_questions(world: TaskWorld, qa: dict | None = None) -> dict[str, QaQuestion]:
    """The question set ``qa`` (``{"per_template", "seed"}``) names on ``world``, by id; built once per process."""
    qa = qa or DEFAULT_QA
    key = (str(world.path), int(qa["per_template"]), int(qa["seed"]))
    if key in _QUESTIONS:
        return _QUESTIONS[key]
    with _one_builder(("qa", *key)):
        if key not in _QUESTIONS:
            _QUESTIONS[key] = {q.id: q for q in build_questions(world, key[1], key[2])}
        return _QUESTIONS[key]


def instance_for(extra: dict) -> Instance:
    """The instance a row's ``extra_info`` names; the last few hundred are kept, so a reset stays cheap."""
    track = get_track(extra.get("track", "action"))
    world = world_of(extra.get("world"))
    ident = extra[track.ident] if track.by_question else int(extra[track.ident])
    key = (str(world.path), track.name, extra["task_id"], ident)
    with _LOCK:
        if key in _INSTANCES:
            _INSTANCES.move_to_end(key)
            return _INSTANCES[key]
    with _one_builder(("instance", *key)):
        with _LOCK:
            if key in _INSTANCES:  # built by the thread this one waited for
                return _INSTANCES[key]
        inst = _BUILD[track.name](extra, world, ident)
        with _LOCK:
            _INSTANCES[key] = inst
            while len(_INSTANCES) > _CACHED:
                _INSTANCES.popitem(last=False)
    return inst


def _question_instance(extra: dict, world: TaskWorld, question_id: str) -> Instance:
    question = qa_questions(world, extra.get("qa")).get(question_id)
    if question is None:
        raise ValueError(f"no QA question {question_id!r} in the set {extra.get('qa') or DEFAULT_QA} of "
                         f"world {world.path}")
    return qa_instance(question, world)


#: How a row's instance is built, per track.
_BUILD = {"action": lambda extra, world, seed: make_instance(extra["task_id"], seed, world),
          "qa": _question_instance}


def row_config(extra: dict, config: str | None = None) -> str:
    """The configuration an episode of this row runs with: the row's (what its prompt lists), else
    ``config``, else baseline. A ``config`` that contradicts the row is refused: the model would be shown
    one set of tools and given another."""
    named = extra.get("config")
    if config and named and config != named:
        raise ValueError(f"the row's prompt was written for configuration {named!r}, not {config!r}: "
                         f"rebuild the dataset with --config {config} or run it with {named!r}")
    return config or named or "baseline"


def episode_for(extra: dict, config: str | None = None, reward: RewardSpec | None = None) -> TextEpisode:
    """The text episode a row's ``extra_info`` stands for (configuration, turns, output budget, worked
    example as the row says): every adapter and the evaluation open a row this one way."""
    return TextEpisode(instance_for(extra), row_config(extra, config), max_turns=int(extra.get("max_turns") or 12),
                       budget=int(extra.get("budget") or TEXT_BUDGET), reward=reward,
                       example=bool(extra.get("example")))


def _prompt(inst: Instance, max_turns: int, config: str, example: bool) -> list[dict]:
    text = TextEpisode(inst, config, max_turns=max_turns, example=example)
    try:
        return text.reset()
    finally:
        text.close()


def dataset_rows(track: str = "action", split: str = "train", *, tasks: str = "all", per_family: int = 8,
                 world: dict | None = None, max_turns: int = 12, qa: dict | None = None,
                 config: str = "baseline", example: bool = False) -> list[dict[str, Any]]:
    """Rows for ``per_family`` instances of every selected family, from the split's seed range; QA:
    ``per_family`` questions of every selected template (``qa.<template>`` ids or globs) from the split.
    ``example``: prompts carry the worked example (:class:`TextEpisode`); the row says so, so every
    adapter that rebuilds the episode opens it the same way."""
    tr = get_track(track)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use {', '.join(SPLITS)}")
    world = world or DEFAULT_WORLD
    tw = world_of(world)
    sha = world_sha256(tw.path)
    if tr.by_question:
        return _qa_rows(tw, {**world, "sha256": sha}, split, tasks, per_family, max_turns, qa or DEFAULT_QA, config,
                        example)
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
            prompt = _prompt(inst, max_turns, config, example)
            rows.append({"data_source": f"fhirgym/{track}", "prompt": prompt, "env_class": tr.env_class,
                         "reward_spec": {"method": "rule", "ground_truth": None},
                         "extra_info": {"track": track, "task_id": fam.id, "seed": seed, "split": split,
                                        "category": fam.category, "difficulty": fam.difficulty,
                                        "writes": inst.writes, "world": {**world, "sha256": sha},
                                        "max_turns": max_turns, "example": example, "config": config}})
            taken += 1
    return rows


def split_questions(tw: TaskWorld, split: str, tasks: str, per_template: int,
                    qa: dict | None = None) -> list[tuple[QaFamily, QaQuestion]]:
    """The first ``per_template`` questions of the split for every template ``tasks`` selects (``qa.<id>``
    ids or globs; all/default: every template), with their template's family."""
    by_template: dict[str, list[QaQuestion]] = {}
    for q in qa_questions(tw, qa).values():
        if q.split == split:
            by_template.setdefault(q.template, []).append(q)
    templates = [QaFamily(qs[0]) for qs in by_template.values()]
    try:
        fams = select("all" if tasks in ("all", "default") else tasks, among=templates)
    except KeyError:
        fams = []
    if not fams:
        raise ValueError(f"--tasks {tasks!r} selects no QA template; see `fhirgym qa templates`")
    return [(fam, q) for fam in fams for q in by_template[fam.id[3:]][:per_template]]


def _qa_rows(tw: TaskWorld, world: dict, split: str, tasks: str, per_template: int, max_turns: int,
             qa: dict, config: str, example: bool) -> list[dict[str, Any]]:
    rows = []
    for fam, q in split_questions(tw, split, tasks, per_template, qa):
        prompt = _prompt(qa_instance(q, tw), max_turns, config, example)
        rows.append({"data_source": "fhirgym/qa", "prompt": prompt, "env_class": QA.env_class,
                     "reward_spec": {"method": "rule", "ground_truth": None},
                     "extra_info": {"track": "qa", "task_id": fam.id, "question_id": q.id, "seed": q.seed,
                                    "split": split, "patient_id": q.patient_id, "shape": q.shape,
                                    "category": "qa", "difficulty": fam.difficulty, "writes": False,
                                    "world": world, "qa": {"per_template": int(qa["per_template"]),
                                                           "seed": int(qa["seed"])},
                                    "max_turns": max_turns, "example": example, "config": config}})
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
