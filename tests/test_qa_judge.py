"""The optional LLM judge with a scripted backend: prompt, parsing, retries, cache, agreement."""

from __future__ import annotations

import math

from fhirgym.agents import ScriptedBackend
from fhirgym.runner import LlmJudge, agreement, gold_text


def test_gold_is_shown_as_fhir_agentbench_shows_it():
    assert gold_text(True, False) == "[[1]]" and gold_text(False, True) == "no answer"
    assert gold_text(["female"], False) == "[['female']]" and gold_text(3.5, False) == "[[3.5]]"
    assert gold_text(None, True) == "no answer"


def test_the_judge_reads_0_or_1_retries_and_caches(tmp_path):
    backend = ScriptedBackend(["1", "I think... 0", "maybe", "yes", "sure"])
    judge = LlmJudge(backend, tmp_path / "cache.jsonl", attempts=3)
    a = judge.judge("Q1", "[[1]]", "Yes")
    assert a.correct and not a.cached
    prompt = backend.requests[0].messages[0]["content"]
    assert "Question: Q1" in prompt and "True answer: [[1]]" in prompt and "Model answer: Yes" in prompt
    assert "round both to the nearest integer" in prompt
    assert not judge.judge("Q2", "[[0]]", "Yes").correct
    third = judge.judge("Q3", "[[2]]", "2")  # three replies without 0/1: rejected after 3 attempts
    assert not third.correct and third.raw == "sure" and backend.remaining == 0
    # a repeat is answered from the cache (the script is exhausted: a call would raise) ...
    assert judge.judge("Q1", "[[1]]", "Yes").cached
    # ... also by a new judge on the same file, for the same model only
    again = LlmJudge(ScriptedBackend([]), tmp_path / "cache.jsonl")
    repeat = again.judge("Q2", "[[0]]", "Yes")
    assert repeat.cached and not repeat.correct
    other = LlmJudge(ScriptedBackend(["1"], name="other-model"), tmp_path / "cache.jsonl")
    assert not other.judge("Q2", "[[0]]", "Yes").cached


def test_agreement_precision_recall_against_the_matcher():
    a = agreement([(True, True), (True, False), (False, True), (False, False), (True, True)])
    assert a.n == 5 and a.agreement == 0.6
    assert a.precision == 2 / 3 and a.recall == 2 / 3
    assert a.judge_accepts == 3 and a.matcher_accepts == 3
    assert "agreement 60.0 %" in a.lines()
    assert math.isnan(agreement([(False, False)]).precision)


def test_cli_judge_agreement_with_a_scripted_judge(small_world_path, tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    import fhirgym.agents
    from fhirgym.cli import main
    from fhirgym.tasks.qa import build_questions, reference_reply, write_questions

    questions = build_questions(small_world_path, per_template=6, seed=0, templates=["lab_value", "admitted"])[:4]
    write_questions(questions, tmp_path / "qa.jsonl")
    replies = [reference_reply(questions[0]), reference_reply(questions[1]), "The final answer is: 123456", "no idea"]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"id": q.id, "answer": r})
                                                 for q, r in zip(questions, replies, strict=True)))
    # matcher: right, right, wrong, wrong; the judge accepts 1, 3 and 4: it agrees on the first only
    monkeypatch.setattr(fhirgym.agents, "make_backend", lambda *a, **k: ScriptedBackend(["1", "0", "1", "1"]))
    run = CliRunner().invoke(main, ["qa", "judge-agreement", str(tmp_path / "a.jsonl"),
                                    "--questions", str(tmp_path / "qa.jsonl"), "--model", "scripted"])
    assert run.exit_code == 0, run.output
    assert "4 answers: agreement 25.0 %, judge precision 33.3 %, recall 50.0 %" in run.output
    assert len((tmp_path / "a.judge-cache.jsonl").read_text().splitlines()) == 4


def test_score_and_judge_read_an_eval_runs_result_lines(small_world_path, tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    import fhirgym.agents
    from fhirgym.cli import main
    from fhirgym.tasks.qa import build_questions, reference_reply, write_questions

    questions = build_questions(small_world_path, per_template=6, seed=0, templates=["gender"])[:2]
    write_questions(questions, tmp_path / "qa.jsonl")
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps({"task_id": f"qa.{q.template}", "final_answer": reply,
                                             "qa": {"question_id": q.id, "shape": q.shape}})
                                 for q, reply in zip(questions, [reference_reply(questions[0]), "no idea"],
                                                     strict=True)))
    score = CliRunner().invoke(main, ["qa", "score", str(results), "--questions", str(tmp_path / "qa.jsonl")])
    assert score.exit_code == 0, score.output
    assert "all                1/2      50.0 %" in score.output
    monkeypatch.setattr(fhirgym.agents, "make_backend", lambda *a, **k: ScriptedBackend(["1", "1"]))
    judged = CliRunner().invoke(main, ["qa", "judge-agreement", str(results), "--questions",
                                       str(tmp_path / "qa.jsonl"), "--model", "scripted"])
    assert "2 answers: agreement 50.0 %" in judged.output, judged.output
    # an answer to a question the set does not hold is refused, naming it
    stray = tmp_path / "stray.jsonl"
    stray.write_text(json.dumps({"id": "no-such-question", "answer": "yes"}))
    refused = CliRunner().invoke(main, ["qa", "score", str(stray), "--questions", str(tmp_path / "qa.jsonl")])
    assert refused.exit_code == 2 and "no-such-question" in refused.output
