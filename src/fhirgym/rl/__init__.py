"""Reinforcement learning over fhirgym episodes: text environments, rewards, datasets, recipes.

    from fhirgym.rl import TextEpisode, dataset_rows, instance_for
    row = dataset_rows("action", "train", tasks="records.*", per_family=2)[0]
    text = TextEpisode(instance_for(row["extra_info"]))
    messages = text.reset()                       # system (tools in Qwen's <tools> block) + user
    step = text.step(model_reply)                 # observations, reward, done, info

Adapters: ``skyrl_env_class()``/``register_skyrl()`` (skyrl-gym's ``BaseTextEnv``, ids ``fhirgym-action``, ``fhirgym-qa``),
``FhirTextEnv`` (Gymnasium-style), ``trl_environment()`` (TRL's ``environment_factory``). Recipes:
``load_recipe("clip-higher")`` → ``trl_args`` / ``skyrl_overrides``; ``write_launch`` writes a SkyRL run.
"""

from ._adapters import FhirTextEnv, register_skyrl, skyrl_env_class, trl_environment
from ._data import (
    DEFAULT_QA,
    DEFAULT_WORLD,
    ENV_CLASSES,
    SPLITS,
    dataset_rows,
    instance_for,
    qa_questions,
    write_rows,
)
from ._recipes import Recipe, load_recipe, recipe_names, skyrl_overrides, trl_args
from ._reward import RewardSpec
from ._skyrl_launch import PAPER_DEFAULTS, launch_overrides, write_launch
from ._text import TEXT_BUDGET, TextEpisode, TextStep, tool_block

__all__ = [
    "DEFAULT_QA",
    "DEFAULT_WORLD",
    "ENV_CLASSES",
    "PAPER_DEFAULTS",
    "SPLITS",
    "TEXT_BUDGET",
    "FhirTextEnv",
    "Recipe",
    "RewardSpec",
    "TextEpisode",
    "TextStep",
    "dataset_rows",
    "instance_for",
    "launch_overrides",
    "load_recipe",
    "qa_questions",
    "recipe_names",
    "register_skyrl",
    "skyrl_env_class",
    "skyrl_overrides",
    "tool_block",
    "trl_args",
    "trl_environment",
    "write_launch",
    "write_rows",
]
