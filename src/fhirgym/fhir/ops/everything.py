"""``Patient/[id]/$everything`` (GET, or POST with Parameters): the patient, its compartment and what
those reference, with ``_type``, ``_since`` and ``_count``; later pages come through :mod:`.paging`."""

from __future__ import annotations

from .._core import ServerCore
from .._errors import bad_request
from .._http import Request, Response, json_body, operation_params, since
from .._json import loads
from .._paging import count, page_url, remember, self_url, watermark
from .._search import non_negative_int
from .read import current
from .search import by_type


def everything(server: ServerCore, req: Request, pid: str) -> Response:
    current(server, "Patient", pid)  # 404 / 410 as for a read
    pairs = list(req.query)
    if req.body:  # POST: a Parameters body means the same as the query parameters
        body = json_body(req, server.config.max_body_bytes)
        if body.get("resourceType") != "Parameters":
            raise bad_request("POST $everything takes a Parameters body", "invalid", ("resourceType",))
        params = body.get("parameter", [])
        pairs += operation_params(params if isinstance(params, list) else [params])
    state, mark = everything_state(server, pid, pairs, req.query)
    token = remember(server, state, "e", [pid, pairs, req.query], mark)
    return Response(200, render_everything(server, token, state, 0))


def everything_state(server: ServerCore, pid: str, pairs: list[tuple[str, str]], self_query: list[tuple[str, str]]
                     ) -> tuple[dict, str]:
    """The resources of a patient's ``$everything`` (``pairs``: its parameters), with the store's watermark."""
    spec, engine, store = server.spec, server.search_engine, server.store
    mark = watermark(store)
    current(server, "Patient", pid)
    q = dict(pairs)
    unknown = set(q) - {"_count", "_type", "_since", "_format", "_pretty"}
    if unknown:
        raise bad_request(f"Unsupported $everything parameter(s): {', '.join(sorted(unknown))}", "not-supported")
    since_ts = since(q["_since"]) if "_since" in q else None
    types = None
    if "_type" in q:  # repeated or comma-separated: either type
        types = {t.strip() for k, v in pairs if k == "_type" for t in v.split(",")}
        bad = sorted(t for t in types if not spec.is_resource_type(t))
        if bad:
            raise bad_request(f"$everything _type: not resource types: {bad}", "invalid", ("_type",))
    found: list[tuple[str, str]] = [("Patient", pid)]
    for t, codes in sorted(spec.patient_compartment.items()):
        if t == "Patient" or (types is not None and t not in types) or not spec.is_resource_type(t):
            continue
        ids: set[str] = set()
        for code in codes:
            if code not in spec.search_params(t) or (t, code) in server.extractor.unsupported:
                continue
            ids.update(engine.referencing(store, t, code, [("Patient", pid)]))
        found.extend((t, i) for i in sorted(ids))
    seen = set(found)
    referenced: list[tuple[str, str]] = []
    for t, ids in by_type(found).items():
        for pair in engine.references_from(store, t, ids, "*", None):
            if pair not in seen and (types is None or pair[0] in types):
                seen.add(pair)
                referenced.append(pair)
    state = {
        "rtype": "Patient", "ids": [], "count": 0, "include": [], "revinclude": [], "summary": None,
        "elements": None, "total": "accurate", "ignored": [],
        "self": self_url(server, f"Patient/{pid}/$everything", self_query),
    }
    all_refs = found + referenced
    if since_ts is not None:  # only what changed since then (the patient too), in the same order
        recent = {(t, i) for t, ids in by_type(all_refs).items()
                  for i in engine.updated_since(store, t, ids, since_ts)}
        all_refs = [pair for pair in all_refs if pair in recent]
    size = count(server, non_negative_int(q["_count"], "_count") if "_count" in q else None)
    state["everything"] = all_refs
    state["count"] = size
    return state, mark


def render_everything(server: ServerCore, token: str, state: dict, offset: int) -> dict:
    refs = state["everything"]
    size = state["count"]
    page = refs[offset : offset + size]
    entries = []
    bodies = {t: server.search_engine.fetch(server.store, t, ids) for t, ids in by_type(page).items()}
    server.spend(sum(len(data) for found in bodies.values() for data in found.values()))
    for t, i in page:
        data = bodies[t].get(i)
        if data is not None:
            entries.append({"fullUrl": f"{server.base}/{t}/{i}", "resource": loads(data),
                            "search": {"mode": "match"}})
    if state.get("changed"):
        entries.append({"resource": {"resourceType": "OperationOutcome", "issue": [{
            "severity": "warning", "code": "informational", "diagnostics": "The store changed since the first page, "
            "and the list was no longer kept: this page is of $everything run again now"}]},
            "search": {"mode": "outcome"}})
    links = [{"relation": "self", "url": state["self"]}]
    if size > 0 and offset + size < len(refs):
        links.append({"relation": "next", "url": page_url(server, token, offset + size, size)})
    bundle = {"resourceType": "Bundle", "type": "searchset", "total": len(refs), "link": links}
    if entries:
        bundle["entry"] = entries
    return bundle
