"""What a run looked at: the resource types its reads and searches covered.

A "nothing found" (action) or "no answer" (QA) reply is a claim about the record, and a constant reply
makes it without looking. A benchmark must not pay for a claim nobody checked, and an RL reward that does
teaches the shortcut (a GRPO run learned to answer "no answer" to everything). So such a reply passes
strictly only after a successful search or read of a type the claim is about (:func:`looked_at`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

#: The read tools and the argument naming the type they read.
_READS = {"searchResources": "resourceType", "getResourceById": "resourceType", "fhir_query": "resource_type"}


def _revincluded(params: Any) -> set[str]:
    """Source types of ``_revinclude`` values (``Coverage:beneficiary``): a search that brought them in."""
    pairs = params.items() if isinstance(params, dict) else params if isinstance(params, list) else []
    out: set[str] = set()
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2 or pair[0] != "_revinclude":
            continue
        for value in pair[1] if isinstance(pair[1], list) else [pair[1]]:
            if isinstance(value, str) and ":" in value:
                out.add(value.split(":", 1)[0])
    return out


def looked_at(calls: Iterable[Any]) -> set[str]:
    """The resource types the successful read and search calls of a run covered (searches that bring
    others in with ``_revinclude`` cover those too). ``calls``: ``ToolCall``s or their JSON."""
    types: set[str] = set()
    for call in calls:
        name = getattr(call, "name", None) or (call.get("name") if isinstance(call, dict) else None)
        error = getattr(call, "error", None) if not isinstance(call, dict) else call.get("error")
        args = getattr(call, "arguments", None) if not isinstance(call, dict) else call.get("arguments")
        if error or not isinstance(args, dict):
            continue
        if name in _READS and isinstance(args.get(_READS[name]), str):
            types.add(args[_READS[name]])
            if name == "searchResources":
                types |= _revincluded(args.get("params"))
        elif name == "fhir_get" and isinstance(args.get("query"), str):
            parts = urlsplit(args["query"].strip())
            if parts.path.strip("/"):
                types.add(parts.path.strip("/"))
                types |= _revincluded(parse_qsl(parts.query))
    return types
