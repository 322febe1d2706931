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

from ._http import FHIR_JSON, Request, Response
from ._json import dumps, loads
from ._server import FhirServer
from ._store import Snapshot

Params = Mapping[str, str | Sequence[str]] | Sequence[tuple[str, str]] | None


class TransportError(RuntimeError):
    """The server could not be reached or answered with something that is not HTTP/JSON."""


class _Headers(dict):
    """Response headers of the HTTP backend, looked up case-insensitively (``headers["ETag"]`` works as
    in-process). Keys are stored lower-case."""

    def __init__(self, items: Mapping[str, str]) -> None:
        super().__init__((k.lower(), v) for k, v in items.items())

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)

    def get(self, key: str, default=None):
        return super().get(key.lower(), default)


def _restorable(body: dict) -> dict:
    """A prior version to PUT back: its tags, profiles and security labels kept, server-managed meta dropped."""
    meta = {k: v for k, v in (body.get("meta") or {}).items() if k not in ("versionId", "lastUpdated")}
    return {**{k: v for k, v in body.items() if k != "meta"}, **({"meta": meta} if meta else {})}


def _location_key(location: object) -> tuple[str, str] | None:
    """``(type, id)`` from a Location, absolute or relative (``[base/]Type/id[/_history/v]``)."""
    if not isinstance(location, str) or not location:
        return None
    segs = [s for s in urlsplit(location).path.split("/") if s]
    if len(segs) >= 4 and segs[-2] == "_history":
        segs = segs[:-2]
    return (segs[-2], segs[-1]) if len(segs) >= 2 else None


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

    def search_all(self, rtype: str, params: Params = None, max_pages: int = 100, strict: bool = False) -> list[dict]:
        """Every matching resource (search mode 'match'), following next links.

        ``strict``: a rejected page raises RuntimeError instead of ending the list early, for callers
        that must never take a partial answer for the whole one (task gold).
        """
        resp = self.search(rtype, params)
        out: list[dict] = []
        pages = 0
        while pages < max_pages:
            if resp.status != 200 or not resp.body:
                if strict:
                    raise RuntimeError(f"search {rtype}?{params} failed: {resp.status} {resp.body}")
                break
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
            resp.body = loads(dumps(resp.body))  # never alias the caller's object
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
            content = dumps(body) if isinstance(body, dict) else body
            hdrs.setdefault("Content-Type", FHIR_JSON)
        try:
            r = self._http.request(method.upper(), url, content=content, headers=hdrs)
        except httpx.HTTPError as exc:
            raise TransportError(f"{method} {url} failed: {exc}") from exc
        parsed = None
        if r.content:
            try:
                parsed = loads(r.content)
            except ValueError:
                raise TransportError(f"{method} {url} answered {r.status_code} with non-JSON content") from None
        return Response(r.status_code, parsed, _Headers(r.headers))

    def request(self, method: str, path: str, params: Params = None, body: dict | bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Response:
        method = method.upper()
        path = path.lstrip("/")
        query = _pairs(params)
        if "?" in path:
            path, qs = path.split("?", 1)
            query = parse_qsl(qs, keep_blank_values=True) + query
        touched = self._before(method, path, query, body) if self.track_changes else {}
        resp = self._raw(method, path, query, body, headers)
        if self.track_changes:
            self._track(method, path, resp, touched)
        return resp

    def _before(self, method: str, path: str, query: list[tuple[str, str]], body: dict | bytes | None
                ) -> dict[int | None, list[tuple[str, str]]]:
        """Remember the prior state of what a PUT/DELETE (also one inside a Bundle) may change.

        Returns the newly remembered keys per Bundle entry (None: the request itself), so that the
        priors of a write that failed can be forgotten again.
        """
        if method in ("PUT", "DELETE"):
            return {None: self._remember_prior(path, query)}
        if method != "POST" or path != "":
            return {}
        bundle = body
        if isinstance(body, bytes):
            try:
                bundle = loads(body)
            except ValueError:
                return {}
        if not isinstance(bundle, dict) or not isinstance(bundle.get("entry"), list):
            return {}
        touched: dict[int | None, list[tuple[str, str]]] = {}
        for n, entry in enumerate(bundle["entry"]):
            req = entry.get("request") if isinstance(entry, dict) else None
            if isinstance(req, dict) and str(req.get("method", "")).upper() in ("PUT", "DELETE") and isinstance(
                req.get("url"), str
            ):
                p, _, qs = req["url"].lstrip("/").partition("?")
                touched[n] = self._remember_prior(p, parse_qsl(qs, keep_blank_values=True))
        return touched

    def _remember_prior(self, path: str, query: list[tuple[str, str]]) -> list[tuple[str, str]]:
        parts = path.split("/")
        if len(parts) == 1 and parts[0] and query:  # conditional: what the search matches now
            found = self._raw("GET", parts[0], [(k, v) for k, v in query if k != "_cascade"], None, None)
            current = [e.get("resource") for e in (found.body or {}).get("entry", []) if found.status == 200
                       and e.get("search", {}).get("mode", "match") == "match"]
            priors = {(r["resourceType"], r["id"]): r for r in current if isinstance(r, dict) and "id" in r}
        elif len(parts) == 2:
            priors = {(parts[0], parts[1]): None}
        else:
            return []
        new = []
        for key, known in priors.items():
            if key in self._prior or key in self._created:
                continue
            if known is None:
                cur = self._raw("GET", f"{key[0]}/{key[1]}", [], None, None)
                known = cur.body if cur.status == 200 else None
            self._prior[key] = known
            new.append(key)
        return new

    def _track(self, method: str, path: str, resp: Response, touched: dict[int | None, list[tuple[str, str]]]) -> None:
        unchanged = resp.status >= 400 or (method == "DELETE" and resp.status == 204)  # 204: nothing to delete
        failed: list[tuple[str, str]] = list(touched.get(None, [])) if unchanged else []
        body = resp.body if isinstance(resp.body, dict) else {}
        if method == "POST" and path == "" and body.get("type") in ("transaction-response", "batch-response"):
            for n, entry in enumerate(body.get("entry", [])):
                r = entry.get("response", {}) if isinstance(entry, dict) else {}
                status = str(r.get("status", ""))
                if status.startswith("201"):
                    self._created_at(r.get("location"))
                elif status[:1] != "2":
                    failed.extend(touched.get(n, []))
        elif method == "POST" and path == "" and resp.status >= 400:
            failed.extend(k for keys in touched.values() for k in keys)
        elif resp.status == 201:
            self._created_at(resp.headers.get("location") or resp.headers.get("content-location"))
        for key in failed:  # nothing changed there: never "restore" it over later changes by others
            self._prior.pop(key, None)

    def _created_at(self, location: object) -> None:
        key = _location_key(location)
        if key is not None and key not in self._prior and key not in self._created:
            self._created.append(key)

    def reset(self) -> None:
        """Undo this client's changes: delete what it created, restore what it updated or deleted."""
        # restores first (they drop references to what this client created), then deletes, newest first;
        # referential integrity can still order-constrain them, so what failed is retried while any succeeds
        ops: list[tuple[str, str, str, dict | None]] = [
            ("PUT", t, i, _restorable(body)) for (t, i), body in self._prior.items() if body
        ]
        ops += [("DELETE", t, i, None) for t, i in reversed(self._created)]
        ops += [("DELETE", t, i, None) for (t, i), body in self._prior.items() if not body]
        failed: list[tuple[tuple[str, str, str, dict | None], int]] = []
        while ops:
            failed = []
            for op in ops:
                method, t, i, body = op
                r = self._raw(method, f"{t}/{i}", [], body, None)
                if r.status >= 400 and not (method == "DELETE" and r.status in (404, 410)):
                    failed.append((op, r.status))
            if len(failed) == len(ops):
                break
            ops = [op for op, _ in failed]
        self._created.clear()
        self._prior.clear()
        if failed:
            errors = [f"{m} {t}/{i}: {status}" for (m, t, i, _), status in failed]
            raise TransportError("reset could not undo everything: " + "; ".join(errors))
