"""The seed grammar every command shares (``--seeds``, inspect's ``-T seeds=``): N, a list or ranges."""

from __future__ import annotations

_HELP = "give N (seeds 0..N-1) or a list like 3,5 or 0-4"


def parse_seeds(value: str | int | list[int | str]) -> list[int]:
    """``5`` → seeds 0..4; ``3,7`` or ``2-4`` (or a mix: ``0-2,9``) → those seeds. A list (what inspect's CLI
    makes of ``-T seeds=0-2,9``) holds seeds and ranges: ``[3, "5-6"]`` → 3, 5, 6.

    Raises ValueError with a message that says what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: {_HELP}")
    if isinstance(value, list | tuple):
        parts = [str(v).strip() for v in value]
    else:
        text = str(value).strip()
        if text.isdigit():
            if int(text) == 0:
                raise ValueError("0 selects no seed: N means seeds 0..N-1, so seed 0 alone is 1 (or 0-0)")
            return list(range(int(text)))
        parts = text.split(",")
    out: list[int] = []
    try:
        for part in parts:
            lo, _, hi = part.partition("-")
            seeds = range(int(lo), int(hi) + 1) if hi else [int(lo)]
            if not seeds or not lo.strip().isdigit():  # 5-3, -1: a typo, not a request for nothing
                raise ValueError
            out.extend(seeds)
    except ValueError:
        raise ValueError(f"{value!r}: {_HELP}") from None
    if not out:
        raise ValueError(f"{value!r}: {_HELP}")
    return out
