"""The seed grammar every command shares (``--seeds``, inspect's ``-T seeds=``): N, a list or ranges."""

from __future__ import annotations


def parse_seeds(value: str | int | list[int]) -> list[int]:
    """``5`` → seeds 0..4; ``3,7`` or ``2-4`` (or a mix: ``0-2,9``) → those seeds; a list of ints as given.

    Raises ValueError with a message that says what is accepted.
    """
    if isinstance(value, list):
        if not value or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value):
            raise ValueError(f"{value!r}: a list of seeds must hold non-negative integers")
        return list(value)
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: give N (seeds 0..N-1) or a list like 3,5 or 0-4")
    text = str(value).strip()
    if text.isdigit():
        if int(text) == 0:
            raise ValueError("0 selects no seed: N means seeds 0..N-1, so seed 0 alone is 1 (or 0-0)")
        return list(range(int(text)))
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            seeds = range(int(lo), int(hi) + 1) if hi else [int(lo)]
            if not seeds:  # 5-3: an empty range is a typo, not a request for nothing
                raise ValueError
            out.extend(seeds)
    except ValueError:
        raise ValueError(f"{value!r}: give N (seeds 0..N-1) or a list like 3,5 or 0-4") from None
    return out
