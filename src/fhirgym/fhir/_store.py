"""SQLite storage with copy-on-write layers: a shared read-only base plus a small per-store layer.

Why layers: copying a 20,000-resource world costs tens of milliseconds (measured when the store was designed), so a reset or fork that
copies the world cannot be fast. Here a world is an immutable SQLite file (the *base*), opened read-only by any number
of stores; each store writes only into its own in-memory *layer* (same schema). Reads go through TEMP views that union
the layer with the base rows the layer does not shadow. Fork = open a connection and attach the base; reset = empty the
layer. Both cost what the episode wrote, not what the world holds.

The store knows nothing of FHIR semantics (validation, search parameters); it keeps resources, history, index rows and
reference edges, and offers snapshots.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ._json import dumps

#: ``None`` binds as NULL either way, but without an adapter Python's sqlite3 looks for one on every
#: ``None`` parameter (two failed attribute lookups): 1.0 µs per ``None`` instead of 0.4. Index rows carry
#: about 13 of them per Synthea resource. The adapter is the identity (``{}.get(None)`` is None), so no
#: other user of sqlite3 in the process sees a difference; one registered before us is left alone.
sqlite3.adapters.setdefault((type(None), sqlite3.PrepareProtocol), {}.get)

#: Index tables and their value columns (after rtype, id, param). One definition serves schema,
#: inserts and views.
INDEX_TABLES: dict[str, tuple[str, ...]] = {
    "ix_string": ("norm", "exact"),
    "ix_token": ("system", "code", "text"),
    "ix_reference": ("target_type", "target_id", "url", "ident_system", "ident_value"),
    "ix_date": ("lo", "hi"),
    "ix_number": ("lo", "hi", "value"),
    "ix_quantity": ("value", "lo", "hi", "system", "code", "unit"),
    "ix_uri": ("uri",),
    "ix_composite": ("comp",),
}

#: Index table of each search parameter type (``special`` has none).
TABLE_FOR_TYPE: dict[str, str] = {
    t: f"ix_{t}" for t in ("string", "token", "reference", "date", "number", "quantity", "uri", "composite")
}

#: Search indexes. Each ends with ``id`` (and the columns a search compares), so a criterion is answered
#: from the index alone, never from the table rows: on a 20,000-resource world that halves a
#: patient-scoped search. The ``_res`` index per table, on (rtype, id), serves updates and includes.
_INDEX_DDL = {
    "ix_string": ["(rtype, param, norm, id)"],
    "ix_token": ["(rtype, param, code, system, id)"],
    "ix_reference": ["(rtype, param, target_id, target_type, id)"],
    "ix_date": ["(rtype, param, lo, hi, id)"],
    "ix_number": ["(rtype, param, value, id)"],
    "ix_quantity": ["(rtype, param, value, id)"],
    "ix_uri": ["(rtype, param, uri, id)"],
    "ix_composite": ["(rtype, param)"],
}


#: Index tables whose ``_res`` index a base file keeps. A base is never updated, so there the index
#: serves only look-ups of a given resource's rows: includes and ``_has`` (references), sorting. Uri and
#: composite parameters are never sort keys here (composites cannot be, ``_profile`` and ``url`` hardly
#: are): a 100-patient world's build saves 1.1 s without theirs (and 1.25 s without ``refs_source``).
#: Token ones stay: without its index, sorting a patient's Observations by code took 108 ms, not 14.
BASE_RES_INDEXES = frozenset(INDEX_TABLES) - {"ix_uri", "ix_composite"}


def _schema(prefix: str = "", base: bool = False) -> list[str]:
    """DDL of a store's tables and indexes; ``base``: the indexes a base file needs (not a layer's)."""
    p = f"{prefix}." if prefix else ""
    stmts = [
        f"CREATE TABLE IF NOT EXISTS {p}resources (rtype TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL,"
        " last_updated TEXT NOT NULL, method TEXT NOT NULL, deleted INTEGER NOT NULL, json BLOB,"
        " UNIQUE (rtype, id))",
        f"CREATE TABLE IF NOT EXISTS {p}history (rtype TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL,"
        " last_updated TEXT NOT NULL, method TEXT NOT NULL, json BLOB, UNIQUE (rtype, id, version))",
        f"CREATE INDEX IF NOT EXISTS {p}resources_time ON resources (last_updated)",
        # a search orders its matches by (last_updated, id) and skips deleted ones: from this index alone,
        # without reading the (large) resource rows
        f"CREATE INDEX IF NOT EXISTS {p}resources_live ON resources (rtype, id, deleted, last_updated)",
        f"CREATE INDEX IF NOT EXISTS {p}history_time ON history (last_updated)",
        f"CREATE TABLE IF NOT EXISTS {p}refs (rtype TEXT NOT NULL, id TEXT NOT NULL, target_type TEXT NOT NULL,"
        " target_id TEXT NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {p}refs_target ON refs (target_type, target_id)",
        f"CREATE TABLE IF NOT EXISTS {p}meta (key TEXT PRIMARY KEY, value TEXT)",
    ]
    if not base:  # edges are looked up by source only to replace them, which never happens in a base
        stmts.append(f"CREATE INDEX IF NOT EXISTS {p}refs_source ON refs (rtype, id)")
    for table, cols in INDEX_TABLES.items():
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {p}{table} (rtype TEXT NOT NULL, id TEXT NOT NULL, param TEXT NOT NULL, "
            + ", ".join(cols)
            + ")"
        )
        if not base or table in BASE_RES_INDEXES:
            stmts.append(f"CREATE INDEX IF NOT EXISTS {p}{table}_res ON {table} (rtype, id)")
        for n, cols_ix in enumerate(_INDEX_DDL[table]):
            stmts.append(f"CREATE INDEX IF NOT EXISTS {p}{table}_q{n} ON {table} {cols_ix}")
    return stmts


#: Tables whose rows belong to the current version of a resource (shadowed by the layer).
CURRENT_TABLES = ("refs", *INDEX_TABLES)

_SHADOW = "NOT EXISTS (SELECT 1 FROM main.resources s WHERE s.rtype = b.rtype AND s.id = b.id)"


#: Both schemas of a store: the writable layer (``main``) and the read-only ``base``.
BOTH = ("main", "base")

#: Page cache of scratch files (world builds, bulk workers), as SQLite's ``cache_size`` (negative: KiB).
#: The default 2 MB made inserts and index builds spill to the OS page by page: a 1M-row index table
#: filled in 8.9 s instead of 4.6 s, and indexed in 8.9 s instead of 7.1 s. Pages are allocated as used.
SCRATCH_CACHE = -1_000_000

#: How much of the read-only base each connection maps into memory (SQLite ``mmap_size``): reads of a
#: world then come from the OS page cache without a copy. Per connection, in address space: with a
#: gigabyte each, a dozen readers reserved 12 GB and failed under an address-space cap. 256 MiB maps a
#: 10-patient world (128 MB) whole; the rest of a larger one is read with ``pread``.
BASE_MMAP = 256 * 1024 * 1024

#: Reader connections a file-backed store keeps at most (:meth:`Store.reading`), unless set otherwise.
DEFAULT_READERS = 8


class Unavailable(RuntimeError):
    """The store cannot serve a read now: every reader connection stayed busy for the whole wait, or a
    new one could not be opened (no file descriptors, no memory). Worth retrying later."""


def merged(table: str, where: str = "", cols: str = "*", sides: tuple[str, ...] = BOTH) -> str:
    """SQL for the current rows of ``table`` across layer and base (base rows the layer shadows hidden).

    ``where`` is applied inside both branches, so SQLite can use each side's indexes. Plain SQL text
    rather than TEMP views: creating views costs milliseconds per connection, which a fork cannot pay.
    ``sides`` (see :meth:`Store.sides`) names the schemas that hold rows: with one side there is no
    UNION and no per-row shadow check, which is most of the cost of a search on a pristine world.
    """
    cond = f" WHERE {where}" if where else ""
    live = f" WHERE deleted = 0 AND ({where})" if where else " WHERE deleted = 0"
    if len(sides) == 1:
        return f"SELECT {cols} FROM {sides[0]}.{table}{live if table == 'resources' else cond}"
    base_cond = f" WHERE {where} AND {_SHADOW}" if where else f" WHERE {_SHADOW}"
    if table == "resources":
        return (
            f"SELECT {cols} FROM main.resources{live} UNION ALL "
            f"SELECT {cols} FROM base.resources b{base_cond.replace(' WHERE ', ' WHERE deleted = 0 AND ', 1)}"
        )
    return f"SELECT {cols} FROM main.{table}{cond} UNION ALL SELECT {cols} FROM base.{table} b{base_cond}"


def history_sql(where: str) -> str:
    """Every version ever stored matching ``where`` (history holds old versions, resources the latest)."""
    cols = "rtype, id, version, last_updated, method, json"
    return " UNION ALL ".join(
        f"SELECT {cols} FROM {schema}.{table} WHERE {where}"
        for schema in ("main", "base")
        for table in ("resources", "history")
    )


@dataclass(frozen=True)
class Snapshot:
    """An immutable state of a store: a read-only base file plus (optionally) a serialized layer.

    Cheap to hold and to open many times. ``flatten`` merges the layer into a new base file, which is
    what a world file is.
    """

    base: Path | None
    layer: bytes | None = None

    def open(self, **kwargs) -> Store:
        """A new, independent, writable store starting at this state."""
        return Store(base=self.base, snapshot=self, **kwargs)

    def flatten(self, path: str | os.PathLike) -> Snapshot:
        """Write base + layer into a single new base file and return a snapshot of it."""
        store = self.open()
        try:
            store.export(path)
        finally:
            store.close()
        return Snapshot(Path(path))


class Store:
    """Resources, history, search-index rows and reference edges in layered SQLite.

    ``base``: path of a read-only base database (None: empty). ``path``: where the writable layer lives
    (None: in memory, up to SQLite's 1 GiB limit for such databases — plenty for an episode; a file path
    makes the store persistent, e.g. ``fhirgym serve --db``, and is what large builds use).
    ``durable=False``: a file store that is scratch, destined to become a base file (:meth:`finish`).
    Thread-safe: one lock serialises use of the connection.
    """

    def __init__(
        self,
        base: str | os.PathLike | None = None,
        path: str | os.PathLike | None = None,
        snapshot: Snapshot | None = None,
        durable: bool = True,
    ) -> None:
        self.base = Path(base).resolve() if base else None
        self.path = Path(path) if path else None
        #: a file that only becomes a base (a world build): no journal, no fsync, a base's indexes
        self.scratch = self.path is not None and not durable
        self.lock = threading.RLock()
        self._depth = 0
        #: asked by SQLite every few thousand steps of a statement: True interrupts it (a request out of time)
        self.interrupt: Callable[[], bool] | None = None
        #: at most this many reader connections (:meth:`reading`); each is checked out by one request
        self.max_readers = DEFAULT_READERS
        self._idle: list[Store] = []  # reader views not in use
        self._open_readers = 0  # reader connections open, idle or in use
        self._pool = threading.Condition(threading.Lock())
        if snapshot is not None and snapshot.layer is not None and self.path is not None:
            raise ValueError("a snapshot with a layer opens in memory only")
        if self.base is not None and not self.base.is_file():
            raise FileNotFoundError(f"base database {self.base} does not exist")
        self.conn = self._connect(snapshot.layer if snapshot is not None else None, durable)
        # the base never changes once attached (a read-only file, or an empty in-memory schema)
        self._base_rows, self.uniform_base = self._base_facts()

    def _base_facts(self) -> tuple[bool, bool]:
        """Whether the base holds resources, and whether they all have the same lastUpdated (true of
        worlds: loaded at one instant). Asked once per base file, not at every fork (0.2 ms of a 1.3 ms
        fork): the file is immutable, and its size, mtime and inode name the version seen."""
        key = None
        if self.base is not None:
            st = self.base.stat()
            key = (str(self.base), st.st_size, st.st_mtime_ns, st.st_ino)
            if key in _BASE_FACTS:
                return _BASE_FACTS[key]
        rows = self.conn.execute("SELECT EXISTS (SELECT 1 FROM base.resources)").fetchone()[0] == 1
        uniform = rows and self.conn.execute(  # two subqueries: SQLite's min/max shortcut (one index lookup each)
            "SELECT (SELECT min(last_updated) FROM base.resources) = (SELECT max(last_updated) FROM base.resources)"
        ).fetchone()[0] == 1
        if key is not None:
            _BASE_FACTS[key] = (rows, uniform)
        return rows, uniform

    def _connect(self, layer: bytes | None, durable: bool = True) -> sqlite3.Connection:
        """A connection with the layer (``layer``: a serialized one; else empty, or the file at ``path``)
        and the base attached."""
        conn = sqlite3.connect(
            str(self.path) if self.path else ":memory:",
            isolation_level=None,
            check_same_thread=False,
            cached_statements=1024,
        )
        if layer is not None:
            conn.deserialize(layer)
        elif self.path is None:
            conn.deserialize(_empty_layer())
        else:
            if durable:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                # a large transaction spills SQLite's default 2 MB page cache into the WAL mid-way; 64 MB
                # (allocated as used) keeps it in memory: 4,000 created Patients in one transaction took
                # 2.4 s of CPU instead of 3.1 (in memory: 2.5)
                conn.execute("PRAGMA cache_size=-65536")
            else:  # a scratch file (e.g. a world being built, discarded on failure): no journal, no fsync
                conn.execute("PRAGMA journal_mode=OFF")
                conn.execute("PRAGMA synchronous=OFF")
                conn.execute(f"PRAGMA cache_size={SCRATCH_CACHE}")
            for stmt in _schema():
                conn.execute(stmt)
        self._attach_base(conn)
        return conn

    def _attach_base(self, conn: sqlite3.Connection) -> None:
        if self.base is not None:
            conn.execute("ATTACH DATABASE ? AS base", ("file:" + str(self.base) + "?mode=ro&immutable=1",))
            conn.execute(f"PRAGMA base.mmap_size={BASE_MMAP}")
        else:
            conn.execute("ATTACH DATABASE ':memory:' AS base")
            for stmt in _schema("base"):
                conn.execute(stmt)
        conn.set_progress_handler(self._progress, 20_000)

    def _progress(self) -> bool:
        return self.interrupt is not None and self.interrupt()

    @property
    def concurrent_reads(self) -> bool:
        """Whether :meth:`reader` gives reads their own connection: a durable file layer (WAL), whose
        readers see the last committed state while a write is under way."""
        return self.path is not None and not self.scratch

    @contextlib.contextmanager
    def reading(self, wait: float | None = None, stop: Callable[[], bool] | None = None) -> Iterator[Store]:
        """A read-only view of this store inside one read transaction (see :attr:`concurrent_reads`): every
        statement made through it sees the state committed when its first one ran, never a write in
        progress, and none waits for the writer.

        The view's connection comes from a pool of at most :attr:`max_readers`, opened as needed and
        kept for the next request (not tied to a thread: threads come and go, their connections stayed
        open). Raises :class:`Unavailable` when none is free within ``wait`` seconds (None: as long as it
        takes; ``stop()`` true ends the wait too) or a new one cannot be opened."""
        view = self._checkout(wait, stop)
        try:
            view.conn.execute("BEGIN")
        except sqlite3.Error as exc:
            self._checkin(view, False)
            raise Unavailable(f"a reader connection failed: {exc}") from exc
        view._depth = 1  # a batch's per-entry transactions become savepoints of this read
        try:
            yield view
        finally:
            view._depth = 0
            healthy = False  # whether the read ended cleanly, so that the connection may serve the next one
            with contextlib.suppress(sqlite3.Error):
                if view.conn.in_transaction:
                    view.conn.execute("ROLLBACK")  # nothing to keep: the view writes nothing
                healthy = True
            self._checkin(view, healthy)

    def _checkout(self, wait: float | None, stop: Callable[[], bool] | None) -> Store:
        if not self.concurrent_reads:
            raise ValueError("concurrent reads need a durable file-backed store (WAL)")
        limit = None if wait is None else time.monotonic() + wait
        with self._pool:
            while not self._idle and self._open_readers >= self.max_readers:
                left = None if limit is None else limit - time.monotonic()
                if (left is not None and left <= 0) or (stop is not None and stop()):
                    raise Unavailable(f"all {self.max_readers} reader connections stayed busy")
                self._pool.wait(0.1 if left is None else min(left, 0.1))
            if self._idle:
                view = self._idle.pop()
                view.interrupt = self.interrupt  # the server's deadline check, set after the store was made
                return view
            self._open_readers += 1
        try:
            return self._open_reader()
        except BaseException as exc:
            with self._pool:
                self._open_readers -= 1
                self._pool.notify()
            if isinstance(exc, sqlite3.Error | OSError | MemoryError):
                raise Unavailable(f"no reader connection could be opened: {exc}") from exc
            raise

    def _checkin(self, view: Store, healthy: bool) -> None:
        """Back to the pool; a connection whose read could not end cleanly is closed instead."""
        if not healthy:
            with contextlib.suppress(sqlite3.Error):
                view.conn.close()
        with self._pool:
            if healthy:
                self._idle.append(view)
            else:
                self._open_readers -= 1
            self._pool.notify()

    def _open_reader(self) -> Store:
        view = object.__new__(Store)
        view.base, view.path, view.scratch = self.base, self.path, False
        view.lock, view._depth = threading.RLock(), 0
        view.max_readers, view._idle, view._open_readers, view._pool = 0, [], 0, threading.Condition()
        view._base_rows, view.uniform_base = self._base_rows, self.uniform_base
        view.interrupt = self.interrupt
        conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                               cached_statements=1024)
        try:
            view._attach_base(conn)
            conn.execute("PRAGMA query_only=1")
        except BaseException:
            conn.close()
            raise
        view.conn = conn
        return view

    def reader_count(self) -> int:
        """Reader connections open now (idle or in use): at most :attr:`max_readers`."""
        with self._pool:
            return self._open_readers

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        with self._pool:
            idle, self._idle = self._idle, []
            self._open_readers -= len(idle)
        for view in idle:
            view.conn.close()
        with self.lock:
            self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self) -> Snapshot:
        """Immutable state of this store (cost: the size of its layer)."""
        with self.lock:
            if self.path is not None:
                raise ValueError("snapshot() of a file-backed store: export() it to a new base file")
            if self._depth:
                raise RuntimeError("snapshot inside a transaction")
            return Snapshot(self.base, self.conn.serialize())

    def fork(self) -> Store:
        """A new independent store with this store's current state."""
        return self.snapshot().open()

    def reset(self, snapshot: Snapshot | None = None) -> None:
        """Return to ``snapshot`` (default: the bare base). Costs what was written since."""
        with self.lock:
            if self._depth:
                raise RuntimeError("reset inside a transaction")
            if self.path is not None:
                raise ValueError("reset of a file-backed store is not supported")
            if snapshot is not None and snapshot.base != self.base:
                raise ValueError("reset to a snapshot of another base: open that snapshot instead")
            if snapshot is not None and snapshot.layer is not None:
                # a new connection, not deserialize() into this one: SQLite 3.40 keeps pointers into the
                # replaced schema for the eponymous virtual tables (json_each) a connection has used, and
                # a later statement read freed memory (valgrind; a crash in the test suite)
                fresh = self._connect(snapshot.layer)
                self.conn.close()
                self.conn = fresh
                return
            self.conn.execute("BEGIN")
            for table in ("resources", "history", "meta", *CURRENT_TABLES):
                self.conn.execute(f"DELETE FROM main.{table}")
            self.conn.execute("COMMIT")

    def export(self, path: str | os.PathLike) -> None:
        """Write the merged state (base + layer) as a standalone base file (atomic replace)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".part", dir=target.parent)
        os.close(fd)
        try:
            # tables first, indexes after the rows are in: one sorted build per index, not row-by-row
            out = sqlite3.connect(tmp, isolation_level=None)
            create_tables(out)
            out.close()
            with self.lock:
                self.conn.execute("ATTACH DATABASE ? AS dest", (tmp,))
                try:
                    # a fresh file that is discarded on failure needs no journal or fsyncs
                    self.conn.execute("PRAGMA dest.journal_mode=OFF")
                    self.conn.execute("PRAGMA dest.synchronous=OFF")
                    self.conn.execute("BEGIN")
                    cols = "rtype, id, version, last_updated, method, deleted, json"
                    self.conn.execute(
                        f"INSERT INTO dest.resources SELECT {cols} FROM main.resources UNION ALL "
                        f"SELECT {cols} FROM base.resources b WHERE {_SHADOW}"
                    )
                    self.conn.execute("INSERT INTO dest.history SELECT * FROM base.history UNION ALL "
                                      "SELECT * FROM main.history")
                    self.conn.execute(
                        "INSERT INTO dest.history SELECT rtype, id, version, last_updated, method, json "
                        f"FROM base.resources b WHERE NOT {_SHADOW}"
                    )
                    for table in CURRENT_TABLES:
                        self.conn.execute(f"INSERT INTO dest.{table} {merged(table)}")
                    self.conn.execute("INSERT OR REPLACE INTO dest.meta SELECT * FROM base.meta")
                    self.conn.execute("INSERT OR REPLACE INTO dest.meta SELECT * FROM main.meta")
                    self.conn.execute("COMMIT")
                except BaseException:
                    self.conn.execute("ROLLBACK")
                    raise
                finally:
                    self.conn.execute("DETACH DATABASE dest")
            fin = sqlite3.connect(tmp, isolation_level=None)
            fin.execute("PRAGMA journal_mode=OFF")
            fin.execute("PRAGMA synchronous=OFF")
            create_indexes(fin, base=True)
            _analyze(fin)
            fin.close()
            _publish(Path(tmp), target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def finish(self, path: str | os.PathLike) -> None:
        """Make this file-backed store's own file the base file at ``path`` and close the store.

        What :meth:`export` gives, without copying: for a store that was filled from empty (a world
        build), whose file already is the merged state. Statistics are gathered, the file is synced and
        renamed over ``path`` atomically.
        """
        with self.lock:
            if self.path is None or self._base_rows or self._depth:
                raise ValueError("finish() needs a file-backed store on an empty base, outside a transaction")
            _analyze(self.conn)
            self.conn.close()
            _publish(self.path, Path(path))

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """A transaction for large loads: secondary indexes are dropped and rebuilt once at the end.

        Building an index once from sorted data is several times faster than maintaining it row by
        row; this is what makes world builds and bulk loads fast. Atomic like :meth:`transaction`.
        """
        with self.lock:
            if self._depth:
                raise RuntimeError("bulk() cannot nest inside a transaction")
            with self.transaction():
                self._drop_indexes()
                try:
                    yield
                finally:
                    create_indexes(self.conn, base=self.scratch)

    def _drop_indexes(self) -> None:
        """Drop the layer's secondary indexes (not the automatic ones of UNIQUE constraints)."""
        names = [r[0] for r in self.conn.execute(
            "SELECT name FROM main.sqlite_master WHERE type = 'index' AND sql IS NOT NULL")]
        for name in names:
            self.conn.execute(f"DROP INDEX main.{name}")

    def can_share_bulk(self) -> bool:
        """Whether :meth:`shared_bulk` applies: an empty scratch store, outside a transaction."""
        with self.lock:
            return self.scratch and not self._depth and not self._base_rows and not self.conn.execute(
                "SELECT EXISTS (SELECT 1 FROM main.resources) OR EXISTS (SELECT 1 FROM main.history)").fetchone()[0]

    @contextlib.contextmanager
    def shared_bulk(self) -> Iterator[Path]:
        """A bulk load of an empty scratch store whose rows other processes write into its file.

        Yields the file. Used by world builds: bulk workers insert straight into it, one chunk at a
        time in input order, which spares copying every row from their own files (:meth:`copy_in`: 7 s
        of a 100-patient world). Not one transaction: on an exception every row is deleted again,
        which leaves the store as it was since it was empty. Indexes are dropped first and built at the
        end, as in :meth:`bulk`.
        """
        with self.lock:
            if not self.can_share_bulk():
                raise ValueError("shared_bulk() needs an empty scratch store (durable=False), outside a transaction")
            with self.transaction():
                self._drop_indexes()
            try:
                yield self.path  # type: ignore[misc]  # scratch: file-backed
            except BaseException:
                with self.transaction():
                    for table in ("resources", "history", *CURRENT_TABLES):
                        self.conn.execute(f"DELETE FROM main.{table}")
                raise
            finally:
                with self.transaction():
                    create_indexes(self.conn, base=True)

    # -- transactions ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Atomic unit of work; nests through savepoints. Rolls back on any exception."""
        with self.lock:
            name = f"sp{self._depth}"
            self.conn.execute("BEGIN" if self._depth == 0 else f"SAVEPOINT {name}")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if not self.conn.in_transaction:
                    raise  # SQLite already rolled back (e.g. disk full): the original error is the one to see
                if self._depth == 0:
                    self.conn.execute("ROLLBACK")
                else:
                    self.conn.execute(f"ROLLBACK TO {name}")
                    self.conn.execute(f"RELEASE {name}")
                raise
            else:
                self._depth -= 1
                self.conn.execute("COMMIT" if self._depth == 0 else f"RELEASE {name}")

    # -- reads -------------------------------------------------------------------------------------
    def current(self, rtype: str, rid: str) -> tuple[int, str, bool, bytes | None] | None:
        """(version, last_updated, deleted, json) of the latest version, or None if never existed."""
        with self.lock:
            for schema in ("main", "base"):
                row = self.conn.execute(
                    f"SELECT version, last_updated, deleted, json FROM {schema}.resources WHERE rtype=? AND id=?",
                    (rtype, rid),
                ).fetchone()
                if row is not None:
                    return row[0], row[1], bool(row[2]), row[3]
        return None

    def versions(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Latest version number of each (type, id) that was ever stored (deleted ones included)."""
        out: dict[tuple[str, str], int] = {}
        with self.lock:
            for schema in ("base", "main"):  # main last: the layer's version wins
                if not self.conn.execute(f"SELECT 1 FROM {schema}.resources LIMIT 1").fetchone():
                    continue
                for start in range(0, len(keys), 400):
                    chunk = keys[start : start + 400]
                    cond = " OR ".join(["(rtype = ? AND id = ?)"] * len(chunk))
                    args = [x for key in chunk for x in key]
                    for rtype, rid, version in self.conn.execute(
                        f"SELECT rtype, id, version FROM {schema}.resources WHERE {cond}", args
                    ):
                        out[(rtype, rid)] = version
        return out

    def layer_versions(self) -> dict[tuple[str, str], tuple[int, bool]]:
        """(version, deleted) of every resource this store's layer holds: what it wrote on top of its base.

        Two calls bracket an episode; the keys whose entry changed are exactly what the episode wrote
        (see ``fhirgym.tasks`` for the diff built on it). Costs the size of the layer, not of the world.
        """
        rows = self.query("SELECT rtype, id, version, deleted FROM main.resources")
        return {(r[0], r[1]): (r[2], bool(r[3])) for r in rows}

    def base_version(self, rtype: str, rid: str) -> tuple[int, bytes | None] | None:
        """(version, json) of a resource in the read-only base, ignoring the layer."""
        rows = self.query("SELECT version, json FROM base.resources WHERE rtype=? AND id=? AND deleted=0", (rtype, rid))
        return (rows[0][0], rows[0][1]) if rows else None

    def version(self, rtype: str, rid: str, version: int) -> tuple[str, str, bytes | None] | None:
        """(last_updated, method, json) of one stored version, or None."""
        rows = self.query(
            f"SELECT last_updated, method, json FROM ({history_sql('rtype=? AND id=? AND version=?')})",
            (rtype, rid, version) * 4,
        )
        return rows[0] if rows else None

    def sides(self) -> tuple[str, ...]:
        """The schemas that hold resources, for :func:`merged`: both, or the one that is not empty.

        Asked afresh each time (a few microseconds): any write to the layer, deletes included, adds a
        ``main.resources`` row, so an empty layer table means there is nothing to union or shadow.
        """
        with self.lock:
            layer = self.conn.execute("SELECT EXISTS (SELECT 1 FROM main.resources)").fetchone()[0] == 1
        if layer and self._base_rows:
            return BOTH
        return ("base",) if self._base_rows else ("main",)

    def query(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    def referrers(self, rtype: str, rid: str, limit: int | None = 20) -> list[tuple[str, str]]:
        """Other current resources holding a reference to rtype/rid (``limit`` None: all of them)."""
        sql = f"SELECT DISTINCT rtype, id FROM ({merged('refs', 'target_type=? AND target_id=?')})"
        rows = self.query(sql + " WHERE NOT (rtype=? AND id=?) LIMIT ?",
                          (rtype, rid, rtype, rid, rtype, rid, -1 if limit is None else limit))
        return [(r[0], r[1]) for r in rows]

    def exists(self, rtype: str, rid: str) -> bool:
        cur = self.current(rtype, rid)
        return cur is not None and not cur[2]

    def iter_current(self, batch: int = 2000) -> Iterator[tuple[str, str, bytes]]:
        """Every live resource as (type, id, stored JSON), in (type, id) order, fetched ``batch`` at a time
        (a whole 100-patient world does not fit in memory at once)."""
        after = ("", "")
        while True:
            rows = self.query(f"SELECT rtype, id, json FROM ({merged('resources')}) WHERE (rtype, id) > (?, ?) "
                              "ORDER BY rtype, id LIMIT ?", (*after, batch))
            yield from rows
            if len(rows) < batch:
                return
            after = (rows[-1][0], rows[-1][1])

    def counts(self) -> dict[str, int]:
        """Number of live resources per type."""
        return dict(self.query(f"SELECT rtype, count(*) FROM ({merged('resources')}) GROUP BY rtype ORDER BY rtype"))

    def get_meta(self, key: str) -> str | None:
        rows = self.query(
            "SELECT value FROM main.meta WHERE key=? UNION ALL SELECT value FROM base.meta WHERE key=?", (key, key)
        )
        return rows[0][0] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self.lock:
            self.conn.execute("INSERT OR REPLACE INTO main.meta VALUES (?, ?)", (key, value))

    # -- writes ------------------------------------------------------------------------------------
    def write(self, records: list[Record]) -> None:
        """Store new current versions (``body`` None = delete) with their index rows and edges.

        Batched: one ``executemany`` per table for the whole list, which is what makes bulk loads fast.
        """
        conn = self.conn
        moved = [(r.rtype, r.id) for r in records if r.version > 1]
        with self.lock:
            if moved:
                conn.executemany(
                    "INSERT OR IGNORE INTO main.history SELECT rtype, id, version, last_updated, method, json "
                    "FROM main.resources WHERE rtype=? AND id=?",
                    moved,
                )
                for table in CURRENT_TABLES:
                    conn.executemany(f"DELETE FROM main.{table} WHERE rtype=? AND id=?", moved)
            insert_records(conn, records)

    def copy_in(self, pieces: list[tuple[Path, dict[str, tuple[int, int]]]]) -> None:
        """Add rows that bulk workers wrote into their own files (:func:`insert_records`), as one bulk load.

        ``pieces``: (file, {table: (first rowid, last rowid)}) of each chunk, in input order, so rows land
        in the order a serial load gives (the same world file, whichever worker took which chunk). The
        copy is ``INSERT ... SELECT`` inside SQLite: the rows never pass through Python here. A copied
        resource supersedes the layer's version of it as in :meth:`write`. At most 8 distinct files
        (SQLite attaches at most 10 databases).
        """
        files = list(dict.fromkeys(path for path, _ in pieces))
        names = {path: f"bulk{n}" for n, path in enumerate(files)}
        with self.lock:
            for path, name in names.items():
                self.conn.execute(f"ATTACH DATABASE ? AS {name}", (str(path),))
            try:
                with self.bulk():
                    for path, ranges in pieces:
                        self._copy_piece(names[path], ranges)
            finally:
                for name in names.values():
                    self.conn.execute(f"DETACH DATABASE {name}")

    def _copy_piece(self, name: str, ranges: dict[str, tuple[int, int]]) -> None:
        conn = self.conn
        lo, hi = ranges["resources"]
        later = f"FROM {name}.resources WHERE rowid BETWEEN {lo} AND {hi} AND version > 1"  # later versions
        if conn.execute(f"SELECT EXISTS (SELECT 1 {later})").fetchone()[0]:
            conn.execute(  # in the chunk's order, as write() moves them
                "INSERT OR IGNORE INTO main.history SELECT m.rtype, m.id, m.version, m.last_updated, m.method, m.json "
                f"FROM {name}.resources w JOIN main.resources m ON m.rtype = w.rtype AND m.id = w.id "
                f"WHERE w.rowid BETWEEN {lo} AND {hi} AND w.version > 1 ORDER BY w.rowid")
            for table in CURRENT_TABLES:
                conn.execute(f"DELETE FROM main.{table} WHERE (rtype, id) IN (SELECT rtype, id {later})")
        for table in ("resources", *CURRENT_TABLES):
            if table in ranges:
                lo, hi = ranges[table]
                verb = "INSERT OR REPLACE" if table == "resources" else "INSERT"
                conn.execute(f"{verb} INTO main.{table} SELECT * FROM {name}.{table} WHERE rowid BETWEEN {lo} AND {hi}")


def _analyze(conn: sqlite3.Connection) -> None:
    """Planner statistics for a base file. Sampled (``analysis_limit``): a full ANALYZE reads every index
    of a 100-patient world (3 s); the planner needs their shape, not exact counts."""
    conn.execute("PRAGMA analysis_limit=2000")
    conn.execute("ANALYZE")
    conn.commit()


def _publish(tmp: Path, target: Path) -> None:
    """The one fsync, then the rename: ``target`` is either the old file or the complete new one."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def create_tables(conn: sqlite3.Connection) -> None:
    """The store's tables without their indexes: a file that bulk workers fill for :meth:`Store.copy_in`,
    or an exported base before its rows are in."""
    for stmt in _schema():
        if stmt.startswith("CREATE TABLE"):
            conn.execute(stmt)


def create_indexes(conn: sqlite3.Connection, base: bool = False) -> None:
    """The store's indexes, built once the rows are in (one sorted build each, not row by row); ``base``:
    those of a base file (see :data:`BASE_RES_INDEXES`)."""
    for stmt in _schema(base=base):
        if stmt.startswith("CREATE INDEX"):
            conn.execute(stmt)


def insert_records(conn: sqlite3.Connection, records: list[Record]) -> None:
    """Insert the rows of ``records`` into ``main`` (what :meth:`Store.write` does once older versions
    are moved aside): table by table, in record order."""
    res_rows: list = []
    index_rows: dict[str, list] = {t: [] for t in INDEX_TABLES}
    ref_rows: list = []
    for r in records:
        data = r.data if r.data is not None else r.body if isinstance(r.body, bytes) or r.body is None \
            else dumps(r.body)
        res_rows += (r.rtype, r.id, r.version, r.last_updated, r.method, 0 if r.body is not None else 1, data)
        key = (r.rtype, r.id)
        for table, rows in r.index.items():
            out = index_rows[table]
            for row in rows:
                out += key
                out += row
        for target in r.refs:
            ref_rows += key
            ref_rows += target
    _insert_flat(conn, "INSERT OR REPLACE INTO main.resources", 7, res_rows)
    # the tables in CURRENT_TABLES order, as copy_in fills them: the same file either way
    _insert_flat(conn, "INSERT INTO main.refs", 4, ref_rows)
    for table, flat in index_rows.items():
        _insert_flat(conn, f"INSERT INTO main.{table}", 2 + len(INDEX_TABLES[table]) + 1, flat)


#: Rows per INSERT statement. Many rows per statement cost 30 % less per row than ``executemany``
#: (one statement step per row, each bound separately); SQLite takes up to 32,766 parameters.
_ROWS_PER_INSERT = 200


def _insert_flat(conn: sqlite3.Connection, head: str, width: int, flat: list) -> None:
    """Insert rows of ``width`` columns given as one flat list of values."""
    n = len(flat) // width
    full = n - n % _ROWS_PER_INSERT
    if full:
        sql = f"{head} VALUES " + ",".join(["(" + ",".join("?" * width) + ")"] * _ROWS_PER_INSERT)
        step = _ROWS_PER_INSERT * width
        for start in range(0, full * width, step):
            conn.execute(sql, flat[start : start + step])
    if n > full:
        marks = "(" + ",".join("?" * width) + ")"
        conn.executemany(f"{head} VALUES {marks}",
                         [flat[k : k + width] for k in range(full * width, n * width, width)])


@dataclass(slots=True)
class Record:
    """One new version of a resource as the store keeps it."""

    rtype: str
    id: str
    version: int
    last_updated: str
    method: str  # POST | PUT | DELETE
    body: dict | bytes | None  # bytes: already serialised JSON
    index: dict[str, list[tuple]] = field(default_factory=dict)
    refs: list[tuple[str, str]] = field(default_factory=list)
    data: bytes | None = None  # ``body`` serialised, when the writer already has it


_EMPTY_LAYER: bytes | None = None
#: (base file, size, mtime, inode) → :meth:`Store._base_facts`
_BASE_FACTS: dict[tuple, tuple[bool, bool]] = {}


def _empty_layer() -> bytes:
    """Serialized empty layer schema, built once: deserializing it is faster than running DDL."""
    global _EMPTY_LAYER
    if _EMPTY_LAYER is None:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        for stmt in _schema():
            conn.execute(stmt)
        _EMPTY_LAYER = conn.serialize()
        conn.close()
    return _EMPTY_LAYER
