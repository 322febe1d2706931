"""What every world generator receives: the seed, the anchor date and the resources made so far.

Generators are plain functions ``generate(ctx) -> list[dict]`` that return new resources (with ids)
and may amend resources already in ``ctx``. Randomness comes only from ``ctx.rng(name)``: one
independent, seeded stream per generator, so adding a generator never changes what the others draw.
Nothing reads the wall clock: dates are computed from ``ctx.anchor`` (the world's "today").
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta


@dataclass
class WorldContext:
    seed: int
    anchor: date
    resources: list[dict] = field(default_factory=list)
    _streams: dict[str, random.Random] = field(default_factory=dict)
    _index: dict[str, list[dict]] | None = None

    # -- randomness ------------------------------------------------------------------------------
    def rng(self, name: str) -> random.Random:
        """The seeded random stream of one generator (same seed + name ⇒ same draws)."""
        if name not in self._streams:
            digest = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
            self._streams[name] = random.Random(int.from_bytes(digest[:8], "big"))
        return self._streams[name]

    def new_id(self, stream: str = "ids") -> str:
        """A deterministic UUID-shaped id (ids look like Synthea's, so no id gives a generator away)."""
        return str(uuid.UUID(int=self.rng(f"id:{stream}").getrandbits(128), version=4))

    # -- time ------------------------------------------------------------------------------------
    def day(self, offset_days: int) -> date:
        return self.anchor + timedelta(days=offset_days)

    def instant(self, day: date, hour: int, minute: int = 0) -> str:
        """FHIR instant (UTC) for a wall-clock time on ``day``."""
        return datetime.combine(day, time(hour, minute), tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- resources -------------------------------------------------------------------------------
    def add(self, resources: list[dict]) -> None:
        self.resources.extend(resources)
        self._index = None

    def of_type(self, rtype: str) -> list[dict]:
        if self._index is None:
            index: dict[str, list[dict]] = defaultdict(list)
            for r in self.resources:
                index[r["resourceType"]].append(r)
            self._index = dict(index)
        return self._index.get(rtype, [])

    def patients(self) -> list[dict]:
        return self.of_type("Patient")
