"""The route table: method + path pattern → the handler of one interaction or operation (``ops/``).

A pattern is the path's segments: literals, ``{type}`` (a resource type), ``{id}`` (a valid id) and
``{vid}`` (any segment); the handler gets the request and those values, in order. The first route
whose method, pattern and guard (``when``) fit serves the request. A path that some route takes
with another method is a 405 (:data:`NOT_ALLOWED`); any other path fails at its first unknown segment.

A route that only reads (``reads``: True, or a test of the request, as for a Bundle of reads) is served
beside the writes, on a reader of the store (see :meth:`FhirServer.handle`), instead of taking the write turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._core import ServerCore
from ._errors import FhirError, bad_request, not_found
from ._http import Request, Response, id_rule, is_id
from ._search import check_format
from .ops import bundle, create, delete, everything, history, metadata, paging, read, search, update, validate


@dataclass(frozen=True)
class Route:
    methods: str  # "GET", or several as "GET|POST"
    pattern: str
    handler: Callable[..., Response]
    when: Callable[[Request], bool] | None = None
    #: whether serving the request writes nothing: a constant, or decided from the request
    reads: bool | Callable[[ServerCore, Request], bool] = False


ROUTES = (
    Route("POST", "", bundle.post, reads=bundle.reads_only),
    Route("GET", "", paging.page, when=paging.has_token, reads=True),
    Route("GET", "", search.system_search, reads=True),
    Route("GET", "metadata", metadata.metadata, reads=True),
    Route("GET", "_history", history.system_history, reads=True),
    Route("GET", "{type}", paging.type_page, when=paging.has_token, reads=True),
    Route("GET", "{type}", search.type_search, reads=True),
    Route("POST", "{type}", create.create),
    Route("PUT", "{type}", update.conditional_update),
    Route("DELETE", "{type}", delete.conditional_delete),
    Route("POST", "{type}/_search", search.post_search, reads=True),
    Route("GET", "{type}/_history", history.type_history, reads=True),
    Route("POST", "{type}/$validate", validate.validate, reads=True),
    Route("GET", "{type}/{id}", read.read, reads=True),
    Route("PUT", "{type}/{id}", update.update),
    Route("DELETE", "{type}/{id}", delete.delete),
    Route("GET", "{type}/{id}/_history", history.history, reads=True),
    Route("GET", "{type}/{id}/_history/{vid}", read.vread, reads=True),
    Route("GET|POST", "Patient/{id}/$everything", everything.everything, reads=True),
    Route("POST", "{type}/{id}/$validate", validate.validate, reads=True),
)

#: the 405 of a path some route takes, asked with another method
NOT_ALLOWED = {
    "": "{method} is not allowed on the base URL",
    "metadata": "metadata supports GET only",
    "{type}": "{method} not allowed on /{type}",
    "{type}/_search": "_search expects POST",
    "{type}/_history": "_history supports GET only",
    "{type}/$validate": "$validate expects POST",
    "{type}/{id}": "{method} not allowed on /{type}/{id}",
}

Pattern = tuple[str, ...]


def _segments(pattern: str) -> Pattern:
    return tuple(pattern.split("/")) if pattern else ()


#: routes by (method, number of segments), in table order
_TABLE: dict[tuple[str, int], list[tuple[Route, Pattern]]] = {}
for _route in ROUTES:
    for _method in _route.methods.split("|"):
        _TABLE.setdefault((_method, len(_segments(_route.pattern))), []).append((_route, _segments(_route.pattern)))
_NOT_ALLOWED = [(_segments(p), message) for p, message in NOT_ALLOWED.items()]


def _match(pattern: Pattern, parts: list[str], is_type: Callable[[str], bool]) -> list[str] | None:
    """The values of the pattern's placeholders in the path, or None when it does not match."""
    values = []
    for seg, part in zip(pattern, parts, strict=True):
        if seg == "{type}":
            if not is_type(part):
                return None
        elif seg == "{id}":
            if not is_id(part):
                return None
        elif seg != "{vid}":
            if seg != part:
                return None
            continue
        values.append(part)
    return values


def _route(server: ServerCore, req: Request) -> tuple[Route, list[str]] | None:
    """The route that serves a request, and the values of its placeholders."""
    path = req.path.strip("/")
    parts = path.split("/") if path else []
    is_type = server.spec.is_resource_type
    for route, pattern in _TABLE.get((req.method.upper(), len(parts)), ()):
        values = _match(pattern, parts, is_type)
        if values is not None and (route.when is None or route.when(req)):
            return route, values
    return None


def dispatch(server: ServerCore, req: Request) -> Response:
    """Serve one request with the first route that takes it (raises FhirError for the others)."""
    for key, value in req.query:
        if key == "_format":
            check_format(value)
    found = _route(server, req)
    if found is None:
        path = req.path.strip("/")
        raise _unrouted(req.method.upper(), path, path.split("/") if path else [], server.spec.is_resource_type)
    route, values = found
    return route.handler(server, req, *values)


def reads_only(server: ServerCore, req: Request) -> bool:
    """Whether serving ``req`` writes nothing (a request no route takes is an error, which writes nothing)."""
    found = _route(server, req)
    if found is None:
        return True
    reads = found[0].reads
    return reads if isinstance(reads, bool) else reads(server, req)


def _unrouted(method: str, path: str, parts: list[str], is_type: Callable[[str], bool]) -> FhirError:
    """The error for a request no route takes: 405 if the path is served for other methods, else the
    first segment that names nothing."""
    for pattern, message in _NOT_ALLOWED:
        if len(pattern) == len(parts) and (values := _match(pattern, parts, is_type)) is not None:
            names = dict(zip([s.strip("{}") for s in pattern if s.startswith("{")], values, strict=True))
            return FhirError(405, message.format(method=method, **names), "not-supported")
    head = parts[0]  # the base URL and a type alone always match above
    if head.startswith("$"):
        return FhirError(404, f"Unknown system operation {head}", "not-supported")
    if not is_type(head):
        return not_found(f"Unknown resource type '{head}'")
    second = parts[1]
    if second.startswith("$"):
        return FhirError(404, f"Unknown operation {second} on {head}", "not-supported")
    if not is_id(second):
        return bad_request(f"Invalid resource id {second!r} ({id_rule(second)})")
    return not_found(f"Unknown path /{path}")
