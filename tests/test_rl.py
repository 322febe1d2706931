"""RL over the episode seam: the text episode, its three adapters (same transcript, same reward), rewards,
datasets in SkyRL's layout, recipes mapped to TRL and SkyRL (the SkyRL launch: tests/test_rl_skyrl.py)."""

from __future__ import annotations

import inspect
import statistics
import time

import orjson
import pytest

from fhirgym.agents import CodeActAgent, ReactAgent
from fhirgym.env import get_config
from fhirgym.rl import (
    FhirTextEnv,
    RewardSpec,
    TextEpisode,
    dataset_rows,
    instance_for,
    load_recipe,
    recipe_names,
    skyrl_env_class,
    skyrl_overrides,
    trl_args,
    trl_environment,
    trl_reward,
    write_rows,
)
from fhirgym.tasks import TaskWorld


@pytest.fixture(scope="module")
def world_spec(small_world_path):
    TaskWorld.open(small_world_path)
    return {"path": str(small_world_path)}


def _call(name: str, args: dict) -> str:
    return "<tool_call>" + orjson.dumps({"name": name, "arguments": args}).decode() + "</tool_call>"


def _solve_find_patient(extra: dict) -> list:
    """A transcript that solves records.find_patient: a search, then the answer built from its result."""
    inst = instance_for(extra)
    p = inst.params
    given, family = p["name"].split()[0], p["name"].split()[-1]
    search = _call("searchResources", {"resourceType": "Patient", "params": {
        "given": given, "family": family, "birthdate": p["birth_date"]}})

    def answer(observation: str) -> str:
        pid = orjson.loads(observation)["resources"][0]["id"]
        return f'<answer>{{"patient_id": "{pid}"}}</answer>'

    return [search, answer]


def _run_text(step, transcript: list) -> tuple[float, bool]:
    """Feed a transcript to any ``step(text) -> (observations, reward, done)`` callable."""
    last_obs = None
    for reply in transcript:
        text = reply(last_obs) if callable(reply) else reply
        observations, reward, done = step(text)
        if done:
            return reward, True
        last_obs = observations[-1]["content"]
    return 0.0, False


def _text_step(text):
    def step(t):
        s = text.step(t)
        return s.observations, s.reward, s.done
    return step


def _gym_step(env):
    def step(t):
        obs, reward, terminated, truncated, _ = env.step(t)
        return obs, reward, terminated or truncated
    return step


def _skyrl_step(env):
    def step(t):
        out = env.step(t)
        return out["observations"], out["reward"], out["done"]
    return step


def test_text_episode_solves_and_scores(world_spec):
    extra = {"task_id": "records.find_patient", "seed": 0, "world": world_spec}
    text = TextEpisode(instance_for(extra))
    messages = text.reset()
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "<tools>" in messages[0]["content"] and '"name":"searchResources"' in messages[0]["content"]
    assert "Current date and time" in messages[1]["content"]
    assert messages[1]["content"].endswith("\n\n" + ReactAgent.nudge)  # the prompt an evaluated agent sees

    reward, done = _run_text(_text_step(text), _solve_find_patient(extra))
    assert done and reward == 1.0 and text.verdict.success
    with pytest.raises(RuntimeError):
        text.step("again")
    text.reset()  # a fresh fork: a wrong answer now scores 0
    s = text.step('<answer>{"patient_id": "nope"}</answer>')
    assert s.done and s.reward == 0.0
    text.close()


def test_the_worked_example_opens_every_adapter_alike(world_spec):
    """``example``: rows, the text episode, the Gymnasium-style env and SkyRL's env open with the same
    messages: system, the worked exchange (a native call, its result, the answer), then the request."""
    from fhirgym.rl import register_skyrl

    register_skyrl()
    import skyrl_gym

    [row] = dataset_rows("action", "train", tasks="records.find_patient", per_family=1, world=world_spec,
                         example=True)
    [plain] = dataset_rows("action", "train", tasks="records.find_patient", per_family=1, world=world_spec)
    assert row["extra_info"]["example"] is True and plain["extra_info"]["example"] is False
    assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert row["prompt"][2]["content"].startswith("<tool_call>") and "<answer>" in row["prompt"][4]["content"]
    assert [row["prompt"][0], row["prompt"][-1]] == plain["prompt"]
    gym = FhirTextEnv()
    assert gym.reset(options={"extra_info": row["extra_info"]})[0] == row["prompt"]
    env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": row["extra_info"]})
    assert env.init([])[0] == row["prompt"]


def test_same_transcript_same_reward_in_every_adapter(world_spec):
    from fhirgym.rl import register_skyrl

    register_skyrl()
    import skyrl_gym

    for task_id, seed in (("records.find_patient", 0), ("records.find_patient", 1)):
        extra = {"task_id": task_id, "seed": seed, "world": world_spec}
        transcripts = {"solve": _solve_find_patient(extra), "wrong": ['<answer>{"patient_id": "x"}</answer>'],
                       "garbled": ['<tool_call>{"name": "searchResources", "arguments": ', "<answer>{}</answer>"]}
        for label, transcript in transcripts.items():
            rewards = {}
            text = TextEpisode(instance_for(extra), reward=RewardSpec())
            text.reset()
            rewards["text"] = _run_text(_text_step(text), transcript)[0]
            gym = FhirTextEnv()
            gym.reset(options={"extra_info": extra})
            rewards["gym"] = _run_text(_gym_step(gym), transcript)[0]
            env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": extra, "max_turns": 12})
            env.init([])
            rewards["skyrl"] = _run_text(_skyrl_step(env), transcript)[0]
            trl = trl_environment()()
            trl.reset(extra_info=extra)
            final = None
            obs = None
            for reply in transcript:
                t = reply(obs) if callable(reply) else reply
                calls = trl.text.parse(t)
                if not calls:
                    final = t
                    break
                obs = getattr(trl, calls[0][0])(**calls[0][1])
            rewards["trl"] = trl_reward(trl, final)
            assert len(set(rewards.values())) == 1, (label, rewards)
            assert rewards["text"] == (1.0 if label == "solve" else 0.0)
            for closer in (text, gym, env):
                closer.close()


def test_reward_terms_are_optional_and_bounded(world_spec):
    extra = {"task_id": "records.create_patient", "seed": 0, "world": world_spec}
    spec = RewardSpec(light_weight=0.2, format_penalty=0.1)
    text = TextEpisode(instance_for(extra), reward=spec)
    text.reset()
    s = text.step('<tool_call>{"name": broken</tool_call>')
    assert s.done and s.reward == 0.0 and s.info["malformed_turns"] == 1  # never below zero
    text.close()


def test_max_turns_ends_the_episode(world_spec):
    extra = {"task_id": "records.find_patient", "seed": 0, "world": world_spec, "max_turns": 2}
    env = FhirTextEnv()
    env.reset(options={"extra_info": extra})
    call = _call("listResourceTypes", {})
    assert env.step(call)[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step(call)
    assert truncated and not terminated and reward == 0.0 and info["stop"] == "max_turns" and obs == []
    env.close()


def test_codeact_blocks_are_calls_only_where_a_python_tool_exists(world_spec):
    text = TextEpisode(instance_for({"task_id": "records.find_patient", "seed": 0, "world": world_spec}))
    text.reset()
    assert text.parse("```python\nprint(1)\n```") == []  # baseline grants no python tool: a final answer
    text.close()
    code = TextEpisode(instance_for({"task_id": "records.find_patient", "seed": 0, "world": world_spec}), "codeact")
    opening = code.reset()
    assert opening[-1]["content"].endswith("\n\n" + CodeActAgent.nudge)
    assert code.parse("```python\nprint(1)\n```") == [("python", {"code": "print(1)\n"})]
    code.close()


def test_reset_cost(world_spec):
    extra = {"task_id": "scheduling.book_first_free_slot", "seed": 0, "world": world_spec}
    text = TextEpisode(instance_for(extra))
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        text.reset()
        times.append(time.perf_counter() - t0)
    text.close()
    assert statistics.median(times) < 0.5  # a sanity bound; bench/bench_rl.py measures the figure


def test_datasets_in_skyrl_layout_with_disjoint_splits(world_spec, tmp_path):
    rows = {split: dataset_rows("action", split, tasks="records.*", per_family=2, world=world_spec)
            for split in ("train", "valid", "test")}
    keys = {split: {(r["extra_info"]["task_id"], r["extra_info"]["seed"]) for r in rs} for split, rs in rows.items()}
    assert all(keys.values()) and not (keys["train"] & keys["valid"] or keys["train"] & keys["test"]
                                       or keys["valid"] & keys["test"])
    row = rows["train"][0]
    assert set(row) == {"data_source", "prompt", "env_class", "reward_spec", "extra_info"}
    assert row["env_class"] == "fhirgym-action" and row["reward_spec"]["method"] == "rule"
    assert "gold" not in orjson.dumps(row).decode()
    paths = write_rows(rows["train"], tmp_path, "train")
    assert [p.suffix for p in paths] == [".jsonl", ".parquet"]
    import pyarrow.parquet as pq

    assert pq.read_table(paths[1]).num_rows == len(rows["train"])
    back = [orjson.loads(line) for line in paths[0].read_bytes().splitlines()]
    assert back == rows["train"]
    again = dataset_rows("action", "train", tasks="records.*", per_family=2, world=world_spec)
    assert again == rows["train"]  # deterministic


def test_recipes_map_to_trl_and_skyrl():
    assert recipe_names() == ["clip-higher", "clip-higher+dynamic", "symmetric"]
    sym, ch, dyn = (load_recipe(n) for n in ("symmetric", "clip-higher", "clip-higher+dynamic"))
    assert (trl_args(sym)["epsilon"], trl_args(sym)["epsilon_high"]) == (0.2, 0.2)
    assert (trl_args(ch)["epsilon"], trl_args(ch)["epsilon_high"]) == (0.2, 0.28)
    for r in (sym, ch, dyn):
        t, s = trl_args(r), skyrl_overrides(r)
        assert t["loss_type"] == "dapo" and s["trainer.algorithm.loss_reduction"] == "token_mean"
        assert t["beta"] == 0.0 and s["trainer.algorithm.use_kl_loss"] is False
        assert t["num_generations"] == s["generator.n_samples_per_prompt"] == 8
        assert t["steps_per_generation"] > 1  # the clip acts only off-policy
        assert (s["trainer.algorithm.eps_clip_low"], s["trainer.algorithm.eps_clip_high"]) == (r.clip_low, r.clip_high)
    assert "trainer.algorithm.dynamic_sampling.type" not in skyrl_overrides(ch)
    assert skyrl_overrides(dyn)["trainer.algorithm.dynamic_sampling.type"] == "filter" and dyn.dynamic
    with pytest.raises(ValueError, match="unknown recipe"):
        load_recipe("nope")


def test_trl_environment_exposes_the_tools_as_documented_methods():
    cls = trl_environment()
    search = cls.searchResources
    sig = inspect.signature(search)
    assert list(sig.parameters)[:2] == ["self", "resourceType"] and sig.parameters["params"].default is None
    assert "Args:" in search.__doc__ and "resourceType:" in search.__doc__
    assert {"reset", "createResource"} <= set(dir(cls))
    public = {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}
    assert public - {"reset"} == {t.name for t in get_config("baseline").tools}  # TRL shows each one as a tool


def test_skyrl_env_class_is_a_base_text_env():
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    assert issubclass(skyrl_env_class(), BaseTextEnv)


# -- the QA track ------------------------------------------------------------------------------------

QA_SET = {"per_template": 6, "seed": 0}


@pytest.fixture(scope="module")
def qa_rows(world_spec):
    return {split: dataset_rows("qa", split, tasks="qa.gender,qa.lab_value,qa.count_drugs", per_family=3,
                                world=world_spec, qa=QA_SET) for split in ("train", "valid", "test")}


def test_qa_rows_split_by_patient_and_carry_no_gold(qa_rows, world_spec, tmp_path):
    from fhirgym.rl import qa_questions

    patients = {s: {r["extra_info"]["patient_id"] for r in rows} for s, rows in qa_rows.items()}
    assert all(patients.values())
    assert not (patients["train"] & patients["valid"] or patients["train"] & patients["test"]
                or patients["valid"] & patients["test"])
    row = qa_rows["train"][0]
    assert row["env_class"] == "fhirgym-qa" and row["data_source"] == "fhirgym/qa"
    assert set(row) == {"data_source", "prompt", "env_class", "reward_spec", "extra_info"}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "Question:" in row["prompt"][1]["content"]
    tw = TaskWorld.open(row["extra_info"]["world"]["path"])
    questions = qa_questions(tw, QA_SET)
    for rows in qa_rows.values():
        for r in rows:
            q = questions[r["extra_info"]["question_id"]]
            flat = orjson.dumps(r).decode()
            hidden = [i for t, ids in q.gold_ids.items() if t != "Patient" for i in ids]  # the prompt names the patient
            assert "gold" not in flat and not any(i in flat for i in hidden) and "answer" not in r["extra_info"]
    paths = write_rows(qa_rows["valid"], tmp_path, "valid")
    import pyarrow.parquet as pq

    assert pq.read_table(paths[1]).num_rows == len(qa_rows["valid"])
    with pytest.raises(ValueError, match="selects no QA template"):
        dataset_rows("qa", "train", tasks="qa.nope", world=world_spec, qa=QA_SET)


def test_qa_rewards_from_the_matcher_identical_across_adapters(qa_rows):
    from fhirgym.rl import qa_questions, register_skyrl
    from fhirgym.tasks.qa import reference_reply

    register_skyrl()
    import skyrl_gym

    rows = [r for r in qa_rows["valid"] if r["extra_info"]["task_id"] in ("qa.gender", "qa.count_drugs")]
    assert rows
    tw = TaskWorld.open(rows[0]["extra_info"]["world"]["path"])
    seen = set()
    for row in rows:
        extra = row["extra_info"]
        q = qa_questions(tw, QA_SET)[extra["question_id"]]
        transcripts = {"right": [reference_reply(q)], "wrong": ["The final answer is: 7 giraffes"],
                       "tool then right": [_call("searchResources", {"resourceType": "Patient", "params": {
                           "_id": q.patient_id}}), reference_reply(q)]}
        for label, transcript in transcripts.items():
            rewards = {}
            text = TextEpisode(instance_for(extra))
            text.reset()
            rewards["text"] = _run_text(_text_step(text), transcript)[0]
            gym = FhirTextEnv()
            gym.reset(options={"extra_info": extra})
            rewards["gym"] = _run_text(_gym_step(gym), transcript)[0]
            env = skyrl_gym.make("fhirgym-qa", env_config={}, extras={"extra_info": extra})
            env.init(row["prompt"])
            rewards["skyrl"] = _run_text(_skyrl_step(env), transcript)[0]
            trl = trl_environment()()
            trl.reset(**row)
            for reply in transcript[:-1]:
                (name, args), = trl.text.parse(reply)
                getattr(trl, name)(**args)
            rewards["trl"] = trl_reward(trl, transcript[-1])
            assert len(set(rewards.values())) == 1, (label, rewards)
            seen.add((label, rewards["text"]))
            for closer in (text, gym, env):
                closer.close()
    assert {("right", 1.0), ("tool then right", 1.0)} <= seen and ("wrong", 1.0) not in seen


def test_qa_reward_can_come_from_the_judge(qa_rows):
    from fhirgym.runner import JudgeVerdict

    class Judge:  # a stand-in for runner.LlmJudge: the reward follows its word, not the matcher's
        def __init__(self, says: bool) -> None:
            self.says, self.asked = says, []

        def judge(self, question, gold, answer):
            self.asked.append((question, gold, answer))
            return JudgeVerdict(self.says, str(int(self.says)), False)

    extra = qa_rows["valid"][0]["extra_info"]
    for says in (True, False):
        judge = Judge(says)
        text = TextEpisode(instance_for(extra), reward=RewardSpec(judge=judge))
        text.reset()
        step = text.step("The final answer is: 7 giraffes")
        assert step.reward == float(says) and step.info["success"] is says
        assert judge.asked[0][2] == "The final answer is: 7 giraffes" and "Question:" in judge.asked[0][0]
        text.close()
    from fhirgym.rl import qa_questions
    from fhirgym.tasks.qa import qa_instance

    tw = TaskWorld.open(extra["world"]["path"])
    question = next(q for q in qa_questions(tw, QA_SET).values() if q.no_answer)
    text = TextEpisode(qa_instance(question, tw), reward=RewardSpec(judge=Judge(True)))
    text.reset()
    step = text.step("The final answer is: no answer")  # a negative claim with no look: nothing, judge or not
    assert step.reward == 0.0 and step.info["success"] is False
    text.close()


def test_trl_tool_parsing_reads_calls_as_the_episode_does():
    """The tokenizer TRL parses with finds the bare JSON call the episode would run, also when its own
    parser fails on a malformed tag; tagged calls and plain answers pass through unchanged."""
    from fhirgym.agents import parse_tool_calls
    from fhirgym.rl._adapters import trl_tool_parsing

    call = '{"name": "getResourceById", "arguments": {"resourceType": "Patient", "resourceId": "p1"}}'
    tagged = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "getResourceById", "arguments": {"resourceType": "Patient", "resourceId": "p1"}}}]}

    class Tok:
        eos_token = "<|im_end|>"

        def parse_response(self, response, prefix=None, tools=None):
            if response.startswith("<tool_call>{broken"):
                raise ValueError("malformed tool call")
            return dict(tagged) if response.startswith("<tool_call>\n{") else {"role": "assistant", "content": response}

    tok = trl_tool_parsing(Tok(), "read")
    assert tok.parse_response(call, prefix=[1]) == {"role": "assistant", "content": "", "tool_calls": tagged["tool_calls"]}
    assert tok.parse_response("<tool_call>\n" + call + "\n</tool_call>") == tagged
    assert tok.parse_response("The final answer is: male") == {"role": "assistant", "content": "The final answer is: male"}
    broken = "<tool_call>{broken</tool_call>\n" + call + "<|im_end|>"
    parsed = tok.parse_response(broken)
    (episode_call,), _ = parse_tool_calls(broken.removesuffix("<|im_end|>"), {"getResourceById"})
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": episode_call.name,
                                                                      "arguments": episode_call.arguments}}]
