"""The evaluation loop end to end: built-in agents, the ReAct loop on a scripted model, result files,
errors vs failures, crash and resume."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from fhirgym.agents import ReactAgent, ScriptedBackend, make_agent
from fhirgym.runner import EvalError, EvalSpec, read_results, run_eval, summary
from fhirgym.tasks import TaskWorld, make_instance


def _documented_fields() -> set[str]:
    """The fields of one result line as docs/RESULTS.md lists them (the docs and the runner agree)."""
    text = (Path(__file__).parents[1] / "docs" / "RESULTS.md").read_text()
    section = text.split("## One line of `results.jsonl`", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


FIELDS = _documented_fields()
#: Fields only some tracks write (the QA track's ``qa``).
TRACK_FIELDS = {"qa"}


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def test_reference_passes_and_null_fails_with_complete_result_files(world, tmp_path):
    ref = run_eval(EvalSpec(out=tmp_path / "ref", agent="reference", tasks="records.*", seeds=[0, 1]), world)
    null = run_eval(EvalSpec(out=tmp_path / "null", agent="null", tasks="records.*", seeds=[0, 1]), world)
    assert ref and len(ref) == len(null)
    assert all(r["status"] == "pass" and r["success"] for r in ref)
    assert all(r["status"] == "fail" and not r["success"] and r["failure_modes"] for r in null)
    for line in ref + null:
        assert set(line) == FIELDS - TRACK_FIELDS
        transcript = orjson.loads((tmp_path / ("ref" if line["agent"] == "reference" else "null")
                                   / line["transcript"]).read_bytes())
        assert transcript["prompt"] and transcript["verdict"]["success"] == line["success"]
    writing = [r for r in ref if r["writes"]]
    assert writing and all(r["light_success"] for r in writing)
    assert all(r["expected_min_calls"] == len(r["tool_calls"]) for r in ref)
    table = summary(ref)
    assert "records" in table and "100.0 %" in table
    run = orjson.loads((tmp_path / "ref" / "run.json").read_bytes())
    assert run["identity"]["agent"] == "reference" and len(run["world_sha256"]) == 64


def test_the_read_write_split_follows_instances(world, tmp_path):
    """A conditional order's seeds draw both branches: the result line says per instance whether it writes."""
    lines = run_eval(EvalSpec(out=tmp_path / "r", agent="reference", tasks="clinical.magnesium_if_low",
                              seeds=[0, 1]), world)
    by_seed = {r["seed"]: r for r in lines}
    assert by_seed[0]["writes"] and by_seed[0]["light_success"] and by_seed[0]["success"]
    assert by_seed[1]["writes"] is False and by_seed[1]["light_success"] is None and by_seed[1]["success"]


def _scripted_solver(inst):
    """A scripted model that solves records.find_patient like a competent agent would, in two turns."""
    p = inst.params
    given, family = p["name"].split()[0], p["name"].split()[-1]
    call = {"name": "searchResources", "arguments": {"resourceType": "Patient",
                                                     "params": {"given": given, "family": family,
                                                                "birthdate": p["birth_date"]}}}

    def answer(messages):
        found = re.search(r'"id":"([^"]+)"', messages[-1]["content"])
        return f'<answer>{{"patient_id": "{found.group(1)}"}}</answer>'

    return ScriptedBackend([f"<tool_call>{orjson.dumps(call).decode()}</tool_call>", answer])


def test_react_loop_with_a_scripted_model(world, tmp_path):
    inst = make_instance("records.find_patient", 0, world)
    backend = _scripted_solver(inst)
    agent = ReactAgent(backend)
    [line] = run_eval(EvalSpec(out=tmp_path, agent="react", model="scripted", tasks="records.find_patient"), world,
                      agent=agent)
    assert line["status"] == "pass" and line["stop_reason"] == "answered" and line["iterations"] == 2
    assert [c["name"] for c in line["tool_calls"]] == ["searchResources"]
    assert line["tokens"]["prompt"] > 0 and line["tokens"]["completion"] > 0
    user = backend.requests[0].messages[1]["content"]
    assert inst.now.strftime("%A") in user and inst.now.strftime("%Y-%m-%d %H:%M") in user and inst.prompt in user
    assert backend.requests[0].tools and {t["function"]["name"] for t in backend.requests[0].tools} >= {
        "searchResources", "createResource"}
    tool_msg = backend.requests[1].messages[-1]
    assert tool_msg["role"] == "tool" and '"total":1' in tool_msg["content"]


def test_a_backend_that_can_afford_less_gets_shorter_tool_outputs_and_replies(world, tmp_path):
    """A local model says what it can afford (tool_budget, max_reply_tokens); --budget still wins."""
    search = ('<tool_call>{"name": "searchResources", "arguments": {"resourceType": "Observation"}}'
              '</tool_call>')
    outputs = {}
    for label, budget in (("cheap", None), ("explicit", 9000)):
        backend = ScriptedBackend([search, "<answer>{}</answer>"])
        backend.tool_budget, backend.max_reply_tokens = 1500, 200
        agent = ReactAgent(backend)
        run_eval(EvalSpec(out=tmp_path / label, agent="react", model="scripted", tasks="records.find_patient",
                          budget=budget), world, agent=agent)
        assert [r.max_tokens for r in backend.requests] == [200, 200]
        outputs[label] = backend.requests[1].messages[-1]["content"]
    assert 1000 < len(outputs["cheap"]) <= 1500 < 6000 < len(outputs["explicit"]) <= 9000
    assert '"omitted"' in outputs["cheap"] and '"omitted"' in outputs["explicit"]


def test_backend_failure_is_an_error_not_a_fail(world, tmp_path):
    agent = ReactAgent(ScriptedBackend([]))  # exhausted at once, like an endpoint that went away
    [line] = run_eval(EvalSpec(out=tmp_path, agent="react", model="scripted", tasks="records.find_patient"), world,
                      agent=agent)
    assert line["status"] == "error" and line["success"] is None and line["error"]
    assert "error" in summary([line])


def test_max_iterations_and_tool_errors_are_recorded(world, tmp_path):
    bad = '<tool_call>{"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {"nope": "1"}}}</tool_call>'
    agent = ReactAgent(ScriptedBackend([bad] * 3), max_iterations=3)
    [line] = run_eval(EvalSpec(out=tmp_path, agent="react", model="scripted", tasks="records.find_patient",
                               max_iterations=3), world, agent=agent)
    assert line["status"] == "fail" and line["stop_reason"] == "max_iterations" and line["iterations"] == 3
    assert all(c["error"] for c in line["tool_calls"]) and "tool_errors" in line["failure_modes"]


def test_python_class_agents_load_by_path(tmp_path):
    agent = make_agent("fhirgym.agents:NullAgent")
    assert agent.name == "null"
    with pytest.raises(ValueError, match="cannot import"):
        make_agent("no_such_module:Agent")


def test_a_run_with_no_seed_is_refused_before_anything_runs(world, tmp_path):
    from click.testing import CliRunner

    from fhirgym.cli import main

    with pytest.raises(EvalError, match="nothing to evaluate"):
        run_eval(EvalSpec(out=tmp_path, agent="null", tasks="records.*", seeds=[]), world)
    assert not (tmp_path / "results.jsonl").exists()
    out = CliRunner().invoke(main, ["eval", "--seeds", "0", "--agent", "null", "--out", str(tmp_path / "cli")])
    assert out.exit_code == 2 and "seed 0 alone is 1" in out.output  # "0" is N = 0 seeds, not seed 0
    assert not (tmp_path / "cli").exists()


def test_a_selector_that_matches_nothing_is_a_clear_error(world, tmp_path):
    from click.testing import CliRunner

    from fhirgym.cli import main

    with pytest.raises(EvalError, match=r"no task matches 'nosuch\.family'"):
        run_eval(EvalSpec(out=tmp_path, agent="null", tasks="records.*,nosuch.family", seeds=[0]), world)
    out = CliRunner().invoke(main, ["eval", "--tasks", "nosuch.family", "--agent", "null",
                                    "--out", str(tmp_path / "cli")])
    assert out.exit_code == 1 and "no task matches 'nosuch.family'" in out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)  # no traceback
    assert not (tmp_path / "cli" / "results.jsonl").exists()
    for args in (["tasks", "list"], ["tasks", "check", "--seeds", "1"]):  # the other commands that take --tasks
        out = CliRunner().invoke(main, [*args, "--tasks", "records.*,nosuch.family"])
        assert out.exit_code == 2 and "no task matches 'nosuch.family'" in out.output, args
        assert isinstance(out.exception, SystemExit), args  # a usage error, no traceback


def test_resume_skips_finished_episodes_and_repairs_a_torn_tail(world, tmp_path):
    spec = EvalSpec(out=tmp_path, agent="reference", tasks="records.*", seeds=[0, 1])
    first = run_eval(spec, world)
    path = tmp_path / "results.jsonl"
    data = path.read_bytes()
    path.write_bytes(data + data.splitlines(keepends=True)[0][:40])  # a kill in the middle of a write
    with pytest.raises(EvalError, match="--resume"):
        run_eval(spec, world)
    spec.resume = True
    again = run_eval(spec, world)
    assert [r["episode_id"] for r in again] == [r["episode_id"] for r in first]
    assert path.read_bytes() == data
    with pytest.raises(EvalError, match="different settings"):
        run_eval(EvalSpec(out=tmp_path, agent="null", tasks="records.*", seeds=[0, 1], resume=True), world)


@pytest.mark.slow
def test_a_run_killed_at_any_moment_resumes_without_loss(small_world_path, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fhirgym.cli", "eval", "--agent", "reference", "--tasks", "records.*",
           "--seeds", "40", "--out", str(out), "--no-report", "--world", str(small_world_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_results(out)) < 5:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = read_results(out)
    assert len(partial) >= 5
    subprocess.run([*cmd, "--resume"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    final = read_results(out)
    ids = [r["episode_id"] for r in final]
    assert len(ids) == len(set(ids)) == 40 * len({r["task_id"] for r in final})
    assert [r["episode_id"] for r in final[: len(partial)]] == [r["episode_id"] for r in partial]
    for raw in Path(out / "results.jsonl").read_bytes().splitlines():
        orjson.loads(raw)


def test_an_external_agent_program_works_through_its_episode_mcp_endpoint(world, tmp_path):
    script = Path(__file__).parent / "_external_agent.py"
    lines = run_eval(EvalSpec(out=tmp_path, agent=f"cmd:{sys.executable} {script}", tasks="records.find_patient",
                              seeds=[0, 1]), world)
    assert [r["status"] for r in lines] == ["pass", "pass"], [r["reasons"] or r["error"] for r in lines]
    assert all([c["name"] for c in r["tool_calls"]] == ["searchResources"] for r in lines)
    assert all(r["sandbox_s"] <= r["duration_s"] for r in lines)


def test_report_of_real_runs_compares_agents(world, tmp_path):
    from fhirgym.analysis import compute_metrics, load_results

    for agent in ("reference", "null"):
        run_eval(EvalSpec(out=tmp_path / agent, agent=agent, tasks="records.*", seeds=[0]), world)
    results = load_results([tmp_path / "reference", tmp_path / "null"])
    assert {r["config"] for r in results} == {"reference · baseline", "null · baseline"}
    assert {r["_config"] for r in results} == {"baseline"}
    metrics = compute_metrics(results, n_boot=200)
    text = orjson.dumps(metrics).decode()
    assert "reference · baseline" in text and "null · baseline" in text
