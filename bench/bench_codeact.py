"""What the CodeAct tools add on top of the sandbox: per python call, per in-sandbox FHIR call, per fetch.

    .venv/bin/python bench/bench_codeact.py [-n 30] [--patients 10]

On one ``records.find_patient`` episode (``--config codeact``) of the demo world: ``fhir_query`` of one
patient's Observations (every page, merged into the workspace); the ``python`` tool with ``answer = 1``
on an empty workspace and with that patient's Observations as ``retrieved_resources``, next to a bare
``Sandbox.run`` of the same code (the difference is the tool: the RPC pipes and thread, the prelude, the
inputs); and one in-sandbox ``read_resource`` round trip (20 per call, so the interpreter's start-up
divides out), which runs as a checked ``getResourceById`` of the episode. Per episode: ``reset`` +
``close`` with and without a workspace. Prints p50/p95 in ms and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from fhirgym.env import Episode
from fhirgym.tasks import TaskWorld, make_instance
from fhirgym.tools import Sandbox
from fhirgym.world import build_world


def _row(label: str, samples: list[float], per: int = 1) -> None:
    samples = [s / per for s in samples]
    p95 = statistics.quantiles(samples, n=20)[18] if len(samples) > 1 else samples[0]
    print(f"{label:<70} p50 {statistics.median(samples):7.2f} ms   p95 {p95:7.2f} ms   (n={len(samples)})")


def _timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--patients", type=int, default=10)
    args = ap.parse_args()
    world = TaskWorld.open(build_world(seed=42, patients=args.patients).path)
    inst = make_instance("records.find_patient", 0, world)
    print(f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")

    def step(ep: Episode, name: str, **arguments):
        call = ep.step({"name": name, "arguments": arguments})
        assert call.error is None, call.output
        return call

    def episode(config: str) -> None:
        ep = Episode(inst, config)
        ep.reset()
        ep.close()

    _row("episode reset + close, baseline (no workspace)", _timed(lambda: episode("baseline"), args.n))
    _row("episode reset + close, codeact (workspace made, removed)", _timed(lambda: episode("codeact"), args.n))
    with Episode(inst, "codeact") as ep, Sandbox() as bare:
        ep.reset()
        found = step(ep, "searchResources", resourceType="Observation", params={"_count": "1"})
        pid = found.output["resources"][0]["subject"]["reference"].split("/")[-1]
        _row("python tool, answer = 1, empty workspace", _timed(lambda: step(ep, "python", code="answer = 1"), args.n))
        _row("bare Sandbox.run, answer = 1", _timed(lambda: bare.run("answer = 1"), args.n))
        fetch = _timed(lambda: step(ep, "fhir_query", resource_type="Observation", patient_id=pid), args.n)
        n_obs = len(ep.workspace.resources["Observation"])
        _row(f"fhir_query Observation, one patient ({n_obs} resources, re-fetch merge)", fetch)
        inputs = {"retrieved_resources": ep.workspace.retrieved()}
        _row(f"python tool, answer = 1, {n_obs} Observations in the workspace",
             _timed(lambda: step(ep, "python", code="answer = 1"), args.n))
        _row(f"bare Sandbox.run, answer = 1, the same {n_obs} Observations",
             _timed(lambda: bare.run("answer = 1", inputs), args.n))
        code = f"for _ in range(20):\n    read_resource('Patient', {pid!r})\nanswer = 1"
        with_reads = _timed(lambda: step(ep, "python", code=code), args.n)
        plain = _timed(lambda: step(ep, "python", code="for _ in range(20):\n    pass\nanswer = 1"), args.n)
        rpc = [a - b for a, b in zip(with_reads, plain, strict=True)]
        _row("in-sandbox read_resource round trip (per call, 20 per python call)", rpc, per=20)


if __name__ == "__main__":
    main()
