"""What a plan will cost and what it can show, before it runs (``fhirgym experiment run PLAN --dry-run``).

Per memory (model × setting × with/without specs): training runs, counted at most (every trial runs); per cell (model ×
setting × config): evaluation episodes; for both the expected model calls, prompt and completion tokens, the cost under
a price table the user passes (there are no built-in prices) and the wall time; then the totals, and for every paired
comparison against the baseline the minimum detectable effect of the report's exact McNemar test
(:func:`fhirgym.analysis.paired_mde`) given its pairs and an assumed base rate. Per-episode figures come, first found,
from result directories passed in, from :data:`MEASURED` (what this repository measured; each entry says where) or from
:data:`STATED` (a stated default, marked as such): nothing is silently assumed, every figure used carries its source
into the output. Sources, prices and the MDE's assumptions: docs/MEMORY.md, section "Before a run".
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import orjson

from ..analysis import paired_mde
from ..runner import read_results
from ._reflect import SPEC_ROUNDS
from ._serve import MEMORY_CONFIGS
from ._settings import SettingPlan

ALPHA = 0.05
POWER = 0.8
#: Without ``--base-rate`` or the plan's ``base_rate``: the least favourable rate for small effects
#: (independent pairs disagree most often at 50 %), so the MDE shown is an upper bound
DEFAULT_BASE_RATE = 0.5


class EstimateError(ValueError):
    pass


@dataclass(frozen=True)
class Figures:
    """Means per episode (or per reflected training run, for the evaluator and reflector)."""

    calls: float
    prompt: float
    completion: float
    seconds: float
    source: str


def _split(total: float, share: float = 0.05) -> tuple[float, float]:
    return total * (1 - share), total * share


_SMALL = ("docs/MEMORY.md, plans/small.toml run 2026-12-02 at b3b3aba (4 one-patient families, prompt-mode memory, "
          "quiet 2 cores): tokens/episode of the config; 17.9 s/episode = (37 min 17 s - 16.4 min of training) / "
          "70 episodes; 2.0 turns (docs/LOCAL-AGENT.md); prompt/completion split assumed 95/5 (not measured)")
_CPU = ("docs/notes/2026-12-04-memory-cpu-plan.md, plans/cpu.toml run 2026-12-04 at 6a7bd48 (8 families, "
        "prompt-mode memory, quiet 2 cores): 144 episodes per config, 12 reflected training runs")
_SMOKE = ("docs/notes/2026-12-03-structured-reflection-smoke.md: one schema-constrained call on the 0.5B "
          "(load average 1-1.8)")
_ONE5 = ("docs/LOCAL-AGENT.md, 2026-12-02: 48.8 s/episode (65 families, 3,172 s), 2.0 turns; 3,682 tokens/episode "
         "and 190 completion tokens (the default six families)")
_RATIO = 48.8 / 17.9  # the 1.5B's seconds per episode over the 0.5B's, both measured here
_PAPER = ("the paper's GPT-4.1-mini tokens per run (the FHIR-AgentEval paper's own table); split assumed 95/5, 5 calls and "
          "30 s/episode stated (not reported)")

#: (model, config or role) → figures this repository measured. Roles: ``train`` (the training actor),
#: ``evaluator``, ``reflector``, ``reflector+specs`` (per reflected run).
MEASURED: dict[tuple[str, str], Figures] = {
    **{("local/qwen2.5-coder-0.5b", config): Figures(2.0, *_split(tokens), 17.9, _SMALL)
       for config, tokens in (("specs", 4634), ("memory-specs", 3503), ("memory-specs+specs", 4697))},
    ("local/qwen2.5-coder-0.5b", "baseline"): Figures(2.0, 3342, 52, 7.5, _CPU),
    ("local/qwen2.5-coder-0.5b", "memory"): Figures(2.0, 3540, 53, 7.8, _CPU),
    ("local/qwen2.5-coder-0.5b", "train"): Figures(2.0, 3379, 49, 14.0, _CPU),
    ("local/qwen2.5-coder-0.5b", "evaluator"): Figures(1, 658, 151, 9.8, _CPU),
    ("local/qwen2.5-coder-0.5b", "reflector"): Figures(1, 862, 246, 15.7, _CPU),
    ("local/qwen2.5-coder-1.5b", "baseline"): Figures(2.0, 3682 - 190, 190, 48.8, _ONE5),
    ("local/qwen2.5-coder-1.5b", "train"): Figures(2.0, 3682 - 190, 190, 48.8, _ONE5 + " (the baseline's)"),
    ("local/qwen2.5-coder-1.5b", "evaluator"): Figures(
        1, 504, 168, round(16.6 * _RATIO, 1), f"estimated: {_SMOKE}, seconds × {_RATIO:.2f} (1.5B/0.5B s/episode)"),
    ("local/qwen2.5-coder-1.5b", "reflector"): Figures(
        1, 724, 247, round(45.0 * _RATIO, 1), f"estimated: {_SMOKE}, seconds × {_RATIO:.2f} (1.5B/0.5B s/episode)"),
    **{("openai/gpt-4.1-mini", config): Figures(5, *_split(tokens), 30.0, _PAPER)
       for config, tokens in (("baseline", 6100), ("memory", 23000), ("memory-specs+specs", 51000))},
}

#: Figures where nothing is measured: an episode like the paper's GPT-4.1-mini baseline; a reflection with
#: the token counts the same prompts took on the 0.5B (a reasoning model bills hidden reasoning tokens on top)
STATED: dict[str, Figures] = {
    "episode": Figures(5, *_split(6100), 30.0, "stated default (not measured): 6,100 tokens (the paper's "
                                               "GPT-4.1-mini baseline), split 95/5, 5 calls, 30 s/episode"),
    "evaluator": Figures(1, 504, 168, 10.0, "stated default (not measured): the 0.5B smoke's tokens, 10 s/call"),
    "reflector": Figures(1, 724, 247, 10.0, "stated default (not measured): the 0.5B smoke's tokens, 10 s/call"),
}


#: A config nobody measured takes the figures of the nearest one: what it serves minus the spec tools, or
#: a memory trained the other way
NEAREST = {"memory-specs+specs": "memory-specs", "memory-specs": "memory", "memory": "baseline", "specs": "baseline"}


def _with_specs_rounds(f: Figures) -> Figures:
    """A reflector that may first call the spec tools: up to SPEC_ROUNDS more calls, each re-reading the
    conversation so far (an upper bound; no such reflection was measured)."""
    return replace(f, calls=f.calls + SPEC_ROUNDS, prompt=f.prompt * (1 + SPEC_ROUNDS),
                   completion=f.completion * 1.5, seconds=f.seconds * (1 + SPEC_ROUNDS),
                   source=f"{f.source}; with up to {SPEC_ROUNDS} spec-tool rounds (stated upper bound)")


class FigureTable:
    """Looks figures up: measured directories first, then :data:`MEASURED`, then :data:`STATED`. A model
    ``local/<base>+<adapter>.gguf`` falls back to its base's figures (the adapter adds a few percent of
    compute; not measured); a config without figures to the nearest config's (:data:`NEAREST`), said so."""

    def __init__(self, measured: dict[tuple[str, str], Figures] | None = None) -> None:
        self.measured = measured or {}

    def _find(self, model: str, key: str) -> Figures | None:
        for table in (self.measured, MEASURED):
            if (model, key) in table:
                return table[(model, key)]
        base, plus, adapter = model.rpartition("+")
        if plus and adapter.endswith(".gguf"):
            found = self._find(base, key)
            if found:
                return replace(found, source=f"{found.source} (the base model's; adapter {adapter} not measured)")
        return None

    def episode(self, model: str, config: str) -> Figures:
        found, nearest = self._find(model, config), config
        while found is None and nearest in NEAREST:
            nearest = NEAREST[nearest]
            found = self._find(model, nearest)
            if found is not None:
                found = replace(found, source=f"{found.source} [{nearest}'s figures: {config} not measured]")
        return found or STATED["episode"]

    def training_actor(self, model: str) -> Figures:
        found = self._find(model, "train")
        if found is None:
            memory = self.episode(model, "memory")
            found = replace(memory, source=f"{memory.source} [for the training actor, which has lessons in its prompt]")
        return found

    def reflection(self, model: str, role: str, with_specs: bool) -> Figures:
        if with_specs and role == "reflector":
            found = self._find(model, "reflector+specs")
            if found is not None:
                return found
            return _with_specs_rounds(self.reflection(model, role, False))
        return self._find(model, role) or STATED[role]


def measured_figures(dirs: list[Path]) -> dict[tuple[str, str], Figures]:
    """Figures measured in ``dirs``: experiment directories (their cells and memories) or evaluation
    directories (``results.jsonl``). Means over non-error episodes per (model, config), over logged training
    runs per model (the actor) and over reflected runs per evaluator/reflector model."""
    episodes: dict[tuple[str, str], list[dict]] = {}
    roles: dict[tuple[str, str], list[float]] = {}  # → [runs, calls, prompt, completion, seconds]
    actors: dict[str, list[dict]] = {}
    where: dict[tuple[str, str], set[str]] = {}
    for d in map(Path, dirs):
        if not d.is_dir():
            raise EstimateError(f"--measured {d}: not a directory")
        cells = sorted(d.glob("cells/*/*/*")) if (d / "cells").is_dir() else [d]
        found = False
        for cell in cells:
            for r in read_results(cell):
                found = True
                if r.get("status") != "error" and r.get("model"):
                    episodes.setdefault((r["model"], r["config"]), []).append(r)
                    where.setdefault((r["model"], r["config"]), set()).add(str(d))
        for summary in sorted(d.glob("memories/*/training.json")):
            found = True
            s = orjson.loads(summary.read_bytes())
            inputs, runs = s["inputs"], (s.get("reflections") or {}).get("runs", 0)
            for line in (summary.parent / "training.jsonl").read_bytes().splitlines():
                r = orjson.loads(line)
                if r.get("outcome") != "error" and "seconds" in r:
                    actors.setdefault(inputs["model"], []).append(r)
            for role in ("evaluator", "reflector"):
                if role in s and runs:
                    key = (inputs[role], "reflector+specs" if role == "reflector" and inputs["with_specs"] else role)
                    acc = roles.setdefault(key, [0, 0, 0, 0, 0.0])
                    for i, v in enumerate((runs, s[role]["calls"], s[role]["prompt_tokens"],
                                           s[role]["completion_tokens"], s[role]["seconds"])):
                        acc[i] += v
                    where.setdefault(key, set()).add(str(d))
        if not found:
            raise EstimateError(f"--measured {d}: no results.jsonl, cells/ or memories/ in it")
    out: dict[tuple[str, str], Figures] = {}
    for (model, config), rs in episodes.items():
        out[(model, config)] = Figures(
            _mean([float(r.get("iterations") or 0) for r in rs]),
            _mean([float((r.get("tokens") or {}).get("prompt") or 0) for r in rs]),
            _mean([float((r.get("tokens") or {}).get("completion") or 0) for r in rs]),
            _mean([float(r.get("duration_s") or 0) for r in rs]),
            f"measured: {len(rs)} episodes in {', '.join(sorted(where[(model, config)]))}")
    for model, rs in actors.items():
        out[(model, "train")] = Figures(
            _mean([float(r.get("iterations") or 0) for r in rs]), _mean([float(r["tokens"]["prompt"]) for r in rs]),
            _mean([float(r["tokens"]["completion"]) for r in rs]), _mean([float(r["seconds"]) for r in rs]),
            f"measured: {len(rs)} training runs")
    for key, (runs, calls, prompt, completion, seconds) in roles.items():
        out[key] = Figures(calls / runs, prompt / runs, completion / runs, seconds / runs,
                           f"measured: {runs} reflected runs in {', '.join(sorted(where[key]))}")
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def load_prices(path: Path) -> dict:
    """A price table: ``currency = "USD"`` (optional) and ``[models."<model string>"]`` with ``input`` and
    ``output`` per million tokens, for any model string of a plan (``openai/gpt-4.1``, ``local/...``)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EstimateError(f"--prices {path}: {exc}") from None
    unknown = sorted(set(data) - {"currency", "models", "note"})
    if unknown or not isinstance(data.get("models"), dict) or not data["models"]:
        raise EstimateError(f"--prices {path}: expected an optional 'currency' and a [models.\"<model>\"] table "
                            f"per model with input and output prices per million tokens"
                            + (f" (unknown keys {unknown})" if unknown else ""))
    models = {}
    for model, price in data["models"].items():
        if not isinstance(price, dict) or set(price) != {"input", "output"} or not all(
                isinstance(price[k], int | float) and not isinstance(price[k], bool) and price[k] >= 0
                and math.isfinite(price[k]) for k in price):
            raise EstimateError(f"--prices {path}: models.{model!r} needs exactly input and output, numbers >= 0 "
                                "(per million tokens)")
        models[model] = (float(price["input"]), float(price["output"]))
    return {"file": str(path), "currency": str(data.get("currency", "USD")), "note": data.get("note"),
            "models": models}


@dataclass
class _Bill:
    calls: float = 0.0
    prompt: float = 0.0
    completion: float = 0.0
    seconds: float = 0.0
    cost: float = 0.0
    unpriced: frozenset[str] = frozenset()

    def add(self, model: str, count: float, f: Figures, prices: dict | None, parallel: int = 1) -> None:
        self.calls += count * f.calls
        self.prompt += count * f.prompt
        self.completion += count * f.completion
        self.seconds += count * f.seconds / parallel
        price = (prices or {}).get("models", {}).get(model)
        if price is None:
            self.unpriced |= {model}
        else:
            self.cost += count * (f.prompt * price[0] + f.completion * price[1]) / 1e6

    def add_bill(self, other: _Bill) -> None:
        self.calls += other.calls
        self.prompt += other.prompt
        self.completion += other.completion
        self.seconds += other.seconds
        self.cost += other.cost
        self.unpriced |= other.unpriced

    def row(self) -> dict:
        return {"calls": round(self.calls), "prompt_tokens": round(self.prompt),
                "completion_tokens": round(self.completion), "minutes": round(self.seconds / 60, 1),
                "cost": round(self.cost, 2), "unpriced": sorted(self.unpriced)}


def _parallel(model: str, parallel: int) -> int:
    """Episodes that really run at once: a local model is one llama.cpp instance on the machine's cores,
    taking turns behind its lock, whatever the plan's ``parallel``."""
    return 1 if model.startswith("local/") else max(1, parallel)


def estimate_plan(plan, settings: dict[str, SettingPlan], *, figures: FigureTable | None = None,
                  prices: dict | None = None, base_rate: float | None = None, correlation: float = 0.0,
                  instances: dict[str, dict] | None = None) -> dict:
    """The dry-run of ``plan`` (an :class:`~fhirgym.memory.Plan`) whose settings resolve to ``settings``:
    a JSON-serialisable dict (``analysis.render_estimate`` prints it). ``instances``: per setting, the
    counts of ``instance_counts`` (distinct evaluation instances, those seen in training), when the world
    is known; the MDE is then also given over the distinct instances."""
    figures = figures or FigureTable()
    if base_rate is None:
        base_rate, rate_source = ((plan.base_rate, "the plan's base_rate") if plan.base_rate is not None
                                  else (DEFAULT_BASE_RATE, "default: the least favourable rate"))
    else:
        rate_source = "--base-rate"
    if not 0 <= base_rate < 1:
        raise EstimateError(f"base rate {base_rate}: must be at least 0 and below 1")
    sources: list[str] = []

    def cite(f: Figures) -> int:
        if f.source not in sources:
            sources.append(f.source)
        return sources.index(f.source) + 1

    def mde(n: int) -> float | None:
        return paired_mde(n, base_rate, alpha=ALPHA, power=POWER, correlation=correlation)

    total = _Bill()
    memories, cells, comparisons = [], [], []
    runs_total = episodes_total = 0
    n_compared = len(plan.configs) * (len(plan.configs) - 1) // 2 * len(plan.settings)  # what Holm corrects over
    for model in plan.models:
        evaluator = plan.evaluator or model
        reflector = plan.reflector or evaluator
        trained: dict[tuple, dict] = {}  # settings with the same training inputs share one memory
        for setting in plan.settings:
            sp = settings[setting]
            runs = len(sp.train_instances()) * plan.trials
            for with_specs in sorted({MEMORY_CONFIGS[c][0] for c in plan.configs if c in MEMORY_CONFIGS}):
                key = (tuple(sp.train_tasks), tuple(sp.train_seeds), sp.train_paraphrase, with_specs)
                if key in trained:
                    trained[key]["setting"] += f", {setting}"
                    continue
                bill = _Bill()
                used = [figures.training_actor(model), figures.reflection(evaluator, "evaluator", False),
                        figures.reflection(reflector, "reflector", with_specs)]
                # the actor's episodes run `parallel` at a time (the first trials ahead); reflections in order
                for who, f, at_once in zip((model, evaluator, reflector), used,
                                           (_parallel(model, plan.parallel), 1, 1), strict=True):
                    bill.add(who, runs, f, prices, at_once)
                total.add_bill(bill)
                runs_total += runs
                trained[key] = {"model": model, "setting": setting, "with_specs": with_specs, "runs": runs,
                                **bill.row(), "figures": [cite(f) for f in used]}
                memories.append(trained[key])
            counts = (instances or {}).get(setting) or {}
            n_instances = len(sp.eval_instances())
            distinct = counts.get("distinct", n_instances)
            episodes = n_instances * plan.runs
            for config in plan.configs:
                f = figures.episode(model, config)
                bill = _Bill()
                bill.add(model, episodes, f, prices, _parallel(model, plan.parallel))
                total.add_bill(bill)
                episodes_total += episodes
                cells.append({"model": model, "setting": setting, "config": config, "episodes": episodes,
                              **bill.row(), "figures": [cite(f)]})
                if config != "baseline" and "baseline" in plan.configs:
                    comparisons.append({
                        "model": model, "setting": setting, "config": config, "pairs": episodes,
                        "instances": n_instances, "distinct": distinct if counts else None,
                        "seen_in_training": counts.get("seen_in_training"),
                        "mde": mde(episodes),
                        "mde_holm": paired_mde(episodes, base_rate, alpha=ALPHA / max(1, n_compared), power=POWER,
                                               correlation=correlation),
                        "mde_distinct": mde(distinct) if distinct < episodes else None})
    return {
        "plan": plan.name,
        "parallel": plan.parallel,
        "assumptions": {"base_rate": base_rate, "base_rate_source": rate_source, "correlation": correlation,
                        "alpha": ALPHA, "power": POWER, "holm_comparisons": n_compared,
                        "training_runs": "at most: every trial of every training variation"},
        "prices": None if prices is None else {k: prices[k] for k in ("file", "currency", "note")},
        "sources": sources,
        "memories": memories,
        "cells": cells,
        "comparisons": comparisons,
        "total": {"training_runs": runs_total, "evaluation_episodes": episodes_total, **total.row()},
    }
