"""Result lists that span pages: remembered under a token, linked by self / next / previous URLs.

Searches, histories and ``$everything`` remember their whole result list once; a page is then a
slice of it (``GET [base]?_getpages=token&_getpagesoffset=n``, see :mod:`.ops.paging`).
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote, urlencode

import orjson

from ._core import ServerCore
from ._errors import bad_request


def count(server: ServerCore, requested: int | None) -> int:
    """The page size for a requested ``_count`` (the default when absent, at most ``max_count``)."""
    if requested is None:
        return server.config.default_count
    if requested < 0:
        raise bad_request(f"_count must be a non-negative integer, got {requested}")
    return min(requested, server.config.max_count)


def remember(server: ServerCore, state: dict, query: list[tuple[str, str]]) -> str:
    """Keep a result list (least recently used go first); its paging token. The token is a function of the
    request and the server's write generation only (no memory address), so identical runs see identical
    links."""
    key = hashlib.sha256(orjson.dumps([state.get("rtype"), query, server.generation])).hexdigest()[:24]
    server.pages[key] = state
    server.pages.move_to_end(key)
    while len(server.pages) > server.config.page_cache_size:
        server.pages.popitem(last=False)
    return key


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
