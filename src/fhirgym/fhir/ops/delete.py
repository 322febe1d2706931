"""``delete`` (``DELETE [type]/[id]``, ``If-Match``, ``_cascade=delete``) and conditional delete
(``DELETE [type]?search``, one match at most)."""

from __future__ import annotations

from .. import _write as write
from .._core import ServerCore
from .._errors import FhirError, Issue, bad_request, operation_outcome
from .._http import Request, Response, etag, if_match


def delete(server: ServerCore, req: Request, rtype: str, rid: str) -> Response:
    cascade = _cascade(req.query)
    with server.store.transaction():
        rec = write.delete(server, rtype, rid, if_match(req), cascade)
    if rec is None:
        return Response(204)
    return Response(200, operation_outcome([Issue("information", "informational", f"Deleted {rtype}/{rid}")]),
                    {"ETag": etag(rec.version)})


def conditional_delete(server: ServerCore, req: Request, rtype: str) -> Response:
    query = [(k, v) for k, v in req.query if k != "_cascade"]
    cascade = _cascade(req.query)
    if not query:
        raise FhirError(405, f"DELETE /{rtype} needs an id or search parameters (conditional delete)",
                        "not-supported")
    with server.store.transaction():
        match = write.single_match(server, rtype, query, "delete")
        if match is None:
            return Response(204)
        write.delete(server, rtype, match, cascade=cascade)
    return Response(200, operation_outcome([Issue("information", "informational", f"Deleted {rtype}/{match}")]))


def _cascade(query: list[tuple[str, str]]) -> bool:
    """Whether a DELETE asks to delete what references the resource too (``_cascade=delete``, R5's form)."""
    values = [v for k, v in query if k == "_cascade"]
    if any(v != "delete" for v in values):
        raise bad_request(f"_cascade must be 'delete', got {values!r}", "invalid", ("_cascade",))
    return bool(values)
