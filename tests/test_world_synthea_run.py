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


# --- third round: conditions, lookup transitions, delays, vitals, pruning -------------------------


def _shipped_nodes(predicate) -> list[dict]:
    """Every dict in the shipped modules' definitions for which ``predicate`` holds."""
    found: list[dict] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if predicate(node):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted(Path(resource_path("modules")).rglob("*.json")):
        walk(json.loads(path.read_text(encoding="utf-8")))
    return found


def _outcome(function, *args) -> tuple:
    try:
        return ("value", function(*args))
    except Exception as error:  # the patched code must fail as the original does
        return ("error", type(error))


def _random_patient(rng: random.Random, attributes: dict[str, list], codes: list[str] = ()) -> tuple:
    """A real Person with random attribute values drawn from ``attributes`` (absent included), some of
    ``codes`` active in its record (as conditions, medications, care plans and allergies), and a time."""
    from synthea.world.person import Person

    person = Person(seed=rng.randrange(10**6))
    person.init_health_record()
    time = datetime(1940, 1, 1) + timedelta(days=rng.uniform(0, 85 * 365))
    if rng.random() < 0.3:  # on the day Date conditions name
        time = datetime(rng.randint(1940, 2025), 1, 1)
    person.attributes["birth_date"] = time - timedelta(days=rng.uniform(0, 100 * 365))
    person.attributes["gender"] = rng.choice(["F", "M", "f"])
    for name, values in attributes.items():
        if rng.random() < 0.6:
            person.attributes[name] = rng.choice(values)
    if rng.random() < 0.5:
        person._module_stack = [rng.choice(["hypertension", "diabetes", "x"])]
    record = person.record
    for active in (record._active_conditions, record._active_medications, record._active_careplans,
                   record._active_allergies):
        for code in rng.sample(codes, min(len(codes), 30)):
            active[code] = [object()]
    return person, time


def test_compiled_conditions_agree_with_logic_on_every_shipped_condition():
    from synthea.engine.logic import Logic

    _synthea_run.replacements()  # records the original Logic.test; installs nothing
    original = Logic.test
    assert original is _synthea_run._original_logic_test
    conditions = _shipped_nodes(lambda node: "condition_type" in node)
    assert len(conditions) > 1000
    values: dict[str, list] = {}
    for condition in conditions:
        if "attribute" in condition:
            pool = values.setdefault(condition["attribute"], [None, True, False, 0, 1, 2.5, "x", "1", 10**6])
            for key in ("value", "value_code"):
                if isinstance(condition.get(key), str | int | float | bool):
                    pool.append(condition[key])
    malformed = [{"condition_type": "Age", "operator": ">=", "quantity": "18"},
                 {"condition_type": "Attribute", "attribute": "a", "operator": ["=="], "value": 1},
                 {"condition_type": "And", "conditions": None}, {"condition_type": "Or", "conditions": [{}, "x"]},
                 {"condition_type": "Gender", "gender": None}, {"condition_type": "Nonsense"}, {},
                 {"condition_type": "Attribute", "attribute": "a", "operator": "<", "value": "b"}]
    malformed += [{"condition_type": "Date", "operator": "<", "date": "2020-01-01T00:00:00Z"},
                  {"condition_type": "Date", "operator": "==", "date": {"year": 2001, "month": 2}},
                  {"condition_type": "Date", "operator": "~", "year": 2001}, {"condition_type": "Date", "year": 0},
                  {"condition_type": "Active Condition", "codes": ["x"]}, {"condition_type": "Active Allergy"}]
    values["a"] = [None, 1, "a", "c", 2.0]
    codes = sorted({str(c["codes"][0].get("code")) for c in conditions
                    if str(c["condition_type"]).startswith("Active") and c.get("codes")})
    assert len(codes) > 20
    rng = random.Random(20251130)
    for condition in conditions + malformed:
        for _ in range(3):
            person, time = _random_patient(rng, values, codes)
            expected = _outcome(original, condition, person, time)
            assert _outcome(_synthea_run.logic_test, condition, person, time) == expected, condition


def test_lookup_follow_draws_what_synthea_draws():
    definitions = _shipped_nodes(lambda node: isinstance(node.get("lookup_table_transition"), list))
    assert definitions
    rng = random.Random(11)
    for definition in definitions:
        transition = LookupTableTransition(definition)
        entries = definition["lookup_table_transition"]
        targets = frozenset(e.get("transition") for e in entries)
        name = next((e["lookup_table_name"] for e in entries if e.get("lookup_table_name")), None)
        rows = LookupTableTransition._load_csv(name) if name else None
        for _ in range(5):
            if rows:
                person, time = _random_person(rows, targets, rng)
            else:
                person, time = _Person({}, rng.randint(0, 100)), datetime(2000, 1, 1)
            seed = rng.randrange(10**6)
            person.random = random.Random(seed)
            expected = transition.follow(person, time), person.random.getstate()
            person.random = random.Random(seed)
            actual = _synthea_run.lookup_follow(transition, person, time), person.random.getstate()
            assert actual == expected, definition
    empty = LookupTableTransition({"lookup_table_transition": []})
    assert _synthea_run.lookup_follow(empty, _Person({}, 3), datetime(2000, 1, 1)) is None


def test_delay_durations_draw_what_synthea_draws():
    from types import SimpleNamespace

    from synthea.engine.values import duration_for
    from synthea.world.person import Person

    delays = _shipped_nodes(lambda node: node.get("type") == "Delay")
    assert len(delays) > 100
    odd = [{"range": {"low": "a", "high": 2, "decimals": "x"}}, {"range": {"low": 1, "high": 2, "decimals": 1}},
           {"exact": {"quantity": 3, "unit": "fortnights"}}, {"range": {"low": 1, "high": 9}, "unit": "eons"},
           {"distribution": {"kind": "GAUSSIAN", "parameters": {"mean": 5, "standardDeviation": 2}}},
           {"exact": 4, "unit": "weeks"}, {"range": 3}, {}]
    for definition in delays + odd:
        state = SimpleNamespace(definition=definition)
        for seed in range(3):
            plain, patched = Person(seed=seed), Person(seed=seed)
            assert _outcome(_synthea_run.delay_duration, state, patched) == _outcome(duration_for, definition, plain)
            assert patched.random.getstate() == plain.random.getstate()


def _vital_patient(seed: int) -> object:
    from synthea.world.person import Person

    rng = random.Random(seed)
    person = Person(seed=seed)
    person.init_health_record()
    attributes = person.attributes
    attributes["birth_date"] = datetime(1930, 1, 1) + timedelta(days=rng.uniform(0, 90 * 365))
    attributes["gender"] = rng.choice(["F", "M"])
    for name, choices in {"diabetes_severity": [0, 1, 2, 3, 4, 5, -1, 2.7, "2"], "ckd": [1, 2, 3, 4, 5, 0, "3", 2.0],
                          "prediabetes": [True, False], "diabetes": [True, False], "chf": [True, False],
                          "hypertension": [True, False], "hypertension_severe": [True, False],
                          "low_hdl": [True, False], "high_total_chol": [True, False]}.items():
        if rng.random() < 0.5:
            attributes[name] = rng.choice(choices)
    if "low_hdl" in attributes:
        attributes["high_total_chol"] = attributes.get("high_total_chol", False)
    if rng.random() < 0.8:
        person.set_vital_sign("Weight", rng.uniform(3, 150), "kg", datetime(2000, 1, 1))
        person.set_vital_sign("Body Mass Index", rng.uniform(12, 60), "kg/m2", datetime(2000, 1, 1))
    return person


def test_vitals_are_the_same_draws_in_the_same_order():
    from synthea.modules.core.lifecycle import LifecycleModule
    from synthea.world import vitals

    _synthea_run.replacements()
    module = LifecycleModule()
    for seed in range(300):
        plain, patched = _vital_patient(seed), _vital_patient(seed)
        time = datetime(2020, 1, 1) + timedelta(weeks=seed)
        expected = list(vitals.calculate_vitals(plain, time).items())
        assert list(_synthea_run.calculate_vitals(patched, time).items()) == expected
        assert list(patched.attributes.items()) == list(plain.attributes.items())
        assert patched.random.getstate() == plain.random.getstate()
        if seed % 3 == 0:  # a module set the blood pressure this step: _vitals keeps it
            plain.set_vital_sign("Systolic Blood Pressure", 150.0, "mm[Hg]", time)
            patched.set_vital_sign("Systolic Blood Pressure", 150.0, "mm[Hg]", time)
        module._vitals(plain, time)
        _synthea_run.lifecycle_vitals(module, patched, time)
        assert list(patched.vital_signs.items()) == list(plain.vital_signs.items())
        assert patched.random.getstate() == plain.random.getstate()


def test_biometrics_are_read_once_and_copied(monkeypatch):
    from synthea.world.vitals import Biometrics

    _synthea_run.replacements()
    paths: list[tuple] = []

    def walk(node: object, path: tuple) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        else:
            paths.extend([path, (*path, "missing"), path[:-1]])

    walk(Biometrics.load(), ())
    assert len(paths) > 50
    for path in paths:
        assert _synthea_run.biometrics_range(Biometrics, *path) == Biometrics.range(*path)
        assert _synthea_run.biometrics_values(Biometrics, *path) == Biometrics.values(*path)
    first = _synthea_run.biometrics_range(Biometrics, "cardiovascular", "heart_rate", "normal")
    assert first and first is not _synthea_run.biometrics_range(Biometrics, "cardiovascular", "heart_rate", "normal")
    monkeypatch.setattr(Biometrics, "_data", {"a": {"b": [1, 2]}})  # other data: read anew
    assert _synthea_run.biometrics_range(Biometrics, "a", "b") == [1.0, 2.0]


def test_pruning_copies_the_same_structure_without_nulls():
    from collections import OrderedDict

    from synthea.export.fhir import prune

    class Text(str):
        pass

    node = {"a": None, "b": [1, None, {"c": None, "d": (None, 2)}, [None]], "e": OrderedDict(f=None, g=True),
            "h": Text("x"), "i": 2.5, "j": {"k": [{"l": None}]}, "m": [], "n": {}}
    assert _synthea_run._pruned(node) == prune(node)
    assert json.dumps(_synthea_run._pruned(node)) == json.dumps(prune(node))
    assert type(_synthea_run._pruned(node)["e"]) is type(prune(node)["e"])
    for leaf in (None, 3, "s", (1, None), [None, None]):
        assert _synthea_run._pruned(leaf) == prune(leaf)
    copied = _synthea_run._pruned(node)
    assert copied["j"] is not node["j"] and copied["b"][2] is not node["b"][2]
