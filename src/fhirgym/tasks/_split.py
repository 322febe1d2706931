"""The fixed held-out split of the task families: which families may be learned from, which only measured.

Memory experiments train on its ``train`` side and evaluate on its ``eval`` side, and behaviour cloning
trains on ``train`` families only; shipped as data (``data/heldout_split.json``) so every result names the
same split. Stratified by (category, difficulty), each stratum shuffled with ``random.Random(19)`` and
alternated train/eval (the file's ``_doc`` says what changed since).
"""

from __future__ import annotations

import functools
from importlib.resources import files

import orjson


@functools.cache
def _split() -> dict[str, tuple[str, ...]]:
    data = orjson.loads(files("fhirgym.tasks").joinpath("data", "heldout_split.json").read_bytes())
    return {"train": tuple(data["train"]), "eval": tuple(data["eval"])}


def heldout_split() -> dict[str, list[str]]:
    """``{"train": [family ids], "eval": [family ids]}`` (a fresh copy)."""
    return {side: list(ids) for side, ids in _split().items()}
