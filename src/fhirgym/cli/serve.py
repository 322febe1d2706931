"""``fhirgym serve`` and ``fhirgym fhir``: the embedded FHIR server over HTTP, and one request to a server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .._defaults import HOST
from ._group import main


@main.command()
@click.option("--host", default=HOST, show_default=True, envvar="FHIRGYM_HOST")
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

    from ..fhir import FhirServer, ServerConfig, Store, run_server

    config = ServerConfig(base_url=f"http://{host}:{port}/fhir", lenient_search=lenient,
                          referential_integrity=not no_referential_integrity, **_limits(limits))
    if demo:
        from ..world import world_file

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
    from ..fhir import FhirServer, HttpClient, InProcessClient, Store

    client = HttpClient(url) if url else InProcessClient(FhirServer(Store(base=base)))
    resp = client.request("GET", path)
    click.echo(json.dumps(resp.body, indent=2))
    sys.exit(0 if resp.status < 400 else 1)
