"""``fhirgym report``: the report of one or more result directories."""

from __future__ import annotations

from pathlib import Path

import click

from ._group import main


@main.command("report")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="File (or existing directory) to write; default: DIR/report.<format> of the first DIR.")
@click.option("--format", "fmt", type=click.Choice(["html", "md", "json"]), default="html", show_default=True)
@click.option("--bootstrap", "n_boot", default=2000, show_default=True, type=int,
              help="Bootstrap resamples for the paired comparisons' confidence intervals.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the bootstrap.")
def report_cmd(dirs: tuple[Path, ...], out: Path | None, fmt: str, n_boot: int, seed: int) -> None:
    """Write the analysis report of result directories (HTML with plots and transcripts, Markdown or JSON)."""
    from ..analysis import ResultsError, write_report

    try:
        path = write_report(list(dirs), out or dirs[0], fmt, n_boot=n_boot, seed=seed)
    except ResultsError as err:
        raise click.ClickException(str(err)) from err
    click.echo(str(path))
