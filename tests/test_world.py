"""World builds: validated, closed, deterministic, cached; import of users' own Bundles/NDJSON."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import orjson
import pytest

from fhirgym.fhir import FhirServer, InProcessClient
from fhirgym.world import DEFAULT_ANCHOR, build_world, import_world, world_info, world_sha256
from fhirgym.world._build import cache_path, generate_resources, store_world


@pytest.fixture(scope="module")
def world50(tmp_path_factory):
    """The issue's acceptance world: 50 patients, built from scratch (not from the cache)."""
    out = tmp_path_factory.mktemp("w50") / "world.db"
    return build_world(seed=50, patients=50, out=out, use_cache=False)


@pytest.mark.slow
def test_fifty_patient_world_is_valid_and_closed(world50):
    # build_world raises WorldBuildError on any validation error or dangling reference; check it anyway
    store = world50.snapshot().open()
    server = FhirServer(store)
    rows = store.query("SELECT json FROM base.resources WHERE deleted = 0")
    errors = [i for (data,) in rows for i in server.validator.validate(orjson.loads(data)) if i.severity == "error"]
    assert errors == []
    dangling = store.query(
        "SELECT r.rtype, r.id, r.target_type, r.target_id FROM base.refs r WHERE NOT EXISTS "
        "(SELECT 1 FROM base.resources t WHERE t.rtype = r.target_type AND t.id = r.target_id AND t.deleted = 0)"
    )
    assert dangling == []
    counts = world50.counts
    assert counts["Patient"] >= 50
    for rtype in ("Practitioner", "PractitionerRole", "Schedule", "Slot", "Appointment", "Coverage", "Account",
                  "RelatedPerson", "ServiceRequest", "Specimen", "DiagnosticReport", "FamilyMemberHistory",
                  "Consent", "Medication", "Location", "Organization", "Encounter", "Observation"):
        assert counts.get(rtype, 0) > 0, rtype


@pytest.mark.slow
def test_world_is_searchable_through_the_server(world50):
    client = InProcessClient(FhirServer(world50.snapshot().open()))
    assert client.search("Slot", {"status": "free", "_summary": "count"}).body["total"] > 0
    assert client.search("Appointment", {"status": "booked", "_include": "Appointment:slot"}).status == 200
    pid = client.search("Patient", {"_count": "1"}).body["entry"][0]["resource"]["id"]
    everything = client.request("GET", f"Patient/{pid}/$everything").body
    assert everything["total"] > 1


def test_same_arguments_give_a_byte_identical_world(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    resources = generate_resources(7, 2, DEFAULT_ANCHOR)
    again = generate_resources(7, 2, DEFAULT_ANCHOR)
    assert orjson.dumps(resources) == orjson.dumps(again)
    manifest = {"seed": 7, "patients": 2, "anchor": "2025-06-02", "generator_version": 1}
    assert store_world(resources, a, manifest, workers=1).ok
    assert store_world(again, b, manifest, workers=2).ok
    assert hashlib.sha256(a.read_bytes()).hexdigest() == hashlib.sha256(b.read_bytes()).hexdigest()


def test_builds_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("FHIRGYM_CACHE", str(tmp_path / "cache"))
    first = build_world(seed=8, patients=1, out=tmp_path / "w.db")
    assert not first.cached and cache_path(8, 1, DEFAULT_ANCHOR).is_file()
    second = build_world(seed=8, patients=1, out=tmp_path / "w2.db")
    assert second.cached and second.sha256 == first.sha256
    assert second.timings == {}  # nothing was generated, validated or loaded the second time


def test_cli_show_and_import(tmp_path):
    from fhirgym.world import synthea_bundles

    bundles = synthea_bundles(seed=9, patients=1)
    src = tmp_path / "in"
    src.mkdir()
    for n, b in enumerate(bundles):
        (src / f"{n}.json").write_bytes(orjson.dumps(b))
    # also NDJSON: one resource per line, references already Type/id
    nd = tmp_path / "extra.ndjson"
    nd.write_text(json.dumps({"resourceType": "Organization", "id": "org-x", "name": "Imported clinic"}) + "\n")
    out = tmp_path / "imported.db"
    info, report = import_world([src, nd], out)
    assert report.ok and info is not None
    assert info.counts["Organization"] >= 1 and info.counts["Patient"] == 1
    shown = subprocess.run([sys.executable, "-m", "fhirgym.cli", "world", "show", str(out)],
                           capture_output=True, text=True, check=True).stdout
    assert "Patient" in shown and f"{info.total:,}" in shown
    # an invalid resource fails the import with a report naming it
    bad = tmp_path / "bad.ndjson"
    bad.write_text(json.dumps({"resourceType": "Patient", "id": "p1", "gender": "robot"}) + "\n")
    info, report = import_world([bad], tmp_path / "bad.db")
    assert info is None and not report.ok and report.invalid[0][0] == "Patient/p1"
    assert "robot" in report.summary()
    assert world_info(out).sha256 == info_sha(out)


def info_sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_world_digest_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    from fhirgym.world import _build

    world = tmp_path / "w.db"
    world.write_bytes(b"first version")
    hashed = []
    monkeypatch.setattr(_build, "file_sha256", lambda p: hashed.append(p) or info_sha(p))
    assert world_sha256(world) == info_sha(world) and len(hashed) == 1
    assert world_sha256(world) == info_sha(world) and len(hashed) == 1  # read back from w.db.sha256
    world.write_bytes(b"another version, another size")
    assert world_sha256(world) == info_sha(world) and len(hashed) == 2
    (tmp_path / "w.db.sha256").write_bytes(b"not json")  # a damaged side file is recomputed, not trusted
    assert world_sha256(world) == info_sha(world) and len(hashed) == 3


def test_invalid_resources_are_all_reported_and_nothing_is_written(tmp_path):
    # validation runs inside the (fail-fast) parallel load; a failure must still report every problem
    resources = [{"resourceType": "Patient", "id": "ok", "gender": "female"},
                 {"resourceType": "Patient", "id": "p1", "gender": "robot"},
                 {"resourceType": "Patient", "id": "p2", "birthDate": "yesterday"}]
    out = tmp_path / "bad.db"
    report = store_world(resources, out, {"generator_version": 1}, workers=2)
    assert not report.ok and report.checked == 3
    assert [key for key, _ in report.invalid] == ["Patient/p1", "Patient/p2"]
    assert not out.exists()


def test_world_file_is_the_one_default_world_and_refuses_a_missing_file(small_world_path, tmp_path):
    from fhirgym.world import world_file

    heard: list[str] = []
    assert world_file(seed=42, patients=10, announce=heard.append) == small_world_path
    assert heard == ["world: seed 42, 10 patients (built once, then cached) ..."]
    assert world_file(str(small_world_path)) == small_world_path.resolve()
    with pytest.raises(ValueError, match=r"world file '.*nope\.db' does not exist"):
        world_file(tmp_path / "nope.db")
