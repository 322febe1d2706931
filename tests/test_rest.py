"""FHIR R4 REST semantics of :class:`FhirServer`, in process (https://hl7.org/fhir/R4/http.html).

Every failing write is also checked to have written nothing (``unchanged``): live counts per type and
the layer's resource/history/reference tables are the same before and after.
"""

from __future__ import annotations

import contextlib
import re
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlsplit

import pytest

from fhirgym.fhir import FhirServer, InProcessClient, Request, ServerConfig, Store
from fhirgym.fhir._http import http_date

BASE = "http://localhost:8080/fhir"
SYS = "http://example.org/mrn"
INSTANT_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


@pytest.fixture
def server() -> FhirServer:
    srv = FhirServer(Store(), config=ServerConfig(base_url=BASE))
    yield srv
    srv.store.close()


@pytest.fixture
def client(server) -> InProcessClient:
    return InProcessClient(server)


def state(server: FhirServer) -> tuple:
    q = server.store.query
    return (
        server.store.counts(),
        q("SELECT count(*), coalesce(sum(version), 0), max(last_updated) FROM main.resources")[0],
        q("SELECT count(*), coalesce(sum(version), 0) FROM main.history")[0],
        q("SELECT count(*) FROM main.refs")[0],
    )


@contextlib.contextmanager
def unchanged(server: FhirServer):
    """Assert that the block writes nothing at all."""
    before = state(server)
    yield
    assert state(server) == before, "a failing request changed the store"


def patient(mrn: str | None = None, **extra) -> dict:
    res: dict = {"resourceType": "Patient", "name": [{"family": "Diaz", "given": ["Ana"]}], **extra}
    if mrn is not None:
        res["identifier"] = [{"system": SYS, "value": mrn}]
    return res


def obs(subject: str | None, text: str = "heart rate", **extra) -> dict:
    res: dict = {"resourceType": "Observation", "status": "final", "code": {"text": text}, **extra}
    if subject:
        res["subject"] = {"reference": subject}
    return res


def issues(resp) -> list[dict]:
    assert resp.body["resourceType"] == "OperationOutcome", resp.body
    assert resp.body["issue"], resp.body
    return resp.body["issue"]


def expressions(resp) -> list[str]:
    return [e for i in issues(resp) for e in i.get("expression", [])]


def put(client, resource: dict):
    resp = client.update(resource)
    assert resp.status in (200, 201), resp.body
    return resp


def tx(entries: list[dict], kind: str = "transaction") -> dict:
    return {"resourceType": "Bundle", "type": kind, "entry": entries}


# -- create / read / vread / update ----------------------------------------------------------------------------
def test_create_assigns_id_and_answers_201_with_location_and_etag(client):
    resp = client.create({**patient("1"), "id": "client-chosen"})
    assert resp.status == 201
    body = resp.body
    rid = body["id"]
    assert rid != "client-chosen" and re.fullmatch(r"[A-Za-z0-9\-.]{1,64}", rid)  # server-assigned
    assert resp.headers["Location"] == f"{BASE}/Patient/{rid}/_history/1"
    assert resp.headers["ETag"] == 'W/"1"'
    assert body["meta"]["versionId"] == "1"
    assert INSTANT_RE.match(body["meta"]["lastUpdated"])
    assert resp.headers["Last-Modified"] == http_date(body["meta"]["lastUpdated"])  # an HTTP-date
    assert re.fullmatch(r"\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT", resp.headers["Last-Modified"])
    assert body["identifier"] == [{"system": SYS, "value": "1"}]
    # two creates never share an id
    assert client.create(patient("2")).body["id"] != rid


def test_read_returns_current_version_with_etag(client):
    rid = client.create(patient("1")).body["id"]
    put(client, {**patient("1", gender="female"), "id": rid})
    resp = client.read("Patient", rid)
    assert resp.status == 200
    assert resp.body["gender"] == "female" and resp.body["meta"]["versionId"] == "2"
    assert resp.headers["ETag"] == 'W/"2"'
    missing = client.read("Patient", "nope")
    assert missing.status == 404 and issues(missing)[0]["code"] == "not-found"


def test_vread_returns_each_stored_version(client):
    rid = client.create(patient("1", gender="male")).body["id"]
    put(client, {**patient("1", gender="female"), "id": rid})
    v1, v2 = client.vread("Patient", rid, 1), client.vread("Patient", rid, 2)
    assert (v1.status, v1.body["gender"], v1.body["meta"]["versionId"], v1.headers["ETag"]) == (200, "male", "1", 'W/"1"')
    assert (v2.status, v2.body["gender"], v2.headers["ETag"]) == (200, "female", 'W/"2"')
    assert client.vread("Patient", rid, 3).status == 404
    assert client.vread("Patient", "nope", 1).status == 404
    assert client.vread("Patient", rid, "abc").status == 400


def test_update_increments_version_and_sets_meta(client):
    first = client.update({**patient("1"), "id": "p1"})
    assert first.status == 201  # update-as-create
    assert first.headers["Location"] == f"{BASE}/Patient/p1/_history/1"
    second = client.update({**patient("1", gender="other"), "id": "p1", "meta": {"versionId": "77"}})
    assert second.status == 200
    assert second.body["meta"]["versionId"] == "2"  # the server's version, not the client's
    assert second.headers["ETag"] == 'W/"2"'
    assert second.headers["Location"] == f"{BASE}/Patient/p1/_history/2"
    assert second.body["meta"]["lastUpdated"] > first.body["meta"]["lastUpdated"]
    third = client.update({**patient("1"), "id": "p1"})
    assert third.body["meta"]["versionId"] == "3"


def test_update_keeps_client_meta_tags(client):
    tag = {"system": "http://example.org/tags", "code": "vip"}
    resp = client.update({**patient(), "id": "p1", "meta": {"tag": [tag]}})
    assert resp.body["meta"]["tag"] == [tag]
    assert client.read("Patient", "p1").body["meta"]["tag"] == [tag]


def test_update_with_mismatched_or_missing_body_id_is_400(client, server):
    put(client, {**patient(), "id": "p1"})
    with unchanged(server):
        mismatch = client.request("PUT", "Patient/p1", body={**patient(), "id": "p2"})
        assert mismatch.status == 400 and expressions(mismatch) == ["id"]
        missing = client.request("PUT", "Patient/p1", body=patient())
        assert missing.status == 400


def test_update_on_the_type_without_search_is_405(client, server):
    with unchanged(server):
        assert client.request("PUT", "Patient", body=patient()).status == 405


# -- delete ------------------------------------------------------------------------------------------------
def test_delete_then_read_is_gone_and_history_shows_it(client):
    put(client, {**patient("1"), "id": "p1"})
    put(client, {**patient("1", gender="male"), "id": "p1"})
    resp = client.delete("Patient", "p1")
    assert resp.status == 200 and resp.headers["ETag"] == 'W/"3"'
    gone = client.read("Patient", "p1")
    assert gone.status == 410 and issues(gone)[0]["code"] == "deleted"
    assert client.vread("Patient", "p1", 3).status == 410  # the deletion version
    assert client.vread("Patient", "p1", 2).body["gender"] == "male"  # earlier versions stay readable
    hist = client.history("Patient", "p1").body
    assert hist["total"] == 3
    newest = hist["entry"][0]
    assert newest["request"] == {"method": "DELETE", "url": "Patient/p1"}
    assert "resource" not in newest and newest["response"]["etag"] == 'W/"3"'
    assert client.search("Patient", {"_id": "p1"}).body["total"] == 0


def test_delete_of_missing_or_deleted_resource_is_a_no_op(client, server):
    put(client, {**patient(), "id": "p1"})
    assert client.delete("Patient", "p1").status == 200
    with unchanged(server):
        assert client.delete("Patient", "p1").status == 204  # already deleted: no new version
        assert client.delete("Patient", "never").status == 204
    assert client.history("Patient", "p1").body["total"] == 2


def test_update_after_delete_recreates_with_next_version(client):
    put(client, {**patient(), "id": "p1"})
    client.delete("Patient", "p1")
    resp = client.update({**patient(), "id": "p1"})
    assert resp.status == 201 and resp.body["meta"]["versionId"] == "3"
    assert client.read("Patient", "p1").status == 200


# -- history -----------------------------------------------------------------------------------------------
def _history_setup(client) -> None:
    put(client, {**patient("1"), "id": "p1"})
    put(client, {**patient("2"), "id": "p2"})
    put(client, {**patient("1", gender="male"), "id": "p1"})
    put(client, {**obs("Patient/p1"), "id": "o1"})
    client.delete("Patient", "p2")


def _versions(bundle: dict) -> list[tuple[str, str]]:
    return [(e["fullUrl"].rsplit("/", 2)[-2] + "/" + e["fullUrl"].rsplit("/", 1)[-1], e["response"]["etag"])
            for e in bundle.get("entry", [])]


def test_history_instance_type_and_system_newest_first(client):
    _history_setup(client)
    inst = client.history("Patient", "p1").body
    assert inst["type"] == "history" and inst["total"] == 2
    assert _versions(inst) == [("Patient/p1", 'W/"2"'), ("Patient/p1", 'W/"1"')]
    typ = client.history("Patient").body
    assert _versions(typ) == [("Patient/p2", 'W/"2"'), ("Patient/p1", 'W/"2"'), ("Patient/p2", 'W/"1"'),
                              ("Patient/p1", 'W/"1"')]
    system = client.history().body
    assert system["total"] == 5
    assert _versions(system)[:2] == [("Patient/p2", 'W/"2"'), ("Observation/o1", 'W/"1"')]
    stamps = [e["response"]["lastModified"] for e in system["entry"]]
    assert stamps == sorted(stamps, reverse=True)
    assert [e["request"]["method"] for e in system["entry"]] == ["DELETE", "PUT", "PUT", "PUT", "PUT"]


def test_history_count_and_since(client):
    _history_setup(client)
    two = client.history(params={"_count": "2"}).body
    assert two["total"] == 5 and len(two["entry"]) == 2
    # paging through the history with next links reaches every change exactly once
    seen = [e["response"]["etag"] + e["fullUrl"] for e in two["entry"]]
    page = two
    while nxt := next((lk["url"] for lk in page["link"] if lk["relation"] == "next"), None):
        page = client.follow(nxt).body
        seen += [e["response"]["etag"] + e["fullUrl"] for e in page["entry"]]
    assert seen == [e["response"]["etag"] + e["fullUrl"] for e in client.history().body["entry"]]
    assert [e["response"]["status"] for e in client.history().body["entry"]].count("201") >= 1
    assert client.history(params={"_count": "0"}).body.get("entry") is None
    all_stamps = [e["response"]["lastModified"] for e in client.history().body["entry"]]
    cut = all_stamps[2]  # the third newest change
    since = client.history(params={"_since": cut}).body
    assert [e["response"]["lastModified"] for e in since["entry"]] == all_stamps[:3]
    # the same instant written with a time-zone offset selects the same changes
    dt = datetime.strptime(cut, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC) + timedelta(hours=2)
    offset = dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}+02:00"
    assert client.history(params={"_since": offset}).body["total"] == 3
    future = client.history("Patient", params={"_since": "2999-01-01"}).body
    assert future["total"] == 0 and "entry" not in future


def test_history_rejects_bad_parameters(client):
    _history_setup(client)
    assert client.history(params={"_since": "yesterday"}).status == 400
    assert client.history(params={"_count": "many"}).status == 400
    assert client.history(params={"_count": "-1"}).status == 400
    assert client.history(params={"_at": "2020"}).status == 400
    assert client.history("Patient", "never").status == 404
    assert client.request("POST", "Patient/_history", body=patient()).status == 405


# -- If-Match --------------------------------------------------------------------------------------------
def test_if_match_guards_update_and_delete(client, server):
    put(client, {**patient(), "id": "p1"})
    put(client, {**patient(gender="male"), "id": "p1"})
    with unchanged(server):
        stale = client.update({**patient(), "id": "p1"}, if_match=1)
        assert stale.status == 412 and issues(stale)[0]["code"] == "conflict"
        assert client.request("DELETE", "Patient/p1", headers={"If-Match": 'W/"1"'}).status == 412
        assert client.update({**patient(), "id": "new"}, if_match=1).status == 412  # nothing to match
        garbage = client.request("PUT", "Patient/p1", body={**patient(), "id": "p1"}, headers={"If-Match": "banana"})
        assert garbage.status == 400
    ok = client.update({**patient(gender="female"), "id": "p1"}, if_match=2)
    assert ok.status == 200 and ok.headers["ETag"] == 'W/"3"'
    strong = client.request("PUT", "Patient/p1", body={**patient(), "id": "p1"}, headers={"If-Match": '"3"'})
    assert strong.status == 200
    assert client.request("DELETE", "Patient/p1", headers={"If-Match": 'W/"4"'}).status == 200


# -- conditional create / update / delete -------------------------------------------------------------------
def test_conditional_create(client, server):
    first = client.create(patient("42"), if_none_exist=f"identifier={SYS}|42")
    assert first.status == 201
    with unchanged(server):
        again = client.create(patient("42", gender="male"), if_none_exist=f"identifier={SYS}|42")
        assert again.status == 200
        assert again.body["id"] == first.body["id"] and "gender" not in again.body
        # the full-URL form of the header is accepted too
        assert client.create(patient("42"), if_none_exist=f"Patient?identifier={SYS}|42").status == 200
    client.create(patient("42"))  # a duplicate, made without the condition
    with unchanged(server):
        many = client.create(patient("42"), if_none_exist=f"identifier={SYS}|42")
        assert many.status == 412
        assert client.create(patient("42"), if_none_exist="nonsense-param=1").status == 400


def test_conditional_update(client, server):
    created = client.request("PUT", "Patient", {"identifier": f"{SYS}|7"}, body=patient("7"))
    assert created.status == 201
    rid = created.body["id"]
    updated = client.request("PUT", "Patient", {"identifier": f"{SYS}|7"}, body=patient("7", gender="female"))
    assert updated.status == 200
    assert updated.body["id"] == rid and updated.body["meta"]["versionId"] == "2"
    with unchanged(server):
        wrong_id = client.request("PUT", "Patient", {"identifier": f"{SYS}|7"}, body={**patient("7"), "id": "other"})
        assert wrong_id.status == 400
    client.create(patient("7"))
    with unchanged(server):
        many = client.request("PUT", "Patient", {"identifier": f"{SYS}|7"}, body=patient("7"))
        assert many.status == 412


def test_conditional_update_with_no_match_and_a_body_id_creates_that_id(client):
    resp = client.request("PUT", "Patient", {"identifier": f"{SYS}|8"}, body={**patient("8"), "id": "chosen"})
    assert resp.status == 201 and resp.body["id"] == "chosen"


def test_conditional_delete(client, server):
    for mrn in ("1", "2", "2"):
        client.create(patient(mrn))
    with unchanged(server):
        none = client.request("DELETE", "Patient", {"identifier": f"{SYS}|nobody"})
        assert none.status == 204
        many = client.request("DELETE", "Patient", {"identifier": f"{SYS}|2"})
        assert many.status == 412
        assert client.request("DELETE", "Patient").status == 405  # no criteria: never "delete all"
    one = client.request("DELETE", "Patient", {"identifier": f"{SYS}|1"})
    assert one.status == 200
    assert server.store.counts() == {"Patient": 2}


# -- referential integrity --------------------------------------------------------------------------------
def test_reference_to_a_missing_resource_is_422_naming_the_element(client, server):
    put(client, {**patient(), "id": "p1"})
    with unchanged(server):
        resp = client.create(obs("Patient/missing"))
        assert resp.status == 422
        assert expressions(resp) == ["Observation.subject"]
        assert "Patient/missing" in issues(resp)[0]["diagnostics"]
        nested = client.create(obs("Patient/p1", performer=[{"reference": "Patient/p1"},
                                                           {"reference": "Practitioner/ghost"}]))
        assert nested.status == 422 and expressions(nested) == ["Observation.performer[1]"]
        absolute = client.create(obs(f"{BASE}/Patient/missing"))
        assert absolute.status == 422
    put(client, {**obs("Patient/p1"), "id": "o1"})
    with unchanged(server):  # an update may not introduce a dangling reference either
        assert client.update({**obs("Patient/gone"), "id": "o1"}).status == 422
    # references that are not local resources are accepted
    external = client.create(obs("http://other.example.org/fhir/Patient/1"))
    assert external.status == 201
    contained = client.create(obs("#p", contained=[{"resourceType": "Patient", "id": "p"}]))
    assert contained.status == 201


def test_a_versioned_reference_must_name_an_existing_version(client, server):
    put(client, {**patient(), "id": "p1"})
    put(client, {**patient(), "id": "p1", "active": False})  # version 2
    for ref in ("Patient/p1/_history/1", "Patient/p1/_history/2", f"{BASE}/Patient/p1/_history/2"):
        assert client.create(obs(ref)).status == 201, ref
    with unchanged(server):
        for ref in ("Patient/p1/_history/3", "Patient/p1/_history/0", "Patient/p1/_history/v1",
                    "Patient/p1/_history/99999999999999999999"):
            resp = client.create(obs(ref))
            assert resp.status == 422 and expressions(resp) == ["Observation.subject"], ref
            assert f"Referenced version {ref} does not exist" in issues(resp)[0]["diagnostics"]
    # in a transaction that creates the target, its versions are not known yet: not checked
    bundle = {"resourceType": "Bundle", "type": "transaction", "entry": [
        {"resource": {**patient(), "id": "p2"}, "request": {"method": "PUT", "url": "Patient/p2"}},
        {"resource": obs("Patient/p2/_history/1"), "request": {"method": "POST", "url": "Observation"}}]}
    assert client.transaction(bundle).status == 200


def test_delete_of_a_referenced_resource_is_409_unless_cascading(client, server):
    put(client, {**patient(), "id": "p1"})
    put(client, {**obs("Patient/p1"), "id": "o1"})
    put(client, {**obs(None, hasMember=[{"reference": "Observation/o1"}]), "id": "panel"})
    with unchanged(server):
        blocked = client.delete("Patient", "p1")
        assert blocked.status == 409
        assert "Observation/o1" in issues(blocked)[0]["diagnostics"]
    cascade = client.delete("Patient", "p1", cascade=True)
    assert cascade.status == 200
    assert client.read("Patient", "p1").status == 410
    assert client.read("Observation", "o1").status == 410  # referrer deleted
    assert client.read("Observation", "panel").status == 410  # and its referrer, transitively
    assert server.store.counts() == {}


def test_deleting_the_referrer_first_unblocks_the_delete(client):
    put(client, {**patient(), "id": "p1"})
    put(client, {**obs("Patient/p1"), "id": "o1"})
    assert client.delete("Observation", "o1").status == 200
    assert client.delete("Patient", "p1").status == 200


def test_integrity_can_be_switched_off():
    srv = FhirServer(Store(), config=ServerConfig(referential_integrity=False))
    c = InProcessClient(srv)
    assert c.create(obs("Patient/missing")).status == 201


# -- validation on write ----------------------------------------------------------------------------------
INVALID = [
    (patient(foo=1), ["Patient.foo"]),
    (patient(birthDate="1974-13-45"), ["Patient.birthDate"]),
    (patient(gender="robot"), ["Patient.gender"]),
    ({"resourceType": "Appointment", "status": "confirmed",
      "participant": [{"actor": {"display": "Dr X"}, "status": "accepted"}]}, ["Appointment.status"]),
    ({"resourceType": "Appointment", "status": "booked"}, ["Appointment.participant"]),
]


@pytest.mark.parametrize(("resource", "where"), INVALID, ids=["unknown-element", "bad-date", "bad-gender",
                                                               "bad-appt-status", "missing-participant"])
def test_invalid_resources_are_rejected_with_422(client, server, resource, where):
    with unchanged(server):
        created = client.create(resource)
        assert created.status == 422
        assert expressions(created) == where
        assert issues(created)[0]["severity"] == "error"
        updated = client.update({**resource, "id": "x1"})
        assert updated.status == 422 and expressions(updated) == where


def test_wrong_or_missing_resource_type_is_400(client, server):
    with unchanged(server):
        wrong = client.request("POST", "Patient", body=obs(None))
        assert wrong.status == 400 and expressions(wrong) == ["resourceType"]
        missing = client.request("POST", "Patient", body={"name": [{"family": "X"}]})
        assert missing.status == 400 and expressions(missing) == ["resourceType"]
        assert client.request("PUT", "Patient/p1", body={**obs(None), "id": "p1"}).status == 400
        assert client.request("POST", "Patient", body=b"[1, 2]").status == 400
        assert client.request("POST", "Patient", body=b"{not json").status == 400
        assert client.request("POST", "Patient", body=b"").status == 400
        assert client.request("POST", "Patient", body=b"{}", headers={"Content-Type": "text/xml"}).status == 415


def test_unknown_type_is_404(client, server):
    with unchanged(server):
        for method, body in (("GET", None), ("POST", {"resourceType": "Foo"}), ("DELETE", None)):
            resp = client.request(method, "Foo", body=body)
            assert resp.status == 404 and issues(resp)[0]["code"] == "not-found"
        assert client.request("GET", "Foo/1").status == 404
        assert client.request("PUT", "Foo/1", body={"resourceType": "Foo", "id": "1"}).status == 404
        assert client.request("GET", "patient").status == 404  # type names are case-sensitive


BAD_IDS = ["x';DROP TABLE resources;--", "../etc", "..%2Fetc", "a" * 65, "a" * 5000, "p 1", "p\x00", "p$1",
           "é", "p1;", "*", "%27"]


@pytest.mark.parametrize("rid", BAD_IDS, ids=range(len(BAD_IDS)))
def test_hostile_ids_are_4xx_with_no_effect(client, server, rid):
    put(client, {**patient(), "id": "p1"})
    with unchanged(server):
        for method, body in (("GET", None), ("PUT", {**patient(), "id": rid}), ("DELETE", None)):
            resp = client.request(method, f"Patient/{rid}", body=body)
            assert 400 <= resp.status < 500, (method, rid, resp.status)
            issues(resp)
        assert client.request("GET", f"Patient/{rid}/_history/1").status // 100 == 4
        # the same ids inside a transaction and via a conditional update
        bundle = tx([{"resource": {**patient(), "id": rid}, "request": {"method": "PUT", "url": f"Patient/{rid}"}}])
        assert client.transaction(bundle).status // 100 == 4
        cond = client.request("PUT", "Patient", {"identifier": f"{SYS}|none"}, body={**patient("none"), "id": rid})
        assert cond.status // 100 == 4
    assert server.store.query("SELECT count(*) FROM sqlite_master WHERE name = 'resources'") == [(1,)]
    assert client.read("Patient", "p1").status == 200


def test_hostile_ids_are_rejected_even_without_validation():
    srv = FhirServer(Store(), config=ServerConfig(validate=False))
    c = InProcessClient(srv)
    before = state(srv)
    for rid in ("x';DROP TABLE resources;--", "a" * 65, "p 1"):
        bundle = tx([{"resource": {**patient(), "id": rid}, "request": {"method": "PUT", "url": f"Patient/{rid}"}}])
        assert c.transaction(bundle).status == 400
        cond = c.request("PUT", "Patient", {"identifier": f"{SYS}|none"}, body={**patient("none"), "id": rid})
        assert cond.status == 400
    assert state(srv) == before


def test_valid_but_unusual_ids_round_trip(client):
    for rid in ("a" * 64, "A-1.b", "0"):
        assert client.update({**patient(), "id": rid}).status == 201
        assert client.read("Patient", rid).body["id"] == rid


# -- Prefer --------------------------------------------------------------------------------------------------
def test_prefer_return(client):
    minimal = client.request("POST", "Patient", body=patient(), headers={"Prefer": "return=minimal"})
    assert minimal.status == 201 and minimal.body is None
    assert minimal.headers["Location"].startswith(f"{BASE}/Patient/") and minimal.headers["ETag"] == 'W/"1"'
    rid = minimal.headers["Location"].split("/")[-3]
    rep = client.request("PUT", f"Patient/{rid}", body={**patient(gender="male"), "id": rid},
                         headers={"Prefer": "return=representation"})
    assert rep.status == 200 and rep.body["gender"] == "male" and rep.body["meta"]["versionId"] == "2"
    oo = client.request("PUT", f"Patient/{rid}", body={**patient(), "id": rid},
                        headers={"Prefer": "return=OperationOutcome"})
    assert oo.status == 200 and issues(oo)[0]["severity"] == "information"
    assert oo.headers["ETag"] == 'W/"3"'
    default = client.create(patient())
    assert default.body["resourceType"] == "Patient"


# -- transactions --------------------------------------------------------------------------------------------
PAT_URN = "urn:uuid:61ebe359-bfdc-4613-8bf2-c5e300945f0a"
OBS_URN = "urn:uuid:88f151c0-a954-468a-88bd-5ae15c08e059"


def test_transaction_rewrites_urn_uuid_references(client, server):
    bundle = tx([
        {"fullUrl": OBS_URN, "resource": obs(PAT_URN), "request": {"method": "POST", "url": "Observation"}},
        {"fullUrl": PAT_URN, "resource": patient("tx"), "request": {"method": "POST", "url": "Patient"}},
    ])
    resp = client.transaction(bundle)
    assert resp.status == 200
    out = resp.body
    assert out["type"] == "transaction-response" and len(out["entry"]) == 2
    o_entry, p_entry = out["entry"]  # response entries in request order
    assert o_entry["response"]["status"] == p_entry["response"]["status"] == "201 Created"
    pid = p_entry["resource"]["id"]
    assert p_entry["response"]["location"] == f"Patient/{pid}/_history/1"
    assert p_entry["response"]["etag"] == 'W/"1"'
    assert p_entry["fullUrl"] == f"{BASE}/Patient/{pid}"
    oid = o_entry["resource"]["id"]
    stored = client.read("Observation", oid).body
    assert stored["subject"]["reference"] == f"Patient/{pid}"
    assert server.store.counts() == {"Observation": 1, "Patient": 1}
    # the reference is indexed: a search by the rewritten id finds the Observation
    assert client.search("Observation", {"subject": f"Patient/{pid}"}).body["total"] == 1


def test_transaction_is_atomic_and_names_the_failing_entry(client, server):
    put(client, {**patient("keep"), "id": "keep"})
    bundle = tx([
        {"resource": {**patient(), "id": "t1"}, "request": {"method": "PUT", "url": "Patient/t1"}},
        {"fullUrl": PAT_URN, "resource": patient("new"), "request": {"method": "POST", "url": "Patient"}},
        {"request": {"method": "DELETE", "url": "Patient/keep"}},
        {"resource": obs(PAT_URN, status="confirmed"), "request": {"method": "POST", "url": "Observation"}},
    ])
    with unchanged(server):
        resp = client.transaction(bundle)
        assert resp.status == 422
        assert expressions(resp) == ["Bundle.entry[3].resource.status"]
        assert issues(resp)[0]["diagnostics"].startswith("Bundle.entry[3]")
    assert client.read("Patient", "t1").status == 404
    assert client.read("Patient", "keep").status == 200


@pytest.mark.parametrize(("entry", "status", "where"), [
    ({"resource": obs("Patient/nobody"), "request": {"method": "POST", "url": "Observation"}}, 422,
     "Bundle.entry[1].resource.subject"),
    ({"resource": obs("urn:uuid:0000-missing"), "request": {"method": "POST", "url": "Observation"}}, 400, None),
    ({"resource": patient(), "request": {"method": "POST", "url": "Observation"}}, 400, None),
    ({"resource": patient(), "request": {"method": "PATCH", "url": "Patient/p1"}}, 400, None),
    ({"request": {"method": "POST", "url": "Patient"}}, 400, None),
    ({"request": {"method": "GET"}}, 400, None),
    ({"resource": patient(), "request": {"method": "PUT", "url": "Patient/p1/extra"}}, 400, None),
    ({"request": {"method": "DELETE", "url": "Patient/p1"}}, 409, None),
], ids=["dangling-ref", "unknown-urn", "type-mismatch", "patch", "no-resource", "no-url", "bad-put-url", "409"])
def test_transaction_failures_roll_back(client, server, entry, status, where):
    put(client, {**patient(), "id": "p1"})
    put(client, {**obs("Patient/p1"), "id": "o1"})
    bundle = tx([{"resource": patient("a"), "request": {"method": "POST", "url": "Patient"}}, entry])
    with unchanged(server):
        resp = client.transaction(bundle)
        assert resp.status == status, resp.body
        assert "Bundle.entry[1]" in issues(resp)[0]["diagnostics"]
        if where:
            assert expressions(resp) == [where]


def test_transaction_resolves_conditional_references(client, server):
    pid = client.create(patient("cond")).body["id"]
    bundle = tx([{"resource": obs(f"Patient?identifier={SYS}|cond"), "request": {"method": "POST", "url": "Observation"}}])
    resp = client.transaction(bundle)
    assert resp.status == 200
    oid = resp.body["entry"][0]["resource"]["id"]
    assert client.read("Observation", oid).body["subject"]["reference"] == f"Patient/{pid}"
    for ref in (f"Patient?identifier={SYS}|nobody", "Patient?name=Diaz"):  # 0 matches; then 2 matches
        client.create(patient("other"))
        with unchanged(server):
            bad = client.transaction(tx([{"resource": obs(ref), "request": {"method": "POST", "url": "Observation"}}]))
            assert bad.status == 412, ref
            assert "Bundle.entry[0]" in issues(bad)[0]["diagnostics"]


def test_transaction_if_none_exist(client, server):
    existing = client.create(patient("dup")).body["id"]
    bundle = tx([
        {"fullUrl": PAT_URN, "resource": patient("dup"),
         "request": {"method": "POST", "url": "Patient", "ifNoneExist": f"identifier={SYS}|dup"}},
        {"resource": obs(PAT_URN), "request": {"method": "POST", "url": "Observation"}},
        {"resource": patient("fresh"), "request": {"method": "POST", "url": "Patient", "ifNoneExist": f"identifier={SYS}|fresh"}},
    ])
    resp = client.transaction(bundle)
    assert resp.status == 200
    statuses = [e["response"]["status"] for e in resp.body["entry"]]
    assert statuses == ["200 OK", "201 Created", "201 Created"]
    assert resp.body["entry"][0]["response"]["location"].startswith(f"Patient/{existing}")
    # the reference to the conditionally-created entry points at the existing patient
    oid = resp.body["entry"][1]["resource"]["id"]
    assert client.read("Observation", oid).body["subject"]["reference"] == f"Patient/{existing}"
    assert server.store.counts() == {"Observation": 1, "Patient": 2}
    client.create(patient("dup"))
    with unchanged(server):
        many = client.transaction(tx(bundle["entry"][:1]))
        assert many.status == 412


def test_transaction_processing_order_is_delete_post_put_get(client, server):
    put(client, {**patient("p1"), "id": "p1"})
    put(client, {**patient("gone"), "id": "d1"})
    bundle = tx([
        {"request": {"method": "GET", "url": "Patient/p1"}},
        {"resource": {**patient("p1", gender="female"), "id": "p1"}, "request": {"method": "PUT", "url": "Patient/p1"}},
        {"resource": patient("gone"), "request": {"method": "POST", "url": "Patient", "ifNoneExist": f"identifier={SYS}|gone"}},
        {"request": {"method": "DELETE", "url": "Patient/d1"}},
        {"request": {"method": "GET", "url": f"Patient?identifier={SYS}|gone"}},
    ])
    resp = client.transaction(bundle)
    assert resp.status == 200, resp.body
    read, upd, post, delete, search = resp.body["entry"]
    # GET ran after the PUT: it sees version 2
    assert read["response"]["status"] == "200 OK" and read["resource"]["meta"]["versionId"] == "2"
    assert upd["response"]["status"] == "200 OK" and upd["response"]["etag"] == 'W/"2"'
    # DELETE ran before the conditional POST: the deleted patient no longer matches, so it is created
    assert delete["response"]["status"] == "200 OK"
    assert post["response"]["status"] == "201 Created"
    assert post["response"]["lastModified"] < upd["response"]["lastModified"]  # POST before PUT
    assert search["resource"]["total"] == 1
    assert search["resource"]["entry"][0]["resource"]["id"] == post["resource"]["id"]
    assert client.read("Patient", "d1").status == 410


def test_transaction_can_delete_resources_that_reference_each_other(client, server):
    put(client, {**patient(), "id": "p1"})
    put(client, {**obs("Patient/p1"), "id": "o1"})
    resp = client.transaction(tx([{"request": {"method": "DELETE", "url": "Patient/p1"}},
                                  {"request": {"method": "DELETE", "url": "Observation/o1"}}]))
    assert resp.status == 200
    assert server.store.counts() == {}


def test_transaction_may_not_touch_one_resource_twice(client, server):
    put(client, {**patient(), "id": "p1"})
    with unchanged(server):
        twice = client.transaction(tx([
            {"resource": {**patient(gender="male"), "id": "p1"}, "request": {"method": "PUT", "url": "Patient/p1"}},
            {"resource": {**patient(gender="female"), "id": "p1"}, "request": {"method": "PUT", "url": "Patient/p1"}},
        ]))
        assert twice.status == 400 and "Bundle.entry[1]" in issues(twice)[0]["diagnostics"]
        deleted_and_put = client.transaction(tx([
            {"request": {"method": "DELETE", "url": "Patient/p1"}},
            {"resource": {**patient(), "id": "p1"}, "request": {"method": "PUT", "url": "Patient/p1"}},
        ]))
        assert deleted_and_put.status == 400


def test_transaction_put_update_as_create_and_conditional_put(client):
    put(client, {**patient("c1"), "id": "c1"})
    resp = client.transaction(tx([
        {"resource": {**patient(), "id": "n1"}, "request": {"method": "PUT", "url": "Patient/n1"}},
        {"resource": patient("c1", gender="male"), "request": {"method": "PUT", "url": f"Patient?identifier={SYS}|c1"}},
    ]))
    assert resp.status == 200
    assert [e["response"]["status"] for e in resp.body["entry"]] == ["201 Created", "200 OK"]
    assert resp.body["entry"][1]["response"]["location"] == "Patient/c1/_history/2"
    assert client.read("Patient", "c1").body["gender"] == "male"


def test_transaction_does_not_modify_the_callers_bundle(client):
    bundle = tx([{"fullUrl": PAT_URN, "resource": patient(), "request": {"method": "POST", "url": "Patient"}},
                 {"resource": obs(PAT_URN), "request": {"method": "POST", "url": "Observation"}}])
    assert client.transaction(bundle).status == 200
    assert bundle["entry"][1]["resource"]["subject"]["reference"] == PAT_URN
    assert "id" not in bundle["entry"][0]["resource"]


def test_bundle_envelope_errors(client, server):
    with unchanged(server):
        assert client.transaction({"resourceType": "Bundle", "type": "collection"}).status == 400
        assert client.transaction({"resourceType": "Patient"}).status == 400
        assert client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": {}}).status == 400
        assert client.transaction({"resourceType": "Bundle", "type": "transaction", "entry": [1]}).status == 400
    empty = client.transaction({"resourceType": "Bundle", "type": "transaction"})
    assert empty.status == 200 and empty.body["entry"] == []


# -- batch ---------------------------------------------------------------------------------------------------
def test_batch_entries_are_independent(client, server):
    put(client, {**patient(), "id": "p1"})
    resp = client.transaction(tx([
        {"resource": {**patient(), "id": "b1"}, "request": {"method": "PUT", "url": "Patient/b1"}},
        {"resource": patient(gender="robot"), "request": {"method": "POST", "url": "Patient"}},
        {"request": {"method": "GET", "url": "Patient/nope"}},
        {"resource": obs("Patient/p1"), "request": {"method": "POST", "url": "Observation"}},
        {"request": {"method": "GET", "url": "Patient/p1"}},
        {"request": {"method": "DELETE", "url": "Patient/p1"}},  # referenced by the entry above: 409
    ], kind="batch"))
    assert resp.status == 200
    body = resp.body
    assert body["type"] == "batch-response" and len(body["entry"]) == 6
    put_e, bad_e, missing_e, obs_e, read_e, del_e = body["entry"]
    assert put_e["response"]["status"] == "201 Created" and put_e["response"]["etag"] == 'W/"1"'
    assert put_e["response"]["location"].endswith("Patient/b1/_history/1")
    assert bad_e["response"]["status"].startswith("422")
    assert bad_e["response"]["outcome"]["issue"][0]["expression"] == ["Bundle.entry[1].resource.gender"]
    assert missing_e["response"]["status"].startswith("404")
    assert missing_e["response"]["outcome"]["resourceType"] == "OperationOutcome"
    assert obs_e["response"]["status"] == "201 Created"
    assert read_e["response"]["status"] == "200 OK" and read_e["resource"]["id"] == "p1"
    assert del_e["response"]["status"].startswith("409")
    assert server.store.counts() == {"Observation": 1, "Patient": 2}


def test_batch_conditional_create_and_if_match(client):
    put(client, {**patient("k"), "id": "k1"})
    resp = client.transaction(tx([
        {"resource": patient("k"), "request": {"method": "POST", "url": "Patient", "ifNoneExist": f"identifier={SYS}|k"}},
        {"resource": {**patient(), "id": "k1"}, "request": {"method": "PUT", "url": "Patient/k1", "ifMatch": 'W/"9"'}},
        {"resource": {**patient(), "id": "k1"}, "request": {"method": "PUT", "url": "Patient/k1", "ifMatch": 'W/"1"'}},
    ], kind="batch"))
    statuses = [e["response"]["status"][:3] for e in resp.body["entry"]]
    assert statuses == ["200", "412", "200"]
    assert client.read("Patient", "k1").body["meta"]["versionId"] == "2"


# -- $validate -------------------------------------------------------------------------------------------------
def test_validate_operation(client, server):
    with unchanged(server):
        ok = client.request("POST", "Patient/$validate", body=patient(gender="female"))
        assert ok.status == 200
        assert [(i["severity"], i["code"]) for i in issues(ok)] == [("information", "informational")]
        bad = client.request("POST", "Patient/$validate", body=patient(gender="robot", birthDate="1974-13-45"))
        assert bad.status == 200
        assert sorted(expressions(bad)) == ["Patient.birthDate", "Patient.gender"]
        assert all(i["severity"] == "error" for i in issues(bad))
        wrapped = client.request("POST", "Patient/$validate", body={
            "resourceType": "Parameters", "parameter": [{"name": "resource", "resource": patient(foo=1)}]})
        assert wrapped.status == 200 and expressions(wrapped) == ["Patient.foo"]
        instance = client.request("POST", "Patient/p1/$validate", body=patient())
        assert instance.status == 200
        assert client.request("POST", "Patient/$validate", body=obs(None)).status == 400
        assert client.request("GET", "Patient/$validate").status == 405
        for params in ([1], "x", [{"name": "resource", "resource": 5}], []):
            malformed = client.request("POST", "Patient/$validate", body={"resourceType": "Parameters", "parameter": params})
            assert malformed.status == 400, params


# -- $everything ------------------------------------------------------------------------------------------------
@pytest.fixture
def two_patients(client):
    put(client, {"resourceType": "Organization", "id": "org", "name": "Clinic"})
    put(client, {"resourceType": "Practitioner", "id": "dr"})
    put(client, {"resourceType": "Practitioner", "id": "dr2"})
    put(client, {**patient("1", managingOrganization={"reference": "Organization/org"}), "id": "p1"})
    put(client, {**patient("2"), "id": "p2"})
    for n in range(3):
        put(client, {**obs("Patient/p1", performer=[{"reference": "Practitioner/dr"}]), "id": f"o1-{n}"})
    put(client, {"resourceType": "Encounter", "id": "e1", "status": "finished", "class": {"code": "AMB"},
                 "subject": {"reference": "Patient/p1"}})
    put(client, {**obs("Patient/p2", performer=[{"reference": "Practitioner/dr2"}]), "id": "o2"})
    put(client, {"resourceType": "Encounter", "id": "e2", "status": "finished", "class": {"code": "AMB"},
                 "subject": {"reference": "Patient/p2"}})
    return client


def _refs(bundle: dict) -> set[str]:
    return {f"{e['resource']['resourceType']}/{e['resource']['id']}" for e in bundle.get("entry", [])}


def test_everything_returns_the_compartment_and_what_it_references(two_patients):
    client = two_patients
    resp = client.request("GET", "Patient/p1/$everything")
    assert resp.status == 200 and resp.body["type"] == "searchset"
    assert _refs(resp.body) == {"Patient/p1", "Observation/o1-0", "Observation/o1-1", "Observation/o1-2",
                                "Encounter/e1", "Practitioner/dr", "Organization/org"}
    assert resp.body["total"] == 7
    assert resp.body["entry"][0]["resource"]["id"] == "p1"  # the patient first
    p2 = _refs(client.request("GET", "Patient/p2/$everything").body)
    assert p2 == {"Patient/p2", "Observation/o2", "Encounter/e2", "Practitioner/dr2"}


def test_everything_pages(two_patients):
    client = two_patients
    first = client.request("GET", "Patient/p1/$everything", {"_count": "3"})
    seen, pages, resp = [], 0, first
    while True:
        pages += 1
        assert len(resp.body.get("entry", [])) <= 3
        seen += [f"{e['resource']['resourceType']}/{e['resource']['id']}" for e in resp.body.get("entry", [])]
        nxt = [link["url"] for link in resp.body["link"] if link["relation"] == "next"]
        if not nxt:
            break
        resp = client.follow(nxt[0])
        assert resp.status == 200
    assert pages == 3 and len(seen) == len(set(seen)) == 7
    zero = client.request("GET", "Patient/p1/$everything", {"_count": "0"}).body
    assert "entry" not in zero and not [x for x in zero["link"] if x["relation"] == "next"]


def test_everything_type_filter_and_errors(two_patients):
    client = two_patients
    only = client.request("GET", "Patient/p1/$everything", {"_type": "Observation"}).body
    assert {r.split("/")[0] for r in _refs(only)} == {"Patient", "Observation"}
    assert client.request("GET", "Patient/nope/$everything").status == 404
    assert client.request("GET", "Patient/p1/$everything", {"start": "2020"}).status == 400
    assert client.request("GET", "Patient/p1/$everything", {"_count": "-1"}).status == 400
    assert client.request("GET", "Observation/o2/$everything").status == 404
    client.delete("Patient", "p2", cascade=True)
    assert client.request("GET", "Patient/p2/$everything").status == 410


def test_everything_since_keeps_what_changed(two_patients):
    client = two_patients
    time.sleep(0.01)  # the writes below are later than the fixture's, at millisecond precision
    since = client.update({**obs("Patient/p1", performer=[{"reference": "Practitioner/dr"}]), "id": "o1-1",
                           "status": "amended"}).body["meta"]["lastUpdated"]
    put(client, {"resourceType": "Encounter", "id": "e1", "status": "cancelled", "class": {"code": "AMB"},
                 "subject": {"reference": "Patient/p1"}})
    resp = client.request("GET", "Patient/p1/$everything", {"_since": since})
    assert resp.status == 200 and _refs(resp.body) == {"Observation/o1-1", "Encounter/e1"}
    assert resp.body["total"] == 2
    assert _refs(client.request("GET", "Patient/p1/$everything", {"_since": "2000-01-01T00:00:00Z"}).body) == _refs(
        client.request("GET", "Patient/p1/$everything").body)
    assert client.request("GET", "Patient/p1/$everything", {"_since": "9999"}).body["total"] == 0
    bad = client.request("GET", "Patient/p1/$everything", {"_since": "yesterday"})
    assert bad.status == 400 and expressions(bad) == ["_since"]


# -- CapabilityStatement --------------------------------------------------------------------------------------
def test_metadata_is_generated_from_what_the_server_implements(client, server):
    resp = client.capabilities()
    assert resp.status == 200
    cap = resp.body
    assert cap["resourceType"] == "CapabilityStatement" and cap["fhirVersion"] == "4.0.1"
    assert cap["kind"] == "instance" and "application/fhir+json" in cap["format"]
    rest = cap["rest"][0]
    assert {i["code"] for i in rest["interaction"]} == {"transaction", "batch", "history-system"}
    types = [r["type"] for r in rest["resource"]]
    assert len(types) == 146 == len(set(types))
    assert set(types) == set(server.spec.resource_types)
    for res in rest["resource"]:
        advertised = {p["name"] for p in res["searchParam"]}
        assert advertised == {p.code for p in server.search_engine.supported_params(res["type"])}
        assert res["versioning"] == "versioned-update" and res["updateCreate"] is True
    patient_ops = next(r for r in rest["resource"] if r["type"] == "Patient")["operation"]
    assert {o["name"] for o in patient_ops} == {"validate", "everything"}
    assert client.request("POST", "metadata", body={}).status == 405


def test_an_unknown_search_parameter_names_the_close_one_and_the_types_parameters(client):
    """An agent that guessed a name can correct itself from the error alone."""
    resp = client.search("Encounter", {"sort": "date"})
    text = issues(resp)[0]["diagnostics"]
    assert resp.status == 400 and issues(resp)[0]["code"] == "not-supported"
    assert "Unknown search parameter 'sort' for resource type Encounter; did you mean '_sort'?" in text
    listed = text.split("search parameters here: ")[1].rstrip(")").split(", ")
    assert "date" in listed and "patient" in listed and "_content" not in listed  # only what this server supports
    assert "did you mean" not in issues(client.search("Encounter", {"zzz": "1"}))[0]["diagnostics"]


def test_every_advertised_search_parameter_is_accepted(client, server):
    cap = client.capabilities().body
    failures = []
    for res in cap["rest"][0]["resource"]:
        for p in res["searchParam"]:
            query = {p["name"]: "x"} if p["type"] == "special" else {f"{p['name']}:missing": "true"}
            resp = client.search(res["type"], query)
            if resp.status != 200:
                failures.append((res["type"], p["name"], resp.status))
    assert failures == []
    # and what is not advertised is refused (strict handling), naming the parameter
    for rtype, code in sorted(server.extractor.unsupported)[:50]:
        resp = client.search(rtype, {code: "x"})
        assert resp.status == 400 and code in issues(resp)[0]["diagnostics"], (rtype, code)


# -- routing odds and ends -------------------------------------------------------------------------------------
def test_routing_errors_are_operation_outcomes(server):
    cases = [
        (Request("GET", ""), 400), (Request("DELETE", ""), 405), (Request("GET", "$export"), 404),
        (Request("GET", "Patient/$bogus"), 404), (Request("PATCH", "Patient/p1"), 405),
        (Request("GET", "Patient/p1/_history/1/extra"), 404), (Request("GET", "_getpages", [("_getpages", "x")]), 404),
        (Request("GET", "", [("_getpages", "expired")]), 410), (Request("GET", "metadata", [("_format", "xml")]), 406),
    ]
    with unchanged(server):
        for req, status in cases:
            resp = server.handle(req)
            assert resp.status == status, (req, resp.body)
            assert resp.body["resourceType"] == "OperationOutcome" and resp.body["issue"][0]["severity"] == "error"


def test_in_process_body_bytes_and_dicts_behave_alike(client):
    import orjson

    a = client.request("POST", "Patient", body=orjson.dumps(patient("b")))
    b = client.request("POST", "Patient", body=patient("b"))
    assert a.status == b.status == 201
    assert {k for k in a.body if k not in ("id", "meta")} == {k for k in b.body if k not in ("id", "meta")}


# -- edge cases found by black-box probing of `fhirgym serve` ------------------------------------------------
@pytest.mark.parametrize("vid", ["99999999999999999999", "\u00b2", "\u0663", "1_0"])
def test_odd_version_ids_are_a_4xx_not_a_500(client, vid):
    put(client, {**patient(), "id": "v1"})
    resp = client.request("GET", f"Patient/v1/_history/{vid}")
    assert resp.status == (404 if vid.isascii() and vid.isdigit() else 400), resp.body


@pytest.mark.parametrize("etag", ['W/"\u00b2"', 'W/"99999999999999999999"', "W/\"\"", "1_0"])
def test_malformed_if_match_is_400_and_writes_nothing(client, server, etag):
    put(client, {**patient(), "id": "m1"})
    with unchanged(server):
        assert client.request("PUT", "Patient/m1", body={**patient(), "id": "m1"}, headers={"If-Match": etag}).status == 400
        assert client.request("DELETE", "Patient/m1", headers={"If-Match": etag}).status == 400


@pytest.mark.parametrize("value", [5, ["x"], {"a": 1}, "", " "])
@pytest.mark.parametrize("key", ["ifNoneExist", "ifMatch"])
def test_bundle_header_fields_that_are_not_strings_are_400(client, server, key, value):
    for kind in ("transaction", "batch"):
        with unchanged(server):
            resp = client.transaction(tx([{"resource": {**patient(), "id": "h1"},
                                           "request": {"method": "PUT", "url": "Patient/h1", key: value}}], kind))
            assert resp.status == 400 and f"request.{key}" in issues(resp)[0]["diagnostics"]


def test_a_batch_reports_every_entry_even_when_one_fails_unexpectedly(client, server, monkeypatch):
    """A bug in one entry (simulated) must not hide that the entries before it were written."""
    real = server.dispatch

    def flaky(req):
        if req.path == "Patient/boom":
            raise RuntimeError("simulated bug")
        return real(req)

    monkeypatch.setattr(server, "dispatch", flaky)
    resp = client.transaction(tx([
        {"resource": {**patient(), "id": "ok1"}, "request": {"method": "PUT", "url": "Patient/ok1"}},
        {"request": {"method": "GET", "url": "Patient/boom"}},
    ], "batch"))
    assert resp.status == 200
    statuses = [e["response"]["status"] for e in resp.body["entry"]]
    assert statuses == ["201 Created", "500"]
    assert "simulated bug" in resp.body["entry"][1]["response"]["outcome"]["issue"][0]["diagnostics"]


def test_a_conditional_update_that_matches_nothing_never_overwrites_the_body_id(client, server):
    put(client, {**patient(), "id": "victim"})
    with unchanged(server):
        resp = client.request("PUT", "Patient", {"identifier": f"{SYS}|nomatch"}, body={**patient(), "id": "victim"})
        assert resp.status == 409
        in_tx = client.transaction(tx([{"resource": {**patient(), "id": "victim"},
                                        "request": {"method": "PUT", "url": f"Patient?identifier={SYS}|nomatch"}}]))
        assert in_tx.status == 409
    assert client.read("Patient", "victim").body["meta"]["versionId"] == "1"


def test_cascade_needs_the_value_delete(client, server):
    put(client, {**patient(), "id": "c1"})
    put(client, {**obs("Patient/c1"), "id": "o1"})
    with unchanged(server):
        assert client.request("DELETE", "Patient", {"_id": "c1", "_cascade": "no"}).status == 400
        assert client.request("DELETE", "Patient/c1", {"_cascade": "yes"}).status == 400
        assert client.request("DELETE", "Patient", {"_id": "c1"}).status == 409
    assert client.request("DELETE", "Patient", {"_id": "c1", "_cascade": "delete"}).status == 200
    assert client.read("Observation", "o1").status == 410


def test_transaction_entries_are_checked_like_their_plain_requests(client, server):
    put(client, {**patient(), "id": "t1"})
    with unchanged(server):
        body_id = client.transaction(tx([{"resource": {**patient(), "id": "other"},
                                          "request": {"method": "PUT", "url": "Patient/t1"}}]))
        assert body_id.status == 400 and "must equal the id in the url" in issues(body_id)[0]["diagnostics"]
        bad_id = client.transaction(tx([{"request": {"method": "DELETE", "url": "Patient/bad id!"}}]))
        assert bad_id.status == 400
        twice = client.transaction(tx([{"request": {"method": "DELETE", "url": "Patient/t1"}},
                                       {"request": {"method": "DELETE", "url": "Patient/t1"}}]))
        assert twice.status == 400 and "Bundle.entry[1]" in issues(twice)[0]["diagnostics"]
        same_full_url = client.transaction(tx([
            {"fullUrl": PAT_URN, "resource": patient(), "request": {"method": "POST", "url": "Patient"}},
            {"fullUrl": PAT_URN, "resource": patient(), "request": {"method": "POST", "url": "Patient"}},
        ]))
        assert same_full_url.status == 400 and "bdl-7" in issues(same_full_url)[0]["diagnostics"]
        lower_case = client.transaction(tx([{"resource": patient(), "request": {"method": "post", "url": "Patient"}}]))
        assert lower_case.status == 400
        stale = client.transaction(tx([{"request": {"method": "DELETE", "url": "Patient/t1", "ifMatch": 'W/"7"'}}]))
        assert stale.status == 412
    # an entry without an id in its body takes the url's
    assert client.transaction(tx([{"resource": patient(gender="male"),
                                   "request": {"method": "PUT", "url": "Patient/t1"}}])).status == 200


def test_transaction_integrity_is_checked_on_its_final_state(client, server):
    put(client, {**patient(), "id": "x"})
    put(client, {**obs("Patient/x"), "id": "ox"})
    put(client, {**obs("Patient/x"), "id": "oy"})
    with unchanged(server):  # oy still references x afterwards
        still = client.transaction(tx([
            {"request": {"method": "DELETE", "url": "Patient/x"}},
            {"resource": {**obs(None), "id": "ox"}, "request": {"method": "PUT", "url": "Observation/ox"}},
        ]))
        assert still.status == 409 and "Observation/oy" in issues(still)[0]["diagnostics"]
        assert "Bundle.entry[0]" in issues(still)[0]["diagnostics"]
    resp = client.transaction(tx([  # ox and oy drop their references to x in the same transaction
        {"request": {"method": "DELETE", "url": "Patient/x"}},
        {"resource": {**obs(None), "id": "ox"}, "request": {"method": "PUT", "url": "Observation/ox"}},
        {"resource": {**obs(None), "id": "oy"}, "request": {"method": "PUT", "url": "Observation/oy"}},
    ]))
    assert resp.status == 200, resp.body
    assert client.read("Patient", "x").status == 410


def test_include_iterate_stops_at_the_configured_number_of_resources(client, server):
    server.config.max_includes = 3
    put(client, {**patient(), "id": "i1"})
    for k in range(5):
        put(client, {**obs("Patient/i1"), "id": f"io{k}"})
    page = client.search("Patient", {"_id": "i1", "_revinclude:iterate": "Observation:subject"}).body
    modes = [e["search"]["mode"] for e in page["entry"]]
    assert modes == ["match", "include", "include", "include", "outcome"]
    assert "incomplete" in page["entry"][-1]["resource"]["issue"][0]["diagnostics"]
    server.config.max_includes = 10
    page = client.search("Patient", {"_id": "i1", "_revinclude": "Observation:subject"}).body
    assert [e["search"]["mode"] for e in page["entry"]] == ["match"] + ["include"] * 5


@pytest.mark.parametrize("value", ["\u00b2", "1_0", " 5", "-1", "\u0663"])
def test_paging_numbers_are_ascii_digits(client, value):
    for k in range(3):
        put(client, {**patient(), "id": f"pg{k}"})
    first = client.search("Patient", {"_count": "1"}).body
    (next_url,) = [lk["url"] for lk in first["link"] if lk["relation"] == "next"]
    token = dict(parse_qsl(urlsplit(next_url).query))["_getpages"]
    assert client.request("GET", "", {"_getpages": token, "_getpagesoffset": "1"}).status == 200
    assert client.request("GET", "", {"_getpages": token, "_getpagesoffset": value}).status == 400
    assert client.request("GET", "", {"_getpages": token, "_getpagesoffset": "1", "_count": value}).status == 400
    assert client.request("GET", "_history", {"_count": value}).status == 400
    assert client.request("GET", "Patient/pg0/$everything", {"_count": value}).status == 400



def test_paging_numbers_of_thousands_of_digits_are_capped_not_a_500(client):
    for k in range(3):
        put(client, {**patient(), "id": f"pd{k}"})
    first = client.search("Patient", {"_count": "1"}).body
    (next_url,) = [lk["url"] for lk in first["link"] if lk["relation"] == "next"]
    token = dict(parse_qsl(urlsplit(next_url).query))["_getpages"]
    huge = "9" * 5000  # int() refuses strings of over 4,300 digits
    beyond = client.request("GET", "", {"_getpages": token, "_getpagesoffset": huge})
    assert beyond.status == 200 and "entry" not in beyond.body
    assert client.request("GET", "_history", {"_count": huge}).status == 200
    assert client.request("GET", "Patient/pd0/$everything", {"_count": huge}).status == 200


def test_metadata_modes_other_than_full_are_refused(client):
    assert client.request("GET", "metadata", {"mode": "full"}).status == 200
    resp = client.request("GET", "metadata", {"mode": "terminology"})
    assert resp.status == 400 and "not supported" in issues(resp)[0]["diagnostics"]


def test_return_minimal_holds_when_if_none_exist_finds_the_resource(client):
    client.create(patient("rm"))
    resp = client.request("POST", "Patient", body=patient("rm"),
                          headers={"If-None-Exist": f"identifier={SYS}|rm", "Prefer": "return=minimal"})
    assert resp.status == 200 and resp.body is None and resp.headers["ETag"] == 'W/"1"'


def test_history_since_takes_the_extreme_instants_of_fhir_years(client):
    client.create(patient())
    assert client.request("GET", "_history", {"_since": "0001-01-01T00:00:00+14:00"}).body["total"] == 1
    assert client.request("GET", "_history", {"_since": "9999-12-31T23:59:59-14:00"}).body["total"] == 0
    assert client.request("GET", "_history", {"_since": "\uff12\uff10\uff12\uff10"}).status == 400  # fullwidth digits


def test_validate_modes_and_profile(two_patients):
    client = two_patients
    server_params = {"resourceType": "Parameters", "parameter": [{"name": "mode", "valueCode": "delete"}]}
    would_fail = client.request("POST", "Patient/p1/$validate", body=server_params)
    assert would_fail.status == 200 and issues(would_fail)[0]["code"] == "conflict"  # referenced by its Observations
    put(client, {**patient(), "id": "lonely"})
    free = client.request("POST", "Patient/lonely/$validate", {"mode": "delete"})
    assert free.status == 200 and issues(free)[0]["severity"] == "information"
    assert client.request("POST", "Patient/nope/$validate", {"mode": "delete"}).status == 404
    assert client.request("POST", "Patient/$validate", {"mode": "bogus"}, body=patient()).status == 400
    other_id = client.request("POST", "Patient/p1/$validate", {"mode": "update"}, body={**patient(), "id": "other"})
    assert [i["severity"] for i in issues(other_id)] == ["error"] and "not the id in the URL" in \
        issues(other_id)[0]["diagnostics"]
    no_id = client.request("POST", "Patient/$validate", {"mode": "update"}, body=patient())
    assert issues(no_id)[0]["code"] == "required"
    profiled = client.request("POST", "Patient/$validate", {"profile": "http://nope"}, body=patient())
    assert [(i["severity"], i["code"]) for i in issues(profiled)] == [("warning", "not-supported")]
    two = {"resourceType": "Parameters", "parameter": [{"name": "resource", "resource": patient()}] * 2}
    assert client.request("POST", "Patient/$validate", body=two).status == 400


def test_everything_takes_parameters_by_post_and_checks_types(two_patients):
    client = two_patients
    body = {"resourceType": "Parameters", "parameter": [{"name": "_count", "valueInteger": 2},
                                                       {"name": "_type", "valueString": "Observation"}]}
    page = client.request("POST", "Patient/p1/$everything", body=body).body
    assert page["total"] == 4 and len(page["entry"]) == 2  # the patient and its 3 Observations, 2 a page
    assert client.request("POST", "Patient/p1/$everything", body=patient()).status == 400
    bad_param = {"resourceType": "Parameters", "parameter": [{"name": "_count"}]}
    assert client.request("POST", "Patient/p1/$everything", body=bad_param).status == 400
    both = client.request("GET", "Patient/p1/$everything", [("_type", "Observation"), ("_type", "Encounter")]).body
    assert {r.split("/")[0] for r in _refs(both)} == {"Patient", "Observation", "Encounter"}
    assert client.request("GET", "Patient/p1/$everything", {"_type": "Foo"}).status == 400
    assert client.request("GET", "Patient/p1/$everything", {"_type": ""}).status == 400


def test_history_says_201_for_the_version_that_brings_a_deleted_resource_back(client):
    put(client, {**patient(), "id": "back"})
    client.delete("Patient", "back")
    assert client.update({**patient(), "id": "back"}).status == 201
    statuses = [e["response"]["status"] for e in client.history("Patient", "back").body["entry"]]
    assert statuses == ["201", "204", "201"]  # newest first


def test_bundle_urls_may_be_absolute_on_this_server(client):
    put(client, {**patient(), "id": "abs"})
    resp = client.transaction(tx([{"request": {"method": "GET", "url": f"{BASE}/Patient/abs"}},
                                  {"request": {"method": "GET", "url": f"{BASE}/Patient?_id=abs"}}], "batch"))
    assert [e["response"]["status"] for e in resp.body["entry"]] == ["200 OK", "200 OK"]
    assert resp.body["entry"][1]["resource"]["total"] == 1


def test_a_paging_token_sent_to_the_type_gives_that_page(client):
    for k in range(3):
        put(client, {**patient(), "id": f"tp{k}"})
    first = client.search("Patient", {"_count": "1", "_sort": "_id"}).body
    (next_url,) = [lk["url"] for lk in first["link"] if lk["relation"] == "next"]
    token = dict(parse_qsl(urlsplit(next_url).query))["_getpages"]
    page = client.request("GET", "Patient", {"_getpages": token, "_getpagesoffset": "2", "_count": "1"})
    assert page.status == 200 and [e["resource"]["id"] for e in page.body["entry"]] == ["tp2"]
    assert client.request("GET", "Observation", {"_getpages": token}).status == 400
    assert client.request("GET", "Patient", {"_getpages": "nope"}).status == 410


def test_conditional_read(client, server):
    put(client, {**patient(), "id": "cr"})
    current = client.read("Patient", "cr")
    etag, modified = current.headers["ETag"], current.headers["Last-Modified"]
    same = client.request("GET", "Patient/cr", headers={"If-None-Match": etag})
    assert same.status == 304 and same.body is None and same.headers["ETag"] == etag
    assert client.request("GET", "Patient/cr", headers={"If-None-Match": 'W/"9", *'}).status == 304
    assert client.request("GET", "Patient/cr", headers={"If-Modified-Since": modified}).status == 304
    assert client.request("GET", "Patient/cr", headers={"If-Modified-Since": "Mon, 01 Jan 1990 00:00:00 GMT"}).status == 200
    assert client.request("GET", "Patient/cr", headers={"If-Modified-Since": "yesterday"}).status == 200  # ignored
    put(client, {**patient(gender="male"), "id": "cr"})
    changed = client.request("GET", "Patient/cr", headers={"If-None-Match": etag})
    assert changed.status == 200 and changed.body["gender"] == "male"
    rest = client.capabilities().body["rest"][0]["resource"]
    assert {r["conditionalRead"] for r in rest} == {"full-support"}


def test_elements_takes_top_level_names_and_self_links_keep_their_query(client):
    put(client, {**patient(), "id": "el"})
    assert client.search("Patient", {"_elements": "name.family"}).status == 400
    assert client.search("Patient", {"_elements": "name,gender"}).status == 200
    history = client.request("GET", "Patient/el/_history", {"_count": "5"}).body
    assert history["link"][0]["url"].endswith("Patient/el/_history?_count=5")
    everything = client.request("GET", "Patient/el/$everything", {"_count": "5"}).body
    assert everything["link"][0]["url"].endswith("Patient/el/$everything?_count=5")


def test_summary_and_elements_shape_a_read_and_a_vread(client):
    put(client, {**patient(), "id": "sh", "text": {"status": "generated", "div": "<div xmlns=\"http://www.w3.org/1999/xhtml\">x</div>"}})
    full = client.read("Patient", "sh").body
    subsetted = {"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED"}
    for path in ("Patient/sh", "Patient/sh/_history/1"):
        only = client.request("GET", path, {"_elements": "name"})
        assert only.status == 200 and only.headers["ETag"] == 'W/"1"'
        assert set(only.body) == {"resourceType", "id", "meta", "name"}
        assert subsetted in only.body["meta"]["tag"]
        data = client.request("GET", path, {"_summary": "data"}).body
        assert "text" not in data and data["name"] == full["name"]
        text = client.request("GET", path, {"_summary": "text"}).body
        assert "text" in text and "name" not in text
        assert client.request("GET", path, {"_summary": "false"}).body == full
        assert client.request("GET", path, {"_summary": "count"}).status == 400
        assert client.request("GET", path, {"_elements": "name.family"}).status == 400
    assert client.read("Patient", "sh").body == full  # the stored resource is untouched
