"""Deterministic scoring of free-text answers, one matcher per answer shape, and retrieval P/R.

FHIR-AgentBench scores answers with an LLM judge (o4-mini) under lenient rules; this matcher applies fixed rules
instead, so a reward is a pure function of the transcript. The answer is the text after the last "The final answer is:"
(or inside the last ``<answer>…</answer>``), else the whole reply; a question without gold ids accepts a no-answer reply
(FHIR-AgentBench maps empty gold ids to "no answer", and its judge reads an empty gold as zero or no answer); then one
rule per shape: the first yes/no word, date-times to the minute, categorical strings as whole phrases, numbers within
the question's tolerance or 0.5 % of the gold value (units converted), counts exact, grouped lists in order. The rules
in full: docs/QA.md, section "Scoring". Retrieval follows FHIR-AgentBench's ``utils/metrics_utils.py`` exactly (see
:func:`retrieval_scores`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._answer import _text, norm_id, parse_instant

_MARKER = re.compile(r"final answer\s*(?:is)?\s*[:：]", re.I)
_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_DATEISH = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?|"
                      r"\b\d{4}-\d{2}\b|\b\d{1,2}/\d{4}\b|(?<![\d.,])(?:19|20)\d{2}(?=\s*:)")
#: a year after a preposition ("since 2019"); "2000 mg" stays a number
_YEAR = re.compile(r"\b(in|to|of|since|from|year|during|until|after|before)\s+(?:19|20)\d{2}\b", re.I)
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+−]?\.\d+")
_UNIT_AFTER = re.compile(r"\s*([a-zA-Z]+)")
_YESNO = re.compile(r"\b(yes|no|true|false)\b", re.I)
_NO_ANSWER = re.compile(
    r"^(?:(?:none|null|nil|n/?a|unknown|not found|nothing found|not available)$|no answer\b|"
    r"no (?:such |matching |relevant )?(?:records?|data|results?|information|matches|values?|measurements?|"
    r"events?|visits?)\b|there (?:is|are|was|were) no\b|cannot be determined|can ?not be answered|no (?:current|such)\b)",
    re.I)
#: unit word -> (dimension, factor to the base unit of that dimension)
UNITS = {"second": ("time", 1 / 3600), "seconds": ("time", 1 / 3600), "minute": ("time", 1 / 60),
         "minutes": ("time", 1 / 60), "min": ("time", 1 / 60), "mins": ("time", 1 / 60), "hour": ("time", 1.0),
         "hours": ("time", 1.0), "h": ("time", 1.0), "hr": ("time", 1.0), "hrs": ("time", 1.0),
         "day": ("time", 24.0), "days": ("time", 24.0), "d": ("time", 24.0), "week": ("time", 168.0),
         "weeks": ("time", 168.0), "kg": ("mass", 1.0), "g": ("mass", 0.001), "lb": ("mass", 0.45359237),
         "lbs": ("mass", 0.45359237)}
GENDER_ALIASES = {"female": ("f", "woman"), "male": ("m", "man")}


@dataclass(frozen=True)
class Match:
    correct: bool
    reason: str  # why (for transcripts and the report)


def final_answer(text: str | None) -> str:
    """The part of a reply that is the answer (see the module docstring)."""
    if not text:
        return ""
    tags = _TAG.findall(text)
    if tags:
        return tags[-1].strip()
    parts = _MARKER.split(text)
    return parts[-1].strip() if len(parts) > 1 else text.strip()


def says_no_answer(text: str) -> bool:
    body = text.strip().strip("`'\"")
    if re.fullmatch(r'\{\s*"?found"?\s*:\s*false\s*\}', text.strip(), re.I):  # fhirgym's structured form
        return True
    return body in ("[]", "{}", "[[]]", "[[None]]") or bool(_NO_ANSWER.match(_text(body)))


def _datetimes(text: str) -> list[datetime]:
    out = []
    for m in _DATETIME.findall(text):
        moment = parse_instant(m)
        if moment is not None:
            out.append(moment.replace(second=0, microsecond=0))
    return out


def _numbers(text: str) -> list[tuple[float, str | None]]:
    """(number, the unit word written after it) for each number, dates and years removed."""
    text = _YEAR.sub(r"\1 ", _DATEISH.sub(" ", text))
    out = []
    for m in _NUMBER.finditer(text):
        unit = _UNIT_AFTER.match(text, m.end())
        out.append((float(m.group().replace(",", "").replace("−", "-")), unit.group(1).lower() if unit else None))
    return out


def _convert(value: float, written: str | None, gold_unit: str | None) -> float:
    """``value`` in ``written`` units expressed in the gold's unit (unchanged when either is unknown)."""
    a, b = UNITS.get(written or ""), UNITS.get((gold_unit or "").lower())
    if a and b and a[0] == b[0]:
        return value * a[1] / b[1]
    return value


def _close(got: float, gold: float, tolerance: float) -> bool:
    return abs(got - gold) <= max(tolerance, 0.005 * abs(gold), 1e-9)


def _phrase_in(phrase: str, text: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(_text(phrase)) + r"(?!\w)", _text(text)) is not None


def match_answer(shape: str, gold: Any, reply: str | None, *, unit: str | None = None, tolerance: float = 0.0,
                 no_answer: bool | None = None) -> Match:
    """Is ``reply`` a correct answer of this shape? ``no_answer``: the question has no gold ids
    (default: the gold answer is None)."""
    text = final_answer(reply)
    empty = gold is None if no_answer is None else no_answer
    if not text:
        return Match(False, "no answer given")
    if says_no_answer(text):
        return Match(empty, "no-answer reply" + ("" if empty else " but the question has an answer"))
    if gold is None:
        return Match(False, "expected a no-answer reply")
    if shape == "yesno":
        m = _YESNO.search(text) or re.fullmatch(r"\s*([01])\W*", text)
        if not m:
            return Match(False, "no yes/no in the answer")
        got = m.group(1).lower() in ("yes", "true", "1")
        return Match(got == bool(gold), f"answered {'yes' if got else 'no'}")
    if shape == "datetime":
        found = _datetimes(text)
        want = parse_instant(gold).replace(second=0, microsecond=0)
        return Match(bool(found) and found[0] == want, f"got {found[0] if found else 'no date-time'}, expected {gold}")
    if shape == "datetime_list":
        got = set(_datetimes(text))
        want = {parse_instant(g).replace(second=0, microsecond=0) for g in gold}
        return Match(got == want, f"{len(got & want)}/{len(want)} date-times, {len(got - want)} extra")
    if shape == "text":
        missing = [g for g in gold if not any(_phrase_in(alt, text) for alt in (g, *GENDER_ALIASES.get(g.lower(), ())))]
        return Match(not missing, f"missing {missing}" if missing else "all named")
    numbers = _numbers(text)
    if not numbers:
        return Match(False, "no number in the answer")
    if shape == "grouped":
        got = [v for v, _ in numbers]
        ok = len(got) == len(gold) and all(_close(a, b, tolerance) for a, b in zip(got, gold, strict=True))
        return Match(ok, f"got {got}, expected {gold}")
    value, written = numbers[0]
    value = _convert(value, written, unit)
    if shape == "count":
        return Match(value == int(gold), f"got {value:g}, expected {gold}")
    return Match(_close(value, float(gold), tolerance), f"got {value:g}, expected {gold}")


def score_answer(question, reply: str | None) -> Match:
    """Match a reply against a :class:`QaQuestion`."""
    return match_answer(question.shape, question.answer, reply, unit=question.unit, tolerance=question.tolerance,
                        no_answer=question.no_answer)


def reference_reply(question) -> str:
    """The reply an agent that knows the gold would give (a reference agent's final text)."""
    gold, shape = question.answer, question.shape
    if gold is None:
        body = "no answer"
    elif shape == "yesno":
        body = "Yes" if gold else "No"
    elif isinstance(gold, list):
        body = ", ".join(f"{g:g}" if isinstance(g, float) else str(g) for g in gold)
    elif isinstance(gold, float | int):
        body = f"{gold:g}" + (f" {question.unit}" if question.unit in UNITS else "")
    else:
        body = str(gold)
    return f"The final answer is: {body}"


def retrieval_scores(gold_ids: Mapping[str, Iterable[str]],
                     retrieved: Mapping[str, Iterable[str]]) -> tuple[float, float]:
    """(precision, recall) of retrieved resource ids, as FHIR-AgentBench computes them.

    Predicted ids are the retrieved ids of the gold's resource types only (a list: a resource fetched
    twice counts twice for precision). Recall is binary: 1 only if every gold id was retrieved.
    Precision is the share of predicted ids that are gold. Edge cases: no gold and nothing predicted →
    (1, 1); no gold, something predicted → (0, NaN); gold but nothing predicted → (NaN, 0). Because
    predictions are restricted to the gold's types, a question without gold ids always scores (1, 1).
    """
    true = [norm_id(i) for ids in gold_ids.values() for i in ids]
    pred = [norm_id(i) for rtype in gold_ids for i in retrieved.get(rtype, ())]
    if not true:
        return (1.0, 1.0) if not pred else (0.0, math.nan)
    if not pred:
        return math.nan, 0.0
    got = set(pred)
    gold = set(true)
    return sum(p in gold for p in pred) / len(pred), float(all(t in got for t in true))
