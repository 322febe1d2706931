"""The python tool's sandbox against a hostile agent, judged on the host: each class of attack that once got
through, in both modes (a zygote per episode, bwrap per call), with the effect checked from outside.

Classes: the host's environment, root on the host (kernel settings, device nodes, a planted setuid
binary), the workspace's disk, what comes back (result fd, answer depth), the workspace's removal, and
the host side of the in-sandbox FHIR functions (malformed requests, deadline, budgets, late logging).
Each escape prints ``ESCAPE | what | stopped by | seconds`` (``pytest -s``).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fhirgym.env import Episode
from fhirgym.runner import _episode as runner_episode
from fhirgym.runner import run_episode
from fhirgym.tasks import TaskWorld, make_instance
from fhirgym.tools import Sandbox, SandboxLimits, _codeact, _sandbox_fs, sandbox_probe

LIMITS = SandboxLimits(cpu_s=5, wall_s=15, memory_bytes=512 << 20, file_bytes=1 << 20, tmp_bytes=4 << 20,
                       output_bytes=256 << 10, pids=16, workspace_bytes=8 << 20, workspace_files=512)
ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True, scope="module")
def _sandbox_required():
    p = sandbox_probe()
    if not p.available and not ROOT:
        pytest.skip(f"python sandbox unavailable and not root: {'; '.join(p.missing)}")
    assert p.available, p.missing  # as root (CI) every layer must work


@pytest.fixture(params=["zygote", "per-call"])
def mode(request: pytest.FixtureRequest) -> bool:
    return request.param == "zygote"


@pytest.fixture()
def sandbox(mode: bool):
    with Sandbox(limits=LIMITS, zygote=mode) as sb:
        yield sb


def _escape(name: str, stopped_by: str, seconds: float) -> None:
    print(f"\nESCAPE | {name} | {stopped_by} | {seconds:.2f} s")


def _still_works(sb: Sandbox) -> None:
    r = sb.run("answer = 6 * 7")
    assert r.ok and r.answer == 42, r


# --- the host's environment ------------------------------------------------------------------------------

_READ_ENVIRONS = """
import glob, os
found = {}
for f in sorted(set(glob.glob('/proc/*/environ') + glob.glob('/proc/*/task/*/environ')
                    + ['/proc/self/environ', '/proc/thread-self/environ'])):
    try:
        found[f] = open(f, 'rb').read().decode(errors='replace')
    except OSError as exc:
        found[f] = type(exc).__name__
found['os.environ'] = '\\0'.join(f'{k}={v}' for k, v in os.environ.items())
answer = found
"""


def test_nothing_of_the_hosts_environment_inside(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch):
    """Every environment the code can read (each pid it sees, its own, os.environ) holds only the sandbox's
    fixed variables; a marker set in the host's environment just before the sandbox starts is nowhere."""
    monkeypatch.setenv("FHIRGYM_LEAK_MARKER", "m4rker-value-9173")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-leak-0042")
    t0 = time.monotonic()
    r = sandbox.run(_READ_ENVIRONS)
    assert r.ok, r
    readable = {f: v for f, v in r.answer.items() if v != "PermissionError"}
    assert "/proc/1/environ" in readable and "os.environ" in readable  # bwrap's pid 1 is readable, and clean
    allowed = {"LANG=C.UTF-8", "HOME=/workspace", "TMPDIR=/tmp", "PWD=/workspace", "PWD=/"}
    for f, text in readable.items():
        assert "m4rker" not in text and "sk-test" not in text, (f, text)
        assert set(filter(None, text.split("\0"))) <= allowed, (f, text)
    _escape("read the host's environment (/proc/*/environ, os.environ)", "bwrap started with {LANG} only",
            time.monotonic() - t0)
    _still_works(sandbox)


# --- never root on the host ------------------------------------------------------------------------------

def _sysctl(name: str) -> str:
    return Path("/proc/sys", name.replace(".", "/")).read_text()


def test_code_is_an_unprivileged_uid_on_the_host(sandbox: Sandbox):
    """What the code makes is the sandbox's uid on the host, never root's; under a root host that uid is no
    account's and not 0."""
    r = sandbox.run("open('mine', 'w').write('x')\nimport os\nos.mkdir('d')\nanswer = os.getuid()")
    assert r.ok and r.answer == 65534
    uid, gid = _sandbox_fs.sandbox_ids()
    for p in (sandbox.workspace / "mine", sandbox.workspace / "d"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (uid, gid)
    if ROOT:
        assert uid != 0 and gid != 0 and "unprivileged" in r.protections
        import pwd

        with pytest.raises(KeyError):
            pwd.getpwuid(uid)


def test_escape_write_kernel_settings(sandbox: Sandbox):
    """No file under /proc/sys opens for writing (read-only /proc, and not root anyway); the host's
    settings are unchanged, checked from outside."""
    before = {n: _sysctl(n) for n in ("fs.lease-break-time", "kernel.core_pattern", "vm.overcommit_memory")}
    t0 = time.monotonic()
    r = sandbox.run("""
import os
opened, tried = [], 0
for d, _, files in os.walk('/proc/sys'):
    if d.startswith('/proc/sys/net'):
        continue
    for f in files:
        tried += 1
        try:
            with open(os.path.join(d, f), 'w') as fh:
                opened.append(fh.name)
        except OSError:
            pass
for path, value in (('/proc/sys/fs/lease-break-time', '7'), ('/proc/sys/kernel/core_pattern', '|/tmp/x')):
    try:
        open(path, 'w').write(value)
        opened.append(path + ' written')
    except OSError:
        pass
answer = [tried, opened]
""")
    assert r.ok, r
    tried, opened = r.answer
    assert tried > 100 and opened == [], opened
    assert {n: _sysctl(n) for n in before} == before
    _escape(f"write host sysctls ({tried} files under /proc/sys)", "read-only /proc; unprivileged uid",
            time.monotonic() - t0)
    _still_works(sandbox)


def test_escape_device_nodes_and_dev(sandbox: Sandbox):
    """Device nodes cannot be chmod-ed (the host's inode stays as it was), /dev takes no new file, /dev/shm
    is capped."""
    before = {d: os.stat(d).st_mode for d in ("/dev/null", "/dev/zero", "/dev/urandom")}
    t0 = time.monotonic()
    r = sandbox.run("""
import os
def attempt(fn):
    try:
        fn()
        return 'DONE'
    except OSError as exc:
        return type(exc).__name__
answer = {d: attempt(lambda d=d: os.chmod(d, 0o600)) for d in ('/dev/null', '/dev/zero', '/dev/urandom')}
answer['new file in /dev'] = attempt(lambda: open('/dev/fill', 'wb').write(b'x' * 4096))
answer['/dev/shm over its cap'] = attempt(lambda: open('/dev/shm/big', 'wb').write(b'x' * (8 << 20)))
answer['write /dev/null'] = attempt(lambda: open('/dev/null', 'w').write('ok'))
""")
    assert r.ok, r
    assert r.answer == {"/dev/null": "PermissionError", "/dev/zero": "PermissionError",
                        "/dev/urandom": "PermissionError", "new file in /dev": "OSError",
                        "/dev/shm over its cap": "OSError", "write /dev/null": "DONE"}, r.answer
    assert {d: os.stat(d).st_mode for d in before} == before
    _escape("chmod host device nodes; fill /dev", "not their owner; read-only /dev; /dev/shm tmpfs size",
            time.monotonic() - t0)
    _still_works(sandbox)


def _copy_of_true_as(sb: Sandbox) -> str:
    """Code that plants an executable with the setuid and setgid bits in a directory it opened to all."""
    return f"""
import os
def attempt(fn):
    try:
        fn()
        return 'DONE'
    except OSError as exc:
        return type(exc).__name__
chmod_ws = attempt(lambda: os.chmod('/workspace', 0o755))
os.makedirs('pub', exist_ok=True)
os.chmod('pub', 0o755)
with open('pub/suid', 'wb') as f:
    f.write(open({os.path.realpath(sys.executable)!r}, 'rb').read())
os.chmod('pub/suid', 0o6755)
answer = [chmod_ws, oct(os.stat('pub/suid').st_mode & 0o7777)]
"""


def test_escape_plant_a_setuid_binary(sandbox: Sandbox):
    """A setuid/setgid executable planted in the workspace runs for nobody else: it is not root's, the
    workspace's root cannot be opened up (root host) or its parent is private, the filesystem is nosuid and
    noexec (root host), and another local user cannot even reach it (checked by running as one)."""
    t0 = time.monotonic()
    r = sandbox.run(_copy_of_true_as(sandbox))
    assert r.ok, r
    chmod_ws, mode = r.answer
    planted = sandbox.workspace / "pub" / "suid"
    st = planted.stat()
    assert st.st_uid != 0 and st.st_uid == _sandbox_fs.sandbox_ids()[0]
    parent = sandbox.workspace.parent.stat()
    assert parent.st_mode & 0o077 == 0  # the private parent: nobody else may enter
    if ROOT:
        assert chmod_ws == "PermissionError" and oct(sandbox.workspace.stat().st_mode & 0o777) == "0o770"
        flags = os.statvfs(sandbox.workspace).f_flag
        assert flags & os.ST_NOSUID and flags & os.ST_NOEXEC
        other = _sandbox_fs.SANDBOX_ID_LAST + 1  # an id no account has, not the sandbox's
        run = subprocess.run(["setpriv", f"--reuid={other}", f"--regid={other}", "--clear-groups", "--", str(planted),
                              "-c", "import os; print(os.geteuid())"], capture_output=True, text=True, check=False)
        assert run.returncode != 0 and "Permission denied" in run.stderr, run
    _escape(f"plant a setuid binary (mode {mode})", "sandbox uid, private parent, nosuid/noexec tmpfs",
            time.monotonic() - t0)
    _still_works(sandbox)


# --- the workspace's disk --------------------------------------------------------------------------------

def test_escape_fill_the_workspace_disk(sandbox: Sandbox):
    """fallocate of a GiB and many files under the per-file limit: the workspace is a tmpfs of
    ``workspace_bytes`` (root host), so the host's disk does not move."""
    free = os.statvfs(sandbox.workspace.parent.parent)
    before = free.f_bavail * free.f_frsize
    t0 = time.monotonic()
    r = sandbox.run("""
import os
def attempt(fn):
    try:
        fn()
        return 'DONE'
    except OSError as exc:
        return exc.strerror
def many():
    for i in range(64):
        with open(f'f{i}', 'wb') as f:
            f.write(b'x' * (512 << 10))
def inodes():
    for i in range(5000):
        open(f'n{i}', 'w').close()
fd = os.open('big', os.O_CREAT | os.O_WRONLY)
answer = {'fallocate 1 GiB': attempt(lambda: os.posix_fallocate(fd, 0, 1 << 30)), 'many files': attempt(many),
          'inodes': attempt(inodes)}
""")
    assert r.ok, r
    after = os.statvfs(sandbox.workspace.parent.parent)
    grew = before - after.f_bavail * after.f_frsize
    if ROOT:
        assert r.answer == {"fallocate 1 GiB": "File too large", "many files": "No space left on device",
                            "inodes": "No space left on device"}, r.answer
        ws = os.statvfs(sandbox.workspace)
        assert ws.f_blocks * ws.f_frsize <= LIMITS.workspace_bytes
        assert grew < 64 << 20, grew  # the host's temp disk: unmoved (other work aside)
    else:
        assert r.answer["fallocate 1 GiB"] == "File too large"  # RLIMIT_FSIZE only, as a normal user
    _escape("fallocate 1 GiB / many files in the workspace", "RLIMIT_FSIZE; workspace tmpfs size and inodes",
            time.monotonic() - t0)
    _still_works(sandbox)


# --- what comes back -------------------------------------------------------------------------------------

@pytest.mark.parametrize("forged", [b"[1, 2]", b'{"error": 5, "answer_repr": false, "answer": 1}',
                                    b'{"answer": 1}', b"[" * 5000 + b"]" * 5000, b"\xff\xfe not json"])
def test_a_forged_result_is_an_error_observation(sandbox: Sandbox, forged: bytes):
    """The code writes its result fd itself and exits: the host reports it, never raises."""
    r = sandbox.run("import os, sys\nrfd = int(sys.argv[6]) if sys.argv[1] == 'call' else 3\n"  # the result fd
                    f"os.write(rfd, {forged!r})\nos._exit(0)")
    assert not r.ok and "result" in r.error and r.answer is None, r
    _still_works(sandbox)


def test_an_answer_nested_deeper_than_the_cap_is_an_error(sandbox: Sandbox):
    r = sandbox.run("a = []\nfor _ in range(300):\n    a = [a]\nanswer = a")
    assert not r.ok and "nests deeper than 100" in r.error and r.answer is None, r
    r = sandbox.run("a = []\nfor _ in range(90):\n    a = [a]\nanswer = a")
    assert r.ok and r.answer is not None
    _still_works(sandbox)


# --- removal -----------------------------------------------------------------------------------------------

def test_a_deep_tree_is_removed_and_close_never_recurses(mode: bool):
    """A directory tree 5,000 deep (the code's doing) goes with the sandbox, without RecursionError."""
    sb = Sandbox(limits=dataclasses.replace(LIMITS, workspace_files=8_000), zygote=mode)
    r = sb.run("import os\nfor i in range(5000):\n    os.mkdir('d')\n    os.chdir('d')\nos.chmod('.', 0)\n"
               "answer = i + 1")
    assert r.ok and r.answer == 5000, r
    ws = sb.workspace
    t0 = time.monotonic()
    sb.close()
    assert not ws.exists() and not ws.parent.exists()
    _escape("a directory tree 5,000 deep", "iterative removal (a tmpfs unmount on a root host)", time.monotonic() - t0)


def test_remove_tree_is_iterative_and_never_follows_symlinks(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    top = tmp_path / "tree"
    top.mkdir()
    (top / "link-file").symlink_to(outside / "keep")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # deeper than any path: made through directory fds
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(old)
    os.symlink(outside, "link", dir_fd=fd)
    os.mkdir("closed", 0, dir_fd=fd)
    os.close(fd)
    _sandbox_fs.remove_tree(str(top))
    assert not top.exists() and (outside / "keep").read_text() == "host file"


def test_episode_close_releases_the_fork_when_the_workspace_cleanup_fails(small_world_path, monkeypatch):
    world = TaskWorld.open(small_world_path)
    ep = Episode(make_instance("records.find_patient", 0, world), "codeact")
    ep.reset()
    fork = ep._fork
    assert fork is not None

    def fail() -> None:
        raise OSError("cannot remove the workspace")

    monkeypatch.setattr(ep.workspace, "close", fail)
    with pytest.raises(OSError, match="cannot remove"):
        ep.close()
    assert ep._fork is None and ep.workspace is None


# --- the host side of the FHIR functions -------------------------------------------------------------------

@pytest.fixture()
def episode(small_world_path):
    world = TaskWorld.open(small_world_path)
    with Episode(make_instance("records.find_patient", 0, world), "codeact") as ep:
        ep.reset()
        yield ep


_RAW = """
import json, os
cells = dict(zip(search.__closure__[0].cell_contents.__code__.co_freevars,
                 (c.cell_contents for c in search.__closure__[0].cell_contents.__closure__)))
wfd, rfd = cells['wfd'], cells['rfd']
def raw(data):
    os.write(wfd, data)
    out = b''
    while not out.endswith(b'\\n'):
        out += os.read(rfd, 1 << 16)
    return json.loads(out)
"""


def test_the_rpc_survives_any_request(episode: Episode):
    """Malformed requests get error replies; the same call's next FHIR function still works."""
    t0 = time.monotonic()
    out = episode.step({"name": "python", "arguments": {"code": _RAW + """
replies = [raw(line) for line in (b'{"op": "search", "args": [1]}\\n', b'not json\\n', b'[1, 2]\\n',
                                  b'{"op": 7, "args": {}}\\n', b'{"op": "read", "args": {}}\\n',
                                  b'{"op": "nope", "args": {"resource_type": "Patient"}}\\n',
                                  b'{"op": "search", "args": {"resource_type": "Patient", "params": {"x": {"y": 1}}}}\\n')]
answer = [sorted(r) for r in replies] + [len(search('Patient', {'_count': '1'})) >= 1]
"""}}).output
    assert out.get("error") is None, out
    assert out["answer"][:6] == [["error"]] * 6 and out["answer"][-1] is True, out
    _escape("malformed RPC requests", "every request validated; errors as replies", time.monotonic() - t0)


def test_rpc_work_stops_at_the_calls_deadline(episode: Episode, monkeypatch: pytest.MonkeyPatch):
    """A search of many slow pages: it stops at the call's deadline (between pages), the python call returns
    on time, and nothing is logged to the episode after it returned."""
    ws = episode.workspace
    assert ws is not None
    ws.sandbox.limits = SandboxLimits(wall_s=2.0)
    pages: list[float] = []
    real = _codeact._request

    def slow(ctx, fn, *args):
        pages.append(time.monotonic())
        time.sleep(0.25)
        return real(ctx, fn, *args)

    monkeypatch.setattr(_codeact, "_request", slow)
    t0 = time.monotonic()
    out = episode.step({"name": "python", "arguments": {"code": (
        "import time\ntry:\n    search('Observation', {'_count': '1'})\nexcept FhirError as exc:\n"
        "    print(exc)\ntime.sleep(60)")}}).output
    took = time.monotonic() - t0
    assert out.get("limit") == "wall", out
    logged = len(episode.calls)
    time.sleep(1.0)
    assert len(episode.calls) == logged and episode.calls[-1].name == "python"
    assert took < 2.0 + 2.0, took  # the wall clock, then at most the page in flight
    assert pages and pages[-1] - t0 < 2.0 + 0.5, pages[-1] - t0  # no page started well after the deadline
    assert not any(t.name == "fhirgym-codeact-rpc" for t in threading.enumerate())
    _escape(f"an RPC search of slow pages ({len(pages)} pages)", "the call's deadline, checked between pages",
            took)


def test_rpc_requests_and_reply_bytes_are_budgeted(episode: Episode, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_codeact, "MAX_RPC_REQUESTS", 40)
    t0 = time.monotonic()
    out = episode.step({"name": "python", "arguments": {"code": """
ok = errors = 0
last = ''
for i in range(100):
    try:
        read_resource('Patient', 'no-such-patient')
    except FhirError as exc:
        last = str(exc)
        errors += 1
answer = [errors, last]
"""}}).output
    assert out["answer"][0] == 100 and "used its 40 FHIR requests" in out["answer"][1], out
    assert sum(c.name == "getResourceById" for c in episode.calls) == 40
    monkeypatch.setattr(_codeact, "MAX_RPC_REPLY_BYTES", 2_000)
    out = episode.step({"name": "python", "arguments": {"code": """
got = []
for i in range(20):
    try:
        got.append(len(search('Patient', {'_count': '5'})))
    except FhirError as exc:
        got.append(str(exc))
answer = got
"""}}).output
    assert any("MiB of FHIR results" in str(g) for g in out["answer"]), out
    _escape("100 RPC requests; a reply budget", "MAX_RPC_REQUESTS, MAX_RPC_REPLY_BYTES per python call",
            time.monotonic() - t0)


def test_the_runner_bounds_tool_calls_per_episode(small_world_path):
    """Every evaluation episode has a step limit by default; calls past it are refused, not run."""
    import inspect

    import orjson

    from fhirgym.agents import ReactAgent, ScriptedBackend
    from fhirgym.runner import EpisodeKey

    assert inspect.signature(run_episode).parameters["max_steps"].default == runner_episode.DEFAULT_MAX_STEPS
    world = TaskWorld.open(small_world_path)
    inst = make_instance("records.find_patient", 0, world)
    call = orjson.dumps({"name": "searchResources", "arguments": {"resourceType": "Patient",
                                                                  "params": {"_count": "1"}}}).decode()
    agent = ReactAgent(ScriptedBackend([f"<tool_call>{call}</tool_call>" * 3] * 2 + ['<answer>{"found": false}</answer>']))
    _, transcript = run_episode(EpisodeKey("baseline", "records.find_patient", 0, 0, 1), inst, agent, max_steps=3)
    calls = transcript["tool_calls"]
    assert len(calls) == 6 and [c["error"] for c in calls[3:]] == ["step limit reached"] * 3, calls


@pytest.mark.skipif(not ROOT, reason="only a root host mounts")
def test_mounts_of_a_killed_host_are_swept_by_the_next_probe():
    """A host process killed with SIGKILL leaves its workspace tmpfs and stage binds; the next probe
    unmounts them and removes their directories."""
    child = subprocess.Popen([sys.executable, "-c", (
        "from fhirgym.tools import Sandbox\nimport sys, time\nsb = Sandbox()\nassert sb.run('answer = 1').ok\n"
        "print(sb.workspace, flush=True)\ntime.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        ws = Path(child.stdout.readline().strip())
        assert ws.is_dir() and str(child.pid) in ws.parent.name
    finally:
        child.kill()
        child.wait()

    def left() -> list[str]:
        return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if f"fhirgym-ws-{child.pid}" in line or f"fhirgym-stage-{child.pid}-" in line]

    assert left(), "the killed process left no mount: nothing to sweep"
    sandbox_probe(refresh=True)
    assert left() == [] and not ws.parent.exists()
