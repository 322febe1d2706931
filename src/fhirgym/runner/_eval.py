"""Evaluation runs: tasks × seeds × paraphrases × runs of one agent and configuration, into a directory.

``run_eval(EvalSpec(...))`` plans the episodes, skips those already in ``results.jsonl`` when resuming, runs the rest
(``parallel`` at a time, each an :class:`~fhirgym.env.Episode` on its own store forked from the task instance's pre-run
snapshot; in this process, or on Ray with ``ray=``: ``_dispatch.py``, ``_ray.py``) and appends one line per finished
episode (docs/RESULTS.md). A sealed run (``sealed=True``) derives every instance's seed from a secret drawn at the start
(HMAC-SHA256 of ``task_id|seed``): public code plus the public seeds cannot rebuild the gold while the run goes on.
``run.json`` holds only the secret's sha256 until the run ends (normally, by an exception or Ctrl-C), then the secret
itself; ``secret=`` replays or resumes a sealed run.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import orjson

from .._defaults import AGENT, CONFIG, QA_PER_TEMPLATE
from ..agents import DEFAULT_MODEL, MODEL_AGENTS, default_iterations, make_agent, needs_model
from ..env import Config, UnknownConfig, configs, get_config
from ..tasks import ACTION, Instance, TaskWorld, Track, get_family, get_track, select
from ..world import world_sha256
from ._dispatch import EpisodeRunner, Recipe, ResultSink, RunError, ThreadPool
from ._episode import EpisodeKey
from ._results import RESULTS, read_results, write_atomic


class EvalError(RuntimeError):
    """A run that cannot start (bad settings, mismatched resume): printed without a traceback."""


@dataclass
class EvalSpec:
    out: Path
    agent: str = AGENT
    model: str | None = None
    base_url: str | None = None
    tasks: str = "default"
    seeds: list[int] = field(default_factory=lambda: [0])
    runs: int = 1
    config: str = CONFIG
    setting: str = "default"
    parallel: int = 1
    resume: bool = False
    world: Path | None = None
    max_iterations: int | None = None  # the turn cap; None: the agent's own (codeact 12, others 15)
    budget: int | None = None
    unsafe_python: bool = False  # --unsafe-python: the python tool may run without a full sandbox
    paraphrases: int = 0  # 0: template prompts only; k: also the first k cached paraphrases
    paraphrase_ids: list[int] | None = None  # exactly these paraphrases (0 = template) instead of 0..paraphrases
    written_paraphrases: bool = False  # no cached LLM paraphrase: use the phrasing written by us (recorded)
    sealed: bool = False  # instance seeds derived from a secret no agent sees during the run
    track: str = "action"  # action: the task families; qa: questions about one patient (docs/QA.md)
    split: str = "valid"  # qa: the questions' split (train, valid, test)
    questions: Path | None = None  # qa: a question file (fhirgym qa build); default: built from the world
    per_template: int = QA_PER_TEMPLATE  # qa without a question file: questions built per template
    secret: str | None = field(default=None, repr=False)  # a sealed run's secret (hex), to replay or resume it
    ray: str | None = None  # None: episodes run in this process; else on Ray ("": ray.init()'s own choice)
    max_attempts: int | None = None  # an OpenAI(-compatible) model: requests per call at most (None: 8)
    retry_budget: float | None = None  # ... and seconds of waiting between them per call (None: 600)

    def agent_settings(self) -> tuple:
        """What builds the agent, anywhere: ``make_agent(*settings[:4], **settings[4])``."""
        backend = {k: v for k in ("max_attempts", "retry_budget") if (v := getattr(self, k)) is not None}
        if backend and not str(self.model or "").startswith(("openai/", "openai-compatible/")):
            raise EvalError("--max-attempts and --retry-budget are for openai/ and openai-compatible/ models")
        return self.agent, self.model, self.base_url, self.max_iterations, backend

    def __post_init__(self) -> None:
        if self.max_iterations is None:
            self.max_iterations = default_iterations(self.agent)

    def identity(self) -> dict:
        """What must match for ``--resume`` to append to an existing directory."""
        out = {k: v for k, v in asdict(self).items() if k in ("agent", "model", "config", "setting", "budget",
                                                               "max_iterations")}
        track = track_of(self)
        if track is not ACTION:  # the default track's runs never recorded theirs
            out.update(track=track.name, **({"split": self.split} if track.by_question else {}))
        if self.sealed and self.secret:
            out["secret_sha256"] = _commitment(self.secret)
        return out


def _commitment(secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(secret)).hexdigest()


def instance_seed(spec: EvalSpec, task_id: str, seed: int) -> int:
    """The seed an instance is built from: the public one, or in a sealed run one derived from the secret."""
    if not spec.sealed:
        return seed
    assert spec.secret is not None
    digest = hmac.new(bytes.fromhex(spec.secret), f"{task_id}|{seed}".encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:6], "big")


def track_of(spec: EvalSpec) -> Track:
    """The spec's :class:`~fhirgym.tasks.Track` (a clear error for an unknown name)."""
    try:
        return get_track(spec.track)
    except ValueError as exc:
        raise EvalError(f"--track: {exc}") from None


def plan(spec: EvalSpec, world: TaskWorld | None = None) -> list[EpisodeKey]:
    """The episodes of a run. QA: ``--tasks`` selects templates (``qa.<template>`` ids or globs, ``all``),
    and seed k is the k-th question of a template in the split."""
    if not spec.seeds or spec.runs < 1:
        raise EvalError("no seeds or no runs: nothing to evaluate (one seed is --seeds 1, seed 0)")
    return (_question_keys if track_of(spec).by_question else _family_keys)(spec, world)


def _question_keys(spec: EvalSpec, world: TaskWorld | None) -> list[EpisodeKey]:
    if world is None:
        raise EvalError("the QA track needs the world its questions come from")
    from ..tasks.qa import QaFamily

    by_template = qa_questions(spec, world)
    templates = [QaFamily(qs[0]) for qs in by_template.values()]
    try:  # the task selector's grammar over the templates; "default" is every template
        fams = select("all" if spec.tasks == "default" else spec.tasks, among=templates)
    except KeyError:  # a term that matches no template
        fams = []
    if not fams:
        raise EvalError(f"--tasks {spec.tasks!r} selects no QA template; see `fhirgym qa templates`")
    return [EpisodeKey(spec.config, f.id, seed, 0, run) for f in fams for seed in spec.seeds
            if seed < len(by_template[f.id[3:]]) for run in range(spec.runs)]


def _family_keys(spec: EvalSpec, world: TaskWorld | None) -> list[EpisodeKey]:
    try:
        fams = select(spec.tasks)
    except KeyError as exc:  # a term that matches no family: the selector's own message
        raise EvalError(f"--tasks: {exc.args[0]}") from None
    if not fams:
        raise EvalError(f"--tasks {spec.tasks!r} selects no task")
    ps = spec.paraphrase_ids if spec.paraphrase_ids is not None else range(spec.paraphrases + 1)
    return [EpisodeKey(spec.config, f.id, seed, p, run) for f in fams for seed in spec.seeds
            for p in ps for run in range(spec.runs)]


_QUESTIONS: dict[tuple, dict[str, list]] = {}


def qa_questions(spec: EvalSpec, world: TaskWorld) -> dict[str, list]:
    """The split's questions by template, in file (or build) order; built ones are cached per world."""
    key = (str(spec.questions or world.path), spec.split, spec.per_template)
    if key not in _QUESTIONS:
        from ..tasks.qa import build_questions, read_questions

        every = read_questions(spec.questions) if spec.questions else build_questions(world, spec.per_template)
        by: dict[str, list] = {}
        for q in every:
            if q.split == spec.split:
                by.setdefault(q.template, []).append(q)
        _QUESTIONS[key] = by
    return _QUESTIONS[key]


def instance_for(spec: EvalSpec, world: TaskWorld, key: EpisodeKey) -> Instance:
    """The task instance an episode of ``plan(spec)`` runs on (its reference solution computed with it):
    ``recipe(spec, key, world)`` built, the one home of key → instance for every runner of episodes."""
    return recipe(spec, key, world).build(world)


def _seal(spec: EvalSpec) -> None:
    if spec.secret is not None:
        spec.sealed = True
        try:
            if len(bytes.fromhex(spec.secret)) < 16:
                raise ValueError
        except ValueError:
            raise EvalError("--secret must be the hex secret a sealed run recorded in run.json") from None
    elif spec.sealed:
        if spec.resume and (spec.out / "run.json").exists():
            raise EvalError(f"resuming the sealed run in {spec.out} needs its secret: pass --secret (from "
                            "run.json's 'sealed.secret')")
        spec.secret = secrets.token_hex(16)
    if spec.sealed and not track_of(spec).seeded:
        raise EvalError("--sealed derives the action track's instance seeds; QA questions come from their file")
    if spec.sealed and (spec.paraphrases or any(spec.paraphrase_ids or [])):
        raise EvalError("a sealed run cannot use cached paraphrases (they are written for the public seeds)")


def _reveal(spec: EvalSpec) -> None:
    """Write the secret of a sealed run into run.json, once the run has ended."""
    run_file = spec.out / "run.json"
    info = orjson.loads(run_file.read_bytes())
    info["sealed"] = {"secret_sha256": _commitment(spec.secret or ""), "secret": spec.secret,
                      "revealed": datetime.now(UTC).isoformat(timespec="seconds"),
                      "replay": f"fhirgym eval ... --secret {spec.secret}"}
    write_atomic(run_file, info)


def task_versions(spec: EvalSpec, keys: list[EpisodeKey]) -> dict[str, int]:
    """The version of every family a run plans (a QA template: the question family's), by id."""
    if track_of(spec).by_question:
        from ..tasks.qa import QaFamily

        return {k.task_id: QaFamily.version for k in keys}
    return {k.task_id: get_family(k.task_id).version for k in keys}


def _prepare_dir(spec: EvalSpec, world: TaskWorld, config: Config, keys: list[EpisodeKey]) -> set[str]:
    out = spec.out
    out.mkdir(parents=True, exist_ok=True)
    run_file = out / "run.json"
    existing = read_results(out, repair=spec.resume)
    if existing and not spec.resume:
        raise EvalError(f"{out} already holds {len(existing)} results: pass --resume to continue, or another --out")
    identity = {**spec.identity(), **({"memory": config.labels["memory"]} if config.labels.get("memory") else {})}
    if run_file.exists() and spec.resume:
        started = orjson.loads(run_file.read_bytes())
        before = started.get("identity", {})
        if before and before != identity:
            diff = {k: (before.get(k), v) for k, v in identity.items() if before.get(k) != v}
            raise EvalError(f"--resume into {out} with different settings {diff}: use another --out")
        recorded = started.get("task_versions", {})
        changed = {t: (recorded[t], v) for t, v in task_versions(spec, keys).items() if recorded.get(t, v) != v}
        if changed:
            raise EvalError(f"--resume into {out}: these families changed version since it started {changed} "
                            "(results of two versions are not comparable): use another --out")
    if not run_file.exists() or not spec.resume:
        info = {"identity": identity, "labels": dict(config.labels), "spec": {k: str(v) if isinstance(v, Path) else v
                                                      for k, v in asdict(spec).items() if k != "secret"},
                "fhirgym_version": version("fhirgym"), "world": str(world.path),
                "world_manifest": world.manifest, "world_sha256": world_sha256(world.path),
                "task_versions": task_versions(spec, keys), "started": datetime.now(UTC).isoformat(timespec="seconds")}
        write_atomic(run_file, info)
    return {line["episode_id"] for line in existing}


def run_eval(spec: EvalSpec, world: TaskWorld, progress: Callable[[dict, int, int], None] | None = None,
             agent=None, config: Config | None = None, log: Callable[[str], None] | None = None) -> list[dict]:
    """Run (or resume) the evaluation; returns every result line of the directory.

    ``agent``: an agent object to use instead of building one from ``spec.agent`` (tests, notebooks; on
    Ray it is pickled to the workers). ``config``: the configuration object to use for ``spec.config``
    instead of the registered one (an experiment binds a memory configuration to a different memory per
    setting, side by side). ``log``: where notes on the run's execution go (Ray's workers, retries)."""
    try:
        config = config or get_config(spec.config)
    except UnknownConfig as exc:
        raise EvalError(f"unknown --config {spec.config!r}; known: {', '.join(configs())}") from exc
    if config.requires:
        raise EvalError(f"configuration {config.name!r} needs {config.requires}")
    keys = plan(spec, world)
    _seal(spec)
    done = _prepare_dir(spec, world, config, keys)
    try:
        return _run(spec, world, config, keys, done, progress, agent, log)
    finally:
        if spec.sealed:
            _reveal(spec)


def recipe(spec: EvalSpec, key: EpisodeKey, world: TaskWorld) -> Recipe:
    """What builds the instance of episode ``key`` (a sealed run's seeds are derived here, on the driver)."""
    if track_of(spec).by_question:
        return Recipe(key.task_id, key.seed, question=qa_questions(spec, world)[key.task_id[3:]][key.seed])
    return Recipe(key.task_id, instance_seed(spec, key.task_id, key.seed), key.paraphrase, spec.written_paraphrases)


def run_label(spec: EvalSpec) -> str | None:
    """The ``model`` field of the run's result lines."""
    model = spec.model if needs_model(spec.agent) else None
    if model is None and spec.agent in MODEL_AGENTS:
        model = DEFAULT_MODEL
    return model


def episode_pool(world: TaskWorld, agent, config: Config, *, parallel: int = 1, ray: str | None = None,
                 options: dict | None = None, log: Callable[[str], None] | None = None):
    """Where episodes run: ``parallel`` threads of this process, or, with ``ray`` (an address; "": ray.init()'s
    own choice), the workers of a Ray cluster. ``agent``: an agent object, or its settings (agent, model,
    base_url, max_iterations[, backend options]), which Ray workers build it from. ``options``: :class:`EpisodeRunner`'s.
    ``pool.submit(key, recipe, config=None, then=None)`` gives a Future of (line, transcript);
    ``pool.stream(work, then)`` the outcomes of (key, recipe) pairs as they finish."""
    if ray is not None:
        try:
            from ._ray import RayPool
        except ImportError as exc:
            raise EvalError(str(exc)) from None
        return RayPool(world, agent, config, parallel=parallel, address=ray, options=options, log=log)
    if isinstance(agent, tuple):
        agent = make_agent(*agent[:4], **(agent[4] if len(agent) > 4 else {}))
    return ThreadPool(EpisodeRunner(world, agent, config, capacity=2 * parallel + 16, **(options or {})), parallel)


def _run(spec: EvalSpec, world: TaskWorld, config, keys: list[EpisodeKey], done: set[str],
         progress: Callable[[dict, int, int], None] | None, agent, log) -> list[dict]:
    todo = [k for k in keys if k.id not in done]
    sink = ResultSink(spec.out, done)
    work = [(k, recipe(spec, k, world)) for k in todo]
    options = {"setting": spec.setting, "model": run_label(spec), "budget": spec.budget,
               "max_iterations": spec.max_iterations, "unsafe_python": spec.unsafe_python}
    try:
        agent = agent if agent is not None else spec.agent_settings()
        with episode_pool(world, agent, config, parallel=spec.parallel, ray=spec.ray, options=options,
                          log=log) as pool:
            for finished, (line, _) in enumerate(pool.stream(work, sink.write), 1):
                if progress:
                    progress(line, finished, len(todo))
    except RunError as exc:  # the open-files limit; the cluster: no traceback, what to do
        raise EvalError(str(exc)) from exc
    return read_results(spec.out)


def summary(results: list[dict]) -> str:
    """The table printed at the end of ``fhirgym eval``: success by category and difficulty, errors, the
    nothing-found floor on the same instances, tokens."""
    def row(label: str, group: list[dict]) -> str:
        scored = [r for r in group if r["status"] != "error"]
        ok = sum(bool(r["success"]) for r in scored)
        writes = [r for r in scored if r.get("light_success") is not None]
        light = f"{100 * sum(r['light_success'] for r in writes) / len(writes):5.1f}" if writes else "    -"
        tokens = sum(r["tokens"]["prompt"] + r["tokens"]["completion"] for r in group) / max(1, len(group))
        errors = len(group) - len(scored)
        rate = f"{100 * ok / len(scored):5.1f}" if scored else "    -"
        floors = []
        for name in ("floor_nothing_found", "floor_guess"):
            known = [r[name] for r in scored if r.get(name) is not None]
            floors.append(f"{100 * sum(known) / len(known):5.1f} %" if known else "    - %")
        return f"{label:28} {len(group):5} {rate} % {light} % {errors:6} {floors[0]} {floors[1]} {tokens:9.0f}"

    head = (f"{'':28} {'n':>5} {'strict':>7} {'light':>7} {'errors':>6} {'floor':>7} {'guess':>7} {'tokens/ep':>9}"
            "   (floors on the same instances: the constant nothing-found reply, the one-search guess)")
    lines = [head, "-" * len(head)]
    for cat in sorted({r["category"] for r in results}):
        lines.append(row(cat, [r for r in results if r["category"] == cat]))
    lines.append("-" * len(head))
    for d in sorted({r["difficulty"] for r in results}):
        lines.append(row(f"difficulty {d}", [r for r in results if r["difficulty"] == d]))
    lines.append("-" * len(head))
    lines.append(row("all", results))
    return "\n".join(lines)


def progress_line(line: dict, finished: int, total: int, started: float, counts: dict[str, int]) -> str:
    counts[line["status"]] = counts.get(line["status"], 0) + 1
    elapsed = time.perf_counter() - started
    eta = elapsed / finished * (total - finished) if finished else 0
    width = 24
    filled = int(width * finished / max(1, total))
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {finished}/{total}  pass {counts.get('pass', 0)} "
            f"fail {counts.get('fail', 0)} error {counts.get('error', 0)}  "
            f"{elapsed:5.0f}s elapsed, ~{eta:4.0f}s left  {line['task_id'][:40]:40}")


__all__ = ["RESULTS", "EvalError", "EvalSpec", "episode_pool", "instance_for", "instance_seed", "plan", "progress_line",
           "recipe", "run_eval", "summary"]
