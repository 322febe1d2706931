"""The ``fhirgym`` command line: each subcommand is a thin call into the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


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
@click.option("--demo", is_flag=True, help="Serve a 10-patient seeded world (built and cached on first use).")
@click.option("--lenient", is_flag=True, help="Ignore unknown search parameters by default (strict otherwise).")
@click.option("--no-referential-integrity", is_flag=True, help="Accept references to resources that do not exist.")
@click.option("--admin", is_flag=True, help="Expose POST /admin/snapshot and /admin/reset (off by default).")
def serve(host: str, port: int, db: Path | None, base: Path | None, demo: bool, lenient: bool,
          no_referential_integrity: bool, admin: bool) -> None:
    """Run the embedded FHIR R4 server (base URL http://HOST:PORT/fhir)."""
    import uvicorn

    from .fhir import FhirServer, ServerConfig, Store, create_app

    if demo:
        from .world import build_world

        click.echo("preparing the demo world (10 patients; built once, then cached) ...", err=True)
        base = build_world(seed=42, patients=10).path
    store = Store(base=base, path=db)
    config = ServerConfig(base_url=f"http://{host}:{port}/fhir", lenient_search=lenient,
                          referential_integrity=not no_referential_integrity)
    server = FhirServer(store, config=config)
    counts = store.counts()
    click.echo(f"fhirgym FHIR R4 server on {config.base_url} ({sum(counts.values())} resources)", err=True)
    uvicorn.run(create_app(server, admin=admin), host=host, port=port, log_level="warning")


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


def _print_info(info) -> None:
    click.echo(f"world: {info.path}")
    if info.seed is not None:
        click.echo(f"seed {info.seed}, {info.patients} patients, anchor date {info.anchor}, "
                   f"generator v{info.generator_version}")
    click.echo(f"sha256 {info.sha256}")
    width = max((len(t) for t in info.counts), default=10)
    for rtype, n in sorted(info.counts.items(), key=lambda kv: (-kv[1], kv[0])):
        click.echo(f"  {rtype:<{width}}  {n:>8,}")
    click.echo(f"  {'total':<{width}}  {info.total:>8,}")


@world.command("build")
@click.option("--seed", default=42, show_default=True, type=int, envvar="FHIRGYM_SEED")
@click.option("--patients", default=100, show_default=True, type=int)
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
    _print_info(info)
    stages = ", ".join(f"{k} {v:.1f} s" for k, v in info.timings.items())
    click.echo(f"{'loaded from cache' if info.cached else 'built'} in {info.build_seconds:.1f} s"
               + (f" ({stages})" if stages else ""))


@world.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def world_show(path: Path) -> None:
    """Print a world's manifest and its resource counts per type."""
    from .world import world_info

    _print_info(world_info(path))


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


if __name__ == "__main__":
    main()
