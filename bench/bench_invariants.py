"""Cost per write of the spec rules (issue 23): the FHIRPath invariants on and off, on world resources.

Prints µs per resource for validation alone and for whole single writes (``FhirServer.update``: validate,
index, store) with ``ServerConfig.invariants`` on and off, over a sample of a built world's resources
(every type, in the world's proportions), then the types whose invariants cost most. Also the read side
of exact decimals: ``loads_json`` (orjson, plus the exact parser when a number needs it) against plain
``orjson.loads`` on the same stored bytes.
Usage: ``python bench/bench_invariants.py [--patients 10] [--every 4] [--writes 3000]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import orjson

from fhirgym.fhir import FhirServer, ServerConfig, Store, loads_json
from fhirgym.world import build_world


def sample(patients: int, every: int) -> list[bytes]:
    store = Store(base=build_world(42, patients).path)
    try:
        return [data for n, (_, _, data) in enumerate(store.iter_current()) if n % every == 0]
    finally:
        store.close()


def per_item(fn, items, repeat: int = 3) -> float:
    """Best of ``repeat`` runs, µs per item."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for x in items:
            fn(x)
        best = min(best, time.perf_counter() - t)
    return best / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=10)
    ap.add_argument("--every", type=int, default=4, help="take every N-th resource of the world")
    ap.add_argument("--writes", type=int, default=3000, help="single writes timed per setting")
    args = ap.parse_args()
    raw = sample(args.patients, args.every)
    resources = [orjson.loads(d) for d in raw]
    print(f"{len(resources):,} resources of the {args.patients}-patient world (every {args.every}th)")

    v = FhirServer(Store()).validator
    for r in resources:  # compile every table and invariant first
        v.validate(r)
    on = per_item(v.validate, resources)
    off = per_item(lambda r: v.validate(r, False), resources)
    print(f"validate           invariants off {off:7.1f} µs   on {on:7.1f} µs   (+{on - off:.1f} µs, x{on / off:.2f})")

    writes = resources[: args.writes]
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    for flag in (False, True, False, True, False, True):  # interleaved: a busy machine hits both alike
        server = FhirServer(Store(), config=ServerConfig(referential_integrity=False, invariants=flag))
        times = []
        for r in writes:
            t = time.perf_counter()
            server.update(r["resourceType"], r["id"], r)
            times.append(time.perf_counter() - t)
        server.store.close()
        runs[flag].append(sorted(times))
    for flag in (False, True):
        best = min(runs[flag], key=statistics.fmean)  # the least disturbed of three runs
        print(f"single write       invariants {'on ' if flag else 'off'} mean {statistics.fmean(best) * 1e6:7.1f} µs"
              f"   p50 {best[len(best) // 2] * 1e6:7.1f} µs   p95 {best[int(len(best) * 0.95)] * 1e6:7.1f} µs"
              f"   ({len(best):,} writes, best of 3 runs)")

    by_type: dict[str, list[dict]] = defaultdict(list)
    for r in resources:
        by_type[r["resourceType"]].append(r)
    extra = {t: per_item(v.validate, rs) - per_item(lambda r: v.validate(r, False), rs) for t, rs in by_type.items()}
    print("invariant cost by type (µs per resource, count in sample):")
    for t, us in sorted(extra.items(), key=lambda kv: -kv[1] * len(by_type[kv[0]]))[:8]:
        print(f"  {t:<26} {us:7.1f} µs  x {len(by_type[t]):>5}")

    exact = per_item(loads_json, raw)
    plain = per_item(orjson.loads, raw)
    print(f"read parse         orjson.loads {plain:6.1f} µs   loads_json {exact:6.1f} µs  (exact decimals kept)")


if __name__ == "__main__":
    main()
