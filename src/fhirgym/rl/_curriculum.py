"""Curricula that cannot be gamed: rows the start policy sometimes solves, on which no constant reply pays.

GRPO learns only from groups whose rewards differ, so a family the start policy never (or always) solves
gives it flat groups; and where a constant reply earns as much as the policy, the cheapest way up is the
constant (the last CPU run learned to reply "no answer" to everything). :func:`measure_curriculum` runs
the start policy on train rows with the very loop training samples with, keeps the families whose pass
rate lies in [``low``, ``high``], and measures the constant replies of :data:`CONSTANTS` on the kept rows;
:func:`check_curriculum` is the refusal ``rl train --curriculum`` applies (docs/RL.md, "Curricula that
cannot be gamed").
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ..agents import AgentTask, GuessAgent
from ..tasks import get_track
from ._data import DEFAULT_QA, DEFAULT_WORLD, dataset_rows, episode_for

VERSION = 1
#: The constant replies whose rewards are a curriculum's floors (per track: the negative reply's name).
CONSTANTS = ("nothing-found", "nothing-found after a look", "guess")


class ShortcutCurriculum(ValueError):
    """A curriculum on which a constant reply pays at least what the start policy earns."""


@dataclass
class CurriculumSpec:
    """What to measure: the start ``model`` on ``per_family`` train rows per family × ``episodes`` each."""

    model: str
    track: str = "action"
    tasks: str = "all"
    per_family: int = 4
    episodes: int = 4
    low: float = 0.2
    high: float = 0.8
    world: dict = field(default_factory=lambda: dict(DEFAULT_WORLD))
    qa: dict = field(default_factory=lambda: dict(DEFAULT_QA))
    config: str = "baseline"
    example: bool = False
    max_turns: int = 12
    max_new_tokens: int = 2048  # the whole completion, tool results included (as in training)
    temperature: float = 1.0
    seed: int = 0
    threads: int | None = None
    n_ctx: int = 8192


def constant_names(track: str) -> tuple[str, ...]:
    """:data:`CONSTANTS` as the track names them (QA's negative reply is "no answer")."""
    return get_track(track).floor_names(CONSTANTS)


def constant_reward(extra: dict, name: str, config: str = "baseline") -> float:
    """What the constant reply ``name`` (:data:`CONSTANTS`) earns on the row ``extra``: the episode's reward
    (the current validator's verdict through :class:`~fhirgym.rl.RewardSpec`), as a policy would get it."""
    text = episode_for(extra, config)
    try:
        text.reset()
        inst = text.episode.instance
        track = get_track(extra.get("track", "action"))
        negative = track.negative
        kind = name.replace(track.negative_name, "nothing-found")
        if kind == "nothing-found":
            return text.step(negative).reward
        if kind == "nothing-found after a look":
            look = {"name": "searchResources",
                    "arguments": {"resourceType": inst.evidence_types[0], "params": {"_count": "1"}}}
            first = text.step("<tool_call>\n" + orjson.dumps(look).decode() + "\n</tool_call>")
            return first.reward if first.done else text.step(negative).reward
        if kind == "guess":
            result = GuessAgent().run(AgentTask(inst.prompt, inst.now, text.episode.tools))
            return text.finish(result.final_answer).reward
        raise ValueError(f"unknown constant reply {name!r}: one of {', '.join(CONSTANTS)}")
    finally:
        text.close()


def measure_curriculum(spec: CurriculumSpec, out: Path,
                       progress: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Measure and write the curriculum (see the module docstring); returns what was written."""
    from ._rollout import LlamaRollouts, rollout_base

    t0 = time.perf_counter()
    if not 0 <= spec.low <= spec.high <= 1:
        raise ValueError(f"pass-rate band [{spec.low}, {spec.high}]: needs 0 <= low <= high <= 1")
    if spec.episodes < 1 or spec.per_family < 1:
        raise ValueError("--episodes and --per-family must be at least 1")
    base = rollout_base(spec.model)
    if base is None:
        raise ValueError(f"{spec.model!r} has no GGUF base for llama.cpp (a local model name, a .gguf path or a "
                         "LoRA checkpoint of one)")
    rows = dataset_rows(spec.track, "train", tasks=spec.tasks, per_family=spec.per_family, world=spec.world,
                        max_turns=spec.max_turns, qa=spec.qa, config=spec.config, example=spec.example)
    if not rows:
        raise ValueError(f"--tasks {spec.tasks!r} gives no training rows on the {spec.track} track")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        engine = LlamaRollouts(base, config=spec.config, seed=spec.seed, n_ctx=spec.n_ctx, threads=spec.threads)
        if Path(spec.model).is_dir():  # a LoRA checkpoint: its adapter on the base, as training starts from it
            from ._export import write_lora_gguf

            engine.use_adapter(write_lora_gguf(Path(spec.model), Path(work) / "start.gguf", base_gguf=engine.base))
        by_family = _start_policy(engine, rows, spec, progress)
        engine.use_adapter(None)
    families = {task: _family_figures(eps, spec) for task, eps in by_family.items()}
    kept = [task for task, fig in families.items() if fig["kept"]]
    kept_rows = [row for row in rows if row["extra_info"]["task_id"] in kept]
    start = statistics.fmean(e["reward"] for task in kept for e in by_family[task]) if kept else None
    floors = {name: statistics.fmean(constant_reward(row["extra_info"], name, spec.config) for row in kept_rows)
              for name in constant_names(spec.track)} if kept_rows else {}
    cur = {"version": VERSION, "spec": {k: v for k, v in asdict(spec).items() if k not in ("threads", "n_ctx")},
           "families": families, "kept": kept, "rows": [_row_id(r) for r in kept_rows],
           "start_mean_reward": start, "floors": floors, "seconds": round(time.perf_counter() - t0, 1)}
    cur["refused"] = refusal(cur, str(out))
    out.write_text(json.dumps(cur, indent=1))
    return cur


def _start_policy(engine: Any, rows: list[dict], spec: CurriculumSpec,
                  progress: Callable[[str, dict], None] | None) -> dict[str, list[dict]]:
    """The start policy's episodes on every row, by family (``progress`` told as each family is done)."""
    by_family: dict[str, list[dict]] = {}
    for r, row in enumerate(rows):
        task = row["extra_info"]["task_id"]
        for e in range(spec.episodes):
            seed = int(np.random.SeedSequence([spec.seed, r, e]).generate_state(1)[0])
            done = engine.episode(row["extra_info"], seed=seed, max_completion=spec.max_new_tokens,
                                  temperature=spec.temperature)
            by_family.setdefault(task, []).append({"row": r, "reward": done.reward,
                                                   "success": bool(done.info.get("success"))})
        if progress and (r + 1 == len(rows) or rows[r + 1]["extra_info"]["task_id"] != task):
            progress(task, _family_figures(by_family[task], spec))
    return by_family


def _family_figures(episodes: list[dict], spec: CurriculumSpec) -> dict[str, Any]:
    rate = statistics.fmean(e["success"] for e in episodes)
    return {"rows": len({e["row"] for e in episodes}), "episodes": len(episodes),
            "passes": sum(e["success"] for e in episodes), "pass_rate": rate,
            "mean_reward": statistics.fmean(e["reward"] for e in episodes),
            "kept": spec.low <= rate <= spec.high}


def _row_id(row: dict) -> dict:
    extra = row["extra_info"]
    return {"task_id": extra["task_id"], "seed": extra.get("seed"), "question_id": extra.get("question_id")}


def _id_set(ids) -> set[str]:
    return {json.dumps(i, sort_keys=True) for i in ids}


def load_curriculum(path: str | Path) -> dict[str, Any]:
    """A curriculum file of :func:`measure_curriculum` (its version and fields checked)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no curriculum file at {path}")
    try:
        cur = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"curriculum {path}: not JSON ({exc})") from None
    missing = {"version", "spec", "kept", "rows", "start_mean_reward", "floors"} - set(cur)
    if missing or cur["version"] != VERSION:
        raise ValueError(f"curriculum {path}: not a curriculum of `fhirgym rl curriculum` (version {VERSION}"
                         + (f"; missing {', '.join(sorted(missing))}" if missing else "") + ")")
    return cur


def refusal(cur: dict[str, Any], name: str = "the curriculum") -> str | None:
    """Why ``rl train`` must not train on ``cur`` (None: it may)."""
    spec, start = cur["spec"], cur["start_mean_reward"]
    if not cur["kept"] or start is None:
        return (f"curriculum {name}: no family of {spec['tasks']!r} has a start pass rate in "
                f"[{spec['low']:.0%}, {spec['high']:.0%}] ({spec['model']}), so there is nothing GRPO can learn from")
    reply = max(cur["floors"], key=cur["floors"].get)  # the best-paid constant
    floor = cur["floors"][reply]
    if floor >= start:
        return (f"curriculum {name}: the constant reply \"{reply}\" earns {floor:.3f} on its {len(cur['rows'])} rows, "
                f"at least the start policy's mean reward {start:.3f} ({spec['model']}, {spec['episodes']} "
                f"episode{'s' if spec['episodes'] != 1 else ''} per row): GRPO would be paid for the shortcut. "
                "Choose other families (--tasks) or a better-placed start model.")
    return None


def check_curriculum(cur: dict[str, Any], model: str, name: str = "the curriculum") -> None:
    """Raise :class:`ShortcutCurriculum` where ``rl train`` must refuse ``cur`` for ``model``."""
    why = refusal(cur, name)
    if why:
        raise ShortcutCurriculum(why)
    if cur["spec"]["model"] != model:
        raise ShortcutCurriculum(f"curriculum {name} was measured for {cur['spec']['model']!r}, not {model!r}: its "
                                 "pass rates and floors are that model's (measure it for this one)")


def curriculum_rows(cur: dict[str, Any]) -> list[dict]:
    """The kept rows, rebuilt (rows are deterministic) and checked against the file's list."""
    spec = cur["spec"]
    rows = dataset_rows(spec["track"], "train", tasks=",".join(cur["kept"]), per_family=spec["per_family"],
                        world=spec["world"], max_turns=spec["max_turns"], qa=spec["qa"], config=spec["config"],
                        example=spec["example"])
    if _id_set(map(_row_id, rows)) != _id_set(cur["rows"]):
        raise ValueError("the curriculum's rows no longer rebuild as they were measured (another world, task "
                         "library or question set?): measure it again")
    return rows
