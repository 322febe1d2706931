"""Evaluation on Ray (the ray extra), on a local Ray instance with this machine's CPUs: the same results as
without Ray for the reference agent and a scripted one, resume and sealed runs as without Ray, and a worker
killed mid-run whose episodes go to another worker, losing and duplicating nothing."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import orjson
import pytest

from fhirgym.runner import EvalSpec, read_results, run_eval
from fhirgym.tasks import TaskWorld

ray = pytest.importorskip("ray")

from _ray_agents import PatientFinder  # noqa: E402  (after the skip: importing it needs nothing of Ray)

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def cluster():
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def _comparable(lines: list[dict]) -> dict[str, dict]:
    """Result lines by episode id, without what measures time."""
    out = {}
    for line in lines:
        line = {k: v for k, v in line.items() if k not in ("duration_s", "sandbox_s")}
        line["tool_calls"] = [{k: v for k, v in c.items() if k != "ms"} for c in line["tool_calls"]]
        out[line["episode_id"]] = line
    return out


def test_the_reference_agent_gives_the_same_results_on_ray(cluster, world, tmp_path):
    spec = {"agent": "reference", "tasks": "records.*,scheduling.book_first_free_slot", "seeds": [0, 1], "parallel": 4}
    local = run_eval(EvalSpec(out=tmp_path / "local", **spec), world)
    notes: list[str] = []
    on_ray = run_eval(EvalSpec(out=tmp_path / "ray", ray="", **spec), world, log=notes.append)
    assert len(local) == len(on_ray) > 10 and {r["status"] for r in on_ray} == {"pass"}
    assert _comparable(on_ray) == _comparable(local)
    assert any(n.startswith(f"ray: {min(os.cpu_count(), 4)} workers, up to") for n in notes), notes
    assert len(list((tmp_path / "ray" / "transcripts").iterdir())) == len(local)


def test_a_scripted_agent_sealed_and_resumed_on_ray_matches_the_local_run(cluster, world, tmp_path):
    secret = secrets.token_hex(16)
    common = {"agent": "scripted", "tasks": "records.find_patient", "secret": secret, "parallel": 4}
    local = run_eval(EvalSpec(out=tmp_path / "local", seeds=list(range(6)), **common), world, agent=PatientFinder())
    out = tmp_path / "ray"
    half = run_eval(EvalSpec(out=out, seeds=[0, 1, 2], ray="", **common), world, agent=PatientFinder())
    assert len(half) == 3
    resumed = run_eval(EvalSpec(out=out, seeds=list(range(6)), ray="", resume=True, **common), world,
                       agent=PatientFinder())
    assert [r["episode_id"] for r in resumed[:3]] == [r["episode_id"] for r in half]
    assert _comparable(resumed) == _comparable(local) and {r["status"] for r in local} == {"pass"}
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["sealed"]["secret"] == secret  # revealed at the end, as without Ray


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(cluster, world, tmp_path):
    marker = tmp_path / "died"
    spec = EvalSpec(out=tmp_path / "ray", agent="scripted", tasks="records.find_patient", seeds=list(range(12)),
                    parallel=4, ray="")
    notes: list[str] = []
    lines = run_eval(spec, world, agent=PatientFinder(think=0.3, die_once=str(marker)), log=notes.append)
    assert marker.exists() and int(marker.read_text()) != os.getpid(), "no worker was killed"
    lost = [n for n in notes if "handed to another worker" in n]
    assert lost and len(lost) <= 2, notes  # what the dead worker had in flight (4 at once over the workers)
    print("\n".join(notes))
    ids = [r["episode_id"] for r in read_results(spec.out)]
    assert len(ids) == len(set(ids)) == 12 and {r["status"] for r in lines} == {"pass"}
    local = run_eval(EvalSpec(out=tmp_path / "local", agent="scripted", tasks="records.find_patient",
                              seeds=list(range(12)), parallel=4), world, agent=PatientFinder())
    assert _comparable(lines) == _comparable(local)


def test_memory_training_on_ray_learns_what_it_learns_one_at_a_time(cluster, world, tmp_path):
    from fhirgym.agents import ReactAgent, ScriptedBackend
    from fhirgym.memory import TrainSpec, train_memory

    def reflector(messages):
        meta = orjson.loads(messages[-1]["content"].split("## Task metadata\n", 1)[1].split("\n", 1)[0])
        return orjson.dumps({"macro": f"Search the record before answering a {meta['task_id']} request.",
                             "micro": []}).decode()

    def train(out, **how):
        from fhirgym.agents import ScriptedBackend as Script

        actor = ReactAgent(ScriptedBackend(['<answer>{"patient_id": "0000"}</answer>'] * 50))
        spec = TrainSpec(out=out, tasks="records.find_patient,billing.find_coverage", seeds=[0, 1], trials=2,
                         model="scripted", **how)
        return train_memory(spec, world, actor=actor, evaluator=Script([orjson.dumps(
            {"score": 2, "critique": "wrong id", "failure_tags": [], "advice": "search"}).decode()] * 50),
            reflector=Script([reflector] * 50))

    one = train(tmp_path / "one")
    ray_store = train(tmp_path / "ray", parallel=4, ray="")
    assert [x.text for x in ray_store.lessons] == [x.text for x in one.lessons] and one.lessons

    def log(store):
        return [{k: v for k, v in orjson.loads(x).items() if k not in ("time", "seconds")}  # when, how long
                for x in (store.path / "training.jsonl").read_bytes().splitlines()]

    assert log(ray_store) == log(one) and [r["trial"] for r in log(one)] == [1, 2, 1, 2, 1, 2, 1, 2]


def test_the_command_line_runs_on_a_given_cluster(cluster, small_world_path, tmp_path):
    import subprocess
    import sys

    address = ray.get_runtime_context().gcs_address
    out = tmp_path / "cli"
    run = subprocess.run([sys.executable, "-m", "fhirgym.cli", "eval", "--agent", "reference", "--tasks",
                          "records.find_patient", "--seeds", "3", "--parallel", "2", "--ray", address, "--out", str(out),
                          "--no-report", "--world", str(small_world_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    print(run.stderr, run.stdout, sep="\n")
    assert "ray: 2 workers, up to 1 episodes at once each, on 1 node(s)" in run.stderr
    assert [r["status"] for r in read_results(out)] == ["pass"] * 3


def test_a_worker_without_the_world_file_builds_it_from_its_seed_and_checks_the_hash(tmp_path):
    from fhirgym.runner._ray import RayRunError, WorldRef
    from fhirgym.world import build_world

    built = build_world(seed=7, patients=2).path  # (cached once per machine, like every world)
    ref = WorldRef.of(TaskWorld.open(built))
    assert ref.build == {"seed": 7, "patients": 2, "anchor": "2025-06-02"}
    elsewhere = WorldRef(str(tmp_path / "not-on-this-node.db"), ref.sha256, ref.build)
    assert elsewhere.open().path == Path(built).resolve()
    with pytest.raises(RayRunError, match=r"built from its seed .* has sha256 \w+, not 0{64}"):
        WorldRef(elsewhere.path, "0" * 64, ref.build).open()
    with pytest.raises(RayRunError, match="not built from a seed: put it where every node reads it"):
        WorldRef(elsewhere.path, ref.sha256, None).open()
