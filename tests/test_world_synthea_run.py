"""The patched Synthea entry point is exact: same lookup rows, same patients as unpatched Synthea."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import pytest
import yaml
from synthea.engine.transition import _EPOCH, LookupTableTransition
from synthea.helpers.resources import resource_path

from fhirgym.world import _synthea_run


class _Person:
    """What ``_matching_row`` reads from a patient: its attributes and its age in whole years."""

    def __init__(self, attributes: dict, age: int) -> None:
        self.attributes = attributes
        self.age = age

    def age_in_years(self, time: datetime) -> int:
        return self.age


def _shipped_lookups() -> list[tuple[str, frozenset]]:
    """Every (table, target columns) pair the shipped modules consult, as ``follow`` passes them."""
    found: set[tuple[str, frozenset]] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            entries = node.get("lookup_table_transition")
            if isinstance(entries, list):
                targets = frozenset(e.get("transition") for e in entries)
                found.update((e["lookup_table_name"], targets) for e in entries if e.get("lookup_table_name"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in Path(resource_path("modules")).rglob("*.json"):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return sorted(found, key=lambda item: (item[0], sorted(map(str, item[1]))))


def _variants(value: str, rng: random.Random) -> object:
    """A patient value that may or may not equal ``value`` once stripped and lower-cased."""
    return rng.choice([value, value.upper(), f" {value} ", value + "x", "", None, 3, value.title()])


def _random_person(rows: list[dict], targets: frozenset, rng: random.Random) -> tuple[_Person, datetime]:
    """A patient and a time drawn around the table's own values, so that rows match and miss."""
    row = rng.choice(rows)
    attributes: dict = {}
    age = rng.randint(0, 110)
    time = datetime(1900, 1, 1) + timedelta(days=rng.uniform(0, 135 * 365))
    for column, cell in row.items():
        if not column or column in targets or cell is None:
            continue
        key = column.strip().lower()
        if key in ("age", "time"):
            ends = [float(x) for x in cell.replace(" ", "").split("-") if x.replace(".", "", 1).isdigit()]
            if ends and rng.random() < 0.7:
                point = rng.choice(ends) + rng.choice([-1, 0, 0, 1])
                if key == "age":
                    age = max(0, int(point))
                else:
                    time = _EPOCH + timedelta(milliseconds=point)
            continue
        name = "gender" if key == "gender" else rng.choice([column, key])
        if rng.random() < 0.9:
            attributes[name] = _variants(cell, rng) if rng.random() < 0.3 else cell
    return _Person(attributes, age), time


def _same_rows(name: str, rows: list[dict], targets: frozenset, rng: random.Random, trials: int) -> int:
    """Compare the patched matcher with Synthea's own on ``trials`` random patients; count matches found."""
    original = LookupTableTransition({"lookup_table_transition": []})
    hits = 0
    for _ in range(trials):
        person, time = _random_person(rows, targets, rng)
        expected = original._matching_row(name, rows, person, time, set(targets))
        actual = _synthea_run.matching_row(original, name, rows, person, time, set(targets))
        assert actual is expected, (name, person.attributes, person.age, time)
        hits += expected is not None
    return hits


def test_indexed_matcher_returns_the_scans_row_for_every_shipped_table():
    lookups = _shipped_lookups()
    assert len({name for name, _ in lookups}) >= 60  # the module set consults (nearly) every bundled table
    rng = random.Random(20251201)
    hits = 0
    for name, targets in lookups:
        rows = LookupTableTransition._load_csv(name)
        if rows:
            hits += _same_rows(name, rows, targets, rng, trials=60)
    assert hits > 0.3 * 60 * len(lookups)  # the patients were not all misses


def test_indexed_matcher_on_awkward_tables():
    """Blank cells (rows of several shapes), overlaps, reversed, single-value and unparseable ranges."""
    rows = [
        {"age": "abc", "Gender ": "F", "stage": "1", "time": "", "T": "0.1"},
        {"age": "10-20", "Gender ": "F", "stage": "", "time": "", "T": "0.2"},
        {"age": "15-30", "Gender ": "", "stage": "2", "time": "0-1000", "T": "0.3"},
        {"age": "30-10", "Gender ": "M", "stage": "1", "time": "", "T": "0.4"},
        {"age": "40", "Gender ": "M", "stage": "", "time": "", "T": "0.5"},
        {"age": "nan-50", "Gender ": "M", "stage": "", "time": "", "T": "0.6"},
        {"age": "", "Gender ": "", "stage": "2", "time": "500-1500", "T": "0.7"},
        {"age": "0-200", "Gender ": "F", "stage": "1", "time": "", "T": "0.8"},
        {"age": "", "Gender ": "", "stage": "", "time": "", "T": "0.9"},
    ]
    rng = random.Random(7)
    for first in range(len(rows)):  # every suffix: the catch-all row last, or not there at all
        name = f"fhirgym-test-awkward-{first}"
        assert _same_rows(name, rows[first:], frozenset({"T"}), rng, trials=400) > 0


def test_c_yaml_loader_reads_every_shipped_file_identically():
    files = sorted(Path(resource_path("")).rglob("*.y*ml"))
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.safe_load(text), path


def test_other_synthea_versions_run_unpatched(monkeypatch, capsys):
    monkeypatch.setattr(_synthea_run, "version", lambda name: "9.9.9")
    monkeypatch.setattr(_synthea_run, "_patched", False)
    before = LookupTableTransition._matching_row
    assert _synthea_run.patch() is False
    assert LookupTableTransition._matching_row is before
    assert "unpatched" in capsys.readouterr().err


def _run(args: list[str], out: Path) -> dict[str, object]:
    cmd = [*args, "-s", "3", "--clinician-seed", "3", "-p", "2", "-r", "20250602", "-o", str(out),
           "--log-level", "error", "Massachusetts"]
    subprocess.run(cmd, check=True, capture_output=True)
    return {p.name: orjson.loads(p.read_bytes()) for p in sorted(out.joinpath("fhir").glob("*.json"))}


@pytest.mark.slow
def test_patched_synthea_writes_the_same_patients(tmp_path):
    exe = Path(sys.executable).with_name("synthea")
    plain = _run([str(exe), "--threads", "1"], tmp_path / "plain")
    # two worker processes: the patches must reach Synthea's pool workers too
    patched = _run([sys.executable, "-m", "fhirgym.world._synthea_run", "--threads", "2"], tmp_path / "patched")
    assert len(plain) == 2
    assert patched == plain


def test_facilities_are_parsed_once_then_copied(monkeypatch):
    from synthea.world.location import Location
    from synthea.world.provider import ProviderManager

    original = ProviderManager._load_facilities
    monkeypatch.setattr(_synthea_run, "_facilities", {})
    monkeypatch.setattr(_synthea_run, "_original_load_facilities", original)
    location = Location()
    location.set_state("Massachusetts")

    def loaded() -> ProviderManager:
        manager = ProviderManager(seed=1)
        manager.load(location)
        return manager

    plain = loaded()
    monkeypatch.setattr(ProviderManager, "_load_facilities", _synthea_run.load_facilities)
    first, second = loaded(), loaded()
    assert len(_synthea_run._facilities) == 1  # the second load parsed nothing
    assert plain.providers and list(first.providers.items()) == list(plain.providers.items())
    assert list(second.providers.items()) == list(plain.providers.items())
    assert all(a is not b for a, b in zip(first.providers.values(), second.providers.values(), strict=True))


@pytest.fixture(scope="module")
def generator():
    from synthea.engine.generator import Generator, GeneratorOptions

    options = GeneratorOptions()
    options.seed = options.clinician_seed = 3
    options.state = "Massachusetts"
    options.reference_date, options.reference_date_explicit = datetime(2025, 6, 2), True
    return Generator(options)


def _life(generator, index: int) -> tuple[list, str]:
    """A patient's attributes (in insertion order, objects by type) and FHIR bundle, as JSON text."""
    from synthea.export.fhir import FHIRExporter

    person = generator.generate_person(index)
    simple = (str, int, float, bool, datetime, timedelta, type(None))
    attributes = [(k, v if isinstance(v, simple) else type(v).__name__) for k, v in person.attributes.items()]
    exporter = next(e for e in generator.exporter.patient_exporters if isinstance(e, FHIRExporter))
    return attributes, json.dumps(exporter.create_bundle(person), default=str, sort_keys=True)


@pytest.mark.parametrize("index", [1, pytest.param(3, marks=pytest.mark.slow)])  # aged 2 and 44
def test_patched_simulation_lives_the_same_life(generator, monkeypatch, index):
    """Module.process, the inline Delay and Guard steps, and the rest leave the same patient behind."""
    plain = _life(generator, index)
    for owner, name, replacement in _synthea_run.replacements():
        monkeypatch.setattr(owner, name, replacement)
    patched = _life(generator, index)
    assert len(plain[0]) > 1000 and '"resourceType": "Encounter"' in plain[1]
    assert patched[0] == plain[0]
    assert patched[1] == plain[1]
