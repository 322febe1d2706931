"""What every interaction works with: the store, the spec's compiled components, the configuration,
ids and the clock, and the page cache.

:class:`ServerCore` is the server minus its routes: the operation modules (``ops/``), the write
pipeline and bulk loads take it, and :class:`~._server.FhirServer` adds the route table on top, so
no module below the router needs to import the server.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..spec import Spec, load_spec
from ._errors import FhirError
from ._http import Request, Response, format_instant
from ._search import SearchEngine
from ._store import Store

#: seconds a client is asked to wait (``Retry-After``) when the server is too busy to take its request
RETRY_AFTER = 2


@dataclass
class ServerConfig:
    """Behaviour switches of the embedded server (defaults match a strict, careful R4 server)."""

    base_url: str = "http://localhost:8080/fhir"
    validate: bool = True
    #: with ``validate``: also the error-level FHIRPath invariants (``per-1`` ...; see ``_invariants.py``)
    invariants: bool = True
    referential_integrity: bool = True
    max_body_bytes: int = 16 * 1024 * 1024
    default_count: int = 50
    max_count: int = 1000
    lenient_search: bool = False  # default handling of unknown search params (Prefer: handling=...)
    id_seed: int | None = None  # deterministic server-assigned ids when set
    clock: Callable[[], datetime] | None = None  # frozen clock for tasks; None = wall clock
    #: result lists kept for paging, counted in ids (least recently used go first). A page whose list was
    #: dropped is still served: its stateless token re-runs the request (see :mod:`._paging`)
    page_cache_ids: int = 1_000_000
    #: resources a ``_cascade=delete`` may delete besides its target; beyond it nothing is deleted (409)
    max_cascade_delete: int = 10_000
    #: entries of one batch or transaction Bundle (413 beyond)
    max_bundle_entries: int = 50_000
    #: stored JSON one response may carry (a page, a history, a batch of searches): beyond it that
    #: request (or batch entry) is refused with an OperationOutcome instead of building the response
    max_response_bytes: int = 32 * 1024 * 1024
    #: seconds one request may run (None: no limit); beyond it it stops, a transaction rolls back, and
    #: the rest of a batch is answered "not processed"
    request_timeout: float | None = 30.0
    #: resources ``_include`` / ``_revinclude`` may add to one page (``:iterate`` over ``*`` can reach a
    #: whole world); beyond it the page says so in an OperationOutcome entry, as HAPI caps its includes
    max_includes: int = 1000
    #: seconds a request may wait for its turn (a write for the writes before it, a read for a free reader)
    #: before it is answered 503 with ``Retry-After`` (None: as long as it takes); ``request_timeout``
    #: counts from when it has its turn
    queue_timeout: float | None = 30.0
    #: requests that only read served at once on a file-backed store, each on its own reader connection
    #: (beyond it they wait their turn, as above); over HTTP, also the worker threads for them
    read_workers: int = 8
    #: over HTTP, seconds a client has to send a request's head (from connecting, or from its first byte
    #: after a response): a connection that does not is closed, with a 408 if it had begun (None: no limit)
    header_timeout: float | None = 10.0
    #: over HTTP, seconds a client has to send a request's body once its head is in (408 beyond)
    body_timeout: float | None = 60.0


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


class ServerCore:
    """An R4 server's state over one :class:`Store`, without routing (see :class:`FhirServer`).

    A request that only reads is served by a shallow copy of the server whose store is a reader: state
    that requests change (the page cache and its count, the shutdown flag) lives in objects the copies
    share, never in a plain attribute that a copy would rebind."""

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
        #: remembered result lists by paging token (see :mod:`._paging`), guarded by ``pages_lock``
        self.pages: OrderedDict[str, dict] = OrderedDict()
        self.pages_lock = threading.Lock()
        self._held = [0]  # ids in ``pages``: in a list, shared with the views a read runs on
        self._lock = threading.RLock()
        self._budget = threading.local()  # the running request's deadline and response bytes, per thread
        self._shutdown = threading.Event()  # shared with the views a read runs on (shallow copies)
        store.interrupt = self.past_deadline
        store.max_readers = self.config.read_workers
        self.capability: dict | None = None
        self.ref_cache: dict[str, tuple[str, str] | None] = {}  # reference string -> local target
        self.admin_snapshot = None  # used only by the optional admin HTTP routes

    @property
    def pages_held(self) -> int:
        """Ids in :attr:`pages` (guarded by ``pages_lock``)."""
        return self._held[0]

    @pages_held.setter
    def pages_held(self, value: int) -> None:
        self._held[0] = value

    @property
    def stopping(self) -> bool:
        """Set on shutdown: running requests stop at their next check (the readers' views see it too)."""
        return self._shutdown.is_set()

    @stopping.setter
    def stopping(self, value: bool) -> None:
        if value:
            self._shutdown.set()
        else:
            self._shutdown.clear()

    @property
    def base(self) -> str:
        return self.config.base_url.rstrip("/")

    def new_id(self) -> str:
        if self._rng is None:
            return str(uuid.uuid4())
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def timestamp(self) -> str:
        now = (self.config.clock() if self.config.clock else datetime.now(UTC)).timestamp()
        # strictly increasing, so history order is total. In whole milliseconds: float steps of 0.001
        # can land just below a millisecond and print the previous one again (frozen clocks hit this).
        ms = max(round(now * 1000), round(self._last_ts * 1000) + 1)
        self._last_ts = ms / 1000
        return format_instant(self._last_ts)

    def dispatch(self, req: Request) -> Response:
        """Route one request to its operation (raises FhirError); the route table is the server's."""
        raise NotImplementedError("a ServerCore has no routes: use FhirServer")

    # -- per-request bounds: time and response size (docs/SERVER.md) ------------------------------------
    def begin_request(self) -> tuple:
        """Start the clock and the response budget of a request served by this thread; returns what
        :meth:`end_request` restores (a request served inside another keeps the outer one's bounds after)."""
        saved = (getattr(self._budget, "deadline", None), getattr(self._budget, "spent", 0))
        timeout = self.config.request_timeout
        self._budget.deadline = time.monotonic() + timeout if timeout is not None else None
        self._budget.spent = 0
        return saved

    def end_request(self, saved: tuple) -> None:
        """Outside requests (the Python API, bulk loads) there is no deadline."""
        self._budget.deadline, self._budget.spent = saved

    def past_deadline(self) -> bool:
        """Whether the running request must stop (its time is up, or the server is shutting down); also
        SQLite's progress handler, which interrupts a statement when it says so."""
        if self.stopping:
            return True
        deadline = getattr(self._budget, "deadline", None)
        return deadline is not None and time.monotonic() > deadline

    def check_time(self) -> None:
        """Raise the request's timeout error when it must stop (called between units of work)."""
        if self.past_deadline():
            raise self.timeout_error()

    def timeout_error(self) -> FhirError:
        if self.stopping:
            return FhirError(503, "The server is shutting down; the request was not completed", "transient")
        return FhirError(408, f"The request ran longer than the server's limit of {self.config.request_timeout} s "
                              "(request_timeout); nothing of an unfinished transaction was kept. Ask for less "
                              "(smaller Bundles, _count, fewer includes)", "timeout")

    @staticmethod
    def busy_error(why: str) -> FhirError:
        """503 for a request that could not get its turn: the client should come back shortly."""
        return FhirError(503, f"{why}; the server is busy, retry shortly", "transient",
                         headers={"Retry-After": str(RETRY_AFTER)})

    def as_timeout(self, exc: BaseException) -> FhirError | None:
        """The timeout error when ``exc`` is SQLite's interruption of a request that ran out of time."""
        if isinstance(exc, sqlite3.OperationalError) and "interrupt" in str(exc) and self.past_deadline():
            return self.timeout_error()
        return None

    def spend(self, nbytes: int) -> None:
        """Count stored JSON a response will carry; 413-like refusal (400, too-costly) past the limit."""
        spent = getattr(self._budget, "spent", 0) + nbytes
        self._budget.spent = spent
        limit = self.config.max_response_bytes
        if spent > limit:
            raise FhirError(400, f"The response would exceed the server's limit of {limit} bytes "
                                 "(max_response_bytes); ask for less (_count, _elements, fewer includes or Bundle "
                                 "entries)", "too-costly")
