"""``update`` (``PUT [type]/[id]``, ``If-Match``) and conditional update (``PUT [type]?search``)."""

from __future__ import annotations

from .. import _write as write
from .._core import ServerCore
from .._errors import FhirError
from .._http import Request, Response, if_match, resource_body
from .create import written


def update(server: ServerCore, req: Request, rtype: str, rid: str) -> Response:
    body = resource_body(req, rtype, server.config.max_body_bytes)
    with server.store.transaction():
        rec, created = write.update(server, rtype, rid, body, if_match(req))
    return written(server, rec, 201 if created else 200, req)


def conditional_update(server: ServerCore, req: Request, rtype: str) -> Response:
    if not req.query:
        raise FhirError(405, f"PUT /{rtype} needs an id or search parameters (conditional update)", "not-supported")
    body = resource_body(req, rtype, server.config.max_body_bytes)
    with server.store.transaction():
        rid, matched = write.conditional_update_target(server, rtype, req.query, body)
        if matched:
            rec, created = write.update(server, rtype, rid, {**body, "id": rid}, if_match(req))
        elif rid is not None:
            rec, created = write.update(server, rtype, rid, body)
        else:
            rec, created = write.create(server, rtype, body), True
    return written(server, rec, 201 if created else 200, req)
