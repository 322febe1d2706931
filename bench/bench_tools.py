"""Tool-call overhead: what the Tool layer and each MCP transport add to a FHIR request.

    .venv/bin/python bench/bench_tools.py [--world FILE] [-n 300]

Two calls on the 10-patient world: getResourceById (one Patient) and a small searchResources
(Patient?gender=female&_count=5). For each: the FHIR request through ``InProcessClient`` directly, the
same through ``Toolbox.call`` (target: ≤ 1 ms p50 more), over MCP in process (``Client(server)``),
over MCP stdio (the ``fhirgym mcp fhir`` CLI spawned; target ≤ 5 ms p50 more than in-process tools) and
over streamable HTTP (``serve_http`` in this process, and the CLI's HTTP server as a separate process, which
is how an external agent sees it). A trivial SDK tool over stdio gives the floor of this machine. Prints
p50/p95 in ms and ratios; "structured" rows add MCP's structured copy of the output (opt-in), to show its cost.
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

    def over_mcp(path: str, target: object) -> None:
        for label, samples in anyio.run(_over_mcp, target, calls, n).items():
            rows[(path, label)] = samples

    direct = {"getResourceById": lambda: client.read("Patient", pid),
              "searchResources": lambda: client.search("Patient", SEARCH)}
    for label, fn in direct.items():
        rows[("direct InProcessClient", label)] = _time_sync(fn, n)
    for label, (name, args) in calls.items():
        rows[("Toolbox.call", label)] = _time_sync(lambda name=name, args=args: box.call(name, args), n)
    box.calls.clear()

    over_mcp("MCP in-process", build_server(box, "bench"))
    over_mcp("MCP in-process, struct", build_server(box, "bench", structured=True))
    cmd = _cli()
    env = dict(os.environ)
    stdio_args = [*cmd[1:], "mcp", "fhir", "--world", str(opts.world)]
    over_mcp("MCP stdio (CLI)", StdioServerParameters(command=cmd[0], args=stdio_args, env=env))
    over_mcp("MCP stdio, structured", StdioServerParameters(command=cmd[0], args=[*stdio_args, "--structured"],
                                                            env=env))
    with serve_http(box) as handle:  # server thread and client share this process (and its GIL)
        over_mcp("MCP HTTP serve_http", handle.url)
    http_args = ["mcp", "fhir", "--transport", "http", "--port", "0", "--world", str(opts.world)]
    proc = subprocess.Popen([*cmd, *http_args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    try:
        over_mcp("MCP HTTP (CLI process)", proc.stdout.readline().strip())  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(10)
    trivial = StdioServerParameters(command=sys.executable, args=["-c", TRIVIAL_SERVER], env=env)
    floor = anyio.run(_over_mcp, trivial, {"add": ("add", {"a": 1, "b": 2})}, n)["add"]
    store.close()

    def p50(path: str, label: str) -> float:
        return statistics.median(rows[(path, label)])

    print(f"world {opts.world.name}, {n} timed calls per cell (after 20 warm-up), ms; "
          f"Python {sys.version.split()[0]}, load avg {os.getloadavg()[0]:.1f}")
    head = (f"{'path':<22} {'call':<16} {'p50':>7} {'p95':>7} {'+p50 vs direct':>15} {'x direct':>9} "
            f"{'x Toolbox':>10}")
    print(head)
    print("-" * len(head))
    for (path, label), samples in rows.items():
        mid, base = statistics.median(samples), p50("direct InProcessClient", label)
        tool = p50("Toolbox.call", label)
        print(f"{path:<22} {label:<16} {mid:>7.3f} {_pct(samples, 0.95):>7.3f} {mid - base:>+15.3f} "
              f"{mid / base:>9.1f} {mid / tool:>10.1f}")
    print(f"\nSDK floor on this machine now: a trivial tool (add) over stdio p50 "
          f"{statistics.median(floor):.3f} ms, p95 {_pct(floor, 0.95):.3f} ms")
    for label in calls:
        tool = p50("Toolbox.call", label)
        extra = tool - p50("direct InProcessClient", label)
        stdio = p50("MCP stdio (CLI)", label) - tool
        print(f"{label}: Toolbox overhead {extra:+.3f} ms p50 (target <= 1 ms: "
              f"{'ok' if extra <= 1 else 'MISSED'}); stdio over in-process {stdio:+.3f} ms (target <= 5 ms: "
              f"{'ok' if stdio <= 5 else 'MISSED'}; "
              f"with --structured {p50('MCP stdio, structured', label) - tool:+.3f}); "
              f"HTTP (CLI process) over in-process {p50('MCP HTTP (CLI process)', label) - tool:+.3f} ms")


if __name__ == "__main__":
    main()
