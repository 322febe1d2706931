"""Later pages of a result list (``GET [base]?_getpages=token&_getpagesoffset=n``): a search's, a
history's or ``$everything``'s, each rendered by its own module. The list is the kept one, or the
token's request run again (see :mod:`.._paging`)."""

from __future__ import annotations

from .._core import ServerCore
from .._errors import FhirError, bad_request
from .._http import Request, Response, is_id
from .._paging import cached, read_token, remember
from .._search import non_negative_int
from .everything import everything_state, render_everything
from .history import history_state, render_history
from .search import render_page, search_state


def has_token(req: Request) -> bool:
    """Whether a GET asks for a page (``_getpages``) rather than a new search."""
    return any(k == "_getpages" for k, _ in req.query)


def page(server: ServerCore, req: Request) -> Response:
    q = dict(req.query)
    token = q.get("_getpages", "")
    offset = non_negative_int(q.get("_getpagesoffset", "0"), "_getpagesoffset")
    state = _state(server, token)
    count = non_negative_int(q["_count"], "_count") if "_count" in q else state["count"]
    state = {**state, "count": min(count, server.config.max_count)}
    if "everything" in state:
        return Response(200, render_everything(server, token, state, offset))
    if "history" in state:
        return Response(200, render_history(server, token, state, offset))
    return Response(200, render_page(server, token, state, offset, req.raw))


def type_page(server: ServerCore, req: Request, rtype: str) -> Response:
    """A paging token sent to the type (our links are on the base): that page, not a fresh search."""
    kind, args, _mark = read_token(dict(req.query)["_getpages"])
    if kind != "s" or not args or args[0] != rtype:
        raise bad_request(f"The paging token is not one of a {rtype} search", "invalid", ("_getpages",))
    return page(server, req)


def _state(server: ServerCore, token: str) -> dict:
    """The token's kept result list, else its request run again (and kept): ``changed`` when the store
    is not as it was for the first page (history re-runs are exact: bounded by their newest entry)."""
    state = cached(server, token)
    if state is not None:
        return state
    kind, args, mark = read_token(token)
    try:
        if kind == "s":
            rtype, query, lenient = args
            state, now = search_state(server, _type(server, rtype), _pairs(query), bool(lenient))
        elif kind == "h":
            path, rtype, rid, query, upto = args
            rtype = None if rtype is None else _type(server, rtype)
            if rid is not None and (rtype is None or not is_id(rid)):
                raise ValueError("not an id")
            state, now = history_state(server, _str(path), rtype, rid, _pairs(query), _opt(upto)), mark
        else:
            pid, pairs, self_query = args
            if not is_id(pid):
                raise ValueError("not an id")
            state, now = everything_state(server, pid, _pairs(pairs), _pairs(self_query))
    except (ValueError, TypeError):  # not the arguments of one of our tokens (a forged one)
        raise FhirError(410, f"Paging token {token!r} is unknown or has expired; repeat the search",
                        "not-found") from None
    if now != mark:
        state["changed"] = True
    remember(server, state, kind, args, mark)
    return state


def _type(server: ServerCore, value: object) -> str:
    """A resource type named in a token: one our own links could carry."""
    if not isinstance(value, str) or not server.spec.is_resource_type(value):
        raise ValueError("not a resource type")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _opt(value: object) -> str | None:
    return None if value is None else _str(value)


def _pairs(value: object) -> list[tuple[str, str]]:
    if not isinstance(value, list):
        raise TypeError("not a list")
    out = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise TypeError("not a pair")
        out.append((_str(pair[0]), _str(pair[1])))
    return out
