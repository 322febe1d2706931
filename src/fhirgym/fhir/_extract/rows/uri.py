"""``uri`` rows ``(param, uri)``."""

from __future__ import annotations

from typing import Any


def u_uri(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str and v:
        out.append((code, v))
