"""Pausing Python's cyclic garbage collector around bulk work.

Parsing, generating or loading hundreds of thousands of JSON dicts triggers a full collection every
few thousand allocations, and each one walks every live container: on a 100-patient world that was
about a third of the parse and build time (a 230 MB ``orjson.loads``: 8.6 s, 3.3 s paused). JSON
trees hold no reference cycles (reference counting frees them), so the collections skipped inside the
block find nothing that the next automatic one after it would not.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collections inside the block (nests; restores the previous state)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
