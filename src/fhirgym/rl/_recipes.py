"""GRPO recipes as data (``rl/recipes/*.toml``, one file each), mapped to TRL and to SkyRL 0.4.

A recipe states the algorithm once; :func:`trl_args` gives ``trl.GRPOConfig`` keyword arguments
(TRL 1.16) and :func:`skyrl_overrides` SkyRL 0.4's ``key=value`` overrides. Dynamic sampling has no
TRL option: ``trl_args`` leaves it out and :attr:`Recipe.dynamic` tells the CPU trainer to apply its
own filter (masking zero-variance groups, SkyRL's ``zero_variance_filter`` semantics). Overlong filtering
(DAPO: a rollout cut by a length limit, with no end of turn, is left out of the loss) is the recipe's
``[loss] overlong_filtering`` (default on) and maps to both: TRL's ``mask_truncated_completions``,
SkyRL's ``generator.apply_overlong_filtering``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

_LOSS_TRL = {"token_mean": "dapo", "sequence_mean": "grpo"}


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    clip_low: float
    clip_high: float
    group_size: int
    temperature: float
    dynamic: bool
    reduction: str
    kl: float
    overlong_filtering: bool
    max_turns: int
    max_prompt_length: int
    max_generate_length: int
    train_batch_size: int
    mini_batch_size: int
    lr: float

    @property
    def updates_per_batch(self) -> int:
        """Optimiser steps per rollout batch: above 1 the policy moves off the sampling one and the clip acts."""
        return self.train_batch_size // self.mini_batch_size


def recipe_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("fhirgym.rl").joinpath("recipes").iterdir()
                  if p.name.endswith(".toml"))


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A shipped recipe by name, or a TOML file of the same shape."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        text = path.read_text()
    else:
        if str(name_or_path) not in recipe_names():
            raise ValueError(f"unknown recipe {name_or_path!r}; shipped: {', '.join(recipe_names())}")
        text = resources.files("fhirgym.rl").joinpath("recipes", f"{name_or_path}.toml").read_text()
    raw = tomllib.loads(text)
    try:
        recipe = Recipe(
            name=raw["name"], description=raw.get("description", ""),
            clip_low=float(raw["clip"]["low"]), clip_high=float(raw["clip"]["high"]),
            group_size=int(raw["sampling"]["group_size"]), temperature=float(raw["sampling"]["temperature"]),
            dynamic=bool(raw["sampling"]["dynamic"]), reduction=raw["loss"]["reduction"],
            kl=float(raw["loss"]["kl"]), overlong_filtering=bool(raw["loss"].get("overlong_filtering", True)),
            max_turns=int(raw["lengths"]["max_turns"]),
            max_prompt_length=int(raw["lengths"]["max_prompt_length"]),
            max_generate_length=int(raw["lengths"]["max_generate_length"]),
            train_batch_size=int(raw["batch"]["train_batch_size"]),
            mini_batch_size=int(raw["batch"]["mini_batch_size"]), lr=float(raw["batch"]["lr"]))
    except KeyError as exc:
        raise ValueError(f"recipe {name_or_path}: missing {exc.args[0]!r}") from None
    if recipe.reduction not in _LOSS_TRL:
        raise ValueError(f"recipe {recipe.name}: reduction must be one of {', '.join(_LOSS_TRL)}")
    if recipe.clip_high < recipe.clip_low or recipe.train_batch_size % recipe.mini_batch_size:
        raise ValueError(f"recipe {recipe.name}: needs clip high ≥ low and mini batches that divide the batch")
    return recipe


def trl_args(recipe: Recipe) -> dict[str, Any]:
    """``trl.GRPOConfig`` keyword arguments (TRL 1.16 names)."""
    return {
        "num_generations": recipe.group_size, "temperature": recipe.temperature,
        "epsilon": recipe.clip_low, "epsilon_high": recipe.clip_high,
        "loss_type": _LOSS_TRL[recipe.reduction], "scale_rewards": "group", "beta": recipe.kl,
        "max_tool_calling_iterations": recipe.max_turns, "max_completion_length": recipe.max_generate_length,
        "mask_truncated_completions": recipe.overlong_filtering, "learning_rate": recipe.lr,
        # one rollout batch feeds several optimiser steps: the ratio leaves 1 and the clip acts
        "steps_per_generation": recipe.updates_per_batch,
    }


def skyrl_overrides(recipe: Recipe, env_class: str = "fhirgym-action") -> dict[str, Any]:
    """SkyRL 0.4 ``key=value`` overrides (``SkyRLTrainConfig.from_cli_overrides``)."""
    out: dict[str, Any] = {
        "trainer.algorithm.advantage_estimator": "grpo",
        "trainer.algorithm.policy_loss_type": "regular",
        "trainer.algorithm.use_kl_loss": recipe.kl > 0,
        "trainer.algorithm.eps_clip_low": recipe.clip_low,
        "trainer.algorithm.eps_clip_high": recipe.clip_high,
        "trainer.algorithm.loss_reduction": recipe.reduction,
        "generator.n_samples_per_prompt": recipe.group_size,
        "generator.max_turns": recipe.max_turns,
        "generator.batched": False,
        "generator.apply_overlong_filtering": recipe.overlong_filtering,
        "generator.sampling_params.temperature": recipe.temperature,
        "generator.sampling_params.max_generate_length": recipe.max_generate_length,
        "trainer.max_prompt_length": recipe.max_prompt_length,
        "trainer.train_batch_size": recipe.train_batch_size,
        "trainer.policy_mini_batch_size": recipe.mini_batch_size,
        "trainer.policy.optimizer_config.lr": recipe.lr,
        "environment.env_class": env_class,
    }
    if recipe.kl > 0:
        out["trainer.algorithm.kl_loss_coef"] = recipe.kl
    if recipe.dynamic:
        out["trainer.algorithm.dynamic_sampling.type"] = "filter"
        out["trainer.algorithm.dynamic_sampling.max_sample_batches"] = 30
    return out
