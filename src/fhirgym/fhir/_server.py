"""The FHIR R4 REST semantics, independent of HTTP: ``FhirServer.handle(Request) -> Response``.

The ASGI app and the in-process client both call :meth:`FhirServer.handle`, so a request takes the
same code path whether or not it crossed a socket. Every failure becomes an OperationOutcome with a
precise 4xx status (one error path, see :mod:`._errors`); a 5xx means a bug in fhirgym. Routing is
the table in :mod:`._routes`, the interactions live in ``ops/``, writes in :mod:`._write`.
"""

from __future__ import annotations

import copy
import logging
import time

from . import _bulk, _routes
from . import _write as write
from ._core import ServerCore
from ._errors import FhirError, Issue, operation_outcome
from ._http import Request, Response
from ._store import Record, Unavailable
from .ops import search as search_op

log = logging.getLogger("fhirgym.fhir")


class FhirServer(ServerCore):
    """An R4 server over one :class:`Store`. Thread-safe (the store serialises access)."""

    def handle(self, req: Request) -> Response:
        """Serve one request; never raises. Within ``request_timeout`` seconds and ``max_response_bytes``.

        A request that writes takes the write turn (the store's one connection), waiting for it at most
        ``queue_timeout`` seconds (then 503 with ``Retry-After``); its time limit starts once it has it.
        A request that only reads, on a store with :attr:`~._store.Store.concurrent_reads`, takes a reader
        of the store instead (:meth:`~._store.Store.reading`): one read transaction, so all it reads is
        one committed state, and it is served while a long write runs."""
        try:
            reads = self.store.concurrent_reads and _routes.reads_only(self, req)
        except Exception:  # whatever is wrong with the request, serving it says so (as a write: to be safe)
            reads = False
        try:
            return self._read(req) if reads else self._write(req)
        except FhirError as err:  # no turn in time, or shutting down
            return Response(err.status, err.outcome(), dict(err.headers))

    def _read(self, req: Request) -> Response:
        try:
            with self.store.reading(self.config.queue_timeout, lambda: self.stopping) as reader:
                saved = self.begin_request()  # its time starts now that it has a reader
                try:
                    view = copy.copy(self)
                    view.store = reader
                    resp = self._serve(view, req)
                finally:
                    self.end_request(saved)
        except Unavailable as exc:
            if self.stopping:
                raise self.timeout_error() from None
            raise self.busy_error(f"No reader of the store was free: {exc}") from None
        self.capability = self.capability or view.capability  # computed once, kept by the server
        return resp

    def _write(self, req: Request) -> Response:
        wait = self.config.queue_timeout
        limit = None if wait is None else time.monotonic() + wait
        while not self._lock.acquire(timeout=0.1 if limit is None else max(0.0, min(0.1, limit - time.monotonic()))):
            if self.stopping:
                raise self.timeout_error()
            if limit is not None and time.monotonic() >= limit:
                raise self.busy_error(f"The request waited {wait} s (queue_timeout) for the writes before it")
        try:
            saved = self.begin_request()  # its time starts now that it has its turn
            try:
                return self._serve(self, req)
            finally:
                self.end_request(saved)
        finally:
            self._lock.release()

    def _serve(self, core: ServerCore, req: Request) -> Response:
        try:
            return core.dispatch(req)
        except FhirError as err:
            return Response(err.status, err.outcome(), dict(err.headers))
        except RecursionError:
            return Response(400, operation_outcome([Issue("error", "too-costly", "Request nested too deeply")]))
        except Exception as exc:  # a bug: still answer with an OperationOutcome, and log it
            if (timeout := self.as_timeout(exc)) is not None:  # SQLite interrupted a request out of time
                return Response(timeout.status, timeout.outcome())
            log.exception("internal error serving %s %s", req.method, req.path)
            return Response(500, operation_outcome([Issue("fatal", "exception", f"Internal error: {exc!r}")]))

    def dispatch(self, req: Request) -> Response:
        return _routes.dispatch(self, req)

    # -- the Python API: what the REST interactions do, without HTTP -------------------------------------
    def create(self, rtype: str, body: dict, rid: str | None = None, pending: set | None = None) -> Record:
        """Validate, assign id/meta, check references and store a new resource."""
        return write.create(self, rtype, body, rid, pending)

    def update(self, rtype: str, rid: str, body: dict, if_match: int | None = None, pending: set | None = None
               ) -> tuple[Record, bool]:
        """Store a new version (or create with the client's id). Returns (record, created)."""
        return write.update(self, rtype, rid, body, if_match, pending)

    def delete(self, rtype: str, rid: str, if_match: int | None = None, cascade: bool = False,
               deleting: set[tuple[str, str]] | None = None, check_referrers: bool = True) -> Record | None:
        """Delete (a new 'deleted' version); see :func:`._write.delete`."""
        return write.delete(self, rtype, rid, if_match, cascade, deleting, check_referrers)

    def search(self, rtype: str, query: list[tuple[str, str]], lenient: bool = False, raw: bool = False) -> dict:
        """Search and return the searchset Bundle (first page); ``raw``: see :attr:`Request.raw`."""
        return search_op.search(self, rtype, query, lenient, raw)

    def load(self, resources: list[dict], validate: bool = True, workers: int = 1) -> list[Issue]:
        """Bulk-load resources (keeping their ids) in one transaction; see :func:`._bulk.load`."""
        return _bulk.load(self, resources, validate, workers)
