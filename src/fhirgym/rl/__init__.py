"""Reinforcement learning over fhirgym episodes: text environments, rewards, datasets, recipes.

    from fhirgym.rl import TextEpisode, dataset_rows, instance_for
    row = dataset_rows("action", "train", tasks="records.*", per_family=2)[0]
    text = TextEpisode(instance_for(row["extra_info"]))
    messages = text.reset()                       # system (tools in Qwen's <tools> block) + user
    step = text.step(model_reply)                 # observations, reward, done, info

Also the SkyRL, Gymnasium-style and TRL adapters, GRPO recipes and the SkyRL launch, CPU training on TRL's GRPOTrainer
with LoRA and llama.cpp rollouts, curricula, the evaluation protocol and behaviour cloning: docs/RL.md, "From Python".
"""

from ._adapters import FhirTextEnv, register_skyrl, skyrl_env_class, trl_environment, trl_reward
from ._behaviour import behaviour_of, behaviour_summary, behaviour_table
from ._curriculum import (
    CONSTANTS,
    CurriculumSpec,
    ShortcutCurriculum,
    check_curriculum,
    constant_reward,
    load_curriculum,
    measure_curriculum,
)
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
from ._rollout import LlamaRollouts, Rollout, llama_trainer_class
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
    "CONSTANTS",
    "DEFAULT_POLICY",
    "DEFAULT_QA",
    "DEFAULT_WORLD",
    "ENV_CLASSES",
    "PAPER_DEFAULTS",
    "SPLITS",
    "TEXT_BUDGET",
    "CurriculumSpec",
    "FhirTextEnv",
    "LlamaRollouts",
    "NotExpressible",
    "OverlapError",
    "Recipe",
    "RewardSpec",
    "Rollout",
    "Selection",
    "SftSpec",
    "ShortcutCurriculum",
    "TextEpisode",
    "TextStep",
    "TrainSpec",
    "Trajectory",
    "base_of",
    "behaviour_of",
    "behaviour_summary",
    "behaviour_table",
    "build_sft",
    "build_trainer",
    "build_trajectories",
    "check_curriculum",
    "constant_reward",
    "dataset_rows",
    "expert_trajectory",
    "instance_for",
    "launch_overrides",
    "llama_trainer_class",
    "load_curriculum",
    "load_policy",
    "load_recipe",
    "measure_curriculum",
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
