"""Options and helpers that more than one command group uses: the world, task selection, seeds, Ray."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .._defaults import DEFAULT_PATIENTS, DEFAULT_SEED


def _world_options(fn):
    """--world FILE, or the cached seeded world of --patients/--world-seed (the same default everywhere)."""
    fn = click.option("--world", "world_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      envvar="FHIRGYM_WORLD", help="World file (default: the seeded world of --patients).")(fn)
    fn = click.option("--patients", default=DEFAULT_PATIENTS, show_default=True, help="Size of the default world.")(fn)
    return click.option("--world-seed", default=DEFAULT_SEED, show_default=True, help="Seed of the default world.")(fn)


def _task_world(world_path: Path | None, patients: int, world_seed: int):
    from ..tasks import TaskWorld
    from ..world import world_file

    return TaskWorld.open(world_file(world_path, seed=world_seed, patients=patients,
                                     announce=lambda text: click.echo(text, err=True)))


def _load_families(ctx, param, value: tuple[str, ...]) -> tuple[str, ...]:
    """--families pkg.module[,…]: import these modules (from the current directory or installed packages)
    so that their @register families join the registry before --tasks selects."""
    names = [n.strip() for v in value for n in v.split(",") if n.strip()]
    if names:
        import os

        from ..tasks import FamiliesUnavailable, load_families

        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: a module next to you is found
        try:
            ctx.meta["fhirgym.families"] = load_families(*names)
        except FamiliesUnavailable as exc:
            raise click.BadParameter(str(exc), ctx, param) from exc
    return tuple(names)


def _selector(selector: str | None, default: str) -> str:
    """--tasks as given; without it, the families --families loaded, else the command's default."""
    if selector:
        return selector
    loaded = click.get_current_context().meta.get("fhirgym.families")
    return ",".join(f.id for f in loaded) if loaded else default


def _select_families(selector: str | None, default: str) -> list:
    """--tasks resolved to families; a term that matches none is a usage error, never a traceback."""
    from ..tasks import select

    try:
        return select(_selector(selector, default))
    except KeyError as exc:
        raise click.BadParameter(exc.args[0], param_hint="'--tasks'") from None


def _families_option(fn):
    return click.option("--families", "families_modules", multiple=True, callback=_load_families,
                        expose_value=False, metavar="PKG.MODULE",
                        help="Load task families from these modules (comma-separated or repeated) besides the "
                             "installed ones (entry-point group fhirgym.tasks); without --tasks, select them.")(fn)


def _seeds(value: str) -> list[int]:
    """``--seeds`` everywhere: ``5`` → seeds 0..4; ``3,7`` or ``2-4`` → those seeds (tasks.parse_seeds)."""
    from ..tasks import parse_seeds

    try:
        return parse_seeds(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from None


def _ray_option(f):
    """``--ray [ADDRESS]``: episodes on a Ray cluster (docs/SCALE.md); bare: ray.init()'s own choice."""
    return click.option(
        "--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
        help="Run episodes on a Ray cluster (the ray extra): ADDRESS as ray.init takes it (auto, HOST:PORT, "
             "ray://HOST:PORT); bare --ray connects to the cluster this machine is part of, else starts one here. "
             "--parallel is then the episodes in flight over the whole cluster.")(f)
