"""The worker-thread limiter for waits that last (a fhirgym agent's whole run, a replay's next turn).

Short synchronous work (an episode's tool call, a sandbox call) takes anyio's default limiter. A thread
that blocks for a long time takes this one instead: were it to hold a default token while it waits for
the event loop (a fhirgym agent asking inspect's model for a turn), many samples at once could hold every
token and leave none for the work they wait for. One limiter per event loop (``RunVar``).
"""

from __future__ import annotations

import anyio
from anyio.lowlevel import RunVar

#: Long waits at once per event loop: bounded in practice by inspect's --max-samples.
WAITS = 1024
_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("fhirgym_inspect_waits")


def waits() -> anyio.CapacityLimiter:
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(WAITS)
        _LIMITER.set(limiter)
        return limiter
