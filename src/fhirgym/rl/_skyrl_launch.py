"""A ready SkyRL 0.4 launch: datasets, the recipe's overrides and the RL paper's model and batch settings.

Written for users with GPUs (SkyRL needs Python ≥ 3.12, CUDA and vLLM); fhirgym tests the parts a CPU
machine can: the overrides parse, the environment registers and steps under skyrl-gym.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ._data import ENV_CLASSES
from ._recipes import Recipe, skyrl_overrides

#: The paper's setting (Qwen3-8B, 8 GPUs, colocated FSDP + vLLM); every key can be overridden.
PAPER_DEFAULTS = {
    "trainer.policy.model.path": "Qwen/Qwen3-8B",
    "trainer.strategy": "fsdp",
    "trainer.placement.colocate_all": True,
    "trainer.placement.policy_num_gpus_per_node": 8,
    "trainer.placement.ref_num_gpus_per_node": 8,
    "generator.inference_engine.backend": "vllm",
    "generator.inference_engine.run_engines_locally": True,
    "generator.inference_engine.num_engines": 4,
    "generator.inference_engine.tensor_parallel_size": 2,
    "generator.inference_engine.weight_sync_backend": "nccl",
    "generator.inference_engine.gpu_memory_utilization": 0.8,
    "trainer.epochs": 1,
    "trainer.eval_interval": 10,
    "trainer.eval_before_train": True,
    "trainer.logger": "console",
}


def _value(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def launch_overrides(recipe: Recipe, data_dir: Path, extra: dict | None = None, *,
                     track: str = "action") -> dict[str, str]:
    out: dict[str, object] = {"data.train_data": json.dumps([str(data_dir / "train.parquet")]),
                              "data.val_data": json.dumps([str(data_dir / "valid.parquet")]),
                              **PAPER_DEFAULTS, **skyrl_overrides(recipe, ENV_CLASSES[track]), **(extra or {})}
    return {k: _value(v) for k, v in out.items()}


def write_launch(recipe: Recipe, data_dir: Path, out: Path, extra: dict | None = None, *,
                 track: str = "action") -> Path:
    """``out/launch.sh``: run it on the GPU machine from an environment with ``skyrl[fsdp]`` and fhirgym."""
    out.mkdir(parents=True, exist_ok=True)
    args = " \\\n  ".join(shlex.quote(f"{k}={v}") for k, v in launch_overrides(recipe, data_dir, extra, track=track).items())
    script = out / "launch.sh"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"# SkyRL 0.4 GRPO run of fhirgym, recipe {recipe.name}: {recipe.description}.\n"
        "# GPU only (CUDA 13, Python >= 3.12): pip install 'skyrl[fsdp]==0.4.0' fhirgym, then run this file.\n"
        "set -euo pipefail\n"
        f"exec python -m fhirgym.rl.skyrl_main \\\n  {args}\n")
    script.chmod(0o755)
    return script
