"""The write pipeline: validate → check references → index → store, for every way a resource is written.

Single creates, updates and deletes, the entries of batches and transactions, and bulk loads
(:mod:`._bulk`, through :func:`record`) all go through here, so a resource is stored the same way
whichever door it came in by. Conditional writes pick their target here too.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from ._core import ServerCore
from ._errors import FhirError, Issue, bad_request, invalid_resource
from ._http import VERSION_RE, id_rule, is_id
from ._json import copy_json, dumps
from ._refs import iter_references, reference_strings, reference_strings_json, rewrite_references
from ._store import Record
from ._values import split_reference


def validate(server: ServerCore, resource: dict) -> None:
    """422 for a resource with errors (unless the server does not validate)."""
    if server.config.validate:
        issues = server.validator.validate(resource, server.config.invariants, server.check_time)
        errors = [i for i in issues if i.severity in ("error", "fatal")]
        if errors:
            raise invalid_resource(errors)


def local_ref(server: ServerCore, ref: str) -> tuple[str, str] | None:
    """(type, id) of the resource a reference string names on this server; None for others."""
    if ref.startswith(server.base + "/"):
        ref = ref[len(server.base) + 1 :]
    elif "://" in ref:
        return None
    t, i, _ = split_reference(ref)
    if t is None or i is None or not server.spec.is_resource_type(t):
        return None
    return t, i


def local_targets(server: ServerCore, resource: dict | bytes) -> set[tuple[str, str]]:
    """(type, id) of every reference to a resource on this server (``resource`` as a dict or as
    orjson bytes; the bytes are scanned, not parsed, which is what bulk loads use)."""
    return targets(server, reference_strings_json(resource) if isinstance(resource, bytes)
                   else reference_strings(resource))


def targets(server: ServerCore, refs: list[str]) -> set[tuple[str, str]]:
    """(type, id) of the given reference strings that name a resource on this server."""
    cache = server.ref_cache
    if len(cache) > 100_000:
        cache.clear()
    out = set()
    for ref in refs:
        target = cache[ref] if ref in cache else cache.setdefault(ref, local_ref(server, ref))
        if target is not None:
            out.add(target)
    return out


def resolve_conditional_reference(server: ServerCore, ref: str) -> str | None:
    """``Type?search`` → ``Type/id`` when exactly one resource matches (412 otherwise); None for others.

    FHIR defines conditional references for transactions; like HAPI we also resolve them on plain
    creates and updates rather than storing a reference nobody can follow.
    """
    head, sep, query = ref.partition("?")
    if not sep or "/" in head or not server.spec.is_resource_type(head):
        return None
    matches = server.search_engine.find(server.store, head, parse_qsl(query, keep_blank_values=True))
    if len(matches) != 1:
        raise FhirError(412, f"Conditional reference {ref!r} matched {len(matches)} resources (needs exactly 1)",
                        "not-found")
    return f"{head}/{matches[0]}"


def check_integrity(server: ServerCore, resource: dict, pending: set[tuple[str, str]] | None = None) -> None:
    """422 when a reference names a resource (or a version) this server does not have; ``pending``:
    resources a transaction is about to write."""
    if not server.config.referential_integrity:
        return
    refs = reference_strings(resource)
    missing = {t for t in targets(server, refs) if not (pending and t in pending)}
    missing = {t for t in missing if not server.store.exists(*t)}
    versions = {ref for ref in refs if "/_history/" in ref and _missing_version(server, ref, pending, missing)}
    if not missing and not versions:
        return
    issues = []
    for path, node in iter_references(resource):
        ref = node["reference"]
        if (target := local_ref(server, ref)) in missing:
            issues.append(Issue("error", "not-found", f"Referenced resource {target[0]}/{target[1]} does not exist",
                                (path,)))
        elif ref in versions:
            issues.append(Issue("error", "not-found", f"Referenced version {ref} does not exist", (path,)))
    raise FhirError(422, issues[0].diagnostics, "not-found", issues[0].expression, issues=issues)


def _missing_version(server: ServerCore, ref: str, pending: set[tuple[str, str]] | None, missing: set) -> bool:
    """Whether a versioned reference (``Patient/1/_history/2``) to a resource that exists here names a
    version this server does not have (or one that is a deletion). Versions of resources written in
    the same transaction are not known yet, and are not checked."""
    target = local_ref(server, ref)
    if target is None or target in missing or (pending and target in pending):
        return False
    vid = split_reference(ref)[2] or ""
    row = server.store.version(*target, int(vid)) if VERSION_RE.fullmatch(vid) else None
    return row is None or row[2] is None


def record(server: ServerCore, rtype: str, rid: str, version: int, method: str, body: dict | None,
           ts: str | None = None) -> Record:
    """The stored form of one write: meta set, index rows extracted, references listed."""
    ts = ts or server.timestamp()
    if body is None:
        return Record(rtype, rid, version, ts, method, None)
    meta = dict(body["meta"]) if isinstance(body.get("meta"), dict) else {}  # unvalidated writes: any shape
    meta["versionId"] = str(version)
    meta["lastUpdated"] = ts
    body["meta"] = meta
    body["id"] = rid
    index = server.extractor.extract(body)
    data = dumps(body)
    refs = sorted(local_targets(server, data))
    return Record(rtype, rid, version, ts, method, body, index, refs, data)


def store(server: ServerCore, rec: Record) -> None:
    server.check_time()
    server.store.write([rec])


def create(server: ServerCore, rtype: str, body: dict, rid: str | None = None, pending: set | None = None) -> Record:
    """Validate, assign id/meta, check references and store a new resource."""
    body = copy_json(body)
    body.pop("id", None)
    rewrite_references(body, lambda ref: resolve_conditional_reference(server, ref))
    validate(server, body)
    check_integrity(server, body, pending)
    rid = rid or server.new_id()
    rec = record(server, rtype, rid, 1, "POST", body)
    store(server, rec)
    return rec


def update(server: ServerCore, rtype: str, rid: str, body: dict, if_match: int | None = None,
           pending: set | None = None) -> tuple[Record, bool]:
    """Store a new version (or create with the client's id). Returns (record, created)."""
    if not is_id(rid):
        raise bad_request(f"Invalid resource id {rid!r} ({id_rule(rid)})", "invalid", ("id",))
    body = copy_json(body)
    if body.get("id") != rid:
        raise bad_request(
            f"The id in the body ({body.get('id')!r}) must equal the id in the URL ({rid!r})", "invalid", ("id",)
        )
    cur = server.store.current(rtype, rid)
    if if_match is not None:
        if cur is None or cur[2]:
            raise FhirError(412, f"If-Match given but {rtype}/{rid} does not exist", "conflict")
        if cur[0] != if_match:
            raise FhirError(412, f"Version conflict: {rtype}/{rid} is at version {cur[0]}, If-Match was {if_match}",
                            "conflict")
    rewrite_references(body, lambda ref: resolve_conditional_reference(server, ref))
    validate(server, body)
    check_integrity(server, body, pending)
    version = 1 if cur is None else cur[0] + 1
    created = cur is None or cur[2]
    rec = record(server, rtype, rid, version, "PUT", body)
    store(server, rec)
    return rec, created


def delete(server: ServerCore, rtype: str, rid: str, if_match: int | None = None, cascade: bool = False,
           deleting: set[tuple[str, str]] | None = None, check_referrers: bool = True) -> Record | None:
    """Delete (a new 'deleted' version). 409 if others reference it, unless cascading.

    ``cascade``: every resource that references it, directly or through others, is deleted too, all in
    one write (the caller's transaction); or nothing is, when that would be more than
    ``ServerConfig.max_cascade_delete`` resources. ``check_referrers=False``: the caller checks the final
    state instead (a transaction, whose other entries may drop their references to this resource)."""
    cur = server.store.current(rtype, rid)
    if cur is None or cur[2]:
        if if_match is not None:
            raise FhirError(412, f"If-Match given but {rtype}/{rid} does not exist", "conflict")
        return None
    if if_match is not None and cur[0] != if_match:
        raise FhirError(412, f"Version conflict: {rtype}/{rid} is at version {cur[0]}, If-Match was {if_match}",
                        "conflict")
    deleting = deleting if deleting is not None else set()
    deleting.add((rtype, rid))
    doomed = [(rtype, rid, cur[0])]
    if server.config.referential_integrity and check_referrers:
        if cascade:
            doomed = _referrers_closure(server, rtype, rid, cur[0], deleting)
        else:
            referrers = [r for r in server.store.referrers(rtype, rid, limit=1000) if r not in deleting]
            if referrers:
                names = ", ".join(f"{t}/{i}" for t, i in referrers[:5])
                more = f" and {len(referrers) - 5} more" if len(referrers) > 5 else ""
                raise FhirError(
                    409,
                    f"Cannot delete {rtype}/{rid}: it is referenced by {names}{more}. "
                    "Delete those first, or pass _cascade=delete.",
                    "conflict",
                )
    records = [record(server, t, i, version + 1, "DELETE", None) for t, i, version in doomed]
    server.check_time()
    server.store.write(records)
    return records[-1]


def _referrers_closure(server: ServerCore, rtype: str, rid: str, version: int, deleting: set[tuple[str, str]]
                       ) -> list[tuple[str, str, int]]:
    """(type, id, current version) of rtype/rid and of every live resource that references it, directly or
    through others: each after what references it (depth first, with a stack of its own, so a chain of
    any depth is fine); ``deleting`` grows by them. 409 beyond ``max_cascade_delete``: a cascade is complete
    or does not happen."""
    limit = server.config.max_cascade_delete
    out: list[tuple[str, str, int]] = []
    found = 0
    stack = [((rtype, rid, version), iter(server.store.referrers(rtype, rid, limit=None)))]
    while stack:
        node, referrers = stack[-1]
        for ref in referrers:
            if ref in deleting:
                continue
            cur = server.store.current(*ref)
            if cur is None or cur[2]:
                continue
            deleting.add(ref)
            found += 1
            if found > limit:
                raise FhirError(
                    409, f"Cannot delete {rtype}/{rid} with _cascade=delete: it would delete more than "
                         f"{limit} other resources (the server's max_cascade_delete; raise it, e.g. "
                         f"`fhirgym serve --limit max_cascade_delete=N`, or delete the referrers in parts). "
                         "Nothing was deleted.", "too-costly")
            stack.append(((*ref, cur[0]), iter(server.store.referrers(*ref, limit=None))))
            break
        else:
            stack.pop()
            out.append(node)
    return out


def conditional_match(server: ServerCore, rtype: str, query: str) -> list[str]:
    """The ids an ``If-None-Exist`` search (``a=b``, ``?a=b`` or ``Type?a=b``) selects."""
    query = query.split("?", 1)[1] if "?" in query else query
    if query.startswith(rtype + "?"):
        query = query[len(rtype) + 1 :]
    params = parse_qsl(query, keep_blank_values=True)
    if not params:
        raise bad_request("Conditional operation needs search parameters")
    return server.search_engine.find(server.store, rtype, params)


def single_match(server: ServerCore, rtype: str, query: list[tuple[str, str]], interaction: str) -> str | None:
    """The one resource a conditional update or delete selects: None when nothing matches, 412 when
    several do."""
    matches = server.search_engine.find(server.store, rtype, query)
    if len(matches) > 1:
        raise FhirError(412, f"Conditional {interaction} matched {len(matches)} resources", "multiple-matches")
    return matches[0] if matches else None


def conditional_update_target(server: ServerCore, rtype: str, query: list[tuple[str, str]], body: dict
                              ) -> tuple[str | None, bool]:
    """(id a conditional update writes, whether the criteria selected it): the match (the body's id,
    if any, must be the same); else the body's id, which must not be an existing resource the
    criteria did not select (R5 spells this out: 409); else None, for a new id."""
    match = single_match(server, rtype, query, "update")
    rid = body.get("id")
    if match is not None:
        if rid not in (None, match):
            raise bad_request(f"Body id {rid!r} differs from the matched resource {match}", "invalid", ("id",))
        return match, True
    cur = server.store.current(rtype, rid) if isinstance(rid, str) else None
    if cur is not None and not cur[2]:
        raise FhirError(409, f"The conditional update matched no resource, but {rtype}/{rid} (the body's id) "
                             "exists and is not what the criteria select", "conflict")
    return rid, False
