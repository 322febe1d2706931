"""The route table: method + path pattern → the handler of one interaction or operation (``ops/``).

A pattern is the path's segments: literals, ``{type}`` (a resource type), ``{id}`` (a valid id) and
``{vid}`` (any segment); the handler gets the request and those values, in order. The first route
whose method, pattern and guard (``when``) fit serves the request. A path that some route takes
with another method is a 405 (:data:`NOT_ALLOWED`); any other path fails at its first unknown segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._core import ServerCore
from ._errors import FhirError, bad_request, not_found
from ._http import ID_RE, Request, Response
from ._search import check_format
from .ops import bundle, create, delete, everything, history, metadata, paging, read, search, update, validate


@dataclass(frozen=True)
class Route:
    methods: str  # "GET", or several as "GET|POST"
    pattern: str
    handler: Callable[..., Response]
    when: Callable[[Request], bool] | None = None


ROUTES = (
    Route("POST", "", bundle.post),
    Route("GET", "", paging.page, when=paging.has_token),
    Route("GET", "", search.system_search),
    Route("GET", "metadata", metadata.metadata),
    Route("GET", "_history", history.system_history),
    Route("GET", "{type}", paging.type_page, when=paging.has_token),
    Route("GET", "{type}", search.type_search),
    Route("POST", "{type}", create.create),
    Route("PUT", "{type}", update.conditional_update),
    Route("DELETE", "{type}", delete.conditional_delete),
    Route("POST", "{type}/_search", search.post_search),
    Route("GET", "{type}/_history", history.type_history),
    Route("POST", "{type}/$validate", validate.validate),
    Route("GET", "{type}/{id}", read.read),
    Route("PUT", "{type}/{id}", update.update),
    Route("DELETE", "{type}/{id}", delete.delete),
    Route("GET", "{type}/{id}/_history", history.history),
    Route("GET", "{type}/{id}/_history/{vid}", read.vread),
    Route("GET|POST", "Patient/{id}/$everything", everything.everything),
    Route("POST", "{type}/{id}/$validate", validate.validate),
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
            if not ID_RE.fullmatch(part):
                return None
        elif seg != "{vid}":
            if seg != part:
                return None
            continue
        values.append(part)
    return values


def dispatch(server: ServerCore, req: Request) -> Response:
    """Serve one request with the first route that takes it (raises FhirError for the others)."""
    method = req.method.upper()
    path = req.path.strip("/")
    parts = path.split("/") if path else []
    for key, value in req.query:
        if key == "_format":
            check_format(value)
    is_type = server.spec.is_resource_type
    for route, pattern in _TABLE.get((method, len(parts)), ()):
        values = _match(pattern, parts, is_type)
        if values is not None and (route.when is None or route.when(req)):
            return route.handler(server, req, *values)
    raise _unrouted(method, path, parts, is_type)


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
    if not ID_RE.fullmatch(second):
        return bad_request(f"Invalid resource id {second!r} (ids are 1-64 of A-Z a-z 0-9 - .)")
    return not_found(f"Unknown path /{path}")
