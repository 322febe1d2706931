"""What a SkyRL run on GPUs depends on, checked on a CPU: the launch (its lengths, its inputs, no local
paths, the way it is installed, the arguments it really passes), its composition under SkyRL's own config
classes where SkyRL can be installed, and the environment inside SkyRL's generator (the configuration
from the rows, reasoning kept out of the parser, episodes built off the event loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import orjson
import pytest

from fhirgym.env import get_config
from fhirgym.rl import (
    FhirTextEnv,
    dataset_rows,
    instance_for,
    load_recipe,
    recipe_names,
    register_skyrl,
    skyrl_overrides,
    trl_args,
    trl_environment,
    trl_reward,
)
from fhirgym.rl._text import strip_reasoning
from fhirgym.tasks import TaskWorld

SKYRL_PIN = "0.4.0"
CONTEXT, GENERATE = 40_960, 2_048  # Qwen3-8B's context; the recipes' max_generate_length


@pytest.fixture(scope="module")
def world_spec(small_world_path):
    TaskWorld.open(small_world_path)
    return {"path": str(small_world_path)}


@pytest.fixture(scope="module")
def row(world_spec):
    [r] = dataset_rows("action", "train", tasks="records.find_patient", per_family=1, world=world_spec,
                       config="read")
    return r


# -- the launch ---------------------------------------------------------------------------------------

def test_overlong_filtering_is_the_recipes_in_trl_and_skyrl(tmp_path):
    for name in recipe_names():
        recipe = load_recipe(name)
        assert recipe.overlong_filtering is True
        assert trl_args(recipe)["mask_truncated_completions"] is True
        assert skyrl_overrides(recipe)["generator.apply_overlong_filtering"] is True
    text = resources.files("fhirgym.rl").joinpath("recipes", "clip-higher.toml").read_text()
    off = tmp_path / "off.toml"
    off.write_text(text.replace("overlong_filtering = true", "overlong_filtering = false"))
    recipe = load_recipe(off)
    assert trl_args(recipe)["mask_truncated_completions"] is False
    assert skyrl_overrides(recipe)["generator.apply_overlong_filtering"] is False


# -- the environment inside SkyRL ---------------------------------------------------------------------

def _call(name: str, args: dict) -> str:
    return "<tool_call>" + orjson.dumps({"name": name, "arguments": args}).decode() + "</tool_call>"


def _search_args(extra: dict) -> dict:
    p = instance_for(extra).params
    return {"resourceType": "Patient", "params": {"given": p["name"].split()[0], "family": p["name"].split()[-1],
                                                  "birthdate": p["birth_date"]}}


def _search(extra: dict) -> str:
    return _call("searchResources", _search_args(extra))


def _answer(observation: str) -> str:
    return f'<answer>{{"patient_id": "{orjson.loads(observation)["resources"][0]["id"]}"}}</answer>'


def test_rows_carry_their_configuration_to_every_env(row):
    """SkyRL passes ``env_config={}``: the row says which tools its prompt lists, and every env grants those."""
    import skyrl_gym

    register_skyrl()
    read = {t.name for t in get_config("read").tools}
    assert row["extra_info"]["config"] == "read" and len(read) < len(get_config("baseline").tools)
    env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": row["extra_info"]})
    assert env.init(row["prompt"])[0] == row["prompt"]
    assert env.text._names == read
    write = _call("createResource", {"resourceType": "Patient", "resource": {"resourceType": "Patient"}})
    refused = env.step(write)["observations"][0]["content"]  # not a tool of this configuration
    assert "unknown tool 'createResource'" in refused
    env.close()
    gym = FhirTextEnv()
    assert gym.reset(options={"extra_info": row["extra_info"]})[0] == row["prompt"]
    gym.close()
    with pytest.raises(ValueError, match="written for configuration 'read', not 'baseline'"):
        FhirTextEnv("baseline").reset(options={"extra_info": row["extra_info"]})
    old = {k: v for k, v in row["extra_info"].items() if k != "config"}  # a row written before rows named it
    env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": old})
    env.init([])
    assert env.text._names == {t.name for t in get_config("baseline").tools}
    env.close()


def test_reasoning_is_dropped_before_a_reply_is_read():
    assert strip_reasoning("The final answer is: male") == "The final answer is: male"
    assert strip_reasoning("<think>\nhmm\n</think>\n\nmale") == "male"
    assert strip_reasoning("opened by the template</think>\n\nmale") == "male"
    assert strip_reasoning("<think>a</think>male<think>b</think> too") == "male too"
    assert strip_reasoning("<think>cut at the length limit <answer>x</answer>") == ""
    assert strip_reasoning("male <think>second thoughts, never closed") == "male"


def test_reasoning_never_reaches_the_call_or_answer_parser(row):
    """Qwen3's ``<think>`` text in SkyRL's env (what its generator passes as the action) and in TRL's final
    reply: a call written while thinking does not run, a draft answer there is not judged."""
    import skyrl_gym

    register_skyrl()
    extra = row["extra_info"]
    env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": extra, "max_turns": 12})
    env.init(row["prompt"])
    thought_call = _call("getResourceById", {"resourceType": "Patient", "resourceId": "p-1"})
    draft = '<answer>{"patient_id": "a-guess"}</answer>'
    out = env.step(f"<think>\nMaybe {thought_call} first, or just {draft}\n</think>\n\n{_search(extra)}")
    assert not out["done"] and out["metadata"]["tool_calls"] == 1 and len(out["observations"]) == 1
    assert [c.name for c in env.text.episode.calls] == ["searchResources"]
    out = env.step(f"<think>It could be {draft}.</think>\n\n{_answer(out['observations'][0]['content'])}")
    assert out["done"] and out["reward"] == 1.0 and env.get_metrics()["success"] == 1.0
    env.close()

    env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": extra})
    env.init([])
    out = env.step(f"<think>I will call {thought_call}")  # cut while thinking: nothing runs, nothing answered
    assert out["done"] and out["reward"] == 0.0 and out["metadata"]["stop"] == "answered"
    assert env.text.episode.calls == [] and env.get_metrics()["malformed_turns"] == 0
    env.close()

    trl = trl_environment("read")()
    trl.reset(**row)
    observation = trl.searchResources(**_search_args(extra))
    assert trl_reward(trl, f"<think>{draft}</think>\n\n{_answer(observation)}") == 1.0


def test_the_env_builds_its_episode_in_skyrls_env_threads_not_on_its_loop(row, monkeypatch):
    """SkyRL's generator (0.4, ``SkyRLGymGenerator.agent_loop``) calls ``skyrl_gym.make`` on its event loop and
    ``env.init``/``step``/``close`` through ``loop.run_in_executor`` on its env thread pool: making the env
    must not build the episode, init must."""
    import skyrl_gym

    from fhirgym.rl import _adapters

    register_skyrl()
    built_on: list[str] = []
    real = _adapters.episode_for

    def spy(*args, **kwargs):
        built_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(_adapters, "episode_for", spy)

    async def agent_loop(pool: ThreadPoolExecutor) -> float:
        loop = asyncio.get_running_loop()
        env = skyrl_gym.make("fhirgym-action", env_config={}, extras={"extra_info": row["extra_info"], "max_turns": 12})
        assert built_on == [] and env.get_metrics() == {} and env.max_turns == 12
        messages, _ = await loop.run_in_executor(pool, env.init, row["prompt"])
        assert messages == row["prompt"]
        out = await loop.run_in_executor(pool, env.step, _search(row["extra_info"]))
        out = await loop.run_in_executor(pool, env.step, _answer(out["observations"][0]["content"]))
        await loop.run_in_executor(pool, env.close)
        return out["reward"]

    with ThreadPoolExecutor(2, thread_name_prefix="skyrl-gym-env-") as pool:
        assert asyncio.run(agent_loop(pool)) == 1.0
    assert len(built_on) == 1 and built_on[0].startswith("skyrl-gym-env-")


def test_concurrent_opens_of_one_row_build_its_instance_once(row, monkeypatch):
    """The eight samples of a prompt open together in SkyRL's env threads: one builds the instance, the others
    wait for it (not eight builds of the same instance)."""
    from fhirgym.rl import _data

    monkeypatch.setattr(_data, "_INSTANCES", OrderedDict())
    builds = []
    real = _data.make_instance

    def slow(*args, **kwargs):
        builds.append(threading.current_thread().name)
        time.sleep(0.2)
        return real(*args, **kwargs)

    monkeypatch.setattr(_data, "make_instance", slow)
    start = threading.Barrier(8)

    def open_row(_):
        start.wait()
        return instance_for(row["extra_info"])

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(open_row, range(8)))
    assert len(builds) == 1 and all(g is got[0] for g in got) and not _data._BUILDERS
