"""Issue 23: complete cascades, bounded requests (time, response size, Bundle entries), reads beside a
long write, and paging links that outlast other clients' traffic (docs/SERVER.md)."""

from __future__ import annotations

import threading
import time
from urllib.parse import parse_qsl, urlsplit

import pytest

from fhirgym.fhir import FhirServer, InProcessClient, Request, ServerConfig, Store


def org(oid: str, part_of: str | None = None) -> dict:
    out: dict = {"resourceType": "Organization", "id": oid, "name": f"Org {oid}"}
    if part_of:
        out["partOf"] = {"reference": f"Organization/{part_of}"}
    return out


def patient(pid: str, **extra) -> dict:
    return {"resourceType": "Patient", "id": pid, "name": [{"family": f"F{pid}"}], **extra}


def make(**config) -> tuple[FhirServer, InProcessClient]:
    server = FhirServer(Store(), config=ServerConfig(id_seed=7, **config))
    return server, InProcessClient(server)


def diagnostics(resp) -> str:
    return " ".join(i.get("diagnostics", "") for i in resp.body["issue"])


def link(bundle: dict, relation: str) -> str | None:
    return next((lk["url"] for lk in bundle.get("link", []) if lk["relation"] == relation), None)


def follow(client: InProcessClient, url: str):
    return client.request("GET", "", dict(parse_qsl(urlsplit(url).query)))


def ids(bundle: dict) -> list[str]:
    return [e["resource"]["id"] for e in bundle.get("entry", []) if e["search"]["mode"] == "match"]


# -- requirement 2: cascades are complete or refused ------------------------------------------------------
def test_a_cascade_deletes_all_1500_referrers_of_an_organization():
    server, client = make()
    assert not server.load([org("big"), *(patient(f"p{k}", managingOrganization={"reference": "Organization/big"})
                                          for k in range(1500))])
    resp = client.delete("Organization", "big", cascade=True)
    assert resp.status == 200, resp.body
    assert server.store.counts() == {}
    assert server.store.referrers("Organization", "big", limit=None) == []
    assert client.read("Patient", "p1499").status == 410


def test_a_cascade_down_a_2000_deep_chain_deletes_every_link():
    server, client = make()
    chain = [org("o0"), *(org(f"o{k}", f"o{k - 1}") for k in range(1, 2001))]
    assert not server.load(chain)
    resp = client.delete("Organization", "o0", cascade=True)
    assert resp.status == 200, resp.body
    assert server.store.counts() == {}
    history = client.request("GET", "Organization/o2000/_history").body
    assert history["entry"][0]["request"]["method"] == "DELETE"


def test_a_cascade_beyond_its_limit_is_refused_and_deletes_nothing():
    server, client = make(max_cascade_delete=100)
    assert not server.load([org("o0"), *(patient(f"p{k}", managingOrganization={"reference": "Organization/o0"})
                                         for k in range(150))])
    before = server.store.counts()
    resp = client.delete("Organization", "o0", cascade=True)
    assert resp.status == 409 and resp.body["issue"][0]["code"] == "too-costly"
    assert "max_cascade_delete" in diagnostics(resp) and "Nothing was deleted" in diagnostics(resp)
    assert server.store.counts() == before
    deep, deep_client = make(max_cascade_delete=100)
    assert not deep.load([org("o0"), *(org(f"o{k}", f"o{k - 1}") for k in range(1, 150))])
    assert deep_client.delete("Organization", "o0", cascade=True).status == 409
    assert deep.store.counts() == {"Organization": 150}
    deep.config.max_cascade_delete = 149  # exactly what the chain needs
    assert deep_client.delete("Organization", "o0", cascade=True).status == 200
    assert deep.store.counts() == {}


# -- requirement 3: bounded requests ---------------------------------------------------------------------
def test_bundle_entries_are_bounded_by_the_configured_limit():
    _server, client = make(max_bundle_entries=3)
    bundle = {"resourceType": "Bundle", "type": "batch",
              "entry": [{"request": {"method": "GET", "url": "Patient"}}] * 4}
    resp = client.transaction(bundle)
    assert resp.status == 413 and "max_bundle_entries" in diagnostics(resp)
    assert client.transaction({**bundle, "entry": bundle["entry"][:3]}).status == 200


def test_a_response_over_max_response_bytes_is_refused_and_a_batch_stays_bounded():
    server, client = make(max_response_bytes=20_000)
    assert not server.load([patient(f"p{k:03d}") for k in range(400)])
    resp = client.search("Patient", {"_count": "400"})
    assert resp.status == 400 and resp.body["issue"][0]["code"] == "too-costly"
    assert "max_response_bytes" in diagnostics(resp)
    assert client.search("Patient", {"_count": "10"}).status == 200
    batch = {"resourceType": "Bundle", "type": "batch",
             "entry": [{"request": {"method": "GET", "url": "Patient?_count=100"}}] * 6}
    statuses = [e["response"]["status"] for e in client.transaction(batch).body["entry"]]
    assert statuses[0] == "200 OK" and statuses[-1] == "400"  # the budget is the whole response's


def test_a_transaction_out_of_time_rolls_back_and_names_the_limit():
    server, client = make(request_timeout=0)
    bundle = {"resourceType": "Bundle", "type": "transaction",
              "entry": [{"resource": patient(f"t{k}"), "request": {"method": "PUT", "url": f"Patient/t{k}"}}
                        for k in range(5)]}
    resp = client.transaction(bundle)
    assert resp.status == 408 and resp.body["issue"][0]["code"] == "timeout"
    assert "request_timeout" in diagnostics(resp)
    assert server.store.counts() == {}
    batch = client.transaction({**bundle, "type": "batch"})
    assert batch.status == 200 and {e["response"]["status"] for e in batch.body["entry"]} == {"408"}
    assert server.store.counts() == {}
    server.create("Patient", patient("api"))  # the Python API has no deadline, even after a request ran out


def test_a_long_sqlite_statement_is_interrupted_at_the_deadline():
    server, client = make()
    assert not server.load([patient(f"p{k}") for k in range(3000)])
    server.config.request_timeout = 0
    resp = client.search("Patient", {"_sort": "-family", "_count": "1"})  # ~200,000 SQLite steps
    assert resp.status == 408, resp.body
    server.config.request_timeout = 30
    assert client.search("Patient", {"_sort": "-family", "_count": "1"}).status == 200


def test_a_stopping_server_ends_running_requests_with_503():
    server, client = make()
    server.stopping = True
    bundle = {"resourceType": "Bundle", "type": "transaction",
              "entry": [{"resource": patient("s1"), "request": {"method": "PUT", "url": "Patient/s1"}}]}
    resp = client.transaction(bundle)
    assert resp.status == 503 and server.store.counts() == {}


def test_reads_are_served_while_a_write_transaction_is_open(tmp_path):
    """A GET on a file-backed store runs on its own connection: it neither waits for the writer nor sees
    its uncommitted work."""
    server = FhirServer(Store(path=tmp_path / "layer.db"), config=ServerConfig(id_seed=1))
    client = InProcessClient(server)
    assert client.update(patient("r1")).status == 201
    inside, release = threading.Event(), threading.Event()

    def writer() -> None:
        with server._lock, server.store.transaction():
            server.create("Patient", patient("ignored"), rid="w1")
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert inside.wait(10)
        start = time.monotonic()
        assert client.read("Patient", "r1").status == 200
        assert client.read("Patient", "w1").status == 404  # not committed yet
        assert [e["resource"]["id"] for e in client.search("Patient", {}).body["entry"]] == ["r1"]
        assert time.monotonic() - start < 5 and thread.is_alive()
    finally:
        release.set()
        thread.join()
    assert client.read("Patient", "w1").status == 200
    server.store.close()


# -- requirement 5: paging that lasts -------------------------------------------------------------------
def test_a_next_link_outlives_other_searches_and_a_small_cache():
    server, client = make(page_cache_ids=10)
    assert not server.load([patient(f"p{k:02d}") for k in range(30)])
    first = client.search("Patient", {"_count": "5", "_sort": "_id"}).body
    nxt = link(first, "next")
    for k in range(600):  # more than the 512 searches that used to expire it, and more than the cache holds
        client.search("Patient", {"_count": "3", "family": f"F{k}"})
    page = follow(client, nxt)
    assert page.status == 200 and ids(page.body) == [f"p{k:02d}" for k in range(5, 10)]
    assert all(e["search"]["mode"] == "match" for e in page.body["entry"])  # unchanged store: no warning
    again = follow(client, link(page.body, "next"))
    assert ids(again.body) == [f"p{k:02d}" for k in range(10, 15)]


def test_a_re_run_after_writes_serves_the_current_list_and_says_so():
    server, client = make(page_cache_ids=10)
    assert not server.load([patient(f"p{k:02d}") for k in range(30)])
    nxt = link(client.search("Patient", {"_count": "5", "_sort": "_id"}).body, "next")
    client.search("Patient", {"_count": "3", "_sort": "-_id"})  # evicts the first list (cache of 10 ids)
    client.update(patient("p00a"))
    page = follow(client, nxt)
    assert page.status == 200 and ids(page.body) == ["p04", "p05", "p06", "p07", "p08"]
    outcome = [e for e in page.body["entry"] if e["search"]["mode"] == "outcome"]
    assert outcome and "changed since the first page" in outcome[0]["resource"]["issue"][0]["diagnostics"]


def test_a_history_page_re_run_is_exact_after_writes():
    _server, client = make(page_cache_ids=2)
    for k in range(6):
        client.update(patient(f"h{k}"))
    nxt = link(client.request("GET", "Patient/_history", {"_count": "2"}).body, "next")
    client.request("GET", "_history", {"_count": "1"})  # evicts
    client.update(patient("h9"))
    page = follow(client, nxt).body
    assert [e["resource"]["id"] for e in page["entry"]] == ["h3", "h2"] and page["total"] == 6


def test_paging_links_are_deterministic_and_foreign_tokens_are_410():
    links = []
    for _ in range(2):
        server, client = make(page_cache_ids=4)
        assert not server.load([patient(f"p{k}") for k in range(12)])
        links.append(link(client.search("Patient", {"_count": "4", "gender:missing": "true"}).body, "next"))
    assert links[0] == links[1] and links[0].startswith("http://localhost:8080/fhir?_getpages=")
    _server, client = make()
    cut = links[0].split("_getpages=")[1].split("&")[0][:-6]
    for token in ("nope", "x" * 70000, "WyJzIl0", "WyJxIiwgW10sICIiXQ", cut):
        resp = client.request("GET", "", {"_getpages": token})
        assert resp.status == 410, (token[:30], resp.status)


def test_an_everything_page_survives_eviction():
    server, client = make(page_cache_ids=3)
    assert not server.load([patient("pt"), *({"resourceType": "Observation", "id": f"o{k}", "status": "final",
                                              "code": {"text": "x"}, "subject": {"reference": "Patient/pt"}}
                                             for k in range(6))])
    first = client.request("GET", "Patient/pt/$everything", {"_count": "3"}).body
    client.search("Patient", {"_count": "1", "_sort": "_id"})
    client.search("Observation", {"_count": "1", "_sort": "_id"})  # evicts the $everything list
    page = follow(client, link(first, "next")).body
    assert len(page["entry"]) == 3 and page["total"] == 7


def test_a_request_inside_another_keeps_the_outer_deadline():
    server, _client = make()
    saved = server.begin_request()
    inner = server.begin_request()
    server.end_request(inner)
    assert server._budget.deadline is not None
    server.end_request(saved)
    assert server._budget.deadline is None
    assert server.handle(Request("GET", "metadata")).status == 200


@pytest.mark.parametrize("limit", ["request_timeout=none", "max_cascade_delete=5"])
def test_serve_limits_parse(limit):
    from fhirgym.cli.serve import _limits

    name, _, value = limit.partition("=")
    assert _limits((limit,)) == {name: None if value == "none" else int(value)}
