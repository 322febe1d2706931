"""Bulk loads: validation, indexing and inserts, optionally in worker processes.

Validation, index extraction and even the SQLite inserts are CPU-bound Python work of about the same
size. With ``workers > 1`` every step runs in a process pool: each worker validates and indexes its
chunks and inserts the rows into its own scratch SQLite file (tables only, no indexes), and the parent
copies them into the store chunk by chunk, in input order, with ``INSERT ... SELECT`` (C speed, no
Python per row) before the indexes are built once. Nothing reaches the store unless every resource is valid.
"""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from .._gc import gc_paused
from ._errors import FhirError, invalid_resource
from ._store import CURRENT_TABLES, Record, create_tables, insert_records

if TYPE_CHECKING:
    from ._server import FhirServer

#: (position in input, resource, version) for every resource to store
Item = tuple[int, dict, int]
#: what preparing a chunk gives: its records, or (position, errors) of its first invalid resource
Prepared = list[Record] | tuple[int, list]
#: where a worker put a chunk's rows: its file and, per table, the first and last rowid
Piece = tuple[Path, dict[str, tuple[int, int]]]

#: SQLite attaches at most 10 databases to a connection; the base is one of them
MAX_WORKERS = 8

_WORKER: FhirServer | None = None
_FOLDER: Path | None = None
_CONN: sqlite3.Connection | None = None


def _init_worker(base_url: str, validate: bool, folder: str) -> None:
    global _WORKER, _FOLDER
    from ._server import FhirServer, ServerConfig
    from ._store import Store

    _WORKER = FhirServer(Store(), config=ServerConfig(base_url=base_url, validate=validate))
    _FOLDER = Path(folder)
    gc.freeze()  # the spec's objects live as long as the worker: no collection needs to walk them


def _prepare(server: FhirServer, items: list[Item], ts: str, validate: bool) -> Prepared:
    out = []
    for n, res, version in items:
        if validate:
            errors = [i for i in server.validator.validate(res) if i.severity in ("error", "fatal")]
            if errors:
                return n, errors
        rec = server._record(res["resourceType"], res["id"], version, "PUT", dict(res), ts)
        rec.body, rec.data = rec.data, None  # the bytes only: nobody parses them again
        out.append(rec)
    return out


def _write_in_worker(payload: bytes, ts: str, validate: bool) -> Piece | tuple[int, list]:
    """Prepare one chunk and insert it into this worker's file: where its rows are, or (position,
    errors) of its first invalid resource."""
    global _CONN
    assert _WORKER is not None and _FOLDER is not None
    with gc_paused():
        result = _prepare(_WORKER, [(n, res, v) for n, res, v in orjson.loads(payload)], ts, validate)
    if isinstance(result, tuple):
        return result
    path = _FOLDER / f"worker-{os.getpid()}.db"
    if _CONN is None:  # one file per worker process, kept open across its chunks
        _CONN = sqlite3.connect(path, isolation_level=None)
        _CONN.execute("PRAGMA journal_mode=OFF")  # scratch: deleted after the copy, or on failure
        _CONN.execute("PRAGMA synchronous=OFF")
        create_tables(_CONN)
    tables = ("resources", *CURRENT_TABLES)
    _CONN.execute("BEGIN")
    before = [_CONN.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0] for t in tables]
    insert_records(_CONN, result)
    after = [_CONN.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0] for t in tables]
    _CONN.execute("COMMIT")
    return path, {t: (b + 1, a) for t, b, a in zip(tables, before, after) if a > b}


def bulk_write(server: FhirServer, items: list[Item], ts: str, validate: bool, workers: int, chunk: int = 500
               ) -> None:
    """Validate, index and store ``items`` in one bulk transaction of ``server.store``.

    Raises 422 for the invalid resource that comes first in the input, and then stores nothing.
    """
    with gc_paused():
        _bulk_write(server, items, ts, validate, workers, chunk)


def _bulk_write(server: FhirServer, items: list[Item], ts: str, validate: bool, workers: int, chunk: int) -> None:
    chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
    workers = min(workers, os.cpu_count() or 1, len(chunks), MAX_WORKERS)
    if workers <= 1:
        with server.store.bulk():  # an invalid chunk raises inside: the whole load rolls back
            for c in chunks:
                server.store.write(_check(_prepare(server, c, ts, validate)))
        return
    # next to a file-backed store (a world build: may exceed memory and a RAM-backed /tmp), else in /tmp
    store_dir = server.store.path.parent if server.store.path is not None else None
    folder = Path(tempfile.mkdtemp(prefix="fhirgym-bulk-", dir=store_dir))
    try:
        with ProcessPoolExecutor(workers, initializer=_init_worker,
                                 initargs=(server.config.base_url, validate, str(folder))) as pool:
            futures = [pool.submit(_write_in_worker, orjson.dumps(c), ts, validate) for c in chunks]
            try:
                results = [f.result() for f in futures]
            finally:
                for f in futures:
                    f.cancel()  # after an error, the chunks not started yet
        failures = [r for r in results if isinstance(r[0], int)]
        if failures:
            _check(min(failures, key=lambda failure: failure[0]))
        server.store.copy_in([r for r in results if isinstance(r[0], Path)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check(result: Prepared) -> list[Record]:
    if isinstance(result, tuple):
        n, errors = result
        err = invalid_resource(errors)
        raise FhirError(err.status, f"resource #{n}: {err.diagnostics}", err.code, err.expression, issues=err.issues)
    return result


__all__ = ["bulk_write"]
