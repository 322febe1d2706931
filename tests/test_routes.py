"""The route table: every handler is an operation module's, and /metadata advertises what it routes."""

from __future__ import annotations

from fhirgym.fhir._routes import NOT_ALLOWED, ROUTES
from fhirgym.fhir.ops.metadata import INTERACTIONS

#: the route of each type-level interaction a CapabilityStatement can advertise
_INTERACTION_ROUTES = {
    "read": ("GET", "{type}/{id}"),
    "vread": ("GET", "{type}/{id}/_history/{vid}"),
    "update": ("PUT", "{type}/{id}"),
    "delete": ("DELETE", "{type}/{id}"),
    "history-instance": ("GET", "{type}/{id}/_history"),
    "history-type": ("GET", "{type}/_history"),
    "create": ("POST", "{type}"),
    "search-type": ("GET", "{type}"),
}


def _routed() -> set[tuple[str, str]]:
    return {(m, r.pattern) for r in ROUTES for m in r.methods.split("|")}


def test_metadata_advertises_exactly_the_routed_interactions():
    routed = _routed()
    assert {i for i, route in _INTERACTION_ROUTES.items() if route in routed} == set(INTERACTIONS)


def test_every_handler_is_an_operation_modules():
    for route in ROUTES:
        assert route.handler.__module__.startswith("fhirgym.fhir.ops."), route


def test_every_405_names_a_routed_path():
    patterns = {r.pattern for r in ROUTES}
    assert set(NOT_ALLOWED) <= patterns
