"""Every report metric on tiny hand-built result sets whose answers are worked out by hand below."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from fhirgym.analysis import compute_metrics
from fhirgym.analysis._metrics import (
    failure_mode_counts,
    light_success,
    paired_comparison,
    pass_at_k,
    pass_hat_k,
    pass_k,
    rate_over_runs,
    scored,
    token_cv,
    tokens_by,
    tool_calls_by_outcome,
    tool_error_rates,
    variance_decomposition,
)
from fhirgym.analysis._stats import (
    binom_two_sided,
    cluster_bootstrap_ci,
    holm,
    mcnemar_exact,
    pvar,
    sample_sd,
)


def ep(task: str = "t1", seed: int = 0, para: int = 0, run: int = 0, ok: bool | None = True, *,
       config: str = "base", setting: str = "default", **kw: Any) -> dict[str, Any]:
    """A result line with only the fields a metric needs; ok=None makes an infrastructure error."""
    status = "error" if ok is None else ("pass" if ok else "fail")
    rec = {"episode_id": f"{config}/{task}/s{seed}/p{para}/r{run}", "task_id": task, "seed": seed,
           "paraphrase": para, "run": run, "config": config, "setting": setting, "status": status, "success": ok,
           "light_success": None, "writes": False, "category": "records", "difficulty": 1,
           "expected_min_calls": 1, "tool_calls": [], "tokens": {"prompt": 0, "completion": 0},
           "failure_modes": [], "error": "boom" if ok is None else None}
    rec.update(kw)
    return rec


# ------------------------------------------------------------------ success


def test_success_mean_and_sample_sd_over_runs_exclude_errors() -> None:
    # run 0: 2 of 3 pass → 66.67 %; run 1: 1 of 3 pass → 33.33 % (its error episode is not counted)
    rs = [ep("a", run=0), ep("b", run=0), ep("c", run=0, ok=False),
          ep("a", run=1), ep("b", run=1, ok=False), ep("c", run=1, ok=False), ep("d", run=1, ok=None)]
    out = rate_over_runs(scored(rs))
    assert out["n"] == 6 and out["runs"] == 2 and out["successes"] == 3
    assert out["mean"] == pytest.approx(50.0)
    # sample sd of {200/3, 100/3}: deviations ±50/3, variance 2·(50/3)² / (2 − 1)
    assert out["sd"] == pytest.approx(math.sqrt(2) * 50 / 3)
    assert out["pooled"] == pytest.approx(50.0)
    summary = compute_metrics(rs)["success"][0]
    assert summary["n_episodes"] == 7 and summary["n_errors"] == 1 and summary["mean"] == pytest.approx(50.0)


def test_single_run_has_no_sd() -> None:
    assert rate_over_runs([ep(), ep("b", ok=False)])["sd"] is None


def test_success_by_category_and_difficulty() -> None:
    rs = [ep("a", category="billing", difficulty=3), ep("b", category="billing", difficulty=3, ok=False),
          ep("c", category="records", difficulty=1)]
    m = compute_metrics(rs)
    by_cat = {r["category"]: r["mean"] for r in m["success_by_category"]}
    assert by_cat == {"billing": 50.0, "records": 100.0}
    by_diff = {r["difficulty"]: (r["n"], r["mean"]) for r in m["success_by_difficulty"]}
    assert by_diff == {1: (1, 100.0), 3: (2, 50.0)}


def test_light_success_only_on_writing_tasks_with_a_light_verdict() -> None:
    rs = [ep("w1", writes=True, ok=False, light_success=True),
          ep("w2", writes=True, ok=True, light_success=True),
          ep("w3", writes=True, ok=False, light_success=False),
          ep("r1", writes=False, ok=True),                      # read-only: excluded
          ep("w4", writes=True, ok=None, light_success=None)]   # error: excluded
    out = light_success(rs)
    assert out["n"] == 3 and out["n_errors"] == 1
    assert out["light_mean"] == pytest.approx(200 / 3)
    assert out["strict_mean"] == pytest.approx(100 / 3)


def test_the_nothing_found_floor_is_read_from_the_lines() -> None:
    from fhirgym.analysis._metrics import floor_rate

    rs = [ep("a", ok=True), ep("b", ok=False), ep("c", ok=None)]
    assert floor_rate(rs) is None  # results written before the field existed
    for r, floor in zip(rs, (True, False, True)):
        r["floor_nothing_found"] = floor
    assert floor_rate(rs) == pytest.approx(50.0)  # the error is left out, like in the success rate


# ------------------------------------------------------------------ variance decomposition


def _nested(values: dict[str, dict[int, list[bool]]]) -> list[dict[str, Any]]:
    return [ep(task, seed=v, run=i, ok=ok) for task, vs in values.items() for v, runs in vs.items()
            for i, ok in enumerate(runs)]


def test_variance_decomposition_known_components() -> None:
    # task A: prompt 0 → runs 100, 100 (mean 100); prompt 1 → 0, 100 (mean 50); task mean 75
    # task B: prompts 0 and 1 → all 0; task mean 0
    rs = _nested({"A": {0: [True, True], 1: [False, True]}, "B": {0: [False, False], 1: [False, False]}})
    out = variance_decomposition(rs)
    assert out["between_task"] == pytest.approx(1406.25)    # pvar(75, 0) = 37.5²
    assert out["within_task"] == pytest.approx(312.5)       # mean(pvar(100, 50) = 625, pvar(0, 0) = 0)
    assert out["same_prompt"] == pytest.approx(625.0)       # mean(0, pvar(0, 100) = 2500, 0, 0)
    # balanced design: the parts add up to the population variance of all 8 episodes (3/8 succeed)
    assert out["total"] == pytest.approx(0.375 * 0.625 * 100**2) == pytest.approx(2343.75)
    assert out["sum"] == pytest.approx(out["total"])
    assert out["share"]["between_task"] == pytest.approx(0.6)
    assert out["share"]["within_task"] == pytest.approx(2 / 15)
    assert out["share"]["same_prompt"] == pytest.approx(4 / 15)
    assert (out["n_tasks"], out["n_variations"], out["n"]) == (2, 4, 8)


def test_variance_levels_without_replication_are_none_not_zero() -> None:
    out = variance_decomposition(_nested({"A": {0: [True]}, "B": {0: [False]}}))
    assert out["between_task"] == pytest.approx(2500.0)
    assert out["within_task"] is None and out["same_prompt"] is None
    assert out["share"]["between_task"] == pytest.approx(1.0)


def test_token_cv_at_three_levels() -> None:
    def tok(task: str, seed: int, run: int, n: int) -> dict[str, Any]:
        return ep(task, seed=seed, run=run, tokens={"prompt": n - 10, "completion": 10})

    rs = [tok("T1", 0, 0, 100), tok("T1", 0, 1, 300), tok("T1", 1, 0, 200), tok("T1", 1, 1, 200),
          tok("T2", 0, 0, 100), tok("T2", 0, 1, 100), tok("T2", 1, 0, 300), tok("T2", 1, 1, 300)]
    out = token_cv(rs)
    # same prompt: CVs 100/200 = 0.5, 0, 0, 0 → 0.125
    assert out["same_prompt"] == pytest.approx(0.125)
    # within task: T1 variation means (200, 200) → 0; T2 (100, 300) → 100/200 = 0.5 → mean 0.25
    assert out["within_task"] == pytest.approx(0.25)
    # overall: mean 200, population variance 60000/8 = 7500
    assert out["overall"] == pytest.approx(math.sqrt(7500) / 200)


# ------------------------------------------------------------------ pass@k and pass^k


def test_pass_at_k_and_pass_hat_k_closed_forms() -> None:
    assert pass_at_k(3, 2, 2) == 1.0 and pass_hat_k(3, 2, 2) == pytest.approx(1 / 3)
    assert pass_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10) and pass_hat_k(5, 1, 2) == 0.0
    assert pass_at_k(4, 0, 3) == 0.0 and pass_hat_k(4, 4, 3) == 1.0


def test_pass_k_on_known_counts() -> None:
    # variation A: n=3, c=2; B: n=3, c=0; C: n=2, c=1
    rs = ([ep("A", run=i, ok=ok) for i, ok in enumerate([True, True, False])]
          + [ep("B", run=i, ok=False) for i in range(3)]
          + [ep("C", run=i, ok=ok) for i, ok in enumerate([True, False])]
          + [ep("C", run=2, ok=None)])  # an error run: C keeps n = 2
    rows = {r["k"]: r for r in pass_k(rs)}
    assert set(rows) == {1, 2, 3}
    assert rows[1]["pass_at_k"] == pytest.approx(100 * (2 / 3 + 0 + 1 / 2) / 3)
    assert rows[1]["pass_hat_k"] == pytest.approx(rows[1]["pass_at_k"])
    # k=2: pass@2 = (1, 0, 1) → 2/3; pass^2 = (C(2,2)/C(3,2) = 1/3, 0, C(1,2)/C(2,2) = 0) → 1/9
    assert rows[2]["pass_at_k"] == pytest.approx(200 / 3)
    assert rows[2]["pass_hat_k"] == pytest.approx(100 / 9)
    # k=3: only A and B have 3 runs; pass@3 = (1, 0), pass^3 = (0, 0)
    assert rows[3]["n_instances"] == 2
    assert rows[3]["pass_at_k"] == pytest.approx(50.0) and rows[3]["pass_hat_k"] == 0.0


# ------------------------------------------------------------------ tools, failures, tokens


def _call(name: str, rtype: str | None, error: str | None = None) -> dict[str, Any]:
    return {"name": name, "arguments": {}, "output_summary": "", "error": error, "resource_type": rtype, "ms": 1.0}


def test_tool_error_rates_by_tool_and_resource_type() -> None:
    rs = [ep("a", tool_calls=[_call("search", "Patient"), _call("search", "Slot", "HTTP 400"),
                              _call("create", "Slot", "HTTP 422"), _call("listResourceTypes", None)]),
          ep("b", ok=False, tool_calls=[_call("search", "Patient", "HTTP 400")]),
          ep("c", ok=None, tool_calls=[_call("search", "Patient", "timeout")])]  # error episode: ignored
    by_tool = {r["key"]: (r["calls"], r["errors"], r["rate"]) for r in tool_error_rates(rs, "name")}
    assert by_tool == {"create": (1, 1, 100.0), "listResourceTypes": (1, 0, 0.0),
                       "search": (3, 2, pytest.approx(200 / 3))}
    by_type = {r["key"]: (r["calls"], r["errors"]) for r in tool_error_rates(rs, "resource_type")}
    assert by_type == {"(none)": (1, 0), "Patient": (2, 1), "Slot": (2, 2)}


def test_failure_mode_counts_of_failed_episodes() -> None:
    rs = [ep("a", ok=False, failure_modes=["tool_errors", "other"]),
          ep("b", ok=False, failure_modes=["tool_errors", "tool_errors"]),  # counted once per episode
          ep("c", ok=False, failure_modes=[]),
          ep("d", ok=True), ep("e", ok=None)]
    out = failure_mode_counts(rs)
    assert out["n_failed"] == 3 and out["unlabelled"] == 1
    assert out["counts"]["tool_errors"] == 2 and out["counts"]["other"] == 1
    assert out["counts"]["prohibited_tool"] == 0


def test_tool_calls_by_outcome_against_expected_minimum() -> None:
    calls = [_call("search", "Patient")]
    rs = [ep("a", ok=True, tool_calls=calls * 2, expected_min_calls=2),
          ep("b", ok=True, tool_calls=calls * 4, expected_min_calls=2),
          ep("c", ok=False, tool_calls=calls * 1, expected_min_calls=3),
          ep("d", ok=None, tool_calls=[], expected_min_calls=1)]
    rows = {r["outcome"]: r for r in tool_calls_by_outcome(rs)}
    assert list(rows) == ["pass", "fail", "error"]
    assert rows["pass"]["mean_calls"] == 3.0 and rows["pass"]["median_calls"] == 3.0
    assert rows["pass"]["mean_expected"] == 2.0 and rows["pass"]["mean_excess"] == 1.0
    assert rows["pass"]["sd_calls"] == pytest.approx(math.sqrt(2))
    assert rows["fail"]["mean_excess"] == -2.0 and rows["fail"]["share_below_min"] == 100.0
    assert rows["error"]["n"] == 1


def test_tokens_by_outcome_keeps_errors_other_groupings_drop_them() -> None:
    rs = [ep("a", tokens={"prompt": 900, "completion": 100}, difficulty=1),
          ep("b", ok=False, tokens={"prompt": 2500, "completion": 500}, difficulty=2),
          ep("c", ok=False, tokens={"prompt": 4000, "completion": 1000}, difficulty=2),
          ep("d", ok=None, tokens={"prompt": 50, "completion": 0}, difficulty=2)]
    by_outcome = {r["key"]: (r["n"], r["mean_total"]) for r in tokens_by(rs, "status")}
    assert by_outcome == {"pass": (1, 1000.0), "fail": (2, 4000.0), "error": (1, 50.0)}
    by_diff = {r["key"]: (r["n"], r["mean_total"], r["mean_completion"]) for r in tokens_by(rs, "difficulty")}
    assert by_diff == {1: (1, 1000.0, 100.0), 2: (2, 4000.0, 750.0)}
    [overall] = tokens_by(rs, None)
    assert overall["n"] == 3 and overall["mean_total"] == pytest.approx(3000.0)
    assert overall["sd_total"] == pytest.approx(sample_sd([1000, 3000, 5000]))


# ------------------------------------------------------------------ statistics


def test_exact_binomial_and_mcnemar() -> None:
    assert binom_two_sided(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_exact(1, 5) == pytest.approx(2 * (1 + 6) / 64)      # = 0.21875
    assert mcnemar_exact(5, 1) == mcnemar_exact(1, 5)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)


def test_holm_adjustment() -> None:
    # sorted 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → monotone: 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


def test_population_variance() -> None:
    assert pvar([0, 100]) == 2500 and pvar([]) is None


def test_cluster_bootstrap_ci() -> None:
    assert cluster_bootstrap_ci({"a": [5.0, 5.0], "b": [5.0]}) == (5.0, 5.0)
    # two clusters {0} and {100}: resampled means are 0, 50, 100 with probability 1/4, 1/2, 1/4
    lo, hi = cluster_bootstrap_ci({"a": [0.0], "b": [100.0]}, n_boot=4000, seed=1)
    assert (lo, hi) == (0.0, 100.0)
    one = cluster_bootstrap_ci({"a": [0.0, 10.0], "b": [20.0], "c": [30.0, 50.0]}, seed=3)
    assert one == cluster_bootstrap_ci({"a": [0.0, 10.0], "b": [20.0], "c": [30.0, 50.0]}, seed=3)
    assert one is not None and one[0] < 22 < one[1]
    assert cluster_bootstrap_ci({}) is None


# ------------------------------------------------------------------ paired comparison


def test_paired_by_run_binary_mcnemar() -> None:
    # 4 tasks × 2 runs; A fails everything except t1, B passes everything except t4/run 1
    a = [ep(f"t{i}", run=r, ok=(i == 1), config="A") for i in range(1, 5) for r in range(2)]
    b = [ep(f"t{i}", run=r, ok=not (i == 4 and r == 1), config="B") for i in range(1, 5) for r in range(2)]
    out = paired_comparison(a, b, n_boot=500)
    assert out["unit"] == "run" and out["n_units"] == 8 and out["n_tasks"] == 4
    assert out["mean_a"] == 25.0 and out["mean_b"] == 87.5
    assert out["diff"] == pytest.approx(62.5)
    assert (out["a_better"], out["b_better"]) == (0, 5)
    assert out["p_value"] == pytest.approx(2 / 32)
    assert out["ci_low"] <= out["diff"] <= out["ci_high"] <= 100


def test_paired_by_run_drops_only_the_pair_of_an_error() -> None:
    a = [ep(f"t{i}", run=r, ok=False, config="A") for i in range(3) for r in range(2)]
    b = [ep(f"t{i}", run=r, ok=True if (i, r) != (2, 1) else None, config="B") for i in range(3) for r in range(2)]
    out = paired_comparison(a, b, n_boot=100)
    assert out["unit"] == "run" and out["n_units"] == 5 and (out["a_better"], out["b_better"]) == (0, 5)
    assert out["diff"] == 100.0


def test_paired_averages_over_runs_when_run_counts_differ() -> None:
    # A has 2 runs per variation, B only 1: pairs are variations, A's success averaged over its runs
    a = [ep("t1", run=0, ok=True), ep("t1", run=1, ok=False), ep("t2", run=0, ok=False), ep("t2", run=1, ok=False),
         ep("t3", run=0, ok=True), ep("t3", run=1, ok=True)]
    b = [ep("t1", run=0, ok=True), ep("t2", run=0, ok=True), ep("t3", run=0, ok=True), ep("t9", run=0, ok=True)]
    out = paired_comparison(a, b, n_boot=200)
    assert out["unit"] == "variation" and out["n_units"] == 3     # t9 has no partner
    assert out["mean_a"] == pytest.approx(50.0) and out["mean_b"] == 100.0
    assert out["diff"] == pytest.approx(50.0)                    # (50 + 100 + 0) / 3
    assert (out["a_better"], out["b_better"]) == (0, 2)
    assert out["p_value"] == pytest.approx(0.5)


def test_compute_metrics_groups_settings_and_holm() -> None:
    rs = []
    for setting in ("s1", "s2"):
        for cfg, skill in (("base", 0), ("mem", 1)):
            rs += [ep(f"t{i}", run=r, ok=bool(skill), config=cfg, setting=setting) for i in range(8) for r in range(2)]
    rs.append(ep("t0", run=5, ok=None, config="mem", setting="s2"))
    m = compute_metrics(rs, n_boot=200)
    assert [g["label"] for g in m["meta"]["groups"]] == ["base · s1", "mem · s1", "base · s2", "mem · s2"]
    assert [(c["setting"], c["a"], c["b"]) for c in m["paired"]] == [("s1", "base · s1", "mem · s1"),
                                                                       ("s2", "base · s2", "mem · s2")]
    for c in m["paired"]:
        assert c["b_better"] == 16 and c["p_value"] == pytest.approx(2 / 2**16)
        assert c["p_holm"] == pytest.approx(2 * c["p_value"]) and c["significant"]
        assert c["diff"] == 100.0 and (c["ci_low"], c["ci_high"]) == (100.0, 100.0)
    assert m["meta"]["n_errors"] == 1 and len(m["errors"]) == 1
    assert [t["task_id"] for t in m["per_task"]] == [f"t{i}" for i in range(8)]
    cell = m["per_task"][0]["groups"]["mem · s2"]
    assert (cell["n"], cell["errors"], cell["rate"], len(cell["episodes"])) == (2, 1, 100.0, 3)
    json.dumps(m)  # the JSON report is this dict


def test_compute_metrics_of_nothing() -> None:
    m = compute_metrics([])
    assert m["meta"]["n_results"] == 0 and m["success"] == [] and m["paired"] == [] and m["per_task"] == []
