"""Bulk loads: validation, indexing and inserts, optionally in worker processes.

Validation, index extraction and even the SQLite inserts are CPU-bound Python work of about the same size. With
``workers > 1`` every step runs in a process pool, and the rows reach the store one of two ways. Into a store in memory,
or any store holding data: each worker validates and indexes its chunks and inserts the rows into its own scratch SQLite
file (tables only, no indexes), and the parent copies them into the store chunk by chunk, in input order, with
``INSERT ... SELECT`` (C speed, no Python per row), in one transaction. Into an empty scratch store (a world build,
:meth:`Store.shared_bulk`): the workers insert straight into the store's own file, each chunk in its turn (input order),
so nothing is copied. Either way the indexes are built once at the end, nothing stays in the store unless every resource
is valid, and a load gives the same file whether it ran in one process or several.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .._gc import gc_paused
from ._core import ServerConfig, ServerCore
from ._errors import FhirError, Issue, bad_request, invalid_resource
from ._http import id_rule, is_id
from ._json import dumps, loads
from ._store import CURRENT_TABLES, SCRATCH_CACHE, Record, Store, create_tables, insert_records
from ._write import record

#: (position in input, resource, version) for every resource to store
Item = tuple[int, dict, int]
#: what preparing a chunk gives: its records, or (position, errors) of its first invalid resource
Prepared = list[Record] | tuple[int, list]
#: where a worker put a chunk's rows: its file and, per table, the first and last rowid
Piece = tuple[Path, dict[str, tuple[int, int]]]

#: SQLite attaches at most 10 databases to a connection; the base is one of them
MAX_WORKERS = 8

_WORKER: ServerCore | None = None
_FOLDER: Path | None = None
_CONN: sqlite3.Connection | None = None
#: shared bulk (:meth:`Store.shared_bulk`): the store's file, and the number of the chunk whose turn it is
_TARGET: Path | None = None
_TURN: Any = None
#: the turn's value once a shared load has failed: nobody waits or writes any more
ABORTED = -1


def _init_worker(base_url: str, validate: bool, folder: str | None, target: str | None, turn: Any,
                 invariants: bool = True) -> None:
    global _WORKER, _FOLDER, _TARGET, _TURN
    _WORKER = ServerCore(Store(), config=ServerConfig(base_url=base_url, validate=validate, invariants=invariants))
    _FOLDER = Path(folder) if folder else None
    _TARGET, _TURN = (Path(target) if target else None), turn
    gc.freeze()  # the spec's objects live as long as the worker: no collection needs to walk them


def _prepare(server: ServerCore, items: list[Item], ts: str, validate: bool) -> Prepared:
    out = []
    for n, res, version in items:
        if validate:
            errors = [i for i in server.validator.validate(res, server.config.invariants) if i.severity in ("error", "fatal")]
            if errors:
                return n, errors
        rec = record(server, res["resourceType"], res["id"], version, "PUT", dict(res), ts)
        rec.body, rec.data = rec.data, None  # the bytes only: nobody parses them again
        out.append(rec)
    return out


def _prepare_payload(payload: bytes, ts: str, validate: bool) -> Prepared:
    """:func:`_prepare` in a worker, of a chunk as the parent serialised it."""
    assert _WORKER is not None
    with gc_paused():
        return _prepare(_WORKER, [(n, res, v) for n, res, v in loads(payload)], ts, validate)


def _connect(path: Path, own: bool) -> sqlite3.Connection:
    """This worker's connection to ``path`` (``own``: its own file, tables created here), kept open
    across its chunks."""
    global _CONN
    if _CONN is None:
        _CONN = sqlite3.connect(path, isolation_level=None)
        _CONN.execute("PRAGMA journal_mode=OFF")  # scratch: deleted, or emptied, on failure
        _CONN.execute("PRAGMA synchronous=OFF")
        _CONN.execute(f"PRAGMA cache_size={SCRATCH_CACHE}")
        if own:
            create_tables(_CONN)
    return _CONN


def _write_in_worker(payload: bytes, ts: str, validate: bool) -> Piece | tuple[int, list]:
    """Prepare one chunk and insert it into this worker's file: where its rows are, or (position,
    errors) of its first invalid resource."""
    assert _FOLDER is not None
    result = _prepare_payload(payload, ts, validate)
    if isinstance(result, tuple):
        return result
    path = _FOLDER / f"worker-{os.getpid()}.db"
    conn = _connect(path, own=True)
    tables = ("resources", *CURRENT_TABLES)
    conn.execute("BEGIN")
    before = [conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0] for t in tables]
    insert_records(conn, result)
    after = [conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0] for t in tables]
    conn.execute("COMMIT")
    return path, {t: (b + 1, a) for t, b, a in zip(tables, before, after) if a > b}


def _write_shared(payload: bytes, ts: str, validate: bool, turn: int) -> tuple[int, list] | None:
    """Prepare chunk number ``turn`` and, once every earlier chunk is in, insert it into the shared file
    as one transaction: None, or (position, errors) of its first invalid resource."""
    assert _TARGET is not None
    result: Prepared | None = None
    try:
        result = _prepare_payload(payload, ts, validate)
    finally:  # the turn passes on whatever happened here, or every later chunk would wait forever
        while (now := _TURN.value) != turn and now != ABORTED:
            time.sleep(0.0005)
        try:
            if isinstance(result, list) and now != ABORTED:
                conn = _connect(_TARGET, own=False)
                conn.execute("BEGIN")
                insert_records(conn, result)
                conn.execute("COMMIT")
        finally:
            with _TURN.get_lock():
                if _TURN.value != ABORTED:
                    _TURN.value = turn + 1
    return result if isinstance(result, tuple) else None


def load(server: ServerCore, resources: list[dict], validate: bool = True, workers: int = 1) -> list[Issue]:
    """Bulk-load resources (keeping their ids) in one transaction; the fast path for worlds and benches.

    Every resource is validated (unless ``validate`` is False) and indexed like any write; a resource
    repeated in the input (same type and id) is stored once, as its last occurrence. ``workers`` > 1
    validates, indexes and inserts in that many processes. References are checked once at the end,
    against the whole loaded set. Returns the dangling-reference issues (empty when the data is
    closed); raises a 422 FhirError on the first invalid resource and then stores nothing.
    """
    resources = [r if r.get("id") else {**r, "id": server.new_id()} for r in resources]
    last: dict[tuple, int] = {}
    for n, res in enumerate(resources):
        rtype, rid = res.get("resourceType"), res.get("id")
        if not isinstance(rtype, str) or not server.spec.is_resource_type(rtype):
            raise bad_request(f"resource #{n}: unknown resourceType {rtype!r}")
        if not is_id(rid):
            raise bad_request(f"resource #{n}: invalid id {rid!r} ({id_rule(rid)})")
        last[(rtype, rid)] = n
    existing = server.store.versions(list(last))
    items = [(n, resources[n], existing.get(key, 0) + 1) for key, n in sorted(last.items(), key=lambda kv: kv[1])]
    ts = server.timestamp()  # one instant for the whole load
    bulk_write(server, items, ts, validate and server.config.validate, workers)
    # each distinct target looked up once (a 100-patient world: 65k targets of 492k edges; 5.4 s → 0.6 s)
    dangling = server.store.query(
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


def bulk_write(server: ServerCore, items: list[Item], ts: str, validate: bool, workers: int, chunk: int = 500
               ) -> None:
    """Validate, index and store ``items`` in one bulk load of ``server.store``.

    Raises 422 for the invalid resource that comes first in the input, and then stores nothing.
    """
    with gc_paused():
        _bulk_write(server, items, ts, validate, workers, chunk)


def _bulk_write(server: ServerCore, items: list[Item], ts: str, validate: bool, workers: int, chunk: int) -> None:
    chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
    workers = min(workers, os.cpu_count() or 1, len(chunks), MAX_WORKERS)
    store = server.store
    if store.can_share_bulk():
        with store.shared_bulk() as path:
            if workers <= 1:  # a transaction per chunk, as the workers do: the same file either way
                for c in chunks:
                    with store.transaction():
                        store.write(_check(_prepare(server, c, ts, validate)))
                return
            turn = multiprocessing.Value("q", 0)
            with ProcessPoolExecutor(workers, initializer=_init_worker,
                                     initargs=(server.config.base_url, validate, None, str(path), turn,
                                               server.config.invariants)) as pool:
                _results(pool, ((_write_shared, dumps(c), ts, validate, n) for n, c in enumerate(chunks)), turn)
        return
    if workers <= 1:
        with store.bulk():  # an invalid chunk raises inside: the whole load rolls back
            for c in chunks:
                store.write(_check(_prepare(server, c, ts, validate)))
        return
    # next to a file-backed store (a world build: may exceed memory and a RAM-backed /tmp), else in /tmp
    store_dir = store.path.parent if store.path is not None else None
    folder = Path(tempfile.mkdtemp(prefix="fhirgym-bulk-", dir=store_dir))
    try:
        with ProcessPoolExecutor(workers, initializer=_init_worker,
                                 initargs=(server.config.base_url, validate, str(folder), None, None,
                                           server.config.invariants)) as pool:
            results = _results(pool, ((_write_in_worker, dumps(c), ts, validate) for c in chunks))
        store.copy_in(results)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _results(pool: ProcessPoolExecutor, calls: Iterable[tuple], turn: Any = None) -> list:
    """Run every call in the pool and return their results in order; raise for the first invalid
    resource in input order (chunks are in input order: the first failing chunk has it). ``turn``: the
    shared load's turn, set to :data:`ABORTED` on a failure so that no chunk waits for one cancelled."""
    # each chunk is serialised as it is submitted: the workers start on the first while the parent does the rest
    futures = [pool.submit(*call) for call in calls]
    results = []
    try:
        for f in futures:
            result = f.result()
            if isinstance(result, tuple) and isinstance(result[0], int):
                _check(result)
            results.append(result)
    except BaseException:
        if turn is not None:
            turn.value = ABORTED
        for f in futures:
            f.cancel()  # the chunks not started yet
        raise
    return results


def _check(result: Prepared) -> list[Record]:
    if isinstance(result, tuple):
        n, errors = result
        err = invalid_resource(errors)
        raise FhirError(err.status, f"resource #{n}: {err.diagnostics}", err.code, err.expression, issues=err.issues)
    return result


__all__ = ["bulk_write", "load"]
