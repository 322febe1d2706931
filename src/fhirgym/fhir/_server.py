"""The FHIR R4 REST semantics, independent of HTTP: ``FhirServer.handle(Request) -> Response``.

The ASGI app and the in-process client both call :meth:`FhirServer.handle`, so a request takes the
same code path whether or not it crossed a socket. Every failure becomes an OperationOutcome with a
precise 4xx status (one error path, see :mod:`._errors`); a 5xx means a bug in fhirgym.
"""

from __future__ import annotations

import copy
import email.utils
import hashlib
import logging
import random
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote, urlencode

import orjson

from ..spec import Spec, load_spec
from ._errors import FhirError, Issue, bad_request, invalid_resource, not_found, operation_outcome
from ._refs import iter_references, reference_strings, reference_strings_json, rewrite_references
from ._search import SearchEngine, check_format, element_names, non_negative_int, summary_mode
from ._store import Record, Store, history_sql
from ._values import END_INSTANT, date_range, split_reference

log = logging.getLogger("fhirgym.fhir")

#: a resource id (``fullmatch`` only: ``$`` would also accept a trailing newline)
ID_RE = re.compile(r"[A-Za-z0-9\-.]{1,64}")
#: a version id: ASCII digits (``str.isdigit`` also accepts "²"), at most SQLite's 64-bit integers
_VERSION_RE = re.compile(r"[0-9]{1,18}")
FHIR_JSON = "application/fhir+json"
_SUBSETTED = {"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED"}


@dataclass
class ServerConfig:
    """Behaviour switches of the embedded server (defaults match a strict, careful R4 server)."""

    base_url: str = "http://localhost:8080/fhir"
    validate: bool = True
    referential_integrity: bool = True
    max_body_bytes: int = 16 * 1024 * 1024
    default_count: int = 50
    max_count: int = 1000
    lenient_search: bool = False  # default handling of unknown search params (Prefer: handling=...)
    id_seed: int | None = None  # deterministic server-assigned ids when set
    clock: Callable[[], datetime] | None = None  # frozen clock for tasks; None = wall clock
    page_cache_size: int = 512
    #: resources ``_include`` / ``_revinclude`` may add to one page (``:iterate`` over ``*`` can reach a
    #: whole world); beyond it the page says so in an OperationOutcome entry, as HAPI caps its includes
    max_includes: int = 1000


@dataclass
class Request:
    method: str
    path: str  # relative to the base URL, no leading slash: "Patient/1/_history/2"
    query: list[tuple[str, str]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes | dict | None = None
    #: the caller serialises the response with orjson (the HTTP adapter): stored resources may then be
    #: spliced into it as ``orjson.Fragment`` bytes instead of being parsed and re-serialised
    raw: bool = False


@dataclass
class Response:
    status: int
    body: dict | None = None
    headers: dict[str, str] = field(default_factory=dict)


_COMPONENTS: dict[int, tuple] = {}


def _components(spec: Spec) -> tuple:
    """Validator and extractor for a spec, shared by every server: their compiled tables are costly."""
    from ._extract import Extractor
    from ._validate import Validator

    key = id(spec)
    if key not in _COMPONENTS:
        _COMPONENTS[key] = (Validator(spec), Extractor(spec), spec)
    validator, extractor, _ = _COMPONENTS[key]
    return validator, extractor


def format_instant(epoch: float) -> str:
    """FHIR instant with millisecond precision in UTC (``2025-01-01T00:00:00.000Z``)."""
    dt = datetime.fromtimestamp(epoch, UTC)
    return (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}."
            f"{dt.microsecond // 1000:03d}Z")


def _by_type(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(type, id) pairs as ids per type, in order: the store and search engine look resources up type by type."""
    out: dict[str, list[str]] = {}
    for t, i in pairs:
        out.setdefault(t, []).append(i)
    return out


def _since(value: str) -> str:
    """A ``_since`` parameter as the stored instant it compares with (``last_updated >= it``)."""
    try:
        lo = date_range(value)[0]
    except ValueError:
        raise bad_request(f"_since must be an instant, got {value!r}", "invalid", ("_since",)) from None
    return format_instant(min(lo, END_INSTANT - 1))  # the end of year 9999 is beyond datetime: its last second


def http_date(instant: str) -> str:
    """A stored ``lastUpdated`` instant as the HTTP-date a ``Last-Modified`` header carries (RFC 9110)."""
    return email.utils.format_datetime(datetime.fromisoformat(instant.replace("Z", "+00:00")), usegmt=True)


def _etag(version: int) -> str:
    return f'W/"{version}"'


def _parse_etag(value: object) -> int:
    """The version in an If-Match header or a Bundle entry's ``request.ifMatch`` (any JSON value)."""
    v = value.strip() if isinstance(value, str) else ""
    if v.startswith("W/"):
        v = v[2:]
    v = v.strip('"')
    if not _VERSION_RE.fullmatch(v):
        raise bad_request(f"Malformed If-Match/ETag value {value!r} (expected W/\"<version>\")")
    return int(v)


def _cascade(query: list[tuple[str, str]]) -> bool:
    """Whether a DELETE asks to delete what references the resource too (``_cascade=delete``, R5's form)."""
    values = [v for k, v in query if k == "_cascade"]
    if any(v != "delete" for v in values):
        raise bad_request(f"_cascade must be 'delete', got {values!r}", "invalid", ("_cascade",))
    return bool(values)


class FhirServer:
    """An R4 server over one :class:`Store`. Thread-safe (the store serialises access)."""

    def __init__(self, store: Store, spec: Spec | None = None, config: ServerConfig | None = None) -> None:
        self.store = store
        self.spec = spec or load_spec()
        self.config = config or ServerConfig()
        self.validator, self.extractor = _components(self.spec)
        self.search_engine = SearchEngine(self.spec, self.extractor.unsupported, self.config.base_url)
        if self.config.clock is not None:
            clock = self.config.clock
            self.search_engine.now = lambda: clock().timestamp()
        self._rng = random.Random(self.config.id_seed) if self.config.id_seed is not None else None
        self._last_ts = 0.0
        self._pages: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.RLock()
        self._generation = 0
        self._capability: dict | None = None
        self._ref_cache: dict[str, tuple[str, str] | None] = {}  # reference string -> local target
        self.admin_snapshot = None  # used only by the optional admin HTTP routes

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def base(self) -> str:
        return self.config.base_url.rstrip("/")

    def new_id(self) -> str:
        if self._rng is None:
            return str(uuid.uuid4())
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _timestamp(self) -> str:
        now = (self.config.clock() if self.config.clock else datetime.now(UTC)).timestamp()
        # strictly increasing, so history order is total. In whole milliseconds: float steps of 0.001
        # can land just below a millisecond and print the previous one again (frozen clocks hit this).
        ms = max(round(now * 1000), round(self._last_ts * 1000) + 1)
        self._last_ts = ms / 1000
        return format_instant(self._last_ts)

    def handle(self, req: Request) -> Response:
        """Serve one request; never raises."""
        try:
            with self._lock:
                return self._dispatch(req)
        except FhirError as err:
            return Response(err.status, err.outcome(), dict(err.headers))
        except RecursionError:
            return Response(400, operation_outcome([Issue("error", "too-costly", "Request nested too deeply")]))
        except Exception as exc:  # a bug: still answer with an OperationOutcome, and log it
            log.exception("internal error serving %s %s", req.method, req.path)
            return Response(500, operation_outcome([Issue("fatal", "exception", f"Internal error: {exc!r}")]))

    # -- routing -------------------------------------------------------------------------------------
    def _dispatch(self, req: Request) -> Response:
        method = req.method.upper()
        path = req.path.strip("/")
        parts = path.split("/") if path else []
        for key, value in req.query:
            if key == "_format":
                check_format(value)
        if not parts:
            if method == "POST":
                return self._bundle(self._json_body(req))
            if method == "GET" and any(k == "_getpages" for k, _ in req.query):
                return self._page(req)
            if method == "GET":
                raise bad_request("System-level search is not supported; search a resource type", "not-supported")
            raise FhirError(405, f"{method} is not allowed on the base URL", "not-supported")
        head = parts[0]
        if head == "metadata" and len(parts) == 1:
            if method != "GET":
                raise FhirError(405, "metadata supports GET only", "not-supported")
            for key, value in req.query:
                if key == "mode" and value != "full":
                    raise bad_request(f"metadata mode={value!r} is not supported (only 'full': a CapabilityStatement)",
                                      "not-supported", ("mode",))
            from ._capability import capability_statement

            if self._capability is None:
                self._capability = capability_statement(self)
            return Response(200, self._capability)
        if head == "_history" and len(parts) == 1 and method == "GET":
            return self._history(req, None, None)
        if head.startswith("$"):
            raise FhirError(404, f"Unknown system operation {head}", "not-supported")
        rtype = head
        if not self.spec.is_resource_type(rtype):
            raise not_found(f"Unknown resource type '{rtype}'")
        if len(parts) == 1:
            if method == "GET" and any(k == "_getpages" for k, _ in req.query):
                # a paging token sent to the type (our links are on the base): that page, not a fresh search
                state = self._pages.get(dict(req.query)["_getpages"])
                if state is not None and (state.get("rtype") != rtype or "everything" in state or "history" in state):
                    raise bad_request(f"The paging token is not one of a {rtype} search", "invalid", ("_getpages",))
                return self._page(req)
            if method == "GET":
                return self._search(req, rtype, req.query)
            if method == "POST":
                return self._create(req, rtype)
            if method == "PUT":
                return self._conditional_update(req, rtype)
            if method == "DELETE":
                return self._conditional_delete(req, rtype)
            raise FhirError(405, f"{method} not allowed on /{rtype}", "not-supported")
        second = parts[1]
        if len(parts) == 2 and second == "_search":
            if method != "POST":
                raise FhirError(405, "_search expects POST", "not-supported")
            return self._search(req, rtype, req.query + self._form_body(req))
        if len(parts) == 2 and second == "_history":
            if method != "GET":
                raise FhirError(405, "_history supports GET only", "not-supported")
            return self._history(req, rtype, None)
        if second == "$validate" and len(parts) == 2:
            if method != "POST":
                raise FhirError(405, "$validate expects POST", "not-supported")
            return self._validate_op(req, rtype, None)
        if second.startswith("$"):
            raise FhirError(404, f"Unknown operation {second} on {rtype}", "not-supported")
        rid = second
        if not ID_RE.fullmatch(rid):
            raise bad_request(f"Invalid resource id {rid!r} (ids are 1-64 of A-Z a-z 0-9 - .)")
        if len(parts) == 2:
            if method == "GET":
                return self._not_modified(req, self._shaped(req, self._read(rtype, rid)))
            if method == "PUT":
                return self._update(req, rtype, rid)
            if method == "DELETE":
                return self._delete(req, rtype, rid)
            raise FhirError(405, f"{method} not allowed on /{rtype}/{rid}", "not-supported")
        third = parts[2]
        if third == "_history" and len(parts) == 3 and method == "GET":
            return self._history(req, rtype, rid)
        if third == "_history" and len(parts) == 4 and method == "GET":
            return self._shaped(req, self._vread(rtype, rid, parts[3]))
        if third == "$everything" and len(parts) == 3 and rtype == "Patient" and method in ("GET", "POST"):
            return self._everything(req, rid)
        if third == "$validate" and len(parts) == 3 and method == "POST":
            return self._validate_op(req, rtype, rid)
        raise not_found(f"Unknown path /{path}")

    # -- bodies --------------------------------------------------------------------------------------
    def _json_body(self, req: Request) -> dict:
        body = req.body
        if isinstance(body, dict):
            try:  # an in-process body must be storable JSON (no 128-bit ints, sets, objects): 400, not a 500
                orjson.dumps(body)
            except TypeError as exc:
                raise bad_request(f"The body is not JSON-serialisable: {exc}", "structure") from None
            return body
        if not body:
            raise bad_request("Request body is empty; a FHIR JSON resource is required", "required")
        if len(body) > self.config.max_body_bytes:
            raise FhirError(413, f"Body of {len(body)} bytes exceeds the limit of {self.config.max_body_bytes}", "too-costly")
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype and ctype not in ("application/fhir+json", "application/json", "application/json+fhir"):
            raise FhirError(415, f"Unsupported content type {ctype!r}: only FHIR JSON is accepted", "not-supported")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"Malformed JSON: {exc}", "structure") from None
        if not isinstance(data, dict):
            raise bad_request("The body must be a JSON object (a FHIR resource)", "structure")
        return data

    def _form_body(self, req: Request) -> list[tuple[str, str]]:
        body = req.body
        if not body:
            return []
        if isinstance(body, dict):
            raise bad_request("_search expects application/x-www-form-urlencoded parameters")
        ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            raise FhirError(415, "POST _search expects application/x-www-form-urlencoded", "not-supported")
        try:
            return parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise bad_request("Form body is not UTF-8") from None

    def _resource_body(self, req: Request, rtype: str) -> dict:
        data = self._json_body(req)
        rt = data.get("resourceType")
        if rt is None:
            raise bad_request("Missing 'resourceType' in the body", "required", ("resourceType",))
        if rt != rtype:
            raise bad_request(f"resourceType {rt!r} in the body does not match the URL type {rtype}", "invalid",
                              ("resourceType",))
        return data

    # -- write pipeline ------------------------------------------------------------------------------
    def _check(self, resource: dict) -> None:
        if self.config.validate:
            issues = self.validator.validate(resource)
            errors = [i for i in issues if i.severity in ("error", "fatal")]
            if errors:
                raise invalid_resource(errors)

    def _local_ref(self, ref: str) -> tuple[str, str] | None:
        if ref.startswith(self.base + "/"):
            ref = ref[len(self.base) + 1 :]
        elif "://" in ref:
            return None
        t, i, _ = split_reference(ref)
        if t is None or i is None or not self.spec.is_resource_type(t):
            return None
        return t, i

    def _local_targets(self, resource: dict | bytes) -> set[tuple[str, str]]:
        """(type, id) of every reference to a resource on this server (``resource`` as a dict or as
        orjson bytes; the bytes are scanned, not parsed, which is what bulk loads use)."""
        return self._targets(reference_strings_json(resource) if isinstance(resource, bytes)
                             else reference_strings(resource))

    def _targets(self, refs: list[str]) -> set[tuple[str, str]]:
        """(type, id) of the given reference strings that name a resource on this server."""
        cache = self._ref_cache
        if len(cache) > 100_000:
            cache.clear()
        out = set()
        for ref in refs:
            target = cache[ref] if ref in cache else cache.setdefault(ref, self._local_ref(ref))
            if target is not None:
                out.add(target)
        return out

    def resolve_conditional_reference(self, ref: str) -> str | None:
        """``Type?search`` → ``Type/id`` when exactly one resource matches (412 otherwise); None for others.

        FHIR defines conditional references for transactions; like HAPI we also resolve them on plain
        creates and updates rather than storing a reference nobody can follow.
        """
        head, sep, query = ref.partition("?")
        if not sep or "/" in head or not self.spec.is_resource_type(head):
            return None
        matches = self.search_engine.find(self.store, head, parse_qsl(query, keep_blank_values=True))
        if len(matches) != 1:
            raise FhirError(412, f"Conditional reference {ref!r} matched {len(matches)} resources (needs exactly 1)",
                            "not-found")
        return f"{head}/{matches[0]}"

    def _check_integrity(self, resource: dict, pending: set[tuple[str, str]] | None = None) -> None:
        if not self.config.referential_integrity:
            return
        refs = reference_strings(resource)
        missing = {t for t in self._targets(refs) if not (pending and t in pending)}
        missing = {t for t in missing if not self.store.exists(*t)}
        versions = {ref for ref in refs if "/_history/" in ref and self._missing_version(ref, pending, missing)}
        if not missing and not versions:
            return
        issues = []
        for path, node in iter_references(resource):
            ref = node["reference"]
            if (target := self._local_ref(ref)) in missing:
                issues.append(Issue("error", "not-found", f"Referenced resource {target[0]}/{target[1]} does not exist",
                                    (path,)))
            elif ref in versions:
                issues.append(Issue("error", "not-found", f"Referenced version {ref} does not exist", (path,)))
        raise FhirError(422, issues[0].diagnostics, "not-found", issues[0].expression, issues=issues)

    def _missing_version(self, ref: str, pending: set[tuple[str, str]] | None, missing: set) -> bool:
        """Whether a versioned reference (``Patient/1/_history/2``) to a resource that exists here names a
        version this server does not have (or one that is a deletion). Versions of resources written in
        the same transaction are not known yet, and are not checked."""
        target = self._local_ref(ref)
        if target is None or target in missing or (pending and target in pending):
            return False
        vid = split_reference(ref)[2] or ""
        row = self.store.version(*target, int(vid)) if _VERSION_RE.fullmatch(vid) else None
        return row is None or row[2] is None

    def _record(self, rtype: str, rid: str, version: int, method: str, body: dict | None,
                ts: str | None = None) -> Record:
        ts = ts or self._timestamp()
        if body is None:
            return Record(rtype, rid, version, ts, method, None)
        meta = dict(body["meta"]) if isinstance(body.get("meta"), dict) else {}  # unvalidated writes: any shape
        meta["versionId"] = str(version)
        meta["lastUpdated"] = ts
        body["meta"] = meta
        body["id"] = rid
        index = self.extractor.extract(body)
        data = orjson.dumps(body)
        refs = sorted(self._local_targets(data))
        return Record(rtype, rid, version, ts, method, body, index, refs, data)

    def _store_write(self, record: Record) -> None:
        self.store.write([record])
        self._generation += 1

    def _write_response(self, record: Record, status: int, req: Request | None) -> Response:
        headers = {
            "ETag": _etag(record.version),
            "Last-Modified": http_date(record.last_updated),
            "Location": f"{self.base}/{record.rtype}/{record.id}/_history/{record.version}",
        }
        prefer = (req.headers.get("prefer", "") if req else "").lower()
        if "return=minimal" in prefer:
            return Response(status, None, headers)
        if "return=operationoutcome" in prefer:
            return Response(status, operation_outcome([Issue("information", "informational", "OK")]), headers)
        return Response(status, record.body, headers)

    def create(self, rtype: str, body: dict, rid: str | None = None, pending: set | None = None) -> Record:
        """Validate, assign id/meta, check references and store a new resource."""
        body = copy.deepcopy(body)
        body.pop("id", None)
        rewrite_references(body, self.resolve_conditional_reference)
        self._check(body)
        self._check_integrity(body, pending)
        rid = rid or self.new_id()
        rec = self._record(rtype, rid, 1, "POST", body)
        self._store_write(rec)
        return rec

    def update(self, rtype: str, rid: str, body: dict, if_match: int | None = None, pending: set | None = None
               ) -> tuple[Record, bool]:
        """Store a new version (or create with the client's id). Returns (record, created)."""
        if not isinstance(rid, str) or not ID_RE.fullmatch(rid):
            raise bad_request(f"Invalid resource id {rid!r} (ids are 1-64 of A-Z a-z 0-9 - .)", "invalid", ("id",))
        body = copy.deepcopy(body)
        if body.get("id") != rid:
            raise bad_request(
                f"The id in the body ({body.get('id')!r}) must equal the id in the URL ({rid!r})", "invalid", ("id",)
            )
        cur = self.store.current(rtype, rid)
        if if_match is not None:
            if cur is None or cur[2]:
                raise FhirError(412, f"If-Match given but {rtype}/{rid} does not exist", "conflict")
            if cur[0] != if_match:
                raise FhirError(412, f"Version conflict: {rtype}/{rid} is at version {cur[0]}, If-Match was {if_match}",
                                "conflict")
        rewrite_references(body, self.resolve_conditional_reference)
        self._check(body)
        self._check_integrity(body, pending)
        version = 1 if cur is None else cur[0] + 1
        created = cur is None or cur[2]
        rec = self._record(rtype, rid, version, "PUT", body)
        self._store_write(rec)
        return rec, created

    def delete(self, rtype: str, rid: str, if_match: int | None = None, cascade: bool = False,
               deleting: set[tuple[str, str]] | None = None, check_referrers: bool = True) -> Record | None:
        """Delete (a new 'deleted' version). 409 if others reference it, unless cascading.

        ``check_referrers=False``: the caller checks the final state instead (a transaction, whose other
        entries may drop their references to this resource)."""
        cur = self.store.current(rtype, rid)
        if cur is None or cur[2]:
            if if_match is not None:
                raise FhirError(412, f"If-Match given but {rtype}/{rid} does not exist", "conflict")
            return None
        if if_match is not None and cur[0] != if_match:
            raise FhirError(412, f"Version conflict: {rtype}/{rid} is at version {cur[0]}, If-Match was {if_match}",
                            "conflict")
        deleting = deleting if deleting is not None else set()
        deleting.add((rtype, rid))
        if self.config.referential_integrity and check_referrers:
            referrers = [r for r in self.store.referrers(rtype, rid, limit=1000) if r not in deleting]
            if referrers and not cascade:
                names = ", ".join(f"{t}/{i}" for t, i in referrers[:5])
                more = f" and {len(referrers) - 5} more" if len(referrers) > 5 else ""
                raise FhirError(
                    409,
                    f"Cannot delete {rtype}/{rid}: it is referenced by {names}{more}. "
                    "Delete those first, or pass _cascade=delete.",
                    "conflict",
                )
            for t, i in referrers:
                if (t, i) not in deleting:
                    self.delete(t, i, cascade=True, deleting=deleting)
        rec = self._record(rtype, rid, cur[0] + 1, "DELETE", None)
        self._store_write(rec)
        return rec

    def load(self, resources: list[dict], validate: bool = True, workers: int = 1) -> list[Issue]:
        """Bulk-load resources (keeping their ids) in one transaction; the fast path for worlds and benches.

        Every resource is validated (unless ``validate`` is False) and indexed like any write; a resource
        repeated in the input (same type and id) is stored once, as its last occurrence. ``workers`` > 1
        validates, indexes and inserts in that many processes (see :mod:`._bulk`). References are
        checked once at the end, against the whole loaded set. Returns the dangling-reference issues
        (empty when the data is closed); raises a 422 FhirError on the first invalid resource and then
        stores nothing.
        """
        from ._bulk import bulk_write

        resources = [r if r.get("id") else {**r, "id": self.new_id()} for r in resources]
        last: dict[tuple, int] = {}
        for n, res in enumerate(resources):
            rtype, rid = res.get("resourceType"), res.get("id")
            if not isinstance(rtype, str) or not self.spec.is_resource_type(rtype):
                raise bad_request(f"resource #{n}: unknown resourceType {rtype!r}")
            if not isinstance(rid, str) or not ID_RE.fullmatch(rid):
                raise bad_request(f"resource #{n}: invalid id {rid!r}")
            last[(rtype, rid)] = n
        existing = self.store.versions(list(last))
        items = [(n, resources[n], existing.get(key, 0) + 1) for key, n in sorted(last.items(), key=lambda kv: kv[1])]
        ts = self._timestamp()  # one instant for the whole load
        bulk_write(self, items, ts, validate and self.config.validate, workers)
        self._generation += 1
        # each distinct target looked up once (a 100-patient world: 65k targets of 492k edges; 5.4 s → 0.6 s)
        dangling = self.store.query(
            "SELECT DISTINCT r.rtype, r.id, r.target_type, r.target_id FROM main.refs r "
            "WHERE (r.target_type, r.target_id) IN (SELECT target_type, target_id FROM "
            "(SELECT DISTINCT target_type, target_id FROM main.refs) t "
            "WHERE NOT EXISTS (SELECT 1 FROM main.resources m WHERE m.rtype = t.target_type AND m.id = t.target_id "
            "AND m.deleted = 0) AND NOT EXISTS (SELECT 1 FROM base.resources b WHERE b.rtype = t.target_type "
            "AND b.id = t.target_id AND b.deleted = 0)) ORDER BY r.rowid"
        )
        return [
            Issue("error", "not-found", f"{t}/{i} references {tt}/{ti}, which does not exist", (t,))
            for t, i, tt, ti in dangling
        ]

    # -- interactions --------------------------------------------------------------------------------
    def _create(self, req: Request, rtype: str) -> Response:
        body = self._resource_body(req, rtype)
        cond = req.headers.get("if-none-exist")
        with self.store.transaction():
            if cond:
                existing = self._conditional_match(rtype, cond)
                if len(existing) > 1:
                    raise FhirError(412, f"If-None-Exist matched {len(existing)} resources", "duplicate")
                if existing:
                    found = self._read(rtype, existing[0])
                    if "return=minimal" in req.headers.get("prefer", "").lower():
                        found.body = None
                    return found
            rec = self.create(rtype, body)
        return self._write_response(rec, 201, req)

    def _conditional_match(self, rtype: str, query: str) -> list[str]:
        query = query.split("?", 1)[1] if "?" in query else query
        if query.startswith(rtype + "?"):
            query = query[len(rtype) + 1 :]
        params = parse_qsl(query, keep_blank_values=True)
        if not params:
            raise bad_request("Conditional operation needs search parameters")
        return self.search_engine.find(self.store, rtype, params)

    def _if_match(self, req: Request) -> int | None:
        value = req.headers.get("if-match")
        return _parse_etag(value) if value else None

    def _update(self, req: Request, rtype: str, rid: str) -> Response:
        body = self._resource_body(req, rtype)
        with self.store.transaction():
            rec, created = self.update(rtype, rid, body, self._if_match(req))
        return self._write_response(rec, 201 if created else 200, req)

    def _conditional_update(self, req: Request, rtype: str) -> Response:
        if not req.query:
            raise FhirError(405, f"PUT /{rtype} needs an id or search parameters (conditional update)", "not-supported")
        body = self._resource_body(req, rtype)
        with self.store.transaction():
            rid, matched = self.conditional_update_target(rtype, req.query, body)
            if matched:
                rec, created = self.update(rtype, rid, {**body, "id": rid}, self._if_match(req))
            elif rid is not None:
                rec, created = self.update(rtype, rid, body)
            else:
                rec, created = self.create(rtype, body), True
        return self._write_response(rec, 201 if created else 200, req)

    def single_match(self, rtype: str, query: list[tuple[str, str]], interaction: str) -> str | None:
        """The one resource a conditional update or delete selects: None when nothing matches, 412 when
        several do."""
        matches = self.search_engine.find(self.store, rtype, query)
        if len(matches) > 1:
            raise FhirError(412, f"Conditional {interaction} matched {len(matches)} resources", "multiple-matches")
        return matches[0] if matches else None

    def conditional_update_target(self, rtype: str, query: list[tuple[str, str]], body: dict
                                  ) -> tuple[str | None, bool]:
        """(id a conditional update writes, whether the criteria selected it): the match (the body's id,
        if any, must be the same); else the body's id, which must not be an existing resource the
        criteria did not select (R5 spells this out: 409); else None, for a new id."""
        match = self.single_match(rtype, query, "update")
        rid = body.get("id")
        if match is not None:
            if rid not in (None, match):
                raise bad_request(f"Body id {rid!r} differs from the matched resource {match}", "invalid", ("id",))
            return match, True
        cur = self.store.current(rtype, rid) if isinstance(rid, str) else None
        if cur is not None and not cur[2]:
            raise FhirError(409, f"The conditional update matched no resource, but {rtype}/{rid} (the body's id) "
                                 "exists and is not what the criteria select", "conflict")
        return rid, False

    def _delete(self, req: Request, rtype: str, rid: str) -> Response:
        cascade = _cascade(req.query)
        with self.store.transaction():
            rec = self.delete(rtype, rid, self._if_match(req), cascade)
        if rec is None:
            return Response(204)
        return Response(200, operation_outcome([Issue("information", "informational", f"Deleted {rtype}/{rid}")]),
                        {"ETag": _etag(rec.version)})

    def _conditional_delete(self, req: Request, rtype: str) -> Response:
        query = [(k, v) for k, v in req.query if k != "_cascade"]
        cascade = _cascade(req.query)
        if not query:
            raise FhirError(405, f"DELETE /{rtype} needs an id or search parameters (conditional delete)",
                            "not-supported")
        with self.store.transaction():
            match = self.single_match(rtype, query, "delete")
            if match is None:
                return Response(204)
            self.delete(rtype, match, cascade=cascade)
        return Response(200, operation_outcome([Issue("information", "informational", f"Deleted {rtype}/{match}")]))

    def _read(self, rtype: str, rid: str) -> Response:
        cur = self.store.current(rtype, rid)
        if cur is None:
            raise not_found(f"{rtype}/{rid} is not known")
        version, last_updated, deleted, data = cur
        if deleted:
            raise FhirError(410, f"{rtype}/{rid} was deleted (version {version})", "deleted",
                            headers={"ETag": _etag(version)})
        return Response(200, orjson.loads(data), {"ETag": _etag(version), "Last-Modified": http_date(last_updated)})

    def _shaped(self, req: Request, resp: Response) -> Response:
        """A read's resource as ``_summary`` / ``_elements`` ask (marked SUBSETTED), like a search's entries."""
        summary = elements = None
        for key, value in req.query:
            if key == "_summary":
                summary = summary_mode(value, ("true", "false", "text", "data"))
            elif key == "_elements":
                elements = element_names(value)
        if summary is not None or elements is not None:
            resp.body = self._subset(resp.body, summary, elements)
        return resp

    @staticmethod
    def _not_modified(req: Request, resp: Response) -> Response:
        """Conditional read: 304 when the client's copy is current (``If-None-Match`` takes precedence over
        ``If-Modified-Since``, whose unparseable dates are ignored, as HTTP says)."""
        etag, modified = resp.headers["ETag"], resp.headers["Last-Modified"]
        tags = req.headers.get("if-none-match")
        if tags is not None:
            current = etag.removeprefix("W/")
            fresh = any(t.strip() == "*" or t.strip().removeprefix("W/") == current for t in tags.split(","))
        else:
            try:
                since = email.utils.parsedate_to_datetime(req.headers.get("if-modified-since", ""))
                fresh = since.tzinfo is not None and email.utils.parsedate_to_datetime(modified) <= since
            except (TypeError, ValueError):
                fresh = False
        return Response(304, None, {"ETag": etag, "Last-Modified": modified}) if fresh else resp

    def _vread(self, rtype: str, rid: str, vid: str) -> Response:
        if not vid.isascii() or not vid.isdigit():
            raise bad_request(f"Version id must be a positive integer, got {vid!r}")
        row = self.store.version(rtype, rid, int(vid)) if _VERSION_RE.fullmatch(vid) else None
        if row is None:
            if self.store.current(rtype, rid) is None:
                raise not_found(f"{rtype}/{rid} is not known")
            raise not_found(f"{rtype}/{rid} has no version {vid}")
        last_updated, _method, data = row
        if data is None:
            raise FhirError(410, f"Version {vid} of {rtype}/{rid} is a deletion", "deleted")
        return Response(200, orjson.loads(data), {"ETag": _etag(int(vid)), "Last-Modified": http_date(last_updated)})

    # -- search --------------------------------------------------------------------------------------
    def _lenient(self, req: Request) -> bool:
        prefer = req.headers.get("prefer", "").lower()
        if "handling=strict" in prefer:
            return False
        if "handling=lenient" in prefer:
            return True
        return self.config.lenient_search

    def search(self, rtype: str, query: list[tuple[str, str]], lenient: bool = False, raw: bool = False) -> dict:
        """Search and return the searchset Bundle (first page); ``raw``: see :attr:`Request.raw`."""
        sreq = self.search_engine.parse(rtype, query, lenient, self.store.sides())
        ids = self.search_engine.ids(self.store, sreq)
        count = self._count(sreq.count)
        state = {
            "rtype": rtype, "ids": ids, "count": count, "include": sreq.include, "revinclude": sreq.revinclude,
            "summary": sreq.summary, "elements": sreq.elements, "total": sreq.total, "ignored": sreq.ignored,
            "self": self._self_url(rtype, query),
        }
        return self._render_page(self._remember(state, query), state, 0, raw)

    def _search(self, req: Request, rtype: str, query: list[tuple[str, str]]) -> Response:
        return Response(200, self.search(rtype, query, self._lenient(req), req.raw))

    def _count(self, requested: int | None) -> int:
        if requested is None:
            return self.config.default_count
        if requested < 0:
            raise bad_request(f"_count must be a non-negative integer, got {requested}")
        return min(requested, self.config.max_count)

    def _remember(self, state: dict, query: list[tuple[str, str]]) -> str:
        key = hashlib.sha256(
            orjson.dumps([state.get("rtype"), query, self._generation, id(self.store)])
        ).hexdigest()[:24]
        self._pages[key] = state
        self._pages.move_to_end(key)
        while len(self._pages) > self.config.page_cache_size:
            self._pages.popitem(last=False)
        return key

    def _page(self, req: Request) -> Response:
        q = dict(req.query)
        token = q.get("_getpages", "")
        state = self._pages.get(token)
        if state is None:
            raise FhirError(410, f"Paging token {token!r} is unknown or has expired; repeat the search", "not-found")
        offset = non_negative_int(q.get("_getpagesoffset", "0"), "_getpagesoffset")
        count = non_negative_int(q["_count"], "_count") if "_count" in q else state["count"]
        state = {**state, "count": min(count, self.config.max_count)}
        if "everything" in state:
            return Response(200, self._render_everything(token, state, offset))
        if "history" in state:
            return Response(200, self._render_history(token, state, offset))
        return Response(200, self._render_page(token, state, offset, req.raw))

    def _render_page(self, token: str, state: dict, offset: int, raw: bool = False) -> dict:
        ids: list[str] = state["ids"]
        count: int = state["count"]
        rtype = state["rtype"]
        bundle: dict = {"resourceType": "Bundle", "type": "searchset"}
        bundle["id"] = hashlib.sha256(f"{token}:{offset}".encode()).hexdigest()[:16]
        if state["total"] != "none":
            bundle["total"] = len(ids)
        ignored = self._ignored_outcome(state) if state["ignored"] and offset == 0 else []
        if state["summary"] == "count":
            bundle["link"] = self._page_links(token, state, offset, 0)
            if ignored:  # a count that ignored parameters must say so
                bundle["entry"] = ignored
            return bundle
        page_ids = ids[offset : offset + count]
        bundle["link"] = self._page_links(token, state, offset, len(ids))
        entry = self._entry_maker(state, raw)
        found = self.search_engine.fetch(self.store, rtype, page_ids)
        matched = [(rtype, i) for i in page_ids if i in found]
        entries = [entry(t, i, found[i], "match") for t, i in matched]
        included, complete = self._includes(matched, state["include"], state["revinclude"])
        for t, i, data in included:
            entries.append(entry(t, i, data, "include"))
        entries.extend(ignored)
        if not complete:
            entries.append({"resource": operation_outcome([Issue(
                "warning", "too-costly", "The _include/_revinclude results of this page are incomplete: at most "
                f"{self.config.max_includes} resources (ServerConfig.max_includes) and 5 rounds of :iterate are "
                "followed; ask for fewer matches per page (_count) or fewer includes")]),
                "search": {"mode": "outcome"}})
        if entries:
            bundle["entry"] = entries
        return bundle

    def _self_url(self, path: str, query: list[tuple[str, str]]) -> str:
        """The self link of the first page of a result list: the request as it was made."""
        return f"{self.base}/{path}" + (f"?{urlencode(query)}" if query else "")

    def _page_url(self, token: str, offset: int, count: int) -> str:
        return f"{self.base}?_getpages={quote(token)}&_getpagesoffset={offset}&_count={count}"

    def _page_links(self, token: str, state: dict, offset: int, total: int) -> list[dict]:
        """self / next / previous links of one page of a remembered result list."""
        count = state["count"]
        links = [{"relation": "self", "url": state["self"] if offset == 0 else self._page_url(token, offset, count)}]
        if count > 0 and offset + count < total:
            links.append({"relation": "next", "url": self._page_url(token, offset + count, count)})
        if count > 0 and offset > 0:
            links.append({"relation": "previous", "url": self._page_url(token, max(0, offset - count), count)})
        return links

    @staticmethod
    def _ignored_outcome(state: dict) -> list[dict]:
        issues = [Issue("warning", "not-supported", f"Ignored search parameter {msg}") for msg in state["ignored"]]
        return [{"resource": operation_outcome(issues), "search": {"mode": "outcome"}}]

    def _entry_maker(self, state: dict, raw: bool) -> Callable[[str, str, bytes, str], dict]:
        """The function turning (type, id, stored JSON, search mode) into a Bundle entry for one page."""
        base = self.base
        summary, elements = state.get("summary"), state.get("elements")
        if summary in (None, "false") and not elements:
            body = orjson.Fragment if raw else orjson.loads  # raw: the stored JSON, spliced in as is
        else:
            def body(data: bytes) -> dict:
                return self._subset(orjson.loads(data), summary, elements)

        def entry(rtype: str, rid: str, data: bytes, mode: str) -> dict:
            return {"fullUrl": f"{base}/{rtype}/{rid}", "resource": body(data), "search": {"mode": mode}}

        return entry

    def _subset(self, body: dict, summary: str | None, elements: list[str] | None) -> dict:
        if summary in (None, "false") and not elements:
            return body
        rtype = body["resourceType"]
        keep_always = {"resourceType", "id", "meta"}
        if summary == "text":
            kept = {k: v for k, v in body.items() if k in keep_always or k == "text" or self._mandatory(rtype, k)}
        elif summary == "data":
            kept = {k: v for k, v in body.items() if k != "text"}
        elif summary == "true":
            kept = {k: v for k, v in body.items() if k in keep_always or self._is_summary(rtype, k)}
        else:
            wanted = set(elements or [])
            # mandatory elements are kept too, as the specification asks (the result stays valid)
            kept = {
                k: v for k, v in body.items()
                if k in keep_always or k in wanted or self._choice_name(rtype, k) in wanted or self._mandatory(rtype, k)
            }
        meta = dict(kept.get("meta") or {})
        meta["tag"] = [*meta.get("tag", []), _SUBSETTED]
        kept["meta"] = meta
        return kept

    def _choice_name(self, rtype: str, key: str) -> str:
        """``valueQuantity`` → ``value`` for choice elements; other keys unchanged."""
        for name, el in self.spec.child_elements(rtype).items():
            if el.is_choice and key.startswith(name) and key[len(name):][:1].isupper():
                return name
        return key

    def _element_def(self, rtype: str, key: str):
        children = self.spec.child_elements(rtype)
        return children.get(key) or children.get(self._choice_name(rtype, key))

    def _is_summary(self, rtype: str, key: str) -> bool:
        el = self._element_def(rtype, key)
        return bool(el and (el.is_summary or el.is_modifier or el.min > 0))

    def _mandatory(self, rtype: str, key: str) -> bool:
        el = self._element_def(rtype, key)
        return bool(el and el.min > 0)

    def _includes(self, matched: list[tuple[str, str]], include: list, revinclude: list
                  ) -> tuple[list[tuple[str, str, bytes]], bool]:
        """(type, id, stored JSON) of the resources ``_include`` / ``_revinclude`` add to a page, and
        whether that is all of them (at most ``max_includes`` are added)."""
        room = self.config.max_includes
        seen = set(matched)
        out: list[tuple[str, str, bytes]] = []
        frontier = list(matched)
        rounds = 0
        first = True
        while frontier and (include or revinclude) and rounds < 5:
            rounds += 1
            found: list[tuple[str, str]] = []
            by_type = _by_type(frontier)
            for src, code, target, iterate in include:
                if not (first or iterate):
                    continue
                for t, ids in by_type.items():
                    if src not in ("*", t):
                        continue
                    for pair in self.search_engine.references_from(self.store, t, ids, code, target):
                        if pair not in seen:
                            seen.add(pair)
                            found.append(pair)
            for src, code, target, iterate in revinclude:
                if not (first or iterate) or src == "*":
                    continue
                targets = [(t, i) for t, i in frontier if target in (None, t)]
                for rid in self.search_engine.referencing(self.store, src, code, targets):
                    if (src, rid) not in seen:
                        seen.add((src, rid))
                        found.append((src, rid))
            if len(found) > room:
                return out + self._bodies(found[:room]), False
            room -= len(found)
            out += self._bodies(found)
            frontier = found
            first = False
            include = [x for x in include if x[3]]
            revinclude = [x for x in revinclude if x[3]]
        return out, not (frontier and (include or revinclude))  # not complete if :iterate ran out of rounds

    def _bodies(self, found: list[tuple[str, str]]) -> list[tuple[str, str, bytes]]:
        """(type, id, stored JSON) of the current resources among ``found``, type by type."""
        out = []
        for t, ids in _by_type(found).items():
            if not self.spec.is_resource_type(t):
                continue
            bodies = self.search_engine.fetch(self.store, t, ids)
            for i in ids:
                if i in bodies:
                    out.append((t, i, bodies[i]))
        return out

    # -- history -------------------------------------------------------------------------------------
    def _history(self, req: Request, rtype: str | None, rid: str | None) -> Response:
        q = dict(req.query)
        conds, args = [], []
        if rtype:
            conds.append("rtype=?")
            args.append(rtype)
        if rid:
            if self.store.current(rtype or "", rid) is None:
                raise not_found(f"{rtype}/{rid} is not known")
            conds.append("id=?")
            args.append(rid)
        if "_since" in q:
            conds.append("last_updated >= ?")
            args.append(_since(q["_since"]))
        unknown = set(q) - {"_since", "_count", "_format", "_pretty"}
        if unknown:
            raise bad_request(f"Unsupported _history parameter(s): {', '.join(sorted(unknown))}", "not-supported")
        where = " AND ".join(conds) or "1"
        rows = self.store.query(
            f"SELECT rtype, id, version, last_updated, method FROM ({history_sql(where)}) "
            "ORDER BY last_updated DESC, version DESC",
            args * 4,
        )
        count = self._count(non_negative_int(q["_count"], "_count") if "_count" in q else None)
        state = {"history": rows, "count": count, "self": self._self_url(req.path, req.query)}
        token = self._remember(state, [*req.query, ("_history", req.path)])
        return Response(200, self._render_history(token, state, 0))

    def _recreated(self, rtype: str, rid: str, version: int) -> bool:
        """Whether this version brought a deleted resource back (a create, as its response said: 201)."""
        before = self.store.version(rtype, rid, version - 1)
        return before is not None and before[2] is None

    def _render_history(self, token: str, state: dict, offset: int) -> dict:
        rows = state["history"]
        count = state["count"]
        entries = []
        for t, i, version, lu, method in rows[offset : offset + count]:
            found = self.store.version(t, i, version)
            data = found[2] if found else None
            entry: dict = {"fullUrl": f"{self.base}/{t}/{i}"}
            if data is not None:
                entry["resource"] = orjson.loads(data)
            entry["request"] = {"method": method, "url": f"{t}/{i}" if method != "POST" else t}
            status = "204" if data is None else "201" if version == 1 or self._recreated(t, i, version) else "200"
            entry["response"] = {"status": status, "etag": _etag(version), "lastModified": lu}
            entries.append(entry)
        links = self._page_links(token, state, offset, len(rows))
        bundle = {"resourceType": "Bundle", "type": "history", "total": len(rows), "link": links}
        if entries:
            bundle["entry"] = entries
        return bundle

    # -- operations ----------------------------------------------------------------------------------
    def _validate_op(self, req: Request, rtype: str, rid: str | None) -> Response:
        """``$validate`` (R4: the resource, or Parameters with ``resource``, ``mode`` and ``profile``)."""
        data = self._json_body(req) if req.body or rid is None else {"resourceType": "Parameters"}
        options = dict(req.query)
        if data.get("resourceType") == "Parameters":
            params = data.get("parameter", [])
            params = params if isinstance(params, list) else []
            options.update(self._operation_params([p for p in params if not (isinstance(p, dict)
                                                                             and p.get("name") == "resource")]))
            found = [p.get("resource") for p in params if isinstance(p, dict) and p.get("name") == "resource"]
            if len(found) > 1:
                raise bad_request("$validate Parameters take one 'resource' parameter", "structure")
            data = found[0] if found else None
        mode = options.get("mode", "create")
        if mode not in ("create", "update", "delete", "profile"):
            raise bad_request(f"$validate mode must be create, update, delete or profile; got {mode!r}", "code-invalid",
                              ("mode",))
        if mode == "delete":  # the resource is the stored one: would deleting it succeed?
            if rid is None:
                raise bad_request("$validate mode=delete is an instance operation: Type/id/$validate", "invalid")
            self._read(rtype, rid)  # 404 / 410
            referrers = self.store.referrers(rtype, rid, limit=6) if self.config.referential_integrity else []
            issues = [Issue("error", "conflict", f"{rtype}/{rid} is referenced by {t}/{i}: a delete would be refused "
                                                 "(409) unless cascading") for t, i in referrers[:5]]
            return Response(200, operation_outcome(issues or [Issue("information", "informational",
                                                                    "Validation successful: the delete would succeed")]))
        if not isinstance(data, dict):
            raise bad_request("$validate Parameters need a 'resource' parameter", "required")
        if data.get("resourceType") != rtype:
            raise bad_request(f"$validate on {rtype} got a {data.get('resourceType')!r}")
        issues = self.validator.validate(data)
        if mode == "update" and data.get("id") is None:
            issues.append(Issue("error", "required", "mode=update: the resource needs an id", (f"{rtype}.id",)))
        elif mode == "update" and rid is not None and data.get("id") != rid:
            issues.append(Issue("error", "invalid", f"mode=update: the resource's id {data.get('id')!r} is not the "
                                                    f"id in the URL ({rid!r})", (f"{rtype}.id",)))
        profile = options.get("profile")
        if profile is not None and profile != f"http://hl7.org/fhir/StructureDefinition/{rtype}":
            issues.append(Issue("warning", "not-supported", f"Profile {profile!r} is not known here: validated "
                                                            f"against the core {rtype} definition only"))
        if not issues:
            issues = [Issue("information", "informational", "Validation successful: no issues")]
        return Response(200, operation_outcome(issues))

    def _everything(self, req: Request, pid: str) -> Response:
        self._read("Patient", pid)  # 404 / 410 as for a read
        pairs = list(req.query)
        if req.body:  # POST: a Parameters body means the same as the query parameters
            body = self._json_body(req)
            if body.get("resourceType") != "Parameters":
                raise bad_request("POST $everything takes a Parameters body", "invalid", ("resourceType",))
            params = body.get("parameter", [])
            pairs += self._operation_params(params if isinstance(params, list) else [params])
        q = dict(pairs)
        unknown = set(q) - {"_count", "_type", "_since", "_format", "_pretty"}
        if unknown:
            raise bad_request(f"Unsupported $everything parameter(s): {', '.join(sorted(unknown))}", "not-supported")
        since = _since(q["_since"]) if "_since" in q else None
        types = None
        if "_type" in q:  # repeated or comma-separated: either type
            types = {t.strip() for k, v in pairs if k == "_type" for t in v.split(",")}
            bad = sorted(t for t in types if not self.spec.is_resource_type(t))
            if bad:
                raise bad_request(f"$everything _type: not resource types: {bad}", "invalid", ("_type",))
        found: list[tuple[str, str]] = [("Patient", pid)]
        for t, codes in sorted(self.spec.patient_compartment.items()):
            if t == "Patient" or (types is not None and t not in types) or not self.spec.is_resource_type(t):
                continue
            ids: set[str] = set()
            for code in codes:
                if code not in self.spec.search_params(t) or (t, code) in self.extractor.unsupported:
                    continue
                ids.update(self.search_engine.referencing(self.store, t, code, [("Patient", pid)]))
            found.extend((t, i) for i in sorted(ids))
        seen = set(found)
        referenced: list[tuple[str, str]] = []
        for t, ids in _by_type(found).items():
            for pair in self.search_engine.references_from(self.store, t, ids, "*", None):
                if pair not in seen and (types is None or pair[0] in types):
                    seen.add(pair)
                    referenced.append(pair)
        state = {
            "rtype": "Patient", "ids": [], "count": 0, "include": [], "revinclude": [], "summary": None,
            "elements": None, "total": "accurate", "ignored": [],
            "self": self._self_url(f"Patient/{pid}/$everything", req.query),
        }
        all_refs = found + referenced
        if since is not None:  # only what changed since then (the patient too), in the same order
            recent = {(t, i) for t, ids in _by_type(all_refs).items()
                      for i in self.search_engine.updated_since(self.store, t, ids, since)}
            all_refs = [pair for pair in all_refs if pair in recent]
        count = self._count(non_negative_int(q["_count"], "_count") if "_count" in q else None)
        state["everything"] = all_refs
        state["count"] = count
        token = self._remember(state, [*list(q.items()), ("$everything", pid)])
        return Response(200, self._render_everything(token, state, 0))

    @staticmethod
    def _operation_params(params: list) -> list[tuple[str, str]]:
        """(name, value) of an operation's Parameters entries with primitive values, as query parameters."""
        out = []
        for n, p in enumerate(params):
            values = [v for k, v in p.items() if k.startswith("value")] if isinstance(p, dict) else []
            if not isinstance(p, dict) or not isinstance(p.get("name"), str) or len(values) != 1 \
                    or not isinstance(values[0], str | int | float | bool):
                raise bad_request(f"Parameters.parameter[{n}] needs a name and one primitive value[x]", "structure",
                                  (f"Parameters.parameter[{n}]",))
            value = values[0]
            out.append((p["name"], str(value).lower() if isinstance(value, bool) else str(value)))
        return out

    def _render_everything(self, token: str, state: dict, offset: int) -> dict:
        refs = state["everything"]
        count = state["count"]
        page = refs[offset : offset + count]
        entries = []
        bodies = {t: self.search_engine.fetch(self.store, t, ids) for t, ids in _by_type(page).items()}
        for t, i in page:
            data = bodies[t].get(i)
            if data is not None:
                entries.append({"fullUrl": f"{self.base}/{t}/{i}", "resource": orjson.loads(data),
                                "search": {"mode": "match"}})
        links = [{"relation": "self", "url": state["self"]}]
        if count > 0 and offset + count < len(refs):
            links.append({"relation": "next", "url": self._page_url(token, offset + count, count)})
        bundle = {"resourceType": "Bundle", "type": "searchset", "total": len(refs), "link": links}
        if entries:
            bundle["entry"] = entries
        return bundle

    # -- batch / transaction ---------------------------------------------------------------------
    def _bundle(self, bundle: dict) -> Response:
        from ._bundle import process_bundle

        return process_bundle(self, bundle)


