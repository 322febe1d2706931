"""FHIR JSON with exact decimals: ``0.010`` stays ``0.010``, ``1.50`` stays ``1.50``.

FHIR says a decimal's precision is part of its value (R4 datatypes: "0.010 is regarded as different to 0.01"), but JSON
libraries parse numbers into floats and print their shortest form. Here a number whose text a float would not reproduce
is parsed into a :class:`FhirDecimal`: a ``float`` (so arithmetic, comparisons and ``isinstance(v, float)`` work as
before) that remembers its exact text, which :func:`dumps` writes back byte for byte. Stored resources were written by
:func:`dumps`, so most come back through orjson alone: the exact (slower) parser runs only when re-serialising orjson's
result would not give the same bytes. Request bodies come from anyone: :func:`parse_body` measures their nesting first
(``json_depth``) and finds the numbers a float would change by scanning the text (strings blanked out), not by
re-serialising the body, which orjson refuses beyond 254 levels.
"""

from __future__ import annotations

import copy
import json
import re
from decimal import Decimal
from typing import Any

import orjson

from .._gc import gc_paused

#: An integer in JSON text that a Python ``int`` reproduces and orjson can write (64-bit).
_I64 = (-(2**63), 2**64 - 1)
_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)")


class FhirDecimal(float):
    """A JSON number as written: its float value, and ``text``, the exact form kept and written back."""

    __slots__ = ("text",)

    text: str

    def __new__(cls, text: str) -> FhirDecimal:
        self = super().__new__(cls, text)
        self.text = text
        return self

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __reduce__(self) -> tuple:
        return (FhirDecimal, (self.text,))

    def __copy__(self) -> FhirDecimal:
        return self

    def __deepcopy__(self, memo: dict) -> FhirDecimal:
        return self

    @property
    def is_integer_text(self) -> bool:
        """Whether it was written as an integer (``-0``, or one beyond 64 bits)."""
        return _INT_TEXT.fullmatch(self.text) is not None


def _number(text: str) -> float | FhirDecimal:
    """A plain float only when orjson writes it back as ``text`` (not Python's repr: 1e+16 vs 1e16)."""
    value = float(text)
    return value if orjson.dumps(value) == text.encode() else FhirDecimal(text)


def _integer(text: str) -> int | FhirDecimal:
    value = int(text)
    return value if _I64[0] <= value <= _I64[1] and text != "-0" else FhirDecimal(text)


def _constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_float=_number, parse_int=_integer, parse_constant=_constant)


def json_default(obj: Any) -> Any:
    """orjson's ``default``: exact decimals as written (``decimal.Decimal`` as ``str()`` gives them)."""
    if type(obj) is FhirDecimal:
        return orjson.Fragment(obj.text)
    if isinstance(obj, Decimal) and obj.is_finite():
        return orjson.Fragment(str(obj))
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def json_default_str(obj: Any) -> Any:
    """:func:`json_default`, and ``str(obj)`` for anything else (tool outputs, logs)."""
    try:
        return json_default(obj)
    except TypeError:
        return str(obj)


def dumps(obj: Any, option: int = 0) -> bytes:
    """orjson's ``dumps`` writing every :class:`FhirDecimal` exactly as it was read."""
    return orjson.dumps(obj, default=json_default, option=option)


def loads(data: bytes | str) -> Any:
    """Parse JSON, keeping each number's exact form (see the module docstring).

    Raises ``orjson.JSONDecodeError`` (a ``ValueError``) for anything orjson would refuse: invalid
    UTF-8, lone surrogates, NaN/Infinity, numbers beyond a double's range, nesting beyond 1024.
    """
    obj = orjson.loads(data)
    raw = data.encode() if isinstance(data, str) else data
    try:
        same = orjson.dumps(obj) == raw
    except TypeError:  # nested beyond what orjson writes: not ours, so the careful way
        same = False
    return obj if same else _DECODER.decode(raw.decode())


def copy_json(obj: Any) -> Any:
    """A deep copy of a JSON value, exact decimals included, through its serialised form: a dozen times
    faster than ``copy.deepcopy`` (a 120,000-entry Bundle: 1 s), and done in C, which matters when a
    request's deadline waits for it. What is not JSON (sets, objects) is copied by ``deepcopy``."""
    try:
        with gc_paused():
            return loads(dumps(obj))
    except TypeError:
        return copy.deepcopy(obj)


#: what is left of a JSON text once its strings are blanked out and everything but brackets is dropped:
#: innermost pairs
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_PAIR = re.compile(rb"\{\}|\[\]")
#: numbers a float (or orjson's 64-bit integers) might not reproduce: fractions, exponents, -0, long integers
_INEXACT = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?[eE][+-]?[0-9]+|-?[0-9]+\.[0-9]+|-0(?![0-9])|-?[0-9]{19,}")


def _blanked(text: bytes) -> bytes:
    """Valid JSON ``text`` with every string emptied (``"a[b"`` -> ``""``): once the escaped backslashes
    and quotes are gone, every other quote opens or closes a string. In C: a regex over a Bundle's
    150,000 strings cost twice as much."""
    return b'""'.join(text.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])


def json_depth(text: bytes, limit: int) -> int:
    """How deeply arrays and objects nest in valid JSON ``text`` (``{"a": [1]}``: 2), counted up to
    ``limit + 1``."""
    return _depth(_blanked(text), limit)


def _depth(blanked: bytes, limit: int) -> int:
    """:func:`json_depth` of a text whose strings are blanked out: each pass of a C-speed substitution
    removes the innermost level."""
    brackets = blanked.translate(None, _NOT_BRACKETS)
    depth = 0
    while brackets and depth <= limit:
        brackets = _PAIR.sub(b"", brackets)
        depth += 1
    return depth


def deeper_than(obj: Any, limit: int) -> bool:
    """Whether a JSON value nests arrays and objects more than ``limit`` levels, from its indented form:
    orjson indents each level by two spaces and strings hold no raw newline, so a line indented past
    ``limit`` levels (or an empty one at it) says so; C-speed searches, no walk of the value. Raises
    ``TypeError`` for what is not JSON."""
    try:
        text = dumps(obj, option=orjson.OPT_INDENT_2)
    except TypeError as exc:
        if "Recursion" in str(exc):  # beyond what orjson writes (254 levels), so beyond any limit of ours
            return True
        raise
    pad = b"\n" + b" " * (2 * limit)
    return pad + b"  " in text or pad + b"[]" in text or pad + b"{}" in text


def parse_body(text: bytes, max_depth: int) -> tuple[Any, int]:
    """A request body as :func:`loads` gives it, and its nesting depth (counted up to ``max_depth + 1``;
    the caller refuses more, and then nothing else has looked at the body). Raises ``ValueError`` for
    what is not JSON (as :func:`loads`)."""
    with gc_paused():  # a large body is a million containers: collections would walk them again and again
        obj = orjson.loads(text)
    blanked = _blanked(text)
    depth = _depth(blanked, max_depth)
    if depth > max_depth:
        return None, depth
    for m in _INEXACT.finditer(blanked):
        token = m[0]
        if b"." in token or b"e" in token or b"E" in token:
            exact = orjson.dumps(float(token)) == token
        else:
            exact = token != b"-0" and _I64[0] <= int(token) <= _I64[1]
        if not exact:
            return _DECODER.decode(text.decode()), depth
    return obj, depth
