"""The experiment matrix: settings never evaluate on a training instance (except `same`), plans load with
clear errors, and an experiment killed with SIGKILL resumes to the same final results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from fhirgym.memory import SETTINGS, ExperimentError, heldout_split, load_plan, plan_setting
from fhirgym.tasks import CATEGORIES, families

ROOT = Path(__file__).parents[1]


def test_no_setting_but_same_evaluates_on_a_training_instance():
    for name in SETTINGS:
        sp = plan_setting(name, "all")
        shared = sp.train_instances() & sp.eval_instances()
        if name == "same":
            assert sp.eval_instances() <= sp.train_instances()
        else:
            assert not shared, (name, sorted(shared)[:3])
        if name in ("paraphrased", "held-out"):
            assert sp.train_paraphrase and sp.eval_paraphrase and sp.train_paraphrase != sp.eval_paraphrase
    held = plan_setting("held-out", "all")
    assert not set(held.train_tasks) & set(held.eval_tasks)


def test_the_held_out_split_is_stratified_and_complete():
    split = heldout_split()
    every = {f.id: f for f in families()}
    assert sorted(split["train"] + split["eval"]) == sorted(every)
    for cat in CATEGORIES:
        n_train = sum(every[t].category == cat for t in split["train"])
        n_eval = sum(every[t].category == cat for t in split["eval"])
        assert abs(n_train - n_eval) <= 1, cat


def test_plans_load_and_bad_plans_are_refused(tmp_path):
    for name in ("paper", "small"):
        plan = load_plan(ROOT / "plans" / f"{name}.toml")
        assert plan.configs == ["baseline", "specs", "memory", "memory-specs", "memory-specs+specs"]
        assert plan.settings == list(SETTINGS)
    bad = tmp_path / "bad.toml"
    bad.write_text('models = ["x"]\n[seeds.unseen]\ntrain = [0, 1]\neval = [1, 2]\n')
    with pytest.raises(ExperimentError, match="share"):
        load_plan(bad)
    bad.write_text('models = ["x"]\nconfigs = ["nope"]\n')
    with pytest.raises(ExperimentError, match="unknown configs"):
        load_plan(bad)
    bad.write_text('models = ["x"]\ntasks = "no.such.task"\n')
    with pytest.raises(ExperimentError, match="no task matches"):
        load_plan(bad)
    bad.write_text('models = ["x"]\nrun = 3\n')
    with pytest.raises(ExperimentError, match="unknown keys"):
        load_plan(bad)


DRIVER = textwrap.dedent('''
    import sys, time, orjson
    from pathlib import Path
    from fhirgym.agents import NullAgent, ScriptedBackend
    from fhirgym.memory import load_plan, run_experiment
    from fhirgym.tasks import TaskWorld

    plan = load_plan(Path(sys.argv[1]))
    world = TaskWorld.open(sys.argv[3])
    slow = float(sys.argv[4])

    class SlowNull(NullAgent):
        def run(self, task):
            time.sleep(slow)
            return super().run(task)

    critique = orjson.dumps({"score": 2, "critique": "No tool was called.", "failure_tags": [],
                             "advice": "Search first."}).decode()
    lesson = orjson.dumps({"macro": "Search the patient before answering.", "micro": [
        {"resource_type": "Patient", "operation": "search", "tip": "Use family and birthdate."}]}).decode()

    def backend(model):
        return ScriptedBackend([lambda m: critique if "You are the evaluator" in m[0]["content"] else lesson] * 1000)

    run_experiment(plan, Path(sys.argv[2]), world, log=lambda m: None, make_agent=lambda m: SlowNull(),
                   make_backend=backend)
''')


def _final(out: Path) -> dict:
    lines = {}
    for path in sorted(out.glob("cells/*/*/*/results.jsonl")):
        for raw in path.read_bytes().splitlines():
            r = orjson.loads(raw)
            key = (r["setting"], r["episode_id"])
            assert key not in lines, f"episode {key} ran twice"
            assert (r["memory"] is not None) == r["config"].startswith("memory")
            lines[key] = (r["status"], r["success"], r["paraphrase_source"], r["prompt_id"])
    return lines


def test_an_experiment_killed_with_sigkill_resumes_to_the_same_results(small_world_path, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(textwrap.dedent('''
        models = ["scripted"]
        configs = ["baseline", "memory", "memory-specs+specs"]
        settings = ["same", "unseen", "paraphrased", "held-out"]
        runs = 2
        tasks = "records.find_patient,clinical.patient_mrn,clinical.patient_by_mrn"
        trials = 2
        memory_mode = "prompt"
        [seeds.unseen]
        train = [0]
        eval = [1]
        [seeds.paraphrased]
        train = [0]
        eval = [1]
        [seeds.held-out]
        train = [0]
        eval = [1]
    '''))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    whole = tmp_path / "whole"
    subprocess.run([sys.executable, str(driver), str(plan), str(whole), str(small_world_path), "0"], check=True,
                   env=env, timeout=900)
    expected = _final(whole)
    assert len(expected) == 2 * 3 * (3 + 3 + 3 + 1)  # runs × configs × eval instances per setting

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(driver), str(plan), str(killed), str(small_world_path), "0.05"],
                            env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # kill it in the middle of the evaluations
        if len(list(killed.glob("cells/*/*/*/results.jsonl"))) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = _final(killed)
    assert 0 < len(partial) < len(expected)
    subprocess.run([sys.executable, str(driver), str(plan), str(killed), str(small_world_path), "0"], check=True,
                   env=env, timeout=900)
    assert _final(killed) == expected
    for log in killed.glob("memories/*/training.jsonl"):
        runs = [(r["family"], r["seed"], r["trial"]) for r in map(orjson.loads, log.read_bytes().splitlines())]
        assert len(runs) == len(set(runs)), "a training run was repeated"
    report = (killed / "report.md").read_text()
    assert "## Before the run: cost and power of plan `plan`" in report and "**Measured so far**: " in report
    assert "Figure 5a" in report and "| memory-specs+specs |" in report and "Paired tests" in report
    assert "Tokens per episode" in report and "Training cost" in report
