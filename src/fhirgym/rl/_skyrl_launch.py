"""A ready SkyRL 0.4 launch: datasets, the recipe's overrides and the RL paper's model and batch settings.

Written for users with GPUs: SkyRL runs in its own environment (Python 3.12, CUDA 13, Ray 2.57, uv), which fhirgym does
not install; the launch's header says how to get it. What a CPU machine can check is checked when the launch is written:
the recipe, the dataset files and their layout, the batch the train split must fill, and the lengths SkyRL validates.
``generator.max_input_length`` caps the whole multi-turn conversation; SkyRL's default (the first prompt's cap) ends a
12-turn episode after a few turns with reward 0, so it is set to the model's context less one turn's generation. The
launch holds no absolute local path: the data directory is written relative to the launch's own directory, and
``FHIRGYM_DATA`` points it elsewhere on the GPU machine (docs/RL.md, section "SkyRL on GPUs").
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from ._data import ENV_CLASSES
from ._recipes import Recipe, load_recipe, skyrl_overrides

PAPER_MODEL = "Qwen/Qwen3-8B"
#: Qwen3-8B's context, ``max_position_embeddings`` in its config.json (as published; not fetched here: no
#: hub access), which vLLM serves it with by default.
PAPER_CONTEXT = 40_960

#: The paper's setting (Qwen3-8B, 8 GPUs, colocated FSDP + vLLM); every key can be overridden.
PAPER_DEFAULTS = {
    "trainer.policy.model.path": PAPER_MODEL,
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

#: The columns of a row in SkyRL's layout (``fhirgym rl dataset`` writes them).
ROW_COLUMNS = ("data_source", "prompt", "env_class", "reward_spec", "extra_info")
SPLIT_FILES = {"train": "train.parquet", "valid": "valid.parquet"}
DATA_VAR = "FHIRGYM_DATA"
_DATA_REF = "$DATA"  # what the data paths say in the launch: the shell variable it sets


def _value(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _int(overrides: dict, key: str) -> int:
    try:
        return int(str(overrides[key]))
    except ValueError:
        raise ValueError(f"{key}={overrides[key]!r}: expected an integer") from None


def max_input_length(recipe: Recipe, model: str, context: int | None) -> int:
    """``generator.max_input_length`` for ``model``: its context (default: the paper model's) less the
    recipe's per-turn generation, so the last turn still fits the model."""
    if context is None:
        if model != PAPER_MODEL:
            raise ValueError(f"the context length of {model} is needed to cap the conversation: give it "
                             "(its max_position_embeddings) as --context, or --set generator.max_input_length=N")
        context = PAPER_CONTEXT
    cap = context - recipe.max_generate_length
    if cap < recipe.max_prompt_length:
        raise ValueError(f"a context of {context} tokens less {recipe.max_generate_length} generated per turn leaves "
                         f"{cap} for the conversation, under the recipe's max_prompt_length {recipe.max_prompt_length}")
    return cap


def launch_overrides(recipe: Recipe, data: Path | str = _DATA_REF, extra: dict | None = None, *,
                     track: str = "action", context: int | None = None) -> dict[str, str]:
    """Every ``key=value`` of the launch. ``data`` is how the launch names the data directory (by default
    the ``$DATA`` variable it sets); ``extra`` overrides anything; ``context`` is the model's context length
    (default: Qwen3-8B's, which only holds for that model)."""
    extra = dict(extra or {})
    out: dict[str, object] = {"data.train_data": json.dumps([f"{data}/{SPLIT_FILES['train']}"]),
                              "data.val_data": json.dumps([f"{data}/{SPLIT_FILES['valid']}"]),
                              **PAPER_DEFAULTS, **skyrl_overrides(recipe, ENV_CLASSES[track]), **extra}
    if "generator.max_input_length" not in extra:
        out["generator.max_input_length"] = max_input_length(recipe, str(out["trainer.policy.model.path"]), context)
    elif _int(out, "generator.max_input_length") < _int(out, "trainer.max_prompt_length"):
        raise ValueError("generator.max_input_length caps the whole conversation: it cannot be under "
                         f"trainer.max_prompt_length ({out['trainer.max_prompt_length']})")
    return {k: _value(v) for k, v in out.items()}


def check_data(data_dir: Path, train_batch_size: int) -> set[str]:
    """The environment classes of the dataset in ``data_dir`` (``train.parquet`` and ``valid.parquet`` in
    SkyRL's row layout); raises ValueError on anything SkyRL would fail on later, on the GPUs."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ValueError("checking the dataset needs pyarrow: pip install 'fhirgym[rl]'") from exc
    missing = [name for name in SPLIT_FILES.values() if not (data_dir / name).is_file()]
    if missing:
        raise ValueError(f"{data_dir} has no {' or '.join(missing)}: write them with `fhirgym rl dataset --split "
                         f"train --out {data_dir}` and `--split valid`")
    classes: set[str] = set()
    for split, name in SPLIT_FILES.items():
        path = data_dir / name
        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for a file that is not parquet
            raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
        absent = [c for c in ROW_COLUMNS if c not in table.column_names]
        if absent:
            raise ValueError(f"{path}: no column {', '.join(absent)}; rows need {', '.join(ROW_COLUMNS)} "
                             "(fhirgym rl dataset writes them)")
        found = set(table.column("env_class").to_pylist())
        unknown = found - set(ENV_CLASSES.values())
        if unknown:
            raise ValueError(f"{path}: env_class {', '.join(sorted(map(str, unknown)))} is not fhirgym's "
                             f"({', '.join(ENV_CLASSES.values())})")
        if any(not (e or {}).get("task_id") for e in table.column("extra_info").to_pylist()):
            raise ValueError(f"{path}: a row's extra_info names no task_id: the environment cannot rebuild it")
        if split == "train" and table.num_rows < train_batch_size:
            raise ValueError(f"{path}: {table.num_rows} rows, fewer than trainer.train_batch_size "
                             f"{train_batch_size} (SkyRL refuses a batch the data cannot fill)")
        if not table.num_rows:
            raise ValueError(f"{path}: no rows")
        classes |= found
    return classes


def _track_of(classes: set[str], track: str | None) -> str:
    tracks = {t for t, c in ENV_CLASSES.items() if c in classes}
    if track is None:
        return tracks.pop() if len(tracks) == 1 else "action"  # mixed: each row names its class anyway
    if tracks != {track}:
        raise ValueError(f"the rows are {' and '.join(sorted(tracks))} rows, not {track}: leave --track out to "
                         "take the data's, or write a dataset of that track")
    return track


_HEADER = """\
#!/usr/bin/env bash
# SkyRL 0.4 GRPO run of fhirgym, recipe {name}: {description}.
#
# Runs in SkyRL 0.4's own environment (CUDA 13 with driver >= r580, Python 3.12, Ray 2.57.0, uv), on GPUs:
#   its image:  docker run -it --runtime=nvidia --gpus all --shm-size=8g novaskyai/skyrl-train-ray-2.57.0-py3.12-cu13.0
#   or a machine set up as SkyRL's installation guide says.
# In it, a SkyRL checkout (git clone https://github.com/NovaSky-AI/SkyRL) and fhirgym's own checkout (fhirgym
# is not on PyPI; its llama-cpp-python dependency compiles there, which needs a C++ compiler). From SkyRL's:
#   export RAY_RUNTIME_ENV_HOOK=ray._private.runtime_env.uv_runtime_env_hook.hook
#   uv run --isolated --extra fsdp --with /path/to/fhirgym bash /path/to/this/launch.sh
# or, in a venv made there with `uv sync --active --extra fsdp` then `uv pip install -e /path/to/fhirgym`:
#   bash launch.sh
# The data directory is {data_note}; {data_var}=DIR points elsewhere.
# Arguments given to this file are more key=value overrides (the last value of a key wins).
set -euo pipefail
HERE=$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)
DATA=${{{data_var}:-"$HERE"/{rel}}}
exec python -m fhirgym.rl.skyrl_main \\
  {args} \\
  "$@"
"""


def _arg(key: str, value: str) -> str:
    """One override as a shell word: ``$DATA`` in it expands, everything else is literal."""
    word = f"{key}={value}"
    if _DATA_REF not in word:
        return shlex.quote(word)
    literal = [re.sub(r'([\\"$`])', r"\\\1", part) for part in word.split(_DATA_REF)]
    return '"' + "${DATA}".join(literal) + '"'


def write_launch(recipe: Recipe | str, data_dir: Path, out: Path, extra: dict | None = None, *,
                 track: str | None = None, context: int | None = None) -> Path:
    """``out/launch.sh``, after checking the inputs: the recipe (a name or a TOML file), the dataset in
    ``data_dir`` (``track``: the rows' by default, else the rows must be of it) and ``out``. The launch
    names the data relative to ``out``. See :func:`launch_overrides` for ``extra`` and ``context``."""
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file: --out names the directory the launch is written to")
    extra = dict(extra or {})
    batch = _int({**skyrl_overrides(recipe), **extra}, "trainer.train_batch_size")
    track = _track_of(check_data(data_dir, batch), track)
    overrides = launch_overrides(recipe, _DATA_REF, extra, track=track, context=context)
    out.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(data_dir.resolve(), out.resolve())
    script = out / "launch.sh"
    script.write_text(_HEADER.format(
        name=recipe.name, description=" ".join(recipe.description.split()), data_var=DATA_VAR, rel=shlex.quote(rel),
        data_note=f"{rel} from this file's directory (train.parquet, valid.parquet)",
        args=" \\\n  ".join(_arg(k, v) for k, v in overrides.items())))
    script.chmod(0o755)
    return script
