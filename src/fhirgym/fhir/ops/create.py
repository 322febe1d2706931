"""``create`` (``POST [type]``), conditional with ``If-None-Exist``; :func:`written` renders any
single write's response (``Prefer: return=``)."""

from __future__ import annotations

from .. import _write as write
from .._core import ServerCore
from .._errors import FhirError, Issue, operation_outcome
from .._http import Request, Response, etag, http_date, resource_body
from .._store import Record
from .read import current


def create(server: ServerCore, req: Request, rtype: str) -> Response:
    body = resource_body(req, rtype, server.config.max_body_bytes)
    cond = req.headers.get("if-none-exist")
    with server.store.transaction():
        if cond:
            existing = write.conditional_match(server, rtype, cond)
            if len(existing) > 1:
                raise FhirError(412, f"If-None-Exist matched {len(existing)} resources", "duplicate")
            if existing:  # nothing created: 200 with what is there, in the form Prefer asks for
                found = current(server, rtype, existing[0])
                prefer = req.headers.get("prefer", "").lower()
                if "return=minimal" in prefer:
                    found.body = None
                elif "return=operationoutcome" in prefer:
                    found.body = operation_outcome([Issue("information", "informational", f"If-None-Exist matched "
                                                          f"{rtype}/{existing[0]}: nothing was created")])
                return found
        rec = write.create(server, rtype, body)
    return written(server, rec, 201, req)


def written(server: ServerCore, record: Record, status: int, req: Request | None) -> Response:
    """The response to a create or update: the resource, nothing, or an OperationOutcome (``Prefer``)."""
    headers = {
        "ETag": etag(record.version),
        "Last-Modified": http_date(record.last_updated),
        "Location": f"{server.base}/{record.rtype}/{record.id}/_history/{record.version}",
    }
    prefer = (req.headers.get("prefer", "") if req else "").lower()
    if "return=minimal" in prefer:
        return Response(status, None, headers)
    if "return=operationoutcome" in prefer:
        return Response(status, operation_outcome([Issue("information", "informational", "OK")]), headers)
    return Response(status, record.body, headers)
