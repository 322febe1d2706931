"""Value conventions shared by indexing (write time) and searching (query time).

Both sides must agree exactly on how a string is normalised and how a date or number becomes a range,
so the functions live here once. Dates become half-open ranges of epoch seconds ``[lo, hi)`` at the
precision they were written with (``2024`` is the whole year), which is what FHIR's prefix semantics
compare.
"""

from __future__ import annotations

import calendar
import math
import re
import unicodedata
from decimal import Decimal

#: Stand-ins for open period ends (SQLite REAL handles them, and they sort correctly).
MIN_TIME = -1.0e18
MAX_TIME = 1.0e18

#: ``re.ASCII``: otherwise ``\d`` also matches '²', fullwidth and Arabic-Indic digits, which int() accepts.
_DATE_RE = re.compile(
    r"^(?P<y>\d{4})(?:-(?P<m>\d{2})(?:-(?P<d>\d{2})"
    r"(?:T(?P<H>\d{2})(?::(?P<M>\d{2})(?::(?P<S>\d{2})(?P<f>\.\d+)?)?)?"
    r"(?P<tz>Z|[+-]\d{2}:\d{2})?)?)?)?$",
    re.ASCII,
)

#: FHIR's decimal (R4 datatypes). Python's Decimal() would also take '1_000', '+1', '.5', 'NaN',
#: 'Infinity' and non-ASCII digits, none of which is a FHIR number.
_DECIMAL_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
#: Largest decimal exponent of a finite float (1.7e308): the index cannot compare numbers beyond it.
_MAX_EXPONENT = 308

#: The span FHIR's years 0001-9999 cover in UTC. A time-zone offset can move an instant of the first or
#: last day outside it, where callers converting to :class:`datetime` would fail: ranges are clamped.
FIRST_INSTANT = float(calendar.timegm((1, 1, 1, 0, 0, 0, 0, 0, 0)))
END_INSTANT = float(calendar.timegm((9999, 12, 31, 0, 0, 0, 0, 0, 0)) + 86400)


def normalize_string(value: str) -> str:
    """Case- and accent-insensitive form used by string search (FHIR's default matching)."""
    decomposed = unicodedata.normalize("NFKD", value)
    stripped = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(stripped.casefold().split())


def date_range(value: str) -> tuple[float, float]:
    """``[lo, hi)`` in epoch seconds for a FHIR date, dateTime or instant (any precision).

    Raises ValueError for anything that is not a valid FHIR date/time. Values without a time zone are
    taken as UTC (FHIR leaves them server-defined).
    """
    m = _DATE_RE.match(value.strip()) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"not a FHIR date/dateTime: {value!r}")
    year = int(m["y"])
    if year == 0:
        raise ValueError(f"year 0000 does not exist in {value!r}")
    month = int(m["m"] or 1)
    day = int(m["d"] or 1)
    if not 1 <= month <= 12:
        raise ValueError(f"month out of range in {value!r}")
    if not 1 <= day <= calendar.monthrange(year, month)[1]:
        raise ValueError(f"day out of range in {value!r}")
    hour = int(m["H"] or 0)
    minute = int(m["M"] or 0)
    second = int(m["S"] or 0)
    if hour > 23 or minute > 59 or second > 60:
        raise ValueError(f"time out of range in {value!r}")
    if m["H"] is not None and m["M"] is None:
        raise ValueError(f"hour without minutes in {value!r}")
    offset = 0
    tz = m["tz"]
    if tz and tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        if int(tz[1:3]) > 14 or int(tz[4:6]) > 59:
            raise ValueError(f"time zone offset out of range in {value!r}")
        offset = sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    base = calendar.timegm((year, month, day, hour, minute, min(second, 59), 0, 0, 0)) - offset
    if m["m"] is None:
        lo, hi = float(base), _month_start(year + 1, 1)
    elif m["d"] is None:
        lo, hi = float(base), _month_start(year + (month == 12), month % 12 + 1)
    elif m["H"] is None:
        lo, hi = float(base), float(base + 86400)
    elif m["S"] is None:
        lo, hi = float(base), float(base + 60)
    elif m["f"]:
        lo = base + float("0" + m["f"])
        hi = lo + 10.0 ** -(len(m["f"]) - 1)
    else:
        lo, hi = float(base), float(base + 1)
    return min(max(lo, FIRST_INSTANT), END_INSTANT), min(max(hi, FIRST_INSTANT), END_INSTANT)


def _month_start(year: int, month: int) -> float:
    """Epoch seconds of the first of a month; year 10000 (the end of 9999) is beyond :mod:`datetime`."""
    return END_INSTANT if year > 9999 else float(calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0)))


def number_range(value: str | float | int) -> tuple[float, float, float]:
    """``(lo, hi, value)``: the implicit precision range of a number as written (``100`` → [99.5, 100.5)).

    Raises ValueError (only) for anything but a FHIR decimal, and for numbers beyond the range of the
    floats the index compares (``1e999999999`` would otherwise overflow Decimal's context).
    """
    text = str(value).strip()
    if not _DECIMAL_RE.fullmatch(text):
        raise ValueError(f"{value!r} is not a FHIR decimal")
    d = Decimal(text)
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)
    if d.adjusted() > _MAX_EXPONENT:  # also a zero written with a huge exponent, 0e999999999
        raise ValueError(f"{value!r} is beyond the range of searchable numbers (±1.7e308)")
    try:
        half = Decimal(5) * Decimal(10) ** (exponent - 1)
        out = float(d - half), float(d + half), float(d)
    except ArithmeticError as exc:  # decimal's signals; unreachable within the bounds above
        raise ValueError(f"{value!r} is beyond the range of searchable numbers (±1.7e308)") from exc
    if not all(map(math.isfinite, out)):
        raise ValueError(f"{value!r} is beyond the range of searchable numbers (±1.7e308)")
    return out


def split_reference(ref: str) -> tuple[str | None, str | None, str | None]:
    """Split a Reference.reference into ``(type, id, version)``; Nones when it is not Type/id shaped.

    Accepts relative (``Patient/1``), versioned (``Patient/1/_history/2``) and absolute URLs
    (``http://x/fhir/Patient/1``). The caller decides whether the type is a real resource type.
    """
    if not ref or ref.startswith("#") or ref.startswith("urn:"):
        return None, None, None
    path = ref.split("?", 1)[0]
    parts = path.rstrip("/").split("/")
    version = None
    if len(parts) >= 4 and parts[-2] == "_history":
        version = parts[-1]
        parts = parts[:-2]
    if len(parts) >= 2 and parts[-2][:1].isupper() and parts[-1]:
        return parts[-2], parts[-1], version
    return None, None, None
