"""Rewards from verdicts: deterministic given the transcript, the same in every adapter.

An action task's reward is its strict verdict (1 or 0). Two optional terms, off by default:
``light_weight`` gives a writing task that failed strict but made the essential change (the light
validator) that much, and ``format_penalty`` takes that much off per reply that tried to call a tool but
wrote no well-formed call. The reward never goes below 0 (a model cannot earn a negative return by
answering at once).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..tasks import Verdict


@dataclass(frozen=True)
class RewardSpec:
    light_weight: float = 0.0
    format_penalty: float = 0.0

    def reward(self, verdict: Verdict, malformed_turns: int = 0, writes: bool = False) -> float:
        value = 1.0 if verdict.success else (self.light_weight if writes and verdict.light_success else 0.0)
        return max(0.0, value - self.format_penalty * malformed_turns)
