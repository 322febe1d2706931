"""CodeAct: the tools (fhir_query, fhir_get, python, finish), the per-episode workspace, the in-sandbox FHIR
functions and the CodeAct agent end to end with a scripted backend (no model)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from click.testing import CliRunner
from mcp import Client, StdioServerParameters

from fhirgym.agents import CodeActAgent, ScriptedBackend, default_iterations
from fhirgym.cli import main
from fhirgym.env import Config, Episode, get_config, register_config
from fhirgym.rl import TextEpisode
from fhirgym.runner import EpisodeKey, EvalSpec, run_episode
from fhirgym.tasks import TaskWorld, make_instance
from fhirgym.tools import (
    CODEACT_TOOLS,
    FHIR_TOOLS,
    WORKSPACE_KEY,
    SandboxProbe,
    Toolbox,
    ToolContext,
    _sandbox,
    sandbox_probe,
)

CODEACT_ONLY = register_config(Config("test-codeact-only", CODEACT_TOOLS, "CodeAct tools, no FHIR writes"),
                               replace=True)


@pytest.fixture(autouse=True, scope="module")
def _sandbox_required():
    p = sandbox_probe()
    if not p.available and os.geteuid() != 0:
        pytest.skip(f"python sandbox unavailable and not root: {'; '.join(p.missing)}")
    assert p.available, p.missing  # as root (CI) it must work: scripts/test.sh installs bubblewrap


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def _call(ep: Episode, name: str, **arguments):
    return ep.step({"name": name, "arguments": arguments})


def _patient_with(ep: Episode, rtype: str) -> str:
    """A patient id that has resources of ``rtype`` (the first one's subject)."""
    found = _call(ep, "searchResources", resourceType=rtype, params={"_count": "1"}).output["resources"][0]
    return (found.get("subject") or found.get("patient"))["reference"].split("/")[-1]


def test_fhir_query_fetches_every_page_and_a_refetch_merges(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        pid = _patient_with(ep, "Observation")
        total = _call(ep, "searchResources", resourceType="Observation", params={"patient": pid, "_summary": "count"})
        first = _call(ep, "fhir_query", resource_type="Observation", patient_id=pid)
        assert first.error is None, first.output
        n = first.output["fetched"]["Observation"]
        assert n == total.output["total"] > 0  # every page
        assert first.output["workspace"] == {"added": n, "updated": [], "unchanged": 0, "counts": {"Observation": n}}
        obs = ep.workspace.resources["Observation"][first.output["ids"]["Observation"][0]]
        # the agent changes one Observation, then fetches again: merged, the change named, nothing dropped
        changed = {**obs, "status": "amended" if obs["status"] != "amended" else "corrected"}
        assert _call(ep, "updateResource", resourceType="Observation", resourceId=obs["id"], body=changed).error is None
        again = _call(ep, "fhir_query", resource_type="Observation", patient_id=pid)
        assert again.output["workspace"]["updated"] == [f"Observation/{obs['id']}"]
        assert again.output["workspace"]["added"] == 0 and again.output["workspace"]["unchanged"] == n - 1
        assert len(ep.workspace.resources["Observation"]) == n
        assert ep.workspace.resources["Observation"][obs["id"]]["status"] == changed["status"]
        # another type adds to the workspace; the Observations stay
        pat = _call(ep, "fhir_query", resource_type="Patient", patient_id=f"Patient/{pid}")
        assert pat.output["ids"] == {"Patient": [pid]}
        assert pat.output["workspace"]["counts"] == {"Observation": n, "Patient": 1}
        code = "answer = {t: len(v) for t, v in retrieved_resources.items()}"
        assert _call(ep, "python", code=code).output["answer"] == {"Observation": n, "Patient": 1}


def test_medication_requests_bring_their_medications(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        found = _call(ep, "searchResources", resourceType="MedicationRequest",
                      params={"medication:missing": "false", "_count": "1"}).output["resources"]
        ref = next(r for r in found if "medicationReference" in r)
        pid = ref["subject"]["reference"].split("/")[-1]
        out = _call(ep, "fhir_query", resource_type="MedicationRequest", patient_id=pid).output
        meds = {m["medicationReference"]["reference"].split("/")[1]
                for m in ep.workspace.resources["MedicationRequest"].values() if "medicationReference" in m}
        assert meds and set(out["ids"]["Medication"]) == meds == set(ep.workspace.resources["Medication"])


def test_fhir_get_accepts_searches_only(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        pid = _patient_with(ep, "Condition")
        ok = _call(ep, "fhir_get", query=f"Condition?patient={pid}&_count=2")
        assert ok.error is None and ok.output["fetched"]["Condition"] == len(ep.workspace.resources["Condition"]) > 0
        refused = {
            f"Patient/{pid}": "not a search",
            f"Patient/{pid}/_history": "not a search",
            "Patient/$everything": "not a search",
            "$export": "not a search",
            "Spaceship?name=x": "not a search",
            "https://evil.example/fhir/Patient?name=x": "relative to this server",
            "https://evil.example/fhir?_getpages=abc&_getpagesoffset=10": "next_page_url",
            "Patient?bad name=x": "not a parameter name",
            f"Patient?_id={pid}&nosuchparam=1": "nosuchparam",
        }
        for query, why in refused.items():
            call = _call(ep, "fhir_get", query=query)
            assert call.error and why in call.error, (query, call.error)
        assert set(ep.workspace.resources) == {"Condition"}  # nothing refused reached the workspace
        bad = _call(ep, "fhir_query", resource_type="Patient?_id=1", patient_id=pid)
        assert bad.error and "not an R4 resource type" in bad.error
        assert "not a FHIR id" in _call(ep, "fhir_query", resource_type="Patient", patient_id="a/../b").error


def test_outputs_stay_within_the_budget(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        pid = _patient_with(ep, "Observation")
    with Episode(inst, "codeact", budget=800) as ep:
        ep.reset()
        out = _call(ep, "fhir_query", resource_type="Observation", patient_id=pid).output
        size = len(orjson.dumps(out))
        assert size <= 800 and out["omitted_ids"] > 0 and "left out" in out["note"]
        n = out["fetched"]["Observation"]
        assert len(ep.workspace.resources["Observation"]) == n  # bounded result, complete workspace
        big = _call(ep, "python", code="print('x' * 100_000)\nanswer = 'y' * 50_000").output
        assert len(orjson.dumps(big)) <= 800
        assert big["stdout"].startswith("xxx") and "stdout" in big["truncated_output"]
        assert "answer_truncated" in big
        err = _call(ep, "python", code="def f(n):\n    return f(n + 1)\nf(0)").output
        assert len(orjson.dumps(err)) <= 800 and err["error"].rstrip().endswith("maximum recursion depth exceeded")


def test_python_errors_show_the_models_lines_only(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        out = _call(ep, "python", code="x = 1\ny = x / 0").output
        assert 'File "<python>", line 2' in out["error"] and "ZeroDivisionError" in out["error"]
        assert "fhirgym-boot" not in out["error"]
        err = _call(ep, "python", code="read_resource('Patient', 'no-such-id')").output["error"]
        assert "FhirError" in err and 'File "<python>", line 1' in err and "fhirgym-boot" not in err


def test_python_refuses_without_a_sandbox_unless_unsafe(world, monkeypatch):
    missing = SandboxProbe(missing=("bubblewrap (bwrap) not found: install it with `bash scripts/_sandbox.sh`",))
    monkeypatch.setattr(_sandbox, "sandbox_probe", lambda refresh=False: missing)
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        refused = _call(ep, "python", code="answer = 1")
        assert refused.error and "bwrap" in refused.error and "--unsafe-python" in refused.error
        assert "answer" not in refused.output
    with Episode(inst, "codeact", unsafe_python=True) as ep:  # explicit: runs with the layers that work
        ep.reset()
        ran = _call(ep, "python", code="import os\nanswer = os.getcwd()")
        assert ran.error is None and ran.output["answer"] == ep.workspace.directory


def test_episodes_have_their_own_workspaces_removed_on_close(world):
    inst = make_instance("records.find_patient", 0, world)
    one, two = Episode(inst, "codeact"), Episode(inst, "codeact")
    one.reset()
    two.reset()
    try:
        pid = _patient_with(one, "Condition")
        _call(one, "fhir_query", resource_type="Condition", patient_id=pid)
        wrote = _call(one, "python", code="open('secret.txt', 'w').write('one')\nimport os\nanswer = os.getcwd()")
        dirs = [Path(one.workspace.directory), Path(two.workspace.directory)]
        assert dirs[0] != dirs[1] and (dirs[0] / "secret.txt").exists()
        assert wrote.output["answer"] == "/workspace"  # the host path is not visible inside
        peek = _call(two, "python", code=(
            f"import os\nanswer = [os.path.exists({str(dirs[0] / 'secret.txt')!r}), os.listdir('.'), "
            "sorted(retrieved_resources)]"))
        assert peek.output["answer"] == [False, [], []]
        assert two.workspace.resources == {}
        one.reset()  # a new run of the episode: a new, empty workspace
        assert not dirs[0].exists() and one.workspace.resources == {}
    finally:
        one.close()
        two.close()
    assert not dirs[1].exists() and two.workspace is None


def test_code_writes_through_checked_episode_calls(world):
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        code = """
made = create_resource("Basic", {"code": {"text": "from the sandbox"}})
back = read_resource("Basic", made["id"])
found = search("Basic", {"_id": made["id"]})
try:
    create_resource("Basic", {"resourceType": "Patient"})
except FhirError as exc:
    refused = str(exc)
try:
    read_resource("Patient", "../../metadata")
except FhirError as exc:
    bad_id = str(exc)
answer = [made["status"], back["code"]["text"], [r["id"] for r in found] == [made["id"]], refused, bad_id]
"""
        out = _call(ep, "python", code=code).output
        assert out["answer"][:3] == [201, "from the sandbox", True], out
        assert "does not match" in out["answer"][3] and "not a FHIR id" in out["answer"][4]
        names = [c.name for c in ep.calls]
        assert names == ["createResource", "getResourceById", "fhir_get", "createResource", "getResourceById",
                         "python"]
        assert [f["function"] for f in out["fhir_calls"]] == ["create", "read", "search", "create", "read"]
        verdict = ep.submit(None)  # the Basic is a real write of this episode: collateral for find_patient
        assert any("collateral" in r for r in verdict.reasons)
    with Episode(inst, CODEACT_ONLY) as ep:  # no write tools granted: none inside either
        ep.reset()
        out = _call(ep, "python", code=(
            "try:\n    create_resource('Basic', {'code': {'text': 'x'}})\nexcept FhirError as exc:\n"
            "    answer = str(exc)")).output
        assert "unknown tool 'createResource'" in out["answer"]
        assert ep.submit(None).changes == []


def test_a_bare_toolbox_makes_a_read_only_workspace(world):
    """Outside an episode (a toolbox of its own, as ``fhirgym mcp fhir --codeact``) code may only read."""
    inst = make_instance("records.find_patient", 0, world)
    with inst.open() as fork:
        ctx = ToolContext(fork.client)
        box = Toolbox(CODEACT_TOOLS + FHIR_TOOLS, ctx)
        try:
            out = box.call("python", {"code": (
                "n = len(search('Patient', {'_count': '3'}))\ntry:\n    create_resource('Basic', {})\n"
                "except FhirError as exc:\n    answer = [n > 0, str(exc)]")}).output
            assert out["answer"][0] is True and "unknown tool 'createResource'" in out["answer"][1]
        finally:
            ctx.extras[WORKSPACE_KEY].close()


# --- the CodeAct agent, scripted ----------------------------------------------------------------------------

def _observation(messages: list[dict]) -> dict:
    last = messages[-1]
    assert last["role"] == "user" and last["content"].startswith("Execution result:\n")
    return orjson.loads(last["content"].removeprefix("Execution result:\n"))


def test_codeact_agent_answers_a_read_task(world):
    inst = make_instance("records.find_patient", 3, world)
    given, family = inst.params["name"].split()[0], inst.params["name"].split()[-1]
    code = (f"found = search('Patient', {{'given': {given!r}, 'family': {family!r}, "
            f"'birthdate': {inst.params['birth_date']!r}}})\nanswer = [p['id'] for p in found]\nprint(len(found))")
    script = [
        f"I'll search for the patient.\n```python\n{code}\n```",
        lambda msgs: f'The final answer is: <answer>{{"patient_id": "{_observation(msgs)["answer"][0]}"}}</answer>',
    ]
    agent = CodeActAgent(ScriptedBackend(script))
    line, transcript = run_episode(EpisodeKey("codeact", inst.family.id, 3, 0, 0), inst, agent, "codeact",
                                   max_iterations=agent.max_iterations)
    assert line["status"] == "pass" and line["success"], line["reasons"]
    assert [c["name"] for c in line["tool_calls"]] == ["fhir_get", "python"]
    assert line["iterations"] == 2 and line["stop_reason"] == "answered"
    assert "create_resource(resource_type, body)" in transcript["system"]


def test_codeact_agent_does_a_write_task_and_finishes(world):
    inst = make_instance("records.create_patient", 0, world)
    p = inst.params
    body = {"resourceType": "Patient", "active": True, "gender": p["gender"], "birthDate": p["birth_date"],
            "name": [{"use": "official", "family": p["family"], "given": [p["given"]]}],
            "telecom": [{"system": "phone", "value": p["phone"], "use": "home"}],
            "address": [{"use": "home", "line": [p["line"]], "city": p["city"], "state": "MA",
                         "postalCode": p["postal"]}]}
    code = (f"dup = search('Patient', {{'family': {p['family']!r}, 'birthdate': {p['birth_date']!r}}})\n"
            f"assert not dup, dup\nmade = create_resource('Patient', {body!r})\nanswer = made['id']")
    script = [
        f"```python\n{code}\n```",
        lambda msgs: ('<tool_call>{"name": "finish", "arguments": {"answer": "Registered as Patient/'
                      + _observation(msgs)["answer"] + '."}}</tool_call>'),
        "never reached: finish ended the episode",
    ]
    backend = ScriptedBackend(script)
    line, _ = run_episode(EpisodeKey("codeact", inst.family.id, 0, 0, 0), inst, CodeActAgent(backend), "codeact",
                          max_iterations=12)
    assert line["status"] == "pass" and line["success"], line["reasons"]
    assert [c["name"] for c in line["tool_calls"]] == ["fhir_get", "createResource", "python", "finish"]
    assert line["final_answer"].startswith("Registered as Patient/") and backend.remaining == 1


def test_codeact_turn_cap_and_factory():
    assert default_iterations("codeact") == 12 and default_iterations("react") == 15
    assert EvalSpec(out=Path("x"), agent="codeact").max_iterations == 12
    assert EvalSpec(out=Path("x"), agent="react").max_iterations == 15
    assert EvalSpec(out=Path("x"), agent="codeact", max_iterations=5).max_iterations == 5
    assert get_config("codeact").tools == CODEACT_TOOLS + FHIR_TOOLS


def test_codeact_agent_stops_at_its_turn_cap(world):
    inst = make_instance("records.find_patient", 0, world)
    agent = CodeActAgent(ScriptedBackend(["```python\nprint(1)\n```"] * 5), max_iterations=3)
    line, _ = run_episode(EpisodeKey("codeact", inst.family.id, 0, 0, 0), inst, agent, "codeact", max_iterations=12)
    assert line["iterations"] == 3 and line["stop_reason"] == "max_iterations" and not line["success"]
    assert [c["name"] for c in line["tool_calls"]] == ["python"] * 3


def test_text_episode_runs_code_and_ends_on_finish(world):
    inst = make_instance("records.find_patient", 3, world)
    env = TextEpisode(inst, "codeact")
    try:
        opening = env.reset()
        assert "create_resource(resource_type, body)" in opening[0]["content"]  # the CodeAct prompt: python granted
        given, family = inst.params["name"].split()[0], inst.params["name"].split()[-1]
        step = env.step(f"```python\nanswer = [p['id'] for p in search('Patient', {{'given': {given!r}, "
                        f"'family': {family!r}, 'birthdate': {inst.params['birth_date']!r}}})]\n```")
        assert not step.done
        pid = orjson.loads(step.observations[0]["content"])["answer"][0]
        answer = f'<answer>{{\\"patient_id\\": \\"{pid}\\"}}</answer>'
        end = env.step(f'<tool_call>{{"name": "finish", "arguments": {{"answer": "{answer}"}}}}</tool_call>')
        assert end.done and end.info["stop"] == "finished" and end.info["success"] and end.reward > 0
        assert re.search(pid, env.episode.answer)
    finally:
        env.close()


def test_the_codeact_tools_over_the_episodes_mcp_endpoint(world):
    """Served over MCP like the others: same workspace, same checked calls, in the episode's call log."""
    inst = make_instance("records.find_patient", 0, world)
    with Episode(inst, "codeact") as ep:
        ep.reset()
        pid = _patient_with(ep, "Condition")

        async def main(url: str) -> tuple[list[str], dict, dict]:
            async with Client(url) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                fetched = await client.call_tool("fhir_query", {"resource_type": "Condition", "patient_id": pid})
                ran = await client.call_tool("python", {"code": (
                    "made = create_resource('Basic', {'code': {'text': 'over mcp'}})\n"
                    "answer = [len(retrieved_resources['Condition']), made['id']]")})
                return names, orjson.loads(fetched.content[0].text), orjson.loads(ran.content[0].text)

        names, fetched, ran = anyio.run(main, ep.tools.mcp_url())
        assert names == [t.name for t in CODEACT_TOOLS + FHIR_TOOLS]
        n, made = ran["answer"]
        assert n == fetched["fetched"]["Condition"] == len(ep.workspace.resources["Condition"]) > 0
        assert [c.name for c in ep.calls][-3:] == ["fhir_query", "createResource", "python"]
        assert [ch.key for ch in ep.submit(None).changes] == [f"Basic/{made}"]


def test_eval_cli_takes_the_codeact_config_and_the_unsafe_flag(small_world_path, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["eval", "--agent", "reference", "--config", "codeact", "--unsafe-python",
                                    "--tasks", "records.find_patient", "--out", str(out), "--no-report",
                                    "--world", str(small_world_path)])
    assert res.exit_code == 0, res.output
    run = orjson.loads((out / "run.json").read_bytes())
    assert run["spec"]["unsafe_python"] is True and run["spec"]["config"] == "codeact"
    assert run["identity"]["max_iterations"] == 15  # the reference agent's; codeact's own is 12
    [line] = [orjson.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert line["config"] == "codeact" and line["status"] == "pass"


def test_mcp_cli_serves_the_codeact_tools_read_only(small_world_path):
    """``fhirgym mcp fhir --codeact --read-only``: code can search, and cannot write through the proxy."""
    exe = shutil.which("fhirgym", path=str(Path(sys.executable).parent))
    assert exe
    params = StdioServerParameters(command=exe, args=["mcp", "fhir", "--transport", "stdio", "--codeact",
                                                      "--read-only", "--world", str(small_world_path)],
                                   env=dict(os.environ))

    async def main() -> tuple[list[str], dict]:
        async with Client(params) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            ran = await client.call_tool("python", {"code": (
                "n = len(search('Patient', {'_count': '2'}))\ntry:\n    create_resource('Basic', {})\n"
                "except FhirError as exc:\n    answer = [n, str(exc)]")})
            return names, orjson.loads(ran.content[0].text)

    names, ran = anyio.run(main)
    assert names == ["fhir_query", "fhir_get", "python", "finish", "listResourceTypes", "getResourceById",
                     "searchResources"]
    assert ran["answer"][0] > 0 and "unknown tool 'createResource'" in ran["answer"][1]
