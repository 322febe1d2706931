"""Per-resource cost of each stage of a write, on Synthea data: where bulk-load time goes.

Prints resources/s and µs per resource for validation, index extraction, reference edges, record
preparation, SQLite writes (with and without the index rebuild), SQLite's own part of a multi-worker
load (the rows copied in and indexed inside SQLite, no Python per row) and whole loads with 1 and 2
workers; then what a target rate leaves for the Python stages once SQLite's serial part is paid.
Usage: ``python bench/bench_components.py [--patients 10] [--limit 10000]``
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from bench_server import bench_data
from fhirgym.fhir import FhirServer, Store
from fhirgym.fhir._store import create_tables, insert_records
from fhirgym.fhir._write import local_targets, record
from fhirgym.world import flatten_bundles


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=10)
    ap.add_argument("--limit", type=int, default=10000)
    ap.add_argument("--target", type=int, default=10000, help="resources/s the budget line is computed for")
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

    scratch = Path(tempfile.mkdtemp(prefix="fhirgym-floor-")) / "rows.db"

    def rows_file() -> None:  # what one bulk worker leaves: every row, in a file, no indexes
        conn = sqlite3.connect(scratch, isolation_level=None)
        conn.execute("PRAGMA journal_mode=OFF")
        create_tables(conn)
        conn.execute("BEGIN")
        insert_records(conn, records)
        conn.execute("COMMIT")
        conn.close()

    def sqlite_alone() -> None:  # the parent's serial part of a multi-worker load: copy in, build indexes
        conn = sqlite3.connect(scratch)
        ranges = {t: (1, n) for t, in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                  if (n := conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0])}
        conn.close()
        Store().copy_in([(scratch, ranges)])

    def write() -> None:
        store = Store()
        with store.bulk():
            for k in range(0, len(records), 500):
                store.write(records[k : k + 500])

    stages = [
        ("validate", lambda: [v.validate(r) for r in res]),
        ("extract index rows", lambda: [x.extract(r) for r in res]),
        ("reference edges", lambda: [local_targets(server, r) for r in res]),
        ("record (meta+extract+edges)", lambda: records.extend(
            record(server, r["resourceType"], r["id"], 1, "PUT", dict(r), ts) for r in res)),
        ("SQLite inserts, tables only", insert_only),
        ("SQLite write + index rebuild", write),
        ("SQLite alone: copy in + indexes", lambda: (rows_file(), times.update(floor=timed(sqlite_alone)))),
        ("load(), 1 worker", lambda: FhirServer(Store()).load(res)),
        ("load(), 2 workers", lambda: FhirServer(Store()).load(res, workers=2)),
    ]
    times: dict[str, float] = {}
    print(f"{len(res)} Synthea resources")
    for name, fn in stages:
        dt = timed(fn)
        dt = times.pop("floor", dt)  # the floor stage times its second half only
        times[name] = dt
        print(f"{name:32s} {len(res) / dt:10,.0f} resources/s {dt / len(res) * 1e6:8.1f} µs/resource")
    scratch.unlink()
    scratch.parent.rmdir()
    us = {k: v / len(res) * 1e6 for k, v in times.items()}
    cores = os.cpu_count() or 1
    wall = 1e6 / args.target
    python = us["validate"] + us["record (meta+extract+edges)"] + us["SQLite inserts, tables only"]
    left = (wall - us["SQLite alone: copy in + indexes"]) * cores
    print(f"at {args.target:,}/s: {wall:.0f} µs of wall time per resource; SQLite's serial part takes "
          f"{us['SQLite alone: copy in + indexes']:.0f}, which leaves {max(left, 0):.0f} µs of CPU on {cores} "
          f"cores for validation, records and inserts from Python: they take {python:.0f} now")


if __name__ == "__main__":
    main()
