"""Layered storage: snapshots, forks and resets are isolated and cost what an episode wrote."""

from __future__ import annotations

import pytest

from fhirgym.fhir import FhirServer, InProcessClient, Snapshot, Store


def _patient(family: str) -> dict:
    return {"resourceType": "Patient", "name": [{"family": family}], "gender": "female"}


@pytest.fixture()
def world(tmp_path):
    """A base file with two patients and an observation."""
    store = Store()
    c = InProcessClient(FhirServer(store))
    a = c.create(_patient("Alpha")).body["id"]
    b = c.create(_patient("Beta")).body["id"]
    obs = {
        "resourceType": "Observation", "status": "final", "code": {"text": "x"},
        "subject": {"reference": f"Patient/{a}"},
    }
    o = c.create(obs).body["id"]
    c.update({**_patient("Alpha2"), "id": a})  # a second version lives in the base's history
    path = tmp_path / "world.db"
    store.export(path)
    store.close()
    return Snapshot(path), a, b, o


def _names(client) -> list[str]:
    bundle = client.search("Patient", {"_sort": "family"}).body
    return [e["resource"]["name"][0]["family"] for e in bundle.get("entry", [])]


def test_forks_are_isolated(world):
    snap, _, b, _ = world
    s1, s2 = snap.open(), snap.open()
    c1, c2 = InProcessClient(FhirServer(s1)), InProcessClient(FhirServer(s2))
    assert _names(c1) == _names(c2) == ["Alpha2", "Beta"]
    c1.create(_patient("Gamma"))
    c2.delete("Patient", b)
    assert _names(c1) == ["Alpha2", "Beta", "Gamma"]
    assert _names(c2) == ["Alpha2"]
    assert c2.read("Patient", b).status == 410
    assert c1.read("Patient", b).status == 200
    # a fresh fork of the same snapshot sees none of it
    assert _names(InProcessClient(FhirServer(snap.open()))) == ["Alpha2", "Beta"]


def test_update_in_layer_shadows_base_index_rows(world):
    snap, a, _, _ = world
    c = InProcessClient(FhirServer(snap.open()))
    c.update({**_patient("Zeta"), "id": a})
    assert c.search("Patient", {"family": "Alpha2"}).body["total"] == 0
    assert c.search("Patient", {"family": "Zeta"}).body["total"] == 1
    history = c.history("Patient", a).body
    assert [e["resource"]["meta"]["versionId"] for e in history["entry"]] == ["3", "2", "1"]


def test_reset_returns_to_the_base_and_to_snapshots(world):
    snap, _, b, o = world
    store = snap.open()
    c = InProcessClient(FhirServer(store))
    c.create(_patient("Gamma"))
    mid = store.snapshot()
    c.delete("Observation", o)
    c.update({**_patient("Omega"), "id": b})
    assert _names(c) == ["Alpha2", "Gamma", "Omega"]
    store.reset(mid)
    assert _names(c) == ["Alpha2", "Beta", "Gamma"]
    assert c.read("Observation", o).status == 200
    store.reset()
    assert _names(c) == ["Alpha2", "Beta"]
    assert store.counts() == {"Observation": 1, "Patient": 2}
    # a snapshot opens as many independent stores as wanted
    other = mid.open()
    assert InProcessClient(FhirServer(other)).search("Patient", {"family": "Gamma"}).body["total"] == 1


def test_fork_copies_the_current_state_and_then_diverges(world):
    snap, _, b, _ = world
    store = snap.open()
    c = InProcessClient(FhirServer(store))
    c.create(_patient("Gamma"))
    forked = InProcessClient(FhirServer(store.fork()))
    assert _names(forked) == ["Alpha2", "Beta", "Gamma"]
    assert forked.delete("Patient", b).status == 200
    assert _names(forked) == ["Alpha2", "Gamma"]
    assert _names(c) == ["Alpha2", "Beta", "Gamma"]


def test_reset_to_a_snapshot_of_another_base_is_refused(world, tmp_path):
    snap, *_ = world
    store = snap.open()
    with pytest.raises(ValueError, match="another base"):
        store.reset(Store().snapshot())


def test_transactions_roll_back(world):
    snap, *_ = world
    store = snap.open()
    server = FhirServer(store)
    before = store.counts()
    with pytest.raises(RuntimeError), store.transaction():
        server.create("Patient", _patient("Temp"))
        raise RuntimeError("boom")
    assert store.counts() == before


def test_export_flattens_layers_with_history(world, tmp_path):
    snap, a, b, _ = world
    store = snap.open()
    c = InProcessClient(FhirServer(store))
    c.update({**_patient("Alpha3"), "id": a})
    c.delete("Patient", b)
    flat = Snapshot(tmp_path / "flat.db")
    store.export(flat.base)
    c2 = InProcessClient(FhirServer(flat.open()))
    assert _names(c2) == ["Alpha3"]
    assert c2.read("Patient", b).status == 410
    assert [e["response"]["etag"] for e in c2.history("Patient", a).body["entry"]] == ['W/"3"', 'W/"2"', 'W/"1"']
    assert c2.vread("Patient", a, 1).body["name"][0]["family"] == "Alpha"


def test_file_backed_store_persists(tmp_path):
    path = tmp_path / "data.db"
    store = Store(path=path)
    pid = InProcessClient(FhirServer(store)).create(_patient("Kept")).body["id"]
    store.close()
    again = InProcessClient(FhirServer(Store(path=path)))
    assert again.read("Patient", pid).body["name"][0]["family"] == "Kept"


def test_resets_to_a_snapshot_after_json_each_queries_stay_sound(world):
    """SQLite 3.40 keeps pointers into a replaced schema for the ``json_each`` a connection has used:
    deserializing a layer into that connection made later statements read freed memory (a segfault in
    the suite). Resets to a snapshot therefore open a new connection; many rounds of search, write and
    reset must give the same answers every time."""
    snap, *_ = world
    store = snap.open()
    c = InProcessClient(FhirServer(store))
    c.create(_patient("Gamma"))
    mid = store.snapshot()
    bp = {"resourceType": "Observation", "status": "final", "code": {"text": "bp"}, "component": [
        {"code": {"coding": [{"system": "http://loinc.org", "code": "8480-6"}]},
         "valueQuantity": {"value": 120, "system": "http://unitsofmeasure.org", "code": "mm[Hg]"}}]}
    for _ in range(150):
        c.create(bp)
        composite = c.search("Observation", {"component-code-value-quantity": "http://loinc.org|8480-6$120"})
        assert composite.body["total"] == 1
        assert _names(c) == ["Alpha2", "Beta", "Gamma"]
        store.reset(mid)
        assert c.search("Observation", {"component-code-value-quantity": "8480-6$120"}).body["total"] == 0
        assert _names(c) == ["Alpha2", "Beta", "Gamma"]
