"""``fhirgym experiment``: run a plan of memory experiments, or say what it would take."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ._group import main
from ._options import _ray_option, _task_world, _world_options


@main.group("experiment")
def experiment_group() -> None:
    """The paper's matrix (models × configs × settings × runs) from one plan file (docs/MEMORY.md)."""


@experiment_group.command("run")
@click.argument("plan", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Experiment directory (not with --dry-run).")
@click.option("--parallel", default=None, type=int, help="Episodes at a time (default: the plan's).")
@click.option("--dry-run", is_flag=True,
              help="Run nothing: print the episodes, model calls, tokens, cost, wall time and the minimum "
                   "detectable effect of every paired comparison.")
@click.option("--prices", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Price table (TOML: [models.\"<model>\"] input/output per million tokens) for the cost figures.")
@click.option("--base-rate", type=float, default=None,
              help="Assumed baseline success (0-1) for the power figures (default: the plan's base_rate, else 0.5).")
@click.option("--measured", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Experiment or evaluation directory whose measured per-episode figures to use (repeatable).")
@click.option("--format", "fmt", type=click.Choice(["md", "json"]), default="md", show_default=True,
              help="Output of --dry-run.")
@_ray_option
@_world_options
def experiment_run(plan: Path, out: Path | None, parallel: int | None, dry_run: bool, prices: Path | None,
                   base_rate: float | None, measured: tuple[Path, ...], fmt: str, ray_address: str | None,
                   world_path: Path | None, patients: int, world_seed: int) -> None:
    """Train each needed memory once, evaluate every cell (resumable), write the report; or, with --dry-run,
    only say what that would take and what it could detect (docs/MEMORY.md)."""
    from ..memory import (
        EstimateError,
        ExperimentError,
        FigureTable,
        estimate,
        load_plan,
        load_prices,
        measured_figures,
        run_experiment,
    )

    if not dry_run and out is None:
        raise click.UsageError("--out DIR is required (except with --dry-run)")
    try:
        exp = load_plan(plan)
        if parallel:
            exp.parallel = parallel
        figures = FigureTable(measured_figures(list(measured)) if measured else None)
        table = load_prices(prices) if prices else None
    except (ExperimentError, EstimateError) as exc:
        raise click.ClickException(str(exc)) from None
    world = _task_world(world_path, patients, world_seed)
    try:
        expected = estimate(exp, figures=figures, prices=table, base_rate=base_rate, world=world)
    except ExperimentError as exc:
        raise click.ClickException(str(exc)) from None
    if dry_run:
        from ..analysis import render_estimate

        click.echo(json.dumps(expected, indent=1) if fmt == "json" else render_estimate(expected))
        return
    try:
        report = run_experiment(exp, out, world, log=lambda m: click.echo(m, err=True), ray=ray_address,
                                expected=expected)
    except ExperimentError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"report: {report}")
