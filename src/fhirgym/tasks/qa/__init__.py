"""Question answering over a world, FHIR-AgentBench style: templates, generator, deterministic scoring.

    from fhirgym.tasks.qa import build_questions, score_answer, retrieval_scores
    questions = build_questions(world_file, per_template=55, seed=0)   # split by patient
    verdict = score_answer(questions[0], "The final answer is: 2024-03-05 14:00:00")
    precision, recall = retrieval_scores(questions[0].gold_ids, {"Observation": ["…"]})

Gold answers and gold resource ids are computed by code from the world (through its FHIR API); the
tests recompute every template's answers from the world file with SQL.
"""

from ._facts import Event, FactReader, PatientFacts
from ._generate import (
    SPLITS,
    QaQuestion,
    assign_splits,
    build_questions,
    count_table,
    read_facts,
    read_questions,
    write_questions,
)
from ._instance import QaAnswer, QaFamily, qa_fields, qa_instance, retrieved_ids
from ._program import Program, program_reply, reference_program, render_answer
from ._score import (
    Match,
    final_answer,
    match_answer,
    reference_reply,
    retrieval_scores,
    says_no_answer,
    score_answer,
)
from ._templates import SHAPES, TEMPLATES, Template

__all__ = [
    "SHAPES",
    "SPLITS",
    "TEMPLATES",
    "Event",
    "FactReader",
    "Match",
    "PatientFacts",
    "Program",
    "QaAnswer",
    "QaFamily",
    "QaQuestion",
    "Template",
    "assign_splits",
    "build_questions",
    "count_table",
    "final_answer",
    "match_answer",
    "program_reply",
    "qa_fields",
    "qa_instance",
    "read_facts",
    "read_questions",
    "reference_program",
    "reference_reply",
    "render_answer",
    "retrieval_scores",
    "retrieved_ids",
    "says_no_answer",
    "score_answer",
    "write_questions",
]
