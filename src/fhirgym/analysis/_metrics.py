"""Every metric of the report as a pure function over result dicts (docs/RESULTS.md; formulas: docs/REPORT.md).

No I/O here, so each number is testable on a hand-built list of results. The conventions (docs/REPORT.md, section
Conventions): success is scored 0/100, so rates, sds and variances come out in % and %²; ``status == "error"`` episodes
(infrastructure failures) are excluded from every success, tool and token metric and counted apart (``n_errors``),
except as a third outcome ``error`` where the outcome is the grouping (tool calls and tokens *by outcome*); a
*variation* (prompt) is ``(task_id, seed, paraphrase)``; results are grouped by ``(config, setting)``, and a group's
``label`` is the config name, suffixed with the setting only when the results hold more than one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ._stats import cluster_bootstrap_ci, cv, holm, mcnemar_exact, mean, pvar, sample_sd

Result = dict[str, Any]

FAILURE_MODES = [
    "incorrect_tool_selection",
    "incorrect_tool_order",
    "incorrect_resource_type",
    "prohibited_tool",
    "tool_errors",
    "collateral_writes",
    "other",
]
OUTCOMES = ["pass", "fail", "error"]
NO_RESOURCE = "(none)"


# ---------------------------------------------------------------- small accessors


def is_error(r: Result) -> bool:
    return r.get("status") == "error"


def scored(results: Iterable[Result]) -> list[Result]:
    """The episodes a validator judged (infrastructure errors removed)."""
    return [r for r in results if not is_error(r)]


def success_value(r: Result) -> float:
    """Strict success as 0 or 100 (falls back to the status if ``success`` is missing)."""
    s = r.get("success")
    if s is None:
        s = r.get("status") == "pass"
    return 100.0 if s else 0.0


def total_tokens(r: Result) -> int:
    t = r.get("tokens") or {}
    return int(t.get("prompt") or 0) + int(t.get("completion") or 0)


def variation_key(r: Result) -> tuple[str, int, int]:
    return (str(r.get("task_id")), int(r.get("seed") or 0), int(r.get("paraphrase") or 0))


def group_key(r: Result) -> tuple[str, str]:
    return (str(r.get("config") or "default"), str(r.get("setting") or "default"))


def _groupby(results: Iterable[Result], key: Callable[[Result], Any]) -> dict[Any, list[Result]]:
    out: dict[Any, list[Result]] = defaultdict(list)
    for r in results:
        out[key(r)].append(r)
    return dict(out)


# ---------------------------------------------------------------- success


def rate_over_runs(results: list[Result], value: Callable[[Result], float] = success_value) -> dict[str, Any]:
    """Rate per run index, then mean and *sample* sd (n − 1) of those per-run rates, plus the pooled rate.

    The sd is over runs (repetitions of the whole set), as in the paper's "55.8 ± 2.3": it measures
    how much a complete re-run moves the headline number. None with fewer than two runs.
    """
    by_run = _groupby(results, lambda r: int(r.get("run") or 0))
    per_run = [{"run": k, "n": len(v), "rate": mean([value(r) for r in v])} for k, v in sorted(by_run.items())]
    rates = [p["rate"] for p in per_run]
    values = [value(r) for r in results]
    return {
        "n": len(results),
        "successes": sum(1 for v in values if v > 0),
        "runs": len(per_run),
        "mean": mean(rates),
        "sd": sample_sd(rates),
        "pooled": mean(values),
        "per_run": per_run,
    }


def floor_rate(results: list[Result], field: str = "floor_nothing_found") -> float | None:
    """% of scored episodes whose instance a floor agent passes on the same instances: the constant
    "nothing found" reply (``floor_nothing_found``: blind, so 0 since a negative claim needs a look) or the
    one-search ``guess`` agent (``floor_guess``); None when no line records it (older versions)."""
    known = [r[field] for r in scored(results) if r.get(field) is not None]
    return mean([100.0 if f else 0.0 for f in known]) if known else None


def qa_breakdown(results: list[Result]) -> list[dict[str, Any]]:
    """QA episodes: accuracy by answer shape and by gold resource type (an episode counts under each of its
    types), FHIR-AgentBench's retrieval precision and recall (means over the episodes where they are
    defined) and turns per episode; one row per (``by``, key), infrastructure errors counted apart."""
    qa = [r for r in results if isinstance(r.get("qa"), dict)]
    rows = []
    groups: list[tuple[str, Any, list[Result]]] = [("all", "all", qa)]
    for key, sub in sorted(_groupby(qa, lambda r: r["qa"].get("shape")).items(), key=lambda kv: str(kv[0])):
        groups.append(("shape", key, sub))
    by_type: dict[str, list[Result]] = defaultdict(list)
    for r in qa:
        for t in r["qa"].get("gold_types") or ["(no answer)"]:
            by_type[t].append(r)
    groups += [("gold type", t, sub) for t, sub in sorted(by_type.items())]
    for by, key, sub in groups:
        sc = scored(sub)
        precision = [r["qa"]["retrieval"]["precision"] for r in sc
                     if (r["qa"].get("retrieval") or {}).get("precision") is not None]
        recall = [r["qa"]["retrieval"]["recall"] for r in sc if (r["qa"].get("retrieval") or {}).get("recall") is not None]
        rows.append({"by": by, "key": key, "n": len(sc), "n_errors": len(sub) - len(sc),
                     "accuracy": mean([success_value(r) for r in sc]),
                     "precision": mean([100 * p for p in precision]), "recall": mean([100 * x for x in recall]),
                     "turns": mean([float(r.get("iterations") or 0) for r in sc])})
    return rows if qa else []


def light_success(results: list[Result]) -> dict[str, Any]:
    """Light vs strict validator on writing tasks (scored episodes whose light verdict exists)."""
    rs = [r for r in scored(results) if r.get("writes") and r.get("light_success") is not None]
    light = rate_over_runs(rs, lambda r: 100.0 if r.get("light_success") else 0.0)
    strict = rate_over_runs(rs)
    errors = sum(1 for r in results if is_error(r) and r.get("writes"))
    return {"n": len(rs), "n_errors": errors, "light_mean": light["mean"], "light_sd": light["sd"],
            "strict_mean": strict["mean"], "strict_sd": strict["sd"]}


# ---------------------------------------------------------------- variance and token CV


def _nest(results: list[Result], value: Callable[[Result], float]) -> dict[str, dict[tuple, list[float]]]:
    """task_id → variation → values of its runs."""
    tree: dict[str, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        tree[str(r.get("task_id"))][variation_key(r)].append(value(r))
    return tree


def variance_decomposition(results: list[Result]) -> dict[str, Any]:
    """Nested decomposition of success (0/100) into between-task, within-task and same-prompt variance.

    Estimator — population variances (divide by n) at every level, unweighted means across groups:

    - between_task = pvar over tasks of the task means (task mean = mean of its variation means);
    - within_task  = mean over tasks with ≥ 2 variations of pvar of its variation means;
    - same_prompt  = mean over variations with ≥ 2 runs of pvar of its run outcomes.

    With population variances and a balanced design (same number of variations per task and runs
    per variation) the three add up exactly to the population variance of all episodes (law of total
    variance), so the shares are a true partition. A level that no group can estimate (one run
    everywhere, one variation per task) is None rather than a misleading 0. Shares are relative to
    the sum of the available components.
    """
    rs = scored(results)
    tree = _nest(rs, success_value)
    var_means = {t: [mean(v) for v in vs.values()] for t, vs in tree.items()}
    task_means = [mean(m) for m in var_means.values()]
    between = pvar(task_means) if task_means else None
    within_parts = [pvar(m) for m in var_means.values() if len(m) >= 2]
    same_parts = [pvar(v) for vs in tree.values() for v in vs.values() if len(v) >= 2]
    comps = {"between_task": between, "within_task": mean(within_parts), "same_prompt": mean(same_parts)}
    denom = sum(v for v in comps.values() if v is not None)
    shares = {k: (v / denom if v is not None and denom > 0 else None) for k, v in comps.items()}
    return {
        "n": len(rs),
        "n_tasks": len(tree),
        "n_variations": sum(len(vs) for vs in tree.values()),
        **comps,
        "sum": denom if task_means else None,
        "total": pvar([success_value(r) for r in rs]),
        "share": shares,
    }


def token_cv(results: list[Result]) -> dict[str, Any]:
    """Coefficient of variation (population sd / mean) of total tokens at three nested levels.

    - same_prompt: CV of the runs of one variation, averaged over variations with ≥ 2 runs;
    - within_task: CV of the variation means of one task, averaged over tasks with ≥ 2 variations;
    - overall: CV of all episodes of the group.
    """
    rs = scored(results)
    tree = _nest(rs, lambda r: float(total_tokens(r)))
    same = [cv(v) for vs in tree.values() for v in vs.values() if len(v) >= 2]
    within = [cv([mean(v) for v in vs.values()]) for vs in tree.values() if len(vs) >= 2]
    return {
        "n": len(rs),
        "same_prompt": mean([c for c in same if c is not None]),
        "within_task": mean([c for c in within if c is not None]),
        "overall": cv([float(total_tokens(r)) for r in rs]),
    }


# ---------------------------------------------------------------- pass@k / pass^k


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n tries, c of them successes, succeeds)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(all k draws succeed) = C(c, k) / C(n, k) (τ²-bench's reliability metric)."""
    return math.comb(c, k) / math.comb(n, k)


def pass_k(results: list[Result]) -> list[dict[str, Any]]:
    """pass@k and pass^k for k = 1 … max runs, averaged over variations with at least k scored runs."""
    counts = [(len(v), sum(1 for r in v if success_value(r) > 0))
              for v in _groupby(scored(results), variation_key).values()]
    rows = []
    for k in range(1, max((n for n, _ in counts), default=0) + 1):
        usable = [(n, c) for n, c in counts if n >= k]
        rows.append({
            "k": k,
            "n_instances": len(usable),
            "pass_at_k": 100 * mean([pass_at_k(n, c, k) for n, c in usable]),
            "pass_hat_k": 100 * mean([pass_hat_k(n, c, k) for n, c in usable]),
        })
    return rows


# ---------------------------------------------------------------- tools, failure modes, tokens


def tool_error_rates(results: list[Result], by: str = "name") -> list[dict[str, Any]]:
    """Share of tool calls with a non-empty ``error``, per tool name or per ``resource_type``."""
    calls: dict[str, int] = defaultdict(int)
    errors: dict[str, int] = defaultdict(int)
    for r in scored(results):
        for call in r.get("tool_calls") or []:
            key = str(call.get(by) or NO_RESOURCE)
            calls[key] += 1
            errors[key] += 1 if call.get("error") else 0
    return [{"key": k, "calls": calls[k], "errors": errors[k], "rate": 100 * errors[k] / calls[k]}
            for k in sorted(calls)]


def failure_mode_counts(results: list[Result]) -> dict[str, Any]:
    """How many failed episodes show each failure mode (an episode may show several)."""
    failed = [r for r in results if r.get("status") == "fail"]
    counts = dict.fromkeys(FAILURE_MODES, 0)
    unlabelled = 0
    for r in failed:
        modes = r.get("failure_modes") or []
        unlabelled += 0 if modes else 1
        for m in set(modes):
            counts[m] = counts.get(m, 0) + 1
    return {"n_failed": len(failed), "counts": counts, "unlabelled": unlabelled}


def tool_calls_by_outcome(results: list[Result]) -> list[dict[str, Any]]:
    """Tool calls per episode by outcome, against the reference solution's minimum."""
    rows = []
    for outcome, rs in sorted(_groupby(results, lambda r: r.get("status")).items(),
                              key=lambda kv: OUTCOMES.index(kv[0]) if kv[0] in OUTCOMES else 9):
        calls = [len(r.get("tool_calls") or []) for r in rs]
        expected = [int(r.get("expected_min_calls") or 0) for r in rs]
        rows.append({
            "outcome": outcome,
            "n": len(rs),
            "mean_calls": mean(calls),
            "sd_calls": sample_sd(calls),
            "median_calls": _median(calls),
            "mean_expected": mean(expected),
            "mean_excess": mean([c - e for c, e in zip(calls, expected)]),
            "share_below_min": 100 * mean([1.0 if c < e else 0.0 for c, e in zip(calls, expected)]),
        })
    return rows


def tool_calls_by_expected(results: list[Result]) -> list[dict[str, Any]]:
    """Mean tool calls per (expected minimum, outcome) of scored episodes: the points of the calls plot."""
    groups = _groupby(scored(results), lambda r: (int(r.get("expected_min_calls") or 0), r.get("status")))
    return [{"expected_min_calls": e, "outcome": o, "n": len(rs),
             "mean_calls": mean([len(r.get("tool_calls") or []) for r in rs])}
            for (e, o), rs in sorted(groups.items())]


def tokens_by(results: list[Result], field: str | None) -> list[dict[str, Any]]:
    """Mean total / prompt / completion tokens per value of ``field`` (None: one row for all).

    ``field="status"`` groups by outcome and keeps error episodes as their own row; every other
    grouping uses scored episodes only.
    """
    rs = results if field == "status" else scored(results)
    groups = _groupby(rs, (lambda r: r.get(field)) if field else (lambda r: "all"))
    rows = []
    for key in sorted(groups, key=lambda k: (OUTCOMES.index(k) if k in OUTCOMES else 9, str(k))):
        g = groups[key]
        tot = [float(total_tokens(r)) for r in g]
        rows.append({
            "key": key,
            "n": len(g),
            "mean_total": mean(tot),
            "sd_total": sample_sd(tot),
            "mean_prompt": mean([float((r.get("tokens") or {}).get("prompt") or 0) for r in g]),
            "mean_completion": mean([float((r.get("tokens") or {}).get("completion") or 0) for r in g]),
        })
    return rows


def _median(xs: list[int]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# ---------------------------------------------------------------- paired comparison


def paired_comparison(a: list[Result], b: list[Result], *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Compare two configs on the task instances both ran: difference in success (b − a, in points).

    Pairing: by (task_id, seed, paraphrase, run) when both configs used the same run indices (unit
    ``run``; a run scored on one side only, e.g. an infrastructure error, drops that one pair);
    otherwise (different run counts) by (task_id, seed, paraphrase) with each side's success averaged
    over its scored runs (unit ``variation``). The CI is a percentile bootstrap resampling
    *tasks* (clusters). The test is the exact McNemar test on discordant units — with averaged units,
    the same exact sign test over units where one side is strictly higher.
    """
    def runs(rs: list[Result]) -> dict[tuple, dict[int, float]]:
        out: dict[tuple, dict[int, float]] = defaultdict(dict)
        for r in scored(rs):
            out[variation_key(r)][int(r.get("run") or 0)] = success_value(r) / 100
        return out

    ra, rb = runs(a), runs(b)
    shared = sorted(set(ra) & set(rb))
    by_run = {r for v in ra.values() for r in v} == {r for v in rb.values() for r in v}
    units: list[tuple[str, float, float]] = []  # (task, a, b)
    for v in shared:
        if by_run:
            units.extend((v[0], ra[v][run], rb[v][run]) for run in sorted(set(ra[v]) & set(rb[v])))
        else:
            units.append((v[0], mean(list(ra[v].values())), mean(list(rb[v].values()))))
    diffs: dict[str, list[float]] = defaultdict(list)
    for task, xa, xb in units:
        diffs[task].append(100 * (xb - xa))
    a_better = sum(1 for _, xa, xb in units if xa > xb)
    b_better = sum(1 for _, xa, xb in units if xb > xa)
    ci = cluster_bootstrap_ci(diffs, n_boot=n_boot, seed=seed)
    return {
        "unit": "run" if by_run else "variation",
        "n_units": len(units),
        "n_variations": len(shared),
        "n_tasks": len(diffs),
        "mean_a": 100 * mean([u[1] for u in units]) if units else None,
        "mean_b": 100 * mean([u[2] for u in units]) if units else None,
        "diff": mean([d for ds in diffs.values() for d in ds]),
        "ci_low": ci[0] if ci else None,
        "ci_high": ci[1] if ci else None,
        "a_better": a_better,
        "b_better": b_better,
        "p_value": mcnemar_exact(a_better, b_better),
    }


# ---------------------------------------------------------------- the whole set


def _labels(groups: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    multi = len({s for _, s in groups}) > 1
    return {g: (f"{g[0]} · {g[1]}" if multi else g[0]) for g in groups}


def per_task(results: list[Result], labels: dict[tuple[str, str], str]) -> list[dict[str, Any]]:
    """One row per task: its metadata and, per group, success, light success, calls, tokens, episodes."""
    rows = []
    by_task = _groupby(results, lambda r: str(r.get("task_id")))
    for task_id in sorted(by_task, key=lambda t: (str(by_task[t][0].get("category")), t)):
        rs = by_task[task_id]
        first = rs[0]
        cells = {}
        for g, grs in _groupby(rs, group_key).items():
            sc = scored(grs)
            light = [r for r in sc if r.get("light_success") is not None]
            cells[labels[g]] = {
                "n": len(sc),
                "successes": sum(1 for r in sc if success_value(r) > 0),
                "errors": len(grs) - len(sc),
                "rate": mean([success_value(r) for r in sc]),
                "light_rate": mean([100.0 if r.get("light_success") else 0.0 for r in light]) if light else None,
                "mean_calls": mean([float(len(r.get("tool_calls") or [])) for r in sc]),
                "mean_tokens": mean([float(total_tokens(r)) for r in sc]),
                "episodes": [
                    {"episode_id": r.get("episode_id"), "status": r.get("status"), "seed": r.get("seed"),
                     "paraphrase": r.get("paraphrase"), "run": r.get("run"), "dir": r.get("_dir")}
                    for r in sorted(grs, key=lambda r: (variation_key(r), int(r.get("run") or 0)))
                ],
            }
        rows.append({
            "task_id": task_id,
            "category": first.get("category"),
            "difficulty": first.get("difficulty"),
            "writes": any(r.get("writes") for r in rs),  # some instance writes (each line says its own)
            "expected_min_calls": first.get("expected_min_calls"),
            "groups": {labels[g]: cells[labels[g]] for g in labels if labels[g] in cells},
        })
    return rows


def compute_metrics(results: list[Result], *, n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """All metrics of the report, JSON-serialisable, for a list of results (any configs and settings)."""
    groups = list(dict.fromkeys(group_key(r) for r in results))
    labels = _labels(groups)
    by_group = _groupby(results, group_key)

    def rows(fn: Callable[[list[Result]], Any], extra: Callable[[Any], list[dict]] | None = None) -> list[dict]:
        out = []
        for g in groups:
            head = {"config": g[0], "setting": g[1], "label": labels[g]}
            value = fn(by_group[g])
            if extra is None:
                out.append({**head, **value})
            else:
                out.extend({**head, **row} for row in extra(value))
        return out

    def by_field(field: str) -> Callable[[list[Result]], list[dict]]:
        def fn(rs: list[Result]) -> list[dict]:
            return [{field: key, "n_errors": sum(1 for r in sub if is_error(r)), "floor": floor_rate(sub),
                     "floor_guess": floor_rate(sub, "floor_guess"), **rate_over_runs(scored(sub))}
                    for key, sub in sorted(_groupby(rs, lambda r: r.get(field)).items(),
                                           key=lambda kv: str(kv[0]))]
        return fn

    def listed(rs: list[dict]) -> list[dict]:
        return rs

    summary = []
    for g in groups:
        rs = by_group[g]
        summary.append({"config": g[0], "setting": g[1], "label": labels[g], "n_episodes": len(rs),
                        "n_errors": sum(1 for r in rs if is_error(r)), "floor": floor_rate(rs),
                        "floor_guess": floor_rate(rs, "floor_guess"), **rate_over_runs(scored(rs))})

    comparisons = []
    for setting in dict.fromkeys(s for _, s in groups):
        cfgs = [g for g in groups if g[1] == setting]
        for i, ga in enumerate(cfgs):
            for gb in cfgs[i + 1:]:
                comparisons.append({"setting": setting, "a": labels[ga], "b": labels[gb],
                                    "a_config": ga[0], "b_config": gb[0],
                                    **paired_comparison(by_group[ga], by_group[gb], n_boot=n_boot, seed=seed)})
    for c, p in zip(comparisons, holm([c["p_value"] for c in comparisons])):
        c["p_holm"] = p
        c["significant"] = p < 0.05

    return {
        "meta": {
            "n_results": len(results),
            "n_scored": len(scored(results)),
            "n_errors": sum(1 for r in results if is_error(r)),
            "n_tasks": len({r.get("task_id") for r in results}),
            "groups": [{"config": g[0], "setting": g[1], "label": labels[g]} for g in groups],
            "bootstrap": {"n_boot": n_boot, "seed": seed, "level": 0.95, "resampled": "tasks"},
        },
        "success": summary,
        "success_by_category": rows(by_field("category"), listed),
        "success_by_difficulty": rows(by_field("difficulty"), listed),
        "light_success": rows(light_success),
        "variance": rows(variance_decomposition),
        "tool_errors_by_tool": rows(lambda rs: tool_error_rates(rs, "name"), listed),
        "tool_errors_by_resource": rows(lambda rs: tool_error_rates(rs, "resource_type"), listed),
        "failure_modes": rows(failure_mode_counts),
        "tool_calls": rows(tool_calls_by_outcome, listed),
        "tool_calls_by_expected": rows(tool_calls_by_expected, listed),
        "tokens_by_config": rows(lambda rs: tokens_by(rs, None), listed),
        "tokens_by_difficulty": rows(lambda rs: tokens_by(rs, "difficulty"), listed),
        "tokens_by_outcome": rows(lambda rs: tokens_by(rs, "status"), listed),
        "tokens_by_expected_calls": rows(lambda rs: tokens_by(rs, "expected_min_calls"), listed),
        "token_cv": rows(token_cv),
        "pass_k": rows(pass_k, listed),
        "paired": comparisons,
        "errors": [{"label": labels[group_key(r)], "episode_id": r.get("episode_id"), "error": r.get("error"),
                    "dir": r.get("_dir")} for r in results if is_error(r)],
        "per_task": per_task(results, labels),
        "qa": rows(qa_breakdown, listed),
    }
