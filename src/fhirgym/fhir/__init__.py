"""The embedded FHIR R4 server: storage, search, validation, snapshots, REST app and clients.

A world is a read-only SQLite *base*; ``Snapshot(base).open()`` gives an isolated writable store in about a millisecond,
and ``store.reset(snapshot)`` returns it to that state. Typical use (more in docs/SERVER.md)::

    from fhirgym.fhir import FhirServer, InProcessClient, Store
    server = FhirServer(Store())                     # empty in-memory store
    client = InProcessClient(server)
    client.create({"resourceType": "Patient", "name": [{"family": "Diaz"}]})
"""

from ._asgi import create_app, http_protocol, run_server
from ._client import FhirClient, HttpClient, InProcessClient, TransportError
from ._core import ServerConfig
from ._errors import FhirError, Issue, operation_outcome
from ._http import Request, Response
from ._json import FhirDecimal, json_default, json_default_str
from ._json import dumps as dumps_json
from ._json import loads as loads_json
from ._refs import rewrite_references
from ._server import FhirServer
from ._store import Record, Snapshot, Store

__all__ = [
    "FhirClient",
    "FhirDecimal",
    "FhirError",
    "FhirServer",
    "HttpClient",
    "InProcessClient",
    "Issue",
    "Record",
    "Request",
    "Response",
    "ServerConfig",
    "Snapshot",
    "Store",
    "TransportError",
    "create_app",
    "dumps_json",
    "http_protocol",
    "json_default",
    "json_default_str",
    "loads_json",
    "operation_outcome",
    "rewrite_references",
    "run_server",
]
