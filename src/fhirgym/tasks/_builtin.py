"""The built-in task library, loaded when the registry is first asked for families."""

from __future__ import annotations

from ._family import LOADERS


def _load() -> None:
    from . import library  # noqa: F401  (importing it registers the built-in families)


LOADERS.append(_load)
