"""``fhirgym tasks``: list, show, check and paraphrase task families."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ._group import main
from ._options import _families_option, _seeds, _select_families, _task_world, _world_options


@main.group()
def tasks() -> None:
    """List, show and check the task families."""


@tasks.command("list")
@_families_option
@click.option("--tasks", "selector", default=None, help="Task selector (ids, globs, categories)  [default: all]")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per family.")
def tasks_list(selector: str | None, as_json: bool) -> None:
    """Every task family: id, category, difficulty, read/write, resource types."""
    fams = _select_families(selector, "all")
    rows = [{"id": f.id, "category": f.category, "difficulty": f.difficulty, "writes": f.writes,
             "resource_types": list(f.resource_types), "title": f.title} for f in fams]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'id':44} {'category':11} {'d':1}  {'r/w':3}  resource types")
    for f, r in zip(fams, rows, strict=True):
        click.echo(f"{r['id']:44} {r['category']:11} {r['difficulty']}  {f.access():3}  "
                   f"{', '.join(r['resource_types'])}")
    writes = sum(r["writes"] for r in rows)
    click.echo(f"{len(rows)} families, {writes} writing ({100 * writes / max(1, len(rows)):.0f} %)")


@tasks.command("show")
@_families_option
@click.argument("task_id")
@click.option("--seed", default=0, show_default=True)
@_world_options
def tasks_show(task_id: str, seed: int, world_path: Path | None, patients: int, world_seed: int) -> None:
    """One instance: prompt, params, frozen now, setup, gold answer and expected state change."""
    from ..tasks import make_instance

    inst = make_instance(task_id, seed, _task_world(world_path, patients, world_seed))
    click.echo(json.dumps(inst.describe(), indent=1, default=str))


@tasks.command("check")
@_families_option
@click.option("--tasks", "selector", default=None, help="Task selector  [default: all]")
@click.option("--seeds", default="20", show_default=True, help="N (seeds 0..N-1) or a list like 3,5 or 0-4.")
@click.option("--no-mutations", is_flag=True, help="Skip the mutation tests.")
@click.option("--table", is_flag=True, help="Print the per-family figures (nothing found, constant agent, gold variety).")
@_world_options
def tasks_check(selector: str | None, seeds: str, no_mutations: bool, table: bool, world_path: Path | None, patients: int,
                world_seed: int) -> None:
    """Run the reference, null and constant "nothing found" agents, the wrong mutations and the equivalent
    rewrites on every family × seed; non-zero exit on any problem."""
    from ..tasks import CheckSummary, check

    world = _task_world(world_path, patients, world_seed)
    fams = _select_families(selector, "all")
    seed_list = _seeds(seeds)

    def progress(row) -> None:
        if not row.ok:
            click.echo(f"PROBLEM {row.task_id} seed {row.seed}: {' | '.join(row.problems)}", err=True)

    rows = check(fams, seed_list, world, mutations=not no_mutations, progress=progress)
    summary = CheckSummary.of(rows, fams, len(seed_list))
    if table:
        click.echo("\n".join(summary.table()))
    for problem in summary.library_problems:
        click.echo(f"PROBLEM {problem}", err=True)
    click.echo("\n".join(summary.lines()))
    sys.exit(0 if summary.ok else 1)


@tasks.command("paraphrase")
@_families_option
@click.option("--tasks", "selector", default=None, help="Task selector  [default: all]")
@click.option("--seeds", default="1", show_default=True, help="N (seeds 0..N-1) or a list like 3,5 or 0-4.")
@click.option("--count", default=1, show_default=True, help="Paraphrases per instance (k = 1..COUNT).")
@click.option("--model", default=None, help="Model that writes them (default: the local 1.5B).")
@click.option("--base-url", default=None, envvar="OPENAI_BASE_URL")
@_world_options
def tasks_paraphrase(selector: str | None, seeds: str, count: int, model: str | None, base_url: str | None,
                     world_path: Path | None, patients: int, world_seed: int) -> None:
    """Generate and cache paraphrased prompts (checked: every entity, date and the format survive)."""
    from ..agents import DEFAULT_MODEL, make_backend
    from ..tasks import ParaphraseUnavailable, make_instance, paraphrase

    model = model or DEFAULT_MODEL
    backend = make_backend(model, base_url=base_url)

    def complete(messages: list[dict]) -> str:
        return backend.chat(messages, None, temperature=0.7, max_tokens=400).text

    world = _task_world(world_path, patients, world_seed)
    failed = 0
    for fam in _select_families(selector, "all"):
        for seed in _seeds(seeds):
            inst = make_instance(fam, seed, world)
            for k in range(1, count + 1):
                try:
                    new = paraphrase(inst, complete, model, k)
                    click.echo(f"{fam.id} s{seed} p{k}: {new.prompt.splitlines()[0][:100]}")
                except ParaphraseUnavailable as exc:
                    failed += 1
                    click.echo(f"REJECTED {exc}", err=True)
    sys.exit(1 if failed else 0)
