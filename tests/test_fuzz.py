"""Property-based fuzzing of :meth:`FhirServer.handle`: random methods, paths, query parameters, headers and
bodies (random bytes, random JSON, mutated valid resources, random Bundles).

Invariants checked for every request:

* the status is never 5xx (a 5xx is a bug in fhirgym by the server's own contract);
* every 4xx body is an OperationOutcome with at least one issue carrying ``severity`` and ``code``;
* every 2xx body is ``None`` or a FHIR resource (a dict with ``resourceType``);
* a request answered with >= 400 changed nothing: live counts per type, and a checksum of the
  ``main.resources`` / ``main.history`` tables, are the same before and after.

Runs derandomized (fixed seed, no example database) so that CI is reproducible; each example starts from
the same seeded snapshot.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fhirgym.fhir import FhirServer, Request, Response, ServerConfig, Store

#: FHIRGYM_FUZZ_EXAMPLES=5000 FHIRGYM_FUZZ_RANDOM=1 turns this into a longer, randomised bug hunt.
FUZZ = settings(
    max_examples=int(os.environ.get("FHIRGYM_FUZZ_EXAMPLES", "250")),
    derandomize=not os.environ.get("FHIRGYM_FUZZ_RANDOM"),
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

SEED = [
    {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "1980-02-03",
     "name": [{"family": "Diaz", "given": ["Ana"]}], "identifier": [{"system": "http://sys", "value": "1"}]},
    {"resourceType": "Patient", "id": "p2", "gender": "male", "name": [{"family": "Smith"}],
     "identifier": [{"system": "http://sys", "value": "2"}]},
    {"resourceType": "Practitioner", "id": "dr1", "name": [{"family": "House"}]},
    {"resourceType": "Observation", "id": "o1", "status": "final",
     "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}]},
     "subject": {"reference": "Patient/p1"}, "performer": [{"reference": "Practitioner/dr1"}],
     "effectiveDateTime": "2024-01-02T10:00:00Z",
     "valueQuantity": {"value": 72, "unit": "/min", "system": "http://unitsofmeasure.org", "code": "/min"}},
    {"resourceType": "Encounter", "id": "e1", "status": "finished", "class": {"code": "AMB"},
     "subject": {"reference": "Patient/p2"}},
    {"resourceType": "Appointment", "id": "a1", "status": "booked", "start": "2025-06-02T09:00:00Z",
     "end": "2025-06-02T09:30:00Z", "participant": [{"actor": {"reference": "Patient/p1"}, "status": "accepted"}]},
]
TEMPLATES = {r["resourceType"]: r for r in SEED}


class Seeded:
    """The fuzzed server and the snapshot every example starts from (short repr for failure reports)."""

    def __init__(self) -> None:
        self.server = FhirServer(Store(), config=ServerConfig(id_seed=99, max_body_bytes=64 * 1024))
        assert self.server.load(copy.deepcopy(SEED)) == []
        self.snap = self.server.store.snapshot()

    def fresh(self) -> FhirServer:
        self.server.store.reset(self.snap)
        return self.server

    def __repr__(self) -> str:
        return "Seeded()"


@pytest.fixture(scope="module")
def seeded():
    s = Seeded()
    yield s
    s.server.store.close()


# -- strategies --------------------------------------------------------------------------------------------
TYPES = ["Patient", "Observation", "Encounter", "Appointment", "Practitioner", "Bundle", "Foo", "patient",
         "OperationOutcome", "Parameters"]
IDS = ["p1", "p2", "o1", "e1", "a1", "dr1", "nope", "x';DROP TABLE resources;--", "..", "../etc", "a" * 65,
       "a" * 64, "%00", "-", "é", " ", "$everything", "_history", "1.2.3", "abc\n", "99999999999999999999",
       "\u00b2", "\u0663"]
SPECIAL = ["_history", "$validate", "$everything", "$meta", "_search", "metadata", "$export", ""]

text = st.text(max_size=12)
segment = st.one_of(st.sampled_from(TYPES), st.sampled_from(IDS), st.sampled_from(SPECIAL),
                    st.integers(-2, 5).map(str), text.filter(lambda s: "/" not in s))
paths = st.one_of(
    st.lists(segment, max_size=5).map("/".join),
    st.tuples(st.sampled_from(TYPES), st.sampled_from(IDS)).map("/".join),
    st.tuples(st.sampled_from(TYPES), st.sampled_from(IDS), st.sampled_from(["_history", "$everything", "$validate"]),
              st.one_of(st.just(""), st.integers(-1, 4).map(str), text)).map(lambda t: "/".join(x for x in t if x)),
    st.sampled_from(["", "metadata", "_history", "Patient/_history", "Patient/p1/_history", "Patient/p1/_history/1",
                     "Patient/p1/$everything", "Patient/$validate", "Patient/_search"]),
)
PARAM_NAMES = ["_id", "_count", "_since", "_sort", "_include", "_revinclude", "_summary", "_elements", "_total",
               "_format", "_pretty", "_cascade", "_type", "_getpages", "_getpagesoffset", "_lastUpdated", "name",
               "family", "gender", "birthdate", "identifier", "subject", "patient", "code", "value-quantity",
               "date", "status", "general-practitioner", "code-value-quantity", "_has:Observation:patient:code",
               "subject:Patient.name", "subject.name", "_tag", "_profile", "_text", "_content", "_list"]
MODIFIERS = ["", ":exact", ":contains", ":missing", ":not", ":text", ":in", ":below", ":above", ":identifier",
             ":Patient", ":iterate", ":bogus", ":of-type", ":code-text"]
PREFIXES = ["", "eq", "ne", "gt", "lt", "ge", "le", "sa", "eb", "ap", "zz"]
VALUES = ["p1", "Patient/p1", "http://sys|1", "|1", "http://sys|", "1980", "1980-02-03", "2024-01-02T10:00:00Z",
          "1974-13-45", "72|http://unitsofmeasure.org|/min", "72", "-1", "0", "1e400", "NaN", "true", "false",
          "Observation:subject", "Patient:*", "*", "json", "xml", "text/html", "delete", "name,gender", "count",
          "accurate", "8867-4$72", "", ",", "\\,", "'", "%", "\x00", " ", "1e999999999", "\u00b2", "\u0663",
          "1_000", "99999999999999999999", "8867-4$1e999999999", "a" * 3000]
values = st.one_of(st.tuples(st.sampled_from(PREFIXES), st.sampled_from(VALUES)).map("".join), text,
                   st.integers().map(str), st.floats(allow_nan=True).map(str))
names = st.one_of(st.tuples(st.sampled_from(PARAM_NAMES), st.sampled_from(MODIFIERS)).map("".join), text)
queries = st.lists(st.tuples(names, values), max_size=5)

header_values = st.one_of(text, st.sampled_from(['W/"1"', 'W/"2"', '"1"', "W/", 'W/"x"', "*", "1", 'W/"99999999999"',
                                                 'W/"99999999999999999999"', 'W/"\u00b2"', "1_0"]))
headers = st.fixed_dictionaries({}, optional={
    "if-match": header_values,
    "if-none-exist": st.one_of(st.tuples(names, values).map(lambda t: f"{t[0]}={t[1]}"), text,
                               st.just("identifier=http://sys|1"), st.just("Patient?identifier=http://sys|1")),
    "prefer": st.sampled_from(["return=minimal", "return=representation", "return=OperationOutcome",
                               "handling=strict", "handling=lenient", "respond-async", "garbage"]),
    "content-type": st.sampled_from(["application/fhir+json", "application/json", "application/xml",
                                     "application/x-www-form-urlencoded", "text/plain", "",
                                     "application/fhir+json; charset=utf-8"]),
})

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), text)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=15)
FIELD_NAMES = ["resourceType", "id", "meta", "text", "name", "gender", "birthDate", "identifier", "subject",
               "status", "code", "participant", "valueQuantity", "effectiveDateTime", "reference", "extension",
               "contained", "entry", "type", "request", "resource", "foo", "_gender", "valueString"]


@st.composite
def mutated_resources(draw) -> dict:
    """A valid seed resource with a few random edits (set / delete / retype a key, also one level deep)."""
    res = copy.deepcopy(draw(st.sampled_from(SEED)))
    if draw(st.booleans()):
        res.pop("id", None)
    for _ in range(draw(st.integers(0, 3))):
        target = res
        nested = [k for k, v in res.items() if isinstance(v, dict)]
        if nested and draw(st.booleans()):
            target = res[draw(st.sampled_from(nested))]
        op = draw(st.sampled_from(["set", "delete", "ref"]))
        key = draw(st.one_of(st.sampled_from(FIELD_NAMES), text))
        if op == "set":
            target[key] = draw(json_values)
        elif op == "delete" and target:
            target.pop(draw(st.sampled_from(sorted(target))), None)
        else:
            target[key] = {"reference": draw(st.sampled_from(
                ["Patient/p1", "Patient/nope", "urn:uuid:1", "Patient?identifier=http://sys|1", "#x", "Foo/1",
                 "http://elsewhere/Patient/1", "Patient/x';--", ""]))}
    return res


@st.composite
def bundles(draw) -> dict:
    entries = []
    for _ in range(draw(st.integers(0, 4))):
        entry: dict = {}
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "get", "XYZ"]))
        url = draw(st.one_of(st.sampled_from(["Patient", "Patient/p1", "Observation/o1", "Patient/new1",
                                              "Patient?identifier=http://sys|1", "Observation?subject=Patient/p1",
                                              "Patient/p1/_history/1", "Foo/1", "Patient/x';--", "", "/", "?"]),
                             text))
        if draw(st.booleans()):
            entry["fullUrl"] = draw(st.sampled_from(["urn:uuid:1", "urn:uuid:2", "Patient/p1", "http://x/Patient/9"]))
        entry["request"] = draw(st.one_of(
            st.just({"method": method, "url": url}),
            st.fixed_dictionaries({"method": st.just(method), "url": st.just(url)},
                                  optional={"ifNoneExist": st.one_of(st.sampled_from(["identifier=http://sys|1",
                                                                                     "x=y", ""]), json_values),
                                            "ifMatch": st.one_of(header_values, json_values)}),
            json_values,
        ))
        if draw(st.booleans()):
            entry["resource"] = draw(st.one_of(mutated_resources(), json_values))
        entries.append(entry if draw(st.integers(0, 9)) else draw(json_values))
    bundle: dict = {"resourceType": "Bundle", "type": draw(st.sampled_from(["transaction", "batch", "collection", None]))}
    if draw(st.integers(0, 9)):
        bundle["entry"] = entries
    else:
        bundle["entry"] = draw(json_values)
    return bundle


def dumps(value) -> bytes:
    """JSON bytes (the stdlib encoder: unlike orjson it accepts integers beyond 64 bits)."""
    return json.dumps(value).encode()


def encoded(strategy):
    return st.one_of(strategy, strategy.map(dumps))


parameters = st.builds(
    lambda params: {"resourceType": "Parameters", "parameter": params},
    st.one_of(json_values, st.lists(st.one_of(
        st.fixed_dictionaries({"name": st.sampled_from(["resource", "mode", "x"])},
                              optional={"resource": st.one_of(mutated_resources(), json_values)}),
        json_values), max_size=3)),
)
bodies = st.one_of(
    st.none(),
    encoded(parameters),
    st.binary(max_size=64),
    encoded(json_values.filter(lambda v: v is not None)),
    encoded(mutated_resources()),
    encoded(bundles()),
)
METHODS = st.one_of(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]), text)


# -- invariants --------------------------------------------------------------------------------------------
def fingerprint(server: FhirServer) -> tuple:
    """Live counts plus a cheap checksum of the layer's resource and history tables."""
    q = server.store.query
    return (
        server.store.counts(),
        q("SELECT count(*), coalesce(sum(version), 0), max(last_updated) FROM main.resources")[0],
        q("SELECT count(*), coalesce(sum(version), 0), max(last_updated) FROM main.history")[0],
        q("SELECT count(*) FROM main.refs")[0],
    )


def check(server: FhirServer, req: Request) -> Response:
    before = fingerprint(server)
    resp = server.handle(req)
    assert resp.status < 500, (req, resp.body)
    if resp.status >= 400:
        body = resp.body
        assert isinstance(body, dict) and body.get("resourceType") == "OperationOutcome", (req, resp.status, body)
        assert body["issue"], body
        for issue in body["issue"]:
            assert issue.get("severity") in ("fatal", "error", "warning", "information"), issue
            assert isinstance(issue.get("code"), str) and issue["code"], issue
        assert fingerprint(server) == before, f"failing request {req} ({resp.status}) changed the store"
    else:
        assert resp.body is None or isinstance(resp.body.get("resourceType"), str), resp.body
    orjson.dumps(resp.body)  # always serialisable
    return resp


@FUZZ
@given(method=METHODS, path=paths, query=queries, hdrs=headers, body=bodies)
# regressions found by this fuzzer (each was a 500)
@example(method="POST", path="Patient/$validate", query=[], hdrs={},
         body={"resourceType": "Parameters", "parameter": [1]})
@example(method="POST", path="Patient/$validate", query=[], hdrs={}, body={"resourceType": "Parameters", "parameter": "x"})
@example(method="POST", path="", query=[], hdrs={}, body={"resourceType": "Bundle", "type": "transaction", "entry": [
    {"request": {"method": "DELETE", "url": "Patient/p1"}, "resource": True}]})
@example(method="POST", path="Observation", query=[], hdrs={}, body={
    "resourceType": "Observation", "status": "final", "code": {"text": "x"}, "valueQuantity": {"value": 2**70}})
# found by black-box probing over HTTP (each was a 500)
@example(method="GET", path="Observation", query=[("value-quantity", "1e999999999")], hdrs={}, body=None)
@example(method="GET", path="Patient/p1/_history/99999999999999999999", query=[], hdrs={}, body=None)
@example(method="GET", path="Patient/p1/_history/\u00b2", query=[], hdrs={}, body=None)
@example(method="POST", path="", query=[], hdrs={}, body={"resourceType": "Bundle", "type": "batch", "entry": [
    {"request": {"method": "POST", "url": "Patient", "ifNoneExist": 5}, "resource": {"resourceType": "Patient"}}]})
def test_any_request_is_answered_cleanly(seeded, method, path, query, hdrs, body):
    server = seeded.fresh()
    check(server, Request(method, path, query, hdrs, body))


@FUZZ
@given(rtype=st.sampled_from(["Patient", "Observation", "Encounter", "Appointment"]), rid=st.sampled_from(IDS),
       method=st.sampled_from(["POST", "PUT", "DELETE"]), hdrs=headers,
       body=st.one_of(mutated_resources(), mutated_resources().map(dumps)), query=queries)
def test_writes_with_mutated_resources(seeded, rtype, rid, method, hdrs, body, query):
    server = seeded.fresh()
    # POST creates; PUT/DELETE go to an instance, or (drawn id "nope" with a query) are conditional on the type
    path = rtype if method == "POST" or (query and rid == "nope") else f"{rtype}/{rid}"
    check(server, Request(method, path, query if path == rtype else [], hdrs, body))


@FUZZ
@given(bundle=bundles(), raw=st.booleans())
@example(bundle={"resourceType": "Bundle", "type": "transaction", "entry": [
    {"request": {"method": "GET", "url": "Patient/p1"}, "resource": [1]}]}, raw=False)
def test_batch_and_transaction_bundles(seeded, bundle, raw):
    server = seeded.fresh()
    resp = check(server, Request("POST", "", [], {}, dumps(bundle) if raw else bundle))
    if resp.status == 200:
        # a processed batch/transaction answers one response entry per request entry, in request order
        assert resp.body["type"] == f"{bundle['type']}-response"
        assert len(resp.body.get("entry", [])) == len(bundle["entry"])
        for entry in resp.body.get("entry", []):
            assert entry["response"]["status"][:3].isdigit()
            assert not entry["response"]["status"].startswith("5"), entry  # a batch entry's 500 is a bug too


@FUZZ
@given(rtype=st.sampled_from(["Patient", "Observation", "Encounter", "Foo"]), query=queries, hdrs=headers)
def test_search_params(seeded, rtype, query, hdrs):
    server = seeded.server
    hdrs = {k: v for k, v in hdrs.items() if k == "prefer"}
    resp = check(server, Request("GET", rtype, query, hdrs, None))
    if resp.status == 200:
        follow = server.handle(Request("GET", rtype, query, hdrs, None))
        assert follow.status == 200
        assert follow.body["resourceType"] == "Bundle"


# -- the HTTP edges: bodies around the size limit, Connection: close, chunking, clients that go away ----------
HTTP_LIMIT = 4096


@pytest.fixture(scope="module")
def http_server():
    from _live_server import LiveServer

    with LiveServer(max_body_bytes=HTTP_LIMIT) as srv:
        yield srv


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 60))
@given(size=st.integers(0, 6 * HTTP_LIMIT), chunked=st.booleans(), close=st.booleans(),
       cut=st.none() | st.floats(0, 0.99))
def test_http_bodies_around_the_limit_are_answered_or_quietly_dropped(http_server, size, chunked, close, cut):
    """Whatever the body's size and framing, a client that sends it all gets an answer (413 beyond the
    limit), never a reset; one that goes away mid-body leaves no traceback in the server's log."""
    import socket

    from test_http import server_log

    body = b"x" * size
    framed = (b"%x\r\n%s\r\n" % (size, body) if size else b"") + b"0\r\n\r\n" if chunked else body
    head = ["POST /fhir/Patient HTTP/1.1", "Host: fuzz", "Content-Type: application/fhir+json",
            "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"]
    if close:
        head.append("Connection: close")
    data = ("\r\n".join(head) + "\r\n\r\n").encode()
    with server_log() as records:
        with socket.create_connection(("127.0.0.1", http_server.port), timeout=10) as sock:
            if cut is not None:
                sock.sendall(data + framed[: int(len(framed) * cut)])
                sock.shutdown(socket.SHUT_RDWR)
            else:
                sock.sendall(data + framed)
                out = b""
                while b"\r\n\r\n" not in out:
                    chunk = sock.recv(65536)  # a reset raises ConnectionResetError
                    assert chunk, f"closed without an answer after {out!r}"
                    out += chunk
                status = int(out.split(b" ", 2)[1])
                assert status == 413 if size > HTTP_LIMIT else 400 <= status < 500, out[:300]
        time.sleep(0.05)
    assert not any(r.exc_info or r.levelno >= logging.ERROR for r in records), [r.getMessage() for r in records]
