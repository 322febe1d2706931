"""Dynamic sampling for TRL's GRPO: groups whose rewards are all equal are masked out of the loss.

DAPO drops such groups and samples more prompts until the batch is full; TRL 1.16 has neither. A group whose rewards are
all equal gets advantage 0 in every completion (reward minus the group mean), so it moves nothing, but its tokens still
count in the token-mean normaliser (``num_items_in_batch``) and dilute the gradient of the groups that carry signal.
:func:`mask_flat_groups` zeroes those groups' ``completion_mask`` and recounts ``num_items_in_batch`` over what is left:
**mask, not resample** (SkyRL's ``zero_variance_filter=true``), so a batch may train on fewer groups than it sampled
(all of them are logged). The trainer subclass applies it to the output of TRL's private
``GRPOTrainer._generate_and_score_completions`` (pinned ``trl==1.16.0``; ``tests/test_rl_math.py`` fails if that hook's
name, signature or output keys change).
"""

from __future__ import annotations

from typing import Any

#: The keys of ``_generate_and_score_completions``' output that the mask reads and writes.
HOOK_KEYS = ("completion_mask", "advantages", "num_items_in_batch")


def flat_groups(advantages: Any, group_size: int) -> Any:
    """A bool per group of ``group_size`` consecutive completions: True where every advantage is 0
    (under GRPO's group normalisation that is exactly "all rewards equal")."""
    if advantages.numel() % group_size:
        raise ValueError(f"{advantages.numel()} completions do not form groups of {group_size}")
    return (advantages.reshape(-1, group_size) == 0).all(dim=1)


def mask_flat_groups(batch: dict[str, Any], group_size: int) -> tuple[dict[str, Any], int]:
    """``batch`` with the flat groups' completions masked out of the loss and ``num_items_in_batch``
    recounted (model tokens only: ``tool_mask`` stays applied); returns it and how many groups were masked.
    The rows must still be in group order (TRL shuffles them only after this hook)."""
    flat = flat_groups(batch["advantages"], group_size)
    rows = flat.repeat_interleave(group_size)
    keep = (~rows).unsqueeze(1).to(batch["completion_mask"].dtype)
    batch["completion_mask"] = batch["completion_mask"] * keep
    loss_mask = batch["completion_mask"] if batch.get("tool_mask") is None else batch["completion_mask"] * batch["tool_mask"]
    batch["num_items_in_batch"] = loss_mask.sum()
    return batch, int(flat.sum())


def dynamic_trainer_class(base: type | None = None) -> type:
    """``base`` (default ``GRPOTrainer``) with :func:`mask_flat_groups` applied to every generation batch
    (built on first use: TRL is an optional dependency). One process only: with several, a process's slice
    of the batch need not hold whole groups."""
    if base is None:
        from trl import GRPOTrainer as base

    class DynamicSamplingGRPOTrainer(base):  # type: ignore[misc, valid-type]
        """GRPO plus dynamic sampling by masking (see :mod:`fhirgym.rl._dynamic`)."""

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            if self.accelerator.num_processes != 1:
                raise RuntimeError("dynamic sampling by masking runs on one process (the CPU trainer)")
            mode = "train" if self.model.training else "eval"
            if mode == "train":
                group = self.num_generations
                out, masked = mask_flat_groups(out, group)
                self._metrics[mode]["dynamic/masked_group_frac"].append(masked / (out["advantages"].numel() / group))
            return out

    return DynamicSamplingGRPOTrainer
