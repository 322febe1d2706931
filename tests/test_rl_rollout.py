"""llama.cpp rollouts for TRL's GRPOTrainer on a tiny random-weight Qwen2 GGUF that llama.cpp and torch both
load (the same weights in both): the sampler's log-probabilities are the trainer's on the same tokens, the
rollout function returns what TRL requires (ids, log-probabilities, env masks) with TextEpisode's loop and
rewards, the current LoRA reaches the sampler before every batch, and TRL's importance-sampling correction
computes, from hand-made sampler log-probabilities, the truncated weights the docs state (how they weigh
the loss: ``tests/test_rl_math.py::test_the_sampler_correction_weighs_each_tokens_clipped_loss``).

Tolerance. Both sides run these F32 tensors in F32 (the rollout engine's KV cache is F32 too), so they
differ by float32 summation order only: on short contexts 1e-6 measured on log-probabilities of order
1-10, asserted < 1e-4; behind the training rows' 3,000-token prompts (the tiny vocabulary is byte-level)
the attention sums over that many keys and the gap grows to 2e-5 on average, 3.4e-4 at most (measured),
asserted < 1e-3. The LoRA step of the training test moves the log-probabilities by 1.2 on average: a
stale adapter would show a thousand times over the tolerance."""

from __future__ import annotations

import inspect
import json
import math
import re
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from _tiny_gguf import random_lora_checkpoint, tiny_qwen2_gguf  # noqa: E402
from fhirgym.agents import LocalBackend  # noqa: E402
from fhirgym.rl import LlamaRollouts, TextEpisode, TrainSpec, dataset_rows, instance_for, load_policy  # noqa: E402
from test_rl_train import _spy_on_generation  # noqa: E402

TOL = 1e-4
LONG_TOL = 1e-3
TASK = "records.patient_not_found"
F32_KV = {"type_k": 0, "type_v": 0}


@pytest.fixture(scope="module")
def world(small_world_path):
    return {"path": str(small_world_path)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    base = tiny_qwen2_gguf(root / "tiny.gguf")
    random_lora_checkpoint(base, root / "ck", seed=1)
    net, tok = load_policy(str(base))
    return {"root": root, "base": base, "ck": root / "ck", "net": net.eval(), "tok": tok}


def _logps(model, context, tokens, temperature=1.0):
    """The torch model's log-probabilities of ``tokens`` after ``context`` (TRL's: log_softmax(logits / T))."""
    with torch.no_grad():
        logits = model(torch.tensor([context + tokens])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return np.array([logp[len(context) - 1 + i, t].item() for i, t in enumerate(tokens)])


def test_sampled_logprobs_are_the_trainers_on_the_same_tokens(tiny):
    """Plain softmax at the temperature, no top-k/top-p/min-p or penalties: what llama.cpp reports for the
    tokens it drew is what torch computes for them, at T 1 and at T 0.7 (the logits divided as TRL divides
    them); a seed repeats a draw; under a grammar the log-probabilities are the renormalised
    distribution's (never below the unconstrained one; 0 where the grammar leaves one token)."""
    backend = LocalBackend(str(tiny["base"]), n_ctx=512, n_threads=1, **F32_KV)
    template = backend.template()
    context = template.tokenize(template.render([{"role": "user", "content": "hello the world"}], None))
    for temperature in (1.0, 0.7):
        drawn = backend.sample_tokens(context, max_tokens=48, temperature=temperature, seed=3)
        assert len(drawn.tokens) == len(drawn.logprobs) > 10
        torch_side = _logps(tiny["net"], context, drawn.tokens, temperature)
        assert np.abs(torch_side - np.array(drawn.logprobs)).max() < TOL
    again = backend.sample_tokens(context, max_tokens=48, temperature=0.7, seed=3)
    assert again.tokens == drawn.tokens and again.reused_tokens == len(context) - 1  # the prompt's KV reused
    assert backend.sample_tokens(context, max_tokens=48, temperature=0.7, seed=4).tokens != drawn.tokens

    gbnf = 'root ::= "the" [ a-z]{4,30}'
    constrained = backend.sample_tokens(context, max_tokens=40, seed=5, grammar=gbnf)
    reply = template.llama.detokenize(constrained.tokens[:-1]).decode()
    assert constrained.finish == "stop" and template.accepts(gbnf, reply) is None
    free = _logps(tiny["net"], context, constrained.tokens)
    assert (np.array(constrained.logprobs) >= free - TOL).all()
    assert constrained.logprobs[0] == 0.0  # "t" of "the": the only token the grammar allows first

    backend.use_lora(_adapter(tiny))  # an adapter on the sampler: the PEFT model's log-probabilities
    peft = load_policy(str(tiny["ck"]))[0].eval()
    drawn = backend.sample_tokens(context, max_tokens=32, seed=6)
    assert np.abs(_logps(peft, context, drawn.tokens) - np.array(drawn.logprobs)).max() < TOL
    assert np.abs(_logps(tiny["net"], context, drawn.tokens) - np.array(drawn.logprobs)).max() > 0.1


def _adapter(tiny):
    from fhirgym.rl import write_lora_gguf

    out = tiny["root"] / "ck.gguf"
    return out if out.is_file() else write_lora_gguf(tiny["ck"], out)


def _fake_trainer(rows, step=0, max_completion=400):
    return SimpleNamespace(_rollout_rows=rows, state=SimpleNamespace(global_step=step),
                           max_completion_length=max_completion, temperature=1.0,
                           model=SimpleNamespace(training=True), _metrics=defaultdict(lambda: defaultdict(list)))


class _CallsThenAnswers(LlamaRollouts):
    """Turns sampled under grammars that make the random model act like an agent: a Patient search, then
    the negative answer (each forced but for where the turn ends: either end-of-generation token)."""

    CALL = '<tool_call>\n{"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {"_count": "1"}}}\n</tool_call>'

    def turn_grammar(self, text, messages):
        if not any(m["role"] == "tool" for m in messages):
            return "root ::= " + json.dumps(self.CALL)
        return 'root ::= "<answer>{\\"found\\": false}</answer>"'


def test_the_rollout_function_returns_what_trl_requires(tiny, world):
    """Two rows (the second a negative instance) × a group of 2: TRL's keys, one completion per prompt, env_mask 0
    and log-probability 0 exactly on the tool results, prompt and completion tokens that are the
    conversation as the chat template renders it, and TextEpisode's reward for the transcript."""
    rows = dataset_rows("action", "train", tasks=TASK, per_family=3, world=world, max_turns=3, config="read")
    for row in rows:
        row["extra_info"]["budget"] = 600  # short tool results: short byte-level token streams
    batch = [rows[0], rows[0], rows[2], rows[2]]
    engine = _CallsThenAnswers(tiny["base"], config="read", n_ctx=8192, threads=1)
    trainer = _fake_trainer(batch, max_completion=1500)
    out = engine([r["prompt"] for r in batch], trainer)
    assert {"prompt_ids", "completion_ids", "logprobs", "env_mask"} <= set(out)
    assert all(len(out[k]) == 4 for k in out)
    template = engine.backend.template()
    with_tools = 0
    for i, row in enumerate(batch):
        ids, logps, mask, done = out["completion_ids"][i], out["logprobs"][i], out["env_mask"][i], out["rollout"][i]
        assert len(ids) == len(logps) == len(mask) <= 1500 and set(mask) <= {0, 1} and mask[0] == 1
        text = TextEpisode(instance_for(row["extra_info"]), "read", max_turns=3, budget=600)
        opening = text.reset()
        assert out["prompt_ids"][i] == template.tokenize(engine.backend.render(opening, None))
        assert all(lp == 0.0 for lp, m in zip(logps, mask, strict=True) if m == 0)
        assert all(lp <= 0.0 for lp in logps) and any(lp < 0 for lp in logps)
        # one run of env tokens per turn that called tools, holding those tools' results
        groups: list[list[dict]] = []
        for m in done["completion"]:
            if m["role"] == "assistant":
                groups.append([])
            elif m["role"] == "tool":
                groups[-1].append(m)
        groups = [g for g in groups if g]
        runs = "".join(map(str, mask))
        zeros = list(re.finditer("0+", runs))
        assert len(zeros) == len(groups)
        for run, group in zip(zeros, groups, strict=True):
            shown = template.llama.detokenize(ids[run.start():run.end()]).decode()
            cut = done["truncated"] and run.end() == len(runs)  # a result that did not fit: cut off
            assert cut or all(tool["content"] in shown for tool in group)
        tools = [m for g in groups for m in g]
        with_tools += bool(tools)
        if not done["truncated"]:  # the tokens are the conversation, rendered
            whole = template.llama.detokenize(out["prompt_ids"][i] + ids, special=True).decode(errors="replace")
            whole = whole.replace("<|endoftext|>", template.eos)  # either end-of-generation token ends a turn
            assert whole + "\n" == template.render(opening + done["completion"], None, generation_prompt=False)
        # TextEpisode's reward: the same replies replayed give the same reward
        replies = [m["content"] for m in done["completion"] if m["role"] == "assistant"]
        cut_reply = done["truncated"] and done["completion"][-1]["role"] == "assistant"
        for j, reply in enumerate(replies):
            step = text.finish(reply) if cut_reply and j == len(replies) - 1 else text.step(reply)
        if text.verdict is None:
            step = text.finish(None)
        assert step.reward == out["episode_reward"][i] == done["reward"]
        assert done["behaviour"]["calls"] == len(tools)
        text.close()
    assert with_tools == 4
    assert out["completion_ids"][0] != out["completion_ids"][1]  # a group's rollouts draw with their own seeds
    assert trainer._metrics["train"]["rollout/seconds"]
    again = engine([r["prompt"] for r in batch], _fake_trainer(batch, max_completion=1500))
    assert again["completion_ids"] == out["completion_ids"]  # seeded by (seed, step, rollout)
    # the negative answer after a look at Patient: right on the negative instance only (seed 2)
    assert out["episode_reward"] == [0.0, 0.0, 1.0, 1.0]
    assert all(r["behaviour"] == {"calls": 1, "looked": True, "answered": True, "negative": True}
               for r in out["rollout"])


def _model_tokens(batch, i):
    """Rollout i of a generation batch: its context (prompt without padding), its completion tokens, and
    the positions of the model's own tokens among them."""
    prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
    keep = batch["completion_mask"][i].bool()
    completion = batch["completion_ids"][i][keep].tolist()
    model = (batch["tool_mask"][i][keep] if "tool_mask" in batch else torch.ones(len(completion))).bool()
    return prompt, completion, model


def _accepted_curriculum(path, model, world):
    """A curriculum file as `rl curriculum` writes it (one row of TASK), whose floors lie below the start."""
    rows = dataset_rows("action", "train", tasks=TASK, per_family=1, world=world, max_turns=2, config="read")
    spec = {"model": model, "track": "action", "tasks": TASK, "per_family": 1, "episodes": 4, "low": 0.2,
            "high": 0.8, "world": world, "qa": {"per_template": 20, "seed": 0}, "config": "read", "example": False,
            "max_turns": 2, "max_new_tokens": 48}
    path.write_text(json.dumps({
        "version": 1, "spec": spec, "kept": [TASK], "rows": [{"task_id": TASK, "seed": r["extra_info"]["seed"],
                                                              "question_id": None} for r in rows],
        "start_mean_reward": 0.5, "floors": {"nothing-found": 0.0, "nothing-found after a look": 0.25, "guess": 0.0}}))
    return path


def test_training_swaps_the_lora_into_the_sampler_before_every_batch(tiny, world, tmp_path, monkeypatch):
    """A warm start from a LoRA checkpoint on an accepted curriculum, two rollout batches of one optimiser
    step each: on both, the sampler's log-probabilities equal the trainer's (old_per_token_logps) on the
    same tokens, the first batch's with the checkpoint's adapter (not the bare base), the second's with the
    adapter after the update (not the checkpoint's any more): the adapter was exported and swapped in
    before each batch. The curve is drawn with the curriculum's floors."""
    from fhirgym.rl import _trainer, build_trainer

    drawn = []
    plot = _trainer.plot_curve
    monkeypatch.setattr(_trainer, "plot_curve", lambda *a, **k: drawn.append(k.get("floors")) or plot(*a, **k))
    cur = _accepted_curriculum(tmp_path / "cur.json", str(tiny["ck"]), world)
    spec = TrainSpec(out=tmp_path / "run", model=str(tiny["ck"]), curriculum=str(cur), max_steps=2, group_size=4,
                     prompts_per_batch=1, updates_per_batch=1, lr=5e-2, lora_r=4, save_steps=10, seed=0, threads=1)
    trainer = build_trainer(spec)
    assert (spec.tasks, spec.config, spec.max_turns, spec.max_new_tokens) == (TASK, "read", 2, 48)
    assert type(trainer).__name__ == "LlamaRolloutTrainer" and trainer.use_vllm and not trainer.args.use_vllm
    trainer.mask_truncated_completions = False  # a random model seldom ends a reply within 48 tokens
    engine = trainer.rollout_func
    episode = engine.episode
    count = iter(range(1000))

    def paid(extra, **kw):  # rewards 1, 0, 1, 0: signal for the update (the sampler is what is under test)
        done = episode(extra, **kw)
        done.reward = float(next(count) % 2 == 0)
        return done

    engine.episode = paid
    seen = _spy_on_generation(trainer)
    trainer.train()
    assert len(seen) == 2
    start = load_policy(str(tiny["ck"]))[0].eval()
    for b, batch in enumerate(seen):
        for i in range(4):
            prompt, completion, model = _model_tokens(batch, i)
            keep = batch["completion_mask"][i].bool()
            sampled = batch["sampling_per_token_logps"][i][keep].numpy()[model.numpy()]
            trained = batch["old_per_token_logps"][i][keep].numpy()[model.numpy()]
            assert np.abs(sampled - trained).max() < LONG_TOL
            before = _logps(start, prompt, completion)[model.numpy()]
            if b == 0:
                base = _logps(tiny["net"], prompt, completion)[model.numpy()]
                assert np.abs(sampled - before).max() < LONG_TOL and np.abs(sampled - base).max() > 0.1
            else:
                assert np.abs(sampled - before).mean() > 0.1  # the updated adapter, not the checkpoint's
    curve = [json.loads(line) for line in (spec.out / "curve.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [1, 2]
    for row in curve:
        assert row["sampling/sampling_logp_difference/mean"] < TOL and row["sampling/kl"] < TOL
        assert row["sampling/importance_sampling_ratio/min"] == pytest.approx(1, abs=1e-3)
        assert row["rollout/export_s"] > 0 and "behaviour/mean_calls" in row
    assert [p.name for p in (spec.out / "rollout-lora").glob("*.gguf")] == ["lora-step1.gguf"]
    assert drawn == [{"start policy": 0.5, "constant: nothing-found": 0.0,
                      "constant: nothing-found after a look": 0.25, "constant: guess": 0.0}] * 2
    assert (spec.out / "curve.png").stat().st_size > 1000 and all(r["floors"] == drawn[0] for r in curve)


class _HandMade:
    """A stand-in rollout engine: fixed completions whose sampler log-probabilities are the trainer's own
    (computed at the current weights) plus chosen offsets, and env tokens in the middle."""

    #: per completion token: offset of log π_sampler from log π_train (None: a tool token)
    OFFSETS = (math.log(2), 0.0, None, None, -math.log(3), -math.log(1.5), math.log(4))

    def __init__(self) -> None:
        self.synced: list[int] = []

    def bind(self, trainer):
        self.trainer = trainer

    def sync_weights(self):
        self.synced.append(self.trainer.state.global_step)

    def __call__(self, prompts, trainer):
        eos = trainer.processing_class.eos_token_id
        prompt = [257, 108, 101, 10]
        completion = [104, 105, 106, 107, 108, 109, eos]
        model = trainer.accelerator.unwrap_model(trainer.model)
        train = _logps(model, prompt, completion)
        logps = [0.0 if o is None else float(t + o) for t, o in zip(train, self.OFFSETS, strict=True)]
        mask = [0 if o is None else 1 for o in self.OFFSETS]
        n = len(prompts)
        return {"prompt_ids": [prompt] * n, "completion_ids": [completion] * n, "logprobs": [logps] * n,
                "env_mask": [mask] * n, "episode_reward": [1.0, 0.0] * (n // 2),
                "rollout": [{"behaviour": {"calls": 0, "looked": False, "answered": True, "negative": False}}] * n}


def test_trl_computes_the_truncated_weights_from_the_samplers_logprobs(tiny, world, tmp_path):
    """Hand-made sampler log-probabilities through TRL's own correction (reused, not rewritten): Δ = log
    π_train − log π_sampler = −offset, so the weights are exp(−ln 2) = 0.5, 1, exp(ln 3) = 3 → capped at 2,
    1.5 and exp(−ln 4) = 0.25 on the model tokens, exactly 1 on the two tool tokens; mean |Δ| over the
    five model tokens is (ln 2 + 0 + ln 3 + ln 1.5 + ln 4) / 5 = 0.7167; the KL (k3) is the mean of
    e^Δ − 1 − Δ = (0.1931, 0, 0.9014, 0.0945, 0.6363) / 5 = 0.3651. The weights are synced first."""
    from datasets import Dataset
    from trl import GRPOConfig

    from fhirgym.rl import llama_trainer_class
    from fhirgym.rl._trainer import _rollout_reward, grpo_args

    spec = TrainSpec(out=tmp_path / "hand", model=str(tiny["base"]), tasks=TASK, per_family=1, world=world,
                     max_steps=1, group_size=2, prompts_per_batch=1, updates_per_batch=1, lr=1e-9, lora_r=4,
                     max_new_tokens=16)
    rows = dataset_rows("action", "train", tasks=TASK, per_family=1, world=world, max_turns=2, config="read")
    from peft import LoraConfig

    engine = _HandMade()
    trainer = llama_trainer_class()(
        model=load_policy(str(tiny["base"]))[0], processing_class=tiny["tok"], args=GRPOConfig(**grpo_args(spec)),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), train_dataset=Dataset.from_list(rows),
        reward_funcs=[_rollout_reward(tmp_path / "rollouts.jsonl")], rollouts=engine)
    seen = _spy_on_generation(trainer)
    trainer.train()
    assert engine.synced == [0]
    weights = seen[0]["importance_sampling_ratio"][0].tolist()
    assert weights == pytest.approx([0.5, 1.0, 1.0, 1.0, 2.0, 1.5, 0.25], abs=1e-4)
    logs = trainer.state.log_history[0]
    assert logs["sampling/sampling_logp_difference/mean"] == pytest.approx(
        (math.log(2) + math.log(3) + math.log(1.5) + math.log(4)) / 5, abs=1e-4)
    k3 = [math.exp(-o) - 1 + o for o in (math.log(2), 0.0, -math.log(3), -math.log(1.5), math.log(4))]
    assert logs["sampling/kl"] == pytest.approx(sum(k3) / 5, abs=1e-4) == pytest.approx(0.3651, abs=1e-3)


def test_trl_gates_its_correction_on_use_vllm_and_nothing_else_we_replace():
    """LlamaRolloutTrainer turns TRL's correction on by setting ``use_vllm`` after ``__init__``. That is
    safe only while TRL reads the flag where this test says: the correction itself, vLLM's setup in
    ``__init__`` (already past), the single-turn and tool-loop generation paths (never taken with a
    ``rollout_func`` and no tools), and the weight sync before ``rollout_func`` (our ``sync_weights``)."""
    from trl import GRPOTrainer

    where = defaultdict(int)
    for name, fn in inspect.getmembers(GRPOTrainer, inspect.isfunction):
        try:
            src = inspect.getsource(fn)
        except OSError:
            continue
        where[name] += src.count("self.use_vllm")
    assert {k: v for k, v in where.items() if v} == {
        "__init__": 3, "_generate_single_turn": 1, "_tool_call_loop": 1, "_generate": 1,
        "_generate_and_score_completions": 4, "_compute_loss": 1}
    generate = inspect.getsource(GRPOTrainer._generate)
    branch = generate.split("if self.rollout_func is not None:", 1)[1].split("else:", 1)[0]
    assert re.findall(r"self\.vllm_generation\.\w+", branch) == ["self.vllm_generation.sync_weights"]
    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert score.count("self.use_vllm and self.vllm_importance_sampling_correction") == 4
    assert "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask" in score
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]' in loss


def test_what_generates_the_rollouts(tiny, tmp_path, monkeypatch):
    """llama.cpp on the CPU for a GGUF base (a local model name, a .gguf path, a LoRA checkpoint on one),
    decided from the name alone (nothing is fetched); TRL's generation for a Hugging Face model, on a GPU
    unless llama.cpp is asked for, and always with vLLM (llama.cpp and vLLM together are refused)."""
    from fhirgym.agents import _local, _weights
    from fhirgym.rl import _policy
    from fhirgym.rl._trainer import grpo_args, rollout_engine

    for module in (_weights, _local, _policy):  # wherever a local model's file could be assembled
        monkeypatch.setattr(module, "model_path", lambda name: pytest.fail(f"{name} would be fetched"))
    spec = lambda **kw: TrainSpec(out=tmp_path, **kw)  # noqa: E731
    assert rollout_engine(spec()) == rollout_engine(spec(model=str(tiny["ck"]))) == "llama.cpp"
    assert rollout_engine(spec(model=str(tiny["base"]))) == "llama.cpp"
    assert rollout_engine(spec(model="Qwen/Qwen2.5-Coder-0.5B-Instruct")) == "torch"
    assert rollout_engine(spec(rollouts="torch")) == "torch"
    assert rollout_engine(spec(device="cuda")) == "torch"
    assert rollout_engine(spec(device="cuda", rollouts="llama.cpp")) == "llama.cpp"
    assert rollout_engine(spec(device="cuda", model="Qwen/Qwen2.5-Coder-0.5B-Instruct", use_vllm=True)) == "torch"
    with pytest.raises(ValueError, match="both generate"):
        rollout_engine(spec(device="cuda", model="Qwen/Qwen2.5-Coder-0.5B-Instruct", use_vllm=True,
                            rollouts="llama.cpp"))
    with pytest.raises(ValueError, match="need a GGUF base"):
        rollout_engine(spec(model="Qwen/Qwen2.5-Coder-0.5B-Instruct", rollouts="llama.cpp"))
    args = grpo_args(spec())
    assert (args["vllm_importance_sampling_correction"], args["vllm_importance_sampling_mode"],
            args["vllm_importance_sampling_clip_max"], args["use_vllm"]) == (True, "token_truncate", 2.0, False)
    with pytest.raises(ValueError, match="cap must be above 1"):
        grpo_args(spec(is_cap=0.5))
