"""The server under concurrency: a bounded pool of readers whose descriptors and memory stay flat over bursts
of reads, reads that each see one committed state, and requests that wait their turn a bounded time
(docs/SERVER.md, "Concurrency")."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from _live_server import bound_socket
from fhirgym.fhir import FhirServer, InProcessClient, Request, ServerConfig, Store


def patient(pid: str, family: str = "F") -> dict:
    return {"resourceType": "Patient", "id": pid, "name": [{"family": family}]}


def observation(oid: str, subject: str) -> dict:
    return {"resourceType": "Observation", "id": oid, "status": "final", "code": {"text": "x"},
            "subject": {"reference": f"Patient/{subject}"}}


def file_server(tmp_path, **config) -> FhirServer:
    return FhirServer(Store(path=tmp_path / "layer.db"), config=ServerConfig(id_seed=3, **config))


# -- bounded readers -----------------------------------------------------------------------------------
#: serves a file-backed store whose worker threads retire after 0.05 s idle (anyio's default is 10 s: the
#: bursts below would take minutes), under the descriptor limit the test sets
_SERVE = """
import sys
import anyio._backends._asyncio as backend
backend.WorkerThread.MAX_IDLE_TIME = 0.05
from fhirgym.fhir import FhirServer, ServerConfig, Store, run_server
port = int(sys.argv[2])
server = FhirServer(Store(path=sys.argv[1]), config=ServerConfig(base_url=f"http://127.0.0.1:{port}/fhir"))
server.load([{"resourceType": "Patient", "id": f"p{k}", "name": [{"family": f"F{k % 7}"}],
              "text": {"status": "generated", "div": "<div xmlns='http://www.w3.org/1999/xhtml'>" + "x" * 2000 + "</div>"}}
             for k in range(300)])
print("ready", flush=True)
run_server(server, "127.0.0.1", port)
"""


def _proc_figures(pid: int) -> tuple[int, int]:
    """(open descriptors, resident kB) of a process."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as fh:
        status = fh.read()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return fds, rss


def _get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.mark.slow
def test_fds_and_memory_stay_flat_over_50_bursts_of_64_reads_under_a_low_fd_limit(tmp_path):
    """Each burst of 64 concurrent searches after a pause used to leave one SQLite reader per worker thread
    open (threads retire, their connections stayed): fds 21 -> 267 over six bursts, then 500s for good under
    ``ulimit -n 256``. Now the readers are a pool of ``read_workers`` connections, checked out per request."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    sock.close()

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(tmp_path / "layer.db"), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=low_limit)
    try:
        assert proc.stdout.readline().decode().strip() == "ready"
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(port, "/fhir/metadata") == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(0.1)
        start_fds = _proc_figures(proc.pid)[0]
        figures, statuses = [], []
        with ThreadPoolExecutor(64) as pool:
            for _burst in range(50):
                paths = [f"/fhir/Patient?family=F{k % 7}&_count=50" for k in range(64)]
                statuses += pool.map(lambda p: _get(port, p), paths)
                time.sleep(0.1)  # idle: the server's worker threads retire
                figures.append(_proc_figures(proc.pid))
        assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        (fds1, rss1), (fds50, rss50) = figures[0], figures[-1]
        print(f"\nburst test: fds {start_fds} at start, {fds1} -> {fds50} (max {max(f for f, _ in figures)}), "
              f"RSS {rss1 / 1024:.0f} -> {rss50 / 1024:.0f} MB (max {max(r for _, r in figures) / 1024:.0f})")
        # bounded by the pool (8 readers of 3 descriptors each at most), and no growth from half to half
        fds_first, fds_last = max(f for f, _ in figures[:25]), max(f for f, _ in figures[25:])
        rss_first, rss_last = max(r for _, r in figures[:25]), max(r for _, r in figures[25:])
        assert max(fds_first, fds_last) <= start_fds + 3 * 8 + 2 and fds_last <= fds_first + 2
        assert rss_last <= rss_first * 1.1 + 16 * 1024  # no reader connection (and its cache) per burst
        assert _get(port, "/fhir/metadata") == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_the_reader_pool_is_bounded_and_a_full_pool_is_a_503_with_retry_after(tmp_path):
    server = file_server(tmp_path, read_workers=2, queue_timeout=0.3)
    client = InProcessClient(server)
    assert client.update(patient("r1")).status == 201
    store = server.store
    with store.reading() as a, store.reading() as b:  # both readers checked out
        assert a is not b and store.reader_count() == 2
        start = time.monotonic()
        resp = client.read("Patient", "r1")
        assert resp.status == 503 and resp.headers["Retry-After"]
        assert resp.body["issue"][0]["code"] == "transient" and time.monotonic() - start < 5
    for _ in range(20):  # released: reused, never more than two
        assert client.read("Patient", "r1").status == 200
    assert store.reader_count() <= 2
    store.close()


def test_a_reader_that_cannot_be_opened_is_a_503_not_a_500(tmp_path, monkeypatch):
    server = file_server(tmp_path)
    client = InProcessClient(server)
    assert client.update(patient("r1")).status == 201
    import sqlite3

    import fhirgym.fhir._store as store_module

    def no_descriptors(*args, **kwargs):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(store_module.sqlite3, "connect", no_descriptors)
    resp = client.read("Patient", "r1")
    assert resp.status == 503 and "Retry-After" in resp.headers, resp.body
    monkeypatch.undo()
    assert client.read("Patient", "r1").status == 200  # and it recovers
    server.store.close()


def test_a_worker_thread_that_cannot_start_is_a_503_with_retry_after(monkeypatch):
    from _live_server import LiveServer

    with LiveServer() as live:
        assert _get(live.port, "/fhir/metadata") == 200
        import anyio.to_thread

        async def no_thread(*args, **kwargs):
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(anyio.to_thread, "run_sync", no_thread)
        conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
        conn.request("GET", "/fhir/Patient")
        resp = conn.getresponse()
        body = orjson.loads(resp.read())
        conn.close()
        assert resp.status == 503 and resp.getheader("Retry-After")
        assert body["resourceType"] == "OperationOutcome" and "can't start new thread" in body["issue"][0]["diagnostics"]


# -- snapshot reads ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_no_read_sees_a_half_written_transaction_over_10000_pages(tmp_path):
    """A writer loops on one transaction (a Patient and 20 Observations of it) and a cascade delete; readers
    page ``Patient?family=T&_revinclude=Observation:subject`` (and ``$everything``): a page holds the
    Patient with all 20 or nothing, never a state that was not committed (210 of 14,090 pages were torn
    when each statement read in autocommit)."""
    server = file_server(tmp_path)
    obs = 20
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": r, "request": {"method": "PUT", "url": f"{r['resourceType']}/{r['id']}"}}
        for r in [patient("t", "T"), *(observation(f"t-{k}", "t") for k in range(obs))]]}
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        while not stop.is_set():
            assert server.handle(Request("POST", "", body=bundle)).status == 200
            gone = server.handle(Request("DELETE", "Patient/t", [("_cascade", "delete")]))
            assert gone.status == 200, gone.body
            writes[0] += 1

    pages, torn, seen = [0], [], {"with": 0, "without": 0}
    search = Request("GET", "Patient", [("family", "T"), ("_revinclude", "Observation:subject")], raw=True)

    def reader() -> None:
        while pages[0] < 10_000 and not stop.is_set():
            n = pages[0] = pages[0] + 1
            if n % 10 == 0:
                resp = server.handle(Request("GET", "Patient/t/$everything", raw=True))
                if resp.status == 200 and resp.body["total"] != obs + 1:
                    torn.append(("$everything", resp.body["total"]))
                continue
            resp = server.handle(search)
            assert resp.status == 200, resp.body
            modes = [e["search"]["mode"] for e in resp.body.get("entry", [])]
            matched, included = modes.count("match"), modes.count("include")
            if (matched, included) not in ((0, 0), (1, obs)):
                torn.append((matched, included))
            seen["with" if matched else "without"] += 1

    threads = [threading.Thread(target=writer), *(threading.Thread(target=reader) for _ in range(2))]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(300)
    stop.set()
    threads[0].join(60)
    print(f"\nconcurrency test: {pages[0]} pages ({seen}), {writes[0]} write cycles, {len(torn)} torn")
    assert pages[0] >= 10_000 and writes[0] > 10 and seen["with"] > 100 and seen["without"] > 100
    assert torn == []
    server.store.close()


def test_a_batch_of_reads_runs_in_one_read_transaction(tmp_path):
    """A batch of reads is one read transaction too: its entries agree with each other."""
    server = file_server(tmp_path)
    client = InProcessClient(server)
    assert client.update(patient("h1")).status == 201
    batch = {"resourceType": "Bundle", "type": "batch", "entry": [
        {"request": {"method": "GET", "url": "Patient/h1/_history"}}, {"request": {"method": "GET", "url": "Patient/h1"}}]}
    resp = client.transaction(batch)
    assert [e["response"]["status"] for e in resp.body["entry"]] == ["200 OK", "200 OK"]
    assert resp.body["entry"][0]["resource"]["total"] == 1
    server.store.close()


# -- limits that hold --------------------------------------------------------------------------------------
def _collection(entries: int) -> bytes:
    return orjson.dumps({"resourceType": "Bundle", "type": "collection", "entry": [
        {"resource": {"resourceType": "Patient", "name": [{"family": f"F{k}"}]}} for k in range(entries)]})


@pytest.mark.slow
def test_validation_stops_at_the_deadline_and_a_write_behind_it_gets_its_own_time():
    """A 120,000-entry collection Bundle used to be validated to the end (408 after 62 s), and a one-line
    POST queued behind it got a 408 too: its deadline had started before it waited for its turn."""
    server = FhirServer(Store(), config=ServerConfig(request_timeout=2))
    body = _collection(120_000)
    headers = {"content-type": "application/fhir+json"}
    result: dict = {}

    def big() -> None:
        start = time.monotonic()
        result["big"] = server.handle(Request("POST", "Bundle", [], headers, body))
        result["big_s"] = time.monotonic() - start

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.3)  # the Bundle has the write turn
    start = time.monotonic()
    small = server.handle(Request("POST", "Patient", [], headers, b'{"resourceType": "Patient"}'))
    small_s = time.monotonic() - start
    thread.join(60)
    print(f"\n120,000-entry Bundle: {result['big'].status} after {result['big_s']:.2f} s (limit 2 s); "
          f"the POST behind it: {small.status} after {small_s:.2f} s")
    assert result["big"].status == 408 and result["big"].body["issue"][0]["code"] == "timeout"
    assert result["big_s"] < 2 + 3  # stopped near its deadline (62 s before), with room for a busy machine
    assert small.status == 201, small.body
    assert small_s < result["big_s"] + 3
    assert server.store.counts() == {"Patient": 1}


@contextlib.contextmanager
def write_in_progress(server: FhirServer) -> Iterator[None]:
    """A long write: it holds the write turn, in an open transaction that created Patient/w1, until the
    block ends."""
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with server._lock, server.store.transaction():
            server.create("Patient", patient("w1"), rid="w1")
            held.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        thread.join()


def test_a_write_that_waits_too_long_for_its_turn_is_a_503_with_retry_after():
    server = FhirServer(Store(), config=ServerConfig(queue_timeout=0.3))
    with write_in_progress(server):
        start = time.monotonic()
        resp = server.handle(Request("POST", "Patient", body={"resourceType": "Patient"}))
        assert resp.status == 503 and resp.headers["Retry-After"] and time.monotonic() - start < 5
        assert "queue_timeout" in resp.body["issue"][0]["diagnostics"]
    assert server.store.counts() == {"Patient": 1}  # the long write's, not the refused one
    assert server.handle(Request("POST", "Patient", body={"resourceType": "Patient"})).status == 201


def test_read_only_batches_and_post_search_do_not_wait_for_a_write(tmp_path):
    server = file_server(tmp_path, queue_timeout=0.5)
    client = InProcessClient(server)
    assert client.update(patient("r1", "Reader")).status == 201
    with write_in_progress(server):
        start = time.monotonic()
        batch = client.transaction({"resourceType": "Bundle", "type": "batch", "entry": [
            {"request": {"method": "GET", "url": "Patient/r1"}}, {"request": {"method": "GET", "url": "Patient?family=Reader"}}]})
        assert batch.status == 200 and [e["response"]["status"] for e in batch.body["entry"]] == ["200 OK", "200 OK"]
        found = client.request("POST", "Patient/_search", body=b"family=Reader",
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert found.status == 200 and found.body["total"] == 1
        assert time.monotonic() - start < 0.5 * 4  # served beside the write, not after its queue_timeout
        assert client.create(patient("x")).status == 503  # a write does wait (and gives up)
    server.store.close()


def test_reads_in_a_batch_count_against_the_response_budget():
    """60 reads of a 12 MB Binary returned 755 MB from a 5 KB request; here 60 of 300 KB under 1 MB."""
    server = FhirServer(Store(), config=ServerConfig(max_response_bytes=1_000_000))
    client = InProcessClient(server)
    data = base64.b64encode(b"x" * 225_000).decode()
    assert client.update({"resourceType": "Binary", "id": "b", "contentType": "text/plain", "data": data}).status == 201
    batch = {"resourceType": "Bundle", "type": "batch", "entry": [{"request": {"method": "GET", "url": "Binary/b"}}] * 60}
    resp = client.transaction(batch)
    statuses = [e["response"]["status"] for e in resp.body["entry"]]
    assert statuses[:3] == ["200 OK"] * 3 and set(statuses[4:]) == {"400"}, statuses
    assert len(orjson.dumps(resp.body)) < 2_000_000
    assert "max_response_bytes" in resp.body["entry"][-1]["response"]["outcome"]["issue"][0]["diagnostics"]


def test_elements_is_capped_and_subsetting_stops_at_the_deadline():
    """A 600,000-name ``_elements`` search answered 200 after 56.6 s."""
    server = FhirServer(Store(), config=ServerConfig(id_seed=1))
    client = InProcessClient(server)
    assert not server.load([patient(f"p{k}") for k in range(300)])
    start = time.monotonic()
    resp = client.search("Patient", {"_elements": ",".join(f"n{k}" for k in range(600_000))})
    assert resp.status == 400 and "at most 1000" in resp.body["issue"][0]["diagnostics"]
    assert time.monotonic() - start < 5
    names = ",".join(["name", *(f"n{k}" for k in range(999))])
    page = client.search("Patient", {"_elements": names, "_count": "300"})
    assert page.status == 200 and page.body["entry"][0]["resource"]["name"]
    assert set(page.body["entry"][0]["resource"]) == {"resourceType", "id", "meta", "name"}
    server.config.request_timeout = 0
    assert client.search("Patient", {"_elements": names, "_count": "300"}).status == 408


def test_the_page_cache_stays_bounded_when_searches_run_on_readers(tmp_path):
    """A read runs on a copy of the server with the reader as its store: the count of cached ids lived on
    the copy, so on a file-backed store no list was ever dropped (200 lists of 6 ids with room for 10)."""
    server = file_server(tmp_path, page_cache_ids=10)
    client = InProcessClient(server)
    assert not server.load([patient(f"p{k}", f"F{k % 5}") for k in range(30)])
    for k in range(200):
        assert client.search("Patient", {"_count": "2", "family": f"F{k % 5}", "_id:not": f"x{k}"}).status == 200
    assert server.pages_held <= 10 and sum(len(state["ids"]) for state in server.pages.values()) <= 10
    server.store.close()
