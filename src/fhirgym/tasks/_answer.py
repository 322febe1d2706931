"""Final answers: the format a prompt asks for, lenient parsing, and comparison with the gold value.

The published sandbox compared answers as exact strings, accepted one timestamp format and checked "nothing found" by a
substring of one English sentence. Here every answer is a small JSON object in ``<answer>…</answer>`` whose fields have
*kinds* (id, ids, int, number, datetime, date, text, bool); parsing accepts tags or bare JSON, any key case, single
quotes, ``Type/id`` or bare ids, equivalent date formats; "nothing found" is ``{"found": false}`` (also ``none``,
``null``, ``not found``, an all-null object), but an empty reply never is. Generous in form, strict in commitment
(:func:`one_value`): a number with its unit or noun, a Reference object for an id, a one-element list for one value are
read as that value; an answer that names several candidates for one value, says "nothing found" next to a value, or
gives answer tags that disagree is wrong whatever the gold (docs/TASKS.md, section "Answers").
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import orjson
from dateutil import parser as dateparser

KINDS = ("id", "ids", "int", "number", "datetime", "date", "text", "bool")


class _NotFound:
    """The structured "nothing found" answer (a singleton)."""

    def __repr__(self) -> str:
        return "NOT_FOUND"

    def __reduce__(self) -> str:
        return "NOT_FOUND"


NOT_FOUND: Any = _NotFound()


@dataclass(frozen=True)
class Contradiction:
    """An answer that does not commit: it says two things at once (never equal to any gold)."""

    why: str

_PLACEHOLDER = {
    "id": "<id>", "ids": ["<id>", "..."], "int": 0, "number": 0.0, "datetime": "<YYYY-MM-DDThh:mm:ssZ>",
    "date": "<YYYY-MM-DD>", "text": "<text>", "bool": True,
}
#: A string that is not one of the placeholders above (a small model copied ``"<text>"`` as its answer).
_NOT_PLACEHOLDER = {"type": "string", "pattern": "^[^<].*$"}
#: JSON schema of each kind, for constrained decoding (a model can then write no other shape).
_SCHEMA: dict[str, dict] = {
    "id": _NOT_PLACEHOLDER, "ids": {"type": "array", "items": _NOT_PLACEHOLDER}, "int": {"type": "integer"},
    "number": {"type": "number"}, "datetime": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"}, "text": _NOT_PLACEHOLDER, "bool": {"type": "boolean"},
}
NOT_FOUND_SCHEMA = {"type": "object", "properties": {"found": {"const": False}}, "required": ["found"]}


@dataclass(frozen=True)
class Field:
    name: str
    kind: str
    description: str = ""
    tolerance: float = 0.0  # for kind "number": absolute tolerance

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown answer kind {self.kind!r}")


@dataclass(frozen=True)
class AnswerSpec:
    """What the final answer must contain. ``none_allowed``: the prompt offers the "nothing found" form."""

    fields: tuple[Field, ...]
    none_allowed: bool = False

    def instructions(self) -> str:
        """The format statement every prompt ends with."""
        example = {f.name: _PLACEHOLDER[f.kind] for f in self.fields}
        text = ("Finish with your final answer as JSON inside answer tags, exactly like: <answer>"
                + orjson.dumps(example).decode() + "</answer>")
        details = [f"{f.name}: {f.description}" for f in self.fields if f.description]
        if details:
            text += " (" + "; ".join(details) + ")"
        if self.none_allowed:
            text += '. If nothing matches, answer <answer>{"found": false}</answer>'
        return text + "."

    def json_schema(self) -> dict:
        """The answer object as JSON schema: every field required, of its kind; or ``{"found": false}``."""
        obj = {"type": "object", "properties": {f.name: _SCHEMA[f.kind] for f in self.fields},
               "required": [f.name for f in self.fields]}
        return {"anyOf": [obj, NOT_FOUND_SCHEMA]} if self.none_allowed else obj

    def parse(self, text: str | None) -> dict | Any | None:
        """The answer as ``{field: raw value}``, NOT_FOUND, or None when no answer can be read."""
        return parse_answer(text, self)

    def compare(self, got: Any, gold: Any) -> list[str]:
        """Reasons the parsed answer differs from the gold one (empty = correct)."""
        if isinstance(got, Contradiction):
            return [f"the answer does not commit: {got.why}"]
        if gold is NOT_FOUND:
            return [] if got is NOT_FOUND else ["expected the 'nothing found' answer"]
        if got is None:
            return ["no answer in the required format"]
        if got is NOT_FOUND:
            return ["answered 'nothing found' but there is an answer"]
        reasons = []
        for f in self.fields:
            if f.name not in got:
                reasons.append(f"answer lacks {f.name!r}")
                continue
            if not same(f, got[f.name], gold[f.name]):
                reasons.append(f"{f.name}: got {got[f.name]!r}, expected {render(gold[f.name])!r}")
        return reasons


_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_NONE_WORDS = {"none", "null", "not found", "nothing found", "no", "n/a", "no match", "no results", "found: false"}


def _loads(text: str) -> Any:
    text = text.strip()
    if text.startswith("```"):
        text = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", text)
    for attempt in (lambda t: orjson.loads(t), lambda t: ast.literal_eval(t)):
        try:
            return attempt(text)
        except Exception:
            continue
    return text


def _last_json_object(text: str) -> str | None:
    """The last balanced {...} in text (strings respected)."""
    end = text.rfind("}")
    while end != -1:
        depth = 0
        for i in range(end, -1, -1):
            ch = text[i]
            if ch == "}":
                depth += 1
            elif ch == "{":
                depth -= 1
                if depth == 0:
                    return text[i : end + 1]
        end = text.rfind("}", 0, end)
    return None


def _is_none(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        low = {str(k).lower(): v for k, v in value.items()}
        found = low.get("found")
        return found is False or (isinstance(found, str) and found.lower() in ("false", "no"))
    if isinstance(value, list):
        return len(value) == 0
    if isinstance(value, str):
        return value.strip().strip(".").lower() in _NONE_WORDS
    return False


def parse_answer(text: str | None, spec: AnswerSpec) -> Any:
    if not text or not text.strip():
        return None
    tags = _TAG.findall(text)
    if len(tags) > 1:
        readings = [_read(_loads(t), spec) for t in tags]
        if not all(_agree(spec, r, readings[-1]) for r in readings):
            return Contradiction(f"{len(tags)} answer tags that disagree")
        return readings[-1]
    if tags:
        return _read(_loads(tags[0]), spec)
    obj = _last_json_object(text)
    return None if obj is None else _read(_loads(obj), spec)


def _agree(spec: AnswerSpec, a: Any, b: Any) -> bool:
    """Two readings of one reply say the same (a restated answer), by the meaning of each field."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return a == b
    if a.keys() != b.keys():
        return False
    try:
        return all(same(f, a[f.name], b[f.name] if f.kind == "ids" else one_value(f.kind, b[f.name]))
                   for f in spec.fields if f.name in a)
    except _Hedged:
        return False


def _read(raw: Any, spec: AnswerSpec) -> Any:
    """One parsed answer payload as ``{field: raw value}``, NOT_FOUND, a Contradiction or None."""
    if isinstance(raw, dict) and _is_none(raw) and _matches_fields(raw, spec):
        return Contradiction("it says nothing was found and names a value")
    if isinstance(raw, dict) and raw and not _matches_fields(raw, spec) and not _is_none(raw):
        low = {str(k).strip().lower(): v for k, v in raw.items()}
        if low.get("found") in (True, "true", "yes"):
            return None  # "found" without the value: no answer
        if any(f.name.lower() in low for f in spec.fields):
            return NOT_FOUND  # every field present is null or empty: nothing found
    if _is_none(raw) and not (isinstance(raw, dict) and _matches_fields(raw, spec)):
        return NOT_FOUND
    if isinstance(raw, dict):
        low = {str(k).strip().lower(): v for k, v in raw.items()}
        out = {f.name: low[f.name.lower()] for f in spec.fields if f.name.lower() in low}
        if not out and len(spec.fields) == 1 and len(low) == 1:
            out = {spec.fields[0].name: next(iter(low.values()))}
        return out
    if len(spec.fields) == 1:  # a bare value for a one-field answer: <answer>3</answer>
        return {spec.fields[0].name: raw}
    return None


def _matches_fields(raw: dict, spec: AnswerSpec) -> bool:
    names = {f.name.lower() for f in spec.fields}
    return any(str(k).lower() in names and v not in (None, [], "") for k, v in raw.items())


# -- comparison ---------------------------------------------------------------------------------------

def norm_id(value: Any) -> str:
    """``Slot/12``, ``http://x/fhir/Slot/12/_history/2`` and ``12`` all give ``12``."""
    text = str(value).strip().strip("'\"")
    text = re.sub(r"/_history/[^/]+$", "", text)
    return text.rsplit("/", 1)[-1]


def parse_instant(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        dt = value
    else:
        text = str(value).strip()
        try:
            dt = datetime.fromisoformat(text)  # the common case, 100× faster than dateutil
        except ValueError:
            try:
                dt = dateparser.parse(text)
            except (ValueError, OverflowError, TypeError):
                return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def parse_day(value: Any) -> date | None:
    if isinstance(value, date) and not isinstance(value, datetime):
        return value
    text = str(value).strip()
    if len(text) == 10:
        try:
            return date.fromisoformat(text)
        except ValueError:
            pass
    try:
        return dateparser.parse(str(value).strip()).date()
    except (ValueError, OverflowError, TypeError):
        return None


def _text(value: Any) -> str:
    return re.sub(r"[\s.,;:!]+", " ", str(value)).strip().casefold()


_SEPARATORS = re.compile(r"[,;\s]+(?:(?:or|and)[,;\s]+)?", re.I)
#: A number in running text, not the digit of a word (``HbA1c``) or of a longer token.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w.])")


def _id_of(value: Any) -> Any:
    """A Reference object or a resource stands for its id."""
    if isinstance(value, dict):
        low = {str(k).lower(): v for k, v in value.items()}
        return low.get("reference") or low.get("id") or value
    return value


def _ids(value: Any) -> set[str] | None:
    if isinstance(value, str):
        value = [v for v in _SEPARATORS.split(value) if v]
    if not isinstance(value, list | tuple | set):
        return None
    return {norm_id(_id_of(v)) for v in value}


class _Hedged(Exception):
    """A field names several candidates for one value."""


def one_value(kind: str, got: Any) -> Any:
    """The one value a field commits to, read generously; raises :class:`_Hedged` if it names several."""
    if isinstance(got, list | tuple):
        if len(got) != 1:
            raise _Hedged
        got = got[0]
    if kind == "id":
        got = _id_of(got)
        if isinstance(got, str) and len({norm_id(t) for t in _SEPARATORS.split(got) if t}) > 1:
            raise _Hedged
    elif kind in ("int", "number"):
        if isinstance(got, dict):  # a Quantity
            got = {str(k).lower(): v for k, v in got.items()}.get("value", got)
        if isinstance(got, str):
            numbers = {float(n.replace(",", "")) for n in _NUMBER.findall(got)}
            if len(numbers) > 1:
                raise _Hedged
            got = numbers.pop() if numbers else got
    return got


def same(field: Field, got: Any, gold: Any) -> bool:
    kind = field.kind
    if kind == "ids":
        return _ids(got) == _ids(gold)
    try:
        got = one_value(kind, got)
    except _Hedged:
        return False
    if kind == "id":  # a list of gold ids: any of them is right (e.g. ties)
        golds = gold if isinstance(gold, list | tuple | set) else [gold]
        return not isinstance(got, list | dict) and norm_id(got) in {norm_id(g) for g in golds}
    if kind in ("int", "number"):
        if isinstance(got, bool):
            return False
        try:
            g = float(str(got).strip().replace(",", ""))
        except ValueError:
            return False
        if kind == "int":
            return g == int(gold)
        return abs(g - float(gold)) <= max(field.tolerance, 1e-9)
    if kind == "datetime":
        a, b = parse_instant(got), parse_instant(gold)
        return a is not None and b is not None and abs((a - b).total_seconds()) < 60
    if kind == "date":
        a, b = parse_day(got), parse_day(gold)
        return a is not None and a == b
    if kind == "bool":
        if isinstance(got, str):
            got = {"true": True, "yes": True, "false": False, "no": False}.get(got.strip().lower(), got)
        return got is bool(gold)
    alternatives = gold if isinstance(gold, list | tuple) else [gold]
    return any(_text(got) == _text(alt) for alt in alternatives)


def render(value: Any) -> Any:
    """A gold value as JSON shows it (for prompts' debug output, reasons and transcripts)."""
    if value is NOT_FOUND:
        return {"found": False}
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: render(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [render(v) for v in (sorted(value) if isinstance(value, set) else value)]
    return value


def answer_text(value: Any) -> str:
    """The answer an agent that knows the gold would give (the reference agent's final text)."""
    return "<answer>" + orjson.dumps(render(value)).decode() + "</answer>"
