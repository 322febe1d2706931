"""Result lists that span pages: stateless paging tokens, a cache of result lists, self / next / previous URLs.

A paging link (``GET [base]?_getpages=token&_getpagesoffset=n``, see :mod:`.ops.paging`) carries its whole request in
the token: the kind (search, history, ``$everything``), its parameters and the store's *watermark* when the first page
was made. A page is a slice of the result list, taken from the cache while the list is there (the most recently used
lists, up to ``ServerConfig.page_cache_ids`` ids in all; lists that fit in one page are not kept), else from the request
run again, so a link never expires because of other clients' traffic; tokens are a function of the request and the
stored state only, so identical runs see identical links. What a re-run gives: docs/SERVER.md, "Paging links that last".
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import quote, urlencode

import orjson

from ._core import ServerCore
from ._errors import FhirError, bad_request
from ._store import Store

#: a token longer than this is not one of ours (URLs of more than a few dozen kilobytes are refused anyway)
_MAX_TOKEN = 65_536


def count(server: ServerCore, requested: int | None) -> int:
    """The page size for a requested ``_count`` (the default when absent, at most ``max_count``)."""
    if requested is None:
        return server.config.default_count
    if requested < 0:
        raise bad_request(f"_count must be a non-negative integer, got {requested}")
    return min(requested, server.config.max_count)


def watermark(store: Store) -> str:
    """What the store's state is, as far as paging needs to know: every write adds a row (a new resource
    row, or the old version moved into history), so the highest rowids move with every write."""
    row = store.query("SELECT (SELECT max(rowid) FROM main.resources), (SELECT max(rowid) FROM main.history)")[0]
    return f"{row[0] or 0}.{row[1] or 0}"


def make_token(kind: str, args: list, mark: str) -> str:
    """The paging token of a request (``kind``: ``s`` search, ``h`` history, ``e`` ``$everything``):
    base64url of its JSON, not compressed (zlib cost 80 µs a search, a fifth of a small one)."""
    return base64.urlsafe_b64encode(orjson.dumps([kind, args, mark])).decode().rstrip("=")


def read_token(token: str) -> tuple[str, list, str]:
    """(kind, args, watermark) of a token; 410 for anything that is not a token of this server."""
    try:
        if len(token) > _MAX_TOKEN:
            raise ValueError("too long")
        kind, args, mark = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if kind not in ("s", "h", "e") or not isinstance(args, list) or not isinstance(mark, str):
            raise ValueError("not a paging token")
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise FhirError(410, f"Paging token {token!r} is unknown or has expired; repeat the search",
                        "not-found") from None
    return kind, args, mark


def remember(server: ServerCore, state: dict, kind: str, args: list, mark: str) -> str:
    """The paging token of a result list, which is kept (least recently used go first) when it spans pages."""
    token = make_token(kind, args, mark)
    size = _size(state)
    if 0 < state["count"] < size:
        with server.pages_lock:
            pages = server.pages
            if token in pages:
                server.pages_held -= _size(pages[token])
            pages[token] = state
            pages.move_to_end(token)
            server.pages_held += size
            while server.pages_held > server.config.page_cache_ids and len(pages) > 1:
                server.pages_held -= _size(pages.popitem(last=False)[1])
    return token


def cached(server: ServerCore, token: str) -> dict | None:
    """The kept result list of a token, if it is still kept."""
    with server.pages_lock:
        state = server.pages.get(token)
        if state is not None:
            server.pages.move_to_end(token)
        return state


def _size(state: dict) -> int:
    return len(state.get("ids") or state.get("history") or state.get("everything") or ())


def self_url(server: ServerCore, path: str, query: list[tuple[str, str]]) -> str:
    """The self link of the first page of a result list: the request as it was made."""
    return f"{server.base}/{path}" + (f"?{urlencode(query)}" if query else "")


def page_url(server: ServerCore, token: str, offset: int, count: int) -> str:
    return f"{server.base}?_getpages={quote(token)}&_getpagesoffset={offset}&_count={count}"


def page_links(server: ServerCore, token: str, state: dict, offset: int, total: int) -> list[dict]:
    """self / next / previous links of one page of a remembered result list."""
    count = state["count"]
    links = [{"relation": "self", "url": state["self"] if offset == 0 else page_url(server, token, offset, count)}]
    if count > 0 and offset + count < total:
        links.append({"relation": "next", "url": page_url(server, token, offset + count, count)})
    if count > 0 and offset > 0:
        links.append({"relation": "previous", "url": page_url(server, token, max(0, offset - count), count)})
    return links
