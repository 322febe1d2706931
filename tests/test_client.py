"""The two client backends: ``HttpClient`` over a real socket behaves like ``InProcessClient`` (same statuses,
same shapes, same header access), and each ``reset()`` undoes exactly what it should.
"""

from __future__ import annotations

import uuid

import pytest

from _live_server import LiveServer
from fhirgym.fhir import FhirServer, HttpClient, InProcessClient, Store, TransportError

SYS = "http://example.org/mrn"


@pytest.fixture(scope="module")
def live():
    with LiveServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def proxied():
    """A server whose configured public base URL differs from the address clients connect to (a proxy)."""
    with LiveServer(base_url="https://fhir.example.org/fhir") as srv:
        yield srv


@pytest.fixture
def http(live):
    client = HttpClient(live.base_url)
    yield client
    client.close()


def patient(mrn: str, **extra) -> dict:
    return {"resourceType": "Patient", "identifier": [{"system": SYS, "value": mrn}], "name": [{"family": "Diaz"}],
            **extra}


def obs(subject: str, text: str = "hr") -> dict:
    return {"resourceType": "Observation", "status": "final", "code": {"text": text},
            "subject": {"reference": subject}}


def summary(resp) -> tuple:
    """Status plus the shape of the response: what a caller branches on, without ids or timestamps."""
    body = resp.body
    shape: tuple = (resp.status,)
    if body is None:
        shape += (None,)
    else:
        shape += (body.get("resourceType"),)
        if body.get("resourceType") == "OperationOutcome":
            shape += (tuple((i["severity"], i["code"], tuple(i.get("expression", []))) for i in body["issue"]),)
        elif body.get("resourceType") == "Bundle":
            shape += (body.get("type"), body.get("total"), len(body.get("entry", [])),
                      tuple(e.get("response", {}).get("status") for e in body.get("entry", [])))
        else:
            shape += (tuple(sorted(body)), body.get("meta", {}).get("versionId"))
    # header names are looked up the same way on both backends (canonical spelling)
    shape += tuple(name for name in ("ETag", "Location", "Last-Modified") if resp.headers.get(name))
    return shape


def scenario(client) -> list[tuple]:
    """The same interactions on any backend; returns the summary of every response."""
    mrn = uuid.uuid4().hex  # the HTTP server is shared by the module: keep this run's data apart
    out = []
    created = client.create(patient(mrn))
    pid = created.body["id"]
    out.append(summary(created))
    out.append(summary(client.read("Patient", pid)))
    out.append(summary(client.vread("Patient", pid, 1)))
    out.append(summary(client.update({**patient(mrn, gender="female"), "id": pid})))
    out.append(summary(client.update({**patient(mrn), "id": pid}, if_match=1)))  # stale: 412
    out.append(summary(client.search("Patient", {"identifier": f"{SYS}|{mrn}"})))
    out.append(summary(client.create(patient(mrn), if_none_exist=f"identifier={SYS}|{mrn}")))  # exists: 200
    out.append(summary(client.create(patient(mrn, gender="robot"))))  # 422 with expression
    out.append(summary(client.read("Patient", "does-not-exist")))
    out.append(summary(client.read("Foo", "1")))
    out.append(summary(client.request("GET", "Patient/x';DROP TABLE resources;--")))
    out.append(summary(client.history("Patient", pid)))
    tx = client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:0b0e7b3c-4b53-4a57-9a1f-4f7d2b0f1a11", "resource": patient(mrn + "-2"),
         "request": {"method": "POST", "url": "Patient"}},
        {"resource": obs("urn:uuid:0b0e7b3c-4b53-4a57-9a1f-4f7d2b0f1a11"), "request": {"method": "POST", "url": "Observation"}},
    ]})
    out.append(summary(tx))
    new_pid = tx.body["entry"][0]["response"]["location"].split("/")[1]
    oid = tx.body["entry"][1]["response"]["location"].split("/")[1]
    out.append(summary(client.delete("Patient", new_pid)))  # referenced: 409
    out.append(summary(client.delete("Observation", oid)))
    out.append(summary(client.read("Observation", oid)))  # 410
    out.append(summary(client.delete("Patient", new_pid)))  # no longer referenced
    out.append(summary(client.request("POST", "Patient/$validate", body=patient(mrn, birthDate="1974-13-45"))))
    out.append(summary(client.request("POST", "Patient", body=patient(mrn), headers={"Prefer": "return=minimal"})))
    out.append(summary(client.request("POST", "Patient", body=b'{"resourceType": "Patient",')))  # malformed: 400
    out.append(summary(client.request("PUT", "Patient", {"identifier": f"{SYS}|{mrn}"}, body=patient(mrn))))  # 2 match
    out.append(summary(client.search("Patient", {"identifier": f"{SYS}|{mrn}", "_count": "1"})))
    out.append(("search_all", len(client.search_all("Patient", {"identifier": f"{SYS}|{mrn}", "_count": "1"}))))
    return out


def test_http_client_matches_in_process_client(live, http):
    in_process = InProcessClient(FhirServer(Store()))
    expected = scenario(in_process)
    got = scenario(http)
    for n, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert a == b, f"step {n}: in-process {a} != http {b}"
    # spot-check that the comparison covers what matters
    assert expected[0][:2] == (201, "Patient") and "ETag" in expected[0] and "Location" in expected[0]
    assert expected[4][0] == 412 and expected[7][0] == 422 and expected[12][2] == "transaction-response"
    assert expected[-1] == ("search_all", 2)


def test_http_client_header_lookup_is_case_insensitive(http):
    resp = http.create(patient(uuid.uuid4().hex))
    assert resp.status == 201
    assert resp.headers["ETag"] == resp.headers["etag"] == 'W/"1"'
    assert resp.headers.get("Location", "").startswith(http.base_url + "/Patient/")
    assert "location" in resp.headers and "Location" in resp.headers


def test_http_client_transport_error():
    client = HttpClient("http://127.0.0.1:9/fhir", timeout=2)  # discard port: nothing listens
    with pytest.raises(TransportError):
        client.read("Patient", "1")
    client.close()


# -- HttpClient.reset: exactly its own changes ----------------------------------------------------------------
def _content(resp) -> dict | None:
    """A resource without server-managed meta (what a restore must bring back), or None when not live."""
    if resp.status != 200:
        return None
    meta = {k: v for k, v in resp.body.get("meta", {}).items() if k not in ("versionId", "lastUpdated")}
    return {**{k: v for k, v in resp.body.items() if k != "meta"}, "meta": meta}


def _state(client, keys) -> dict:
    return {key: _content(client.read(*key)) for key in keys}


@pytest.mark.parametrize("server_fixture", ["live", "proxied"])
def test_http_client_reset_undoes_exactly_its_own_changes(request, server_fixture):
    srv = request.getfixturevalue(server_fixture)
    tag = uuid.uuid4().hex[:8]
    other = HttpClient(srv.base_url, track_changes=False)  # someone else's data
    ids = {name: f"{name}-{tag}" for name in ("p1", "p2", "p3", "p4", "p5", "p6", "p7", "o1", "o2")}
    label = {"tag": [{"system": "http://example.org/tags", "code": "keep-me"}]}  # restored along with the data
    for name in ("p1", "p2", "p3", "p4", "p5", "p6", "p7"):
        assert other.update({**patient(f"{name}-{tag}"), "id": ids[name], "meta": label}).status == 201
    assert other.update({**obs(f"Patient/{ids['p1']}"), "id": ids["o1"]}).status == 201
    assert other.update({**obs(f"Patient/{ids['p2']}", "bp"), "id": ids["o2"]}).status == 201
    keys = [("Patient", ids[n]) for n in ("p1", "p2", "p3", "p4", "p5", "p6", "p7")]
    keys += [("Observation", ids["o1"]), ("Observation", ids["o2"])]
    before = _state(other, keys)
    counts_before = srv.server.store.counts()

    a = HttpClient(srv.base_url)
    # plain REST: create, create-then-update, update of another's resource, delete of another's resource
    a1 = a.create(patient(f"a1-{tag}")).body["id"]
    a_obs = a.create(obs(f"Patient/{a1}")).body["id"]
    assert a.update({**obs(f"Patient/{a1}", "changed"), "id": a_obs}).status == 200
    assert a.update({**patient(f"p1-{tag}", gender="male"), "id": ids["p1"]}).status == 200
    # another's Observation now points at a1: reset must restore o1 before it can delete a1
    assert a.update({**obs(f"Patient/{a1}"), "id": ids["o1"]}).status == 200
    assert a.delete("Observation", ids["o2"]).status == 200
    assert a.update({**patient("put-created"), "id": f"a-put-{tag}"}).status == 201  # update-as-create
    # conditional update and conditional delete of others' resources
    assert a.request("PUT", "Patient", {"identifier": f"{SYS}|p3-{tag}"},
                     body=patient(f"p3-{tag}", gender="other")).status == 200
    assert a.request("DELETE", "Patient", {"identifier": f"{SYS}|p4-{tag}"}).status == 200
    # a failed update must not be "restored" later over someone else's newer data
    assert a.update({**patient(f"p7-{tag}", gender="robot"), "id": ids["p7"]}).status == 422
    # a transaction: create with urn:uuid reference, update, delete, conditional update
    tx = a.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:5d6c1f4e-8a55-4a52-8a1e-4a1c1b8b9e01", "resource": patient(f"tx-{tag}"),
         "request": {"method": "POST", "url": "Patient"}},
        {"resource": obs("urn:uuid:5d6c1f4e-8a55-4a52-8a1e-4a1c1b8b9e01"), "request": {"method": "POST", "url": "Observation"}},
        {"resource": {**patient(f"p5-{tag}", gender="female"), "id": ids["p5"]},
         "request": {"method": "PUT", "url": f"Patient/{ids['p5']}"}},
        {"request": {"method": "DELETE", "url": f"Patient/{ids['p6']}"}},
        {"resource": patient(f"p2-{tag}", gender="unknown"),
         "request": {"method": "PUT", "url": f"Patient?identifier={SYS}|p2-{tag}"}},
    ]})
    assert tx.status == 200, tx.body
    tx_created = [tuple(e["response"]["location"].split("/")[:2]) for e in tx.body["entry"][:2]]

    # meanwhile someone else works too: B's creation and B's update of p7 must survive A's reset
    b = HttpClient(srv.base_url)
    b1 = b.create(patient(f"b1-{tag}")).body["id"]
    assert b.update({**patient(f"p7-{tag}", gender="female"), "id": ids["p7"]}).status == 200
    b_state = _content(b.read("Patient", b1)), _content(b.read("Patient", ids["p7"]))

    a.reset()

    after = _state(other, keys)
    expected = {**before, ("Patient", ids["p7"]): b_state[1]}
    assert after == expected
    for key in [("Patient", a1), ("Observation", a_obs), ("Patient", f"a-put-{tag}"), *tx_created]:
        assert other.read(*key).status in (404, 410), key
    assert (_content(other.read("Patient", b1)), _content(other.read("Patient", ids["p7"]))) == b_state
    counts = srv.server.store.counts()
    counts_before["Patient"] = counts_before.get("Patient", 0) + 1  # B's creation
    assert counts == counts_before
    # a second reset has nothing left to undo
    a.reset()
    assert _state(other, keys) == expected
    for c in (a, b, other):
        c.close()


# -- InProcessClient.reset ------------------------------------------------------------------------------------
def test_in_process_reset_returns_to_the_snapshot():
    server = FhirServer(Store())
    seed = InProcessClient(server)
    pid = seed.update({**patient("seed"), "id": "seed"}).body["id"]
    assert seed.create(obs(f"Patient/{pid}")).status == 201
    snap = server.store.snapshot()
    counts = server.store.counts()
    history = server.store.query("SELECT count(*) FROM main.history")
    seeded_patient = seed.read("Patient", pid).body

    client = InProcessClient(server, snap)
    client.create(patient("new"))
    client.update({**patient("seed", gender="male"), "id": pid})
    client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": patient("tx"), "request": {"method": "POST", "url": "Patient"}}]})
    assert client.read("Patient", pid).body["meta"]["versionId"] == "2"
    assert server.store.counts() != counts

    client.reset()
    assert server.store.counts() == counts
    assert server.store.query("SELECT count(*) FROM main.history") == history
    assert client.read("Patient", pid).body == seeded_patient
    assert client.history("Patient", pid).body["total"] == 1


def test_in_process_reset_without_snapshot_empties_the_layer():
    server = FhirServer(Store())
    client = InProcessClient(server)
    client.create(patient("x"))
    assert server.store.counts() == {"Patient": 1}
    client.reset()
    assert server.store.counts() == {}
    assert client.history().body["total"] == 0


def test_in_process_client_never_aliases_the_callers_objects():
    server = FhirServer(Store())
    client = InProcessClient(server)
    body = patient("alias")
    resp = client.create(body)
    assert "id" not in body and "meta" not in body
    resp.body["name"][0]["family"] = "Changed"
    assert client.read("Patient", resp.body["id"]).body["name"][0]["family"] == "Diaz"
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"fullUrl": "urn:uuid:9f1f2a7e-2f7c-4b8b-9d3e-1c2b3a4d5e6f", "resource": patient("alias-2"),
         "request": {"method": "POST", "url": "Patient"}},
        {"resource": obs("urn:uuid:9f1f2a7e-2f7c-4b8b-9d3e-1c2b3a4d5e6f"), "request": {"method": "POST", "url": "Observation"}},
    ]}
    assert client.transaction(bundle).status == 200
    # the caller's Bundle is not rewritten (its urn:uuid reference stays as written)
    assert bundle["entry"][1]["resource"]["subject"]["reference"] == "urn:uuid:9f1f2a7e-2f7c-4b8b-9d3e-1c2b3a4d5e6f"
