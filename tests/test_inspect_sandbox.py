"""The fhirgym-bwrap inspect sandbox: inspect's own bash()/python() tools in the python tool's sandbox, with
its limits, and the escape suite of tests/test_sandbox.py run again through inspect.

Every escape must end as a refused operation, a tool error or a killed command within its limit, the
host unharmed (marker files unchanged, no process left), and the next call in the sample must work.
Each escape prints ``ESCAPE (inspect) | what | stopped by | seconds`` (``pytest -s``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai", reason="the inspect extra is not installed (pip install -e '.[inspect]')")

import anyio
from inspect_ai import eval as inspect_eval
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import basic_agent
from inspect_ai.tool import bash, python
from inspect_ai.util import SandboxEnvironmentSpec, SandboxUserUnsupportedError

import fhirgym
from fhirgym.inspect import BwrapConfig, BwrapSandboxEnvironment
from fhirgym.tools import SandboxLimits, sandbox_probe

#: inspect-ai 0.3.285's own retry setup warns on every model it builds (tenacity's renamed argument)
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")
USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
#: The escape suite's limits (tests/test_sandbox.py's), CPU time shortest; room in /tmp and per file for the
#: shell's commands (bash is 1.3 MB)
TIGHT = BwrapConfig(limits=SandboxLimits(cpu_s=1, wall_s=10, memory_bytes=512 << 20, file_bytes=2 << 20,
                                         tmp_bytes=16 << 20, output_bytes=64 << 10, pids=16))


@pytest.fixture(autouse=True, scope="module")
def _sandbox_required():
    p = sandbox_probe()
    if p.available:
        return
    why = "; ".join(p.missing)
    if os.geteuid() == 0:
        pytest.fail(f"the python sandbox must work here (root; scripts/test.sh installs bubblewrap): {why}")
    pytest.skip(f"python sandbox unavailable and not root, so it cannot be set up: {why}")


def test_the_default_limits_are_the_python_tools():
    assert BwrapConfig().limits == SandboxLimits()
    assert BwrapConfig(**TIGHT.model_dump()) == TIGHT  # what inspect's log records, read back
    for bad, message in (({"limits": {"cpu_seconds": 3}}, "cpu_seconds"), ({"nope": 1}, "Extra inputs")):
        with pytest.raises(ValueError, match=message):
            BwrapConfig(**bad)


def test_exec_and_files_behave_as_inspect_expects(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "marker.txt").write_text("host marker")

    async def run() -> None:
        [env] = (await BwrapSandboxEnvironment.sample_init("t", TIGHT, {})).values()
        try:
            r = await env.exec(["bash", "--login", "-c", "echo out; echo err >&2; pwd; exit 3"])
            assert (r.success, r.returncode, r.stdout, r.stderr) == (False, 3, "out\n/workspace\n", "err\n")
            r = await env.exec(["bash", "--login", "-c", "python3 -"], input="import sys; print(sys.stdin.read() or 6*7)")
            assert r.success and r.stdout == "42\n"
            r = await env.exec(["sh", "-c", 'echo "$GREETING from $(pwd)"'], cwd="sub", env={"GREETING": "hi"})
            assert not r.success and r.stderr == "/workspace/sub: No such file or directory\n"  # not made yet
            await env.write_file("sub/notes.txt", "line 1\r\nline 2\n")  # parents made, newlines kept
            r = await env.exec(["sh", "-c", 'echo "$GREETING from $(pwd)"; cat notes.txt'], cwd="sub",
                               env={"GREETING": "hi"})
            assert r.stdout == "hi from /workspace/sub\nline 1\r\nline 2\n"
            assert await env.read_file("/workspace/sub/notes.txt") == "line 1\r\nline 2\n"
            await env.write_file("/tmp/scratch.bin", b"\x00\x01")  # outside the workspace: written inside
            assert await env.read_file("/tmp/scratch.bin", text=False) == b"\x00\x01"
            r = await env.exec(["no-such-command"])
            assert r.returncode == 127 and r.stderr == "no-such-command: No such file or directory\n"
            with pytest.raises(FileNotFoundError):
                await env.read_file("missing.txt")
            with pytest.raises(IsADirectoryError):
                await env.read_file("sub")
            with pytest.raises(SandboxUserUnsupportedError):
                await env.exec(["id"], user="root")
            assert (await env.exec(["id", "-u"], user="nobody")).stdout == "65534\n"
            # a symlink the code planted to a host path is never followed by the host: read, it resolves
            # inside (where that path does not exist); written, the link is replaced by the file
            await env.exec(["ln", "-s", str(outside / "marker.txt"), "evil"])
            with pytest.raises(FileNotFoundError):
                await env.read_file("evil")
            await env.write_file("evil", "pwned")
            assert await env.read_file("evil") == "pwned"
            assert (outside / "marker.txt").read_text() == "host marker"
            with pytest.raises(TimeoutError):
                await env.exec(["sleep", "30"], timeout=1)
        finally:
            await BwrapSandboxEnvironment.sample_cleanup("t", TIGHT, {"default": env}, False)

    anyio.run(run)


def _script(steps: list[tuple[str, str, dict]]):
    """mockllm's outputs: each step's tool call in turn, then the submit call."""
    def outputs(input, tools, tool_choice, config):
        turn = sum(m.role == "assistant" for m in input)
        if turn < len(steps):
            call_id, name, args = steps[turn]
            out = ModelOutput.for_tool_call("mockllm/model", name, args, tool_call_id=call_id)
        else:
            out = ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"}, tool_call_id="submit")
        out.usage = USAGE
        return out

    return outputs


def _host_processes(*argv: str) -> list[int]:
    """Host processes whose command line is exactly ``argv`` (what a sandboxed call started)."""
    want = b"\0".join(a.encode() for a in argv) + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == want:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_escape_suite_through_inspects_own_tools(tcp_server, small_world_path, tmp_path: Path):
    port, accepted = tcp_server
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "marker.txt").write_text("host marker")
    package = Path(fhirgym.__file__).resolve().parent
    pyproject = package.parents[1] / "pyproject.toml"
    targets = ["/escape.txt", "/usr/lib/escape.txt", str(outside / "marker.txt"), str(outside / "new.txt"),
               str(package / "escape.txt")]
    reads = ["/etc/passwd", str(pyproject), str(small_world_path), str(Path.home() / ".cache" / "fhirgym")]
    steps = [
        ("write", "bash", {"command": "for t in " + " ".join(targets) + '; do echo x > "$t" || echo "REFUSED $t"; done'}),
        ("read", "bash", {"command": "cat " + " ".join(reads) + "; ls /"}),
        ("net-python", "python", {"code": f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))"}),
        ("net-bash", "bash", {"command": f"echo hi > /dev/tcp/127.0.0.1/{port}"}),
        ("fork-bomb", "python", {"code": "import os\nwhile True:\n    os.fork()"}),
        ("memory", "python", {"code": "x = bytearray(10 * 2**30)"}),
        ("cpu", "python", {"code": "while True:\n    pass"}),
        ("sleep", "bash", {"command": "sleep 3600"}),
        ("left-behind", "bash", {"command": "sleep 3601 & echo started"}),
        ("flood", "bash", {"command": "yes | head -c 100000000"}),
        ("disk", "bash", {"command": "head -c 10000000 /dev/zero > big.bin; ls -l big.bin"}),
        ("alive", "bash", {"command": "echo alive; id -u"}),
    ]
    [log] = inspect_eval("fhirgym/action", model=get_model("mockllm/model", custom_outputs=_script(steps)),
                         solver=basic_agent(tools=[bash(timeout=3), python()]),
                         sandbox=SandboxEnvironmentSpec("fhirgym-bwrap", TIGHT), display="none",
                         task_args={"tasks": "records.find_patient", "seeds": 1, "world": str(small_world_path)},
                         log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    [sample] = log.samples
    out = {m.tool_call_id: m for m in sample.messages if m.role == "tool"}
    seconds = {e.id: (e.completed - e.timestamp).total_seconds() for e in sample.events
               if e.event == "tool" and e.completed}

    def escape(key: str, what: str, stopped_by: str) -> str:
        print(f"\nESCAPE (inspect) | {what} | {stopped_by} | {seconds.get(key, float('nan')):.2f} s")
        m = out[key]
        return m.text + (f"\n[tool error: {m.error.type}: {m.error.message}]" if m.error else "")

    text = escape("write", "write outside the workspace (bash)", "mount namespace: nothing else mounted, root read-only")
    assert text.count("REFUSED") == len(targets), text
    assert (outside / "marker.txt").read_text() == "host marker" and sorted(p.name for p in outside.iterdir()) == [
        "marker.txt"] and not (package / "escape.txt").exists()
    text = escape("read", "read /etc/passwd, the project, the world file, the cache (bash)",
                  "mount namespace: not mounted")
    assert text.count("No such file or directory") == len(reads), text
    assert "root:" not in text and "[project]" not in text and "SQLite" not in text
    text = escape("net-python", "TCP to the host's loopback server (python)", "seccomp: EPERM on socket")
    assert "PermissionError: [Errno 1] Operation not permitted" in text, text
    text = escape("net-bash", "TCP through bash's /dev/tcp (bash)", "seccomp: EPERM on socket")
    assert "Operation not permitted" in text and accepted == [], text
    text = escape("fork-bomb", "fork bomb (python)", f"pids cgroup (pids.max={TIGHT.limits.pids})")
    assert "BlockingIOError" in text, text
    text = escape("memory", "10 GB allocation (python)", f"RLIMIT_AS ({TIGHT.limits.memory_bytes >> 20} MiB): MemoryError")
    assert "MemoryError" in text, text
    text = escape("cpu", "infinite loop (python)", f"RLIMIT_CPU ({TIGHT.limits.cpu_s} s): SIGXCPU")
    assert "CPU time limit" in text, text
    text = escape("sleep", "sleep forever (bash, timeout=3)", "the call's timeout: TimeoutError, processes killed")
    assert out["sleep"].error is not None and out["sleep"].error.type == "timeout", text
    text = escape("left-behind", "a background process left running (bash)", "killed with the call's process group")
    assert "started" in text and _host_processes("3601") == []
    text = escape("flood", "100 MB of output (bash)", f"output cap ({TIGHT.limits.output_bytes >> 10} KiB): limit error")
    assert out["flood"].error is not None and out["flood"].error.type == "limit", text
    text = escape("disk", "fill the disk (bash)", f"RLIMIT_FSIZE ({TIGHT.limits.file_bytes >> 20} MiB)")
    assert "File size limit exceeded" in text and f"{TIGHT.limits.file_bytes} " in text, text
    assert escape("alive", "the next call", "works") == "alive\n65534\n"
    assert _host_processes("sleep", "3600") == []


def test_a_codeact_sample_shares_the_episodes_sandbox(small_world_path, tmp_path: Path):
    """With -T config=codeact inspect's bash() runs in the episode's own sandbox: the python tool's workspace
    and limits (a file one writes, the other reads)."""
    steps = [("write", "bash", {"command": "echo shared > notes.txt; ls -A"}),
             ("read", "python", {"code": "print(open('notes.txt').read())"})]  # fhirgym's python tool
    [log] = inspect_eval("fhirgym/action", model=get_model("mockllm/model", custom_outputs=_script(steps)),
                         solver=basic_agent(tools=[bash(timeout=5)]), display="none",
                         task_args={"tasks": "records.find_patient", "seeds": 1, "config": "codeact",
                                    "world": str(small_world_path)}, log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    assert log.eval.sandbox.type == "fhirgym-bwrap"
    [sample] = log.samples
    out = {m.tool_call_id: m.text for m in sample.messages if m.role == "tool"}
    assert out["write"].split() == ["notes.txt"]
    assert '"stdout":"shared\\n\\n"' in out["read"]  # our python tool's JSON result


def test_unknown_config_files_fail_clearly(tmp_path: Path):
    bad = tmp_path / "bwrap.yaml"
    bad.write_text("limits: {cpu_s: 2}\nnope: 1\n")
    good = tmp_path / "ok.yaml"
    good.write_text("limits: {cpu_s: 2, wall_s: 5}\ncommands: [bash, ls]\n")

    async def run():
        [env] = (await BwrapSandboxEnvironment.sample_init("t", str(good), {})).values()
        assert (env.config.limits.cpu_s, env.config.limits.wall_s, env.config.commands) == (2, 5, ("bash", "ls"))
        with pytest.raises(ValueError, match="nope"):
            await BwrapSandboxEnvironment.sample_init("t", str(bad), {})
        with pytest.raises(ValueError, match="No such file or directory"):
            await BwrapSandboxEnvironment.sample_init("t", str(tmp_path / "missing.yaml"), {})

    anyio.run(run)
