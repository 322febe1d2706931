"""What every interaction works with: the store, the spec's compiled components, the configuration,
ids and the clock, and the page cache.

:class:`ServerCore` is the server minus its routes: the operation modules (``ops/``), the write
pipeline and bulk loads take it, and :class:`~._server.FhirServer` adds the route table on top, so
no module below the router needs to import the server.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..spec import Spec, load_spec
from ._http import Request, Response, format_instant
from ._search import SearchEngine
from ._store import Store


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
    page_cache_size: int = 512
    #: resources ``_include`` / ``_revinclude`` may add to one page (``:iterate`` over ``*`` can reach a
    #: whole world); beyond it the page says so in an OperationOutcome entry, as HAPI caps its includes
    max_includes: int = 1000


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
    """An R4 server's state over one :class:`Store`, without routing (see :class:`FhirServer`)."""

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
        #: remembered result lists by paging token (see :mod:`._paging`)
        self.pages: OrderedDict[str, dict] = OrderedDict()
        self._lock = threading.RLock()
        #: bumped by every write, so a paging token never names a result list of an older state
        self.generation = 0
        self.capability: dict | None = None
        self.ref_cache: dict[str, tuple[str, str] | None] = {}  # reference string -> local target
        self.admin_snapshot = None  # used only by the optional admin HTTP routes

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
