"""``fhirgym experiment run PLAN.toml --out DIR``: the paper's matrix in one command.

models × configs × settings × runs. Each memory a cell needs is trained once, into ``DIR/memories/<key>`` where the key
hashes everything that decides it (training inputs, world), so a rerun or another cell reuses it. Every cell is an
ordinary evaluation directory ``DIR/cells/<model>/<setting>/<config>`` run with ``resume``: a killed experiment (kill -9
included) rerun with the same command skips every finished episode and every logged training run, and reaches the same
results. ``DIR/report.md`` (and ``report.json``) opens with what the plan was expected to cost and what its comparisons
could detect (:func:`estimate`, kept in ``DIR/estimate.json``; the same figures ``--dry-run`` prints) beside what the
run measured, then Figure 5a (success ± sd over runs per config × setting), paired tests against the baseline, token
figures and the training cost (docs/MEMORY.md, section "The experiment").
"""

from __future__ import annotations

import hashlib
import re
import statistics
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..analysis import compute_metrics, render_estimate
from ..runner import EvalSpec, read_results, run_eval
from ..tasks import TaskWorld, make_instance, offline_paraphrase, render
from ..world import world_sha256
from ._estimate import EstimateError, FigureTable, estimate_plan
from ._serve import MEMORY_CONFIGS, MODES, bound_config
from ._settings import SETTINGS, SettingError, plan_setting
from ._train import SUMMARY, TrainSpec, train_memory

CONFIGS = ("baseline", "specs", "memory", "memory-specs", "memory-specs+specs")
ESTIMATE = "estimate.json"
#: Mean tokens per episode the paper reports for GPT-4.1-mini (the FHIR-AgentEval paper): the reference column.
PAPER_TOKENS = {"baseline": "6.1k", "memory": "≈23k", "memory-specs+specs": "≈51k"}


class ExperimentError(ValueError):
    pass


@dataclass
class Plan:
    name: str
    models: list[str]
    configs: list[str] = field(default_factory=lambda: list(CONFIGS))
    settings: list[str] = field(default_factory=lambda: list(SETTINGS))
    runs: int = 3
    tasks: str = "default"
    trials: int = 2
    agent: str = "react"
    evaluator: str | None = None
    reflector: str | None = None
    base_url: str | None = None
    memory_mode: str = "tools"
    parallel: int = 1
    max_iterations: int = 15
    budget: int | None = None
    seeds: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # setting → {"train": [...], "eval": [...]}
    base_rate: float | None = None  # the baseline success the plan was sized for (its power figures; not a run input)


def load_plan(path: Path) -> Plan:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExperimentError(f"{path}: {exc}") from None
    known = set(Plan.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ExperimentError(f"{path}: unknown keys {unknown}; known: {sorted(known)}")
    if not data.get("models"):
        raise ExperimentError(f"{path}: 'models' must list at least one model")
    plan = Plan(**{"name": Path(path).stem, **data})
    bad = [c for c in plan.configs if c not in CONFIGS]
    if bad:
        raise ExperimentError(f"{path}: unknown configs {bad}; known: {', '.join(CONFIGS)}")
    bad = [s for s in plan.settings if s not in SETTINGS]
    if bad:
        raise ExperimentError(f"{path}: unknown settings {bad}; known: {', '.join(SETTINGS)}")
    if plan.memory_mode not in MODES:
        raise ExperimentError(f"{path}: memory_mode must be one of {', '.join(MODES)}")
    if plan.base_rate is not None and (isinstance(plan.base_rate, bool) or not isinstance(plan.base_rate, int | float)
                                       or not 0 <= plan.base_rate < 1):
        raise ExperimentError(f"{path}: base_rate must be a number from 0 to below 1 (a success rate)")
    for setting in plan.settings:  # refuse a plan whose train and eval instances overlap before running
        try:
            _setting(plan, setting)
        except SettingError as exc:
            raise ExperimentError(f"{path}: {exc}") from None
    return plan


def _setting(plan: Plan, setting: str):
    seeds = plan.seeds.get(setting, {})
    return plan_setting(setting, plan.tasks, seeds.get("train"), seeds.get("eval"))


def estimate(plan: Plan, *, figures: FigureTable | None = None, prices: dict | None = None,
             base_rate: float | None = None, world: TaskWorld | None = None) -> dict:
    """What ``plan`` will cost and what its paired comparisons can detect (docs/MEMORY.md, "Before a run").
    With the ``world`` it will run on, the evaluation instances are also drawn, to count the distinct ones
    and those that repeat a training instance of their setting."""
    settings = {s: _setting(plan, s) for s in plan.settings}
    try:
        return estimate_plan(plan, settings, figures=figures, prices=prices, base_rate=base_rate,
                             instances={s: instance_counts(sp, world) for s, sp in settings.items()} if world else None)
    except EstimateError as exc:
        raise ExperimentError(str(exc)) from None


def instance_counts(sp, world: TaskWorld) -> dict:
    """Distinct evaluation instances of a setting (two seeds of a family can draw the same task: same
    prompt and parameters) and how many of them are also a training instance of it (outside ``same``, the
    settings keep training and evaluation apart by seed; in a small world the draws can still coincide)."""
    def identity(task: str, seed: int) -> tuple[str, str, bytes]:
        inst = make_instance(task, seed, world)
        return task, inst.prompt, orjson.dumps(render(inst.params), option=orjson.OPT_SORT_KEYS, default=str)

    evals = {identity(t, s) for t, s in sp.eval_instances()}
    trains = {identity(t, s) for t, s in sp.train_instances()}
    return {"instances": len(sp.eval_instances()), "distinct": len(evals),
            "seen_in_training": len(evals & trains) if sp.name != "same" else 0}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def _memory_key(spec: TrainSpec, world: TaskWorld) -> str:
    blob = orjson.dumps({**spec.inputs(), "world": world_sha256(world.path)}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:16]


def run_experiment(plan: Plan, out: Path, world: TaskWorld, *, log: Callable[[str], None] = print,
                   make_agent: Callable[[str], object] | None = None,
                   make_backend: Callable[[str], object] | None = None, ray: str | None = None,
                   expected: dict | None = None) -> Path:
    """Run (or resume) every cell of ``plan`` into ``out``; returns the report's path.

    ``make_agent(model)`` / ``make_backend(model)``: agent and evaluator/reflector backends to use
    instead of building them from the model strings (tests pass scripted ones). ``ray``: run the
    episodes (training actors and cells) on a Ray cluster (an address; "": ray.init()'s own choice).
    ``expected``: the plan's :func:`estimate`, kept in ``out/estimate.json`` (without it, one with the
    built-in figures and no prices, unless a first run left one)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_bytes(orjson.dumps(plan.__dict__, option=orjson.OPT_INDENT_2))
    if expected is not None or not (out / ESTIMATE).exists():
        (out / ESTIMATE).write_bytes(orjson.dumps(expected or estimate(plan), option=orjson.OPT_INDENT_2))
    memories: dict[tuple[str, str, bool], Path] = {}
    for model in plan.models:
        for setting in plan.settings:
            sp = _setting(plan, setting)
            for with_specs in sorted({MEMORY_CONFIGS[c][0] for c in plan.configs if c in MEMORY_CONFIGS}):
                spec = TrainSpec(out=out, tasks=",".join(sp.train_tasks), seeds=sp.train_seeds, trials=plan.trials,
                                 model=model, evaluator=plan.evaluator, reflector=plan.reflector,
                                 with_specs=with_specs, agent=plan.agent, base_url=plan.base_url,
                                 max_iterations=plan.max_iterations, budget=plan.budget,
                                 paraphrase=sp.train_paraphrase, parallel=plan.parallel, ray=ray)
                spec.out = out / "memories" / _memory_key(spec, world)
                meta = spec.out / "memory.json"
                if not (meta.exists() and orjson.loads(meta.read_bytes()).get("frozen")):
                    log(f"training memory {spec.out.name} ({model}, {setting}, specs={with_specs})")
                    backend = make_backend(spec.evaluator or model) if make_backend else None
                    train_memory(spec, world, actor=make_agent(model) if make_agent else None,
                                 evaluator=backend, reflector=backend, paraphraser=offline_paraphrase)
                memories[(model, setting, with_specs)] = spec.out
            for config in plan.configs:
                cell = out / "cells" / _slug(model) / setting / config
                cfg = None
                if config in MEMORY_CONFIGS:
                    cfg = bound_config(config, memories[(model, setting, MEMORY_CONFIGS[config][0])], plan.memory_mode)
                espec = EvalSpec(out=cell, agent=plan.agent, model=model, base_url=plan.base_url,
                                 tasks=",".join(sp.eval_tasks), seeds=sp.eval_seeds, runs=plan.runs, config=config,
                                 setting=setting, parallel=plan.parallel, resume=True,
                                 max_iterations=plan.max_iterations, budget=plan.budget,
                                 paraphrase_ids=[sp.eval_paraphrase], written_paraphrases=True, ray=ray)
                log(f"evaluating {model} / {setting} / {config}")
                run_eval(espec, world, agent=make_agent(model) if make_agent else None, config=cfg, log=log)
    return write_experiment_report(plan, out)


def _measured_line(expected: dict, out: Path) -> str:
    """What the run has measured so far, beside the estimate's totals."""
    runs = tokens = 0
    minutes = 0.0
    for mem in sorted((out / "memories").glob("*/" + SUMMARY)) if (out / "memories").exists() else []:
        s = orjson.loads(mem.read_bytes())
        runs += s["episodes"]
        tokens += s["actor_tokens"] + s["reflection_tokens"]
        minutes += s["minutes"]
    episodes = 0
    for cell in sorted(out.glob("cells/*/*/*")):
        results = read_results(cell)
        episodes += len(results)
        tokens += sum(_tokens(r) for r in results)
        minutes += sum(float(r.get("duration_s") or 0) for r in results) / 60
    t = expected["total"]
    return (f"**Measured so far**: {runs:,} training runs (estimate: ≤ {t['training_runs']:,}), {episodes:,} "
            f"evaluation episodes (estimate: {t['evaluation_episodes']:,}), {tokens:,} tokens (estimate: "
            f"{t['prompt_tokens'] + t['completion_tokens']:,}), {minutes:.1f} min of training and episode time, summed "
            f"(estimate: {t['minutes']:.1f} min of wall time).\n")


def _tokens(r: dict) -> int:
    t = r.get("tokens") or {}
    return int(t.get("prompt") or 0) + int(t.get("completion") or 0)


def _fmt(mean: float | None, sd: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.1f} ± {sd:.1f}" if sd is not None else f"{mean:.1f}"


def write_experiment_report(plan: Plan, out: Path) -> Path:
    """report.md + report.json from the cells present (whatever is finished so far)."""
    lines = [f"# Experiment {plan.name}", ""]
    data: dict = {"plan": plan.__dict__, "models": {}}
    expected = orjson.loads((out / ESTIMATE).read_bytes()) if (out / ESTIMATE).exists() else None
    if expected:
        lines += [render_estimate(expected), _measured_line(expected, out), ""]
        data["estimate"] = expected
    for model in plan.models:
        results = []
        for setting in plan.settings:
            for config in plan.configs:
                cell = out / "cells" / _slug(model) / setting / config
                if (cell / "results.jsonl").exists():
                    results += read_results(cell)
        if not results:
            continue
        metrics = compute_metrics(results, n_boot=1000)
        cells = {(s["config"], s["setting"]): s for s in metrics["success"]}
        lines += [f"## {model}", "", "### Success rate (strict, %; mean ± sd over runs) — Figure 5a", "",
                  "| config | " + " | ".join(plan.settings) + " |", "|---|" + "---|" * len(plan.settings)]
        for config in plan.configs:
            row = [_fmt(cells[(config, s)]["mean"], cells[(config, s)]["sd"]) + f" (n={cells[(config, s)]['n']})"
                   if (config, s) in cells else "-" for s in plan.settings]
            lines.append(f"| {config} | " + " | ".join(row) + " |")
        paired = [c for c in metrics["paired"] if "baseline" in (c["a_config"], c["b_config"])]
        lines += ["", "### Paired tests against the baseline (same instances; exact McNemar, Holm-corrected)", "",
                  "| setting | config | diff (points) | 95% CI | p | p (Holm) | units |", "|---|---|---|---|---|---|---|"]
        for c in paired:
            other, sign = (c["b_config"], 1) if c["a_config"] == "baseline" else (c["a_config"], -1)
            diff = None if c["diff"] is None else sign * c["diff"]
            ci = ("-" if c["ci_low"] is None else
                  f"[{min(sign * c['ci_low'], sign * c['ci_high']):.1f}, {max(sign * c['ci_low'], sign * c['ci_high']):.1f}]")
            lines.append(f"| {c['setting']} | {other} | {'-' if diff is None else f'{diff:+.1f}'} | {ci} | "
                         f"{c['p_value']:.3g} | {c['p_holm']:.3g} | {c['n_units']} {c['unit']}s |")
        lines += ["", "### Tokens per episode (all settings)", "",
                  "| config | episodes | mean | CV | paper (GPT-4.1-mini) |", "|---|---|---|---|---|"]
        tokens = {}
        for config in plan.configs:
            xs = [_tokens(r) for r in results if r["config"] == config and r["status"] != "error"]
            if not xs:
                continue
            mean = statistics.fmean(xs)
            cv = statistics.pstdev(xs) / mean if mean else None
            tokens[config] = {"n": len(xs), "mean": mean, "cv": cv}
            lines.append(f"| {config} | {len(xs)} | {mean:,.0f} | {'-' if cv is None else f'{cv:.2f}'} | "
                         f"{PAPER_TOKENS.get(config, '-')} |")
        data["models"][model] = {"success": metrics["success"], "paired": paired, "tokens": tokens}
    training = []
    for mem in sorted((out / "memories").glob("*/" + SUMMARY)) if (out / "memories").exists() else []:
        s = orjson.loads(mem.read_bytes())
        training.append({"memory": mem.parent.name, **{k: s[k] for k in ("episodes", "actor_tokens",
                                                                            "reflection_tokens", "minutes")},
                         "with_specs": s["inputs"]["with_specs"], "model": s["inputs"]["model"]})
    if training:
        lines += ["", "## Training cost", "", "| memory | model | specs | episodes | actor tokens | reflection tokens "
                  "| minutes |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {t['memory']} | {t['model']} | {t['with_specs']} | {t['episodes']} | {t['actor_tokens']:,} | "
                  f"{t['reflection_tokens']:,} | {t['minutes']:.1f} |" for t in training]
        data["training"] = training
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "report.json").write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str))
    return path
