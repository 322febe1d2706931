"""The CPU trainer end to end on a tiny random-weight Qwen2 model with a scripted ``generate`` (TRL's own
test pattern): no real weights, no network. It trains, clips off-policy, masks flat groups, writes the
curve and checkpoints, resumes, and the evaluation protocol runs on what it saved."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from fhirgym.rl import TrainSpec, build_trainer, rl_eval, train  # noqa: E402
from fhirgym.tasks import TaskWorld  # noqa: E402

TASK = "records.find_patient"


def tiny_qwen(path, corpus=()):
    """A 2-layer Qwen2 with random weights and a byte-level BPE trained on ``corpus`` (the prompts and tool
    outputs it will see, so sequences stay short), carrying TRL's Qwen2.5 chat template (so TRL's
    tool-call parser recognises it), saved to ``path``."""
    from importlib import resources

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>", "<tools>", "</tools>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ['{"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {}}}',
              "The final answer is: <answer>{\"patient_id\": \"abc\"}</answer> system user assistant tool",
              *corpus]
    tok.train_from_iterator(corpus * 5, trainers.BpeTrainer(vocab_size=4000, special_tokens=special,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    template = resources.files("trl").joinpath("chat_templates", "qwen2_5.jinja").read_text()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=template)
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def scripted_generate(tokenizer, replies):
    """``model.generate`` replaced: rollout i of a batch answers ``replies(i, prompt_text)`` (plus <|im_end|>)."""
    calls = []

    def generate(input_ids, attention_mask=None, **_):
        rows = []
        for i in range(input_ids.size(0)):
            prompt = tokenizer.decode(input_ids[i][attention_mask[i].bool()])
            text = replies(i, prompt)
            rows.append(tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"])
        calls.append(len(rows))
        width = max(map(len, rows))
        out = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r)
        return torch.cat([input_ids, out], dim=1)

    generate.calls = calls
    return generate


@pytest.fixture(scope="module")
def world_spec(small_world_path):
    TaskWorld.open(small_world_path)
    return {"path": str(small_world_path)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, world_spec, solutions):
    from fhirgym.rl import TextEpisode, dataset_rows, instance_for

    corpus = []
    for split in ("train", "test"):
        for row in dataset_rows("action", split, tasks=TASK, per_family=2, world=world_spec):
            corpus += [m["content"] for m in row["prompt"]]
            text = TextEpisode(instance_for(row["extra_info"]))
            text.reset()
            params = _params_of(row["extra_info"])
            given, family = params["name"].split()[0], params["name"].split()[-1]
            step = text.step("<tool_call>" + json.dumps({"name": "searchResources", "arguments": {
                "resourceType": "Patient", "params": {"given": given, "family": family,
                                                      "birthdate": params["birth_date"]}}}) + "</tool_call>")
            corpus += [o["content"] for o in step.observations]
            text.close()
    return tiny_qwen(tmp_path_factory.mktemp("tiny"), corpus)


def _params_of(extra):
    from fhirgym.rl import instance_for

    return instance_for(extra).params


def _answer_from(prompt: str) -> str:
    """The id of the first Patient in the last tool response of the prompt (what a solver would answer)."""
    body = prompt.rsplit("<tool_response>", 1)[1].split("</tool_response>", 1)[0]
    resources = json.loads(body.strip()).get("resources") or [{"id": "nobody"}]
    return resources[0]["id"]


def _search_for(prompt: str) -> dict:
    """The search a solver makes: the patient's names and birth date as the task asked (from its params)."""
    for params in SOLUTIONS.values():
        if params["name"] in prompt:
            given, family = params["name"].split()[0], params["name"].split()[-1]
            return {"given": given, "family": family, "birthdate": params["birth_date"]}
    return {}


SOLUTIONS: dict = {}


@pytest.fixture(scope="module", autouse=True)
def solutions(world_spec):
    from fhirgym.rl import instance_for

    for seed in [*range(0, 6), *range(11_000, 11_006)]:
        try:
            inst = instance_for({"task_id": TASK, "seed": seed, "world": world_spec})
        except Exception:
            continue
        SOLUTIONS[seed] = inst.params


def _replies(i: int, prompt: str) -> str:
    """Rollouts of a group of 4: even ones search then answer from the result (solve), odd ones guess (fail)."""
    if "<tool_response>" in prompt:
        return f'<answer>{{"patient_id": "{_answer_from(prompt)}"}}</answer>'
    if i % 2:
        return '<answer>{"patient_id": "nobody"}</answer>'
    return "<tool_call>\n" + json.dumps({"name": "searchResources", "arguments": {
        "resourceType": "Patient", "params": _search_for(prompt)}}) + "\n</tool_call>"


def _spec(out, tiny, world_spec, **kw):
    base = dict(out=out, model=str(tiny), tasks=TASK, per_family=2, world=world_spec, max_steps=4, group_size=4,
                prompts_per_batch=1, updates_per_batch=2, max_turns=3, max_new_tokens=2048, lr=5e-2, lora_r=4,
                save_steps=2, seed=0)
    base.update(kw)
    return TrainSpec(**base)


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _spy_on_generation(trainer) -> list[dict]:
    """What each of the trainer's generation batches hands to the loss (copied: TRL edits it in place)."""
    seen: list[dict] = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        seen.append({k: v.clone() if hasattr(v, "clone") else v for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = spy
    return seen


def test_train_clips_off_policy_writes_curve_checkpoints_and_resumes(tiny, world_spec, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = _spec(tmp_path / "run", tiny, world_spec, recipe="clip-higher")
    model, tok = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    model.generate = scripted_generate(tok, _replies)
    trainer = build_trainer(spec, model, tok)
    seen = _spy_on_generation(trainer)
    trainer.train()
    curve = _jsonl(spec.out / "curve.jsonl")
    assert [r["step"] for r in curve] == [1, 2, 3, 4]
    assert (spec.out / "curve.png").stat().st_size > 1000
    assert (spec.out / "checkpoint-2").is_dir() and (spec.out / "checkpoint-4").is_dir()
    assert json.loads((spec.out / "checkpoint-2" / "fhirgym_base.json").read_text())["model"] == str(tiny)
    # the scripted group solves twice in four: reward 0.5 per step, advantages ±0.866 (std over n - 1)
    assert [r.get("reward") for r in curve] == [pytest.approx(0.5), None, pytest.approx(0.5), None]
    assert len(seen) == 2  # 4 steps, 2 optimiser steps per generation batch
    adv = seen[0]["advantages"]
    assert sorted(adv.tolist()) == pytest.approx([-0.866, -0.866, 0.866, 0.866], abs=1e-3)
    # observation tokens are in the completion but masked out of the loss
    assert "tool_mask" in seen[0] and (seen[0]["tool_mask"] == 0).any()
    assert int(seen[0]["num_items_in_batch"]) == int((seen[0]["completion_mask"] * seen[0]["tool_mask"]).sum())
    # off-policy: the old log-probs are kept for the second update, whose ratio is no longer 1
    assert "old_per_token_logps" in seen[0]
    second = [r for r in curve if r["step"] % 2 == 0]
    assert all("clip_ratio/region_mean" in r for r in second)

    # resume: two more steps from checkpoint-4, the curve goes on
    resumed = train(_spec(spec.out, tiny, world_spec, recipe="clip-higher", max_steps=6, resume=True),
                    *_scripted(tiny))
    assert resumed["resumed_from"].endswith("checkpoint-4") and resumed["steps"] == 6 and resumed["steps_this_run"] == 2
    curve = _jsonl(spec.out / "curve.jsonl")
    assert [r["step"] for r in curve] == [1, 2, 3, 4, 5, 6]
    assert (spec.out / "final" / "adapter_config.json").is_file()
    assert json.loads((spec.out / "final" / "fhirgym_base.json").read_text())["model"] == str(tiny)


def _scripted(tiny, replies=_replies):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    model.generate = scripted_generate(tok, replies)
    return model, tok


def test_the_ratio_leaves_one_on_the_second_update(tiny, world_spec, tmp_path):
    """Clipping acts only off-policy: on the first update of a generation batch the new and old log-probs
    agree; after one optimiser step (lr 5e-2 on LoRA) they differ on the second update."""
    spec = _spec(tmp_path / "ratio", tiny, world_spec, max_steps=2)
    trainer = build_trainer(spec, *_scripted(tiny))
    ratios = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, attention_mask, logits_to_keep, *a, **k):
        out = original(model, input_ids, attention_mask, logits_to_keep, *a, **k)
        if torch.is_grad_enabled():
            ratios.append(out[0].detach().clone())
        return out

    trainer._get_per_token_logps_and_entropies = spy
    buffered = []
    original_prepare = trainer._prepare_inputs

    def prepare(batch):
        out = original_prepare(batch)
        buffered.append(out)
        return out

    trainer._prepare_inputs = prepare
    trainer.train()
    assert len(buffered) == 2
    first = (ratios[0] - buffered[0]["old_per_token_logps"]).abs()
    second = (ratios[1] - buffered[1]["old_per_token_logps"]).abs()
    mask0 = buffered[0]["completion_mask"].bool()
    mask1 = buffered[1]["completion_mask"].bool()
    assert first[mask0].max() < 1e-5  # ratio 1 on the first update
    assert second[mask1].max() > 1e-3  # the policy has moved: the ratio is not 1, the clip can act


def test_trl_runs_the_bare_json_calls_the_episode_runs(tiny, world_spec, tmp_path):
    """The 0.5B mostly writes its call as a bare JSON object; TRL's Qwen parser reads only tagged calls, so
    without fhirgym's parsing TRL would end those rollouts unanswered (reward 0). With it, the same
    scripted group as the tagged test calls the tool and scores the same 0.5."""
    def bare(i: int, prompt: str) -> str:
        return _replies(i, prompt).replace("<tool_call>\n", "").replace("\n</tool_call>", "")

    assert not bare(0, "Ada").startswith("<")
    spec = _spec(tmp_path / "bare", tiny, world_spec, max_steps=2)
    trainer = build_trainer(spec, *_scripted(tiny, bare))
    seen = _spy_on_generation(trainer)
    trainer.train()
    curve = _jsonl(spec.out / "curve.jsonl")
    assert curve[0]["reward"] == pytest.approx(0.5) and curve[0]["tools/call_frequency"] > 0
    assert (seen[0]["tool_mask"] == 0).any()  # the tool's result went into the completion, masked
    rollouts = _jsonl(spec.out / "rollouts.jsonl")
    assert [r["step"] for r in rollouts] == [1] * 4  # what each reward paid for, as TRL ran it
    assert sum(r["reward"] for r in rollouts) / 4 == pytest.approx(curve[0]["reward"])
    called = [r for r in rollouts if any(m["role"] == "tool" for m in r["completion"])]
    assert len(called) == 2 and all(r["extra_info"]["task_id"] == TASK for r in rollouts)


def test_a_time_limit_stops_at_a_rollout_batch_boundary_and_saves(tiny, world_spec, tmp_path):
    """A limit of 0 minutes is past after the first optimiser step, but the run finishes the rollout batch
    (2 updates) before it stops, then saves final/ and says why it stopped."""
    spec = _spec(tmp_path / "limit", tiny, world_spec, max_steps=6, time_limit_min=0.0)
    summary = train(spec, *_scripted(tiny))
    assert summary["steps"] == 2 and summary["stopped_by"] == "time_limit"
    assert (spec.out / "final" / "adapter_config.json").is_file() and (spec.out / "checkpoint-2").is_dir()
    assert train(_spec(tmp_path / "full", tiny, world_spec, max_steps=2), *_scripted(tiny))["stopped_by"] == "steps"


def test_dynamic_recipe_masks_flat_groups(tiny, world_spec, tmp_path):
    """Every rollout guesses (reward 0 everywhere): with clip-higher+dynamic the flat group is masked out
    of the loss, num_items_in_batch counts nothing, and the share is logged."""
    spec = _spec(tmp_path / "dyn", tiny, world_spec, recipe="clip-higher+dynamic", max_steps=2)
    trainer = build_trainer(spec, *_scripted(tiny, lambda i, p: '<answer>{"patient_id": "nobody"}</answer>'))
    assert type(trainer).__name__ == "DynamicSamplingGRPOTrainer"
    seen = _spy_on_generation(trainer)
    trainer.train()
    assert int(seen[0]["num_items_in_batch"]) == 0 and int(seen[0]["completion_mask"].sum()) == 0
    curve = _jsonl(spec.out / "curve.jsonl")
    assert curve[0]["dynamic/masked_group_frac"] == 1.0 and curve[0]["frac_reward_zero_std"] == 1.0


def test_eval_protocol_on_a_checkpoint(tiny, world_spec, tmp_path):
    """``rl_eval`` runs n passes per held-out prompt and reports mean ± sd, pass@k and the breakdowns."""
    model, tok = _scripted(tiny)
    report = rl_eval(model, tok, track="action", split="test", tasks=TASK, per_family=2, n=4, world=world_spec,
                     max_turns=3, max_new_tokens=64, out=tmp_path / "eval")
    assert report["prompts"] == 2 and report["episodes"] == 8
    assert report["mean"] == pytest.approx(0.5) and report["pass@k"]["1"] == pytest.approx(0.5)
    assert report["pass@k"]["4"] == pytest.approx(1.0)  # each prompt is solved in 2 of 4 passes
    assert report["by_resource_type"]["Patient"]["mean"] == pytest.approx(0.5)
    assert report["mean_turns"] == pytest.approx(1.5)
    # half the passes search then answer, half answer at once: a look in 2 of 4, no negative answer
    assert report["behaviour"] == {"behaviour/negative_share": 0.0, "behaviour/mean_calls": 0.5,
                                   "behaviour/answer_without_look_share": 0.5}
    assert (tmp_path / "eval" / "episodes.jsonl").is_file() and (tmp_path / "eval" / "report.json").is_file()


def test_eval_protocol_on_the_qa_track(tiny, world_spec, tmp_path):
    """QA: the breakdowns are by the question's gold types and answer shape."""
    from fhirgym.rl import qa_questions
    from fhirgym.tasks.qa import reference_reply

    qa = {"per_template": 6, "seed": 0}
    questions = list(qa_questions(TaskWorld.open(world_spec["path"]), qa).values())

    def replies(i, prompt):
        q = next(q for q in questions if q.question in prompt)
        return reference_reply(q) if i % 2 == 0 else "The final answer is: 7 giraffes"

    model, tok = _scripted(tiny, replies)
    report = rl_eval(model, tok, track="qa", split="test", tasks="qa.gender,qa.count_drugs", per_family=1, n=2,
                     world=world_spec, qa=qa, max_turns=2, max_new_tokens=64)
    assert report["prompts"] == 2 and report["mean"] == pytest.approx(0.5) and report["pass@k"]["2"] == 1.0
    assert set(report["by_shape"]) == {"text", "count"} and "Patient" in report["by_resource_type"]
    assert report["mean_turns"] == 1.0


def test_bfloat16_training_keeps_the_head_and_lora_in_float32(tiny, world_spec, tmp_path):
    """``dtype="bfloat16"``: the decoder computes in bfloat16, the output head (an untied float32 copy of the
    tied embedding) gives float32 logits, LoRA trains in float32, and the clip sees a ratio of exactly 1 on
    the first update, as in float32."""
    from fhirgym.rl import load_policy

    model, tok = load_policy(str(tiny), dtype="bfloat16")
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert embed.weight.dtype == torch.bfloat16 and head.weight.dtype == torch.float32
    assert torch.equal(head.weight, embed.weight.float()) and head.weight.data_ptr() != embed.weight.data_ptr()
    ids = torch.tensor([[1, 2, 3]])
    assert model(input_ids=ids).logits.dtype == torch.float32
    with pytest.raises(ValueError, match="dtype 'float16'"):
        load_policy(str(tiny), dtype="float16")

    model.generate = scripted_generate(tok, _replies)
    spec = _spec(tmp_path / "bf16", tiny, world_spec, max_steps=2, dtype="bfloat16")
    trainer = build_trainer(spec, model, tok)
    seen = _spy_on_generation(trainer)
    lora = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora and all(p.dtype == torch.float32 for p in lora.values())
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[n].detach(), p) for n, p in lora.items())  # it trained
    assert seen[0]["old_per_token_logps"].dtype == torch.float32
    curve = _jsonl(spec.out / "curve.jsonl")
    assert curve[0]["reward"] == pytest.approx(0.5) and curve[0]["clip_ratio/region_mean"] == 0.0
