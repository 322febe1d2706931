"""Tool-call overhead: what the Tool layer and each MCP transport add to a FHIR request.

    .venv/bin/python bench/bench_tools.py [--world FILE] [-n 300]

Two calls on the 10-patient world: getResourceById (one Patient) and a small searchResources
(Patient?gender=female&_count=5). For each: the FHIR request through ``InProcessClient`` directly, the
same through ``Toolbox.call`` (target: ≤ 1 ms p50 more), over MCP in process (``Client(server)``),
over MCP stdio (the ``fhirgym mcp fhir`` CLI spawned; target ≤ 5 ms p50 more than in-process tools) and
over streamable HTTP (``serve_http`` in this process, and the CLI's HTTP server as a separate process, which
is how an external agent sees it). A trivial SDK tool over stdio gives the floor of this machine. Prints
p50/p95 in ms and ratios; the "text" row leaves out MCP's structured copy of the output, to show its cost.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

from fhirgym.fhir import FhirServer, InProcessClient, Snapshot
from fhirgym.mcp import build_server, serve_http
from fhirgym.tools import FHIR_TOOLS, Toolbox, ToolContext

SEARCH = {"gender": "female", "_count": "5"}
#: The SDK's own floor: a trivial tool over stdio, so figures can be read against this machine's state.
TRIVIAL_SERVER = """
from mcp.server import MCPServer
server = MCPServer("floor", log_level="WARNING")
@server.tool()
def add(a: int, b: int) -> int:
    return a + b
server.run("stdio")
"""


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _time_sync(fn: Callable[[], object], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def _time_async(fn: Callable[[], Awaitable[object]], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        await fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def _over_mcp(target: object, calls: dict[str, tuple[str, dict]], n: int) -> dict[str, list[float]]:
    async with Client(target) as client:  # type: ignore[arg-type]
        await client.list_tools()
        results = {}
        for label, (name, args) in calls.items():
            async def one(name: str = name, args: dict = args) -> None:
                res = await client.call_tool(name, args)
                assert not res.is_error, res.content[0].text
            results[label] = await _time_async(one, n)
        return results


def _cli() -> list[str]:
    script = shutil.which("fhirgym", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "fhirgym.cli"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=Path, default=None, help="world file (default: seed 42, 10 patients)")
    ap.add_argument("-n", type=int, default=300, help="timed calls per cell")
    opts = ap.parse_args()
    if opts.world is None:
        from fhirgym.world import build_world

        opts.world = build_world(seed=42, patients=10).path
    snapshot = Snapshot(opts.world)
    store = snapshot.open()
    client = InProcessClient(FhirServer(store), snapshot)
    box = Toolbox(FHIR_TOOLS, ToolContext(client))
    pid = client.search("Patient", {"_count": "1"}).body["entry"][0]["resource"]["id"]
    calls = {"getResourceById": ("getResourceById", {"resourceType": "Patient", "resourceId": pid}),
             "searchResources": ("searchResources", {"resourceType": "Patient", "params": SEARCH})}
    n = opts.n

    rows: dict[tuple[str, str], list[float]] = {}
    rows[("direct InProcessClient", "getResourceById")] = _time_sync(lambda: client.read("Patient", pid), n)
    rows[("direct InProcessClient", "searchResources")] = _time_sync(lambda: client.search("Patient", SEARCH), n)
    for label, (name, args) in calls.items():
        rows[("Toolbox.call", label)] = _time_sync(lambda name=name, args=args: box.call(name, args), n)
    box.calls.clear()

    for label, samples in anyio.run(_over_mcp, build_server(box, "bench"), calls, n).items():
        rows[("MCP in-process", label)] = samples
    for label, samples in anyio.run(_over_mcp, build_server(box, "bench", structured=False), calls, n).items():
        rows[("MCP in-process, text", label)] = samples  # without the structured copy of the output
    cmd = _cli()
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "mcp", "fhir", "--world", str(opts.world)],
                                   env=dict(os.environ))
    for label, samples in anyio.run(_over_mcp, params, calls, n).items():
        rows[("MCP stdio (CLI)", label)] = samples
    with serve_http(box) as handle:  # server thread and client share this process (and its GIL)
        for label, samples in anyio.run(_over_mcp, handle.url, calls, n).items():
            rows[("MCP HTTP serve_http", label)] = samples
    proc = subprocess.Popen([*cmd, "mcp", "fhir", "--transport", "http", "--port", "0", "--world", str(opts.world)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
    try:
        url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        for label, samples in anyio.run(_over_mcp, url, calls, n).items():
            rows[("MCP HTTP (CLI process)", label)] = samples
    finally:
        proc.terminate()
        proc.wait(10)
    floor = anyio.run(_over_mcp, StdioServerParameters(command=sys.executable, args=["-c", TRIVIAL_SERVER],
                                                       env=dict(os.environ)),
                      {"add": ("add", {"a": 1, "b": 2})}, n)["add"]
    store.close()

    print(f"world {opts.world.name}, {n} timed calls per cell (after 20 warm-up), ms; "
          f"Python {sys.version.split()[0]}, load avg {os.getloadavg()[0]:.1f}")
    head = f"{'path':<22} {'call':<16} {'p50':>7} {'p95':>7} {'+p50 vs direct':>15} {'x direct':>9} {'x Toolbox':>10}"
    print(head)
    print("-" * len(head))
    for (path, label), samples in rows.items():
        p50, p95 = statistics.median(samples), _pct(samples, 0.95)
        direct = statistics.median(rows[("direct InProcessClient", label)])
        tool = statistics.median(rows[("Toolbox.call", label)])
        print(f"{path:<22} {label:<16} {p50:>7.3f} {p95:>7.3f} {p50 - direct:>+15.3f} {p50 / direct:>9.1f} "
              f"{p50 / tool:>10.1f}")
    print(f"\nSDK floor on this machine now: a trivial tool (add) over stdio p50 {statistics.median(floor):.3f} ms, "
          f"p95 {_pct(floor, 0.95):.3f} ms")
    for label in calls:
        direct = statistics.median(rows[("direct InProcessClient", label)])
        tool = statistics.median(rows[("Toolbox.call", label)])
        stdio = statistics.median(rows[("MCP stdio (CLI)", label)])
        http = statistics.median(rows[("MCP HTTP (CLI process)", label)])
        print(f"{label}: Toolbox overhead {tool - direct:+.3f} ms p50 (target <= 1 ms: "
              f"{'ok' if tool - direct <= 1 else 'MISSED'}); stdio over in-process {stdio - tool:+.3f} ms "
              f"(target <= 5 ms: {'ok' if stdio - tool <= 5 else 'MISSED'}); HTTP over in-process "
              f"{http - tool:+.3f} ms")


if __name__ == "__main__":
    main()
