"""``read`` and ``vread`` (``GET [type]/[id]``, ``GET [type]/[id]/_history/[vid]``), with conditional
reads (304) and ``_summary`` / ``_elements``."""

from __future__ import annotations

import email.utils

from .._core import ServerCore
from .._errors import FhirError, bad_request, not_found
from .._http import VERSION_RE, Request, Response, etag, http_date
from .._json import loads
from .._subset import shaped


def read(server: ServerCore, req: Request, rtype: str, rid: str) -> Response:
    return not_modified(req, shaped(server.spec, req, current(server, rtype, rid)))


def vread(server: ServerCore, req: Request, rtype: str, rid: str, vid: str) -> Response:
    if not vid.isascii() or not vid.isdigit():
        raise bad_request(f"Version id must be a positive integer, got {vid!r}")
    row = server.store.version(rtype, rid, int(vid)) if VERSION_RE.fullmatch(vid) else None
    if row is None:
        if server.store.current(rtype, rid) is None:
            raise not_found(f"{rtype}/{rid} is not known")
        raise not_found(f"{rtype}/{rid} has no version {vid}")
    last_updated, _method, data = row
    if data is None:
        raise FhirError(410, f"Version {vid} of {rtype}/{rid} is a deletion", "deleted")
    server.spend(len(data))
    resp = Response(200, loads(data), {"ETag": etag(int(vid)), "Last-Modified": http_date(last_updated)})
    return shaped(server.spec, req, resp)


def current(server: ServerCore, rtype: str, rid: str) -> Response:
    """The current version of a resource (404 unknown, 410 deleted): what a read answers before shaping,
    counted against the request's response budget (a batch of reads of a large Binary adds up)."""
    cur = server.store.current(rtype, rid)
    if cur is None:
        raise not_found(f"{rtype}/{rid} is not known")
    version, last_updated, deleted, data = cur
    if deleted:
        raise FhirError(410, f"{rtype}/{rid} was deleted (version {version})", "deleted",
                        headers={"ETag": etag(version)})
    server.spend(len(data))
    return Response(200, loads(data), {"ETag": etag(version), "Last-Modified": http_date(last_updated)})


def not_modified(req: Request, resp: Response) -> Response:
    """Conditional read: 304 when the client's copy is current (``If-None-Match`` takes precedence over
    ``If-Modified-Since``, whose unparseable dates are ignored, as HTTP says)."""
    tag, modified = resp.headers["ETag"], resp.headers["Last-Modified"]
    tags = req.headers.get("if-none-match")
    if tags is not None:
        now = tag.removeprefix("W/")
        fresh = any(t.strip() == "*" or t.strip().removeprefix("W/") == now for t in tags.split(","))
    else:
        try:
            since = email.utils.parsedate_to_datetime(req.headers.get("if-modified-since", ""))
            fresh = since.tzinfo is not None and email.utils.parsedate_to_datetime(modified) <= since
        except (TypeError, ValueError):
            fresh = False
    return Response(304, None, {"ETag": tag, "Last-Modified": modified}) if fresh else resp
