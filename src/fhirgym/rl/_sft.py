"""Behaviour cloning: TRL's ``SFTTrainer`` with LoRA on the expert trajectories (docs/TRAINING.md).

The data are :mod:`._trajectories`' token streams, never tokenised again: ``labels`` hold the model's own
replies and -100 everywhere else. The loss reads the head at the labelled positions only
(``logits_to_keep``): the 151,936-word head over every position was most of a CPU step. Beside the LoRA,
the head's rows of the special tokens the replies write are trained (``head``): the base never writes
``<tool_call>``, and attention-only LoRA barely reaches it. Checkpoints record what they were trained on
(``fhirgym_sft.json``) beside what ``rl export`` needs (``fhirgym_base.json``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ._trainer import (
    BASE_FILE,
    DEFAULT_POLICY,
    LORA_TARGETS,
    _last_checkpoint,
    _time_limit_callback,
    load_policy,
    plot_curve,
)
from ._trajectories import MANIFEST, commit, read_trajectories

SFT_FILE = "fhirgym_sft.json"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX), where it halves a step."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


@dataclass
class SftSpec:
    """One behaviour-cloning run over trajectories directories (``data``: one or several, e.g. an action and a
    QA set; ``valid`` for a held-out loss)."""

    out: Path
    data: Path | list[Path]
    model: str = DEFAULT_POLICY
    valid: Path | None = None
    epochs: float = 2.0
    max_steps: int = -1  # > 0: stop there (else the epochs decide)
    lr: float = 2e-4
    lora_r: int = 16
    head: bool = True  # adapt the output head too (see the module docstring)
    grad_accum: int = 4  # trajectories per optimiser step (one at a time: no padding)
    dtype: str = "auto"  # bfloat16 where the CPU has it, else float32
    save_steps: int = 25
    seed: int = 0
    resume: bool = False
    threads: int | None = None
    time_limit_min: float | None = None
    command: str = ""  # the command line that started the run (recorded with the checkpoint)
    extra: dict = field(default_factory=dict)

    def datasets(self) -> list[Path]:
        return [Path(d) for d in (self.data if isinstance(self.data, list | tuple) else [self.data])]

    def weights_dtype(self) -> str:
        return ("bfloat16" if cpu_has_bf16() else "float32") if self.dtype == "auto" else self.dtype


def _rows(paths: list[Path]) -> list[dict]:
    return [{"input_ids": t.input_ids, "labels": t.labels} for p in paths for t in read_trajectories(p)]


def special_targets(rows: list[dict], tokenizer: Any) -> list[int]:
    """The tokenizer's added (special) tokens among the labelled ones: the head rows ``head`` trains.

    Under the base 0.5B, ``<tool_call>`` opening a reply has log p ≈ -20; after half an epoch of
    attention-only LoRA it was ≈ -10 and the model opened its replies with ``<|im_start|>``. Training the
    rows themselves (PEFT's ``trainable_token_indices``) moves them directly; TRL refuses a LoRA on
    ``lm_head`` (its own loss reads the head's weight) and one would change every row."""
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return sorted({t for r in rows for t in r["labels"] if t in added})


def _trainer_class():
    import torch
    from trl import SFTTrainer

    class LabelledPositionsSFT(SFTTrainer):
        """SFT whose loss reads the output head at the labelled positions only (one sequence a batch)."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            labels = inputs["labels"]
            if labels.shape[0] != 1:
                raise ValueError("one trajectory per batch (gradient accumulation makes the batch)")
            targets = labels[0, 1:]
            keep = torch.nonzero(targets != -100).squeeze(-1)
            out = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"),
                        logits_to_keep=keep)
            logits = out.logits[0].float()
            loss = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum")
            if num_items_in_batch is not None:
                loss = loss / num_items_in_batch
            else:
                loss = loss / max(1, keep.numel())
            return (loss, out) if return_outputs else loss

    return LabelledPositionsSFT


def _curve(path: Path, plot: Path, t0: float):
    from transformers import TrainerCallback

    class LossCurve(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            row = {"step": state.global_step, "wall_s": round(time.perf_counter() - t0, 1),
                   **{k: logs[k] for k in ("loss", "eval_loss", "learning_rate", "grad_norm") if k in logs}}
            if len(row) > 2:
                with open(path, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
                plot_curve(path, plot, key="loss")

    return LossCurve()


def _record(folder: Path, spec: SftSpec) -> None:
    """What a checkpoint was trained on, beside what ``rl export`` needs."""
    (folder / BASE_FILE).write_text(json.dumps({"model": spec.model, "recipe": "sft", "track": "sft"}))
    manifests = [json.loads((d / MANIFEST).read_text()) if (d / MANIFEST).is_file() else None
                 for d in spec.datasets()]
    (folder / SFT_FILE).write_text(json.dumps({
        "data": [str(d) for d in spec.datasets()], "trajectories": manifests, "settings": asdict(spec),
        "commit": commit()}, indent=1, default=str))


def build_sft(spec: SftSpec, model: Any = None, tokenizer: Any = None) -> Any:
    """The configured trainer (``model``/``tokenizer`` given: used as they are, e.g. a tiny test model)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import SFTConfig

    if spec.threads:
        torch.set_num_threads(spec.threads)
    rows = _rows(spec.datasets())
    if not rows:
        raise ValueError(f"{', '.join(map(str, spec.datasets()))} hold no trajectories")
    if model is None:
        model, tokenizer = load_policy(spec.model, dtype=spec.weights_dtype())
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    spec.out.mkdir(parents=True, exist_ok=True)
    valid = Dataset.from_list(_rows([spec.valid])) if spec.valid else None
    args = SFTConfig(output_dir=str(spec.out), num_train_epochs=spec.epochs, max_steps=spec.max_steps,
                     learning_rate=spec.lr, per_device_train_batch_size=1, per_device_eval_batch_size=1,
                     gradient_accumulation_steps=spec.grad_accum, lr_scheduler_type="cosine", warmup_steps=0.05,
                     logging_steps=1, save_steps=spec.save_steps, save_strategy="steps", report_to="none",
                     seed=spec.seed, data_seed=spec.seed, use_cpu=True, bf16=False, fp16=False,
                     dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=False,
                     max_length=None, eval_strategy="epoch" if valid is not None else "no",
                     gradient_checkpointing=False)
    head_tokens = special_targets(rows, tokenizer) if spec.head else []
    lora = LoraConfig(r=spec.lora_r, lora_alpha=2 * spec.lora_r, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                      trainable_token_indices={"lm_head": head_tokens} if head_tokens else None, task_type="CAUSAL_LM")
    trainer = _trainer_class()(model=model, args=args, train_dataset=Dataset.from_list(rows), eval_dataset=valid,
                               processing_class=tokenizer, peft_config=lora)
    if head_tokens:  # PEFT's row layer multiplies by the head's float32 weight itself, past fp32_logits' cast
        trainer.model.get_output_embeddings().register_forward_pre_hook(lambda _m, a: (a[0].float(), *a[1:]))

    class RecordEachCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                _record(folder, spec)

    t0 = time.perf_counter()
    trainer.add_callback(_curve(spec.out / "curve.jsonl", spec.out / "curve.png", t0))
    trainer.add_callback(RecordEachCheckpoint())
    if spec.time_limit_min is not None:
        trainer.add_callback(_time_limit_callback(spec.time_limit_min, 1, t0))
    return trainer


def sft(spec: SftSpec, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run (or resume) behaviour cloning; returns the run's summary (also ``summary.json``)."""
    trainer = build_sft(spec, model, tokenizer)
    checkpoint = _last_checkpoint(spec.out) if spec.resume else None
    if not spec.resume:
        (spec.out / "curve.jsonl").unlink(missing_ok=True)
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    wall = time.perf_counter() - t0
    final = spec.out / "final"
    trainer.save_model(str(final))
    trainer.processing_class.save_pretrained(str(final))
    _record(final, spec)
    rows = len(trainer.train_dataset)
    steps = trainer.state.global_step - (int(Path(checkpoint).name.split("-")[1]) if checkpoint else 0)
    seen = steps * spec.grad_accum
    tokens = sum(len(r["input_ids"]) for r in trainer.train_dataset) / max(1, rows) * seen
    summary = {"steps": trainer.state.global_step, "steps_this_run": steps, "trajectories": rows,
               "wall_s": round(wall, 1), "trajectories_per_min": round(60 * seen / wall, 2) if wall else None,
               "tokens_per_s": round(tokens / wall, 1) if wall else None, "train_loss": result.training_loss,
               "stopped_by": ("time_limit" if spec.time_limit_min is not None
                              and trainer.state.global_step < trainer.state.max_steps else "steps"),
               "resumed_from": checkpoint, "final": str(final), "dtype": spec.weights_dtype()}
    (spec.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
