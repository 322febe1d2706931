"""Before a run: the power of the report's paired test (against a published value and an exact enumeration),
the dry-run's arithmetic on a hand-made plan, its sources of per-episode figures and prices, the CPU plan's
power, the CLI and the report that opens with the same figures."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import textwrap
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from fhirgym.analysis import mcnemar_power, paired_mde, render_estimate
from fhirgym.analysis._stats import mcnemar_exact, mcnemar_n_normal, paired_cells
from fhirgym.cli import main
from fhirgym.memory import (
    EstimateError,
    ExperimentError,
    Figures,
    FigureTable,
    estimate,
    load_plan,
    load_prices,
    measured_figures,
    write_experiment_report,
)
from fhirgym.tasks import TaskWorld

ROOT = Path(__file__).parents[1]


def test_the_normal_approximation_gives_connors_published_sample_size():
    # Connor (1987), Biometrics 43:207-211, p. 209, as worked on powerandsamplesize.com: p01 = 0.45,
    # p10 = 0.05, two-sided alpha 0.05, power 80 % -> 23 pairs
    assert math.ceil(mcnemar_n_normal(0.05, 0.45)) == 23


def _enumerated_power(n: int, p10: float, p01: float, alpha: float) -> float:
    """Every outcome of n pairs (A-only, B-only, concordant counts) with its multinomial probability, tested
    with the report's own mcnemar_exact: the definition of the test's power, with no shortcut."""
    total = 0.0
    for a, b in itertools.product(range(n + 1), repeat=2):
        if a + b <= n and mcnemar_exact(a, b) < alpha:
            ways = math.comb(n, a) * math.comb(n - a, b)
            total += ways * p10**a * p01**b * (1 - p10 - p01) ** (n - a - b)
    return total


@pytest.mark.parametrize(("n", "p10", "p01"), [(12, 0.1, 0.35), (25, 0.05, 0.2), (30, 0.15, 0.15), (9, 0.0, 0.6)])
def test_exact_power_is_the_enumerated_probability_of_rejecting(n, p10, p01):
    assert mcnemar_power(n, p10, p01) == pytest.approx(_enumerated_power(n, p10, p01, 0.05), abs=1e-12)


def test_exact_power_is_near_the_normal_approximation_and_below_it():
    """On large samples the exact power approaches Connor's normal power, from below: the exact conditional
    test is conservative (its real size is under alpha), which is why the MDE uses the exact power."""
    z = statistics.NormalDist()
    for n, p10, p01 in ((400, 0.1, 0.16), (300, 0.05, 0.12), (1000, 0.2, 0.25)):
        psi, delta = p10 + p01, p01 - p10
        normal = z.cdf((delta * math.sqrt(n) - z.inv_cdf(0.975) * math.sqrt(psi)) / math.sqrt(psi - delta**2))
        assert normal - 0.05 < mcnemar_power(n, p10, p01) < normal


def test_the_mde_is_the_smallest_effect_with_the_power():
    mde = paired_mde(72, 0.031)
    assert mde == 15.0
    assert mcnemar_power(72, *paired_cells(0.031, mde / 100)) >= 0.8 > mcnemar_power(72, *paired_cells(0.031, 0.149))
    assert paired_mde(4, 0.5) is None  # four pairs cannot reach p < 0.05 at all
    assert paired_mde(200, 0.3) < paired_mde(100, 0.3) < paired_mde(50, 0.3)
    assert paired_mde(100, 0.3, correlation=0.5) < paired_mde(100, 0.3)  # concordant pairs carry no noise
    assert paired_cells(0.2, 0.1) == pytest.approx((0.2 * 0.7, 0.3 * 0.8))  # independent given the pair


PLAN = textwrap.dedent('''
    models = ["openai/m", "local/qwen2.5-coder-0.5b"]
    configs = ["baseline", "memory"]
    settings = ["unseen"]
    runs = 2
    trials = 2
    tasks = "clinical.record_temperature,clinical.latest_glucose"
    parallel = 4
    evaluator = "openai/judge"
    [seeds.unseen]
    train = [0]
    eval = [1, 2]
''')
EPISODE = Figures(3, 1000, 100, 20.0, "hand: episode")
TABLE = FigureTable({("openai/m", "baseline"): EPISODE, ("openai/m", "memory"): Figures(4, 2000, 200, 30.0, "hand: memory"),
                     ("openai/m", "train"): Figures(2, 500, 50, 10.0, "hand: actor"),
                     ("openai/judge", "evaluator"): Figures(1, 300, 30, 3.0, "hand: evaluator"),
                     ("openai/judge", "reflector"): Figures(1, 400, 40, 4.0, "hand: reflector")})
PRICES = textwrap.dedent('''
    currency = "EUR"
    note = "made up for a test"
    [models."openai/m"]
    input = 2.0
    output = 10.0
    [models."openai/judge"]
    input = 1.0
    output = 4.0
''')


def test_the_dry_run_arithmetic_on_a_hand_made_plan(tmp_path):
    (tmp_path / "plan.toml").write_text(PLAN)
    (tmp_path / "prices.toml").write_text(PRICES)
    est = estimate(load_plan(tmp_path / "plan.toml"), figures=TABLE, prices=load_prices(tmp_path / "prices.toml"),
                   base_rate=0.2)
    cells = {(c["model"], c["config"]): c for c in est["cells"]}
    base = cells[("openai/m", "baseline")]  # 2 families x 2 seeds x 2 runs = 8 episodes, 4 at a time
    assert (base["episodes"], base["calls"], base["prompt_tokens"], base["completion_tokens"]) == (8, 24, 8000, 800)
    assert base["cost"] == pytest.approx(8 * (1000 * 2.0 + 100 * 10.0) / 1e6, abs=0.005)  # 0.024 EUR
    assert base["minutes"] == round(8 * 20 / 4 / 60, 1)
    memory = cells[("openai/m", "memory")]
    assert (memory["calls"], memory["prompt_tokens"], memory["minutes"]) == (32, 16000, 1.0)
    local = cells[("local/qwen2.5-coder-0.5b", "baseline")]  # one llama.cpp model: parallel 1, whatever the plan says
    assert local["minutes"] == round(8 * 7.5 / 60, 1) and local["unpriced"] == ["local/qwen2.5-coder-0.5b"]
    [mem] = [m for m in est["memories"] if m["model"] == "openai/m"]  # 2 families x seed 0 x 2 trials = 4 runs
    assert mem["runs"] == 4 and mem["calls"] == 4 * (2 + 1 + 1)
    assert (mem["prompt_tokens"], mem["completion_tokens"]) == (4 * 1200, 4 * 120)
    assert mem["cost"] == pytest.approx(4 * ((500 * 2 + 50 * 10) + (300 * 1 + 30 * 4) + (400 * 1 + 40 * 4)) / 1e6, abs=0.005)
    assert mem["minutes"] == round((4 * 10 / 4 + 4 * 3 + 4 * 4) / 60, 1)  # actor 4 at a time, reflections in order
    total = est["total"]
    assert total["training_runs"] == 8 and total["evaluation_episodes"] == 32
    assert total["calls"] == sum(c["calls"] for c in est["cells"]) + sum(m["calls"] for m in est["memories"])
    assert total["unpriced"] == ["local/qwen2.5-coder-0.5b"]
    [cmp] = [c for c in est["comparisons"] if c["model"] == "openai/m"]
    assert (cmp["pairs"], cmp["instances"], cmp["mde"], cmp["mde_distinct"]) == (8, 4, paired_mde(8, 0.2), paired_mde(4, 0.2))
    assert est["assumptions"]["holm_comparisons"] == 1 and est["assumptions"]["base_rate"] == 0.2
    text = render_estimate(est)
    assert "0.02 EUR" in text and "+ unpriced (local/qwen2.5-coder-0.5b)" in text and "made up for a test" in text
    assert "hand: episode" in text and "plans/cpu.toml run 2026-12-04" in text  # every figure says where from


def test_a_model_nobody_measured_gets_stated_figures_and_an_adapter_its_base(tmp_path):
    table = FigureTable()
    assert table.episode("openai/unknown", "memory").source.startswith("stated default")
    bc = table.episode("local/qwen2.5-coder-0.5b+bc.gguf", "memory")
    assert bc.seconds == 7.8 and "the base model's; adapter bc.gguf not measured" in bc.source
    assert "[baseline's figures: specs not measured]" in table.episode("local/qwen2.5-coder-1.5b", "specs").source


def test_measured_directories_give_the_figures(tmp_path):
    cell = tmp_path / "exp" / "cells" / "openai_m" / "unseen" / "baseline"
    cell.mkdir(parents=True)
    lines = [{"episode_id": f"e{i}", "model": "openai/m", "config": "baseline", "status": status, "iterations": it,
              "tokens": {"prompt": p, "completion": c}, "duration_s": s}
             for i, (status, it, p, c, s) in enumerate([("pass", 2, 1000, 50, 10.0), ("fail", 4, 3000, 150, 30.0),
                                                         ("error", 9, 9, 9, 999.0)])]
    (cell / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    mem = tmp_path / "exp" / "memories" / "k"
    mem.mkdir(parents=True)
    (mem / "training.json").write_bytes(orjson.dumps({
        "inputs": {"model": "openai/m", "evaluator": "openai/judge", "reflector": "openai/judge", "with_specs": False},
        "reflections": {"runs": 2},
        "evaluator": {"calls": 3, "prompt_tokens": 900, "completion_tokens": 90, "seconds": 6.0},
        "reflector": {"calls": 2, "prompt_tokens": 800, "completion_tokens": 80, "seconds": 8.0}}))
    (mem / "training.jsonl").write_text(json.dumps({"outcome": "fail", "iterations": 2, "seconds": 12.0,
                                                    "tokens": {"prompt": 700, "completion": 70}}) + "\n")
    figures = {k: (f.calls, f.prompt, f.completion, f.seconds) for k, f in measured_figures([tmp_path / "exp"]).items()}
    assert figures[("openai/m", "baseline")] == (3.0, 2000.0, 100.0, 20.0)  # the error line left out
    assert figures[("openai/judge", "evaluator")] == (1.5, 450.0, 45.0, 3.0)
    assert figures[("openai/judge", "reflector")] == (1.0, 400.0, 40.0, 4.0)
    assert figures[("openai/m", "train")] == (2.0, 700.0, 70.0, 12.0)
    assert measured_figures([tmp_path / "exp"])[("openai/m", "baseline")].source.startswith("measured: 2 episodes in")
    with pytest.raises(EstimateError, match=r"no results\.jsonl"):
        measured_figures([tmp_path])


@pytest.mark.parametrize("text", ['[models."m"]\ninput = 1\n', '[models."m"]\ninput = -1\noutput = 2\n',
                                  'currency = "USD"\n', '[models."m"]\ninput = "1"\noutput = 2\n',
                                  'price = 3\n[models."m"]\ninput = 1\noutput = 2\n', "not toml ["])
def test_bad_price_tables_are_refused(tmp_path, text):
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(EstimateError, match="--prices"):
        load_prices(tmp_path / "p.toml")


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def test_the_cpu_plan_detects_15_points_in_unseen_and_held_out(world):
    """The sizing of plans/cpu.toml: under its stated base rate (the 0.5B's measured 3.1 %) and independent
    pairs, each baseline-vs-memory comparison has an MDE of at most 15 points, over distinct task instances
    none of which is a training instance (drawn in the default world it runs on)."""
    plan = load_plan(ROOT / "plans" / "cpu.toml")
    est = estimate(plan, world=world)
    assert est["assumptions"]["base_rate"] == 0.031 and est["assumptions"]["correlation"] == 0
    compared = {c["setting"]: c for c in est["comparisons"] if c["config"] == "memory"}
    assert set(compared) == {"unseen", "held-out"}
    for c in compared.values():
        assert c["mde"] <= 15.0 and c["distinct"] == c["pairs"] and c["seen_in_training"] == 0 and c["mde_distinct"] is None


def test_a_plan_with_a_bad_base_rate_is_refused(tmp_path):
    (tmp_path / "p.toml").write_text('models = ["x"]\nbase_rate = 1.5\n')
    with pytest.raises(ExperimentError, match="base_rate"):
        load_plan(tmp_path / "p.toml")
    (tmp_path / "p.toml").write_text('models = ["x"]\n')
    with pytest.raises(ExperimentError, match="base rate"):
        estimate(load_plan(tmp_path / "p.toml"), base_rate=-0.1)


def test_the_cli_dry_run_and_the_report_that_opens_with_it(tmp_path, small_world_path):
    (tmp_path / "plan.toml").write_text(PLAN)
    (tmp_path / "prices.toml").write_text(PRICES)
    runner = CliRunner()
    world = ["--world", str(small_world_path)]
    done = runner.invoke(main, ["experiment", "run", str(tmp_path / "plan.toml"), "--dry-run", "--prices",
                                str(tmp_path / "prices.toml"), "--base-rate", "0.2", *world])
    assert done.exit_code == 0, done.output
    assert "## Before the run: cost and power of plan `plan`" in done.output and "EUR" in done.output
    as_json = runner.invoke(main, ["experiment", "run", str(tmp_path / "plan.toml"), "--dry-run", "--format", "json",
                                   *world])
    est = json.loads(as_json.output)
    assert est["assumptions"]["base_rate"] == 0.5 and est["prices"] is None
    assert {c["distinct"] for c in est["comparisons"]} == {4}  # drawn in the world: 4 distinct instances
    assert runner.invoke(main, ["experiment", "run", str(tmp_path / "plan.toml"), *world]).exit_code == 2  # no --out
    (tmp_path / "bad.toml").write_text("[models.m]\ninput = 1\n")
    bad = runner.invoke(main, ["experiment", "run", str(tmp_path / "plan.toml"), "--dry-run", "--prices",
                               str(tmp_path / "bad.toml"), *world])
    assert bad.exit_code == 1 and "input and output" in bad.output
    out = tmp_path / "exp"
    out.mkdir()
    (out / "estimate.json").write_text(as_json.output)
    report = write_experiment_report(load_plan(tmp_path / "plan.toml"), out).read_text()
    assert report.startswith("# Experiment plan\n\n## Before the run: cost and power of plan `plan`")
    assert "**Measured so far**: 0 training runs (estimate: ≤ 8)" in report
