"""``fhirgym qa``: question sets, their templates, scoring and judge agreement."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .._defaults import QA_PER_TEMPLATE
from ._group import main
from ._options import _task_world, _world_options


@main.group("qa")
def qa_group() -> None:
    """Question answering over a world: build question sets, list templates, score answers."""


@qa_group.command("build")
@click.option("--per-template", default=55, show_default=True,
              help="Questions per template (70/15/15 over train/valid/test).")
@click.option("--seed", default=0, show_default=True, help="Fixes every choice: splits, parameters, phrasings.")
@click.option("--templates", "only", default=None, help="Comma-separated template ids (default: all).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="QA.jsonl to write.")
@_world_options
def qa_build(per_template: int, seed: int, only: str | None, out: Path, world_path: Path | None, patients: int,
             world_seed: int) -> None:
    """Generate questions with computed gold answers and gold resource ids; print counts per template and split."""
    import time

    from ..tasks.qa import build_questions, count_table, write_questions

    world = _task_world(world_path, patients, world_seed)
    started = time.perf_counter()
    questions = build_questions(world, per_template=per_template, seed=seed,
                                templates=only.split(",") if only else None)
    seconds = time.perf_counter() - started
    write_questions(questions, out)
    click.echo(count_table(questions))
    click.echo(f"{len(questions)} questions in {out} ({seconds:.1f} s including reading the world, "
               f"{len(questions) / seconds:.0f} questions/s)")


@qa_group.command("templates")
def qa_templates() -> None:
    """Every question template: id, answer shape, resource types of its gold ids, first phrasing."""
    from ..tasks.qa import TEMPLATES

    for t in TEMPLATES:
        click.echo(f"{t.id:24} {t.shape:13} {','.join(t.types):30} {t.texts[0]}")
    click.echo(f"{len(TEMPLATES)} templates")


def _answer_rows(answers_file: Path) -> list[dict]:
    """Answer lines (``id``, ``answer``, optional ``retrieved``) or an eval run's result lines (``qa``,
    ``final_answer``): both are read the same way, so a run can be scored and judged as it stands."""
    rows = []
    for n, line in enumerate(answers_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if isinstance(row.get("qa"), dict):
            row = {"id": row["qa"]["question_id"], "answer": row.get("final_answer")}
        if "id" not in row:
            raise click.UsageError(f"{answers_file}:{n}: neither an answer line (id, answer) nor a QA result line")
        rows.append(row)
    return rows


def _questions_by_id(questions_file: Path | None, world_path: Path | None, patients: int, world_seed: int,
                     per_template: int, rows: list[dict]) -> dict:
    from ..tasks.qa import build_questions, read_questions

    if questions_file is not None:
        questions = read_questions(questions_file)
    else:  # the set `fhirgym eval --track qa` builds without --questions
        questions = build_questions(_task_world(world_path, patients, world_seed), per_template)
    by_id = {q.id: q for q in questions}
    unknown = sorted({r["id"] for r in rows} - by_id.keys())
    if unknown:
        raise click.UsageError(f"{len(unknown)} answers are to questions not in the question set "
                               f"(first: {unknown[0]}); pass the --questions file or world options the run used")
    return by_id


def _qa_source_options(fn):
    fn = click.option("--per-template", default=QA_PER_TEMPLATE, show_default=True,
                      help="Without --questions: the set eval builds with this --per-template.")(fn)
    fn = _world_options(fn)
    return click.option("--questions", "questions_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        default=None, help="The QA.jsonl the answers are to (default: the set eval builds).")(fn)


@qa_group.command("score")
@click.argument("answers_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_qa_source_options
def qa_score(answers_file: Path, questions_file: Path | None, world_path: Path | None, patients: int,
             world_seed: int, per_template: int) -> None:
    """Score ANSWERS (JSON lines: id, answer, optional retrieved {type: [ids]}; or an eval run's
    results.jsonl) with the deterministic matcher."""
    import math
    from collections import defaultdict

    from ..tasks.qa import retrieval_scores, score_answer

    rows = _answer_rows(answers_file)
    by_id = _questions_by_id(questions_file, world_path, patients, world_seed, per_template, rows)
    per_shape: dict[str, list[bool]] = defaultdict(list)
    precision, recall = [], []
    for row in rows:
        q = by_id[row["id"]]
        per_shape[q.shape].append(score_answer(q, row.get("answer")).correct)
        if "retrieved" in row:
            p, r = retrieval_scores(q.gold_ids, row["retrieved"])
            precision += [] if math.isnan(p) else [p]
            recall += [] if math.isnan(r) else [r]
    every = [x for v in per_shape.values() for x in v]
    for shape, hits in sorted(per_shape.items()):
        click.echo(f"{shape:14} {sum(hits):5}/{len(hits):<5} {100 * sum(hits) / len(hits):5.1f} %")
    click.echo(f"{'all':14} {sum(every):5}/{len(every):<5} {100 * sum(every) / max(1, len(every)):5.1f} %")
    if precision or recall:
        click.echo(f"retrieval precision {sum(precision) / max(1, len(precision)):.3f}, "
                   f"recall {sum(recall) / max(1, len(recall)):.3f}")


@qa_group.command("judge-agreement")
@click.argument("answers_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_qa_source_options
@click.option("--model", default="local/qwen2.5-coder-1.5b", show_default=True, help="The judge's backend.")
@click.option("--base-url", default=None, envvar="OPENAI_BASE_URL", help="Endpoint of an OpenAI-compatible server.")
@click.option("--cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Verdict cache (JSON lines; default: ANSWERS.judge-cache.jsonl).")
def qa_judge_agreement(answers_file: Path, questions_file: Path | None, world_path: Path | None, patients: int,
                       world_seed: int, per_template: int, model: str, base_url: str | None,
                       cache: Path | None) -> None:
    """The LLM judge's agreement, precision and recall against the deterministic matcher on ANSWERS
    (JSON lines: id, answer; or an eval run's results.jsonl)."""
    from ..agents import make_backend
    from ..runner import LlmJudge, agreement, gold_text
    from ..tasks.qa import score_answer

    rows = _answer_rows(answers_file)
    by_id = _questions_by_id(questions_file, world_path, patients, world_seed, per_template, rows)
    judge = LlmJudge(make_backend(model, base_url=base_url),
                     cache or answers_file.with_suffix(".judge-cache.jsonl"))
    pairs = []
    for row in rows:
        q = by_id[row["id"]]
        verdict = judge.judge(q.prompt(), gold_text(q.answer, q.no_answer), row.get("answer"))
        pairs.append((score_answer(q, row.get("answer")).correct, verdict.correct))
    click.echo(agreement(pairs).lines())
