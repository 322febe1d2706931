"""``fhirgym eval``: evaluate an agent on tasks into a result directory."""

from __future__ import annotations

from pathlib import Path

import click

from .._defaults import AGENT, CONFIG, QA_PER_TEMPLATE, TRACK_NAMES
from ._group import main
from ._options import _families_option, _ray_option, _seeds, _selector, _task_world, _world_options


@main.command("eval")
@_families_option
@click.option("--agent", default=AGENT, show_default=True,
              help="react | codeact | reference | null | nothing-found | guess | cmd:\"PROGRAM ARGS\" | "
                   "package.module:Class")
@click.option("--model", default=None, help="local/qwen2.5-coder-1.5b (default), local/qwen2.5-coder-0.5b, "
              "local/PATH.gguf, local/MODEL+ADAPTER.gguf (a LoRA adapter of rl export --adapter), openai/NAME, "
              "openai-compatible/NAME (with --base-url)")
@click.option("--base-url", default=None, envvar="OPENAI_BASE_URL", help="Endpoint of an OpenAI-compatible server.")
@click.option("--tasks", "selector", default=None,
              help="Task selector: ids, globs (scheduling.*), categories, reads/writes, d1-d3, split:train/split:eval, all, default  "
                   "[default: default]")
@click.option("--seeds", default="1", show_default=True, help="N (seeds 0..N-1) or a list like 3,5 or 0-4.")
@click.option("--runs", default=1, show_default=True, help="Repetitions of every instance.")
@click.option("--config", default=CONFIG, show_default=True,
              help="A registered configuration: baseline (FHIR tools), specs (+ spec tools), codeact (fhir_query, "
                   "fhir_get, python, finish + FHIR tools), memory, memory-specs, memory-specs+specs (with "
                   "--memory), or one a layer or package registers.")
@click.option("--setting", default="default", show_default=True, help="Label of the experiment setting.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Output directory.")
@click.option("--parallel", default=1, show_default=True, help="Episodes at a time.")
@click.option("--resume", is_flag=True, help="Skip episodes already in OUT/results.jsonl.")
@click.option("--max-iterations", default=None, type=int,
              help="Model turns per episode (default: 12 for codeact, else 15).")
@click.option("--budget", default=None, type=int,
              help="Characters per tool output (default: 4000 for a local model, else 12000).")
@click.option("--unsafe-python", is_flag=True,
              help="Let the python tool run code where the sandbox cannot be fully set up (no bubblewrap, "
                   "cgroups or seccomp), with the layers that work; without it, python refuses there.")
@click.option("--paraphrases", default=0, show_default=True, help="Also run the first K cached paraphrases.")
@click.option("--no-report", is_flag=True, help="Do not write OUT/report.html at the end.")
@click.option("--sealed", is_flag=True,
              help="Derive instance seeds from a secret drawn now; run.json records it when the run ends.")
@click.option("--secret", default=None, help="Replay (or resume) a sealed run with the secret its run.json recorded.")
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True,
              help="action: the task families; qa: questions about one patient (--tasks selects templates, "
                   "seed k is a template's k-th question of --split).")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default="valid", show_default=True,
              help="QA: the questions' split.")
@click.option("--questions", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="QA: a question file from `fhirgym qa build` (default: built from the world).")
@click.option("--per-template", default=QA_PER_TEMPLATE, show_default=True,
              help="QA without --questions: questions per template.")
@click.option("--memory", "memory_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="A frozen memory (fhirgym memory train) for --config memory, memory-specs or memory-specs+specs.")
@click.option("--memory-mode", type=click.Choice(["tools", "prompt"]), default="tools", show_default=True,
              help="tools: the agent calls searchMemory/getMemoryTips; prompt: the top lessons go into the system "
                   "prompt under a token budget.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=None,
              help="openai/ and openai-compatible/ models: requests per model call at most, retries included "
                   "(429, 5xx, timeouts)  [default: 8]")
@click.option("--retry-budget", type=click.FloatRange(min=0), default=None,
              help="... and seconds of waiting between them per call, Retry-After honoured; then the episode is "
                   "an infrastructure error  [default: 600]")
@_ray_option
@_world_options
def eval_cmd(agent: str, model: str | None, base_url: str | None, selector: str, seeds: str, runs: int, config: str,
             setting: str, out: Path, parallel: int, resume: bool, max_iterations: int | None,
             budget: int | None, unsafe_python: bool, paraphrases: int, no_report: bool, sealed: bool,
             secret: str | None, track: str, split: str, questions: Path | None, per_template: int,
             memory_dir: Path | None, memory_mode: str, max_attempts: int | None, retry_budget: float | None,
             ray_address: str | None, world_path: Path | None, patients: int, world_seed: int) -> None:
    """Evaluate an agent on tasks: one isolated store per episode, results.jsonl + transcripts + report."""
    import time

    from ..runner import EvalError, EvalSpec, progress_line, run_eval, summary

    if memory_dir is not None:
        from ..memory import MemoryStoreError, bind

        try:
            bind(config, memory_dir, memory_mode)
        except (MemoryStoreError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None

    spec = EvalSpec(out=out, agent=agent, model=model, base_url=base_url, tasks=_selector(selector, "default"), seeds=_seeds(seeds),
                    runs=runs, config=config, setting=setting, parallel=parallel, resume=resume,
                    max_iterations=max_iterations, budget=budget, unsafe_python=unsafe_python,
                    paraphrases=paraphrases, sealed=sealed, secret=secret, track=track, split=split,
                    questions=questions, per_template=per_template, ray=ray_address, max_attempts=max_attempts,
                    retry_budget=retry_budget)
    world = _task_world(world_path, patients, world_seed)
    started = time.perf_counter()
    counts: dict[str, int] = {}

    def progress(line: dict, finished: int, total: int) -> None:
        click.echo(progress_line(line, finished, total, started, counts), nl=finished == total, err=True)

    try:
        results = run_eval(spec, world, progress, log=lambda m: click.echo(m, err=True))
    except (EvalError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"\n{len(results)} episodes in {out} ({time.perf_counter() - started:.0f} s)")
    click.echo(summary(results))
    if not no_report:
        from ..analysis import write_report

        path = write_report([out], out / "report.html")
        click.echo(f"report: {path}")
