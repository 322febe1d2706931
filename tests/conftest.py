"""Shared fixtures: fresh in-memory servers, and one small Synthea world generated once per session."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from fhirgym.fhir import FhirServer, InProcessClient, ServerConfig, Store

#: The frozen "now" of servers built with a clock (the ``ap`` prefix measures its tolerance from now).
FROZEN_NOW = datetime(2024, 6, 1, 12, 0, 0, tzinfo=UTC)


def new_client(config: ServerConfig | None = None, store: Store | None = None) -> InProcessClient:
    return InProcessClient(FhirServer(store or Store(), config=config))


@pytest.fixture()
def client() -> InProcessClient:
    """A client of a new, empty server (wall clock)."""
    return new_client()


@pytest.fixture()
def frozen_client() -> InProcessClient:
    """A client of a new, empty server whose clock is frozen at FROZEN_NOW (ids stay random)."""
    return new_client(ServerConfig(clock=lambda: FROZEN_NOW))


@pytest.fixture(scope="session")
def synthea_bundles() -> list[dict]:
    """Three Synthea patients as transaction Bundles (seeded: the same data every run), generated once."""
    from fhirgym.world import synthea_bundles as generate

    try:
        return generate(seed=11, patients=3)
    except RuntimeError as exc:
        if "not installed" in str(exc):
            pytest.skip(str(exc))
        raise


@dataclass
class SyntheaEntry:
    """One resource of a Synthea bundle and the id the server gave it."""

    bundle: int  # index of its bundle: urn:uuid references resolve within the same bundle
    full_url: str
    resource: dict
    server_id: str

    @property
    def rtype(self) -> str:
        return self.resource["resourceType"]


@dataclass
class SyntheaWorld:
    """A server loaded with the Synthea bundles, and how every bundle entry maps to a server id.

    The same fullUrl can occur in several bundles (shared organizations, practitioners, payors); each
    POST creates its own resource, so entries are keyed by (bundle, fullUrl).
    """

    client: InProcessClient
    bundles: list[dict]
    entries: list[SyntheaEntry] = field(default_factory=list)
    by_url: dict[tuple[int, str], SyntheaEntry] = field(default_factory=dict)

    def of_type(self, rtype: str) -> list[SyntheaEntry]:
        return [e for e in self.entries if e.rtype == rtype]

    def target(self, entry: SyntheaEntry, reference: dict | None) -> SyntheaEntry | None:
        """The entry a Reference of ``entry`` points to (Synthea writes urn:uuid references only)."""
        if not reference or "reference" not in reference:
            return None
        ref = reference["reference"]
        assert ref.startswith("urn:uuid:"), ref
        return self.by_url[(entry.bundle, ref)]


@pytest.fixture(scope="session")
def synthea_world(synthea_bundles) -> SyntheaWorld:
    """The Synthea bundles POSTed as transactions to one server. Read-only: tests must not write to it."""
    client = new_client()
    world = SyntheaWorld(client, synthea_bundles)
    for n, bundle in enumerate(synthea_bundles):
        resp = client.transaction(bundle)
        assert resp.status == 200, resp.body
        assert resp.body["type"] == "transaction-response"
        entries = resp.body["entry"]
        assert len(entries) == len(bundle["entry"])
        for req_entry, resp_entry in zip(bundle["entry"], entries):  # responses come in request order
            assert resp_entry["response"]["status"].startswith("201")
            rtype, rid = resp_entry["response"]["location"].split("/")[:2]
            assert rtype == req_entry["resource"]["resourceType"]
            entry = SyntheaEntry(n, req_entry["fullUrl"], req_entry["resource"], rid)
            world.entries.append(entry)
            world.by_url[(n, entry.full_url)] = entry
    return world


@pytest.fixture(scope="session")
def small_world_path():
    """The 10-patient demo world (seed 42): built once per machine, then cached."""
    from fhirgym.world import build_world

    return build_world(seed=42, patients=10).path


@pytest.fixture(scope="module")
def ex():
    """A search-index extractor over the R4 spec, one per test module (its failure counter too)."""
    from fhirgym.fhir._extract import Extractor
    from fhirgym.spec import load_spec

    return Extractor(load_spec())


@pytest.fixture()
def tcp_server():
    """A loopback server that counts the connections it accepts (it must get none)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.1)
    accepted: list[object] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                accepted.append(conn)
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join(2)
    srv.close()
