"""Bulk loads and the fast paths behind search: parallel loads store exactly what a serial load stores,
edges read from JSON bytes equal edges from the tree, one-sided stores search like layered ones, and
spliced JSON serialises to the same bytes as parsed JSON."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fhirgym.fhir import FhirError, FhirServer, InProcessClient, Request, ServerConfig, Snapshot, Store
from fhirgym.fhir._refs import reference_strings, reference_strings_json
from fhirgym.fhir._store import BOTH, CURRENT_TABLES

CLOCK = ServerConfig(clock=lambda: datetime(2024, 6, 1, tzinfo=UTC))


def _resources(patients: int) -> list[dict]:
    """Patients with two observations each: more than two 500-resource chunks for 400 patients."""
    out: list[dict] = []
    for n in range(patients):
        out.append({"resourceType": "Patient", "id": f"p{n}", "name": [{"family": f"Fam{n % 7}"}],
                    "gender": "female" if n % 2 else "male"})
        for k in range(2):
            out.append({
                "resourceType": "Observation", "id": f"o{n}-{k}", "status": "final",
                "code": {"coding": [{"system": "http://loinc.org", "code": f"{8000 + k}-1"}]},
                "subject": {"reference": f"Patient/p{n}"}, "effectiveDateTime": f"2024-01-{k + 1:02d}",
            })
    return out


def _rows(store: Store) -> dict[str, list]:
    """Every row of the layer, in storage order (which decides the bytes of an exported world)."""
    return {t: store.query(f"SELECT * FROM main.{t} ORDER BY rowid") for t in ("resources", "history", *CURRENT_TABLES)}


def test_parallel_load_stores_what_a_serial_load_stores_in_the_same_order():
    data = _resources(400)
    stores = []
    for workers in (1, 2):
        store = Store()
        server = FhirServer(store, config=CLOCK)
        server.load(data[:30])  # a first version of some: the bulk load then writes version 2
        assert server.load(data, workers=workers) == []
        stores.append(store)
    serial, parallel = (_rows(s) for s in stores)
    assert len(serial["resources"]) == len(data)
    assert len(serial["history"]) == 30
    assert parallel == serial
    # the indexes are back; the 30 reloaded resources are at version 2, the others at 1
    client = InProcessClient(FhirServer(stores[1], config=CLOCK))
    bundle = client.search("Observation", {"patient": "p20", "code": "http://loinc.org|8001-1"}).body
    assert [e["resource"]["id"] for e in bundle["entry"]] == ["o20-1"]
    assert bundle["entry"][0]["resource"]["meta"]["versionId"] == "1"
    assert client.read("Patient", "p1").body["meta"]["versionId"] == "2"


def test_parallel_load_rejects_the_first_invalid_resource_and_stores_nothing():
    data = _resources(400)
    data[700]["status"] = "not-a-status"
    data[900]["gender"] = 5
    store = Store()
    with pytest.raises(FhirError) as err:
        FhirServer(store).load(data, workers=2)
    assert err.value.status == 422 and "resource #700" in err.value.diagnostics
    assert store.counts() == {}


def test_a_scratch_store_is_loaded_in_place_by_the_workers_like_a_serial_load(tmp_path):
    # a world build's store: the workers write straight into its file (no copy), chunk by chunk in order
    data = _resources(400)
    stores = [Store(path=tmp_path / f"{w}.db", durable=False) for w in (1, 2)]
    for workers, store in zip((1, 2), stores):
        assert store.can_share_bulk()
        assert FhirServer(store, config=CLOCK).load(data, workers=workers) == []
    assert _rows(stores[0]) == _rows(stores[1]) and len(_rows(stores[1])["resources"]) == len(data)
    indexes = [store.query("SELECT name FROM main.sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                           "ORDER BY name") for store in stores]
    assert indexes[0] == indexes[1] and ("ix_token_res",) in indexes[1] and ("ix_uri_res",) not in indexes[1]
    client = InProcessClient(FhirServer(stores[1], config=CLOCK))
    bundle = client.search("Observation", {"patient": "p20", "code": "http://loinc.org|8001-1"}).body
    assert [e["resource"]["id"] for e in bundle["entry"]] == ["o20-1"]
    assert not stores[1].can_share_bulk()  # it holds data now: a second load goes through a transaction


def test_a_failed_load_into_a_scratch_store_leaves_it_empty_and_usable(tmp_path, monkeypatch):
    from fhirgym.fhir import _bulk

    data = _resources(400)
    data[700]["status"] = "not-a-status"
    data[900]["gender"] = 5
    store = Store(path=tmp_path / "s.db", durable=False)
    server = FhirServer(store, config=CLOCK)
    with pytest.raises(FhirError) as err:
        server.load(data, workers=2)
    assert err.value.status == 422 and "resource #700" in err.value.diagnostics
    assert store.counts() == {} and store.can_share_bulk()
    # a crash in a worker (not a validation error) must not leave later chunks waiting for their turn
    real = _bulk._prepare
    monkeypatch.setattr(_bulk, "_prepare", lambda s, items, *a: 1 / 0 if items[0][0] == 500 else real(s, items, *a))
    with pytest.raises(ZeroDivisionError):
        server.load(_resources(400), workers=2)
    assert store.counts() == {}
    monkeypatch.setattr(_bulk, "_prepare", real)
    assert server.load(_resources(400), workers=2) == [] and store.counts() == {"Observation": 800, "Patient": 400}


def test_load_reports_every_edge_to_a_missing_resource_once(tmp_path):
    base = Store()
    FhirServer(base, config=CLOCK).load(_resources(1))  # Patient/p0 lives in the base
    base.export(tmp_path / "w.db")
    store = Snapshot(tmp_path / "w.db").open()
    server = FhirServer(store, config=CLOCK)
    server.load([{"resourceType": "Patient", "id": "p9"}])
    obs = [{"resourceType": "Observation", "id": f"x{n}", "status": "final", "code": {"text": "x"},
            "subject": {"reference": f"Patient/{target}"}, "performer": [{"reference": f"Patient/{target}"}]}
           for n, target in enumerate(["p0", "gone", "p9", "gone", "lost"])]
    issues = server.load(obs)
    # two parameters, one edge each: x1, x3 and x4 each reported once per missing target, in input order
    assert [i.diagnostics for i in issues] == [
        "Observation/x1 references Patient/gone, which does not exist",
        "Observation/x3 references Patient/gone, which does not exist",
        "Observation/x4 references Patient/lost, which does not exist",
    ]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(alphabet='ab"\\,{}:/ré\n'),
    lambda kids: st.lists(kids, max_size=4)
    | st.dictionaries(st.sampled_from(["reference", "_reference", "x", 'a"b', "reference\\"]), kids, max_size=4),
    max_leaves=20,
))
def test_references_read_from_json_bytes_equal_the_tree_walk(tree):
    doc = {"resourceType": "Basic", "a": tree}
    # the tree walk goes depth-first, the byte scan in document order: the same multiset
    assert sorted(reference_strings_json(orjson.dumps(doc))) == sorted(reference_strings(doc))


def test_references_read_from_json_bytes_handle_escapes():
    doc = {"resourceType": "Basic", "x": [{"reference": 'Patient/"q"'}, {"reference": "a\\"},
                                          {"note": ',"reference":"Patient/no"'}, {"reference": 3}]}
    assert sorted(reference_strings_json(orjson.dumps(doc))) == sorted(reference_strings(doc))
    assert "Patient/no" not in reference_strings_json(orjson.dumps(doc))


def test_a_store_searches_alike_with_one_side_or_two(tmp_path):
    store = Store()
    server = FhirServer(store)
    server.load(_resources(5))
    assert store.sides() == ("main",)
    store.export(tmp_path / "w.db")
    fork = Snapshot(tmp_path / "w.db").open()
    assert fork.sides() == ("base",)
    client = InProcessClient(FhirServer(fork))

    def ids() -> list[str]:
        return [e["resource"]["id"] for e in client.search("Observation", {"patient.family": "Fam1"}).body["entry"]]

    assert ids() == ["o1-0", "o1-1"]
    client.delete("Observation", "o1-0")
    assert fork.sides() == BOTH
    assert ids() == ["o1-1"]  # the layer's deletion shadows the base row
    fork.reset()
    assert fork.sides() == ("base",)
    assert ids() == ["o1-0", "o1-1"]


def test_spliced_search_serialises_like_the_parsed_one():
    server = FhirServer(Store())
    server.load(_resources(3))
    for query in ([("patient", "p1")], [("patient", "p1"), ("_include", "Observation:patient")],
                  [("code", "8000-1"), ("_elements", "status")]):
        parsed = server.handle(Request("GET", "Observation", query))
        raw = server.handle(Request("GET", "Observation", query, raw=True))
        assert raw.status == parsed.status == 200
        assert orjson.loads(orjson.dumps(raw.body)) == parsed.body
        assert parsed.body["entry"]
