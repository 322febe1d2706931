"""The GRPO math, by hand, against the trainer's own code (TRL 1.16's ``_compute_loss`` and advantages):
group advantages, symmetric vs clip-higher clipping on hand-made ratios, token-mean vs sequence-mean,
the dynamic-sampling filter and observation masking. Plus the pins on TRL's private hooks that the
trainer relies on: these tests fail if TRL changes them.

The numbers in the comments are worked out by hand; the code under test is TRL's, called on a stand-in
``self`` whose model returns the log-probabilities we chose.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from trl import GRPOTrainer  # noqa: E402

from fhirgym.rl._dynamic import HOOK_KEYS, dynamic_trainer_class, flat_groups, mask_flat_groups  # noqa: E402


def _trl_loss(logps, old_logps, advantages, mask, *, loss_type="dapo", eps_low=0.2, eps_high=0.2,
              tool_mask=None, steps_per_generation=1, grad_accum=1, is_weights=None):
    """TRL's ``_compute_loss`` on hand-made per-token log-probs; returns (loss, metrics). ``is_weights``:
    per-token importance weights of the sampler correction (TRL's ``importance_sampling_ratio``), on."""
    logps = torch.tensor(logps, dtype=torch.float64, requires_grad=True)
    mask_t = torch.tensor(mask, dtype=torch.float64)
    loss_mask = mask_t if tool_mask is None else mask_t * torch.tensor(tool_mask, dtype=torch.float64)

    class Acc:
        num_processes = 1
        sync_gradients = True

        def gather(self, x):
            return x

        def reduce(self, x, reduction="sum"):
            return x

    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0, aux_loss_enabled=False, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=0.0, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high,
        args=SimpleNamespace(delta=None, steps_per_generation=steps_per_generation, use_bias_correction_kl=False),
        use_vllm=is_weights is not None, vllm_importance_sampling_correction=True,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=grad_accum,
        accelerator=Acc(), _entropy_bonus_enabled=False, _metrics=defaultdict(lambda: defaultdict(list)),
        max_completion_length=len(mask[0]))
    n = len(mask)
    inputs = {"prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
              "completion_ids": torch.zeros(n, len(mask[0]), dtype=torch.long), "completion_mask": mask_t,
              "advantages": torch.tensor(advantages, dtype=torch.float64),
              "old_per_token_logps": torch.tensor(old_logps, dtype=torch.float64),
              "num_items_in_batch": loss_mask.sum()}
    if tool_mask is not None:
        inputs["tool_mask"] = torch.tensor(tool_mask, dtype=torch.float64)
    if is_weights is not None:
        inputs["importance_sampling_ratio"] = torch.tensor(is_weights, dtype=torch.float64)
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    return loss, fake._metrics["train"], logps


def test_group_advantages_by_hand():
    """Rewards [1, 0, 0, 1 | 1, 1, 1, 1] in groups of 4: the first group's mean is 0.5 and its sample std
    (n - 1) is sqrt(1/3) = 0.57735, so the advantages are ±0.5 / (0.57735 + 1e-4) = ±0.86588; the second
    group is flat: advantage 0 everywhere, which is what the dynamic-sampling filter looks for."""
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    grouped = rewards.view(-1, 4)
    mean = grouped.mean(dim=1).repeat_interleave(4)
    std = nanstd(grouped, dim=1).repeat_interleave(4)  # TRL's own std, as its trainer computes it
    advantages = (rewards - mean) / (std + 1e-4)  # the line of GRPOTrainer._generate_and_score_completions
    by_hand = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert advantages.tolist() == pytest.approx([by_hand, -by_hand, -by_hand, by_hand, 0, 0, 0, 0], abs=1e-6)
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "advantages = rewards - mean_grouped_rewards" in src and "advantages / (std_rewards + 1e-4)" in src
    assert flat_groups(advantages, 4).tolist() == [False, True]


RATIOS = [0.5, 0.9, 1.1, 1.25, 1.4]  # π/π_old per token, one sequence of five tokens


def _per_token_objective(ratios, advantage, eps_low, eps_high):
    """min(r·A, clip(r, 1-εl, 1+εh)·A), by hand."""
    return [min(r * advantage, min(max(r, 1 - eps_low), 1 + eps_high) * advantage) for r in ratios]


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_symmetric_vs_clip_higher_on_hand_made_ratios(advantage):
    """A = +1: symmetric (0.2/0.2) caps r at 1.2, so the tokens at 1.25 and 1.4 give 1.2 each (no gradient);
    clip-higher (0.2/0.28) lets 1.25 through and caps 1.4 at 1.28. A = -1: both clip the low side at 0.8
    (r = 0.5 gives -0.8, no gradient) and leave the high side unclipped (min picks r·A)."""
    old = [0.0] * len(RATIOS)
    logps = [[math.log(r) for r in RATIOS]]
    results = {}
    for name, high in (("symmetric", 0.2), ("clip-higher", 0.28)):
        loss, metrics, lp = _trl_loss(logps, [old], [advantage], [[1] * 5], eps_low=0.2, eps_high=high)
        expected = -sum(_per_token_objective(RATIOS, advantage, 0.2, high)) / 5  # token mean over 5 tokens
        assert loss.item() == pytest.approx(expected, abs=1e-9)
        loss.backward()
        results[name] = (loss.item(), lp.grad.tolist(), metrics)
    sym_grad, ch_grad = results["symmetric"][1][0], results["clip-higher"][1][0]
    if advantage > 0:
        assert results["symmetric"][0] == pytest.approx(-(0.5 + 0.9 + 1.1 + 1.2 + 1.2) / 5)
        assert results["clip-higher"][0] == pytest.approx(-(0.5 + 0.9 + 1.1 + 1.25 + 1.28) / 5)
        assert sym_grad[3] == 0 and ch_grad[3] != 0  # the token at 1.25: clipped only by the symmetric bound
        assert sym_grad[4] == ch_grad[4] == 0  # 1.4: clipped by both
        assert results["symmetric"][2]["clip_ratio/high_mean"] == [pytest.approx(2 / 5)]
        assert results["clip-higher"][2]["clip_ratio/high_mean"] == [pytest.approx(1 / 5)]
    else:
        assert results["symmetric"][0] == results["clip-higher"][0] == pytest.approx((0.8 + 0.9 + 1.1 + 1.25 + 1.4) / 5)
        assert sym_grad[0] == ch_grad[0] == 0 and sym_grad[4] != 0
        assert results["symmetric"][2]["clip_ratio/low_mean"] == [pytest.approx(1 / 5)]


def test_on_policy_the_clip_never_acts():
    """With one update per generation batch the ratio is exactly 1 (TRL uses the detached current
    log-probs as the old ones): both recipes give the same loss and gradient. Hence the recipes' several
    updates per batch (steps_per_generation > 1)."""
    logps = [[-1.0, -2.0, -0.5]]
    outs = [_trl_loss(logps, logps, [1.0], [[1, 1, 1]], eps_high=h) for h in (0.2, 0.28)]
    for loss, metrics, _ in outs:
        assert loss.item() == pytest.approx(-1.0)
        assert metrics["clip_ratio/region_mean"] == [0.0]
    from fhirgym.rl import load_recipe, trl_args

    for name in ("symmetric", "clip-higher", "clip-higher+dynamic"):
        assert trl_args(load_recipe(name))["steps_per_generation"] > 1


def test_token_mean_vs_sequence_mean():
    """Two sequences on policy (ratio 1), advantages +1 and -1, lengths 1 and 3. Token mean ("dapo", the
    recipes' loss): -(1·1 - 1·3) / 4 tokens = 0.5: every token weighs the same, the long sequence
    dominates. Sequence mean ("grpo"): -(1/1 - 3/3) / 2 = 0: each sequence weighs the same."""
    logps = [[-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]]
    mask = [[1, 0, 0], [1, 1, 1]]
    token_mean, _, _ = _trl_loss(logps, logps, [1.0, -1.0], mask, loss_type="dapo")
    seq_mean, _, _ = _trl_loss(logps, logps, [1.0, -1.0], mask, loss_type="grpo")
    assert token_mean.item() == pytest.approx(0.5)
    assert seq_mean.item() == pytest.approx(0.0)


def test_observation_tokens_are_masked_out_of_the_loss():
    """Tool-result tokens (tool_mask 0) neither add to the loss nor count in the token-mean normaliser, and get
    no gradient: a sequence of 4 tokens whose middle two are an observation equals the 2-token sequence."""
    ratios = [1.1, 5.0, 0.1, 1.1]  # wild ratios on the observation tokens must not matter
    logps = [[math.log(r) for r in ratios]]
    loss, _, lp = _trl_loss(logps, [[0.0] * 4], [1.0], [[1, 1, 1, 1]], tool_mask=[[1, 0, 0, 1]])
    assert loss.item() == pytest.approx(-(1.1 + 1.1) / 2)
    loss.backward()
    assert lp.grad[0, 1] == lp.grad[0, 2] == 0 and lp.grad[0, 0] != 0


def test_the_sampler_correction_weighs_each_tokens_clipped_loss():
    """The correction of llama.cpp rollouts (TRL's, docs/RL.md): on policy (ratio 1), advantage +1 on a
    3-token completion with truncated importance weights 0.5, 1, 2, the token-mean loss is
    −(0.5 + 1 + 2) / 3 = −1.1667 and each token's gradient −w/3; off policy the weight multiplies the clipped
    term: ratio 1.4 (clipped at 1.28 by clip-higher, no gradient) with weight 2 gives −2.56, and ratio 0.9
    with weight 0.5 gives −0.45 with gradient −0.5·0.9."""
    logps = [[-1.0, -2.0, -0.5]]
    loss, _, lp = _trl_loss(logps, logps, [1.0], [[1, 1, 1]], eps_high=0.28, is_weights=[[0.5, 1.0, 2.0]])
    assert loss.item() == pytest.approx(-3.5 / 3)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.5 / 3, -1 / 3, -2 / 3])
    loss, _, lp = _trl_loss([[math.log(1.4), math.log(0.9)]], [[0.0, 0.0]], [1.0], [[1, 1]], eps_high=0.28,
                            is_weights=[[2.0, 0.5]])
    assert loss.item() == pytest.approx(-(2 * 1.28 + 0.5 * 0.9) / 2)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, -0.5 * 0.9 / 2])


def test_dynamic_sampling_masks_flat_groups_and_recounts_tokens():
    """Groups of 2: the first has rewards (1, 0) → advantages ±0.707…, the second (1, 1) → 0, 0. The mask
    removes the second group's 3 + 2 tokens from the loss mask and from num_items_in_batch (9 → 4, tool
    tokens excluded), so the informative group's per-token weight goes from 1/9 to 1/4."""
    batch = {"advantages": torch.tensor([0.7071, -0.7071, 0.0, 0.0]),
             "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]),
             "tool_mask": torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]),
             "num_items_in_batch": torch.tensor(9)}
    out, masked = mask_flat_groups(batch, 2)
    assert masked == 1
    assert out["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0], [0, 0, 0]]
    assert int(out["num_items_in_batch"]) == 4
    # through TRL's loss: the informative group's loss is now a mean over its own 4 model tokens
    logps = [[0.0] * 3] * 4
    loss, _, _ = _trl_loss(logps, logps, out["advantages"].tolist(), out["completion_mask"].tolist(),
                           tool_mask=batch["tool_mask"].tolist())
    assert loss.item() == pytest.approx(-(0.7071 * 2 - 0.7071 * 2) / 4)
    with pytest.raises(ValueError, match="groups of 3"):
        flat_groups(torch.zeros(4), 3)


def test_the_trl_hooks_the_trainer_relies_on_are_unchanged():
    """Dynamic sampling overrides TRL's private ``_generate_and_score_completions``: its name, its signature,
    the keys of its output and the place TRL calls it (before shuffling and splitting into mini-batches)
    are pinned here. A TRL upgrade that changes any of them fails this test."""
    assert trl.__version__ == "1.16.0"
    hook = GRPOTrainer._generate_and_score_completions
    assert list(inspect.signature(hook).parameters) == ["self", "inputs"]
    src = inspect.getsource(hook)
    for key in HOOK_KEYS:
        assert f'"{key}": {key}' in src
    assert '"tool_mask"' in src and "loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask" in src
    prepare = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert prepare.index("self._generate_and_score_completions(generation_batch)") < prepare.index("shuffle_sequence_dict")
    loss_src = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'inputs["num_items_in_batch"]' in loss_src and 'completion_mask * inputs["tool_mask"]' in loss_src
    cls = dynamic_trainer_class()
    assert issubclass(cls, GRPOTrainer) and "_generate_and_score_completions" in cls.__dict__
