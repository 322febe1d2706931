"""Batch and transaction Bundles.

A transaction is atomic (one SQLite transaction; any failing entry rolls everything back and the
error names the entry), processes entries in the order the specification prescribes (DELETE, POST,
PUT, GET), assigns ids to new resources up front so ``urn:uuid:`` and other fullUrl references
between entries are rewritten, and resolves conditional references (``Patient?identifier=...``).
A batch runs each entry on its own and reports per-entry outcomes.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit

from .. import _write as write
from .._core import ServerCore
from .._errors import FhirError, Issue, bad_request, operation_outcome
from .._http import Request, Response, id_rule, is_id, json_body, parse_etag
from .._json import copy_json
from .._refs import rewrite_references

_ORDER = {"DELETE": 0, "POST": 1, "PUT": 2, "PATCH": 2, "GET": 3, "HEAD": 3}
_STATUS_TEXT = {200: "200 OK", 201: "201 Created", 204: "204 No Content", 404: "404 Not Found", 410: "410 Gone"}
#: ``Bundle.entry.request`` elements that hold a header's value (a non-empty string)
_HEADER_FIELDS = ("ifNoneExist", "ifMatch", "ifNoneMatch", "ifModifiedSince")

log = logging.getLogger("fhirgym.fhir")


def _status(code: int) -> str:
    return _STATUS_TEXT.get(code, str(code))


def _entry_error(n: int, err: FhirError) -> FhirError:
    issues = [
        Issue(i.severity, i.code, f"Bundle.entry[{n}]: {i.diagnostics}",
              tuple(f"Bundle.entry[{n}].resource.{e.split('.', 1)[1]}" if "." in e else f"Bundle.entry[{n}]"
                    for e in i.expression))
        for i in err.issues
    ]
    return FhirError(err.status, issues[0].diagnostics, issues[0].code, issues[0].expression, issues=issues)


def _parse_entries(bundle: dict, base: str, max_entries: int) -> list[tuple[int, dict, str, str, dict | None]]:
    if bundle.get("resourceType") != "Bundle":
        raise bad_request("POST to the base URL expects a Bundle of type batch or transaction", "invalid",
                          ("resourceType",))
    kind = bundle.get("type")
    if kind not in ("batch", "transaction"):
        raise bad_request(f"Bundle.type must be batch or transaction, got {kind!r}", "invalid", ("Bundle.type",))
    entries = bundle.get("entry", [])
    if not isinstance(entries, list):
        raise bad_request("Bundle.entry must be a list", "structure", ("Bundle.entry",))
    if len(entries) > max_entries:
        raise FhirError(413, f"Bundle has {len(entries)} entries; the server's limit is {max_entries} "
                             "(max_bundle_entries): send it in parts", "too-costly")
    out = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise bad_request(f"Bundle.entry[{n}] must be an object", "structure", (f"Bundle.entry[{n}]",))
        request = entry.get("request")
        if not isinstance(request, dict) or not isinstance(request.get("method"), str) or not isinstance(
            request.get("url"), str
        ):
            raise bad_request(f"Bundle.entry[{n}].request needs method and url", "required",
                              (f"Bundle.entry[{n}].request",))
        method = request["method"]
        if method.upper() not in _ORDER or method.upper() == "PATCH":
            raise bad_request(f"Bundle.entry[{n}].request.method {method!r} is not supported", "not-supported",
                              (f"Bundle.entry[{n}].request.method",))
        if method not in _ORDER:  # a code of the required http-verb ValueSet: case matters
            raise bad_request(f"Bundle.entry[{n}].request.method {method!r} must be {method.upper()!r}", "code-invalid",
                              (f"Bundle.entry[{n}].request.method",))
        for key in _HEADER_FIELDS:
            if key in request and not (isinstance(request[key], str) and request[key].strip()):
                raise bad_request(f"Bundle.entry[{n}].request.{key} must be a non-empty string, got {request[key]!r}",
                                  "structure", (f"Bundle.entry[{n}].request.{key}",))
        resource = entry.get("resource") if method in ("POST", "PUT") else None
        if method in ("POST", "PUT") and not isinstance(resource, dict):
            raise bad_request(f"Bundle.entry[{n}] ({method}) needs a resource", "required",
                              (f"Bundle.entry[{n}].resource",))
        url = request["url"]
        if url.startswith(base + "/") or url == base:  # an absolute url on this server: relative to its base
            url = url[len(base):]
        out.append((n, entry, method, url.lstrip("/"), resource))
    _check_full_urls(out)
    return out


def _check_full_urls(entries: list) -> None:
    """bdl-7: a fullUrl names one entry (unless the entries are versions: different meta.versionId).
    In a transaction a repeated fullUrl would silently decide which entry its references point to."""
    seen: dict[tuple, int] = {}
    for n, entry, _method, _url, resource in entries:
        full_url = entry.get("fullUrl")
        if not isinstance(full_url, str) or not full_url:
            continue
        meta = resource.get("meta") if isinstance(resource, dict) else None
        key = (full_url, meta.get("versionId") if isinstance(meta, dict) else None)
        if key in seen:
            raise bad_request(f"Bundle.entry[{n}].fullUrl {full_url!r} repeats that of entry[{seen[key]}] (bdl-7)",
                              "invalid", (f"Bundle.entry[{n}].fullUrl",))
        seen[key] = n


def post(server: ServerCore, req: Request) -> Response:
    """``POST [base]``: a batch or transaction Bundle."""
    return process_bundle(server, json_body(req, server.config.max_body_bytes))


def reads_only(server: ServerCore, req: Request) -> bool:
    """Whether a Bundle only reads (every entry a GET or HEAD): then it need not wait for the writes.
    A body that is no Bundle at all is refused, which writes nothing either."""
    try:
        bundle = json_body(req, server.config.max_body_bytes)
    except FhirError:
        return True
    entries = bundle.get("entry", [])
    return bundle.get("resourceType") == "Bundle" and isinstance(entries, list) and all(
        isinstance(e, dict) and isinstance(e.get("request"), dict) and e["request"].get("method") in ("GET", "HEAD")
        for e in entries)


def process_bundle(server: ServerCore, bundle: dict) -> Response:
    entries = _parse_entries(bundle, server.base, server.config.max_bundle_entries)
    if bundle["type"] == "batch":
        return Response(200, _batch(server, entries))
    # references are rewritten in place: work on copies, never on the caller's (in-process) objects
    entries = [(n, e, m, u, copy_json(r) if r is not None else None) for n, e, m, u, r in entries]
    with server.store.transaction():
        result = _transaction(server, entries)
    return Response(200, result)


def _split_url(url: str) -> tuple[str, list[str], list[tuple[str, str]]]:
    parts = urlsplit(url)
    path = parts.path.strip("/")
    segs = path.split("/") if path else []
    return path, segs, parse_qsl(parts.query, keep_blank_values=True)


def _transaction(server: ServerCore, entries: list) -> dict:
    # 0. deletes first (the prescribed order is DELETE, POST, PUT, GET), so that the conditional creates,
    #    updates and references below see their effect; resources deleted together may reference each other
    #    (their referrers are checked on the final state, at the end: other entries may drop the references)
    responses: dict[int, dict] = {}
    deleted: dict[tuple[str, str], int] = {}  # what this transaction deletes -> its entry
    for n, entry, method, url, _resource in entries:
        if method == "DELETE":
            server.check_time()
            try:
                key = _delete_target(server, url)
                if key in deleted:
                    raise bad_request(f"{key[0]}/{key[1]} is deleted by more than one entry of this transaction",
                                      "invalid")
                if_match = entry["request"].get("ifMatch")
                rec = write.delete(server, *key, parse_etag(if_match) if if_match else None,
                                    check_referrers=False) if key is not None else None
                if key is not None:
                    deleted[key] = n
                responses[n] = {"response": {"status": _status(200 if rec else 204)}}
            except FhirError as err:
                raise _entry_error(n, err) from None
    deleting = set(deleted)

    # 1. decide the identity of every written resource, so references can be rewritten up front
    mapping: dict[str, str] = {}
    plans: dict[int, tuple] = {}
    pending: set[tuple[str, str]] = set()
    for n, entry, method, url, resource in entries:
        server.check_time()
        try:
            _path, segs, query = _split_url(url)
            full_url = entry.get("fullUrl")
            if method == "POST":
                rtype = segs[0] if len(segs) == 1 else None
                if rtype is None or not server.spec.is_resource_type(rtype):
                    raise bad_request(f"POST url must be a resource type, got {url!r}")
                if resource.get("resourceType") != rtype:
                    raise bad_request(f"resourceType {resource.get('resourceType')!r} does not match url {url!r}")
                existing = None
                cond = entry["request"].get("ifNoneExist")
                if cond:
                    matches = write.conditional_match(server, rtype, cond)
                    if len(matches) > 1:
                        raise FhirError(412, f"ifNoneExist matched {len(matches)} resources", "duplicate")
                    existing = matches[0] if matches else None
                rid = existing or server.new_id()
                plans[n] = ("POST", rtype, rid, existing is not None)
                if isinstance(full_url, str) and full_url:
                    mapping[full_url] = f"{rtype}/{rid}"
                pending.add((rtype, rid))
            elif method == "PUT":
                if len(segs) == 2 and not query:
                    rtype, rid = segs
                    if resource.get("id") not in (None, rid):  # absent: the entry's url names it
                        raise bad_request(f"The id in the body ({resource.get('id')!r}) must equal the id in the url "
                                          f"({rid!r})", "invalid", ("id",))
                elif len(segs) == 1 and query:
                    rtype = segs[0]
                    rid = write.conditional_update_target(server, rtype, query, resource)[0] or server.new_id()
                else:
                    raise bad_request(f"PUT url must be Type/id or Type?search, got {url!r}")
                if not server.spec.is_resource_type(rtype):
                    raise FhirError(404, f"Unknown resource type {rtype!r}", "not-found")
                if resource.get("resourceType") != rtype:
                    raise bad_request(f"resourceType {resource.get('resourceType')!r} does not match url {url!r}")
                plans[n] = ("PUT", rtype, rid, False)
                if isinstance(full_url, str) and full_url:
                    mapping[full_url] = f"{rtype}/{rid}"
                pending.add((rtype, rid))
        except FhirError as err:
            raise _entry_error(n, err) from None

    # one transaction must not write (or delete and write) the same resource twice
    written: dict[tuple[str, str], int] = {}
    for n, (_method, rtype, rid, existed) in sorted(plans.items()):
        if existed:
            continue
        if (rtype, rid) in deleting or (rtype, rid) in written:
            raise _entry_error(n, bad_request(f"{rtype}/{rid} is deleted or written by more than one entry of this "
                                              "transaction", "invalid"))
        written[(rtype, rid)] = n

    def resolve(ref: str) -> str | None:
        if ref in mapping:
            return mapping[ref]
        if ref.startswith("urn:uuid:") or ref.startswith("urn:oid:"):
            raise bad_request(f"Reference {ref!r} does not match any fullUrl in this transaction", "not-found")
        resolved = write.resolve_conditional_reference(server, ref)
        if resolved is not None:
            mapping[ref] = resolved
        return resolved

    for n, _entry, _method, _url, resource in entries:
        if resource is not None:
            try:
                rewrite_references(resource, resolve)
            except FhirError as err:
                raise _entry_error(n, err) from None

    # 2. execute the rest in the prescribed order
    for n, entry, method, url, resource in sorted(entries, key=lambda e: (_ORDER[e[2]], e[0])):
        if n in responses:  # a DELETE, done in step 0
            continue
        server.check_time()
        try:
            responses[n] = _execute(server, n, entry, method, url, resource, plans.get(n), pending)
        except FhirError as err:
            raise _entry_error(n, err) from None
    _check_conditional_creates(server, entries, plans)
    if server.config.referential_integrity:  # 3. nothing left may reference what was deleted
        for (rtype, rid), n in deleted.items():
            referrers = [r for r in server.store.referrers(rtype, rid, limit=6) if r not in deleting]
            if referrers:
                names = ", ".join(f"{t}/{i}" for t, i in referrers[:5])
                raise _entry_error(n, FhirError(409, f"Cannot delete {rtype}/{rid}: after this transaction it is still "
                                                     f"referenced by {names}", "conflict"))
    return {
        "resourceType": "Bundle",
        "type": "transaction-response",
        "entry": [responses[n] for n, *_ in entries],
    }


def _check_conditional_creates(server: ServerCore, entries: list, plans: dict[int, tuple]) -> None:
    """Each conditional create (``ifNoneExist``) still matches at most one resource once every entry is
    written: two entries with the same condition (or one whose resource another entry's condition
    selects) would otherwise both create, each having looked before the other was there. Asked only
    of types this transaction writes more than once."""
    writes: dict[str, int] = {}
    for _method, rtype, _rid, existed in plans.values():
        if not existed:
            writes[rtype] = writes.get(rtype, 0) + 1
    for n, entry, method, _url, _resource in entries:
        if method != "POST" or plans[n][3] or writes[plans[n][1]] < 2:
            continue
        cond = entry["request"].get("ifNoneExist")
        if cond and len(matches := write.conditional_match(server, plans[n][1], cond)) > 1:
            raise _entry_error(n, FhirError(400, f"ifNoneExist {cond!r} matches {len(matches)} resources once this "
                                                 "transaction is written: its entries would create duplicates that "
                                                 "the condition is there to prevent", "duplicate"))


def _execute(server: ServerCore, n: int, entry: dict, method: str, url: str, resource: dict | None,
             plan: tuple | None, pending: set) -> dict:
    if method == "POST":
        _, rtype, rid, existed = plan
        if existed:
            return {"response": {"status": _status(200), "location": f"{rtype}/{rid}"}}
        rec = write.create(server, rtype, resource, rid=rid, pending=pending)
        return _written(server, rec, 201)
    if method == "PUT":
        _, rtype, rid, _ = plan
        body = {**resource, "id": rid}
        if_match = entry["request"].get("ifMatch")
        rec, created = write.update(server, rtype, rid, body, parse_etag(if_match) if if_match else None, pending=pending)
        return _written(server, rec, 201 if created else 200)
    # GET / HEAD
    path, _segs, query = _split_url(url)
    resp = server.dispatch(Request("GET", path, query, {}))
    out: dict = {"response": {"status": _status(resp.status)}}
    if resp.body is not None and method == "GET":
        out["resource"] = resp.body
    if "ETag" in resp.headers:
        out["response"]["etag"] = resp.headers["ETag"]
    return out


def _delete_target(server: ServerCore, url: str) -> tuple[str, str] | None:
    """The resource a transaction's DELETE entry names (``Type/id``) or selects (``Type?search``; None
    when nothing matches)."""
    _path, segs, query = _split_url(url)
    if not segs or len(segs) > 2 or (len(segs) == 2) == bool(query):
        raise bad_request(f"DELETE url must be Type/id or Type?search, got {url!r}")
    if not server.spec.is_resource_type(segs[0]):
        raise FhirError(404, f"Unknown resource type {segs[0]!r}", "not-found")
    if len(segs) == 2:
        if not is_id(segs[1]):
            raise bad_request(f"Invalid resource id {segs[1]!r} ({id_rule(segs[1])})", "invalid")
        return segs[0], segs[1]
    match = write.single_match(server, segs[0], query, "delete")
    return (segs[0], match) if match is not None else None


def _written(server: ServerCore, rec, status: int) -> dict:
    return {
        "fullUrl": f"{server.base}/{rec.rtype}/{rec.id}",
        "resource": rec.body,
        "response": {
            "status": _status(status),
            "location": f"{rec.rtype}/{rec.id}/_history/{rec.version}",
            "etag": f'W/"{rec.version}"',
            "lastModified": rec.last_updated,
        },
    }


def _batch(server: ServerCore, entries: list) -> dict:
    out = []
    for n, entry, method, url, resource in entries:
        if server.past_deadline():  # out of time: the rest is answered, not done (what is done stays done)
            err = _entry_error(n, server.timeout_error())
            out.append({"response": {"status": str(err.status), "outcome": err.outcome()}})
            continue
        path, _segs, query = _split_url(url)
        headers = {}
        req_info = entry["request"]
        if req_info.get("ifNoneExist"):
            headers["if-none-exist"] = req_info["ifNoneExist"]
        if req_info.get("ifMatch"):
            headers["if-match"] = req_info["ifMatch"]
        try:
            with server.store.transaction():
                resp = server.dispatch(Request(method, path, query, headers, resource))
        except FhirError as err:
            out.append({"response": {"status": str(err.status), "outcome": _entry_error(n, err).outcome()}})
            continue
        except Exception as exc:  # a bug: the entries done so far stay done, so the batch-response must come back
            if (timeout := server.as_timeout(exc)) is not None:
                out.append({"response": {"status": str(timeout.status), "outcome": _entry_error(n, timeout).outcome()}})
                continue
            log.exception("internal error in Bundle.entry[%d] of a batch", n)
            out.append({"response": {"status": "500", "outcome": operation_outcome(
                [Issue("fatal", "exception", f"Bundle.entry[{n}]: internal error: {exc!r}")])}})
            continue
        response: dict = {"status": _status(resp.status)}
        for header, key in (("Location", "location"), ("ETag", "etag")):
            if header in resp.headers:
                response[key] = resp.headers[header]
        meta = resp.body.get("meta") if resp.body is not None else None
        if "Last-Modified" in resp.headers and isinstance(meta, dict) and "lastUpdated" in meta:
            response["lastModified"] = meta["lastUpdated"]  # an instant here, not the header's HTTP-date
        item: dict = {"response": response}
        if resp.body is not None and resp.body.get("resourceType") != "OperationOutcome":
            item["resource"] = resp.body
        elif resp.body is not None:
            response["outcome"] = resp.body
        out.append(item)
    return {"resourceType": "Bundle", "type": "batch-response", "entry": out}


