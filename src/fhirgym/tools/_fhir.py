"""FHIR CRUD tools: the six calls of the published sandbox, over any :class:`~fhirgym.fhir.FhirClient`.

Same names and arguments as FHIR-AgentEval's MCP server so transcripts compare, with
what its users asked for: outputs bounded by the context budget with an explicit note of what was left
out and how to get it (``next_page_url``), unsupported search parameters rejected (the server is strict),
and errors as compact results (HTTP status + OperationOutcome issues with their expressions).
"""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from ..fhir import FhirClient, Response, TransportError, json_default_str, loads_json
from ..spec import load_spec
from ._core import Tool, ToolContext, ToolError

_TYPE = {"type": "string", "description": "FHIR resource type, e.g. Patient, Appointment, Slot"}
_ID = {"type": "string", "description": "logical id of the resource (without the type prefix)"}


#: FHIR's id syntax (R4 §2.24.0.1 "id"): what a resourceId may be, so it can never smuggle in a path or query.
_ID_RE = re.compile(r"[A-Za-z0-9\-.]{1,64}", re.ASCII)
#: A search parameter name with its modifier or chain (``subject:Patient.family``, ``_has:Observation:…``).
_PARAM_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.:]*", re.ASCII)


@functools.cache
def _resource_types() -> frozenset[str]:
    return frozenset(load_spec().resource_types)


def _rtype(args: dict) -> str:
    """The ``resourceType`` argument, which must name an R4 resource type (never a path or a query)."""
    rtype = args["resourceType"]
    if rtype not in _resource_types():
        raise ToolError(f"resourceType {rtype!r} is not an R4 resource type (e.g. Patient, Observation); "
                        "use listResourceTypes")
    return rtype


def _rid(args: dict) -> str:
    rid = args["resourceId"]
    if not _ID_RE.fullmatch(rid):
        raise ToolError(f"resourceId {rid!r} is not a FHIR id (1-64 of A-Z a-z 0-9 - .), without the type prefix")
    return rid


def _client(ctx: ToolContext) -> FhirClient:
    if ctx.client is None:
        raise ToolError("no FHIR server is bound to this tool")
    return ctx.client


def _issues(body: dict | None) -> list[dict]:
    if not isinstance(body, dict) or body.get("resourceType") != "OperationOutcome":
        return []
    out = []
    for issue in body.get("issue", []):
        item = {k: issue[k] for k in ("severity", "code", "diagnostics", "expression") if k in issue}
        out.append(item)
    return out


def _request(ctx: ToolContext, fn, *args, **kwargs) -> Response:
    try:
        resp = fn(*args, **kwargs)
    except TransportError as exc:
        raise ToolError(f"FHIR server unreachable: {exc}") from None
    if resp.status >= 400:
        issues = _issues(resp.body)
        message = next((i.get("diagnostics") for i in issues if i.get("diagnostics")), None)
        raise ToolError(message or f"HTTP {resp.status}", status=resp.status, issues=issues)
    return resp


def _strip(resource: dict) -> dict:
    """Search results without their narrative (``text``): it repeats the data and eats the context."""
    return {k: v for k, v in resource.items() if k != "text"} if "text" in resource else resource


def _size(obj: Any) -> int:
    return len(orjson.dumps(obj, default=json_default_str))


def list_resource_types(ctx: ToolContext, args: dict) -> dict:
    resp = _request(ctx, _client(ctx).capabilities)
    rest = (resp.body or {}).get("rest") or [{}]
    types = sorted(r["type"] for r in rest[0].get("resource", []) if "type" in r)
    return {"resourceTypes": types, "count": len(types)}


def get_resource_by_id(ctx: ToolContext, args: dict) -> dict:
    resp = _request(ctx, _client(ctx).read, _rtype(args), _rid(args))
    return resp.body or {}


def _params(raw: Any) -> list[tuple[str, str]]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise ToolError("params must be an object of search parameter → value (or list of values)")
    out: list[tuple[str, str]] = []
    for key, value in raw.items():
        if not _PARAM_RE.fullmatch(key):
            raise ToolError(f"search parameter name {key!r} is not a parameter name (e.g. 'family', "
                            "'subject:Patient', 'patient.family'); put values in the value, not the name")
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, dict | list) or v is None:
                raise ToolError(f"search parameter {key!r}: values must be strings or numbers, "
                                f"e.g. 'ge2025-06-01' or 'http://loinc.org|4548-4'")
            out.append((key, str(v).lower() if isinstance(v, bool) else str(v)))
    return out


def search_resources(ctx: ToolContext, args: dict) -> dict:
    client = _client(ctx)
    rtype = _rtype(args)
    page_limit = max(1, int(args.get("page_limit") or 5))
    if args.get("page_url"):
        resp = _request(ctx, client.follow, _page_link(client, args["page_url"]))
    else:
        resp = _request(ctx, client.search, rtype, _params(args.get("params")))
    matches: list[dict] = []
    included: list[dict] = []
    pages = 0
    total = (resp.body or {}).get("total")
    while True:
        pages += 1
        for entry in (resp.body or {}).get("entry", []):
            mode = entry.get("search", {}).get("mode", "match")
            if "resource" in entry:
                (matches if mode == "match" else included).append(_strip(entry["resource"]))
        next_url = next((lk["url"] for lk in (resp.body or {}).get("link", []) if lk.get("relation") == "next"), None)
        if not (args.get("all_pages") and next_url and pages < page_limit):
            break
        resp = _request(ctx, client.follow, next_url)
    out: dict[str, Any] = {"resourceType": rtype, "total": total, "returned": len(matches)}
    out["resources"], omitted = _fit(matches, ctx.budget - 600 - (_size(included) if included else 0))
    if included:
        out["included"] = included
    if omitted:
        out["omitted"] = omitted
        start = _offset(args.get("page_url")) or 0
        link = next_url or next((lk["url"] for lk in (resp.body or {}).get("link", [])
                                 if lk.get("relation") in ("previous", "prev")), None)
        resume = _with_offset(link, start + len(out["resources"])) if link and _offset(link) is not None else None
        if resume:
            next_url = resume
        out["note"] = (f"{omitted} matching resources were left out to fit the output budget; "
                       + ("fetch them with next_page_url, or " if resume else "")
                       + "narrow the search (more parameters, _count, _elements)")
    if next_url:
        out["next_page_url"] = next_url
    return out


def _page_link(client: FhirClient, url: str) -> str:
    """A paging link of this server's searches; any other URL (``_history``, an operation) is refused."""
    parts = urlsplit(url)
    base = urlsplit(client.base_url)
    own = parts.path.rstrip("/") == base.path.rstrip("/") and (not parts.netloc or parts.netloc == base.netloc)
    if not own or "_getpages" not in dict(parse_qsl(parts.query)):
        raise ToolError("page_url must be a next_page_url returned by an earlier search")
    return url


def _offset(url: str | None) -> int | None:
    """The ``_getpagesoffset`` of a paging link (HAPI's and ours), None when it has none."""
    if not url:
        return None
    value = dict(parse_qsl(urlsplit(url).query)).get("_getpagesoffset")
    return int(value) if value and value.isdigit() else None


def _with_offset(url: str, offset: int) -> str:
    parts = urlsplit(url)
    query = [(k, str(offset) if k == "_getpagesoffset" else v) for k, v in parse_qsl(parts.query)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _fit(items: list[dict], budget: int) -> tuple[list[dict], int]:
    """The longest prefix of ``items`` whose JSON fits ``budget`` characters, and how many were left out."""
    used = 2
    for n, item in enumerate(items):
        used += _size(item) + 1
        if used > budget:
            return items[:n], len(items) - n
    return items, 0


def _written(resp: Response) -> dict:
    body = resp.body or {}
    meta = body.get("meta", {}) if isinstance(body, dict) else {}
    return {"status": resp.status, "resourceType": body.get("resourceType"), "id": body.get("id"),
            "versionId": meta.get("versionId"), "resource": body}


def _body(args: dict) -> dict:
    body = args["body"]
    if isinstance(body, str):
        try:
            body = loads_json(body)  # decimals as the caller wrote them
        except ValueError as exc:
            raise ToolError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ToolError("body must be a JSON object (a FHIR resource)")
    rtype = _rtype(args)
    if body.setdefault("resourceType", rtype) != rtype:
        raise ToolError(f"body.resourceType {body['resourceType']!r} does not match resourceType {rtype!r}")
    return body


def create_resource(ctx: ToolContext, args: dict) -> dict:
    body = _body(args)
    return _written(_request(ctx, _client(ctx).create, body, args.get("ifNoneExist") or None))


def update_resource(ctx: ToolContext, args: dict) -> dict:
    body = _body(args)
    if body.setdefault("id", _rid(args)) != args["resourceId"]:
        raise ToolError(f"body.id {body['id']!r} does not match resourceId {args['resourceId']!r}")
    version = args.get("ifMatchVersion")
    return _written(_request(ctx, _client(ctx).update, body, str(version) if version not in (None, "") else None))


def delete_resource(ctx: ToolContext, args: dict) -> dict:
    resp = _request(ctx, _client(ctx).delete, _rtype(args), _rid(args))
    return {"status": resp.status, "deleted": f"{args['resourceType']}/{args['resourceId']}"}


LIST_RESOURCE_TYPES = Tool(
    "listResourceTypes", "List the FHIR resource types this server supports.",
    {"type": "object", "properties": {}}, list_resource_types)

GET_RESOURCE_BY_ID = Tool(
    "getResourceById", "Read one FHIR resource by type and id.",
    {"type": "object", "properties": {"resourceType": _TYPE, "resourceId": _ID},
     "required": ["resourceType", "resourceId"]}, get_resource_by_id)

SEARCH_RESOURCES = Tool(
    "searchResources",
    "Search FHIR resources of one type with FHIR search parameters, e.g. resourceType 'Slot', params "
    "{'schedule': 'Schedule/123', 'status': 'free', 'start': ['ge2025-06-09', 'lt2025-06-10'], '_sort': 'start'}. "
    "Values are strings; repeat a parameter with a list (AND); comma-separated values mean OR. Unknown "
    "parameters are rejected. Returns total, the matching resources (narrative text removed) and "
    "next_page_url when there are more pages; set all_pages to follow pages (up to page_limit).",
    {"type": "object", "properties": {
        "resourceType": _TYPE,
        "params": {"type": "object", "description": "search parameter name → value or list of values",
                   "additionalProperties": {"type": ["string", "number", "boolean", "array"]}},
        "all_pages": {"type": "boolean", "description": "follow next links (default false)"},
        "page_limit": {"type": "integer", "description": "max pages when all_pages is true (default 5)"},
        "page_url": {"type": "string", "description": "a next_page_url from an earlier result"},
    }, "required": ["resourceType"]}, search_resources)

CREATE_RESOURCE = Tool(
    "createResource",
    "Create a FHIR resource. body is the resource as a JSON object; ifNoneExist is an optional search "
    "query (e.g. 'identifier=http://x|123') that makes the create conditional.",
    {"type": "object", "properties": {
        "resourceType": _TYPE, "body": {"type": ["object", "string"], "description": "the resource (JSON)"},
        "ifNoneExist": {"type": "string", "description": "conditional-create search query"}},
     "required": ["resourceType", "body"]}, create_resource, writes=True)

UPDATE_RESOURCE = Tool(
    "updateResource",
    "Replace a FHIR resource with body (the complete new version, not a patch: read it first and change "
    "what you need). ifMatchVersion makes the update fail if someone changed it meanwhile.",
    {"type": "object", "properties": {
        "resourceType": _TYPE, "resourceId": _ID, "body": {"type": ["object", "string"], "description": "the full resource (JSON)"},
        "ifMatchVersion": {"type": ["string", "integer"], "description": "expected current versionId"}},
     "required": ["resourceType", "resourceId", "body"]}, update_resource, writes=True)

DELETE_RESOURCE = Tool(
    "deleteResource", "Delete a FHIR resource by type and id.",
    {"type": "object", "properties": {"resourceType": _TYPE, "resourceId": _ID},
     "required": ["resourceType", "resourceId"]}, delete_resource, writes=True)

FHIR_TOOLS: tuple[Tool, ...] = (LIST_RESOURCE_TYPES, GET_RESOURCE_BY_ID, SEARCH_RESOURCES, CREATE_RESOURCE,
                                UPDATE_RESOURCE, DELETE_RESOURCE)
