"""The inspect tasks ``fhirgym/action`` and ``fhirgym/qa``, and the scorer that reads an episode's verdict.

``inspect eval fhirgym/action -T tasks=SELECTOR -T seeds=SPEC -T config=NAME`` runs the instances
``fhirgym eval --tasks SELECTOR --seeds SPEC --config NAME`` runs, one episode per sample; ``-T runs=K``
is K epochs (``--runs K``) reduced to the mean, pass@K and pass^K. The score's value is the strict
verdict (C/I); its metadata carry the light verdict, the nothing-found floor, the reasons and failure
modes, as ``results.jsonl`` does. The verdict is judged on the episode's live store, so a log cannot be
re-scored (``inspect score``) after the sample's episode has closed.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
from inspect_ai import Epochs, Task, task
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, grouped, scorer, stderr
from inspect_ai.solver import TaskState
from inspect_ai.util import SandboxEnvironmentSpec

from .._defaults import DEFAULT_PATIENTS, DEFAULT_SEED, QA_PER_TEMPLATE
from ..agents import default_iterations
from ..env import UnknownConfig, get_config
from ..tools import needs_workspace
from . import _dataset
from ._episodes import handle_of
from ._sandbox import NAME as SANDBOX
from ._solvers import close_episode, default_agent, episode


@scorer(metrics=[accuracy(), stderr(), grouped(accuracy(), "category", all=False),
                 grouped(accuracy(), "difficulty", all=False, name_template="difficulty {group_name}")])
def verdict() -> Scorer:
    """Submit the sample's answer to its episode: C on a strict success, else I."""

    async def score(state: TaskState, target: Target) -> Score:
        handle = handle_of(state.uuid)
        answer = (state.output.completion or "").strip() or None
        judged = await anyio.to_thread.run_sync(handle.submit, answer)
        meta = await anyio.to_thread.run_sync(handle.describe, judged, answer)
        meta["run"] = state.epoch - 1
        return Score(value=CORRECT if meta["success"] else INCORRECT, answer=answer,
                     explanation="; ".join(meta["reasons"]) or "strict success", metadata=meta)

    return score


def _task(src: dict, config: str, runs: int, budget: int | None, max_turns: int | None,
          unsafe_python: bool) -> Task:
    """``max_turns``: the default agent's cap on model turns (0: none); fhirgym's solvers have their own
    (``-S max_iterations``)."""
    try:
        cfg = get_config(config)
    except UnknownConfig as exc:
        raise ValueError(str(exc)) from None
    if cfg.requires:
        raise ValueError(f"configuration {config!r} needs {cfg.requires}, which an inspect task cannot bind")
    if runs < 1:
        raise ValueError("runs must be at least 1")
    # a CodeAct configuration's samples get the bubblewrap sandbox: inspect's bash()/python() run in the
    # episode's own (the python tool's), with its limits
    sandbox = SandboxEnvironmentSpec(SANDBOX) if needs_workspace(cfg.tools) else None
    epochs = Epochs(runs, ["mean", f"pass_at_{runs}", f"pass_k_{runs}"]) if runs > 1 else None
    return Task(dataset=_dataset.samples(src),
                setup=episode(src, config, budget, unsafe_python),
                solver=default_agent(config, max_turns or None), scorer=verdict(), cleanup=close_episode,
                sandbox=sandbox, epochs=epochs, metadata={"fhirgym": {**src, "config": config}})


@task
def action(tasks: str | list[str] = "default", seeds: str | int | list[int] = "1", config: str = "baseline",
           runs: int = 1, world: str | None = None, world_seed: int = DEFAULT_SEED,
           patients: int = DEFAULT_PATIENTS, budget: int | None = None,
           max_turns: int = default_iterations("react"), unsafe_python: bool = False) -> Task:
    """fhirgym's action families (``fhirgym eval``'s selectors and seed grammar)."""
    src = _dataset.source("action", _dataset.world_path(world, world_seed, patients), tasks, seeds)
    return _task(src, config, runs, budget, max_turns, unsafe_python)


@task
def qa(split: str = "valid", tasks: str | list[str] = "all", seeds: str | int | list[int] = "1",
       config: str = "baseline", runs: int = 1, questions: str | None = None,
       per_template: int = QA_PER_TEMPLATE, world: str | None = None, world_seed: int = DEFAULT_SEED,
       patients: int = DEFAULT_PATIENTS, budget: int | None = None, max_turns: int = default_iterations("react"),
       unsafe_python: bool = False) -> Task:
    """fhirgym's QA track (``fhirgym eval --track qa``): ``tasks`` selects templates, seed k is a template's
    k-th question of ``split``."""
    if split not in ("train", "valid", "test"):
        raise ValueError(f"split must be train, valid or test, not {split!r}")
    src = _dataset.source("qa", _dataset.world_path(world, world_seed, patients), tasks, seeds, split=split,
                          questions=questions, per_template=per_template)
    return _task(src, config, runs, budget, max_turns, unsafe_python)
