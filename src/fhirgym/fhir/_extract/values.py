"""Value conversions the row builders share, cached: Synthea repeats displays, dates and numbers a lot."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from .._json import FhirDecimal
from .._values import date_range, normalize_string, number_range, split_reference


class Memo(dict):
    """Cache whose hit is one C-level dict lookup (an lru_cache hit costs a Python-level call)."""

    __slots__ = ("fn", "limit")

    def __init__(self, fn: Callable[[Any], Any], limit: int = 1 << 16):
        super().__init__()
        self.fn = fn
        self.limit = limit

    def __missing__(self, key: Any) -> Any:
        if len(self) >= self.limit:
            self.clear()
        value = self[key] = self.fn(key)
        return value


def _date_or_none(value: str) -> tuple[float, float] | None:
    try:
        return date_range(value)
    except ValueError:
        return None


def _number_or_none(text: str) -> tuple[float, float, float] | None:
    try:
        return number_range(text)
    except ValueError:
        return None


norm = Memo(normalize_string).__getitem__
DATES = Memo(_date_or_none)
FLOATS = Memo(lambda v: _number_or_none(repr(v)))  # ints and floats apart: 1 == 1.0 but "1" != "1.0"
INTS = Memo(lambda v: _number_or_none(repr(v)))


def num_range(v: Any) -> tuple[float, float, float] | None:
    """Precision range of a JSON number, from its textual form; None for non-numbers (and bools)."""
    cls = v.__class__
    if cls is float:
        return FLOATS[v]
    if cls is int:
        return INTS[v]
    if cls is FhirDecimal:
        return _number_or_none(v.text)
    if cls is Decimal:
        return _number_or_none(str(v))
    return None


class RefTypes(Memo):
    """Reference string -> (type, id), the type only when it is a real resource type."""

    __slots__ = ()

    def __init__(self, known: frozenset[str]):
        def split(ref: str) -> tuple[str | None, str | None]:
            t, i, _ = split_reference(ref)
            return (t, i) if t in known else (None, None)

        super().__init__(split)


def date_of(v: Any) -> tuple[float, float] | None:
    return DATES[v] if v.__class__ is str else None
