"""``fhirgym world``: build, show, check and import synthetic worlds."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .._defaults import DEFAULT_PATIENTS, DEFAULT_SEED
from ._group import main


@main.group()
def world() -> None:
    """Build, inspect and import synthetic worlds."""


def _print_info(info, digest: bool = True) -> None:
    click.echo(f"world: {info.path}")
    if info.seed is not None:
        click.echo(f"seed {info.seed}, {info.patients} patients, anchor date {info.anchor}, "
                   f"generator v{info.generator_version}")
    if digest:  # `world show` prints it; a build does not spend 6 s hashing a 100-patient file
        click.echo(f"sha256 {info.sha256}")
    width = max((len(t) for t in info.counts), default=10)
    for rtype, n in sorted(info.counts.items(), key=lambda kv: (-kv[1], kv[0])):
        click.echo(f"  {rtype:<{width}}  {n:>8,}")
    click.echo(f"  {'total':<{width}}  {info.total:>8,}")


@world.command("build")
@click.option("--seed", "--world-seed", "seed", default=DEFAULT_SEED, show_default=True, type=int,
              envvar="FHIRGYM_SEED", help="The world's seed (--world-seed, as the other commands call it).")
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True, type=int)
@click.option("--anchor-date", default=None, help="The world's 'today' (YYYY-MM-DD); default 2025-06-02.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Where to write the world file.")
@click.option("--no-cache", is_flag=True, help="Rebuild even if this world is cached.")
@click.option("--workers", default=2, show_default=True, type=int, help="Processes for validation/indexing.")
def world_build(seed: int, patients: int, anchor_date: str | None, out: Path | None, no_cache: bool,
                workers: int) -> None:
    """Build a seeded world (Synthea + generators), validated, as one base file (cached)."""
    from ..world import DEFAULT_ANCHOR, WorldBuildError, build_world

    try:
        info = build_world(seed, patients, anchor_date or DEFAULT_ANCHOR, out, use_cache=not no_cache,
                           workers=workers)
    except WorldBuildError as err:
        click.echo(err.report.summary(limit=50), err=True)
        sys.exit(1)
    _print_info(info, digest=False)
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in info.timings.items())
    click.echo(f"{'loaded from cache' if info.cached else 'built'} in {info.build_seconds:.1f} s"
               + (f" ({stages})" if stages else ""))


@world.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def world_show(path: Path) -> None:
    """Print a world's manifest and its resource counts per type."""
    from ..world import world_info

    _print_info(world_info(path))


@world.command("check")
@click.argument("path", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--seed", "--world-seed", "seed", default=DEFAULT_SEED, show_default=True, type=int,
              envvar="FHIRGYM_SEED", help="The world's seed (--world-seed, as the other commands call it).")
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True, type=int)
def world_check(path: Path | None, seed: int, patients: int) -> None:
    """Validate every resource of a world as a write would (FHIRPath invariants included); exit 1 on any
    error. Without PATH: the (cached) world of --seed and --patients."""
    import time

    from ..world import check_world, world_file

    path = world_file(path, seed=seed, patients=patients)
    t = time.perf_counter()
    report = check_world(path)
    click.echo(f"{path}: {report.summary(limit=50)} ({time.perf_counter() - t:.1f} s)")
    sys.exit(0 if report.ok else 1)


@world.command("import")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--workers", default=2, show_default=True, type=int)
def world_import(paths: tuple[Path, ...], out: Path, workers: int) -> None:
    """Build a world from FHIR Bundles (.json) or NDJSON files (e.g. your own Synthea output)."""
    from ..world import import_world

    info, report = import_world(list(paths), out, workers)
    click.echo(report.summary(limit=50))
    if info is None:
        sys.exit(1)
    _print_info(info)
