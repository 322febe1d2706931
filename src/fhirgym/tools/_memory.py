"""Memory tools: lessons a Reflexion training run distilled (docs/MEMORY.md), read by the agent at run time.

The tools are defined here once, like every tool, and work over any store object found in
``ToolContext.extras[MEMORY_KEY]`` that has ``search(query, k)``, ``tips(resource_type, operation)`` and
``stats()`` (``fhirgym.memory.MemoryStore``; the memory layer sits above this one, so it is not imported).
The memory configurations put their frozen store there; MCP serves the same three tools.
"""

from __future__ import annotations

from typing import Any

from ._core import Tool, ToolContext, ToolError

MEMORY_KEY = "memory"
OPERATIONS = ("search", "read", "create", "update", "delete")


def _store(ctx: ToolContext) -> Any:
    store = ctx.extras.get(MEMORY_KEY)
    if store is None:
        raise ToolError("no memory is bound to these tools (start them with --memory DIR)")
    return store


def _search(ctx: ToolContext, args: dict) -> dict:
    query = str(args["query"]).strip()
    if not query:
        raise ToolError("query must not be empty")
    k = args.get("k", 3)
    if not 1 <= k <= 20:
        raise ToolError("k must be between 1 and 20")
    return {"lessons": _store(ctx).search(query, k)}


def _tips(ctx: ToolContext, args: dict) -> dict:
    rtype = str(args["resourceType"]).strip()
    op = args.get("operation")
    if op is not None and op not in OPERATIONS:
        raise ToolError(f"operation must be one of {', '.join(OPERATIONS)}")
    return {"tips": _store(ctx).tips(rtype, op)}


def _stats(ctx: ToolContext, args: dict) -> dict:
    return _store(ctx).stats()


SEARCH_MEMORY = Tool(
    "searchMemory",
    "Search the long-term memory of lessons learned on similar tasks (strategy: planning, tool order, "
    "filtering, constraints). Describe the task in your own words; returns the k most similar lessons.",
    {"type": "object", "properties": {
        "query": {"type": "string", "description": "what you are about to do, in plain words"},
        "k": {"type": "integer", "description": "how many lessons (1-20, default 3)"}},
     "required": ["query"]},
    _search, group="memory")
GET_MEMORY_TIPS = Tool(
    "getMemoryTips",
    "Operational tips learned for one FHIR resource type and operation (search, read, create, update, "
    "delete): JSON shape, search parameters, pitfalls.",
    {"type": "object", "properties": {
        "resourceType": {"type": "string", "description": "FHIR resource type, e.g. Appointment"},
        "operation": {"type": "string", "description": "search | read | create | update | delete (omit: all)"}},
     "required": ["resourceType"]},
    _tips, group="memory")
GET_MEMORY_STATS = Tool(
    "getMemoryStats",
    "What the memory holds: lesson counts by kind and resource type, and its content hash.",
    {"type": "object", "properties": {}},
    _stats, group="memory")

MEMORY_TOOLS: tuple[Tool, ...] = (SEARCH_MEMORY, GET_MEMORY_TIPS, GET_MEMORY_STATS)
