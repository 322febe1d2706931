"""What a policy did, beside what it earned: the behaviour that gives a shortcut away before the reward does.

Per episode (:func:`behaviour_of`): the tool calls it made, whether it looked at the record (a successful
read or search of any type: :func:`fhirgym.tasks.looked_at`, the check behind "a negative answer needs
evidence"), whether it answered, and whether the answer was the negative constant (an action task's
"nothing found", a QA question's "no answer": the reply the last CPU GRPO run collapsed to).
:func:`behaviour_summary` turns rows that carry these (``rollouts.jsonl`` of ``rl train``,
``episodes.jsonl`` of ``rl eval``) into figures per optimiser step: the share of negative answers, the
mean number of calls and the share of answers given without a look.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..tasks import NOT_FOUND, Instance, looked_at
from ..tasks.qa import QaFamily, final_answer, says_no_answer
from ._text import TextEpisode

#: The per-step figures, as they appear in ``curve.jsonl`` and ``behaviour.jsonl``.
FIGURES = ("behaviour/negative_share", "behaviour/mean_calls", "behaviour/answer_without_look_share")


def is_negative(inst: Instance, answer: str | None) -> bool:
    """Whether ``answer`` is the instance's negative reply ("nothing found"; QA: "no answer"), right or wrong."""
    if not answer or not answer.strip():
        return False
    fam = inst.family
    if isinstance(fam, QaFamily):
        return says_no_answer(final_answer(answer))
    spec = fam.answer
    return spec is not None and spec.parse(answer) is NOT_FOUND


def behaviour_of(text: TextEpisode, answer: str | None) -> dict[str, Any]:
    """``{"calls", "looked", "answered", "negative"}`` of a finished text episode whose final reply was ``answer``."""
    calls = text.episode.calls
    answered = bool(answer and answer.strip())
    return {"calls": len(calls), "looked": bool(looked_at(calls)), "answered": answered,
            "negative": is_negative(text.episode.instance, answer)}


def figures(behaviours: list[dict]) -> dict[str, float]:
    """The three figures over some episodes' behaviours (shares of all episodes; 0 for none)."""
    n = len(behaviours)
    if not n:
        return {}
    return {"behaviour/negative_share": sum(b["negative"] for b in behaviours) / n,
            "behaviour/mean_calls": statistics.fmean(b["calls"] for b in behaviours),
            "behaviour/answer_without_look_share": sum(b["answered"] and not b["looked"] for b in behaviours) / n}


def behaviour_summary(path: Path) -> list[dict[str, Any]]:
    """One row per step (``step``, ``episodes``, the three figures) from a JSONL file whose lines carry
    ``behaviour`` (and ``step``; lines without one count as step ``None``: an evaluation)."""
    by_step: dict[Any, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if row.get("behaviour") is not None:
                by_step[row.get("step")].append(row["behaviour"])
    steps = sorted(by_step, key=lambda s: (s is None, s if s is not None else 0))
    return [{"step": s, "episodes": len(by_step[s]), **figures(by_step[s])} for s in steps]


def behaviour_table(rows: list[dict[str, Any]]) -> str:
    """The per-step summary as a small text table."""
    lines = ["step  episodes  negative answers  mean calls  answers without a look"]
    for r in rows:
        lines.append(f"{'-' if r['step'] is None else r['step']:>4}  {r['episodes']:>8}  "
                     f"{r['behaviour/negative_share']:>16.2f}  {r['behaviour/mean_calls']:>10.2f}  "
                     f"{r['behaviour/answer_without_look_share']:>23.2f}")
    return "\n".join(lines)
