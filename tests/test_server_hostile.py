"""The server against hostile input: bodies nested to any depth, ids a URL cannot carry, encoded bodies,
forged paging tokens, work beyond its limits (docs/SERVER.md)."""

from __future__ import annotations

import re

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
        assert resp.status == 400 and "not '.' or '..'" in resp.body["issue"][0]["diagnostics"], (method, path)
    tx = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": body, "request": {"method": "PUT", "url": f"Patient/{rid}"}}]})
    assert tx.status == 400, tx.body
    tx = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"request": {"method": "DELETE", "url": f"Patient/{rid}"}}]})
    assert tx.status == 400, tx.body
    with pytest.raises(FhirError, match=re.escape("not '.' or '..'")):
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
