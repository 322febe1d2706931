"""Agent-facing tools, each defined once and served in process, over MCP and to RL environments: FHIR CRUD,
FHIR-spec and CodeAct tools (``_codeact.py``, docs/CODEACT.md), memory tools (``_memory.py``, docs/MEMORY.md); and the sandbox the ``python`` tool runs
code in (``_sandbox.py``, threat model in docs/SANDBOX.md).

    from fhirgym.tools import FHIR_TOOLS, Toolbox, ToolContext
    box = Toolbox(FHIR_TOOLS, ToolContext(client))
    call = box.call("searchResources", {"resourceType": "Patient", "params": {"family": "Diaz"}})
    call.output, call.error, call.ms
"""

from ._codeact import (
    CODEACT_TOOLS,
    FHIR_GET,
    FHIR_QUERY,
    FINISH,
    PYTHON,
    UNSAFE_KEY,
    WORKSPACE_KEY,
    Workspace,
    episode_toolbox,
    final_answer_of,
    needs_workspace,
)
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
from ._memory import GET_MEMORY_STATS, GET_MEMORY_TIPS, MEMORY_KEY, MEMORY_TOOLS, SEARCH_MEMORY
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
    "CODEACT_TOOLS",
    "CREATE_RESOURCE",
    "DEFAULT_BUDGET",
    "DELETE_RESOURCE",
    "FHIR_GET",
    "FHIR_QUERY",
    "FHIR_TOOLS",
    "FINISH",
    "GET_DATA_TYPE_DEFINITION",
    "GET_MEMORY_STATS",
    "GET_MEMORY_TIPS",
    "GET_RESOURCE_BY_ID",
    "GET_SEARCH_PARAMS",
    "GET_STRUCTURE_DEFINITION",
    "LIST_RESOURCES",
    "LIST_RESOURCE_TYPES",
    "MEMORY_KEY",
    "MEMORY_TOOLS",
    "PYTHON",
    "SEARCH_MEMORY",
    "SEARCH_RESOURCES",
    "SPEC_TOOLS",
    "UNSAFE_KEY",
    "UPDATE_RESOURCE",
    "WORKSPACE_KEY",
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
    "Workspace",
    "episode_toolbox",
    "final_answer_of",
    "needs_workspace",
    "sandbox_available",
    "sandbox_probe",
]
