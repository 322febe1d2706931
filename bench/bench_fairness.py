"""Benchmark: latency of a small read while a large write runs (issue 23, "fair and bounded").

Starts ``fhirgym serve`` (default settings, as a user gets them) in a subprocess, then measures the
latency of ``GET Patient/small`` over HTTP: first alone, then while another client's large transaction
(``--entries`` new Patients, one request) or batch of searches runs (the load is first timed alone). Also times how long the server takes
to exit on SIGTERM while it is busy. Prints figures; asserts nothing.

``--src DIR`` serves from another checkout's ``src`` (for a before/after table), e.g. main's code:
``git archive main src | tar -x -C /tmp/before && python bench/bench_fairness.py --src /tmp/before/src``.

Usage: ``python bench/bench_fairness.py [--entries 10000] [--load transaction|batch] [--src DIR]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import orjson

FHIR_JSON = "application/fhir+json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(src: str | None, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if src:
        env["PYTHONPATH"] = src
    proc = subprocess.Popen([sys.executable, "-m", "fhirgym.cli", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/fhir/metadata", timeout=2).status_code == 200:
                return proc
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def pcts(xs: list[float]) -> str:
    if not xs:
        return "no reads completed"
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(len(xs) * 0.95))]
    return (f"n={len(xs):5d}  p50={statistics.median(xs) * 1e3:8.1f} ms  p95={p95 * 1e3:8.1f} ms  "
            f"max={xs[-1] * 1e3:8.1f} ms")


def load_bundle(kind: str, entries: int) -> bytes:
    if kind == "transaction":
        entry = [{"resource": {"resourceType": "Patient", "name": [{"family": f"Load{k}"}], "gender": "female"},
                  "request": {"method": "POST", "url": "Patient"}} for k in range(entries)]
    else:
        entry = [{"request": {"method": "GET", "url": f"Patient?family=Load{k}"}} for k in range(entries)]
    return orjson.dumps({"resourceType": "Bundle", "type": kind, "entry": entry})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--load", choices=["transaction", "batch"], default="transaction")
    ap.add_argument("--src", help="serve from this src directory instead of the installed fhirgym")
    ap.add_argument("--baseline", type=int, default=200, help="reads measured with no load")
    args = ap.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}/fhir"
    proc = start(args.src, port)
    try:
        with httpx.Client(base_url=base, timeout=600) as web:
            assert web.put("/Patient/small", json={"resourceType": "Patient", "id": "small"},
                           headers={"Content-Type": FHIR_JSON}).status_code in (200, 201)
            alone = []
            for _ in range(args.baseline):
                t = time.perf_counter()
                web.get("/Patient/small").raise_for_status()
                alone.append(time.perf_counter() - t)

            body = load_bundle(args.load, args.entries)
            t = time.perf_counter()
            alone_status = web.post("", content=body, headers={"Content-Type": FHIR_JSON}).status_code
            alone_s = time.perf_counter() - t
            result: dict = {}

            def write() -> None:
                t = time.perf_counter()
                with httpx.Client(timeout=600) as other:
                    resp = other.post(base, content=body, headers={"Content-Type": FHIR_JSON})
                result["status"], result["seconds"] = resp.status_code, time.perf_counter() - t

            writer = threading.Thread(target=write)
            writer.start()
            time.sleep(0.5)  # the write is under way (its body is sent and being processed)
            during = []
            while writer.is_alive():
                t = time.perf_counter()
                resp = web.get("/Patient/small")
                if writer.is_alive():
                    during.append(time.perf_counter() - t)
                assert resp.status_code == 200, resp.text
            writer.join()

            # SIGTERM while busy: a second large request, then the signal
            sender = threading.Thread(target=_post_quietly, args=(base, body), daemon=True)
            sender.start()
            time.sleep(1.0)
            t = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
                exit_s = f"{time.perf_counter() - t:.1f} s (exit code {proc.returncode})"
            except subprocess.TimeoutExpired:
                exit_s = "did not exit within 120 s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    code = args.src or "installed fhirgym"
    print(f"server code: {code}; load: one {args.load} of {args.entries} entries, alone: answered {alone_status} "
          f"in {alone_s:.1f} s; beside the reads: {result.get('status')} in {result.get('seconds', 0):.1f} s")
    print(f"GET Patient/small alone         {pcts(alone)}")
    print(f"GET Patient/small during load   {pcts(during)}")
    print(f"exit after SIGTERM while busy   {exit_s}")


def _post_quietly(base: str, body: bytes) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(base, content=body, headers={"Content-Type": FHIR_JSON}, timeout=600)


if __name__ == "__main__":
    main()
