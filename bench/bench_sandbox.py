"""Overhead of the python tool's sandbox: per call and per episode.

    .venv/bin/python bench/bench_sandbox.py [-n 50]

Per call (target ≤ 30 ms p50 for a trivial call): ``answer = 1``; the same with a 1 MB
``retrieved_resources`` input (FHIR Observations); and, to show what each layer costs, the trivial call
with fewer layers: the bootstrap in a plain process with rlimits only (what ``--unsafe-python`` falls back
to), plus bubblewrap, plus seccomp, then everything (the cgroups). The floor is ``python -I -S -c pass``
with no sandbox at all. Per episode: making a sandbox with its own workspace and closing it (workspace
removed), the first call in a fresh workspace, and the one-off machine probe. Prints p50/p95 in ms and the
load average, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import orjson

from bench_tools import _time_sync
from fhirgym.tools import Sandbox, SandboxLimits, _sandbox, sandbox_probe


def _row(label: str, samples: list[float]) -> None:
    p95 = statistics.quantiles(samples, n=20)[18] if len(samples) > 1 else samples[0]
    print(f"{label:<58} p50 {statistics.median(samples):7.1f} ms   p95 {p95:7.1f} ms   (n={len(samples)})")


def _resources(target_bytes: int) -> dict[str, list[dict]]:
    """FHIR Observations (glucose labs) adding up to about ``target_bytes`` of JSON."""
    obs, size, i = [], 0, 0
    while size < target_bytes:
        o = {"resourceType": "Observation", "id": f"obs-{i}", "status": "final",
             "code": {"coding": [{"system": "http://loinc.org", "code": "2339-0", "display": "Glucose"}]},
             "subject": {"reference": "Patient/p1"}, "effectiveDateTime": f"2024-01-{i % 28 + 1:02d}T08:00:00Z",
             "valueQuantity": {"value": 90 + i % 40, "unit": "mg/dL", "system": "http://unitsofmeasure.org",
                               "code": "mg/dL"}}
        obs.append(o)
        size += len(orjson.dumps(o)) + 1
        i += 1
    return {"Observation": obs}


class _Layers(Sandbox):
    """A sandbox restricted to some layers, to show what each costs (benchmark only)."""

    def __init__(self, layers: tuple[str, ...], **kw) -> None:
        super().__init__(**kw)
        self._layers = layers

    def protections(self) -> tuple[str, ...]:
        return self._layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=50, help="calls per row")
    args = ap.parse_args()
    t = time.perf_counter()
    p = sandbox_probe(refresh=True)
    print(f"probe (once per process): {(time.perf_counter() - t) * 1000:.1f} ms; available={p.available} "
          f"{p.missing or ''}")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    exe, _ = _sandbox._interpreter()
    _row("floor: python -I -S -c pass (no sandbox)",
         _time_sync(lambda: subprocess.run([exe, "-I", "-S", "-c", "pass"], check=True), args.n, 3))
    limits = SandboxLimits()
    for layers, label in ((("rlimits",), "bootstrap + rlimits (the --unsafe-python fallback)"),
                          (("bwrap", "rlimits"), "+ bubblewrap"),
                          (("bwrap", "seccomp", "rlimits"), "+ seccomp")):
        with _Layers(layers, limits=limits) as sb:
            _row(f"answer = 1: {label}", _time_sync(lambda sb=sb: sb.run("answer = 1"), args.n, 3))
    with Sandbox(limits=limits) as sb:
        _row("answer = 1: full sandbox (+ pids and memory cgroups)", _time_sync(lambda: sb.run("answer = 1"), args.n, 3))
        _row("print('hello'), no answer: full sandbox", _time_sync(lambda: sb.run("print('hello')"), args.n, 3))
        res = _resources(1 << 20)
        size = len(orjson.dumps(res))
        code = "answer = len(retrieved_resources['Observation'])"
        r = sb.run(code, {"retrieved_resources": res})
        assert r.ok and r.answer == len(res["Observation"]), r
        _row(f"1 MB retrieved_resources ({size / 1e6:.2f} MB, {r.answer} Observations): full",
             _time_sync(lambda: sb.run(code, {"retrieved_resources": res}), args.n, 3))
    print()
    state: dict[str, Sandbox] = {}

    def setup() -> None:
        state["sb"] = Sandbox(limits=limits)

    def teardown() -> None:
        state["sb"].close()

    def first_call() -> None:
        with Sandbox(limits=limits) as sb:
            sb.write_file("Observation.json", orjson.dumps(res["Observation"][:100]))
            sb.run("import json\nanswer = len(json.load(open('Observation.json')))")

    setups, teardowns = [], []
    for _ in range(args.n):
        t = time.perf_counter()
        setup()
        setups.append((time.perf_counter() - t) * 1000)
        state["sb"].run("open('scratch.txt', 'w').write('x' * 1000)")
        t = time.perf_counter()
        teardown()
        teardowns.append((time.perf_counter() - t) * 1000)
    _row("episode setup: Sandbox() with its own workspace", setups)
    _row("episode teardown: close() (workspace with a file removed)", teardowns)
    _row("episode: setup + write an input file + first call + teardown", _time_sync(first_call, args.n, 3))
    print(f"\npython {sys.version.split()[0]}, bwrap {p.bwrap}, cgroups pids={p.cgroup_pids} "
          f"memory={p.cgroup_memory}")


if __name__ == "__main__":
    main()
