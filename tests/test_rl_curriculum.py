"""Curricula that cannot be gamed (``fhirgym rl curriculum``, ``rl train --curriculum``) and the behaviour
figures that show a shortcut: the constant replies' rewards under the current validators, the refusal and
its message, a curriculum measured on a tiny random-weight GGUF (llama.cpp), and its floors on the curve."""

from __future__ import annotations

import json

import pytest

from fhirgym.rl import (
    CONSTANTS,
    check_curriculum,
    constant_reward,
    dataset_rows,
    instance_for,
)
from fhirgym.rl._behaviour import behaviour_summary, figures, is_negative
from fhirgym.rl._curriculum import refusal
from fhirgym.runner._episode import guess_floor
from fhirgym.tasks import NOT_FOUND

TASK = "records.patient_not_found"


@pytest.fixture(scope="module")
def world(small_world_path):
    return {"path": str(small_world_path)}


def test_constant_replies_earn_what_the_current_validators_pay(world):
    """"Nothing found" without a call passes nothing now; after one search of the evidence type it passes
    exactly the negative instances (seeds 2 and 5 of the first six train seeds here); ``guess`` earns its
    floor (the report's ``floor_guess``). QA: "no answer" after a look passes the no-answer questions."""
    rows = dataset_rows("action", "train", tasks=TASK, per_family=6, world=world, max_turns=3, config="read")
    negatives = [r["extra_info"]["seed"] for r in rows
                 if instance_for(r["extra_info"]).gold.answer is NOT_FOUND]
    assert negatives == [2, 5]
    for row in rows:
        extra = row["extra_info"]
        blind, looked, guess = (constant_reward(extra, name, "read") for name in CONSTANTS)
        assert blind == 0.0
        assert looked == float(extra["seed"] in negatives)
        assert guess == float(guess_floor(instance_for(extra)))
    qa = dataset_rows("qa", "train", tasks="qa.marital_status", per_family=6, world=world, max_turns=3,
                      config="read", qa={"per_template": 20, "seed": 0})
    for row in qa:
        empty = instance_for(row["extra_info"]).family.question.no_answer
        assert constant_reward(row["extra_info"], "no-answer", "read") == 0.0
        assert constant_reward(row["extra_info"], "no-answer after a look", "read") == float(empty)


def _curriculum(start, floors, model="m"):
    return {"version": 1, "spec": {"model": model, "tasks": TASK, "low": 0.2, "high": 0.8, "episodes": 4},
            "kept": [TASK], "rows": [{"task_id": TASK, "seed": s, "question_id": None} for s in range(6)],
            "start_mean_reward": start, "floors": floors}


def test_the_refusal_names_the_best_paid_reply_and_both_figures():
    floors = {"nothing-found": 0.0, "nothing-found after a look": 1 / 3, "guess": 0.0}
    why = refusal(_curriculum(0.25, floors), "cur.json")
    assert why == ('curriculum cur.json: the constant reply "nothing-found after a look" earns 0.333 on its 6 rows, '
                   "at least the start policy's mean reward 0.250 (m, 4 episodes per row): GRPO would be paid for "
                   "the shortcut. Choose other families (--tasks) or a better-placed start model.")
    assert refusal(_curriculum(1 / 3, floors)) is not None  # "at least": a tie is refused
    assert refusal(_curriculum(0.5, floors)) is None
    check_curriculum(_curriculum(0.5, floors), "m")
    with pytest.raises(ValueError, match="measured for 'm', not 'other'"):
        check_curriculum(_curriculum(0.5, floors), "other")
    empty = {**_curriculum(None, {}), "kept": [], "rows": []}
    assert "nothing GRPO can learn from" in refusal(empty)


def test_behaviour_figures_by_hand(world, tmp_path):
    """Shares of all episodes: 2 of 4 negative, calls (0 + 1 + 2 + 3) / 4 = 1.5, one answer without a look
    (an episode that gave no answer does not count as one)."""
    rows = [{"calls": 0, "looked": False, "answered": True, "negative": True},
            {"calls": 1, "looked": True, "answered": True, "negative": True},
            {"calls": 2, "looked": True, "answered": True, "negative": False},
            {"calls": 3, "looked": False, "answered": False, "negative": False}]
    assert figures(rows) == {"behaviour/negative_share": 0.5, "behaviour/mean_calls": 1.5,
                             "behaviour/answer_without_look_share": 0.25}
    log = tmp_path / "rollouts.jsonl"
    log.write_text("".join(json.dumps({"step": s, "behaviour": b}) + "\n" for s, b in zip([1, 1, 3, 3], rows, strict=True)))
    assert [(r["step"], r["episodes"], r["behaviour/mean_calls"]) for r in behaviour_summary(log)] == [(1, 2, 0.5),
                                                                                                     (3, 2, 2.5)]
    action = instance_for(dataset_rows("action", "train", tasks=TASK, per_family=1, world=world)[0]["extra_info"])
    assert is_negative(action, '<answer>{"found": false}</answer>')
    assert not is_negative(action, '<answer>{"patient_id": "p-1"}</answer>') and not is_negative(action, None)
    question = instance_for(dataset_rows("qa", "train", tasks="qa.gender", per_family=1, world=world,
                                         qa={"per_template": 20, "seed": 0})[0]["extra_info"])
    assert is_negative(question, "The final answer is: no answer") and not is_negative(question, "The final answer is: male")


def test_rl_curriculum_measures_and_rl_train_refuses_a_shortcut(world, tmp_path):
    """On a tiny random-weight GGUF (it solves nothing), with the band opened to [0, 1] so the family is
    kept: the start policy earns 0, "nothing found" after a look 1/3 of the three rows, and rl train refuses
    the file with the reply and both figures; nor may --tasks be given beside --curriculum."""
    pytest.importorskip("trl")
    from click.testing import CliRunner

    from _tiny_gguf import tiny_qwen2_gguf
    from fhirgym.cli import main

    base = tiny_qwen2_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "cur.json"
    args = ["rl", "curriculum", "--model", str(base), "--tasks", TASK, "--per-family", "3", "--episodes", "1",
            "--low", "0", "--high", "1", "--config", "read", "--max-turns", "2", "--max-new-tokens", "24",
            "--threads", "1", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--patients", "10", "--world-seed", "42"])  # the small world
    assert result.exit_code == 0, result.output
    cur = json.loads(out.read_text())
    assert cur["kept"] == [TASK] and cur["families"][TASK]["episodes"] == 3
    assert cur["start_mean_reward"] == 0.0
    assert cur["floors"] == {"nothing-found": 0.0, "nothing-found after a look": pytest.approx(1 / 3), "guess": 0.0}
    assert "rl train will refuse it" in result.output and "kept" in result.output
    refused = CliRunner().invoke(main, ["rl", "train", "--model", str(base), "--curriculum", str(out), "--out",
                                        str(tmp_path / "run")])
    assert refused.exit_code != 0
    assert ('the constant reply "nothing-found after a look" earns 0.333 on its 3 rows, at least the start '
            "policy's mean reward 0.000") in refused.output
    both = CliRunner().invoke(main, ["rl", "train", "--model", str(base), "--curriculum", str(out), "--tasks", TASK,
                                     "--out", str(tmp_path / "run")])
    assert both.exit_code != 0 and "drop --tasks" in both.output

    # a warm start (a LoRA checkpoint) is measured with its adapter on the base, and leaves no file behind
    from _tiny_gguf import random_lora_checkpoint
    from fhirgym.rl import CurriculumSpec, measure_curriculum

    random_lora_checkpoint(base, tmp_path / "ck", seed=1)
    warm = measure_curriculum(CurriculumSpec(model=str(tmp_path / "ck"), tasks=TASK, per_family=1, episodes=1, low=0,
                                             high=1, world=world, config="read", max_turns=2, max_new_tokens=24),
                              tmp_path / "warm" / "cur.json")
    assert warm["spec"]["model"] == str(tmp_path / "ck") and warm["families"][TASK]["episodes"] == 1
    assert [p.name for p in (tmp_path / "warm").iterdir()] == ["cur.json"]
