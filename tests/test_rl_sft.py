"""Behaviour cloning: expert trajectories in the exact tokens evaluation shows a local model, their loss
mask, the splits that keep evaluation honest, and the SFT trainer end to end on a tiny random model.

The trajectory tests that need Qwen's real chat template and tokenizer read them from the 0.5B GGUF
(vocabulary only, no weights); the training and llama.cpp tests use the tiny random Qwen2 GGUF of
``_tiny_gguf.py``, whose byte-level vocabulary writes any text too.
"""

from __future__ import annotations

import json

import pytest

from _tiny_gguf import tiny_qwen2_gguf
from fhirgym.agents import ChatResult, LocalBackend, ReactAgent
from fhirgym.agents._local import _cached_tokens
from fhirgym.rl import (
    NotExpressible,
    OverlapError,
    Selection,
    SftSpec,
    expert_trajectory,
    load_policy,
    read_trajectories,
    sft,
    write_lora_gguf,
    write_trajectories,
)
from fhirgym.rl._sft import special_targets
from fhirgym.rl._trajectories import action_turns
from fhirgym.runner import EpisodeKey, run_episode
from fhirgym.tasks import TaskWorld, heldout_split, make_instance

FAMILIES = ("records.find_patient", "clinical.record_body_weight")


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_qwen2_gguf(tmp_path_factory.mktemp("sft") / "tiny.gguf")


def _tiny_backend(tiny) -> LocalBackend:
    return LocalBackend(str(tiny), n_ctx=32768, n_threads=1, max_reply_tokens=4096)  # bytes: long replies


@pytest.mark.model
def test_trained_tokens_are_the_replies_and_nothing_else(world):
    """The loss mask, token by token: the trained tokens decode to exactly the reference's replies, each
    followed by its end-of-turn token; system prompt, tools, request and tool results are never trained."""
    backend = LocalBackend("qwen2.5-coder-0.5b")
    inst = make_instance("clinical.record_body_weight", 100, world)
    traj = expert_trajectory(inst, backend)
    template = backend.template()
    from fhirgym.env import get_config

    replies = action_turns(inst, [t.openai_schema() for t in get_config("baseline").tools])
    trained = [ids for ids, on in traj.segments if on]
    assert [template.llama.detokenize(ids[:-1], special=True).decode() for ids in trained] == replies
    assert all(ids[-1] == template.eos_id for ids in trained)
    labels, ids = traj.labels, traj.input_ids
    assert len(labels) == len(ids) and sum(lab != -100 for lab in labels) == sum(len(t) for t in trained)
    for i, (tok, lab) in enumerate(zip(ids, labels, strict=True)):
        assert lab in (-100, tok), i
    context = template.llama.detokenize([t for t, lab in zip(ids, labels, strict=True) if lab == -100],
                                          special=True).decode()
    assert inst.prompt.splitlines()[0] in context and "<tools>" in context and "<tool_response>" in context
    whole = template.llama.detokenize(ids, special=True).decode()
    assert whole.count("<|im_start|>assistant\n") == traj.turns + 2  # and the worked example's call and answer


@pytest.mark.model
def test_a_reply_the_grammar_refuses_is_not_expressible(world):
    backend = LocalBackend("qwen2.5-coder-0.5b")
    inst = make_instance("records.find_patient", 100, world)
    from fhirgym.rl import _trajectories

    real = _trajectories.action_turns

    def swapped(inst, schemas, max_turns=15):  # arguments out of the schema's key order
        turns = real(inst, schemas, max_turns)
        return [turns[0].replace('"resourceType": "Patient", ', "").replace('}}\n', ', "resourceType": "Patient"}}\n'),
                *turns[1:]]

    _trajectories.action_turns = swapped
    try:
        with pytest.raises(NotExpressible, match="grammar refuses"):
            expert_trajectory(inst, backend)
    finally:
        _trajectories.action_turns = real


def test_trajectories_equal_what_a_live_episode_shows_the_model(world, tiny):
    """Byte for byte: each turn's prompt in a trajectory is the token stream llama.cpp was given when the
    same episode ran through the local backend for real."""
    inst = make_instance("clinical.record_body_weight", 101, world)
    traj = expert_trajectory(inst, _tiny_backend(tiny))
    live = _tiny_backend(tiny)
    from fhirgym.env import get_config

    replies = iter(action_turns(inst, [t.openai_schema() for t in get_config("baseline").tools]))
    shown: list[list[int]] = []

    class Live:
        """The real backend's chat (llama.cpp renders, tokenizes and prefills), then the reference's reply."""

        name, tool_budget, max_reply_tokens = live.name, live.tool_budget, live.max_reply_tokens

        def chat(self, messages, tools=None, **kw):
            result = live.chat(messages, tools, max_tokens=1, answer_schema=kw.get("answer_schema"))
            shown.append(_cached_tokens(live.load())[: result.prompt_tokens])
            reply = next(replies)
            from fhirgym.agents import parse_tool_calls

            calls, text = parse_tool_calls(reply, {t["function"]["name"] for t in tools})
            if calls:
                live.remember(text, [(c.name, c.arguments) for c in calls], reply)
            return ChatResult(text, calls, result.prompt_tokens, 1, "tool_calls" if calls else "stop")

    line, _ = run_episode(EpisodeKey("baseline", inst.task_id, inst.seed, 0, 1), inst, ReactAgent(Live()),
                          budget=live.tool_budget)
    assert line["status"] == "pass"
    prefixes, stream = [], []
    for ids, trained in traj.segments:
        if not trained:
            prefixes.append([*stream, *ids])
        stream += ids
    assert shown == prefixes and len(shown) == traj.turns


def test_splits_refuse_evaluations_data_unless_told():
    with pytest.raises(OverlapError, match="eval families"):
        Selection(tasks="eval").check()
    with pytest.raises(OverlapError, match="held-out split's eval families"):
        Selection(tasks=heldout_split()["eval"][0]).check()
    with pytest.raises(OverlapError, match="split 'test'"):
        Selection(split="test").check()
    Selection(tasks="eval", allow_overlap=True).check()
    assert Selection(per_family=3).seeds() == [100, 101, 102]  # never evaluation's seeds 0-99
    assert Selection(split="valid", per_family=2).seeds() == [10_000, 10_001]
    assert set(Selection().families()) == set(heldout_split()["train"])


def test_tiny_model_learns_the_trajectories_and_its_adapter_runs_on_llama_cpp(world, tiny, tmp_path,
                                                                            monkeypatch, small_world_path):
    """Four trajectories, the loss falls; checkpoints record what they were trained on; the adapter
    exported for llama.cpp loads and answers."""
    from fhirgym.rl import _trajectories

    monkeypatch.setattr(_trajectories, "LocalBackend", lambda model: _tiny_backend(model))
    sel = Selection(tasks=",".join(FAMILIES), per_family=2, world={"path": str(small_world_path)})
    manifest = write_trajectories(tmp_path / "data", sel, model=str(tiny))
    assert manifest["kept"] == 4 and manifest["skipped"] == 0 and manifest["seeds"] == [100, 101]
    assert set(manifest["per_family"]) == set(FAMILIES) and manifest["trained_tokens"] < manifest["tokens"]
    assert len(read_trajectories(tmp_path / "data")) == 4
    summary = sft(SftSpec(out=tmp_path / "run", data=tmp_path / "data", model=str(tiny), epochs=6, lr=2e-2,
                          lora_r=8, grad_accum=2, save_steps=10, dtype="float32", threads=1))
    curve = [json.loads(x) for x in (tmp_path / "run" / "curve.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in curve if "loss" in r]
    assert len(losses) == 12 and sum(losses[-3:]) < 0.85 * sum(losses[:3]), losses  # a random model: it falls
    record = json.loads((tmp_path / "run" / "final" / "fhirgym_sft.json").read_text())
    assert record["trajectories"][0]["selection"]["tasks"] == ",".join(FAMILIES)
    assert record["trajectories"][0]["sha256"] == manifest["sha256"] and summary["trajectories"] == 4
    assert (tmp_path / "run" / "curve.png").is_file() and (tmp_path / "run" / "checkpoint-10").is_dir()
    # the head's rows of the special tokens the replies write (<tool_call>, <|im_end|>…) were trained too
    trained = json.loads((tmp_path / "run" / "final" / "adapter_config.json").read_text())["trainable_token_indices"]
    assert record["settings"]["head"] and trained["lm_head"] == special_targets(
        [{"labels": t.labels} for t in read_trajectories(tmp_path / "data")], load_policy(str(tiny))[1])
    assert trained["lm_head"]  # the tiny vocabulary spells the tags in bytes: its end-of-turn token
    adapter = write_lora_gguf(tmp_path / "run" / "final", tmp_path / "tuned.gguf", base_gguf=tiny)
    tuned = LocalBackend(str(tiny), n_ctx=512, n_threads=1, lora=str(adapter), grammar=False)
    reply = tuned.chat([{"role": "user", "content": "hello"}], max_tokens=4)
    assert reply.completion_tokens >= 1
