"""Exact decimals (issue 23, requirement 1): a decimal keeps its lexical form end to end, and search
compares decimals as numbers with FHIR's implicit precision ranges."""

from __future__ import annotations

import copy
import pickle

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _live_server import LiveServer
from conftest import new_client
from fhirgym.fhir import FhirDecimal, dumps_json, loads_json

#: R4's decimal (datatypes: ``-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?``), exponents bounded so that
#: the value stays within a double's range (beyond it the server answers 400, see test below).
DECIMAL = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,2})?", fullmatch=True)


def _obs(text: str, low: str | None = None) -> bytes:
    return (b'{"resourceType":"Observation","status":"final","code":{"text":"t"},'
            b'"valueQuantity":{"value":' + text.encode() + b',"unit":"mg"},'
            b'"referenceRange":[{"low":{"value":' + (low or text).encode() + b'}}]}')


def _value_texts(body: dict) -> list[str]:
    """The decimals of an Observation from :func:`_obs` as JSON text, as a client serialising it sees them."""
    return [dumps_json(body["valueQuantity"]["value"]).decode(),
            dumps_json(body["referenceRange"][0]["low"]["value"]).decode()]


def _raw_texts(data: bytes, text: str) -> int:
    """How many times ``"value":<text>`` followed by a delimiter occurs in raw JSON bytes."""
    needle = b'"value":' + text.encode()
    return sum(data[i + len(needle): i + len(needle) + 1] in (b",", b"}") for i in _find_all(data, needle))


def _find_all(data: bytes, needle: bytes) -> list[int]:
    out, i = [], data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=DECIMAL, low=DECIMAL | st.sampled_from(["1.5", "1e+16", "1e16", "0.1", "3"]))
def test_any_decimal_comes_back_identical_in_process(text, low):
    client = new_client()
    created = client.request("POST", "Observation", body=_obs(text, low))
    assert created.status == 201, created.body
    rid = created.body["id"]
    want = [text, low]
    assert _value_texts(created.body) == want
    assert _value_texts(client.read("Observation", rid).body) == want
    assert _value_texts(client.vread("Observation", rid, 1).body) == want
    hit = client.search("Observation", {"_id": rid}).body["entry"][0]["resource"]
    assert _value_texts(hit) == want
    hist = client.history("Observation", rid).body["entry"][0]["resource"]
    assert _value_texts(hist) == want
    # an in-process dict body carrying the decimals as read (FhirDecimals) keeps them through an update
    body = client.read("Observation", rid).body
    assert client.update(body).status == 200
    assert _value_texts(client.read("Observation", rid).body) == want


@pytest.fixture(scope="module")
def live():
    with LiveServer() as srv:
        yield srv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=DECIMAL)
def test_any_decimal_comes_back_identical_over_http(live, text):
    with httpx.Client(base_url=live.base_url, headers={"Content-Type": "application/fhir+json"}) as http:
        patient = http.post("/Patient", content=b'{"resourceType":"Patient"}').json()["id"]
        body = _obs(text).replace(b'"status"', b'"subject":{"reference":"Patient/' + patient.encode() + b'"},"status"')
        created = http.post("/Observation", content=body)
        assert created.status_code == 201, created.text
        rid = created.json()["id"]
        for path in (f"/Observation/{rid}", f"/Observation/{rid}/_history/1", f"/Observation?_id={rid}",
                     f"/Observation/{rid}/_history", f"/Patient/{patient}/$everything"):
            assert _raw_texts(http.get(path).content, text) == 2, path
        tx = {"resourceType": "Bundle", "type": "transaction", "entry": [{
            "resource": loads_json(body), "request": {"method": "POST", "url": "Observation"}}]}
        answer = http.post("/", content=dumps_json(tx), headers={"Prefer": "return=representation"})
        assert answer.status_code == 200, answer.text
        assert _raw_texts(answer.content, text) == 2


def test_lexical_forms_the_issue_named():
    client = new_client()
    for text in ("1.50", "0.010", "1.1111111111111111111", "12345678901234567890.5", "-0", "1E5", "1e-400",
                 "1e+16", "1e16", "1e-07", "1e-7", "1.5e+300", "100.0", "-0.0"):
        rid = client.request("POST", "Observation", body=_obs(text)).body["id"]
        assert _value_texts(client.read("Observation", rid).body) == [text, text]


def test_a_decimal_reads_as_a_float_that_remembers_its_text():
    v = loads_json(b'{"v": 1.50}')["v"]
    assert type(v) is FhirDecimal and v == 1.5 and v * 2 == 3.0 and str(v) == "1.50"
    assert copy.deepcopy(v).text == pickle.loads(pickle.dumps(v)).text == "1.50"
    plain = loads_json(b'{"v": 1.5, "i": 3}')
    assert type(plain["v"]) is float and type(plain["i"]) is int  # canonical numbers stay plain


def test_search_compares_decimals_as_numbers_with_their_precision():
    client = new_client()
    ids = {t: client.request("POST", "Observation", body=_obs(t)).body["id"] for t in ("0.010", "0.01", "100", "1.5E2")}

    def found(q: str) -> set[str]:
        resp = client.search("Observation", {"value-quantity": q})
        assert resp.status == 200, resp.body
        return {e["resource"]["id"] for e in resp.body.get("entry", [])}

    # numbers, not strings: the stored value inside the search value's precision range
    assert found("0.01") == {ids["0.010"], ids["0.01"]}  # [0.005, 0.015)
    assert found("0.0100") == {ids["0.010"], ids["0.01"]}  # [0.00995, 0.01005)
    assert found("0.0101") == set()  # [0.01005, 0.01015)
    assert found("1e2") == {ids["100"]}  # [50, 150): 1.5E2 is its exclusive end
    assert found("15e1") == {ids["1.5E2"]}
    assert found("gt0.0100") == {ids["100"], ids["1.5E2"]}
    assert found("lt1") == {ids["0.010"], ids["0.01"]}


def test_a_decimal_beyond_a_double_is_a_clear_400():
    client = new_client()
    resp = client.request("POST", "Observation", body=_obs("1e400"))
    assert resp.status == 400
    assert "infinity" in resp.body["issue"][0]["diagnostics"]
