"""``history`` at instance, type and system level (``[type]/[id]/_history``, ``[type]/_history``,
``_history``), with ``_since`` and ``_count``: newest first, deletions as entries without a resource."""

from __future__ import annotations

from .._core import ServerCore
from .._errors import bad_request, not_found
from .._http import Request, Response, etag, since
from .._json import loads
from .._paging import count, page_links, remember, self_url
from .._search import non_negative_int
from .._store import history_sql


def system_history(server: ServerCore, req: Request) -> Response:
    return history(server, req, None, None)


def type_history(server: ServerCore, req: Request, rtype: str) -> Response:
    return history(server, req, rtype, None)


def history(server: ServerCore, req: Request, rtype: str | None, rid: str | None) -> Response:
    state = history_state(server, req.path, rtype, rid, req.query, None)
    rows = state["history"]
    upto = rows[0][3] if rows else None  # the newest entry: a re-run up to it lists the same versions
    token = remember(server, state, "h", [req.path, rtype, rid, req.query, upto], "")
    return Response(200, render_history(server, token, state, 0))


def history_state(server: ServerCore, path: str, rtype: str | None, rid: str | None, query: list[tuple[str, str]],
                  upto: str | None) -> dict:
    """A history's versions, newest first (``upto``: only those stored at or before that instant)."""
    q = dict(query)
    conds, args = [], []
    if rtype:
        conds.append("rtype=?")
        args.append(rtype)
    if rid:
        if server.store.current(rtype or "", rid) is None:
            raise not_found(f"{rtype}/{rid} is not known")
        conds.append("id=?")
        args.append(rid)
    if "_since" in q:
        conds.append("last_updated >= ?")
        args.append(since(q["_since"]))
    if upto is not None:
        conds.append("last_updated <= ?")
        args.append(upto)
    unknown = set(q) - {"_since", "_count", "_format", "_pretty"}
    if unknown:
        raise bad_request(f"Unsupported _history parameter(s): {', '.join(sorted(unknown))}", "not-supported")
    where = " AND ".join(conds) or "1"
    rows = server.store.query(
        f"SELECT rtype, id, version, last_updated, method FROM ({history_sql(where)}) "
        "ORDER BY last_updated DESC, version DESC",
        args * 4,
    )
    size = count(server, non_negative_int(q["_count"], "_count") if "_count" in q else None)
    return {"history": rows, "count": size, "self": self_url(server, path, query)}


def render_history(server: ServerCore, token: str, state: dict, offset: int) -> dict:
    rows = state["history"]
    size = state["count"]
    entries = []
    for t, i, version, lu, method in rows[offset : offset + size]:
        found = server.store.version(t, i, version)
        data = found[2] if found else None
        server.spend(len(data) if data else 0)
        entry: dict = {"fullUrl": f"{server.base}/{t}/{i}"}
        if data is not None:
            entry["resource"] = loads(data)
        entry["request"] = {"method": method, "url": f"{t}/{i}" if method != "POST" else t}
        status = "204" if data is None else "201" if version == 1 or _recreated(server, t, i, version) else "200"
        entry["response"] = {"status": status, "etag": etag(version), "lastModified": lu}
        entries.append(entry)
    links = page_links(server, token, state, offset, len(rows))
    bundle = {"resourceType": "Bundle", "type": "history", "total": len(rows), "link": links}
    if entries:
        bundle["entry"] = entries
    return bundle


def _recreated(server: ServerCore, rtype: str, rid: str, version: int) -> bool:
    """Whether this version brought a deleted resource back (a create, as its response said: 201)."""
    before = server.store.version(rtype, rid, version - 1)
    return before is not None and before[2] is None
