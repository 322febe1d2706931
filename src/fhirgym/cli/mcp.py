"""``fhirgym mcp``: the agents' tools served over MCP (stdio or streamable HTTP)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .._defaults import HOST
from ._group import main
from ._options import _families_option, _task_world, _world_options


@main.group("mcp")
def mcp_group() -> None:
    """Serve the agent tools over MCP (stdio for a client that spawns us, or streamable HTTP)."""


def _mcp_options(fn):
    """--transport/--host/--port/--read-only/--budget, the same for every MCP server."""
    options = [
        click.option("--transport", type=click.Choice(["stdio", "http"]), default="stdio", show_default=True),
        click.option("--host", default=HOST, show_default=True, help="HTTP only."),
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

    from ..mcp import build_server, serve_http
    from ..tools import episode_toolbox

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

    from ..tools import CODEACT_TOOLS, FHIR_TOOLS, SPEC_TOOLS

    with contextlib.redirect_stdout(sys.stderr):  # on stdio, stdout belongs to the protocol
        if url:
            from ..fhir import HttpClient

            client = HttpClient(url)
        else:
            world = _task_world(world_path, patients, world_seed)
            if task_id:
                from ..tasks import make_instance

                try:
                    client = make_instance(task_id, seed, world).open().client
                except KeyError as exc:
                    raise click.ClickException(str(exc.args[0])) from None
            else:
                from ..fhir import FhirServer, InProcessClient

                client = InProcessClient(FhirServer(world.snapshot.open(), world.spec), world.snapshot)
    tools = (CODEACT_TOOLS if codeact else ()) + FHIR_TOOLS + (SPEC_TOOLS if with_specs else ())
    _mcp_serve(tools, client, "fhirgym-fhir", transport, host, port, read_only, budget, structured,
               unsafe_python=unsafe_python)


@mcp_group.command("specs")
@_mcp_options
def mcp_specs(transport: str, host: str, port: int, read_only: bool, budget: int | None,
              structured: bool) -> None:
    """The FHIR R4 specification tools (official definitions; no FHIR server needed)."""
    from ..tools import SPEC_TOOLS

    _mcp_serve(SPEC_TOOLS, None, "fhirgym-specs", transport, host, port, read_only, budget, structured)


@mcp_group.command("memory")
@_mcp_options
@click.option("--memory", "memory_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A frozen memory directory (fhirgym memory train).")
def mcp_memory(transport: str, host: str, port: int, read_only: bool, budget: int | None, structured: bool,
               memory_dir: Path) -> None:
    """The memory tools (searchMemory, getMemoryTips, getMemoryStats) over a frozen memory."""
    import contextlib

    from ..memory import MemoryStoreError, open_frozen
    from ..tools import MEMORY_KEY, MEMORY_TOOLS

    with contextlib.redirect_stdout(sys.stderr):
        try:
            store = open_frozen(memory_dir)
        except MemoryStoreError as exc:
            raise click.ClickException(str(exc)) from None
    _mcp_serve(MEMORY_TOOLS, None, "fhirgym-memory", transport, host, port, read_only, budget, structured,
               extras={MEMORY_KEY: store})
