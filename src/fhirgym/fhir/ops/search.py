"""``search`` (``GET [type]``, ``POST [type]/_search``): the first page of a searchset Bundle, with
``_include`` / ``_revinclude``, ``_summary`` / ``_elements`` and ignored-parameter outcomes.

Later pages are slices of the remembered result list (:mod:`.paging`), rendered by :func:`render_page`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import orjson

from .._core import ServerCore
from .._errors import Issue, bad_request, operation_outcome
from .._http import Request, Response, form_body
from .._json import loads
from .._paging import count, page_links, remember, self_url, watermark
from .._subset import subset


def type_search(server: ServerCore, req: Request, rtype: str) -> Response:
    return Response(200, search(server, rtype, req.query, lenient(server, req), req.raw))


def post_search(server: ServerCore, req: Request, rtype: str) -> Response:
    return Response(200, search(server, rtype, req.query + form_body(req), lenient(server, req), req.raw))


def system_search(server: ServerCore, req: Request) -> Response:
    raise bad_request("System-level search is not supported; search a resource type", "not-supported")


def lenient(server: ServerCore, req: Request) -> bool:
    """Whether unknown parameters are ignored (``Prefer: handling=``, else the server's default)."""
    prefer = req.headers.get("prefer", "").lower()
    if "handling=strict" in prefer:
        return False
    if "handling=lenient" in prefer:
        return True
    return server.config.lenient_search


def search(server: ServerCore, rtype: str, query: list[tuple[str, str]], lenient: bool = False, raw: bool = False
           ) -> dict:
    """Search and return the searchset Bundle (first page); ``raw``: see :attr:`Request.raw`."""
    state, mark = search_state(server, rtype, query, lenient)
    return render_page(server, remember(server, state, "s", [rtype, query, lenient], mark), state, 0, raw)


def search_state(server: ServerCore, rtype: str, query: list[tuple[str, str]], lenient: bool) -> tuple[dict, str]:
    """A search's result list and what its pages need, with the store's watermark (see :mod:`.._paging`)."""
    engine = server.search_engine
    mark = watermark(server.store)
    sreq = engine.parse(rtype, query, lenient, server.store.sides())
    ids = engine.ids(server.store, sreq)
    state = {
        "rtype": rtype, "ids": ids, "count": count(server, sreq.count), "include": sreq.include,
        "revinclude": sreq.revinclude, "summary": sreq.summary, "elements": sreq.elements, "total": sreq.total,
        "ignored": sreq.ignored, "self": self_url(server, rtype, query),
    }
    return state, mark


def render_page(server: ServerCore, token: str, state: dict, offset: int, raw: bool = False) -> dict:
    """One page of a remembered search: its matches, what they include, and the links."""
    ids: list[str] = state["ids"]
    count: int = state["count"]
    rtype = state["rtype"]
    bundle: dict = {"resourceType": "Bundle", "type": "searchset"}
    bundle["id"] = hashlib.sha256(f"{token}:{offset}".encode()).hexdigest()[:16]
    if state["total"] != "none":
        bundle["total"] = len(ids)
    ignored = _ignored_outcome(state) if state["ignored"] and offset == 0 else []
    if state["summary"] == "count":
        bundle["link"] = page_links(server, token, state, offset, 0)
        if ignored:  # a count that ignored parameters must say so
            bundle["entry"] = ignored
        return bundle
    page_ids = ids[offset : offset + count]
    bundle["link"] = page_links(server, token, state, offset, len(ids))
    entry = _entry_maker(server, state, raw)
    found = server.search_engine.fetch(server.store, rtype, page_ids)
    server.spend(sum(map(len, found.values())))
    matched = [(rtype, i) for i in page_ids if i in found]
    entries = [entry(t, i, found[i], "match") for t, i in matched]
    included, complete = _includes(server, matched, state["include"], state["revinclude"])
    server.spend(sum(len(data) for _t, _i, data in included))
    for t, i, data in included:
        entries.append(entry(t, i, data, "include"))
    entries.extend(ignored)
    if state.get("changed"):
        entries.append({"resource": operation_outcome([Issue(
            "warning", "informational", "The store changed since the first page of this search, and its result "
            "list was no longer kept: this page is of the search run again now, so results may have moved "
            "between pages; repeat the search for a consistent list")]), "search": {"mode": "outcome"}})
    if not complete:
        entries.append({"resource": operation_outcome([Issue(
            "warning", "too-costly", "The _include/_revinclude results of this page are incomplete: at most "
            f"{server.config.max_includes} resources (ServerConfig.max_includes) and 5 rounds of :iterate are "
            "followed; ask for fewer matches per page (_count) or fewer includes")]),
            "search": {"mode": "outcome"}})
    if entries:
        bundle["entry"] = entries
    return bundle


def _ignored_outcome(state: dict) -> list[dict]:
    issues = [Issue("warning", "not-supported", f"Ignored search parameter {msg}") for msg in state["ignored"]]
    return [{"resource": operation_outcome(issues), "search": {"mode": "outcome"}}]


def _entry_maker(server: ServerCore, state: dict, raw: bool) -> Callable[[str, str, bytes, str], dict]:
    """The function turning (type, id, stored JSON, search mode) into a Bundle entry for one page."""
    base = server.base
    summary, elements = state.get("summary"), state.get("elements")
    if summary in (None, "false") and not elements:
        body = orjson.Fragment if raw else loads  # raw: the stored JSON, spliced in as is
    else:
        wanted = frozenset(elements) if elements else None

        def body(data: bytes) -> dict:
            server.check_time()  # subsetting is work like any: a page of 1,000 with long lists
            return subset(server.spec, loads(data), summary, wanted)

    def entry(rtype: str, rid: str, data: bytes, mode: str) -> dict:
        return {"fullUrl": f"{base}/{rtype}/{rid}", "resource": body(data), "search": {"mode": mode}}

    return entry


def by_type(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(type, id) pairs as ids per type, in order: the store and search engine look resources up type by type."""
    out: dict[str, list[str]] = {}
    for t, i in pairs:
        out.setdefault(t, []).append(i)
    return out


def _includes(server: ServerCore, matched: list[tuple[str, str]], include: list, revinclude: list
              ) -> tuple[list[tuple[str, str, bytes]], bool]:
    """(type, id, stored JSON) of the resources ``_include`` / ``_revinclude`` add to a page, and
    whether that is all of them (at most ``max_includes`` are added)."""
    engine, store = server.search_engine, server.store
    room = server.config.max_includes
    seen = set(matched)
    out: list[tuple[str, str, bytes]] = []
    frontier = list(matched)
    rounds = 0
    first = True
    while frontier and (include or revinclude) and rounds < 5:
        rounds += 1
        found: list[tuple[str, str]] = []
        grouped = by_type(frontier)
        for src, code, target, iterate in include:
            if not (first or iterate):
                continue
            for t, ids in grouped.items():
                if src not in ("*", t):
                    continue
                for pair in engine.references_from(store, t, ids, code, target):
                    if pair not in seen:
                        seen.add(pair)
                        found.append(pair)
        for src, code, target, iterate in revinclude:
            if not (first or iterate) or src == "*":
                continue
            targets = [(t, i) for t, i in frontier if target in (None, t)]
            for rid in engine.referencing(store, src, code, targets):
                if (src, rid) not in seen:
                    seen.add((src, rid))
                    found.append((src, rid))
        if len(found) > room:
            return out + _bodies(server, found[:room]), False
        room -= len(found)
        out += _bodies(server, found)
        frontier = found
        first = False
        include = [x for x in include if x[3]]
        revinclude = [x for x in revinclude if x[3]]
    return out, not (frontier and (include or revinclude))  # not complete if :iterate ran out of rounds


def _bodies(server: ServerCore, found: list[tuple[str, str]]) -> list[tuple[str, str, bytes]]:
    """(type, id, stored JSON) of the current resources among ``found``, type by type."""
    out = []
    for t, ids in by_type(found).items():
        if not server.spec.is_resource_type(t):
            continue
        bodies = server.search_engine.fetch(server.store, t, ids)
        for i in ids:
            if i in bodies:
                out.append((t, i, bodies[i]))
    return out
