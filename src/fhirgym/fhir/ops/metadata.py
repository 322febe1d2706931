"""``metadata`` (``GET metadata``): the CapabilityStatement, generated from what the server
implements (never written by hand).

Resource types and search parameters come from the spec minus the extractor's explicit
``unsupported`` table; modifiers from the search engine; the interactions are those :mod:`.._routes` serves.
"""

from __future__ import annotations

import fhirgym

from .._core import ServerCore
from .._errors import bad_request
from .._http import Request, Response
from .._search import MODIFIERS

INTERACTIONS = ["read", "vread", "update", "delete", "history-instance", "history-type", "create", "search-type"]


def metadata(server: ServerCore, req: Request) -> Response:
    for key, value in req.query:
        if key == "mode" and value != "full":
            raise bad_request(f"metadata mode={value!r} is not supported (only 'full': a CapabilityStatement)",
                              "not-supported", ("mode",))
    if server.capability is None:
        server.capability = capability_statement(server)
    return Response(200, server.capability)


def capability_statement(server: ServerCore) -> dict:
    spec = server.spec
    engine = server.search_engine
    resources = []
    for rtype in spec.resource_types:
        params = engine.supported_params(rtype)
        ref_params = [p.code for p in params if p.type == "reference"]
        entry = {
            "type": rtype,
            "profile": f"http://hl7.org/fhir/StructureDefinition/{rtype}",
            "interaction": [{"code": c} for c in INTERACTIONS],
            "versioning": "versioned-update",
            "readHistory": True,
            "updateCreate": True,
            "conditionalCreate": True,
            "conditionalRead": "full-support",
            "conditionalUpdate": True,
            "conditionalDelete": "single",
            "referencePolicy": ["literal", "local"],
            "searchInclude": ["*"] + [f"{rtype}:{c}" for c in ref_params],
            "searchRevInclude": sorted(
                f"{src}:{p.code}"
                for src in spec.resource_types
                for p in engine.supported_params(src)
                if p.type == "reference" and (not p.targets or rtype in p.targets)
            ),
            "searchParam": [
                {
                    "name": p.code,
                    "definition": p.url,
                    "type": p.type,
                    "documentation": "modifiers: " + ", ".join(sorted(MODIFIERS.get(p.type, ()))),
                }
                for p in params
            ],
            "operation": [{"name": "validate", "definition": "http://hl7.org/fhir/OperationDefinition/Resource-validate"}],
        }
        if rtype == "Patient":
            entry["operation"].append(
                {"name": "everything", "definition": "http://hl7.org/fhir/OperationDefinition/Patient-everything"}
            )
        resources.append(entry)
    return {
        "resourceType": "CapabilityStatement",
        "status": "active",
        "date": "2026-01-01",
        "publisher": "fhirgym",
        "kind": "instance",
        "software": {"name": "fhirgym embedded FHIR server", "version": fhirgym.__version__},
        "implementation": {"description": "fhirgym embedded R4 server", "url": server.base},
        "fhirVersion": "4.0.1",
        "format": ["application/fhir+json", "json"],
        "rest": [
            {
                "mode": "server",
                "resource": resources,
                "interaction": [{"code": "transaction"}, {"code": "batch"}, {"code": "history-system"}],
            }
        ],
    }
