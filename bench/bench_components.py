"""Per-resource cost of each stage of a write, on Synthea data: where bulk-load time goes.

Prints resources/s and µs per resource for validation, index extraction, reference edges, record
preparation, SQLite writes (with and without the index rebuild) and whole loads with 1 and 2 workers.
Usage: ``python bench/bench_components.py [--patients 10] [--limit 10000]``
"""

from __future__ import annotations

import argparse
import sqlite3
import time

from bench_server import bench_data
from fhirgym.fhir import FhirServer, Store
from fhirgym.fhir._store import create_tables, insert_records
from fhirgym.world import flatten_bundles


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=10)
    ap.add_argument("--limit", type=int, default=10000)
    args = ap.parse_args()
    res = flatten_bundles(bench_data(args.patients))[: args.limit]
    server = FhirServer(Store())
    server.load(res[:300])  # compile validator and extractor tables first
    v, x = server.validator, server.extractor
    records = []
    ts = "2025-01-01T00:00:00.000Z"

    def insert_only() -> None:  # the tables alone, as a bulk worker fills its file
        conn = sqlite3.connect(":memory:", isolation_level=None)
        create_tables(conn)
        conn.execute("BEGIN")
        for k in range(0, len(records), 500):
            insert_records(conn, records[k : k + 500])
        conn.execute("COMMIT")

    def write() -> None:
        store = Store()
        with store.bulk():
            for k in range(0, len(records), 500):
                store.write(records[k : k + 500])

    stages = [
        ("validate", lambda: [v.validate(r) for r in res]),
        ("extract index rows", lambda: [x.extract(r) for r in res]),
        ("reference edges", lambda: [server._local_targets(r) for r in res]),
        ("record (meta+extract+edges)", lambda: records.extend(
            server._record(r["resourceType"], r["id"], 1, "PUT", dict(r), ts) for r in res)),
        ("SQLite inserts, tables only", insert_only),
        ("SQLite write + index rebuild", write),
        ("load(), 1 worker", lambda: FhirServer(Store()).load(res)),
        ("load(), 2 workers", lambda: FhirServer(Store()).load(res, workers=2)),
    ]
    print(f"{len(res)} Synthea resources")
    for name, fn in stages:
        dt = timed(fn)
        print(f"{name:32s} {len(res) / dt:10,.0f} resources/s {dt / len(res) * 1e6:8.1f} µs/resource")


if __name__ == "__main__":
    main()
