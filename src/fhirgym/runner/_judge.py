"""The optional LLM judge of QA answers, with FHIR-AgentBench's lenient rules, and its agreement
with the deterministic matcher.

FHIR-AgentBench scores every answer with an LLM (o4-mini) told to accept formatting differences,
integer rounding, missing units and dates without times. Here any chat backend can be that judge;
verdicts are cached on disk by (question, answer, model) so a re-run costs nothing, and
:func:`agreement` measures the judge against the matcher (the RL paper reports 96 % agreement of its
judge with a physician). The judge lives above ``tasks/`` because it needs a model backend.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..agents import ChatBackend

#: The judge's instructions: FHIR-AgentBench's rules (evaluation_metrics.py), in our words.
JUDGE_PROMPT = """You check whether a model's answer to a question about a patient's record is correct, \
by comparing it with the true answer. Reply with 1 if it is correct and 0 if it is not; reply with nothing else.

Rules:
1. A true answer of "no answer" means there is no answer, or the answer is effectively zero. Return 1 if the \
model also says there is no answer (or answers 0 / "no" to a count or yes/no question), 0 if it gives a real answer.
2. Yes/no: [[1]] means yes and [[0]] means no. Judge by meaning ("the second value is not lower" answers "no" to \
"is it lower?").
3. Numbers: round both to the nearest integer (days to whole days) before comparing; ignore units and decimal \
formatting; accept an answer whose breakdown contains the true value.
4. Dates: the dates must match; the time may be left out, and times a minute apart are the same.
5. Lists: the answer must contain every listed value and no extra clinical values; harmless context is fine.
6. Extra correct detail is fine; be lenient about brackets, quotes, spacing and style.

Examples:
- question: What is the gender of patient 123? true answer: [['female']] model answer: The patient is a woman. -> 1
- question: Has patient 123 been prescribed aspirin in 2020? true answer: no answer model answer: No, there is no \
such prescription. -> 1
- question: What was the minimum sodium value of patient 123 this year? true answer: [[133.4]] model answer: \
133 mmol/L -> 1
- question: When was patient 123 last admitted to the hospital? true answer: [['2024-03-05 14:07:00']] model \
answer: On 2024-03-06. -> 0

Question: {question}
True answer: {gold}
Model answer: {answer}
Output (0 or 1):"""


def gold_text(answer: Any, no_answer: bool) -> str:
    """The true answer as FHIR-AgentBench shows it to its judge: a nested list, or "no answer"."""
    if no_answer or answer is None:
        return "no answer"
    if isinstance(answer, bool):
        return f"[[{int(answer)}]]"
    rows = answer if isinstance(answer, list) else [answer]
    return "[" + ", ".join(f"[{r!r}]" for r in rows) + "]"


@dataclass(frozen=True)
class JudgeVerdict:
    correct: bool
    raw: str  # the judge's last reply
    cached: bool


class LlmJudge:
    """``judge(question, gold, answer)`` with a backend; verdicts cached in ``cache`` (JSON lines)."""

    def __init__(self, backend: ChatBackend, cache: str | Path | None = None, attempts: int = 3) -> None:
        self.backend = backend
        self.attempts = attempts
        self.path = Path(cache) if cache else None
        self.cache: dict[str, dict] = {}
        if self.path and self.path.exists():
            for line in self.path.read_bytes().splitlines():
                if line.strip():
                    row = orjson.loads(line)
                    self.cache[row["key"]] = row

    def key(self, question: str, answer: str) -> str:
        return hashlib.sha256(orjson.dumps([question, answer, self.backend.name])).hexdigest()

    def judge(self, question: str, gold: str, answer: str | None) -> JudgeVerdict:
        """``question`` as the agent saw it, ``gold`` from :func:`gold_text`, ``answer`` the agent's reply."""
        answer = answer or ""
        key = self.key(f"{question}\n{gold}", answer)
        if key in self.cache:
            row = self.cache[key]
            return JudgeVerdict(row["correct"], row["raw"], True)
        prompt = JUDGE_PROMPT.format(question=question, gold=gold, answer=answer.strip() or "(empty)")
        raw, correct = "", False
        for _ in range(self.attempts):  # FHIR-AgentBench asks until it reads 0 or 1; we ask a bounded number of times
            raw = self.backend.chat([{"role": "user", "content": prompt}], temperature=0.0, max_tokens=8).text
            found = re.search(r"[01]", raw)
            if found:
                correct = found.group() == "1"
                break
        row = {"key": key, "correct": correct, "raw": raw, "model": self.backend.name}
        self.cache[key] = row
        if self.path:
            with open(self.path, "ab") as fh:
                fh.write(orjson.dumps(row) + b"\n")
        return JudgeVerdict(correct, raw, False)


@dataclass(frozen=True)
class Agreement:
    """The judge against the deterministic matcher, taken as the reference."""

    n: int
    agreement: float
    precision: float  # of the answers the judge accepts, the share the matcher accepts
    recall: float  # of the answers the matcher accepts, the share the judge accepts
    judge_accepts: int
    matcher_accepts: int

    def lines(self) -> str:
        return (f"{self.n} answers: agreement {100 * self.agreement:.1f} %, judge precision {100 * self.precision:.1f} %, "
                f"recall {100 * self.recall:.1f} % (judge accepts {self.judge_accepts}, matcher {self.matcher_accepts})")


def agreement(pairs: Iterable[tuple[bool, bool]]) -> Agreement:
    """``pairs`` of (matcher says correct, judge says correct)."""
    pairs = list(pairs)
    both = sum(m and j for m, j in pairs)
    judge = sum(j for _, j in pairs)
    matcher = sum(m for m, _ in pairs)
    same = sum(m == j for m, j in pairs)
    n = len(pairs)
    return Agreement(n, same / n if n else float("nan"), both / judge if judge else float("nan"),
                     both / matcher if matcher else float("nan"), judge, matcher)
