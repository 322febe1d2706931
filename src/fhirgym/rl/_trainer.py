"""The trainer: TRL's ``GRPOTrainer`` (pinned 1.16.0) with LoRA over fhirgym episodes, on the CPU or a GPU.

``train(TrainSpec(...))`` builds a track's rows, gives TRL the episode (its tools, :meth:`TextEpisode`'s
reward), maps the recipe with :func:`trl_args`, adds dynamic sampling where the recipe asks
(:mod:`._dynamic`) and writes checkpoints, ``curve.jsonl``/``curve.png``, ``rollouts.jsonl`` and
``behaviour.jsonl`` as it goes. Rollouts on a GGUF base come from llama.cpp (:mod:`._rollout`); ``torch``
keeps TRL's own generation, the only choice for a Hugging Face model. A curriculum (:mod:`._curriculum`)
is refused when a constant reply earns at least the start policy's mean reward on it. Weights
(:func:`load_policy`): a local model name, a ``.gguf``, a Hugging Face directory or hub id, or a LoRA
checkpoint of ours. docs/RL.md, "Training with TRL", says what each file holds.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._defaults import POLICY, RECIPE
from ..agents import LOCAL_MODELS
from ._adapters import trl_environment, trl_reward, trl_tool_parsing
from ._behaviour import FIGURES, behaviour_of, behaviour_summary, figures
from ._curriculum import check_curriculum, constant_names, curriculum_rows, load_curriculum
from ._data import DEFAULT_QA, DEFAULT_WORLD, dataset_rows
from ._dynamic import dynamic_trainer_class
from ._policy import BASE_FILE, load_policy
from ._recipes import load_recipe, trl_args
from ._rollout import IS_CAP, IS_MODE, IS_MODES, LlamaRollouts, llama_trainer_class, rollout_base

#: The default trainable model: the 0.5B GGUF fhirgym already assembles for local evaluation.
DEFAULT_POLICY = POLICY
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_TOOLS_HEADER = "\n\n# Tools\n\n"


def trl_prompt(messages: list[dict]) -> list[dict]:
    """A row's prompt for TRL: TRL's chat template lists the environment's tools itself, so the tool block
    :class:`TextEpisode` writes into the system message is dropped (it would appear twice)."""
    out = []
    for m in messages:
        if m["role"] == "system" and _TOOLS_HEADER in m["content"]:
            m = {**m, "content": m["content"].split(_TOOLS_HEADER, 1)[0]}
        out.append(m)
    return out


def final_text(completion: Any) -> str:
    """The model's last reply in a TRL completion (a message list in the tool loop, or plain text)."""
    if isinstance(completion, str):
        return completion
    replies = [m for m in completion if m.get("role") == "assistant"]
    if not replies:
        return ""
    content = replies[-1].get("content") or ""
    return content if isinstance(content, str) else " ".join(str(c.get("text", "")) for c in content)


def episode_reward(completions: list, environments: list | None = None, **_: Any) -> list[float]:
    """TRL reward function: each rollout's episode judged on its final reply (the same reward as every
    other adapter gives that transcript)."""
    if environments is None:
        raise RuntimeError("episode_reward needs TRL's environment_factory (environments=...)")
    return [trl_reward(env, final_text(c)) for env, c in zip(environments, completions, strict=True)]


def _log_rollouts(path: Path, step: int | None, rows: list[dict], log_metric: Any) -> None:
    """Append the rollouts of one generation batch to ``rollouts.jsonl`` and log their behaviour figures."""
    with open(path, "a") as fh:
        for i, row in enumerate(rows):
            fh.write(json.dumps({"step": step, "rollout": i, **row}, default=str) + "\n")
    if log_metric is not None:
        for name, value in figures([r["behaviour"] for r in rows]).items():
            log_metric(name, value)


def _logged_reward(path: Path):
    """:func:`episode_reward` that also appends each rollout to ``rollouts.jsonl`` (optimiser step, question,
    reward, what the policy did, the whole completion with its tool results), so what a reward paid for can
    be read back."""

    def episode_reward_logged(completions: list, environments: list | None = None, trainer_state: Any = None,
                              extra_info: list | None = None, log_metric: Any = None, **_: Any) -> list[float]:
        rewards = episode_reward(completions, environments)
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        rows = [{"reward": reward, "extra_info": extra_info[i] if extra_info else None,
                 "behaviour": behaviour_of(env.text, env.text.episode.answer), "completion": completion}
                for i, (env, completion, reward) in enumerate(zip(environments or [], completions, rewards,
                                                                  strict=True))]
        _log_rollouts(path, step, rows, log_metric)
        return rewards

    episode_reward_logged.__name__ = "episode_reward"  # TRL names the reward's log columns after it
    return episode_reward_logged


def _rollout_reward(path: Path):
    """The reward of llama.cpp rollouts: each episode's own (:class:`LlamaRollouts` ran and judged it), with
    the rollouts logged as :func:`_logged_reward` logs them."""

    def episode_reward(completions: list, episode_reward: list | None = None, rollout: list | None = None,
                       trainer_state: Any = None, log_metric: Any = None, **_: Any) -> list[float]:
        if episode_reward is None or rollout is None:
            raise RuntimeError("the llama.cpp rollout reward needs the rollout function's episode_reward and rollout")
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        _log_rollouts(path, step, list(rollout), log_metric)
        return [float(r) for r in episode_reward]

    return episode_reward


@dataclass
class TrainSpec:
    """One CPU GRPO run. ``prompts_per_batch`` prompts × ``group_size`` completions are generated per
    rollout batch and used for ``updates_per_batch`` optimiser steps (above 1 the clip acts)."""

    out: Path
    recipe: str = RECIPE
    model: str = DEFAULT_POLICY
    track: str = "action"
    tasks: str = "all"
    per_family: int = 4
    world: dict = field(default_factory=lambda: dict(DEFAULT_WORLD))
    qa: dict = field(default_factory=lambda: dict(DEFAULT_QA))
    config: str = "baseline"
    example: bool = False  # prompts carry the worked example (TextEpisode)
    max_steps: int = 10
    group_size: int | None = None  # default: the recipe's
    prompts_per_batch: int = 2
    updates_per_batch: int | None = None  # default: the recipe's
    max_turns: int | None = None  # default: the recipe's
    max_new_tokens: int | None = None  # default: the recipe's max_generate_length
    lr: float | None = None  # default: the recipe's
    dtype: str = "float32"  # the base's weights (_policy.DTYPES); LoRA weights and the output head stay float32
    lora_r: int = 16
    save_steps: int = 5
    seed: int = 0
    resume: bool = False
    threads: int | None = None
    time_limit_min: float | None = None  # stop at the first rollout-batch boundary past this wall time
    rollouts: str = "auto"  # ROLLOUTS: llama.cpp on a GGUF base on the CPU, else TRL's own generation
    grammar: bool = False  # llama.cpp rollouts: each turn under the local agent's turn grammar
    is_mode: str = IS_MODE  # the sampler correction (TRL's vllm_importance_sampling_mode)
    is_cap: float = IS_CAP  # its truncation (TRL's vllm_importance_sampling_clip_max)
    curriculum: str | None = None  # a file of `rl curriculum`: its rows, refused if a constant reply pays
    n_ctx: int = 8192  # llama.cpp rollouts: the context (prompt and completion)
    device: str = "cpu"  # DEVICES; see device_args
    use_vllm: bool = False  # generate with vLLM (cuda only)
    vllm_mode: str = "colocate"  # VLLM_MODES
    vllm_server_url: str | None = None  # server mode: the `trl vllm-serve` endpoint (default: TRL's localhost:8000)


DEVICES = ("cpu", "cuda")
VLLM_MODES = ("colocate", "server")


def device_args(spec: TrainSpec) -> dict[str, Any]:
    """The ``trl.GRPOConfig`` keyword arguments that say where training and generation run, all in this one place.

    ``cpu``: TRL's CPU mode, no mixed precision (``--dtype bfloat16`` makes the weights bfloat16 instead).
    ``cuda``: the GPU with bf16 mixed precision (Ampere or newer), generation by transformers unless
    ``use_vllm``: vLLM in this process sharing the GPU (``colocate``) or a ``trl vllm-serve`` server
    (``server``). vLLM loads the policy by its Hugging Face name or directory, so not from a GGUF."""
    if spec.device not in DEVICES:
        raise ValueError(f"device {spec.device!r}: one of {', '.join(DEVICES)}")
    if spec.vllm_mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode {spec.vllm_mode!r}: one of {', '.join(VLLM_MODES)}")
    if spec.device == "cpu":
        if spec.use_vllm or spec.vllm_server_url:
            raise ValueError("vLLM generates on GPUs: use it with --device cuda")
        return {"use_cpu": True, "bf16": False, "fp16": False, "use_vllm": False}
    out: dict[str, Any] = {"use_cpu": False, "bf16": True, "fp16": False, "use_vllm": spec.use_vllm}
    if spec.vllm_server_url and not (spec.use_vllm and spec.vllm_mode == "server"):
        raise ValueError("a vLLM server URL needs --use-vllm --vllm-mode server")
    if spec.use_vllm:
        if spec.model in LOCAL_MODELS or spec.model.endswith(".gguf"):
            raise ValueError(f"vLLM loads the policy by its Hugging Face name or directory, not the GGUF {spec.model!r}: "
                             "give --model a hub id (e.g. Qwen/Qwen2.5-Coder-0.5B-Instruct) or a model directory")
        out["vllm_mode"] = spec.vllm_mode
        if spec.vllm_server_url:
            out["vllm_server_base_url"] = spec.vllm_server_url
    return out


#: How rollouts are generated: ``auto`` (llama.cpp on the CPU where the base is a GGUF), ``llama.cpp``, or
#: ``torch`` (TRL's own generation: transformers, or vLLM with ``use_vllm``).
ROLLOUTS = ("auto", "llama.cpp", "torch")


def rollout_engine(spec: TrainSpec) -> str:
    """``llama.cpp`` or ``torch``: what generates this run's rollouts."""
    if spec.rollouts not in ROLLOUTS:
        raise ValueError(f"rollouts {spec.rollouts!r}: one of {', '.join(ROLLOUTS)}")
    if spec.rollouts == "torch":
        return "torch"
    if spec.use_vllm:
        if spec.rollouts == "llama.cpp":
            raise ValueError("llama.cpp rollouts and vLLM both generate the rollouts: choose one")
        return "torch"
    if rollout_base(spec.model) is None:
        if spec.rollouts == "llama.cpp":
            raise ValueError(f"llama.cpp rollouts need a GGUF base; {spec.model!r} is none (use torch rollouts)")
        return "torch"
    return "llama.cpp" if spec.rollouts == "llama.cpp" or spec.device == "cpu" else "torch"


def grpo_args(spec: TrainSpec) -> dict[str, Any]:
    """``trl.GRPOConfig`` keyword arguments: the recipe's, sized for this run, on the spec's device."""
    recipe = load_recipe(spec.recipe)
    args = trl_args(recipe)
    group = spec.group_size or recipe.group_size
    updates = spec.updates_per_batch or recipe.updates_per_batch
    completions = spec.prompts_per_batch * group
    if completions % updates:
        raise ValueError(f"{spec.prompts_per_batch} prompts × {group} completions do not split into {updates} updates")
    args.update(num_generations=group, steps_per_generation=updates, per_device_train_batch_size=completions // updates,
                gradient_accumulation_steps=1)
    if spec.max_turns:
        args["max_tool_calling_iterations"] = spec.max_turns
    if spec.max_new_tokens:
        args["max_completion_length"] = spec.max_new_tokens
    if spec.lr:
        args["learning_rate"] = spec.lr
    if rollout_engine(spec) == "llama.cpp":
        if spec.is_mode not in IS_MODES:
            raise ValueError(f"is_mode {spec.is_mode!r}: one of {', '.join(IS_MODES)}")
        if not spec.is_cap > 1:
            raise ValueError(f"is_cap {spec.is_cap}: the weights' cap must be above 1")
        args.update(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=spec.is_mode,
                    vllm_importance_sampling_clip_max=spec.is_cap)
    args.update(device_args(spec))
    args.update(output_dir=str(spec.out), gradient_checkpointing=False,
                max_steps=spec.max_steps, logging_steps=1, save_steps=spec.save_steps, save_strategy="steps",
                report_to="none", seed=spec.seed, data_seed=spec.seed, disable_tqdm=False, dataloader_num_workers=0,
                remove_unused_columns=False, log_completions=False, num_train_epochs=1)
    return args


#: What ``curve.jsonl`` keeps of the trainer's logs (those present on a step).
CURVE_KEYS = ("reward", "reward_std", "frac_reward_zero_std", "loss", "clip_ratio/region_mean",
              "clip_ratio/high_mean", "clip_ratio/low_mean", "dynamic/masked_group_frac", "completions/mean_length",
              "tools/call_frequency", "kl", *FIGURES,
              # the sampler/trainer mismatch and its correction (llama.cpp rollouts: fhirgym.rl._rollout)
              "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max", "sampling/kl",
              "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
              "sampling/importance_sampling_ratio/max", "rollout/seconds", "rollout/export_s", "rollout/swap_s",
              "rollout/model_tokens_per_s", "rollout/truncated_frac")


def _curve_callback(path: Path, plot: Path, t0: float, floors: dict[str, float] | None = None):
    from transformers import TrainerCallback

    class CurveWriter(TrainerCallback):
        """Appends one line per optimiser step to ``curve.jsonl`` and redraws ``curve.png`` (with the
        curriculum's floors); the reward figures appear on the steps that generated (the first of each
        rollout batch)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs:  # the run's closing summary
                return
            row = {"step": state.global_step, "wall_s": round(time.perf_counter() - t0, 1),
                   **{k: logs[k] for k in CURVE_KEYS if k in logs}, **({"floors": floors} if floors else {})}
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
            plot_curve(path, plot, floors=floors)

    return CurveWriter()


def _base_callback(spec: TrainSpec):
    from transformers import TrainerCallback

    class NameTheBase(TrainerCallback):
        """Writes ``fhirgym_base.json`` into every ``checkpoint-N`` as into ``final/``, so any checkpoint
        can be exported or evaluated (PEFT records only the base's directory, no GGUF file)."""

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                _name_the_base(folder, spec)

    return NameTheBase()


def _name_the_base(folder: Path, spec: TrainSpec) -> None:
    (folder / BASE_FILE).write_text(json.dumps({"model": spec.model, "recipe": spec.recipe, "track": spec.track}))


def _time_limit_callback(minutes: float, steps_per_batch: int, t0: float):
    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        """Ends training at the first rollout-batch boundary after ``minutes`` of wall time, so a run fits a
        budget without wasting a generated batch; the trainer then saves ``final/`` as after ``--steps``."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % steps_per_batch == 0 and time.perf_counter() - t0 >= 60 * minutes:
                control.should_training_stop = True
                control.should_save = True

    return TimeLimit()


def plot_curve(curve: Path, out: Path, key: str = "reward", floors: dict[str, float] | None = None) -> Path:
    """``key`` per optimiser step (and its running mean) from ``curve.jsonl``, as a PNG: the reward of a
    GRPO run (0 to 1), the loss of behaviour cloning. ``floors``: horizontal lines, by label (what the
    constant replies and the start policy earn on the curriculum; default: those the curve's rows carry)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in (json.loads(line) for line in curve.read_text().splitlines() if line.strip()) if key in r]
    if floors is None:
        floors = next((r["floors"] for r in reversed(rows) if r.get("floors")), None)
    steps = [r["step"] for r in rows]
    rewards = [r[key] for r in rows]
    running = [sum(rewards[max(0, i - 4):i + 1]) / len(rewards[max(0, i - 4):i + 1]) for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
    label = "mean reward of the step's completions" if key == "reward" else f"{key} of the step"
    ax.plot(steps, rewards, "o", ms=3, alpha=0.5, label=label)
    ax.plot(steps, running, "-", label="running mean (5 steps)")
    for i, (name, value) in enumerate((floors or {}).items()):
        ax.axhline(value, linestyle="--" if name == "start policy" else ":", linewidth=1, color=f"C{i + 2}",
                   label=f"{name}: {value:.2f}")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(key)
    if key == "reward":
        ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _last_checkpoint(out: Path) -> str | None:
    found = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]) if p.name.split("-")[1].isdigit() else -1)
    return str(found[-1]) if found else None


def _curriculum(spec: TrainSpec) -> tuple[list[dict] | None, dict[str, float] | None]:
    """The curriculum's rows and floors (None, None without one); its settings become the spec's. Refused
    (ShortcutCurriculum) where a constant reply pays at least the start policy's mean reward, and where the
    turn or token limits asked for are not those it was measured under."""
    if not spec.curriculum:
        return None, None
    cur = load_curriculum(spec.curriculum)
    check_curriculum(cur, spec.model, spec.curriculum)
    measured = cur["spec"]
    for name, flag in (("max_turns", "--max-turns"), ("max_new_tokens", "--max-new-tokens")):
        if getattr(spec, name) not in (None, measured[name]):
            raise ValueError(f"curriculum {spec.curriculum} was measured with {flag} {measured[name]}, not "
                             f"{getattr(spec, name)}: its pass rates are for that limit (leave it out, or measure again)")
        setattr(spec, name, measured[name])
    spec.track, spec.tasks, spec.per_family = measured["track"], ",".join(cur["kept"]), measured["per_family"]
    spec.world, spec.qa, spec.config, spec.example = measured["world"], measured["qa"], measured["config"], measured["example"]
    floors = {"start policy": cur["start_mean_reward"],
              **{f"constant: {name}": cur["floors"][name] for name in constant_names(spec.track)}}
    return curriculum_rows(cur), floors


def build_trainer(spec: TrainSpec, model: Any = None, tokenizer: Any = None) -> Any:
    """The configured trainer (``model``/``tokenizer`` given: used as they are, e.g. a tiny test model)."""
    import os

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    device_args(spec)  # a device or vLLM choice that cannot work fails before the data and the model load
    if spec.threads:
        torch.set_num_threads(spec.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    recipe = load_recipe(spec.recipe)
    rows, floors = _curriculum(spec)
    if rows is None:
        rows = dataset_rows(spec.track, "train", tasks=spec.tasks, per_family=spec.per_family, world=spec.world,
                            max_turns=spec.max_turns or recipe.max_turns, qa=spec.qa, config=spec.config,
                            example=spec.example)
    if not rows:
        raise ValueError(f"--tasks {spec.tasks!r} gives no training rows on the {spec.track} track")
    engine = rollout_engine(spec)
    if model is None:
        model, tokenizer = load_policy(spec.model, dtype=spec.dtype)
    peft_config = None
    if hasattr(model, "peft_config"):  # a LoRA checkpoint (a warm start): train its adapter on
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.requires_grad_(True)
    else:
        peft_config = LoraConfig(r=spec.lora_r, lora_alpha=2 * spec.lora_r, lora_dropout=0.0,
                                 target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    spec.out.mkdir(parents=True, exist_ok=True)
    (spec.out / "train_spec.json").write_text(json.dumps(asdict(spec), default=str, indent=1))
    args = GRPOConfig(**grpo_args(spec))
    common = dict(model=model, processing_class=tokenizer, args=args, peft_config=peft_config)
    if engine == "llama.cpp":
        base = rollout_base(spec.model)
        rollouts = LlamaRollouts(base, config=spec.config, seed=spec.seed, n_ctx=spec.n_ctx, threads=spec.threads,
                                 grammar=spec.grammar, workdir=spec.out / "rollout-lora")
        (spec.out / "rollout-lora").mkdir(exist_ok=True)
        trainer = llama_trainer_class(recipe.dynamic)(
            **common, reward_funcs=[_rollout_reward(spec.out / "rollouts.jsonl")],
            train_dataset=Dataset.from_list(rows), rollouts=rollouts)
    else:
        for r in rows:
            r["prompt"] = trl_prompt(r["prompt"])
        cls = dynamic_trainer_class() if recipe.dynamic else GRPOTrainer
        trainer = cls(**{**common, "processing_class": trl_tool_parsing(tokenizer, spec.config)},
                      reward_funcs=[_logged_reward(spec.out / "rollouts.jsonl")], train_dataset=Dataset.from_list(rows),
                      environment_factory=trl_environment(spec.config))
    t0 = time.perf_counter()
    trainer.add_callback(_curve_callback(spec.out / "curve.jsonl", spec.out / "curve.png", t0, floors))
    trainer.add_callback(_base_callback(spec))
    if spec.time_limit_min is not None:
        trainer.add_callback(_time_limit_callback(spec.time_limit_min, trainer.args.steps_per_generation, t0))
    return trainer


def train(spec: TrainSpec, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run (or resume) the training; returns the run's summary (also written to ``summary.json``)."""
    trainer = build_trainer(spec, model, tokenizer)
    checkpoint = _last_checkpoint(spec.out) if spec.resume else None
    if not spec.resume:  # a fresh run starts a fresh curve and rollout log
        for name in ("curve.jsonl", "rollouts.jsonl", "behaviour.jsonl"):
            (spec.out / name).unlink(missing_ok=True)
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    wall = time.perf_counter() - t0
    if isinstance(trainer.rollout_func, LlamaRollouts):
        trainer.rollout_func.close()
    final = spec.out / "final"
    trainer.save_model(str(final))
    trainer.processing_class.save_pretrained(str(final))
    _name_the_base(final, spec)
    args = trainer.args
    steps_done = trainer.state.global_step - (int(Path(checkpoint).name.split("-")[1]) if checkpoint else 0)
    rollouts = steps_done * args.per_device_train_batch_size  # completions generated: one batch per step on average
    summary = {"steps": trainer.state.global_step, "steps_this_run": steps_done, "wall_s": round(wall, 1),
               "steps_per_min": round(60 * steps_done / wall, 3) if wall else None,
               "rollouts_per_min": round(60 * rollouts / wall, 3) if wall else None,
               "stopped_by": ("time_limit" if spec.time_limit_min is not None
                              and trainer.state.global_step < spec.max_steps else "steps"),
               "resumed_from": checkpoint, "final": str(final), "train_loss": result.training_loss,
               "rollout_engine": rollout_engine(spec)}
    behaviour = behaviour_summary(spec.out / "rollouts.jsonl") if (spec.out / "rollouts.jsonl").is_file() else []
    with open(spec.out / "behaviour.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in behaviour)
    summary["behaviour"] = behaviour
    (spec.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
