"""The ASGI app over real HTTP (uvicorn on 127.0.0.1): content negotiation, body limits, error shapes,
admin routes, an external FHIR client (fhirpy) and the ``fhirgym serve`` command end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import orjson
import pytest
from fhirpy import AsyncFHIRClient, SyncFHIRClient
from fhirpy.base.exceptions import OperationOutcome, ResourceNotFound

from _live_server import LiveServer, bound_socket
from fhirgym.fhir import HttpClient, Store

FHIR_JSON = "application/fhir+json"
LIMIT = 4096


@pytest.fixture(scope="session")
def live():
    with LiveServer(max_body_bytes=LIMIT) as srv:
        yield srv


@pytest.fixture(scope="session")
def admin_live():
    with LiveServer(admin=True) as srv:
        yield srv


@pytest.fixture
def web(live):
    with httpx.Client(base_url=live.root, timeout=30) as client:
        yield client


def assert_outcome(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith(FHIR_JSON)
    body = resp.json()
    assert body["resourceType"] == "OperationOutcome" and body["issue"], body
    assert body["issue"][0]["severity"] in ("error", "fatal")
    if code:
        assert body["issue"][0]["code"] == code
    return body


def new_patient(**extra) -> dict:
    return {"resourceType": "Patient", "name": [{"family": "Diaz"}], **extra}


# -- content negotiation -----------------------------------------------------------------------------------
def test_responses_are_fhir_json(web):
    resp = web.get("/fhir/metadata")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith(FHIR_JSON)
    assert resp.json()["fhirVersion"] == "4.0.1"
    for fmt in ("json", "application/fhir+json", "application/json"):
        assert web.get("/fhir/metadata", params={"_format": fmt}).status_code == 200, fmt
    for accept in ("application/json", "*/*", "application/fhir+json;q=0.9, text/html"):
        assert web.get("/fhir/metadata", headers={"Accept": accept}).status_code == 200, accept


def test_xml_is_refused(web, live):
    before = live.server.store.counts()
    for fmt in ("xml", "application/fhir+xml", "text/xml"):
        assert_outcome(web.get("/fhir/metadata", params={"_format": fmt}), 406, "not-supported")
    assert_outcome(web.get("/fhir/metadata", headers={"Accept": "application/fhir+xml"}), 406)
    xml = b'<Patient xmlns="http://hl7.org/fhir"><gender value="male"/></Patient>'
    assert_outcome(web.post("/fhir/Patient", content=xml, headers={"Content-Type": "application/xml"}), 415)
    assert_outcome(web.post("/fhir/Patient", content=xml, headers={"Content-Type": "application/fhir+xml"}), 415)
    assert live.server.store.counts() == before


def test_json_content_type_variants_are_accepted(web):
    body = orjson.dumps(new_patient())
    for ctype in (FHIR_JSON, "application/json", "application/fhir+json; charset=utf-8", "application/json+fhir"):
        resp = web.post("/fhir/Patient", content=body, headers={"Content-Type": ctype})
        assert resp.status_code == 201, (ctype, resp.text)


def test_pretty_printing(web):
    pretty = web.get("/fhir/metadata", params={"_pretty": "true"}).text
    compact = web.get("/fhir/metadata").text
    assert "\n  " in pretty and "\n" not in compact
    assert orjson.loads(pretty) == orjson.loads(compact)


# -- bodies ---------------------------------------------------------------------------------------------------
def test_malformed_json_is_400(web, live):
    before = live.server.store.counts()
    for raw in (b'{"resourceType": "Patient",', b"not json", b"[]", b'"Patient"', b"\xff\xfe"):
        assert_outcome(web.post("/fhir/Patient", content=raw, headers={"Content-Type": FHIR_JSON}), 400)
    assert_outcome(web.post("/fhir/Patient", content=b"", headers={"Content-Type": FHIR_JSON}), 400)
    assert live.server.store.counts() == before


def test_oversized_body_is_413(web, live):
    before = live.server.store.counts()
    big = orjson.dumps(new_patient(text={"status": "generated", "div": "x" * LIMIT}))
    assert_outcome(web.post("/fhir/Patient", content=big, headers={"Content-Type": FHIR_JSON}), 413, "too-costly")
    assert_outcome(web.put("/fhir/Patient/big", content=big, headers={"Content-Type": FHIR_JSON}), 413)

    def chunks():  # no Content-Length: the limit is enforced while streaming
        yield b'{"resourceType": "Patient", "id": "big", "x": "'
        for _ in range(LIMIT // 256 + 1):
            yield b"y" * 256
        yield b'"}'

    assert_outcome(web.put("/fhir/Patient/big", content=chunks(), headers={"Content-Type": FHIR_JSON}), 413)
    bundle = {"resourceType": "Bundle", "type": "batch",
              "entry": [{"request": {"method": "GET", "url": "metadata"}}] * (LIMIT // 40)}
    assert_outcome(web.post("/fhir", content=orjson.dumps(bundle), headers={"Content-Type": FHIR_JSON}), 413)
    assert live.server.store.counts() == before
    # just under the limit is fine
    ok = orjson.dumps(new_patient(text={"status": "generated", "div": "<div xmlns=\"http://www.w3.org/1999/xhtml\">"
                                        + "x" * (LIMIT - 300) + "</div>"}))
    assert len(ok) < LIMIT
    assert web.post("/fhir/Patient", content=ok, headers={"Content-Type": FHIR_JSON}).status_code == 201


# -- routes -----------------------------------------------------------------------------------------------------
def test_non_fhir_paths_are_404_operation_outcomes(web):
    for path in ("/", "/Patient", "/fhirx/Patient", "/api/fhir/metadata", "/admin/snapshot", "/favicon.ico"):
        assert_outcome(web.get(path), 404, "not-found")
    assert_outcome(web.post("/admin/reset"), 404)  # no admin routes unless asked for
    assert_outcome(web.post("/admin/snapshot"), 404)


def test_create_read_update_delete_over_http(web, live):
    created = web.post("/fhir/Patient", json=new_patient(), headers={"Content-Type": FHIR_JSON})
    assert created.status_code == 201
    location = created.headers["location"]
    rid = created.json()["id"]
    assert location == f"{live.base_url}/Patient/{rid}/_history/1"
    assert created.headers["etag"] == 'W/"1"'
    read = web.get(f"/fhir/Patient/{rid}")
    assert read.status_code == 200 and read.headers["etag"] == 'W/"1"' and read.json()["id"] == rid
    head = web.head(f"/fhir/Patient/{rid}")
    assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == 'W/"1"'
    upd = web.put(f"/fhir/Patient/{rid}", json={**new_patient(gender="male"), "id": rid},
                  headers={"If-Match": 'W/"1"'})
    assert upd.status_code == 200 and upd.headers["etag"] == 'W/"2"'
    assert_outcome(web.put(f"/fhir/Patient/{rid}", json={**new_patient(), "id": rid}, headers={"If-Match": 'W/"1"'}),
                   412)
    minimal = web.post("/fhir/Patient", json=new_patient(), headers={"Prefer": "return=minimal"})
    assert minimal.status_code == 201 and minimal.content == b"" and minimal.headers["location"]
    assert web.delete(f"/fhir/Patient/{rid}").status_code == 200
    assert_outcome(web.get(f"/fhir/Patient/{rid}"), 410, "deleted")
    assert_outcome(web.get("/fhir/Patient/x%27%3BDROP%20TABLE%20resources%3B--"), 400)
    assert_outcome(web.get("/fhir/Foo/1"), 404)


def test_search_over_get_and_post(web):
    mrn = f"http-{time.monotonic_ns()}"
    web.post("/fhir/Patient", json=new_patient(identifier=[{"system": "http://s", "value": mrn}]))
    got = web.get("/fhir/Patient", params={"identifier": f"http://s|{mrn}"}).json()
    posted = web.post("/fhir/Patient/_search", content=f"identifier=http://s|{mrn}",
                      headers={"Content-Type": "application/x-www-form-urlencoded"}).json()
    assert got["total"] == posted["total"] == 1
    assert got["entry"][0]["resource"]["id"] == posted["entry"][0]["resource"]["id"]
    assert_outcome(web.get("/fhir/Patient", params={"bogus": "1"}), 400)


def test_transaction_over_http(web):
    urn = "urn:uuid:2b3c4d5e-6f70-4812-9a3b-4c5d6e7f8091"
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": urn, "resource": new_patient(), "request": {"method": "POST", "url": "Patient"}},
        {"resource": {"resourceType": "Observation", "status": "final", "code": {"text": "x"},
                      "subject": {"reference": urn}}, "request": {"method": "POST", "url": "Observation"}},
    ]}
    resp = web.post("/fhir", json=bundle, headers={"Content-Type": FHIR_JSON})
    assert resp.status_code == 200
    out = resp.json()
    pid = out["entry"][0]["resource"]["id"]
    assert out["entry"][1]["resource"]["subject"]["reference"] == f"Patient/{pid}"


# -- admin -----------------------------------------------------------------------------------------------------
def test_admin_snapshot_and_reset(admin_live):
    srv = admin_live
    with httpx.Client(base_url=srv.root) as web:
        kept = web.post("/fhir/Patient", json=new_patient()).json()["id"]
        snap = web.post("/admin/snapshot")
        assert snap.status_code == 200 and snap.json()["issue"][0]["severity"] == "information"
        dropped = web.post("/fhir/Patient", json=new_patient()).json()["id"]
        assert web.put(f"/fhir/Patient/{kept}", json={**new_patient(gender="male"), "id": kept}).status_code == 200
        reset = web.post("/admin/reset")
        assert reset.status_code == 200
        assert web.get(f"/fhir/Patient/{dropped}").status_code == 404
        back = web.get(f"/fhir/Patient/{kept}").json()
        assert back["meta"]["versionId"] == "1" and "gender" not in back
        assert srv.server.store.counts() == {"Patient": 1}
        # admin operations are not part of the FHIR API, and take POST only
        assert_outcome(web.post("/fhir/admin/snapshot"), 404)
        assert_outcome(web.get("/admin/reset"), 405)
        assert_outcome(web.post("/admin/explode"), 404)
        assert srv.server.store.counts() == {"Patient": 1}


def test_admin_on_a_file_backed_store_answers_an_outcome_not_a_500(tmp_path):
    with LiveServer(admin=True, store=Store(path=tmp_path / "layer.db")) as srv, httpx.Client(base_url=srv.root) as web:
        assert web.post("/fhir/Patient", json=new_patient()).status_code == 201
        assert_outcome(web.post("/admin/snapshot"), 409, "not-supported")
        assert_outcome(web.post("/admin/reset"), 409, "not-supported")
        assert srv.server.store.counts() == {"Patient": 1}


# -- an external client: fhirpy ---------------------------------------------------------------------------------
def test_fhirpy_sync_client_crud_and_search(live):
    client = SyncFHIRClient(live.base_url)
    mrn = f"fhirpy-{time.monotonic_ns()}"
    pat = client.resource("Patient", name=[{"family": "Diaz", "given": ["Ana"]}], gender="female",
                          identifier=[{"system": "http://s", "value": mrn}])
    pat.save()
    assert pat.id and pat["meta"]["versionId"] == "1"
    read = client.reference("Patient", pat.id).to_resource()
    assert read["name"] == [{"family": "Diaz", "given": ["Ana"]}]
    read["gender"] = "male"
    read.save()
    assert read["meta"]["versionId"] == "2"
    assert client.get("Patient", pat.id)["gender"] == "male"
    found = client.resources("Patient").search(identifier=f"http://s|{mrn}").get()
    assert found.id == pat.id
    for n in range(3):
        client.resource("Patient", name=[{"family": f"Page{n}"}], identifier=[{"system": "http://s", "value": mrn}]).save()
    page = client.resources("Patient").search(identifier=f"http://s|{mrn}").limit(2)
    assert len(page.fetch()) == 2
    assert len(page.fetch_all()) == 4  # follows our next links
    obs = client.resource("Observation", status="final", code={"text": "hr"}, subject=pat.to_reference())
    obs.save()
    with pytest.raises(OperationOutcome) as conflict:
        pat.delete()  # still referenced
    assert "referenced" in str(conflict.value)
    obs.delete()
    pat.delete()
    with pytest.raises(ResourceNotFound):
        client.reference("Patient", pat.id).to_resource()
    with pytest.raises(OperationOutcome):
        client.resource("Patient", gender="robot").save()


def test_fhirpy_count_works_in_strict_mode(live):
    """fhirpy's count() sends HAPI's ``_totalMethod`` control parameter, which the server accepts."""
    mrn = f"count-{time.monotonic_ns()}"
    client = SyncFHIRClient(live.base_url)
    client.resource("Patient", identifier=[{"system": "http://s", "value": mrn}]).save()
    assert client.resources("Patient").search(identifier=f"http://s|{mrn}").count() == 1
    with pytest.raises(OperationOutcome):  # a genuinely unknown parameter is still refused
        client.resources("Patient").search(nosuchparam="x").count()


def test_fhirpy_async_client(live):
    async def scenario() -> tuple[str, list[str]]:
        client = AsyncFHIRClient(live.base_url)
        mrn = f"async-{time.monotonic_ns()}"
        pat = client.resource("Patient", identifier=[{"system": "http://s", "value": mrn}])
        await pat.save()
        found = await client.resources("Patient").search(identifier=f"http://s|{mrn}").fetch()
        await pat.delete()
        return pat.id, [r.id for r in found]

    pid, found = asyncio.run(scenario())
    assert found == [pid]


def _wait_until_serving(proc: subprocess.Popen, base: str) -> None:
    """Until ``fhirgym serve`` answers /metadata (a minute at most; its output if it died)."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/metadata", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, "fhirgym serve did not become ready"
        time.sleep(0.1)


# -- the `fhirgym serve` command ------------------------------------------------------------------------------
@pytest.mark.slow
def test_fhirgym_serve_cli_end_to_end(tmp_path):
    sock = bound_socket()
    port = sock.getsockname()[1]
    sock.close()  # the CLI binds it itself
    base = f"http://127.0.0.1:{port}/fhir"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fhirgym.cli", "serve", "--port", str(port), "--admin"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        _wait_until_serving(proc, base)
        client = HttpClient(base)
        created = client.create(new_patient())
        assert created.status == 201
        assert created.headers["Location"].startswith(f"{base}/Patient/")  # the CLI sets its base URL
        rid = created.body["id"]
        assert client.read("Patient", rid).body["name"] == [{"family": "Diaz"}]
        assert client.search("Patient", {"_id": rid}).body["total"] == 1
        assert httpx.post(f"http://127.0.0.1:{port}/admin/snapshot").status_code == 200
        # the `fhirgym fhir get --url` command talks to it too
        get = subprocess.run([sys.executable, "-m", "fhirgym.cli", "fhir", "get", f"Patient/{rid}", "--url", base],
                             capture_output=True, timeout=60)
        assert get.returncode == 0 and orjson.loads(get.stdout)["id"] == rid
        missing = subprocess.run([sys.executable, "-m", "fhirgym.cli", "fhir", "get", "Patient/nope", "--url", base],
                                 capture_output=True, timeout=60)
        assert missing.returncode == 1 and orjson.loads(missing.stdout)["resourceType"] == "OperationOutcome"
        client.close()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail("fhirgym serve did not stop on SIGINT")
        proc.stdout.close()
    assert proc.returncode in (0, -signal.SIGINT)


def test_control_characters_in_the_path_are_400_not_a_read_of_another_id(web):
    assert web.put("/fhir/Patient/abc", json={**new_patient(), "id": "abc"}).status_code in (200, 201)
    # a trailing newline used to be dropped by the route's `$` (the read answered Patient/abc)
    assert_outcome(web.get("/fhir/Patient/abc%0A"), 400, "invalid")
    assert_outcome(web.get("/fhir/Patient/a%0Ab"), 400, "invalid")  # matched no route: was a plain-text 404
    assert_outcome(web.get("/fhir/Patient/abc%00"), 400, "invalid")
    assert web.get("/fhir/Patient/abc").status_code == 200


def test_a_method_no_route_has_is_a_405_operation_outcome(web):
    assert_outcome(web.request("TRACE", "/fhir/Patient"), 405, "not-supported")


def test_json_with_a_zero_weight_is_not_acceptable(web):
    assert_outcome(web.get("/fhir/metadata", headers={"Accept": "application/fhir+json;q=0"}), 406)
    assert web.get("/fhir/metadata", headers={"Accept": "application/fhir+json;q=0.5"}).status_code == 200


# -- HTTP edges (issue 23): the 413 reaches every client, a disconnect is one log line, SIGTERM ends it -----------
def raw_exchange(port: int, head: bytes, body: bytes = b"", read: bool = True) -> bytes:
    """Send a request as raw bytes on a fresh connection and read the answer until the server closes it
    (or 5 s pass); a reset instead of an answer raises ConnectionResetError."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head + body)
        if not read:
            return b""
        out = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and b"connection: close" not in out.lower():
                    head_end = out.index(b"\r\n\r\n") + 4
                    length = int(next((ln.split(b":")[1] for ln in out[:head_end].lower().split(b"\r\n")
                                       if ln.startswith(b"content-length:")), b"0"))
                    if len(out) >= head_end + length:
                        break
        return out


def post_head(size: int | None, *extra: str, path: str = "/fhir/Patient") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", f"Content-Type: {FHIR_JSON}"]
    lines.append(f"Content-Length: {size}" if size is not None else "Transfer-Encoding: chunked")
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def test_a_413_reaches_a_client_that_sends_connection_close(live):
    body = b"x" * (LIMIT * 2)
    for extra in (("Connection: close",), ()):
        out = raw_exchange(live.port, post_head(len(body), *extra), body)
        assert out.startswith(b"HTTP/1.1 413"), out[:200]
        assert b"too-costly" in out
    chunked = b"".join(b"%x\r\n%s\r\n" % (1000, b"y" * 1000) for _ in range(LIMIT // 1000 + 2)) + b"0\r\n\r\n"
    out = raw_exchange(live.port, post_head(None, "Connection: close"), chunked)
    assert out.startswith(b"HTTP/1.1 413"), out[:200]


def test_a_413_leaves_a_keep_alive_connection_usable_after_the_body_is_read(live):
    import socket

    body = b"x" * (LIMIT * 2)
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as sock:
        sock.sendall(post_head(len(body)) + body + b"GET /fhir/metadata HTTP/1.1\r\nHost: test\r\n\r\n")
        out = b""
        while out.count(b"HTTP/1.1 ") < 2 or b'"fhirVersion"' not in out:
            chunk = sock.recv(65536)
            assert chunk, out[:300]
            out += chunk
    assert out.startswith(b"HTTP/1.1 413") and b"HTTP/1.1 200" in out


def test_a_body_far_over_the_limit_is_refused_before_it_is_sent(live):
    """Beyond four times the limit (or when the client waits for 100 Continue) the body is not worth reading:
    the 413 goes out at once and the connection closes."""
    for extra in (("Expect: 100-continue",), ()):
        out = raw_exchange(live.port, post_head(LIMIT * 100, *extra))
        assert out.startswith(b"HTTP/1.1 413"), out[:200]
        assert b"connection: close" in out.lower()


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def server_log():
    """Every record the server side logs (uvicorn's and fhirgym's loggers), INFO and up."""
    handler = _Records()
    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "fhirgym.fhir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


def test_a_client_that_disconnects_mid_body_is_one_quiet_log_line(live):
    before = live.server.store.counts()
    with server_log() as records:
        raw_exchange(live.port, post_head(LIMIT - 10), b'{"resourceType": "Pat', read=False)
        deadline = time.monotonic() + 5
        while not records and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [r.getMessage() for r in records] == ["client disconnected while sending the body of POST /fhir/Patient"]
    assert not any(r.exc_info for r in records)
    assert live.server.store.counts() == before


@pytest.mark.slow
def test_sigterm_ends_a_busy_server_within_seconds(tmp_path):
    """A batch of 30,000 searches (about ten seconds of work) is running, with no request time limit: SIGTERM
    still ends the process in a few seconds (the running request stops at its next check)."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    base = f"http://127.0.0.1:{port}/fhir"
    proc = subprocess.Popen([sys.executable, "-m", "fhirgym.cli", "serve", "--port", str(port),
                             "--limit", "request_timeout=none"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=tmp_path)
    try:
        _wait_until_serving(proc, base)
        batch = {"resourceType": "Bundle", "type": "batch",
                 "entry": [{"request": {"method": "GET", "url": f"Patient?name=n{k}"}} for k in range(30_000)]}
        def send() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server goes away under it
                httpx.post(base, content=orjson.dumps(batch), headers={"Content-Type": FHIR_JSON}, timeout=60)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(1.5)
        assert httpx.get(f"{base}/metadata", timeout=5).status_code == 200  # served beside the batch
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert time.monotonic() - start < 6
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
