"""Overhead of the python tool's sandbox: per call and per episode.

    .venv/bin/python bench/bench_sandbox.py [-n 50]

Per call (target ≤ 30 ms p50 for a trivial call): ``answer = 1``, ``print``, and ``answer = 1`` with a
1 MB ``retrieved_resources`` input (FHIR Observations), in the default mode (the episode's bwrap sandbox
and zygote started once, a forked process per call); then the same trivial call with bwrap and an
interpreter started per call (``zygote=False``), and as the ``--unsafe-python`` fallback would run it
(a plain process with rlimits only). The floor is ``python -I -S -c pass`` with no sandbox at all, to read
the figures against this machine's state. Per episode: making a sandbox with its own workspace, its
first call (which starts bwrap and the zygote), and closing it. Prints p50/p95 in ms and the load average,
since the machine may be shared.
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
    limits = SandboxLimits()
    res = _resources(1 << 20)
    code = "answer = len(retrieved_resources['Observation'])"
    _row("floor: python -I -S -c pass (no sandbox)",
         _time_sync(lambda: subprocess.run([exe, "-I", "-S", "-c", "pass"], check=True), args.n, 3))
    with Sandbox(limits=limits) as sb:
        _row("answer = 1 (zygote per episode: the default)", _time_sync(lambda: sb.run("answer = 1"), args.n, 3))
        _row("print('hello'), no answer", _time_sync(lambda: sb.run("print('hello')"), args.n, 3))
        r = sb.run(code, {"retrieved_resources": res})
        assert r.ok and r.answer == len(res["Observation"]), r
        _row(f"1 MB retrieved_resources ({len(orjson.dumps(res)) / 1e6:.2f} MB, {r.answer} Observations)",
             _time_sync(lambda: sb.run(code, {"retrieved_resources": res}), args.n, 3))
    with Sandbox(limits=limits, zygote=False) as sb:
        _row("answer = 1, bwrap + interpreter per call (zygote=False)",
             _time_sync(lambda: sb.run("answer = 1"), args.n, 3))
    with _Layers(("rlimits",), limits=limits, unsafe=True) as sb:
        _row("answer = 1, plain process + rlimits (--unsafe-python fallback)",
             _time_sync(lambda: sb.run("answer = 1"), args.n, 3))
    print()
    setups, firsts, teardowns = [], [], []
    for _ in range(args.n):
        t0 = time.perf_counter()
        sb = Sandbox(limits=limits)
        t1 = time.perf_counter()
        sb.write_file("Observation.json", orjson.dumps(res["Observation"][:100]))
        sb.run("import json\nanswer = len(json.load(open('Observation.json')))")
        t2 = time.perf_counter()
        sb.close()
        t3 = time.perf_counter()
        setups.append((t1 - t0) * 1000)
        firsts.append((t2 - t1) * 1000)
        teardowns.append((t3 - t2) * 1000)
    _row("episode setup: Sandbox() with its own workspace", setups)
    _row("episode's first call: starts bwrap + zygote (input file, json)", firsts)
    _row("episode teardown: close() (zygote, cgroups, workspace)", teardowns)
    print(f"\npython {sys.version.split()[0]}, bwrap {p.bwrap}, cgroups pids={p.cgroup_pids} "
          f"memory={p.cgroup_memory}")


if __name__ == "__main__":
    main()
