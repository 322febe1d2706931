"""The wire: requests and responses as the server sees them, and the HTTP-level helpers (ids, ETags,
dates, bodies, operation parameters) every interaction shares.

It imports nothing of the server, so every module can use it without importing the server back.
"""

from __future__ import annotations

import email.utils
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qsl

from ._errors import FhirError, bad_request
from ._json import deeper_than, parse_body
from ._values import END_INSTANT, date_range

#: a resource id (``fullmatch`` only: ``$`` would also accept a trailing newline); see :func:`is_id`
ID_RE = re.compile(r"[A-Za-z0-9\-.]{1,64}")
#: JSON nesting (arrays and objects) a request body may have. FHIR resources need a few dozen levels at
#: most; the validator walks at most 100 objects deep, orjson writes at most 254 levels. A body beyond it is
#: refused before anything else looks at it.
MAX_JSON_DEPTH = 128
#: a version id: ASCII digits (``str.isdigit`` also accepts "²"), at most SQLite's 64-bit integers
VERSION_RE = re.compile(r"[0-9]{1,18}")
FHIR_JSON = "application/fhir+json"


def is_id(value: object) -> bool:
    """Whether ``value`` may name a resource: FHIR's id pattern, less the two ids it allows that a URL
    cannot carry (``Patient/..`` is ``Patient``'s parent to every HTTP client, RFC 3986 dot-segments)."""
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None and value not in (".", "..")


def id_rule(value: object) -> str:
    """Why ``value`` is not an id (see :func:`is_id`), for the refusal's diagnostics."""
    if value in (".", ".."):
        return "'.' and '..' are not ids: a URL cannot carry them"
    return "ids are 1-64 of A-Z a-z 0-9 - ."


@dataclass
class Request:
    method: str
    path: str  # relative to the base URL, no leading slash: "Patient/1/_history/2"
    query: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes | dict | None = None
    #: the caller serialises the response with orjson (the HTTP adapter): stored resources may then be
    #: spliced into it as ``orjson.Fragment`` bytes instead of being parsed and re-serialised
    raw: bool = False
    #: the body as :func:`json_body` parsed and checked it (it is asked more than once: see ``_routes``)
    parsed: dict | None = field(default=None, repr=False, compare=False)


@dataclass
class Response:
    status: int
    body: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)


def format_instant(epoch: float) -> str:
    """FHIR instant with millisecond precision in UTC (``2025-01-01T00:00:00.000Z``)."""
    dt = datetime.fromtimestamp(epoch, UTC)
    return (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}."
            f"{dt.microsecond // 1000:03d}Z")


def http_date(instant: str) -> str:
    """A stored ``lastUpdated`` instant as the HTTP-date a ``Last-Modified`` header carries (RFC 9110)."""
    return email.utils.format_datetime(datetime.fromisoformat(instant.replace("Z", "+00:00")), usegmt=True)


def since(value: str) -> str:
    """A ``_since`` parameter as the stored instant it compares with (``last_updated >= it``)."""
    try:
        lo = date_range(value)[0]
    except ValueError:
        raise bad_request(f"_since must be an instant, got {value!r}", "invalid", ("_since",)) from None
    return format_instant(min(lo, END_INSTANT - 1))  # the end of year 9999 is beyond datetime: its last second


def etag(version: int) -> str:
    return f'W/"{version}"'


def parse_etag(value: object) -> int:
    """The version in an If-Match header or a Bundle entry's ``request.ifMatch`` (any JSON value)."""
    v = value.strip() if isinstance(value, str) else ""
    if v.startswith("W/"):
        v = v[2:]
    v = v.strip('"')
    if not VERSION_RE.fullmatch(v):
        raise bad_request(f"Malformed If-Match/ETag value {value!r} (expected W/\"<version>\")")
    return int(v)


def if_match(req: Request) -> int | None:
    value = req.headers.get("if-match")
    return parse_etag(value) if value else None


def json_body(req: Request, max_bytes: int) -> dict:
    """The request's JSON object (415 for other content types or encodings, 413 beyond ``max_bytes``,
    400 nested beyond :data:`MAX_JSON_DEPTH`); parsed once per request."""
    if req.parsed is not None:
        return req.parsed
    body = req.body
    if isinstance(body, dict):
        try:  # an in-process body must be storable JSON (no 128-bit ints, sets, objects): 400, not a 500
            deep = deeper_than(body, MAX_JSON_DEPTH)
        except TypeError as exc:
            raise bad_request(f"The body is not JSON-serialisable: {exc}", "structure") from None
        if deep:
            raise too_deep(MAX_JSON_DEPTH + 1)
        req.parsed = body
        return body
    if not body:
        raise bad_request("Request body is empty; a FHIR JSON resource is required", "required")
    if len(body) > max_bytes:
        raise FhirError(413, f"Body of {len(body)} bytes exceeds the limit of {max_bytes}", "too-costly")
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in ("application/fhir+json", "application/json", "application/json+fhir"):
        raise FhirError(415, f"Unsupported content type {ctype!r}: only FHIR JSON is accepted", "not-supported")
    check_encoding(req)
    try:
        data, depth = parse_body(body, MAX_JSON_DEPTH)
    except ValueError as exc:
        if "depth limit" in str(exc):  # orjson's own limit (1024), far beyond ours
            raise too_deep(MAX_JSON_DEPTH + 1) from None
        raise bad_request(f"Malformed JSON: {exc}", "structure") from None
    if depth > MAX_JSON_DEPTH:
        raise too_deep(depth)
    if not isinstance(data, dict):
        raise bad_request("The body must be a JSON object (a FHIR resource)", "structure")
    req.parsed = data
    return data


def too_deep(depth: int) -> FhirError:
    more = f"{depth} levels" if depth <= MAX_JSON_DEPTH else f"more than {MAX_JSON_DEPTH} levels"
    return bad_request(f"The body nests arrays and objects {more} deep; the server accepts at most "
                       f"{MAX_JSON_DEPTH}", "too-costly")


def check_encoding(req: Request) -> None:
    """415 for a compressed (or otherwise encoded) body: bodies are read as they come, uncompressed."""
    encoding = req.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise FhirError(415, f"Unsupported Content-Encoding {encoding!r}: send the body uncompressed", "not-supported")


def resource_body(req: Request, rtype: str, max_bytes: int) -> dict:
    """The request's resource, which must be of the type the URL names."""
    data = json_body(req, max_bytes)
    rt = data.get("resourceType")
    if rt is None:
        raise bad_request("Missing 'resourceType' in the body", "required", ("resourceType",))
    if rt != rtype:
        raise bad_request(f"resourceType {rt!r} in the body does not match the URL type {rtype}", "invalid",
                          ("resourceType",))
    return data


def form_body(req: Request) -> list[tuple[str, str]]:
    """The parameters of a ``POST _search`` body (``application/x-www-form-urlencoded``)."""
    body = req.body
    if not body:
        return []
    if isinstance(body, dict):
        raise bad_request("_search expects application/x-www-form-urlencoded parameters")
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise FhirError(415, "POST _search expects application/x-www-form-urlencoded", "not-supported")
    check_encoding(req)
    try:
        return parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise bad_request("Form body is not UTF-8") from None


def operation_params(params: list) -> list[tuple[str, str]]:
    """(name, value) of an operation's Parameters entries with primitive values, as query parameters."""
    out = []
    for n, p in enumerate(params):
        values = [v for k, v in p.items() if k.startswith("value")] if isinstance(p, dict) else []
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or len(values) != 1 \
                or not isinstance(values[0], str | int | float | bool):
            raise bad_request(f"Parameters.parameter[{n}] needs a name and one primitive value[x]", "structure",
                              (f"Parameters.parameter[{n}]",))
        value = values[0]
        out.append((p["name"], str(value).lower() if isinstance(value, bool) else str(value)))
    return out
