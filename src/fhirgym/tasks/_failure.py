"""Failure modes of a run (FHIR-AgentEval) and its proximity to the closest gold tool sequence.

Computed from the call log and the verdict only, so the same function labels runs of any agent.
``incorrect_tool_selection``: no gold sequence's tool multiset is covered by the calls made; ``incorrect_tool_order``:
the tools were there, but no gold sequence is a subsequence of the calls; ``incorrect_resource_type``: a resource type
the task requires was never touched by a call; ``prohibited_tool``: a tool the task prohibits was called;
``tool_errors``: at least one call returned an error; ``collateral_writes``: the store changed where the task did not
ask for it; ``other``: the run failed for none of these reasons (e.g. a wrong value or answer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

MODES = ("incorrect_tool_selection", "incorrect_tool_order", "incorrect_resource_type", "prohibited_tool",
         "tool_errors", "collateral_writes", "other")


def _is_subsequence(gold: Sequence[str], calls: Sequence[str]) -> bool:
    it = iter(calls)
    return all(any(c == g for c in it) for g in gold)


def _covers(gold: Sequence[str], calls: Sequence[str]) -> bool:
    have = Counter(calls)
    return all(have[name] >= n for name, n in Counter(gold).items())


def lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def proximity(calls: Sequence[str], sequences: Sequence[Sequence[str]]) -> dict[str, float]:
    """Closest gold sequence by LCS ratio (LCS / longer length) and by multiset Jaccard; best of each."""
    best_lcs = 0.0
    best_jac = 0.0
    for gold in sequences:
        longer = max(len(gold), len(calls))
        best_lcs = max(best_lcs, lcs(calls, gold) / longer if longer else 1.0)
        a, b = Counter(calls), Counter(gold)
        union = sum((a | b).values())
        best_jac = max(best_jac, sum((a & b).values()) / union if union else 1.0)
    return {"lcs": round(best_lcs, 4), "jaccard": round(best_jac, 4)}


def failure_modes(success: bool, calls: Sequence[str], call_types: Sequence[str | None], call_errors: Sequence[bool],
                  sequences: Sequence[Sequence[str]], required_types: Sequence[str],
                  prohibited: Sequence[str], collateral: bool) -> list[str]:
    """The failure modes of a run (empty when it succeeded)."""
    if success:
        return []
    modes = []
    if sequences and not any(_covers(g, calls) for g in sequences):
        modes.append("incorrect_tool_selection")
    elif sequences and not any(_is_subsequence(g, calls) for g in sequences):
        modes.append("incorrect_tool_order")
    touched = {t for t in call_types if t}
    if any(t not in touched for t in required_types):
        modes.append("incorrect_resource_type")
    if any(c in prohibited for c in calls):
        modes.append("prohibited_tool")
    if any(call_errors):
        modes.append("tool_errors")
    if collateral:
        modes.append("collateral_writes")
    return modes or ["other"]


def failure_modes_of(inst: Any, calls: Sequence[Any], collateral: bool) -> list[str]:
    """:func:`failure_modes` of a failed run of an instance (its sequences, resource types and prohibited
    tools: per instance) from its recorded tool calls (``ToolCall``s)."""
    return failure_modes(False, [c.name for c in calls], [c.resource_type for c in calls],
                         [c.error is not None for c in calls], inst.sequences, inst.resource_types,
                         inst.prohibited_tools, collateral)
