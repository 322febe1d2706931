"""Rewards from verdicts: deterministic given the transcript, the same in every adapter.

An action task's reward is its strict verdict (1 or 0); a QA question's is the deterministic matcher's verdict
(``tasks.qa.score_answer``, what ``Episode.submit`` judges it by), or, when ``judge`` is set, the LLM judge's
(``runner.LlmJudge``: FHIR-AgentBench's lenient rules, temperature 0, verdicts cached on disk, so a transcript gets the
same reward again), but never for a "no answer" the run did not look for (the verdict's ``unsupported_negative``). Two
optional terms, off by default: ``light_weight`` gives a writing task that failed strict but made the essential change
(the light validator) that much, and ``format_penalty`` takes that much off per reply that tried to call a tool but
wrote no well-formed call. The reward never goes below 0 (a model cannot earn a negative return by answering at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..runner import gold_text
from ..tasks import Instance, Verdict
from ..tasks.qa import QaFamily


@dataclass(frozen=True)
class RewardSpec:
    light_weight: float = 0.0
    format_penalty: float = 0.0
    #: QA only: an object with ``judge(question, gold, answer) -> JudgeVerdict`` (``runner.LlmJudge``).
    judge: Any = field(default=None, compare=False)

    def correct(self, instance: Instance, verdict: Verdict, answer: str | None) -> bool:
        """Whether the episode counts as solved: the judge's word on a QA answer when there is a judge,
        else the verdict (strict validator, or the QA matcher)."""
        fam = instance.family
        if self.judge is None or not isinstance(fam, QaFamily):
            return verdict.success
        if verdict.unsupported_negative:  # "no answer" without a look earns nothing, whatever a judge says
            return False
        q = fam.question
        return bool(self.judge.judge(instance.params["prompt"], gold_text(q.answer, q.no_answer), answer).correct)

    def reward(self, verdict: Verdict, malformed_turns: int = 0, writes: bool = False,
               correct: bool | None = None) -> float:
        """``correct`` overrides ``verdict.success`` (see :meth:`correct`)."""
        solved = verdict.success if correct is None else correct
        value = 1.0 if solved else (self.light_weight if writes and verdict.light_success else 0.0)
        return max(0.0, value - self.format_penalty * malformed_turns)
