"""The server against hostile input: bodies nested to any depth, ids a URL cannot carry, encoded bodies,
forged paging tokens, work beyond its limits (docs/SERVER.md)."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import orjson
import pytest

from fhirgym.fhir import FhirError, FhirServer, InProcessClient, Request, ServerConfig, Store

MAX_DEPTH = 128  # docs/SERVER.md: "a body nested deeper than 128 levels"


def make(**config) -> tuple[FhirServer, InProcessClient]:
    server = FhirServer(Store(), config=ServerConfig(id_seed=11, **config))
    assert not server.load([{"resourceType": "Patient", "id": "p1", "name": [{"family": "Diaz"}]}])
    return server, InProcessClient(server)


def nested(depth: int) -> object:
    """A JSON value ``depth`` levels deep, objects and arrays in turn."""
    value: object = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


def nested_text(depth: int) -> bytes:
    """:func:`nested` as JSON text, however deep (orjson writes at most 254 levels)."""
    heads = [b"[" if level % 2 else b'{"a":' for level in range(depth)]
    tails = [b"]" if level % 2 else b"}" for level in range(depth)]
    return b"".join(reversed(heads)) + b'"leaf"' + b"".join(tails)


HOLE = "@@"
#: every entry point that takes a JSON body: (method, path, body with a hole, levels above the hole)
ENTRY_POINTS = {
    "create": ("POST", "Patient", {"resourceType": "Patient", "extension": HOLE}, 1),
    "update": ("PUT", "Patient/p1", {"resourceType": "Patient", "id": "p1", "extension": HOLE}, 1),
    "batch": ("POST", "", {"resourceType": "Bundle", "type": "batch", "entry": [
        {"resource": {"resourceType": "Patient", "extension": HOLE}, "request": {"method": "POST", "url": "Patient"}}]},
        4),
    "transaction": ("POST", "", {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": {"resourceType": "Patient", "extension": HOLE}, "request": {"method": "POST", "url": "Patient"}}]},
        4),
    "$validate": ("POST", "Patient/$validate", {"resourceType": "Patient", "extension": HOLE}, 1),
    "$validate Parameters": ("POST", "Patient/p1/$validate", {"resourceType": "Parameters", "parameter": [
        {"name": "resource", "resource": {"resourceType": "Patient", "extension": HOLE}}]}, 4),
    "$everything": ("POST", "Patient/p1/$everything", {"resourceType": "Parameters", "parameter": [
        {"name": "_count", "valueString": "1", "extension": HOLE}]}, 3),
}


def fill(template: object, value: object) -> object:
    if template == HOLE:
        return value
    if isinstance(template, dict):
        return {k: fill(v, value) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, value) for v in template]
    return template


DEPTHS = sorted({*range(1, 260), *range(260, 5001, 89), 1023, 1024, 1025, 5000})


@pytest.mark.slow
def test_no_body_nested_1_to_5000_levels_gets_a_5xx_at_any_entry_point():
    """Bodies nested 255-1024 levels were a 500 everywhere (``TypeError: Recursion limit reached``, from
    re-serialising the whole body to check its decimals). Now deeper than 128 is a 400 before any check."""
    server, _client = make()
    snap = server.store.snapshot()
    seen: dict[tuple[str, bool], set[int]] = {}
    headers = {"content-type": "application/fhir+json"}
    for depth in DEPTHS:
        for name, (method, path, template, above) in ENTRY_POINTS.items():
            inner = max(depth - above, 0)
            deep = above + inner > MAX_DEPTH
            text = orjson.dumps(template).replace(f'"{HOLE}"'.encode(), nested_text(inner))
            for body in (text, fill(template, nested(inner))):  # as HTTP gives it, as an in-process client does
                resp = server.handle(Request(method, path, [], headers, body))
                assert resp.status < 500, (name, depth, type(body), resp.body)
                seen.setdefault((name, deep), set()).add(resp.status)
                if deep:
                    issue = resp.body["issue"][0]
                    assert resp.status == 400 and issue["code"] == "too-costly", (name, depth, resp.body)
                    assert f"at most {MAX_DEPTH}" in issue["diagnostics"]
            server.store.reset(snap)
    assert {name for name, deep in seen if deep} == set(ENTRY_POINTS)
    assert all(statuses == {400} for (_name, deep), statuses in seen.items() if deep)
    assert any(s < 300 for (name, deep), statuses in seen.items() if not deep for s in statuses)


def test_decimals_stay_exact_without_re_serialising_the_body():
    _server, client = make()
    text = (b'{"resourceType": "Observation", "status": "final", "code": {"text": "1.50 in a string"},'
            b' "valueQuantity": {"value": 1.50}, "component": [{"code": {"text": "c"}, "valueInteger": -0}]}')
    resp = client.request("POST", "Observation", body=text, headers={"Content-Type": "application/fhir+json"})
    assert resp.status in (201, 422), resp.body
    stored = client.request("POST", "Observation", body=text.replace(b', "component": [{"code": {"text": "c"},'
                                                                     b' "valueInteger": -0}]', b""),
                            headers={"Content-Type": "application/fhir+json"})
    assert stored.status == 201, stored.body
    rid = stored.body["id"]
    raw = Request("GET", f"Observation/{rid}", raw=True)
    from fhirgym.fhir import dumps_json

    assert b'"value":1.50' in dumps_json(client.server.handle(raw).body)


# -- ids ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rid", [".", ".."])
def test_dot_segment_ids_are_refused_on_every_route(rid):
    server, client = make()
    body = {"resourceType": "Patient", "id": rid}
    for method, path, sent in [("GET", f"Patient/{rid}", None), ("PUT", f"Patient/{rid}", body),
                               ("DELETE", f"Patient/{rid}", None), ("GET", f"Patient/{rid}/_history", None),
                               ("GET", f"Patient/{rid}/$everything", None)]:
        resp = client.request(method, path, body=sent)
        assert resp.status == 400 and "a URL cannot carry them" in resp.body["issue"][0]["diagnostics"], (method, path)
    tx = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": body, "request": {"method": "PUT", "url": f"Patient/{rid}"}}]})
    assert tx.status == 400, tx.body
    tx = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"request": {"method": "DELETE", "url": f"Patient/{rid}"}}]})
    assert tx.status == 400, tx.body
    with pytest.raises(FhirError, match="a URL cannot carry them"):
        server.load([body])
    assert client.read("Patient", "p1.").status == 404  # other dots are ids like any


# -- bodies -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_an_encoded_body_is_415_not_a_decoding_error(encoding):
    _server, client = make()
    import gzip

    headers = {"Content-Type": "application/fhir+json", "Content-Encoding": encoding}
    resp = client.request("POST", "Patient", body=gzip.compress(b'{"resourceType": "Patient"}'), headers=headers)
    assert resp.status == 415 and encoding in resp.body["issue"][0]["diagnostics"]
    form = client.request("POST", "Patient/_search", body=b"x", headers={
        "Content-Type": "application/x-www-form-urlencoded", "Content-Encoding": encoding})
    assert form.status == 415
    plain = client.request("POST", "Patient", body=b'{"resourceType": "Patient"}',
                           headers={"Content-Type": "application/fhir+json", "Content-Encoding": "identity"})
    assert plain.status == 201


# -- transactions and conditional creates -------------------------------------------------------------
def test_two_conditional_creates_of_one_resource_in_a_transaction_are_refused():
    server, client = make()
    new = {"resourceType": "Patient", "identifier": [{"system": "http://sys", "value": "42"}]}
    entry = {"resource": new, "request": {"method": "POST", "url": "Patient", "ifNoneExist": "identifier=http://sys|42"}}
    before = server.store.counts()
    resp = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [entry, entry]})
    assert resp.status == 400 and resp.body["issue"][0]["code"] == "duplicate", resp.body
    assert "Bundle.entry[" in resp.body["issue"][0]["diagnostics"] and server.store.counts() == before
    # one of them alone creates it; sent again, the condition matches and nothing more is created
    for status in ("201 Created", "200 OK"):
        once = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [entry]})
        assert once.status == 200 and once.body["entry"][0]["response"]["status"] == status
    assert server.store.counts()["Patient"] == before["Patient"] + 1
    # a plain create of a resource the condition selects, beside it: refused too
    other = {**new, "identifier": [{"system": "http://sys", "value": "43"}]}
    conditional = {"resource": other, "request": {**entry["request"], "ifNoneExist": "identifier=http://sys|43"}}
    plain = {"resource": other, "request": {"method": "POST", "url": "Patient"}}
    assert client.transaction({"resourceType": "Bundle", "type": "transaction",
                               "entry": [conditional, plain]}).status == 400


@pytest.mark.parametrize("prefer", ["return=OperationOutcome", "return=minimal", "return=representation"])
def test_a_matched_conditional_create_honours_prefer(prefer):
    _server, client = make()
    headers = {"If-None-Exist": "family=Diaz", "Prefer": prefer}
    resp = client.request("POST", "Patient", body={"resourceType": "Patient", "name": [{"family": "Diaz"}]},
                          headers=headers)
    assert resp.status == 200
    if prefer == "return=OperationOutcome":
        assert resp.body["resourceType"] == "OperationOutcome" and "nothing was created" in str(resp.body)
    elif prefer == "return=minimal":
        assert resp.body is None
    else:
        assert resp.body["resourceType"] == "Patient" and resp.body["id"] == "p1"


# -- paging tokens ------------------------------------------------------------------------------------------
def _token(kind: str, args: list) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([kind, args, "0.0"])).decode().rstrip("=")


@pytest.mark.parametrize("kind,args", [
    ("s", ["NotAType", [], False]), ("s", ["Patient/../x", [], False]),
    ("h", ["x", "NoSuchType", None, [], None]), ("h", ["x", "Patient", "..", [], None]), ("h", ["x", None, "p1", [], None]),
    ("e", ["..", [], []]), ("e", ["a/b", [], []]),
])
def test_forged_paging_tokens_are_410(kind, args):
    """A forged token searched unknown types (200, empty)."""
    _server, client = make()
    resp = client.request("GET", "", {"_getpages": _token(kind, args)})
    assert resp.status == 410, resp.body
    assert client.request("GET", "", {"_getpages": _token("s", ["Patient", [], False])}).status == 200


# -- HTTP: idle and slow clients, shutdown -------------------------------------------------------------------
@pytest.fixture(scope="module")
def impatient():
    from _live_server import LiveServer

    with LiveServer(header_timeout=0.5, body_timeout=0.5) as live:
        yield live


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_an_idle_connection_is_closed_after_header_timeout(impatient):
    sock = _connect(impatient.port)
    start = time.monotonic()
    assert _read_all(sock) == b""  # closed by the server, nothing said: nothing was asked
    assert time.monotonic() - start < 5
    sock.close()


def test_a_slowloris_head_is_answered_408_and_closed(impatient):
    sock = _connect(impatient.port)
    start = time.monotonic()
    head = b"GET /fhir/metadata HTTP/1.1\r\nHost: x\r\nX-Slow: "
    with contextlib.suppress(OSError):  # the server may close while we still send
        for byte in head:
            sock.send(bytes([byte]))
            time.sleep(0.02)
        for _ in range(100):  # a byte every 0.1 s, never the end of the head
            sock.send(b"a")
            time.sleep(0.1)
    answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"header_timeout" in answer, answer[:200]
    assert time.monotonic() - start < 6
    sock.close()


def test_a_slow_body_is_408_and_a_prompt_client_is_served(impatient):
    sock = _connect(impatient.port)
    sock.sendall(b"POST /fhir/Patient HTTP/1.1\r\nHost: x\r\nContent-Type: application/fhir+json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"resourceType\"")
    answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer, answer[:300]
    sock.close()
    import httpx

    resp = httpx.post(f"{impatient.base_url}/Patient", json={"resourceType": "Patient"},
                      headers={"Content-Type": "application/fhir+json"}, timeout=10)
    assert resp.status_code == 201
    with httpx.Client(timeout=10) as web:  # keep-alive: a second request after a short pause
        assert web.get(f"{impatient.base_url}/metadata").status_code == 200
        time.sleep(0.2)
        assert web.get(f"{impatient.base_url}/metadata").status_code == 200


@pytest.mark.slow
def test_sigterm_answers_a_running_request_503_and_removes_the_scratch_layer(tmp_path):
    """SIGTERM answered in-flight requests 500 (uvicorn cancelled them 1 s after the grace period) and left
    the scratch layer of plain ``serve`` on disk (uvicorn re-raised SIGTERM after shutting down)."""
    import httpx

    from _live_server import bound_socket
    from test_http import _wait_until_serving

    sock = bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    base = f"http://127.0.0.1:{port}/fhir"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "fhirgym.cli", "serve", "--port", str(port),
                             "--limit", "request_timeout=none"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TMPDIR": str(scratch)}, cwd=tmp_path)
    try:
        _wait_until_serving(proc, base)
        assert [p.name for p in scratch.iterdir() if p.name.startswith("fhirgym-serve-")]
        body = orjson.dumps({"resourceType": "Bundle", "type": "collection", "entry": [
            {"resource": {"resourceType": "Patient", "name": [{"family": f"F{k}"}]}} for k in range(100_000)]})
        answer: dict = {}

        def send() -> None:
            resp = httpx.post(f"{base}/Bundle", content=body, headers={"Content-Type": "application/fhir+json"},
                              timeout=60)
            answer["status"], answer["body"] = resp.status_code, resp.json()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(2.5)  # the Bundle is being validated (about a minute of work)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        elapsed = time.monotonic() - start
        sender.join(10)
        assert answer.get("status") == 503, answer
        assert answer["body"]["resourceType"] == "OperationOutcome" and "shutting down" in str(answer["body"])
        assert elapsed < 8
        assert [p.name for p in scratch.iterdir()] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
