"""Building a question set from a world: templates × patients, split by patient, fixed by a seed.

Every random choice draws from ``Random(f"qa|{seed}|…")``, and patients and templates are visited in
a fixed order, so the same world, seed and size give the same file. Patients are split 70/15/15
into train/valid/test before any question is drawn: no patient appears in two splits. About a
quarter of the questions have no answer (empty gold ids, as in FHIR-AgentBench: "no" to a
yes/no question, nothing to report, no current visit): each draw first decides whether it wants
one (a per-template share corrected by the split's running share), then samples parameters until
the answer's emptiness matches (or settles for the last draw).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from random import Random
from typing import Any

import orjson

from .._family import TaskWorld
from ._facts import FactReader, PatientFacts
from ._templates import (
    BY_ID,
    TEMPLATES,
    Ambiguous,
    Template,
    answer,
    context_text,
    default_anchor,
    fmt,
    render_question,
    sample_params,
    visit_anchor,
    vocabulary,
)

SPLITS = ("train", "valid", "test")
SPLIT_SHARES = (0.70, 0.15, 0.15)
#: Target share of questions without answer (FHIR-AgentBench: 23.9 %).
EMPTY_SHARE = 0.24
DRAWS = 16  # parameter draws per question before settling
#: Absolute tolerance per answer shape (numbers also get 0.5 % of the gold value); elapsed time and
#: lengths of stay accept whole units, as FHIR-AgentBench's judge rounds them.
NUMERIC = ("value", "sum", "difference", "aggregate", "grouped", "elapsed", "duration")
TOLERANCE = {"value": 0.05, "sum": 0.05, "difference": 0.05, "aggregate": 0.05, "grouped": 0.05, "elapsed": 1.0,
             "duration": 0.5, "count": 0.0}


@dataclass
class QaQuestion:
    """One question about one patient, with its gold answer and gold resource ids (None/{}: no answer)."""

    id: str
    template: str
    shape: str
    patient_id: str
    question: str
    context: str
    anchor: str  # the assumed current time, "YYYY-MM-DD HH:MM:SS" UTC
    answer: Any
    gold_ids: dict[str, list[str]]
    unit: str | None
    tolerance: float
    split: str
    seed: int
    params: dict = field(default_factory=dict)

    @property
    def no_answer(self) -> bool:
        return not self.gold_ids

    @property
    def gold_types(self) -> list[str]:
        return sorted(self.gold_ids)

    def prompt(self) -> str:
        """The agent's input, in FHIR-AgentBench's layout."""
        return f"Question: {self.question}\nContext:\nPatient FHIR ID is {self.patient_id}.\n{self.context}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, row: dict) -> QaQuestion:
        return cls(**row)


def assign_splits(patient_ids: Iterable[str], seed: int) -> dict[str, str]:
    """Patient id -> split: a seeded shuffle cut 70/15/15 (each split gets a patient when there are 3+)."""
    ids = sorted(patient_ids)
    Random(f"qa-split|{seed}").shuffle(ids)
    n = len(ids)
    n_valid = max(1 if n >= 3 else 0, round(SPLIT_SHARES[1] * n))
    n_test = max(1 if n >= 3 else 0, round(SPLIT_SHARES[2] * n))
    n_train = n - n_valid - n_test
    return {pid: SPLITS[0] if i < n_train else SPLITS[1] if i < n_train + n_valid else SPLITS[2]
            for i, pid in enumerate(ids)}


def split_quota(per_template: int) -> dict[str, int]:
    """Questions per split for one template: 70/15/15 of ``per_template`` (valid and test rounded up)."""
    valid = test = math.ceil(SPLIT_SHARES[1] * per_template)
    return {"train": max(0, per_template - valid - test), "valid": valid, "test": test}


def _has_data(template: Template, facts: PatientFacts) -> bool:
    if template.kind == "patient":
        return True
    return bool(facts.of("admission" if template.visit_anchor else template.kind))


def _question(template: Template, pool: list[PatientFacts], vocab: dict[str, list[str]], rng: Random,
              default: datetime, seed: int, split: str, want_empty: bool) -> QaQuestion | None:
    """One question on a patient of ``pool``: one with data of the template's kind unless ``want_empty``."""
    rich = [f for f in pool if _has_data(template, f)]
    facts = rng.choice(rich if rich and not want_empty else pool)
    chosen = None
    for _ in range(DRAWS):
        anchor = visit_anchor(facts, rng, default) if template.visit_anchor else default
        params = sample_params(template, facts, vocab, rng, want_empty, anchor)
        try:
            value, events = answer(template, facts, params, anchor)
        except Ambiguous:
            continue
        chosen = (anchor, params, value, events)
        if (not events) == want_empty:
            break
    if chosen is None:
        return None
    anchor, params, value, events = chosen
    ids: dict[str, set[str]] = {}
    for e in events:
        for rtype, rid in e.ids():
            if rtype in template.types:
                ids.setdefault(rtype, set()).add(rid)
    unit = None
    if template.shape in NUMERIC:
        unit = {"elapsed": params.get("unit"), "duration": "days"}.get(template.shape,
                                                                      next((e.unit for e in events if e.unit), None))
    text = render_question(template, facts, params, rng)
    key = f"{seed}|{template.id}|{facts.id}|{text}|{fmt(anchor)}"
    return QaQuestion(
        id=hashlib.sha256(key.encode()).hexdigest()[:16], template=template.id, shape=template.shape,
        patient_id=facts.id, question=text, context=context_text(template, params, anchor), anchor=fmt(anchor),
        answer=value, gold_ids={k: sorted(v) for k, v in sorted(ids.items())}, unit=unit,
        tolerance=TOLERANCE.get(template.shape, 0.0), split=split, seed=seed, params=params)


def read_facts(world: TaskWorld) -> list[PatientFacts]:
    """Every patient of the world, read through its FHIR API (kept in the world's cache)."""
    if "qa.facts" not in world.cache:
        reader = FactReader(world.base_client())
        world.cache["qa.facts"] = [reader.read(p) for p in reader.patients()]
    return world.cache["qa.facts"]


def build_questions(world: TaskWorld | str | Path, per_template: int = 55, seed: int = 0,
                    templates: Iterable[str] | None = None,
                    progress: Callable[[str, int], None] | None = None) -> list[QaQuestion]:
    """``per_template`` questions per template (70/15/15 over the splits), in a fixed order.

    A template whose split has too few distinct questions (e.g. gender on a 10-patient world) yields
    fewer; the counts table shows it.
    """
    tw = world if isinstance(world, TaskWorld) else TaskWorld.open(world)
    facts = read_facts(tw)
    vocab = vocabulary(facts)
    split_of = assign_splits((f.id for f in facts), seed)
    default = default_anchor(tw.anchor)
    chosen = [BY_ID[t] for t in templates] if templates else list(TEMPLATES)
    out: list[QaQuestion] = []
    made_in = Counter[str]()
    empty_in = Counter[str]()
    for template in chosen:
        for split, quota in split_quota(per_template).items():
            pool = [f for f in facts if split_of[f.id] == split]
            rng = Random(f"qa|{seed}|{template.id}|{split}")
            seen: set[str] = set()
            made = t_empty = 0
            for _ in range(quota * 8):
                if made >= quota or not pool:
                    break
                # each template aims at the target share, corrected by the split's running share so far
                # (some templates rarely have an answer: no current visit), kept within 10–40 %
                so_far = empty_in[split] / made_in[split] if made_in[split] else EMPTY_SHARE
                target = min(0.4, max(0.1, EMPTY_SHARE + 4 * (EMPTY_SHARE - so_far)))
                want_empty = t_empty + 1 <= target * (made + 1)
                q = _question(template, pool, vocab, rng, default, seed, split, want_empty)
                if q is None or q.id in seen:
                    continue
                seen.add(q.id)
                out.append(q)
                made += 1
                t_empty += q.no_answer
                made_in[split] += 1
                empty_in[split] += q.no_answer
        if progress:
            progress(template.id, sum(q.template == template.id for q in out))
    return out


def write_questions(questions: Iterable[QaQuestion], path: str | Path) -> int:
    """One JSON object per line; returns the number written."""
    n = 0
    with open(path, "wb") as fh:
        for q in questions:
            fh.write(orjson.dumps(q.to_json()) + b"\n")
            n += 1
    return n


def read_questions(path: str | Path) -> list[QaQuestion]:
    return [QaQuestion.from_json(orjson.loads(line)) for line in Path(path).read_bytes().splitlines() if line.strip()]


def count_table(questions: list[QaQuestion]) -> str:
    """Questions per template and split, with the no-answer share, as a Markdown table."""
    per = Counter((q.template, q.split) for q in questions)
    empty = Counter(q.template for q in questions if q.no_answer)
    shape = {q.template: q.shape for q in questions}
    lines = ["| template | shape | train | valid | test | no answer |", "|---|---|---:|---:|---:|---:|"]
    for t in dict.fromkeys(q.template for q in questions):
        total = sum(per[(t, s)] for s in SPLITS)
        lines.append(f"| {t} | {shape[t]} | " + " | ".join(str(per[(t, s)]) for s in SPLITS)
                     + f" | {100 * empty[t] / max(1, total):.0f} % |")
    totals = Counter(q.split for q in questions)
    n_empty = sum(q.no_answer for q in questions)
    lines.append(f"| **all ({len(dict.fromkeys(q.template for q in questions))} templates)** | | "
                 + " | ".join(str(totals[s]) for s in SPLITS) + f" | {100 * n_empty / max(1, len(questions)):.1f} % |")
    return "\n".join(lines)
