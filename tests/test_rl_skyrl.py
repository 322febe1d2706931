"""What a SkyRL run on GPUs depends on, checked on a CPU: the launch (its lengths, its inputs, no local
paths, the way it is installed, the arguments it really passes), its composition under SkyRL's own config
classes where SkyRL can be installed, and the environment inside SkyRL's generator (the configuration
from the rows, reasoning kept out of the parser, episodes built off the event loop)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path

import orjson
import pytest

from fhirgym.env import get_config
from fhirgym.rl import (
    FhirTextEnv,
    dataset_rows,
    instance_for,
    launch_overrides,
    load_recipe,
    recipe_names,
    register_skyrl,
    skyrl_overrides,
    trl_args,
    trl_environment,
    trl_reward,
    write_launch,
    write_rows,
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


def _write_data(folder: Path, row: dict, train: int = 64, valid: int = 4, env_class: str | None = None) -> Path:
    """A dataset in SkyRL's layout: copies of one real row under other seeds (what the launch reads)."""
    def rows(n: int, offset: int) -> list[dict]:
        return [{**row, "env_class": env_class or row["env_class"],
                 "extra_info": {**row["extra_info"], "seed": offset + i}} for i in range(n)]

    write_rows(rows(train, 0), folder, "train", ("parquet",))
    write_rows(rows(valid, 10_000), folder, "valid", ("parquet",))
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory, row):
    return _write_data(tmp_path_factory.mktemp("data"), row)


def run_launch(script: Path, *args: str, env: dict | None = None) -> list[str]:
    """Run ``launch.sh`` with bash as a GPU machine would, a stand-in ``python`` on PATH printing its argv:
    the arguments the entrypoint would really get, after the shell's quoting and expansion."""
    stub_dir = script.parent.parent / f"{script.parent.name}-bin"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "python"
    stub.write_text("#!/bin/sh\nexec " + shlex.quote(sys.executable)
                    + " -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    stub.chmod(0o755)
    done = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", **(env or {})})
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    assert argv[:2] == ["-m", "fhirgym.rl.skyrl_main"]
    return argv[2:]


def _parsed(args: list[str]):
    from omegaconf import OmegaConf  # what SkyRL's from_cli_overrides parses the arguments with

    return OmegaConf.from_cli(args)


# -- the launch ---------------------------------------------------------------------------------------

def test_the_launch_caps_the_conversation_at_the_models_context():
    """``generator.max_input_length`` (the whole conversation; SkyRL's default is the first prompt's 4,096)
    is the model's context less one turn's generation, for every recipe; another model needs its context."""
    for name in recipe_names():
        recipe = load_recipe(name)
        assert recipe.max_generate_length == GENERATE and recipe.max_turns == 12
        assert launch_overrides(recipe)["generator.max_input_length"] == str(CONTEXT - GENERATE)
    recipe = load_recipe("clip-higher")
    other = {"trainer.policy.model.path": "Qwen/Qwen2.5-7B-Instruct"}
    with pytest.raises(ValueError, match="--context"):
        launch_overrides(recipe, extra=other)
    assert launch_overrides(recipe, extra=other, context=32_768)["generator.max_input_length"] == str(32_768 - GENERATE)
    with pytest.raises(ValueError, match="under the recipe's max_prompt_length 4096"):
        launch_overrides(recipe, context=6_000)
    given = launch_overrides(recipe, extra={**other, "generator.max_input_length": "20000"})
    assert given["generator.max_input_length"] == "20000"
    with pytest.raises(ValueError, match=r"cannot be under trainer\.max_prompt_length"):
        launch_overrides(recipe, extra={"generator.max_input_length": "1000"})
    with pytest.raises(ValueError, match="expected an integer"):
        launch_overrides(recipe, extra={"generator.max_input_length": "lots"})


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


def test_the_launch_runs_as_written_and_holds_no_local_path(data, tmp_path):
    """The launch bash really runs passes the entrypoint the recipe's overrides, with the data named relative
    to the launch (or by FHIRGYM_DATA), says how SkyRL is really installed, and takes more overrides."""
    project = tmp_path / "project"
    shutil.copytree(data, project / "data")
    script = write_launch("clip-higher+dynamic", project / "data", project / "launch", {"trainer.epochs": "2"})
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "exec python -m fhirgym.rl.skyrl_main" in text
    assert str(tmp_path) not in text  # no absolute local path
    assert "novaskyai/skyrl-train-ray-2.57.0-py3.12-cu13.0" in text and "uv sync --active --extra fsdp" in text
    assert "uv run --isolated --extra fsdp --with /path/to/fhirgym" in text and "pip install 'skyrl" not in text

    args = run_launch(script)
    cfg = _parsed(args)
    assert cfg.data.train_data == [f"{project / 'launch'}/../data/train.parquet"]
    assert [Path(p).resolve() for p in cfg.data.val_data] == [(project / "data" / "valid.parquet").resolve()]
    assert cfg.trainer.epochs == 2 and cfg.trainer.policy.model.path == "Qwen/Qwen3-8B"
    assert cfg.generator.max_input_length == CONTEXT - GENERATE and cfg.trainer.max_prompt_length == 4096
    assert cfg.generator.apply_overlong_filtering is True and cfg.generator.max_turns == 12
    assert cfg.trainer.algorithm.eps_clip_high == 0.28 and cfg.trainer.algorithm.dynamic_sampling.type == "filter"
    assert cfg.environment.env_class == "fhirgym-action"
    assert len(args) == len(launch_overrides(load_recipe("clip-higher+dynamic"), extra={"trainer.epochs": "2"}))

    moved = tmp_path / "moved"  # launch and data moved together (to the GPU machine): the data follows
    shutil.move(project, moved)
    cfg = _parsed(run_launch(moved / "launch" / "launch.sh"))
    assert [Path(p).resolve() for p in cfg.data.train_data] == [(moved / "data" / "train.parquet").resolve()]
    other = tmp_path / "gpu data"
    cfg = _parsed(run_launch(moved / "launch" / "launch.sh", env={"FHIRGYM_DATA": str(other)}))
    assert cfg.data.train_data == [f"{other}/train.parquet"]
    later = _parsed(run_launch(moved / "launch" / "launch.sh", "trainer.epochs=3", "generator.max_turns=6"))
    assert later.trainer.epochs == 3 and later.generator.max_turns == 6  # the last value of a key wins


def test_a_data_path_with_spaces_survives_the_shell(row, tmp_path):
    data = _write_data(tmp_path / "my data $HOME", row)
    script = write_launch("symmetric", data, tmp_path / "out dir")
    cfg = _parsed(run_launch(script))
    assert [Path(p).resolve() for p in cfg.data.train_data] == [(data / "train.parquet").resolve()]


def test_write_launch_checks_its_inputs(row, data, tmp_path):
    out = tmp_path / "launch"
    with pytest.raises(ValueError, match="unknown recipe"):
        write_launch("nope", data, out)
    with pytest.raises(ValueError, match=r"no train\.parquet or valid\.parquet.*fhirgym rl dataset"):
        write_launch("clip-higher", tmp_path / "nothing", out)
    few = _write_data(tmp_path / "few", row, train=10)
    with pytest.raises(ValueError, match=r"10 rows, fewer than trainer\.train_batch_size 64"):
        write_launch("clip-higher", few, out)
    assert not out.exists()  # nothing written on a refusal
    write_launch("clip-higher", few, out, {"trainer.train_batch_size": "8", "trainer.policy_mini_batch_size": "4"})

    import pyarrow as pa
    import pyarrow.parquet as pq

    bare = tmp_path / "bare"
    shutil.copytree(data, bare)
    pq.write_table(pa.Table.from_pylist([{"prompt": row["prompt"], "env_class": "fhirgym-action"}] * 64),
                   bare / "train.parquet")
    with pytest.raises(ValueError, match="no column data_source, reward_spec, extra_info"):
        write_launch("clip-higher", bare, out)
    (bare / "train.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        write_launch("clip-higher", bare, out)
    with pytest.raises(ValueError, match="env_class gsm8k is not fhirgym's"):
        write_launch("clip-higher", _write_data(tmp_path / "alien", row, env_class="gsm8k"), out)

    qa = _write_data(tmp_path / "qa", row, env_class="fhirgym-qa")
    with pytest.raises(ValueError, match="the rows are qa rows, not action"):
        write_launch("clip-higher", qa, out, track="action")
    assert _parsed(run_launch(write_launch("clip-higher", qa, out))).environment.env_class == "fhirgym-qa"
    (tmp_path / "a file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        write_launch("clip-higher", data, tmp_path / "a file")


def test_rl_skyrl_writes_the_launch_or_says_what_is_wrong(data, tmp_path):
    from click.testing import CliRunner

    from fhirgym.cli import main

    run = CliRunner().invoke(main, ["rl", "skyrl", "--data", str(data), "--out", str(tmp_path / "l"),
                                    "--set", "trainer.policy.model.path=Qwen/Qwen3-4B", "--context", "32768"])
    assert run.exit_code == 0 and "launch.sh" in run.output, run.output
    assert _parsed(run_launch(tmp_path / "l" / "launch.sh")).generator.max_input_length == 32768 - GENERATE
    run = CliRunner().invoke(main, ["rl", "skyrl", "--data", str(data), "--out", str(tmp_path / "m"),
                                    "--set", "trainer.policy.model.path=Qwen/Qwen3-4B"])
    assert run.exit_code != 0 and "--context" in run.output and not (tmp_path / "m").exists()


def _skyrl_or_skip():
    """SkyRL's config classes and validator at the pinned version, or a skip that says why they are absent."""
    try:
        import skyrl
        from skyrl.train.config import SkyRLTrainConfig
    except ImportError as exc:
        why = (f"SkyRL {SKYRL_PIN}'s wheel requires Python >= 3.12 and this is {sys.version_info.major}."
               f"{sys.version_info.minor}" if sys.version_info < (3, 12) else f"SkyRL {SKYRL_PIN} is not installed")
        pytest.skip(f"{why}; it also pins transformers<=5.16.1 and peft==0.18.1 against this project's "
                    f"transformers==5.24.0 and peft==0.21.2, so no test extra can hold it ({exc}). "
                    "test_the_launch_runs_as_written_and_holds_no_local_path parses the same arguments with OmegaConf.")
    if skyrl.__version__ != SKYRL_PIN:
        pytest.skip(f"SkyRL {skyrl.__version__} is installed; the launch is written for {SKYRL_PIN}")
    try:
        from skyrl.train.utils.utils import validate_cfg
    except ImportError as exc:
        pytest.skip(f"SkyRL's validator needs its training stack (skyrl[skyrl-train]: ray, torch): {exc}")
    return SkyRLTrainConfig, validate_cfg


def test_each_recipes_launch_composes_and_validates_under_skyrl(row, data, tmp_path):
    """Every recipe's launch, on both tracks, as bash passes it: SkyRL 0.4's own parser builds its typed
    config (any unknown key or wrong type raises) and its validator accepts it; the values that matter
    arrive as meant (the conversation cap, overlong filtering, the recipe's algorithm)."""
    config_class, validate_cfg = _skyrl_or_skip()
    qa = _write_data(tmp_path / "qa", row, env_class="fhirgym-qa")
    for name in recipe_names():
        recipe = load_recipe(name)
        for folder, env_class in ((data, "fhirgym-action"), (qa, "fhirgym-qa")):
            args = run_launch(write_launch(name, folder, tmp_path / f"{name}-{env_class}"))
            cfg = config_class.from_cli_overrides(args)
            validate_cfg(cfg)
            assert cfg.generator.max_input_length == CONTEXT - GENERATE
            assert cfg.generator.apply_overlong_filtering is recipe.overlong_filtering
            assert cfg.trainer.algorithm.eps_clip_high == recipe.clip_high
            assert cfg.trainer.algorithm.dynamic_sampling.type == ("filter" if recipe.dynamic else None)
            assert cfg.environment.env_class == env_class and cfg.generator.max_turns == recipe.max_turns
            assert [Path(p).resolve() for p in cfg.data.train_data] == [(folder / "train.parquet").resolve()]


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
