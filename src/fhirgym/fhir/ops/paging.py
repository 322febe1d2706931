"""Later pages of a remembered result list (``GET [base]?_getpages=token&_getpagesoffset=n``): a
search's, a history's or ``$everything``'s, each rendered by its own module."""

from __future__ import annotations

from .._core import ServerCore
from .._errors import FhirError, bad_request
from .._http import Request, Response
from .._search import non_negative_int
from .everything import render_everything
from .history import render_history
from .search import render_page


def has_token(req: Request) -> bool:
    """Whether a GET asks for a page (``_getpages``) rather than a new search."""
    return any(k == "_getpages" for k, _ in req.query)


def page(server: ServerCore, req: Request) -> Response:
    q = dict(req.query)
    token = q.get("_getpages", "")
    state = server.pages.get(token)
    if state is None:
        raise FhirError(410, f"Paging token {token!r} is unknown or has expired; repeat the search", "not-found")
    offset = non_negative_int(q.get("_getpagesoffset", "0"), "_getpagesoffset")
    count = non_negative_int(q["_count"], "_count") if "_count" in q else state["count"]
    state = {**state, "count": min(count, server.config.max_count)}
    if "everything" in state:
        return Response(200, render_everything(server, token, state, offset))
    if "history" in state:
        return Response(200, render_history(server, token, state, offset))
    return Response(200, render_page(server, token, state, offset, req.raw))


def type_page(server: ServerCore, req: Request, rtype: str) -> Response:
    """A paging token sent to the type (our links are on the base): that page, not a fresh search."""
    state = server.pages.get(dict(req.query)["_getpages"])
    if state is not None and (state.get("rtype") != rtype or "everything" in state or "history" in state):
        raise bad_request(f"The paging token is not one of a {rtype} search", "invalid", ("_getpages",))
    return page(server, req)
