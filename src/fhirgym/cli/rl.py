"""``fhirgym rl``: datasets, trajectories, behaviour cloning, GRPO, evaluation and export of trained models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .._defaults import (
    CONFIG,
    DEFAULT_PATIENTS,
    DEFAULT_SEED,
    POLICY,
    RECIPE,
    RL_QA_PER_TEMPLATE,
    TRACK_NAMES,
)
from ._group import main
from ._options import _families_option, _selector


@main.group("rl")
def rl_group() -> None:
    """Reinforcement learning: datasets of fhirgym episodes, GRPO recipes, a SkyRL launch for GPUs."""


@rl_group.command("dataset")
@_families_option
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True)
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default="train", show_default=True)
@click.option("--tasks", "selector", default=None,
              help="Task selector (QA: qa.<template> ids or globs)  [default: all]")
@click.option("--per-family", default=8, show_default=True,
              help="Instances per family (seeds of the split); QA: questions per template of the split.")
@click.option("--max-turns", default=12, show_default=True)
@click.option("--config", default=CONFIG, show_default=True, help="Configuration (tools) of the prompts.")
@click.option("--example", is_flag=True, help="Prompts carry the worked example the local agent shows a small model.")
@click.option("--qa-per-template", default=RL_QA_PER_TEMPLATE, show_default=True, help="QA: size of the question set built.")
@click.option("--qa-seed", default=0, show_default=True, help="QA: seed of the question set.")
@click.option("--format", "formats", default="jsonl,parquet", show_default=True, help="jsonl and/or parquet.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--world-seed", default=DEFAULT_SEED, show_default=True)
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True)
def rl_dataset(track: str, split: str, selector: str | None, per_family: int, max_turns: int, config: str,
               example: bool, qa_per_template: int, qa_seed: int, formats: str, out: Path, world_seed: int,
               patients: int) -> None:
    """Rows in SkyRL's layout (data_source, prompt, env_class, reward_spec, extra_info); TRL reads them too.
    QA rows come from a question set split by patient, so splits never share a patient."""
    from ..rl import dataset_rows, write_rows

    try:
        rows = dataset_rows(track, split, tasks=_selector(selector, "all"), per_family=per_family,
                            max_turns=max_turns, world={"seed": world_seed, "patients": patients}, config=config,
                            qa={"per_template": qa_per_template, "seed": qa_seed}, example=example)
    except (ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        paths = write_rows(rows, out, split, tuple(f.strip() for f in formats.split(",") if f.strip()))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{len(rows)} rows ({split}) → " + ", ".join(str(p) for p in paths))


@rl_group.command("trajectories")
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True,
              help="action: ReAct over the task families; qa: CodeAct over the QA questions.")
@click.option("--split", type=click.Choice(["train", "valid"]), default="train", show_default=True,
              help="train: seeds from 100 on (QA: the train patients); valid: the RL valid seeds (QA: patients).")
@click.option("--tasks", "selector", default="train", show_default=True,
              help="train or eval (the held-out split's sides), or a task selector; QA: qa.<template> globs.")
@click.option("--per-family", default=20, show_default=True, help="Instances per family (QA: per template).")
@click.option("--model", default=POLICY, show_default=True,
              help="The local model whose template and grammar the trajectories are written in.")
@click.option("--allow-overlap", is_flag=True, help="Allow the held-out eval families or evaluation's seeds.")
@click.option("--qa-per-template", default=RL_QA_PER_TEMPLATE, show_default=True, help="QA: size of the question set built.")
@click.option("--qa-seed", default=0, show_default=True)
@click.option("--world-seed", default=DEFAULT_SEED, show_default=True)
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def rl_trajectories(track: str, split: str, selector: str, per_family: int, model: str, allow_overlap: bool,
                    qa_per_template: int, qa_seed: int, world_seed: int, patients: int, out: Path) -> None:
    """Expert trajectories for behaviour cloning: each instance's reference solution replayed as the local
    model's turns through a real episode, in the exact tokens evaluation shows the model; kept only on a
    strict pass. Writes trajectories.jsonl, skipped.jsonl (with reasons) and manifest.json."""
    from ..rl import OverlapError, Selection, write_trajectories

    sel = Selection(track=track, split=split, tasks=selector, per_family=per_family,
                    world={"seed": world_seed, "patients": patients},
                    qa={"per_template": qa_per_template, "seed": qa_seed}, allow_overlap=allow_overlap)

    def progress(item) -> None:
        if getattr(item, "reason", None):
            click.echo(f"skipped {item.task_id} s{item.seed}: {item.reason}", err=True)

    try:
        manifest = write_trajectories(out, sel, model, progress)
    except (OverlapError, ValueError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    for family, counts in manifest["per_family"].items():
        click.echo(f"{family:44} kept {counts['kept']:4}  not expressible {counts['skipped']:4}")
    click.echo(f"{manifest['kept']} kept, {manifest['skipped']} not expressible, {manifest['tokens']} tokens "
               f"({manifest['trained_tokens']} trained) in {manifest['seconds']} s → {out}")


@rl_group.command("sft")
@click.option("--data", type=click.Path(file_okay=False, exists=True, path_type=Path), required=True, multiple=True,
              help="A directory written by `fhirgym rl trajectories` (repeatable: e.g. an action and a QA set).")
@click.option("--valid", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Trajectories of the valid split, for a held-out loss each epoch.")
@click.option("--model", default=POLICY, show_default=True,
              help="qwen2.5-coder-0.5b/1.5b (fhirgym's GGUF), a .gguf path, a model directory or a HF hub id.")
@click.option("--epochs", default=2.0, show_default=True)
@click.option("--steps", type=int, default=-1, show_default=True, help="Optimiser steps (> 0: instead of epochs).")
@click.option("--lr", default=2e-4, show_default=True)
@click.option("--lora-r", default=16, show_default=True)
@click.option("--head/--no-head", default=True, show_default=True,
              help="Adapt the output head too (the base never writes Qwen's <tool_call> token otherwise).")
@click.option("--grad-accum", default=4, show_default=True, help="Trajectories per optimiser step.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Base weights (auto: bfloat16 where the CPU has it); LoRA and the output head stay float32.")
@click.option("--save-steps", default=25, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", type=int, default=None)
@click.option("--resume", is_flag=True, help="Go on from the last checkpoint in --out.")
@click.option("--time-limit", type=float, default=None, help="Minutes of training, then save as usual.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def rl_sft(data: tuple[Path, ...], valid: Path | None, model: str, epochs: float, steps: int, lr: float, lora_r: int,
           head: bool, grad_accum: int, dtype: str, save_steps: int, seed: int, threads: int | None, resume: bool,
           time_limit: float | None, out: Path) -> None:
    """Behaviour cloning: TRL's SFTTrainer with LoRA on expert trajectories, the loss on the model's own
    replies only (needs `pip install 'fhirgym[rl]'`). Writes checkpoints, curve.jsonl/png, final/ and
    summary.json; `fhirgym rl export` turns final/ into a GGUF or an adapter llama.cpp serves."""
    try:
        import trl  # noqa: F401

        from ..rl import SftSpec, sft
    except ImportError as exc:
        raise click.ClickException(f"rl sft needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
    spec = SftSpec(out=out, data=list(data), valid=valid, model=model, epochs=epochs, max_steps=steps, lr=lr,
                   lora_r=lora_r, head=head, grad_accum=grad_accum, dtype=dtype, save_steps=save_steps, seed=seed,
                   threads=threads, resume=resume, time_limit_min=time_limit, command=" ".join(sys.argv))
    try:
        summary = sft(spec)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(summary, indent=1))


@rl_group.command("recipes")
@click.option("--json", "as_json", is_flag=True)
def rl_recipes(as_json: bool) -> None:
    """The shipped GRPO recipes and what each means for TRL and for SkyRL."""
    from ..rl import load_recipe, recipe_names, skyrl_overrides, trl_args

    out = {n: {"description": load_recipe(n).description, "trl": trl_args(load_recipe(n)),
               "skyrl": skyrl_overrides(load_recipe(n))} for n in recipe_names()}
    if as_json:
        click.echo(json.dumps(out, indent=1))
        return
    for name, r in out.items():
        click.echo(f"{name}: {r['description']}")


def _qa_world(world_seed: int, patients: int, qa_per_template: int, qa_seed: int) -> tuple[dict, dict]:
    return {"seed": world_seed, "patients": patients}, {"per_template": qa_per_template, "seed": qa_seed}


def _rl_common(fn):
    """Options shared by ``rl train`` and ``rl eval``: track, tasks, world, QA set, turns, lengths."""
    for opt in reversed([
        click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True),
        click.option("--tasks", "selector", default="all", show_default=True,
                     help="Task selector (QA: qa.<template> ids or globs)."),
        click.option("--per-family", default=4, show_default=True,
                     help="Rows per family (QA: per template) of the split."),
        click.option("--config", default=CONFIG, show_default=True, help="Configuration (tools)."),
        click.option("--example", is_flag=True,
                     help="Prompts carry the worked example the local agent shows a small model."),
        click.option("--max-turns", type=int, default=None, help="Model turns per episode (default: the recipe's; eval 6)."),
        click.option("--max-new-tokens", type=int, default=None,
                     help="Tokens per completion (train: the whole multi-turn completion; eval: per turn)."),
        click.option("--world-seed", default=DEFAULT_SEED, show_default=True),
        click.option("--patients", default=DEFAULT_PATIENTS, show_default=True),
        click.option("--qa-per-template", default=RL_QA_PER_TEMPLATE, show_default=True, help="QA: size of the question set."),
        click.option("--qa-seed", default=0, show_default=True),
        click.option("--threads", type=int, default=None, help="torch threads (default: torch's choice)."),
        click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
                     help="torch weights (bfloat16: about twice as fast on CPUs with avx512_bf16; the output "
                          "head and LoRA stay float32)."),
    ]):
        fn = opt(fn)
    return fn


@rl_group.command("train")
@click.option("--recipe", default=RECIPE, show_default=True, help="A shipped recipe name or a TOML file.")
@click.option("--model", default=POLICY, show_default=True,
              help="qwen2.5-coder-0.5b/1.5b (fhirgym's GGUF), a .gguf path, a model directory or a HF hub id.")
@_rl_common
@click.option("--steps", default=10, show_default=True, help="Optimiser steps in all (a resumed run counts on).")
@click.option("--group-size", type=int, default=None, help="Completions per prompt (default: the recipe's).")
@click.option("--prompts-per-batch", default=2, show_default=True, help="Prompts per rollout batch.")
@click.option("--updates-per-batch", type=int, default=None,
              help="Optimiser steps per rollout batch (default: the recipe's; above 1 the clip acts).")
@click.option("--lr", type=float, default=None, help="Learning rate (default: the recipe's).")
@click.option("--lora-r", default=16, show_default=True)
@click.option("--save-steps", default=5, show_default=True, help="Checkpoint every N steps.")
@click.option("--seed", default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Go on from the last checkpoint in --out.")
@click.option("--time-limit", type=float, default=None,
              help="Minutes of training: stop at the first rollout-batch boundary past it (then save as usual).")
@click.option("--curriculum", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A file of `fhirgym rl curriculum`: train on its rows (refused if a constant reply earns at least "
                   "the start policy's mean reward there); its floors are drawn on the curve.")
@click.option("--rollouts", type=click.Choice(["auto", "llama.cpp", "torch"]), default="auto", show_default=True,
              help="What generates rollouts: llama.cpp (auto: on a GGUF base) or TRL's torch generation.")
@click.option("--grammar", is_flag=True, help="llama.cpp rollouts: sample each turn under the local agent's grammar.")
@click.option("--is-mode", type=click.Choice(["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]),
              default="token_truncate", show_default=True,
              help="llama.cpp rollouts: TRL's importance-sampling correction of the sampler/trainer mismatch.")
@click.option("--is-cap", type=float, default=2.0, show_default=True, help="Its cap on the importance weights.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: train on the GPU with bf16 mixed precision (not yet run on a GPU; docs/RL.md).")
@click.option("--use-vllm", is_flag=True, help="Generate with vLLM (--device cuda; --model a HF id or directory).")
@click.option("--vllm-mode", type=click.Choice(["colocate", "server"]), default="colocate", show_default=True,
              help="colocate: vLLM in this process on the training GPU; server: a running `trl vllm-serve`.")
@click.option("--vllm-server-url", default=None, help="The `trl vllm-serve` endpoint  [default: TRL's, localhost:8000]")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.pass_context
def rl_train(ctx: click.Context, recipe: str, model: str, track: str, selector: str, per_family: int, config: str,
             example: bool, max_turns: int | None, max_new_tokens: int | None, world_seed: int, patients: int,
             qa_per_template: int, qa_seed: int, threads: int | None, dtype: str, steps: int, group_size: int | None,
             prompts_per_batch: int, updates_per_batch: int | None, lr: float | None, lora_r: int, save_steps: int,
             seed: int, resume: bool, time_limit: float | None, curriculum: Path | None, rollouts: str, grammar: bool,
             is_mode: str, is_cap: float, device: str, use_vllm: bool, vllm_mode: str, vllm_server_url: str | None,
             out: Path) -> None:
    """GRPO with LoRA (TRL's GRPOTrainer; needs `pip install 'fhirgym[rl]'`, and vLLM for --use-vllm) on the
    CPU or a GPU. On the CPU with a GGUF base llama.cpp generates the rollouts (the current LoRA swapped in
    before each batch, the sampler mismatch corrected). Writes checkpoints, curve.jsonl/png and rollouts.jsonl
    as it goes, then final/ (the LoRA adapter), behaviour.jsonl and summary.json."""
    try:
        import trl  # noqa: F401

        from ..rl import TrainSpec, behaviour_table, train
    except ImportError as exc:
        raise click.ClickException(f"rl train needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
    if curriculum is not None:
        named = [f"--{name.replace('_', '-')}" for name in ("track", "selector", "per_family", "config", "example",
                                                              "world_seed", "patients", "qa_per_template", "qa_seed")
                 if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if named:
            raise click.UsageError(f"--curriculum names the rows and how they were measured: drop "
                                   f"{', '.join(n.replace('--selector', '--tasks') for n in named)}")
    world, qa = _qa_world(world_seed, patients, qa_per_template, qa_seed)
    spec = TrainSpec(out=out, recipe=recipe, model=model, track=track, tasks=selector, per_family=per_family,
                     world=world, qa=qa, config=config, example=example, max_steps=steps, group_size=group_size,
                     prompts_per_batch=prompts_per_batch, updates_per_batch=updates_per_batch, max_turns=max_turns,
                     max_new_tokens=max_new_tokens, lr=lr, lora_r=lora_r, save_steps=save_steps, seed=seed,
                     resume=resume, threads=threads, time_limit_min=time_limit, dtype=dtype, device=device,
                     use_vllm=use_vllm, vllm_mode=vllm_mode, vllm_server_url=vllm_server_url,
                     curriculum=str(curriculum) if curriculum else None, rollouts=rollouts, grammar=grammar,
                     is_mode=is_mode, is_cap=is_cap)
    try:
        summary = train(spec)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    except ImportError as exc:  # e.g. vLLM, which TRL imports only when asked to generate with it
        raise click.ClickException(f"rl train: {exc}") from None
    behaviour = summary.pop("behaviour")
    click.echo(json.dumps(summary, indent=1))
    if behaviour:
        click.echo("behaviour per step (rollouts.jsonl → behaviour.jsonl):\n" + behaviour_table(behaviour))


@rl_group.command("curriculum")
@click.option("--model", default=POLICY, show_default=True,
              help="The start policy: qwen2.5-coder-0.5b/1.5b, a .gguf path, or a LoRA checkpoint on one (warm start).")
@click.option("--track", type=click.Choice(TRACK_NAMES), default=TRACK_NAMES[0], show_default=True)
@click.option("--tasks", "selector", default="all", show_default=True,
              help="Candidate families (QA: qa.<template> ids or globs).")
@click.option("--per-family", default=4, show_default=True, help="Train rows per family (QA: per template).")
@click.option("--episodes", default=4, show_default=True, help="Episodes of the start policy per row (temperature 1).")
@click.option("--low", default=0.2, show_default=True, help="Keep families whose pass rate is at least this…")
@click.option("--high", default=0.8, show_default=True, help="…and at most this.")
@click.option("--config", default=CONFIG, show_default=True, help="Configuration (tools).")
@click.option("--example", is_flag=True, help="Prompts carry the worked example the local agent shows a small model.")
@click.option("--max-turns", default=12, show_default=True, help="Model turns per episode (as training will use).")
@click.option("--max-new-tokens", default=2048, show_default=True,
              help="Tokens per completion, tool results included (as training will use).")
@click.option("--world-seed", default=DEFAULT_SEED, show_default=True)
@click.option("--patients", default=DEFAULT_PATIENTS, show_default=True)
@click.option("--qa-per-template", default=RL_QA_PER_TEMPLATE, show_default=True, help="QA: size of the question set.")
@click.option("--qa-seed", default=0, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--threads", type=int, default=None, help="llama.cpp threads (default: all cores).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The curriculum file (JSON).")
def rl_curriculum(model: str, track: str, selector: str, per_family: int, episodes: int, low: float, high: float,
                  config: str, example: bool, max_turns: int, max_new_tokens: int, world_seed: int, patients: int,
                  qa_per_template: int, qa_seed: int, seed: int, threads: int | None, out: Path) -> None:
    """A curriculum GRPO can learn from: the start policy's pass rate per family on train rows (llama.cpp,
    temperature 1), the families between --low and --high kept, and on their rows what the constant replies
    earn (nothing-found / no-answer, the same after one look, guess). `rl train --curriculum` refuses it if
    a constant earns at least the start policy's mean reward."""
    from ..rl import CurriculumSpec, measure_curriculum

    world, qa = _qa_world(world_seed, patients, qa_per_template, qa_seed)
    spec = CurriculumSpec(model=model, track=track, tasks=selector, per_family=per_family, episodes=episodes, low=low,
                          high=high, world=world, qa=qa, config=config, example=example, max_turns=max_turns,
                          max_new_tokens=max_new_tokens, seed=seed, threads=threads)

    def progress(task: str, fig: dict) -> None:
        click.echo(f"{task:44} pass {fig['passes']:3}/{fig['episodes']:<3} ({fig['pass_rate']:4.0%})  "
                   f"reward {fig['mean_reward']:.2f}  {'kept' if fig['kept'] else 'dropped'}")

    try:
        cur = measure_curriculum(spec, out, progress)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    if cur["start_mean_reward"] is not None:
        click.echo(f"{len(cur['kept'])} families, {len(cur['rows'])} rows kept: start policy {cur['start_mean_reward']:.3f}; "
                   "constant replies " + ", ".join(f"{k} {v:.3f}" for k, v in cur["floors"].items()))
    click.echo(f"→ {out}")
    if cur["refused"]:
        click.echo(f"rl train will refuse it: {cur['refused']}", err=True)


@rl_group.command("eval")
@click.option("--model", required=True,
              help="A checkpoint directory (LoRA or HF), a .gguf path or qwen2.5-coder-0.5b (torch), or a fhirgym "
                   "backend string: local/<model or .gguf> (llama.cpp), openai/<model>, openai-compatible/<model>.")
@click.option("--base-url", default=None, help="Endpoint of an openai-compatible/<model>.")
@click.option("--n", "n", default=4, show_default=True, help="Passes per prompt.")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), default="test", show_default=True)
@click.option("--temperature", default=1.0, show_default=True)
@click.option("--seed", default=0, show_default=True)
@_rl_common
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def rl_eval_cmd(model: str, base_url: str | None, n: int, split: str, temperature: float, seed: int, track: str,
                selector: str, per_family: int, config: str, example: bool, max_turns: int | None,
                max_new_tokens: int | None, world_seed: int, patients: int, qa_per_template: int, qa_seed: int,
                threads: int | None, dtype: str, out: Path) -> None:
    """The RL evaluation protocol: n passes per held-out prompt; mean ± sd, pass@k, breakdowns by resource
    type and answer shape, mean turns (report.json, episodes.jsonl)."""
    from ..rl import rl_eval

    world, qa = _qa_world(world_seed, patients, qa_per_template, qa_seed)
    tokenizer = None
    try:
        if model.split("/", 1)[0] in ("local", "openai", "openai-compatible"):
            from ..agents import make_backend

            policy = make_backend(model, base_url=base_url)
        else:
            try:
                import torch

                from ..rl import load_policy
            except ImportError as exc:
                raise click.ClickException(f"a torch model needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
            if threads:
                torch.set_num_threads(threads)
            policy, tokenizer = load_policy(model, dtype=dtype)
            policy.eval()
        report = rl_eval(policy, tokenizer, track=track, split=split, tasks=selector, per_family=per_family, n=n,
                         world=world, qa=qa, config=config, max_turns=max_turns or 6,
                         max_new_tokens=max_new_tokens or 512, temperature=temperature, seed=seed, out=out,
                         example=example)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{report['prompts']} prompts × {n}: reward {report['mean']:.3f} ± {report['sd']:.3f} (sd over passes), "
               + ", ".join(f"pass@{k} {v:.3f}" for k, v in report["pass@k"].items())
               + f", mean turns {report['mean_turns']:.2f}")
    for name in ("by_resource_type", "by_shape"):
        click.echo(f"{name}: " + ", ".join(f"{k} {v['mean']:.2f} ({v['episodes']})" for k, v in report[name].items()))
    click.echo("behaviour: " + ", ".join(f"{k.split('/', 1)[1]} {v:.2f}" for k, v in report["behaviour"].items()))
    click.echo(f"→ {out / 'report.json'}")


@rl_group.command("export")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A LoRA checkpoint of rl train (final/ or checkpoint-N/).")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="FILE.gguf (merged into the base GGUF, or with --adapter the adapter alone) or, with --hf, "
                   "a directory.")
@click.option("--adapter", is_flag=True,
              help="Write a llama.cpp LoRA adapter GGUF (F32, a few MB) that llama.cpp applies over the base.")
@click.option("--hf", is_flag=True, help="Write a merged Hugging Face directory instead (needs torch).")
def rl_export(checkpoint: Path, out: Path, adapter: bool, hf: bool) -> None:
    """Make a LoRA checkpoint servable by `fhirgym eval`: merged into the base GGUF (then
    `fhirgym eval --agent react --model local/OUT.gguf`), as a llama.cpp adapter for that base
    (`--model local/BASE+OUT.gguf`), or merged into a Hugging Face directory."""
    if adapter and hf:
        raise click.UsageError("--adapter and --hf write different things: give one")
    try:
        from ..rl import base_of, merge_into_gguf, merge_to_hf, write_lora_gguf

        if hf:
            click.echo(f"wrote {merge_to_hf(checkpoint, out)}")
            return
        path = (write_lora_gguf if adapter else merge_into_gguf)(checkpoint, out)
        model = f"{base_of(checkpoint)}+{path}" if adapter else str(path)
    except ImportError as exc:
        raise click.ClickException(f"rl export needs the rl extra: pip install 'fhirgym[rl]' ({exc})") from None
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); evaluate it with: "
               f"fhirgym eval --agent react --model local/{model}")


@rl_group.command("skyrl")
@click.option("--recipe", default=RECIPE, show_default=True, help="A shipped recipe name or a TOML file.")
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory with train.parquet and valid.parquet (fhirgym rl dataset).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--track", type=click.Choice(TRACK_NAMES), default=None,
              help="The rows' track (fhirgym-action or fhirgym-qa); checked against the data  [default: the data's]")
@click.option("--context", type=int, default=None,
              help="The model's context length in tokens, which caps the conversation (generator.max_input_length "
                   "= context - max_generate_length)  [default: Qwen3-8B's 40960; needed for another model]")
@click.option("--set", "sets", multiple=True, help="Extra SkyRL override key=value (repeatable).")
def rl_skyrl(recipe: str, data: Path, out: Path, track: str | None, context: int | None, sets: tuple[str, ...]) -> None:
    """Write a SkyRL 0.4 launch for GPU machines (SkyRL's own environment: Python 3.12, CUDA 13), after
    checking the recipe, the dataset and the lengths. The launch says how to install and run it."""
    from ..rl import write_launch

    extra = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.ClickException(f"--set {item!r}: expected key=value")
        extra[key] = value
    try:
        script = write_launch(recipe, data, out, extra, track=track, context=context)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {script}: run it in SkyRL 0.4's environment on a GPU machine (its header says how)")
