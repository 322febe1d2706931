"""One episode's harness work at a time, however many episodes wait for their model at once.

Hundreds of episode threads in one process fight over the GIL: every SQLite statement and socket call releases it, and
winning it back costs context switches. An episode whose model is served elsewhere is nearly all waiting, so its thread
holds the gate (:func:`held`) while it runs harness code (tools, validation, building the next request) and lets go only
where it blocks (:func:`waiting`: the model's HTTP reply, a sandboxed code call); the waits overlap, the harness code
runs as if single-threaded. Measured at K = 256: 23 ms of CPU per episode ungated, 17 ms gated (docs/SCALE.md).

Only episodes whose agent says it waits here (``cooperative``) are gated: an agent that blocks elsewhere (its own HTTP
client, a program it runs) while holding the gate would stall every other one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_GATE = threading.Lock()
_held = threading.local()


@contextlib.contextmanager
def held(gated: bool = True) -> Iterator[None]:
    """Run the block as the one episode doing harness work (a no-op when not ``gated``, or when this
    thread already holds the gate)."""
    if not gated or getattr(_held, "on", False):
        yield
        return
    with _GATE:
        _held.on = True
        try:
            yield
        finally:
            _held.on = False


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """Around a blocking wait: another episode's harness work runs meanwhile (a no-op outside
    :func:`held`, and inside another ``waiting``)."""
    if not getattr(_held, "on", False):
        yield
        return
    _held.on = False
    _GATE.release()
    try:
        yield
    finally:
        _GATE.acquire()
        _held.on = True
