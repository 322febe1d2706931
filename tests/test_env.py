"""The episode seam: reset / step / submit / verdict, configurations, and what an agent can reach.

The reachability walk starts from everything a plug-in agent is given (its constructor's options, the
AgentTask, the results of every tool) and follows attributes (properties included), ``__dict__``s,
``__slots__``, containers, bound methods and closures: none of it may lead to the answer key.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import types
from dataclasses import replace
from datetime import date, datetime
from typing import ClassVar

import orjson
import pytest

from fhirgym.agents import AgentResult, AgentTask, CommandAgent, ScriptedBackend
from fhirgym.env import Config, Episode, EpisodeStateError, configs, get_config, register_config
from fhirgym.fhir import FhirServer, InProcessClient, ServerConfig, Snapshot, Store
from fhirgym.runner import EvalSpec, run_eval
from fhirgym.tasks import Expect, Family, Fork, Gold, Instance, TaskWorld, View, make_instance
from fhirgym.tools import FHIR_TOOLS, Sandbox, Toolbox, ToolContext, Workspace, sandbox_available

#: Types whose objects lead to the gold, the reference solution, the store or the world (or, the CodeAct
#: workspace and its sandbox, to host paths and to what another part of the episode fetched).
FORBIDDEN = (Instance, Gold, Expect, Family, Fork, Episode, TaskWorld, View, Snapshot, Store, FhirServer,
             InProcessClient, ServerConfig, Toolbox, ToolContext, Workspace, Sandbox)
ATOMS = (str, bytes, int, float, bool, type(None), datetime, date)


def reachable(*roots: object) -> list[object]:
    """Every object reachable from ``roots`` the way agent code could walk it, modules and classes aside."""
    seen: set[int] = set()
    stack = list(roots)
    out = []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, (*ATOMS, type, types.ModuleType)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, types.FunctionType):
            stack.extend(c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None)
            stack.extend([obj.__defaults__, obj.__kwdefaults__, getattr(obj, "__wrapped__", None)])
        elif isinstance(obj, types.MethodType):
            stack.extend([obj.__self__, obj.__func__])
        elif isinstance(obj, types.BuiltinMethodType):
            stack.append(getattr(obj, "__self__", None))
        elif isinstance(obj, functools.partial):
            stack.extend([obj.func, obj.args, obj.keywords])
        else:
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            for klass in type(obj).__mro__:
                for slot in getattr(klass, "__slots__", ()):
                    stack.append(getattr(obj, slot, None))
            for name in dir(obj):
                if name.startswith("__"):
                    continue
                with contextlib.suppress(Exception):  # properties too: what agent code can ask for
                    stack.append(getattr(obj, name))
    return out


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


class Snoop:
    """A plug-in agent that makes a few calls and keeps everything it was given."""

    name = "snoop"
    seen: ClassVar[list] = []

    def __init__(self, backend=None, max_iterations: int = 15) -> None:
        self.backend = backend

    def run(self, task: AgentTask) -> AgentResult:
        tools = task.tools
        found = tools.call("searchResources", {"resourceType": "Patient", "params": {"_count": "2"}})
        pid = found.output["resources"][0]["id"]
        tools.call("getResourceById", {"resourceType": "Patient", "resourceId": pid})
        tools.call("listResourceTypes", {})
        tools.call("createResource", {"resourceType": "Basic", "body": {"code": {"text": "x"}}})
        if "python" in tools.names:  # the CodeAct tools: a fetch into the workspace, code, a finish
            tools.call("fhir_query", {"resource_type": "Patient", "patient_id": pid})
            tools.call("python", {"code": "import os\nanswer = [os.getcwd(), sorted(retrieved_resources)]"})
            tools.call("finish", {"answer": "<answer>{}</answer>"})
        tools.call("getResourceById", {"resourceType": "Patient?_id=" + pid, "resourceId": pid})
        Snoop.seen.append((self, task, tools.calls, tools.schemas(), tools.names))
        return AgentResult("<answer>{}</answer>", "answered")


@pytest.mark.parametrize("config", ["baseline", "codeact"])
def test_nothing_reachable_from_a_plugin_agent_leads_to_the_answer_key(world, tmp_path, config):
    """The walk: the agent object, its AgentTask, the tools' records and outputs, schemas and names."""
    Snoop.seen.clear()
    agent = Snoop(backend=ScriptedBackend([]))
    run_eval(EvalSpec(out=tmp_path, agent="x", tasks="records.find_patient,scheduling.book_first_free_slot",
                      seeds=[0, 1], config=config), world, agent=agent)
    assert len(Snoop.seen) == 4
    world_path = str(world.path)
    for roots in Snoop.seen:
        objects = reachable(*roots)
        assert len(objects) > 100  # the walk did reach the tool outputs
        leaks = [type(o).__name__ for o in objects if isinstance(o, FORBIDDEN)]
        assert not leaks, leaks
        texts = [o for o in objects if isinstance(o, str)]
        assert not [t for t in texts if world_path in t]
        task = roots[1]
        assert not any(hasattr(task, name) for name in ("reference", "extra", "gold", "params", "seed"))
        calls = roots[2]
        assert calls[-1].error and "not an R4 resource type" in calls[-1].error
        if config == "codeact":
            assert calls[-2].output["final_answer"] == "<answer>{}</answer>"
            if sandbox_available():  # (where it cannot be set up, python refuses: tests/test_codeact.py)
                assert calls[-3].error is None and calls[-3].output["answer"] == ["/workspace", ["Patient"]]
            assert not [t for t in texts if "fhirgym-ws-" in t]  # the workspace's host path stays out of reach


def test_the_walk_finds_what_the_old_task_object_leaked(world):
    """A control: the walker does find the answer key behind a closure or a bound method."""
    inst = make_instance("records.find_patient", 0, world)
    fam = inst.family

    def reference(tb):  # what AgentTask.reference used to be
        return fam.solve(tb, inst.params, inst.now)

    assert any(isinstance(o, Gold) for o in reachable(AgentResult(None, "x", messages=[reference])))
    assert any(isinstance(o, Family) for o in reachable(functools.partial(fam.solve)))
    with inst.open() as fork:
        assert any(isinstance(o, ServerConfig) for o in reachable(fork.toolbox()))


def test_an_agent_cannot_change_what_it_is_judged_by(world):
    inst = make_instance("records.find_patient", 0, world)
    ep = Episode(inst)
    ep.reset()
    inst.gold.answer = None  # a hostile edit of the instance after the episode started
    verdict = ep.submit(None)
    assert not verdict.success and any("answer" in r for r in verdict.reasons)
    ep.close()


def test_episode_reset_step_submit_reward(world):
    inst = make_instance("scheduling.book_first_free_slot", 0, world)
    with Episode(inst, "baseline") as ep:
        with pytest.raises(EpisodeStateError):
            ep.step({"name": "listResourceTypes", "arguments": {}})
        obs = ep.reset()
        assert obs.prompt == inst.prompt and obs.now == inst.now and obs.instructions == ""
        assert [t["function"]["name"] for t in obs.tools] == [t.name for t in FHIR_TOOLS]
        created = ep.step({"name": "createResource", "arguments": {"resourceType": "Basic",
                                                                    "body": {"code": {"text": "x"}}}})
        assert created.error is None and len(ep.calls) == 1
        with pytest.raises(EpisodeStateError):
            ep.verdict()
        verdict = ep.submit("done")
        assert not verdict.success and ep.reward() == 0.0 and ep.done
        assert any("collateral" in r or "missing" in r for r in verdict.reasons)
        with pytest.raises(EpisodeStateError):
            ep.step({"name": "listResourceTypes", "arguments": {}})
        ep.reset()  # a fresh fork: the Basic written above is gone
        assert ep.calls == [] and not ep.done
        from fhirgym.env import solve_reference

        text = solve_reference(ep)
        assert ep.submit(text).success and ep.reward() == 1.0


def test_a_step_limit_refuses_further_calls(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, max_steps=1) as ep:
        ep.reset()
        assert ep.step({"name": "listResourceTypes", "arguments": {}}).error is None
        refused = ep.step({"name": "listResourceTypes", "arguments": {}})
        assert refused.error == "step limit reached" and len(ep.calls) == 2


def test_configurations_are_an_open_registry(world, tmp_path):
    assert {"baseline", "read", "specs", "codeact"} <= set(configs())
    assert len(get_config("specs").tools) == len(FHIR_TOOLS) + 4
    read = [t.name for t in get_config("read").tools]
    assert read == ["listResourceTypes", "getResourceById", "searchResources"]
    with Episode(make_instance("clinical.record_blood_pressure", 0, world), "read") as ep:
        ep.reset()  # a write tool is not granted: the call is refused
        assert "createResource" in ep.step({"name": "createResource", "arguments": {
            "resourceType": "Observation", "body": {"resourceType": "Observation"}}}).error
    seen: list[str] = []
    lessons = Config("test-lessons", FHIR_TOOLS, "baseline plus a lesson", system_suffix="Be careful.",
                     prepare=lambda inst: f"Lesson for a {inst.family.category} task.",
                     after=lambda ep: seen.append(f"{ep.instance.task_id}: {ep.reward()}"))
    register_config(lessons)
    with pytest.raises(ValueError, match="already registered"):
        register_config(replace(lessons, description="another"))
    backend = ScriptedBackend(["<answer>{}</answer>"])
    from fhirgym.agents import ReactAgent

    [line] = run_eval(EvalSpec(out=tmp_path, agent="react", model="scripted", config="test-lessons",
                               tasks="records.find_patient"), world, agent=ReactAgent(backend))
    system = backend.requests[0].messages[0]["content"]
    assert system.endswith("Be careful.\n\nLesson for a records task.")
    assert line["config"] == "test-lessons" and seen == ["records.find_patient: 0.0"]
    with pytest.raises(Exception, match="unknown --config"):
        run_eval(EvalSpec(out=tmp_path / "x", agent="null", config="nope"), world)


def test_agent_exceptions_fail_and_infrastructure_errors_error(world, tmp_path):
    from fhirgym.agents import BackendError

    class Crashes:
        name = "crashes"

        def run(self, task):
            task.tools.call("listResourceTypes", {})
            raise ValueError("unsure, giving up")

    class Unreachable:
        name = "unreachable"

        def run(self, task):
            raise BackendError("endpoint down")

    [crash] = run_eval(EvalSpec(out=tmp_path / "a", agent="x", tasks="records.find_patient"), world,
                       agent=Crashes())
    assert crash["status"] == "fail" and crash["success"] is False and crash["error"] is None
    assert crash["stop_reason"] == "crashed" and crash["reasons"][0].startswith("agent crashed: ValueError")
    [down] = run_eval(EvalSpec(out=tmp_path / "b", agent="x", tasks="records.find_patient"), world,
                      agent=Unreachable())
    assert down["status"] == "error" and down["success"] is None and "endpoint down" in down["error"]


def test_floor_agents_and_the_recorded_floor(world, tmp_path):
    lines = {}
    for agent in ("nothing-found", "guess", "null"):
        lines[agent] = run_eval(EvalSpec(out=tmp_path / agent, agent=agent, tasks="records.*,billing.*",
                                         seeds=[0, 1, 2]), world)
    for nf in lines["nothing-found"]:
        assert nf["success"] == nf["floor_nothing_found"] and nf["tool_calls"] == []
    assert all(len(g["tool_calls"]) == 1 and g["tool_calls"][0]["name"] == "searchResources"
               for g in lines["guess"])
    assert not any(r["success"] for r in lines["null"])
    floors = [r["floor_nothing_found"] for r in lines["null"]]
    assert floors == [r["floor_nothing_found"] for r in lines["nothing-found"]]
    from fhirgym.runner import summary

    assert "floor" in summary(lines["null"])


def test_a_sealed_run_hides_its_seeds_until_the_end_and_replays(world, tmp_path):
    # Ten patients: one derived seed finds a public seed's patient one time in ten, six all at once ~1e-6.
    seeds = list(range(6))
    spec = EvalSpec(out=tmp_path / "sealed", agent="reference", tasks="records.find_patient", seeds=seeds,
                    sealed=True)
    seen_during: list[dict] = []

    def progress(line, finished, total):
        seen_during.append(orjson.loads((tmp_path / "sealed" / "run.json").read_bytes()))

    sealed = run_eval(spec, world, progress)
    run = orjson.loads((tmp_path / "sealed" / "run.json").read_bytes())
    secret = run["sealed"]["secret"]
    assert secret and "secret" not in run["spec"] and len(seen_during) == len(seeds)
    for info in seen_during:  # while episodes ran: the commitment only
        assert "sealed" not in info and secret not in orjson.dumps(info).decode()
        assert info["identity"]["secret_sha256"] == run["sealed"]["secret_sha256"]
    public = run_eval(EvalSpec(out=tmp_path / "public", agent="reference", tasks="records.find_patient",
                               seeds=seeds), world)
    assert [r["prompt_id"] for r in sealed] != [r["prompt_id"] for r in public]
    replay = run_eval(EvalSpec(out=tmp_path / "replay", agent="reference", tasks="records.find_patient",
                               seeds=seeds, secret=secret), world)
    assert [r["prompt_id"] for r in replay] == [r["prompt_id"] for r in sealed]
    assert all(r["status"] == "pass" for r in sealed + replay)
    from fhirgym.runner import EvalError

    with pytest.raises(EvalError, match="needs its secret"):
        run_eval(replace(spec, resume=True, secret=None), world)


def test_an_external_program_gets_none_of_our_settings(world, monkeypatch):
    monkeypatch.setenv("FHIRGYM_WORLD", str(world.path))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst) as ep:
        obs = ep.reset()
        task = AgentTask(obs.prompt, obs.now, ep.tools)
        env = CommandAgent("true").environment(task)
        assert "FHIRGYM_WORLD" not in env and env["OPENAI_API_KEY"] == "sk-test"
        assert not [k for k, v in env.items() if str(world.path) in v]
        assert env["FHIRGYM_MCP_URL"].startswith("http://127.0.0.1:")
        assert copy.deepcopy(task.tools.calls) == []
