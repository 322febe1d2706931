"""De-identification of lessons: no value of a training instance may reach the memory.

Before a lesson is stored (and before a critique or a model's malformed reply reaches the training log,
which lives in the same shareable directory), every value the training instance carries — its parameters (names, ids,
dates, codes, phone numbers, member ids), its setup resources' ids, its gold answer's values — is
replaced by a placeholder named for its kind (``<NAME>``, ``<ID>``, ``<DATE>``, ``<PHONE>``,
``<MEMBER_ID>``, ``<VALUE>``); then patterns catch what the transcript may have added (UUIDs, ISO dates
and times, phone numbers, long digit runs). Lessons are about *how* to work, so nothing is lost.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_DATETIME = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b")
_SLASH_DATE = re.compile(r"\b\d{1,2}/\d{1,2}/\d{2,4}\b")
_PHONE = re.compile(r"(?<!\w)(?:\+?1[ .-]?)?\(?\d{3}\)?[ .-]?\d{3}[ .-]?\d{4}(?!\w)")
_TIME = re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")
_LONG_DIGITS = re.compile(r"\b\d{5,}\b")
#: Reference-like ``Type/id`` pairs where the id is not a placeholder already.
_REF = re.compile(r"\b([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]{1,64})\b")
_CODE_WORD = re.compile(r"[a-z][a-z\-]*")
_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December")
_WORD_DATE = re.compile(rf"\b(?:{_MONTHS})\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,\s*\d{{4}})?\b|\b\d{{1,2}}\s+(?:{_MONTHS})"
                        r"(?:\s+\d{4})?\b")


def _kind(key: str, value: str) -> str:
    low = key.lower()
    if "member" in low or "subscriber" in low or "policy" in low:
        return "<MEMBER_ID>"
    if "phone" in low or "telecom" in low or _PHONE.fullmatch(value.strip()):
        return "<PHONE>"
    if "date" in low or "time" in low or "birth" in low or _DATETIME.fullmatch(value) or _WORD_DATE.fullmatch(value):
        return "<DATE>"
    if "name" in low or "practitioner" in low or "doctor" in low or ("patient" in low and not low.endswith("id")):
        return "<NAME>"
    if low.endswith("id") or low.endswith("ids") or _UUID.fullmatch(value) or "identifier" in low:
        return "<ID>"
    return "<VALUE>"


def _walk(value: Any, key: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list | tuple | set):
        for v in value:
            yield from _walk(v, key)
    elif value is not None and not isinstance(value, bool):
        yield key, str(value)


def sensitive_values(params: dict, answer: Any = None, setup: list[dict] | None = None) -> dict[str, str]:
    """value → placeholder for everything of one instance that must not be stored."""
    out: dict[str, str] = {}

    def add(key: str, text: str, kind: str | None = None, shortest: int = 2) -> None:
        text = text.strip()
        if len(text) < shortest or text.startswith("<"):
            return
        kind = kind or _kind(key, text)
        out.setdefault(text, kind)
        if kind == "<NAME>":  # the parts of a name on their own ("Diaz", "Maria")
            for part in re.split(r"[\s,]+", text):
                if len(part) >= 3 and part[0].isupper():
                    out.setdefault(part, kind)
        if kind == "<DATE>" and "T" in text:
            out.setdefault(text.split("T")[0], kind)

    for key, text in _walk(params):
        if not (_kind(key, text) == "<VALUE>" and _CODE_WORD.fullmatch(text)):  # keep "booked", "final"
            add(key, text)
    for key, text in _walk(answer):
        add(key, text, "<VALUE>" if not _kind(key, text).startswith(("<DATE", "<ID", "<NAME")) else None, 1)
    for resource in setup or []:
        if resource.get("id"):
            add("id", str(resource["id"]), "<ID>")
        for name in resource.get("name") or []:
            if isinstance(name, dict):
                for part in [*name.get("given", []), name.get("family", "")]:
                    add("name", str(part), "<NAME>")
        for ident in resource.get("identifier") or []:
            if isinstance(ident, dict) and ident.get("value"):
                add("identifier", str(ident["value"]), "<ID>")
        for tel in resource.get("telecom") or []:
            if isinstance(tel, dict) and tel.get("value"):
                add("phone", str(tel["value"]), "<PHONE>")
    return out


def deidentify_all(value: Any, values: dict[str, str]) -> Any:
    """Every string in a JSON value de-identified (:func:`deidentify`), keys included."""
    if isinstance(value, str):
        return deidentify(value, values)
    if isinstance(value, dict):
        return {deidentify(str(k), values): deidentify_all(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [deidentify_all(v, values) for v in value]
    return value


def deidentify(text: str, values: dict[str, str]) -> str:
    """``text`` with every listed value and every id/date/phone-like pattern replaced by a placeholder."""
    for value in sorted(values, key=len, reverse=True):  # longest first: "Maria Diaz" before "Diaz"
        pattern = re.escape(value)
        if value[:1].isalnum():
            pattern = r"(?<![\w-])" + pattern
        if value[-1:].isalnum():
            pattern += r"(?![\w-])"
        text = re.sub(pattern, values[value], text, flags=re.I)
    text = _UUID.sub("<ID>", text)
    text = _REF.sub(lambda m: m.group(0) if m.group(2).startswith("<") or not any(c.isdigit() for c in m.group(2))
                    else f"{m.group(1)}/<ID>", text)
    text = _DATETIME.sub("<DATE>", text)
    text = _SLASH_DATE.sub("<DATE>", text)
    text = _WORD_DATE.sub("<DATE>", text)
    text = _PHONE.sub("<PHONE>", text)
    text = _TIME.sub("<TIME>", text)
    return _LONG_DIGITS.sub("<VALUE>", text)
