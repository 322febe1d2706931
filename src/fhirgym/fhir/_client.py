"""One client interface, two backends: in-process (no HTTP, the sandbox hot path) and HTTP (any R4 server).

Both return the same :class:`Response` (status, parsed JSON body, headers) and never raise for FHIR
errors: a 4xx comes back as a response carrying its OperationOutcome, which is what agent tools and
validators want to see. Transport failures of the HTTP backend raise :class:`TransportError`.

``reset()`` returns the server to where the client found it. In-process that is a store reset to a
snapshot. Against an external server (HAPI, Blaze, ...), where no snapshot exists, the client records
what it changed and undoes it: deletes what it created (newest first) and puts back the prior version
of what it updated or deleted. Changes made by other clients are not undone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import orjson

from ._server import FHIR_JSON, FhirServer, Request, Response
from ._store import Snapshot

Params = Mapping[str, str | Sequence[str]] | Sequence[tuple[str, str]] | None


class TransportError(RuntimeError):
    """The server could not be reached or answered with something that is not HTTP/JSON."""


def _pairs(params: Params) -> list[tuple[str, str]]:
    if params is None:
        return []
    if isinstance(params, Mapping):
        out: list[tuple[str, str]] = []
        for k, v in params.items():
            if isinstance(v, str | int | float):
                out.append((k, str(v)))
            else:
                out.extend((k, str(x)) for x in v)
        return out
    return [(k, str(v)) for k, v in params]


class FhirClient:
    """FHIR interactions over :meth:`request`; subclasses provide the transport and ``reset``."""

    def request(self, method: str, path: str, params: Params = None, body: dict | bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    # -- conveniences ------------------------------------------------------------------------------
    def capabilities(self) -> Response:
        return self.request("GET", "metadata")

    def read(self, rtype: str, rid: str) -> Response:
        return self.request("GET", f"{rtype}/{rid}")

    def vread(self, rtype: str, rid: str, version: str | int) -> Response:
        return self.request("GET", f"{rtype}/{rid}/_history/{version}")

    def history(self, rtype: str | None = None, rid: str | None = None, params: Params = None) -> Response:
        path = "/".join(x for x in (rtype, rid) if x) + ("/_history" if rtype else "_history")
        return self.request("GET", path, params)

    def create(self, resource: dict, if_none_exist: str | None = None) -> Response:
        headers = {"If-None-Exist": if_none_exist} if if_none_exist else None
        return self.request("POST", str(resource.get("resourceType", "")), body=resource, headers=headers)

    def update(self, resource: dict, if_match: str | int | None = None) -> Response:
        headers = {"If-Match": f'W/"{if_match}"'} if if_match is not None else None
        path = f"{resource.get('resourceType', '')}/{resource.get('id', '')}"
        return self.request("PUT", path, body=resource, headers=headers)

    def delete(self, rtype: str, rid: str, cascade: bool = False) -> Response:
        return self.request("DELETE", f"{rtype}/{rid}", {"_cascade": "delete"} if cascade else None)

    def search(self, rtype: str, params: Params = None, lenient: bool = False) -> Response:
        headers = {"Prefer": "handling=lenient"} if lenient else None
        return self.request("GET", rtype, params, headers=headers)

    def search_all(self, rtype: str, params: Params = None, max_pages: int = 100) -> list[dict]:
        """Every matching resource (search mode 'match'), following next links."""
        resp = self.search(rtype, params)
        out: list[dict] = []
        pages = 0
        while resp.status == 200 and resp.body and pages < max_pages:
            pages += 1
            out.extend(
                e["resource"] for e in resp.body.get("entry", []) if e.get("search", {}).get("mode", "match") == "match"
            )
            nxt = next((link["url"] for link in resp.body.get("link", []) if link.get("relation") == "next"), None)
            if not nxt:
                break
            resp = self.follow(nxt)
        return out

    def follow(self, url: str) -> Response:
        """GET an absolute link the server returned (e.g. a paging ``next`` link)."""
        parts = urlsplit(url)
        base_path = urlsplit(self.base_url).path.rstrip("/")
        path = parts.path[len(base_path):] if parts.path.startswith(base_path) else parts.path
        return self.request("GET", path.lstrip("/"), parse_qsl(parts.query, keep_blank_values=True))

    def transaction(self, bundle: dict) -> Response:
        return self.request("POST", "", body=bundle)

    base_url: str = ""


class InProcessClient(FhirClient):
    """Calls :meth:`FhirServer.handle` directly: same code path as HTTP, no socket, no JSON encoding."""

    def __init__(self, server: FhirServer, snapshot: Snapshot | None = None) -> None:
        self.server = server
        self.base_url = server.base
        self.snapshot = snapshot

    def request(self, method: str, path: str, params: Params = None, body: dict | bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        hdrs = {k.lower(): v for k, v in (headers or {}).items()}
        if isinstance(body, bytes):
            hdrs.setdefault("content-type", FHIR_JSON)
        path = path.lstrip("/")
        query = _pairs(params)
        if "?" in path:
            path, qs = path.split("?", 1)
            query = parse_qsl(qs, keep_blank_values=True) + query
        resp = self.server.handle(Request(method.upper(), path, query, hdrs, body))
        if isinstance(body, dict) and resp.body is body:
            resp.body = orjson.loads(orjson.dumps(resp.body))  # never alias the caller's object
        return resp

    def reset(self) -> None:
        self.server.store.reset(self.snapshot)


class HttpClient(FhirClient):
    """Any R4 server over HTTP (ours, HAPI, Blaze, ...), with change tracking for :meth:`reset`."""

    def __init__(self, base_url: str, timeout: float = 30.0, headers: Mapping[str, str] | None = None,
                 track_changes: bool = True) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(timeout=timeout, headers={"Accept": FHIR_JSON, **(headers or {})})
        self.track_changes = track_changes
        self._created: list[tuple[str, str]] = []
        self._prior: dict[tuple[str, str], dict | None] = {}

    def close(self) -> None:
        self._http.close()

    def _raw(self, method: str, path: str, query: list[tuple[str, str]], body: dict | bytes | None,
             headers: Mapping[str, str] | None) -> Response:
        url = f"{self.base_url}/{path.lstrip('/')}" if path else self.base_url
        if query:
            url += ("&" if "?" in url else "?") + urlencode(query)
        hdrs = dict(headers or {})
        content = None
        if body is not None:
            content = orjson.dumps(body) if isinstance(body, dict) else body
            hdrs.setdefault("Content-Type", FHIR_JSON)
        try:
            r = self._http.request(method.upper(), url, content=content, headers=hdrs)
        except httpx.HTTPError as exc:
            raise TransportError(f"{method} {url} failed: {exc}") from exc
        parsed = None
        if r.content:
            try:
                parsed = orjson.loads(r.content)
            except orjson.JSONDecodeError:
                raise TransportError(f"{method} {url} answered {r.status_code} with non-JSON content") from None
        return Response(r.status_code, parsed, dict(r.headers))

    def request(self, method: str, path: str, params: Params = None, body: dict | bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        method = method.upper()
        path = path.lstrip("/")
        query = _pairs(params)
        if self.track_changes and method in ("PUT", "DELETE"):
            self._remember_prior(path)
        resp = self._raw(method, path, query, body, headers)
        if self.track_changes and resp.status in (200, 201):
            self._track(method, path, resp)
        return resp

    def _remember_prior(self, path: str) -> None:
        parts = path.split("?")[0].split("/")
        if len(parts) != 2 or (parts[0], parts[1]) in self._prior or (parts[0], parts[1]) in self._created:
            return
        cur = self._raw("GET", path, [], None, None)
        self._prior[(parts[0], parts[1])] = cur.body if cur.status == 200 else None

    def _track(self, method: str, path: str, resp: Response) -> None:
        if method == "POST" and path == "" and resp.body and resp.body.get("type") == "transaction-response":
            for entry in resp.body.get("entry", []):
                r = entry.get("response", {})
                if str(r.get("status", "")).startswith("201") and r.get("location"):
                    t, i = r["location"].split("/")[:2]
                    if (t, i) not in self._prior:
                        self._created.append((t, i))
            return
        loc = resp.headers.get("location") or resp.headers.get("content-location")
        if resp.status == 201 and loc:
            tail = loc.split(self.base_url + "/", 1)[-1].split("/")
            if len(tail) >= 2 and (tail[0], tail[1]) not in self._prior:
                self._created.append((tail[0], tail[1]))

    def reset(self) -> None:
        """Undo this client's changes: delete what it created, restore what it updated or deleted."""
        errors = []
        for t, i in reversed(self._created):
            r = self._raw("DELETE", f"{t}/{i}", [], None, None)
            if r.status >= 400 and r.status != 404 and r.status != 410:
                errors.append(f"DELETE {t}/{i}: {r.status}")
        for (t, i), body in self._prior.items():
            if body is None:
                self._raw("DELETE", f"{t}/{i}", [], None, None)
            else:
                body = {k: v for k, v in body.items() if k != "meta"}
                r = self._raw("PUT", f"{t}/{i}", [], body, None)
                if r.status >= 400:
                    errors.append(f"PUT {t}/{i}: {r.status}")
        self._created.clear()
        self._prior.clear()
        if errors:
            raise TransportError("reset could not undo everything: " + "; ".join(errors))
