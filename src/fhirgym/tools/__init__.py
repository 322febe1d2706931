"""Agent-facing tools, each defined once and served in process, over MCP and to RL environments; and the
sandbox the ``python`` tool runs code in (``_sandbox.py``, threat model in docs/SANDBOX.md).

    from fhirgym.tools import FHIR_TOOLS, Toolbox, ToolContext
    box = Toolbox(FHIR_TOOLS, ToolContext(client))
    call = box.call("searchResources", {"resourceType": "Patient", "params": {"family": "Diaz"}})
    call.output, call.error, call.ms
"""

from ._core import DEFAULT_BUDGET, Tool, Toolbox, ToolCall, ToolContext, ToolError
from ._fhir import (
    CREATE_RESOURCE,
    DELETE_RESOURCE,
    FHIR_TOOLS,
    GET_RESOURCE_BY_ID,
    LIST_RESOURCE_TYPES,
    SEARCH_RESOURCES,
    UPDATE_RESOURCE,
)
from ._sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxProbe,
    SandboxResult,
    SandboxUnavailable,
    sandbox_available,
    sandbox_probe,
)
from ._specs import (
    GET_DATA_TYPE_DEFINITION,
    GET_SEARCH_PARAMS,
    GET_STRUCTURE_DEFINITION,
    LIST_RESOURCES,
    SPEC_TOOLS,
)

__all__ = [
    "CREATE_RESOURCE",
    "DEFAULT_BUDGET",
    "DELETE_RESOURCE",
    "FHIR_TOOLS",
    "GET_DATA_TYPE_DEFINITION",
    "GET_RESOURCE_BY_ID",
    "GET_SEARCH_PARAMS",
    "GET_STRUCTURE_DEFINITION",
    "LIST_RESOURCES",
    "LIST_RESOURCE_TYPES",
    "SEARCH_RESOURCES",
    "SPEC_TOOLS",
    "UPDATE_RESOURCE",
    "Sandbox",
    "SandboxLimits",
    "SandboxProbe",
    "SandboxResult",
    "SandboxUnavailable",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Toolbox",
    "sandbox_available",
    "sandbox_probe",
]
