"""Benchmark of the embedded FHIR server: bulk load, fork/reset, search latency vs peers.

Prints figures, asserts nothing (targets are judged by a person reading the table):
- bulk load rate (validation + indexing + storage; serial, with every core, and the trusted path
  without validation as a separate row) and transaction load rate;
- fork and reset p50/p95 on the loaded store;
- patient-scoped and chained search p50/p95 on >= 20,000 Synthea resources, side by side:
  our server in-process, our server over HTTP (``fhirgym serve``), ``sekmet-fhir==0.1.1`` over HTTP
  (installed into its own venv, started on loopback), and raw SQL on our own index (the floor).

Usage: ``python bench/bench_server.py [--patients 10] [--runs 50] [--no-sekmet]``
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlencode

import httpx
import orjson

from fhirgym.fhir import FhirServer, InProcessClient, Snapshot, Store
from fhirgym.spec import cache_dir, load_spec
from fhirgym.world import flatten_bundles as flatten
from fhirgym.world import synthea_bundles

SEKMET = "sekmet-fhir==0.1.1"


def bench_data(patients: int, seed: int = 42) -> list[dict]:
    """Synthea transaction bundles, generated once and cached."""
    folder = cache_dir() / "bench" / f"synthea-v2-s{seed}-p{patients}"
    if not folder.is_dir() or not any(folder.glob("*.json")):
        folder.mkdir(parents=True, exist_ok=True)
        for n, b in enumerate(synthea_bundles(seed, patients)):
            (folder / f"{n:04d}.json").write_bytes(orjson.dumps(b))
    return [orjson.loads(p.read_bytes()) for p in sorted(folder.glob("*.json"))]


def pct(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e3, xs[min(len(xs) - 1, int(len(xs) * 0.95))] * 1e3


def timed(fn, runs: int) -> tuple[float, float]:
    fn()  # warm
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return pct(ts)


class KeepAlive:
    """The timing client for every server: one keep-alive HTTP/1.1 connection (stdlib ``http.client``).

    A GET costs it ~0.1 ms; httpx adds about 1 ms per request on this machine, paid equally by every
    server, which would measure the client rather than the servers. The body is read, not parsed.
    """

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def get(self, path: str, params: list[tuple[str, str]]) -> bytes:
        for attempt in (1, 2):  # a server may close an idle keep-alive connection: reconnect once, as httpx does
            try:
                self.conn.request("GET", f"{path}?{urlencode(params)}", headers={"Accept": "*/*"})  # as httpx
                resp = self.conn.getresponse()
                body = resp.read()
                break
            except (http.client.RemoteDisconnected, ConnectionError):
                self.conn.close()
                if attempt == 2:
                    raise
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {resp.status}: {body[:300]!r}")
        return body

    def close(self) -> None:
        self.conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early ({proc.returncode})")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def sekmet_python() -> Path:
    venv = cache_dir() / "bench" / "sekmet-venv"
    py = venv / "bin" / "python"
    if not (venv / "bin" / "sekmet").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        done = subprocess.run([str(py), "-m", "pip", "install", "-q", SEKMET], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not install {SEKMET}: {done.stderr[-1500:]}")
    return venv / "bin" / "sekmet"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patients", type=int, default=10)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--peer-runs", type=int, default=5, help="runs per query against sekmet-fhir (slow)")
    ap.add_argument("--no-sekmet", action="store_true")
    args = ap.parse_args()

    load_spec()
    bundles = bench_data(args.patients)
    resources = flatten(bundles)
    n = len(resources)
    print(f"data: {args.patients} Synthea patients, {n} resources, {len(bundles)} bundles")

    # -- bulk load ---------------------------------------------------------------------------------
    # validated (every resource checked against its StructureDefinition) and, as a separate row, the
    # trusted path worlds use (validated once when built, loaded with validate=False); both index every
    # search parameter, record every reference edge and rebuild the store's indexes
    cores = os.cpu_count() or 1
    for label, validate, workers in [("validate + index + store", True, 1),
                                     (f"validate + index + store, {cores} workers", True, cores),
                                     (f"trusted: index + store (validate=False), {cores} workers", False, cores)]:
        store = Store()
        server = FhirServer(store)
        t = time.perf_counter()
        dangling = server.load(resources, validate=validate, workers=workers)
        dt = time.perf_counter() - t
        print(f"bulk load ({label}): {n / dt:,.0f} resources/s ({dt:.1f} s), dangling refs: {len(dangling)}")
    tx_store = Store()
    tx_client = InProcessClient(FhirServer(tx_store))
    t = time.perf_counter()
    for b in bundles:
        assert tx_client.transaction(b).status == 200
    dt = time.perf_counter() - t
    print(f"transaction load (POST Bundles in-process): {n / dt:,.0f} resources/s ({dt:.1f} s)")
    tx_store.close()

    tmp = Path(tempfile.mkdtemp(prefix="fhirgym-bench-"))
    base = tmp / "world.db"
    t = time.perf_counter()
    store.export(base)
    print(f"export to base file: {time.perf_counter() - t:.1f} s, {base.stat().st_size / 1e6:.0f} MB")
    snap = Snapshot(base)

    # -- fork / reset -------------------------------------------------------------------------------
    fork_ts, reset_ts = [], []
    patient = {"resourceType": "Patient", "name": [{"family": "Bench"}]}
    for _ in range(200):
        t = time.perf_counter()
        s = snap.open()
        fork_ts.append(time.perf_counter() - t)
        srv = FhirServer(s)
        for _ in range(5):
            srv.create("Patient", patient)
        t = time.perf_counter()
        s.reset()
        reset_ts.append(time.perf_counter() - t)
        s.close()
    # reset to a snapshot that has a layer of its own (a task's seeded state), after the episode's writes
    task_store = snap.open()
    task_server = FhirServer(task_store)
    for _ in range(5):
        task_server.create("Patient", patient)
    task_snap = task_store.snapshot()
    snap_ts = []
    for _ in range(200):
        for _ in range(5):
            task_server.create("Patient", patient)
        t = time.perf_counter()
        task_store.reset(task_snap)
        snap_ts.append(time.perf_counter() - t)
    task_store.close()
    fp50, fp95 = pct(fork_ts)
    rp50, rp95 = pct(reset_ts)
    sp50, sp95 = pct(snap_ts)
    print(f"fork  p50 {fp50:.3f} ms  p95 {fp95:.3f} ms  (store of {n} resources)")
    print(f"reset p50 {rp50:.3f} ms  p95 {rp95:.3f} ms  (after 5 creates)")
    print(f"reset to a snapshot with a layer p50 {sp50:.3f} ms  p95 {sp95:.3f} ms  (after 5 creates)")

    # -- queries --------------------------------------------------------------------------------------
    obs_by_patient = Counter()
    codes = Counter()
    for r in resources:
        if r["resourceType"] == "Observation":
            ref = r.get("subject", {}).get("reference", "")
            obs_by_patient[ref] += 1
            for c in r.get("code", {}).get("coding", []):
                codes[(c.get("system"), c.get("code"))] += 1
    pref, _ = obs_by_patient.most_common(1)[0]
    pid = pref.split("/")[1]
    patient_res = next(r for r in resources if r["resourceType"] == "Patient" and r["id"] == pid)
    family = patient_res["name"][0]["family"]
    (system, code), _ = codes.most_common(1)[0]
    queries = [
        ("patient-scoped: Observation?patient&code", "Observation",
         [("patient", pid), ("code", f"{system}|{code}"), ("_count", "50")]),
        ("patient-scoped: latest Observation", "Observation", [("patient", pid), ("_sort", "-date"), ("_count", "1")]),
        ("patient-scoped: Condition?patient", "Condition", [("patient", pid), ("_count", "50")]),
        ("chained: Observation?patient.family&code", "Observation",
         [("patient.family", family), ("code", f"{system}|{code}"), ("_count", "50")]),
        ("chained: Encounter?patient.family", "Encounter", [("patient.family", family), ("_count", "50")]),
    ]
    # the floor: the plainest SQL that returns the same first page from our own index (the id sets as
    # covering-index scans, later sets probed through IN, the page's JSON parsed), with no total,
    # paging state or Bundle. Ours also counts every match and orders the page.
    low, high = family.lower(), family.lower() + "\U0010ffff"
    family_ids = "SELECT id FROM ix_string WHERE rtype='Patient' AND param='family' AND norm >= ? AND norm < ?"
    raw_sql = {
        0: ("SELECT json FROM resources WHERE rtype='Observation' AND id IN ("
            "SELECT id FROM ix_reference WHERE rtype='Observation' AND param='patient' AND target_id=? "
            "AND id IN (SELECT id FROM ix_token WHERE rtype='Observation' AND param='code' AND code=? AND system=?)"
            ") LIMIT 50", (pid, code, system)),
        1: ("SELECT r.json FROM resources r JOIN ix_reference a ON a.rtype=r.rtype AND a.id=r.id "
            "WHERE r.rtype='Observation' AND a.param='patient' AND a.target_id=? ORDER BY "
            "(SELECT max(hi) FROM ix_date d WHERE d.rtype=r.rtype AND d.id=r.id AND d.param='date') DESC LIMIT 1",
            (pid,)),
        2: ("SELECT json FROM resources WHERE rtype='Condition' AND id IN (SELECT id FROM ix_reference "
            "WHERE rtype='Condition' AND param='patient' AND target_id=?) LIMIT 50", (pid,)),
        3: ("SELECT json FROM resources WHERE rtype='Observation' AND id IN ("
            "SELECT id FROM ix_reference WHERE rtype='Observation' AND param='patient' "
            f"AND target_id IN ({family_ids}) "
            "AND id IN (SELECT id FROM ix_token WHERE rtype='Observation' AND param='code' AND code=? AND system=?)"
            ") LIMIT 50", (low, high, code, system)),
        4: ("SELECT json FROM resources WHERE rtype='Encounter' AND id IN (SELECT id FROM ix_reference "
            f"WHERE rtype='Encounter' AND param='patient' AND target_id IN ({family_ids})) LIMIT 50", (low, high)),
    }
    import sqlite3

    raw = sqlite3.connect(f"file:{base}?mode=ro&immutable=1", uri=True)
    raw.execute("PRAGMA mmap_size=1073741824")  # as our store maps its base
    ours = InProcessClient(FhirServer(snap.open()))

    results: dict[str, dict[str, tuple]] = {}
    totals = {}
    for i, (name, rtype, q) in enumerate(queries):
        resp = ours.search(rtype, q)
        assert resp.status == 200, resp.body
        totals[name] = resp.body.get("total")
        sql, params = raw_sql[i]
        rows = raw.execute(sql, params).fetchall()
        expected = min(len(rows), 50)
        got = len(resp.body.get("entry", []))
        results[name] = {
            "ours in-process": timed(lambda rtype=rtype, q=q: ours.search(rtype, q), args.runs),
            "raw SQL floor": timed(lambda sql=sql, params=params: [orjson.loads(r[0]) for r in
                                                                   raw.execute(sql, params).fetchall()], args.runs),
        }
        if got != expected:
            print(f"  WARNING {name}: ours returned {got} entries, raw SQL {expected}")

    # our server over HTTP (a separate process, as sekmet is)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fhirgym.cli", "serve", "--port", str(port), "--base", str(base)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/fhir"
        wait_ready(url + "/metadata", proc)
        client = KeepAlive(port)
        for name, rtype, q in queries:
            results[name]["ours over HTTP"] = timed(lambda rtype=rtype, q=q: client.get(f"/fhir/{rtype}", q), args.runs)
        client.close()
    finally:
        proc.terminate()
        proc.wait()

    if not args.no_sekmet:
        exe = sekmet_python()
        port = free_port()
        db = tmp / "sekmet.db"
        env = {**os.environ, "SEKMET_DB": str(db)}
        proc = subprocess.Popen([str(exe), "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/fhir"
            wait_ready(url + "/metadata", proc)
            with httpx.Client(timeout=300) as http:
                t = time.perf_counter()
                ids: dict[str, str] = {}
                for b in bundles:
                    r = http.post(url, content=orjson.dumps(b), headers={"Content-Type": "application/fhir+json"})
                    r.raise_for_status()
                    for e, req_e in zip(r.json().get("entry", []), b["entry"]):
                        m = re.search(r"([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]+)(/_history/\d+)?$",
                                      e.get("response", {}).get("location", ""))
                        if m and m.group(1) == req_e["resource"]["resourceType"]:
                            ids[req_e["resource"]["id"]] = m.group(2)
                print(f"sekmet-fhir transaction load: {n / (time.perf_counter() - t):,.0f} resources/s")
                spid = ids.get(pid, pid)
                print(f"  sekmet id of the benchmark patient: {spid} (ours: {pid})")
                client = KeepAlive(port)
                for name, rtype, q in queries:
                    sq = [(k, spid if v == pid else v) for k, v in q]
                    r = http.get(f"{url}/{rtype}", params=sq)
                    if r.status_code != 200:
                        print(f"  sekmet {name}: HTTP {r.status_code}")
                        continue
                    if r.json().get("total") != totals[name]:
                        print(f"  NOTE {name}: sekmet total {r.json().get('total')} vs ours {totals[name]}")
                    results[name]["sekmet-fhir over HTTP"] = timed(
                        lambda rtype=rtype, sq=sq: client.get(f"/fhir/{rtype}", sq), args.peer_runs)
                    print(f"  sekmet {name}: p50 {results[name]['sekmet-fhir over HTTP'][0]:.1f} ms", flush=True)
                client.close()
        finally:
            proc.terminate()
            proc.wait()

    print()
    print(f"search latency, ms (p50 / p95), {args.runs} runs each, {n} resources")
    cols = ["ours in-process", "ours over HTTP", "sekmet-fhir over HTTP", "raw SQL floor"]
    print(f"{'query':44s} " + " ".join(f"{c:>22s}" for c in cols) + f" {'sekmet/ours(HTTP)':>18s} {'ours/raw':>9s}")
    for name, r in results.items():
        cells = [f"{r[c][0]:9.2f} / {r[c][1]:8.2f}" if c in r else f"{'-':>22s}" for c in cols]
        ratio_s = (f"{r['sekmet-fhir over HTTP'][0] / r['ours over HTTP'][0]:17.1f}x"
                   if "sekmet-fhir over HTTP" in r else f"{'-':>18s}")
        ratio_r = f"{r['ours in-process'][0] / r['raw SQL floor'][0]:8.1f}x"
        print(f"{name:44s} " + " ".join(f"{c:>22s}" for c in cells) + f" {ratio_s} {ratio_r}")


if __name__ == "__main__":
    main()
