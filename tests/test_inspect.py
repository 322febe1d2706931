"""fhirgym inside inspect-ai: the tasks, the providers, the solvers, the same verdicts as ``fhirgym eval``.

Offline throughout: the models are mockllm (usage set on every output, else inspect fetches a tokenizer),
fhirgym/reference, fhirgym/nothing-found and the local-model provider over a scripted backend; everything
runs through ``inspect_ai.eval()``, and once through the ``inspect`` CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="the inspect extra is not installed (pip install -e '.[inspect]')")

from inspect_ai import eval as inspect_eval
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import ChatMessageUser, ModelOutput, ModelUsage, get_model

from fhirgym.agents import ChatResult, ReactAgent, RequestedCall
from fhirgym.env import Episode, solve_reference
from fhirgym.inspect import _episodes, _solvers
from fhirgym.inspect._solvers import GUIDANCE
from fhirgym.runner import EvalSpec, run_eval
from fhirgym.tasks import TaskWorld, make_instance, parse_seeds

#: inspect-ai 0.3.285's own retry setup warns on every model it builds (tenacity's renamed argument)
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")
USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def _eval(tmp_path: Path, task: str = "fhirgym/action", model="fhirgym/reference", **task_args) -> EvalLog:
    solver = task_args.pop("solver", None)
    max_samples = task_args.pop("max_samples", None)
    [log] = inspect_eval(task, model=model, solver=solver, task_args=task_args, display="none",
                         log_dir=str(tmp_path / "logs"), max_samples=max_samples)
    assert log.status == "success", log.error
    assert _episodes.live() == 0  # every sample's cleanup closed its episode
    return log


def _verdicts(log: EvalLog) -> dict[str, dict]:
    """Sample id → the scorer's metadata (fhirgym eval's result-line fields)."""
    return {str(s.id): s.scores["verdict"].metadata for s in log.samples}


def _lines(results: list[dict]) -> dict[str, dict]:
    return {f"{r['task_id']}-s{r['seed']}": r for r in results}


FIELDS = ("success", "light_success", "floor_nothing_found", "reasons", "failure_modes")


def _same(inspect_meta: dict[str, dict], lines: dict[str, dict]) -> None:
    assert set(inspect_meta) == set(lines)
    for sid, meta in inspect_meta.items():
        assert {k: meta[k] for k in FIELDS} == {k: lines[sid][k] for k in FIELDS}, sid


# --- tasks and the same numbers both ways -----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["reference", "nothing-found"])
def test_every_family_two_seeds_scores_as_in_fhirgym_eval(agent, world, small_world_path, tmp_path):
    """inspect's accuracy equals fhirgym eval's strict success on the same 130 instances, and so does every
    sample's verdict (strict, light, floor, reasons, failure modes)."""
    lines = _lines(run_eval(EvalSpec(out=tmp_path / "fhirgym", agent=agent, tasks="all", seeds=[0, 1]), world))
    log = _eval(tmp_path, model=f"fhirgym/{agent}", tasks="all", seeds=2, world=str(small_world_path))
    assert len(log.samples) == len(lines) == 130
    _same(_verdicts(log), lines)
    metrics = {k: m.value for k, m in log.results.scores[0].metrics.items()}
    strict = sum(r["success"] for r in lines.values()) / len(lines)
    assert metrics["accuracy"] == pytest.approx(strict)
    assert strict == (1.0 if agent == "reference" else 0.0)  # a "nothing found" without a look passes nothing
    for category in {r["category"] for r in lines.values()}:  # inspect's grouped metric: the paper's breakdown
        group = [r for r in lines.values() if r["category"] == category]
        assert metrics[category] == pytest.approx(sum(r["success"] for r in group) / len(group))
    print(f"\nPARITY | {agent} | inspect accuracy {metrics['accuracy']:.3f} | fhirgym eval strict {strict:.3f}")


class _Scripts:
    """A fixed script per task prompt: tool calls, then the answer; played to fhirgym's ReAct agent (as a
    ChatBackend) and to inspect's react() (as mockllm's outputs)."""

    name = "scripted"

    def __init__(self, scripts: dict[str, list[tuple]]) -> None:
        self.scripts = scripts

    def _step(self, text: str, turn: int) -> tuple:
        [script] = [s for prompt, s in self.scripts.items() if prompt in text]
        return script[turn]

    def chat(self, messages, tools=None, **_) -> ChatResult:
        step = self._step(messages[1]["content"], sum(m["role"] == "assistant" for m in messages))
        if step[0] == "call":
            return ChatResult("", [RequestedCall(f"call_{len(messages)}", step[1], step[2])], 1, 1)
        return ChatResult(step[1], [], 1, 1)

    def outputs(self, input, tools, tool_choice, config) -> ModelOutput:
        user = next(m.text for m in input if isinstance(m, ChatMessageUser))
        step = self._step(user, sum(m.role == "assistant" for m in input))
        names = {t.name for t in tools}
        if step[0] == "call":
            out = ModelOutput.for_tool_call("mockllm/model", step[1], step[2], tool_call_id=f"c{len(input)}")
        elif "submit" in names:  # inspect's react(): the answer is its submit call
            out = ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": step[1]}, tool_call_id="end")
        else:  # a fhirgym agent: a reply without a call is the answer
            out = ModelOutput.from_content("mockllm/model", step[1])
        out.usage = USAGE
        return out


def _scripts(world, families: list[str]) -> dict[str, list[tuple]]:
    """Multi-turn scripts: each family's reference calls and answer on seed 0, and, on seed 1, the same
    calls with the "nothing found" answer and the last call dropped (a fail with reasons)."""
    scripts = {}
    for family in families:
        for seed in (0, 1):
            inst = make_instance(family, seed, world)
            with Episode(inst) as ep:
                ep.reset()
                answer = solve_reference(ep)
                calls = [("call", c.name, c.arguments) for c in ep.calls]
            if seed == 1:
                calls, answer = calls[:-1], '<answer>{"found": false}</answer>'
            scripts[inst.prompt] = [*calls, ("answer", answer)]
    return scripts


def test_a_scripted_multi_turn_agent_gets_the_same_verdicts_both_ways(world, small_world_path, tmp_path):
    families = ["records.find_patient", "billing.set_guarantor", "clinical.record_blood_pressure",
                "scheduling.book_first_free_slot"]
    scripts = _Scripts(_scripts(world, families))
    selector = ",".join(families)
    lines = _lines(run_eval(EvalSpec(out=tmp_path / "fhirgym", agent="react", tasks=selector, seeds=[0, 1]),
                            world, agent=ReactAgent(scripts)))
    model = get_model("mockllm/model", custom_outputs=scripts.outputs)
    by_react = _verdicts(_eval(tmp_path / "react", model=model, tasks=selector, seeds=2, world=str(small_world_path)))
    by_fhirgym_react = _verdicts(_eval(tmp_path / "fhirgym-react", model=model, solver=_solvers.fhirgym_react(),
                                       tasks=selector, seeds=2, world=str(small_world_path)))
    _same(by_react, lines)
    _same(by_fhirgym_react, lines)
    assert {sid: m["success"] for sid, m in by_react.items()} == {f"{f}-s{s}": s == 0 for f in families for s in (0, 1)}
    failed = [m for sid, m in by_react.items() if sid.endswith("-s1")]
    assert all(m["reasons"] and m["failure_modes"] for m in failed)
    assert any(m["light_success"] is False for m in failed) and any(m["light_success"] for m in by_react.values())


def test_sample_metadata_and_scores_carry_the_breakdowns(small_world_path, tmp_path):
    log = _eval(tmp_path, tasks="records.find_patient,clinical.magnesium_if_low", seeds="0-1", runs=2,
                world=str(small_world_path))
    assert len(log.samples) == 8 and log.eval.config.epochs == 2
    sample = next(s for s in log.samples if s.id == "clinical.magnesium_if_low-s1")
    assert sample.metadata == {"task_id": "clinical.magnesium_if_low", "category": "clinical", "difficulty": 3,
                               "seed": 1, "writes": False, "track": "action"}
    assert sample.target == ""  # never the gold
    scores = log.results.scores
    assert {s.reducer for s in scores} == {"mean", "pass_at_2", "pass_k_2"}
    assert all(s.metrics["accuracy"].value == 1.0 for s in scores)
    assert sorted(s.scores["verdict"].metadata["run"] for s in log.samples if s.id == sample.id) == [0, 1]
    assert {s.metadata["writes"] for s in log.samples if s.metadata["task_id"] == "clinical.magnesium_if_low"} == {
        True, False}  # the instance's own, as in a result line


def test_the_log_holds_tool_events_and_the_scorers_metadata(small_world_path, tmp_path):
    log = _eval(tmp_path, tasks="billing.find_coverage", seeds=1, world=str(small_world_path))
    back = read_eval_log(log.location)  # the .eval file itself
    [sample] = back.samples
    tools = [e for e in sample.events if e.event == "tool"]
    assert [e.function for e in tools] == ["searchResources", "searchResources", "submit"]
    assert json.loads(tools[0].result)["resourceType"] == "Patient" and tools[0].error is None
    assert [e.event for e in sample.events].count("model") == 3
    meta = sample.scores["verdict"].metadata
    assert meta["success"] and meta["floor_nothing_found"] is False and meta["reasons"] == []
    assert meta["expected_min_calls"] == 2 and meta["tool_calls"] == 2 and meta["verdict"]["answer_ok"]
    system = sample.messages[0].text
    assert system.startswith(GUIDANCE) and "reply without calling a tool" not in system and "submit()" in system


def test_qa_track_matches_fhirgym_eval(world, small_world_path, tmp_path):
    lines = _lines(run_eval(EvalSpec(out=tmp_path / "fhirgym", agent="reference", track="qa", split="valid",
                                     tasks="qa.admission_time,qa.lab_value*", seeds=[0, 1]), world))
    log = _eval(tmp_path, "fhirgym/qa", split="valid", tasks="qa.admission_time,qa.lab_value*", seeds=2,
                world=str(small_world_path))
    meta = _verdicts(log)
    _same(meta, lines)
    assert all(m["qa"]["retrieval"] == {"precision": 1.0, "recall": 1.0} for m in meta.values())
    assert {s.metadata["template"] for s in log.samples} == {r["qa"]["template"] for r in lines.values()}


def test_a_tool_error_goes_back_to_the_model_and_the_sample_goes_on(small_world_path, tmp_path):
    def outputs(input, tools, tool_choice, config):
        turn = sum(m.role == "assistant" for m in input)
        out = (ModelOutput.for_tool_call("mockllm/model", "searchResources",
                                         {"resourceType": "Patient", "params": {"nope": "1"}}, tool_call_id="bad")
               if turn == 0 else ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "no idea"}))
        out.usage = USAGE
        return out

    log = _eval(tmp_path, model=get_model("mockllm/model", custom_outputs=outputs), tasks="records.find_patient",
                seeds=1, world=str(small_world_path))
    [sample] = log.samples
    tool = next(m for m in sample.messages if m.role == "tool")
    assert tool.error is not None and "nope" in tool.error.message and json.loads(tool.error.message)["error"]
    meta = sample.scores["verdict"].metadata
    assert meta["success"] is False and "tool_errors" in meta["failure_modes"]


def test_the_default_agents_turn_cap_ends_without_an_answer(small_world_path, tmp_path):
    def outputs(input, tools, tool_choice, config):
        out = ModelOutput.for_tool_call("mockllm/model", "listResourceTypes", {}, tool_call_id=f"c{len(input)}")
        out.usage = USAGE
        return out

    log = _eval(tmp_path, model=get_model("mockllm/model", custom_outputs=outputs), tasks="records.find_patient",
                seeds=1, max_turns=3, world=str(small_world_path))
    [sample] = log.samples
    meta = sample.scores["verdict"].metadata
    assert sample.limit.type == "turn" and meta["tool_calls"] == 3 and meta["final_answer"] is None
    assert not meta["success"]


def test_bad_settings_fail_with_clear_errors(small_world_path):
    for args, message in (({"config": "nope"}, "unknown configuration 'nope'"),
                          ({"seeds": "5-3"}, "give N"), ({"tasks": "nosuch.family"}, "no task matches"),
                          ({"config": "memory"}, "needs"), ({"world": "/nonexistent.db"}, "does not exist")):
        with pytest.raises(Exception, match=message):
            inspect_eval("fhirgym/action", model="fhirgym/reference", display="none",
                         task_args={"world": str(small_world_path), **args}, log_dir="/dev/null/never")
    with pytest.raises(ValueError, match="unknown model fhirgym/gpt"):
        get_model("fhirgym/gpt")
    with pytest.raises(ValueError, match="unknown local model"):
        get_model("fhirgym/local-llama-70b")
    assert parse_seeds("0-2,9") == [0, 1, 2, 9] and parse_seeds(2) == [0, 1]
    assert parse_seeds(["0-2", "9"]) == [0, 1, 2, 9] and parse_seeds([5]) == [5]  # inspect's -T seeds=0-2,9


def test_the_base_install_has_no_inspect():
    """inspect-ai is the inspect extra's (and the test extra's, for CI), never a base dependency, and no
    other layer imports it."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("inspect-ai") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert "inspect-ai==0.3.285" in extras["inspect"] and "inspect-ai==0.3.285" in extras["test"]
    assert project["entry-points"]["inspect_ai"] == {"fhirgym": "fhirgym.inspect._registry"}
    code = ("import sys, fhirgym.cli, fhirgym.runner, fhirgym.analysis, fhirgym.rl, fhirgym.memory\n"
            "assert 'inspect_ai' not in sys.modules, 'imported inspect_ai'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- solvers and providers ----------------------------------------------------------------------------------


def test_fhirgym_codeact_solver_runs_code_in_the_episodes_sandbox(world, small_world_path, tmp_path):
    inst = make_instance("records.find_patient", 0, world)
    given, family = inst.params["name"].split()[0], inst.params["name"].split()[-1]
    code = (f"hits = search('Patient', {{'given': {given!r}, 'family': {family!r}, "
            f"'birthdate': {inst.params['birth_date']!r}}})\nprint(hits[0]['id'])")
    turns = iter([f"```python\n{code}\n```", None])

    def outputs(input, tools, tool_choice, config):
        text = next(turns)
        if text is None:  # the printed id, as the answer
            printed = json.loads(input[-1].text.split("\n", 1)[1])["stdout"].strip()
            text = f'<answer>{{"patient_id": "{printed}"}}</answer>'
        out = ModelOutput.from_content("mockllm/model", text)
        out.usage = USAGE
        return out

    log = _eval(tmp_path, model=get_model("mockllm/model", custom_outputs=outputs), config="codeact",
                solver=_solvers.fhirgym_codeact(), tasks="records.find_patient", seeds=1, world=str(small_world_path))
    [sample] = log.samples
    meta = sample.scores["verdict"].metadata
    assert meta["success"] and meta["config"] == "codeact", meta
    assert [m.role for m in sample.messages][:2] == ["system", "user"]  # the CodeAct agent's own prompt
    assert log.eval.sandbox.type == "fhirgym-bwrap"
    assert sum(e.event == "model" for e in sample.events) == 2


def test_the_local_provider_speaks_to_the_local_backend(monkeypatch, small_world_path, tmp_path):
    """fhirgym/local-<model> is fhirgym eval's LocalBackend: the request's tools and the sample's answer format
    go to it, the episode adopts its tool budget, and its final text becomes the agent's submit call."""
    made = []  # inspect also builds throwaway instances (model-info lookups): the backend is built lazily

    class Backend:
        name, tool_budget, max_reply_tokens = "local/qwen2.5-coder-0.5b", 1500, 200

        def __init__(self):
            self.requests = []

        def chat(self, messages, tools=None, *, temperature=0.0, max_tokens=1024, seed=None, answer_schema=None):
            self.requests.append((messages, tools, max_tokens, answer_schema))
            if len(self.requests) == 1:
                return ChatResult("", [RequestedCall("t1", "searchResources", {"resourceType": "Observation"})], 30, 5)
            return ChatResult('<answer>{"patient_id": "x"}</answer>', [], 40, 6)

    def make_backend(model, **options):
        made.append((model, options, Backend()))
        return made[-1][2]

    from fhirgym.inspect import _models

    monkeypatch.setattr(_models, "make_backend", make_backend)
    log = _eval(tmp_path, model=get_model("fhirgym/local-qwen2.5-coder-0.5b", n_ctx=4096, memoize=False),
                tasks="records.find_patient", seeds=1, world=str(small_world_path))
    [(model, options, backend)] = [m for m in made if m[2].requests]
    assert model == "local/qwen2.5-coder-0.5b" and options == {"n_ctx": 4096}
    first, second = backend.requests
    assert first[0][0]["role"] == "system" and {t["function"]["name"] for t in first[1]} >= {"searchResources", "submit"}
    assert first[2] == 200 and first[3]["properties"]["patient_id"]  # the reply cap, the answer's schema
    result = second[0][-1]
    assert result["role"] == "tool" and '"omitted"' in result["content"] and len(result["content"]) <= 1500
    [sample] = log.samples
    assert sample.output.completion == '<answer>{"patient_id": "x"}</answer>'
    assert sample.scores["verdict"].metadata["success"] is False
    assert log.stats.model_usage["fhirgym/local-qwen2.5-coder-0.5b"].input_tokens == 70


def test_sixteen_concurrent_samples_do_not_block_the_loop_or_mix_episodes(monkeypatch, small_world_path, tmp_path):
    """16 samples at once (--max-samples 16): episode calls run in worker threads, many at the same time
    (the event loop is free meanwhile), and each sample's calls reach its own episode."""
    in_flight, peak, lock = [0], [0], threading.Lock()
    step = _episodes.EpisodeHandle.step

    def slow_step(self, name, arguments):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            time.sleep(0.05)  # a slow store: serialised, 16 samples' ~40 calls would take > 2 s
            return step(self, name, arguments)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(_episodes.EpisodeHandle, "step", slow_step)
    tasks = "records.find_patient,billing.find_coverage,clinical.record_blood_pressure,orders.record_surgery_plan"
    started = time.perf_counter()
    log = _eval(tmp_path, tasks=tasks, seeds=4, max_samples=16, world=str(small_world_path))
    seconds = time.perf_counter() - started
    assert len(log.samples) == 16 and all(m["success"] for m in _verdicts(log).values())
    assert peak[0] >= 8, peak
    print(f"\nCONCURRENCY | 16 samples, --max-samples 16 | peak {peak[0]} episode calls at once | {seconds:.1f} s")


@pytest.mark.slow
def test_the_inspect_cli_runs_a_fhirgym_task(small_world_path, tmp_path):
    inspect_cli = Path(sys.executable).parent / "inspect"
    run = subprocess.run([str(inspect_cli), "eval", "fhirgym/action", "--model", "fhirgym/reference",
                          "-T", "tasks=records.find_patient,clinical.record_heart_rate", "-T", "seeds=0,2-2",
                          "-T", f"world={small_world_path}", "--log-dir", str(tmp_path), "--display", "plain"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [path] = tmp_path.glob("*.eval")
    log = read_eval_log(str(path))
    assert log.eval.task == "fhirgym/action" and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert sorted(s.id for s in log.samples) == ["clinical.record_heart_rate-s0", "clinical.record_heart_rate-s2",
                                                 "records.find_patient-s0", "records.find_patient-s2"]
    for sample in log.samples:
        assert any(e.event == "tool" and e.function == "searchResources" for e in sample.events)
        assert sample.scores["verdict"].metadata["success"]
