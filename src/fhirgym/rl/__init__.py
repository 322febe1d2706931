"""Reinforcement learning over fhirgym episodes: text environments, rewards, datasets, recipes.

    from fhirgym.rl import TextEpisode, dataset_rows, instance_for
    row = dataset_rows("action", "train", tasks="records.*", per_family=2)[0]
    text = TextEpisode(instance_for(row["extra_info"]))
    messages = text.reset()                       # system (tools in Qwen's <tools> block) + user
    step = text.step(model_reply)                 # observations, reward, done, info

Adapters: ``skyrl_env_class()``/``register_skyrl()`` (skyrl-gym's ``BaseTextEnv``, ids ``fhirgym-action``, ``fhirgym-qa``),
``FhirTextEnv`` (Gymnasium-style), ``trl_environment()`` (TRL's ``environment_factory``). Recipes:
``load_recipe("clip-higher")`` → ``trl_args`` / ``skyrl_overrides``; ``write_launch`` writes a SkyRL run.
CPU training (``pip install 'fhirgym[rl]'``): ``train(TrainSpec(out, recipe, model, track))`` on TRL's
GRPOTrainer with LoRA; ``rl_eval(model, tokenizer, n=4)`` is the evaluation protocol (docs/RL.md).
Behaviour cloning (docs/TRAINING.md): ``write_trajectories(out, Selection(...))`` replays the reference
solutions as a local model's turns; ``sft(SftSpec(out, data))`` trains on them with TRL's SFTTrainer.
"""

from ._adapters import FhirTextEnv, register_skyrl, skyrl_env_class, trl_environment, trl_reward
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
from ._evaluate import pass_at_k, rl_eval
from ._export import base_of, merge_into_gguf, merge_to_hf, write_lora_gguf
from ._recipes import Recipe, load_recipe, recipe_names, skyrl_overrides, trl_args
from ._reward import RewardSpec
from ._sft import SftSpec, build_sft, sft
from ._skyrl_launch import PAPER_DEFAULTS, launch_overrides, write_launch
from ._text import TEXT_BUDGET, TextEpisode, TextStep, tool_block
from ._trainer import DEFAULT_POLICY, TrainSpec, build_trainer, load_policy, plot_curve, train
from ._trajectories import (
    NotExpressible,
    OverlapError,
    Selection,
    Trajectory,
    build_trajectories,
    expert_trajectory,
    read_trajectories,
    write_trajectories,
)

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_QA",
    "DEFAULT_WORLD",
    "ENV_CLASSES",
    "PAPER_DEFAULTS",
    "SPLITS",
    "TEXT_BUDGET",
    "FhirTextEnv",
    "NotExpressible",
    "OverlapError",
    "Recipe",
    "RewardSpec",
    "Selection",
    "SftSpec",
    "TextEpisode",
    "TextStep",
    "TrainSpec",
    "Trajectory",
    "base_of",
    "build_sft",
    "build_trainer",
    "build_trajectories",
    "dataset_rows",
    "expert_trajectory",
    "instance_for",
    "launch_overrides",
    "load_policy",
    "load_recipe",
    "merge_into_gguf",
    "merge_to_hf",
    "pass_at_k",
    "plot_curve",
    "qa_questions",
    "read_trajectories",
    "recipe_names",
    "register_skyrl",
    "rl_eval",
    "sft",
    "skyrl_env_class",
    "skyrl_overrides",
    "tool_block",
    "train",
    "trl_args",
    "trl_environment",
    "trl_reward",
    "write_launch",
    "write_lora_gguf",
    "write_rows",
    "write_trajectories",
]
