"""A QA question as a task instance, so it runs through the same episode seam, runner and report.

Each question becomes an :class:`~fhirgym.tasks.Instance` of its own (unregistered) family
``qa.<template>``: the world unchanged (no setup), the frozen clock at the question's assumed current
time, the gold answer held by the question itself, and an answer spec whose comparison is the
deterministic matcher. The reference solution reads the gold resources with the FHIR tools and gives
the reference reply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from .._answer import AnswerSpec
from .._family import WRITE_TOOLS, Family, Gold, Instance, TaskWorld
from ._generate import QaQuestion
from ._score import reference_reply, retrieval_scores, score_answer
from ._templates import BY_ID

FINAL_ANSWER = ("When you have the answer, end your reply with \"The final answer is: <answer>\" (a value, a "
                "date-time, yes or no, or a list, as the question asks; \"no answer\" if the record holds none).")


@dataclass(frozen=True)
class QaAnswer(AnswerSpec):
    """The free-text answer of a QA question, judged by :func:`score_answer` against the (frozen) gold."""

    fields: tuple = ()

    def instructions(self) -> str:
        return FINAL_ANSWER

    def parse(self, text: str | None) -> str | None:
        return text

    def compare(self, got: Any, gold: Any) -> list[str]:
        match = score_answer(gold, got)
        return [] if match.correct else [match.reason]

    def json_schema(self) -> dict | None:
        return None


class QaFamily(Family):
    """The family of one question (its template's id); never registered: the QA track lists questions."""

    category: ClassVar[str] = "qa"
    writes: ClassVar[bool] = False
    prohibited_tools: ClassVar[tuple[str, ...]] = WRITE_TOOLS
    answer = QaAnswer()

    def __init__(self, question: QaQuestion) -> None:
        self.question = question
        self.id = f"qa.{question.template}"
        self.title = question.template
        self.difficulty = 1 if question.shape in ("yesno", "categorical", "value", "datetime") else 2
        types = tuple(question.gold_types) or ("Patient",)
        self.resource_types = types
        self.sequences = (("fhir_query",) * len(types), ("searchResources",) * len(types))
        # "no answer" is a claim about the template's event kind (a lab: Observation), whatever it holds
        template = BY_ID.get(question.template)
        self.negative_evidence = template.types if template is not None else types

    def negative(self, gold: Gold) -> bool:
        return isinstance(gold.answer, QaQuestion) and gold.answer.no_answer

    def prompt(self, params: dict) -> str:
        return params["prompt"]

    def full_prompt(self, params: dict) -> str:
        return self.prompt(params).strip() + "\n\n" + FINAL_ANSWER

    def solve(self, tools, params: dict, now: datetime) -> str:
        """Read exactly the gold resources (so the reference's retrieval is perfect), then reply; with no
        gold, count what the patient has of the question's kind first (a "no answer" needs that look)."""
        if not self.question.gold_ids:
            rtype = self.negative_evidence[0]
            tools.call("searchResources", {"resourceType": rtype, "params": {
                "_id" if rtype == "Patient" else "patient": self.question.patient_id, "_count": "0"}})
        for rtype, ids in self.question.gold_ids.items():
            for start in range(0, len(ids), 15):  # short queries, small outputs: every id fits the budget
                tools.call("searchResources", {"resourceType": rtype, "params": {
                    "_id": ",".join(ids[start:start + 15]), "_elements": "id"}, "all_pages": True})
        return reference_reply(self.question)


def qa_instance(question: QaQuestion, world: TaskWorld) -> Instance:
    """The instance of ``question`` on ``world`` (the world the questions were built from)."""
    fam = QaFamily(question)
    now = datetime.fromisoformat(question.anchor.replace(" ", "T")).replace(tzinfo=UTC)
    params = {"question_id": question.id, "patient_id": question.patient_id, "prompt": question.prompt()}
    return Instance(fam, question.seed, params, now, fam.full_prompt(params), [], world.snapshot,
                    Gold(answer=question), world)


def retrieved_ids(outputs: Iterable[Any]) -> dict[str, list[str]]:
    """The resource ids an episode's tool outputs brought, by type: every FHIR resource in them (searches,
    reads) and the id lists of the CodeAct fetches (``fhir_query``/``fhir_get``: ``{"ids": {type: [...]}}``)."""
    out: dict[str, list[str]] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("resourceType"), str) and isinstance(value.get("id"), str):
                out.setdefault(value["resourceType"], []).append(value["id"])
            ids = value.get("ids")
            if isinstance(ids, dict):
                for rtype, found in ids.items():
                    if isinstance(found, list):
                        out.setdefault(str(rtype), []).extend(str(i) for i in found)
            for v in value.values():
                if v is not ids:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for output in outputs:
        walk(output)
    return out


def qa_fields(question: QaQuestion, outputs: Iterable[Any]) -> dict[str, Any]:
    """What a result line adds for a QA episode: shape, gold types and FHIR-AgentBench's retrieval P/R."""
    precision, recall = retrieval_scores(question.gold_ids, retrieved_ids(outputs))
    return {"question_id": question.id, "template": question.template, "shape": question.shape,
            "no_answer": question.no_answer, "gold_types": question.gold_types,
            "retrieval": {"precision": precision, "recall": recall}}
