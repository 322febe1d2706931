"""The python tool's sandbox: normal behaviour, and the escape suite of issue 18.

Every escape must end in an error result within its limit, the next call in the same workspace must
still work, and the host must be unharmed: marker files outside unchanged, no process of the call left,
its cgroups removed. Each escape prints ``ESCAPE | what | stopped by | seconds`` (``pytest -s``).

The sandbox needs bubblewrap, libseccomp (pyseccomp) and writable cgroups; ``scripts/test.sh`` installs
bubblewrap. As root (CI) a missing layer fails these tests instead of skipping them: the protection
must be exercised. Only a non-root run without the layers is skipped, with the reason.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import fhirgym
from fhirgym.tools import (
    Sandbox,
    SandboxLimits,
    SandboxProbe,
    SandboxResult,
    SandboxUnavailable,
    _sandbox,
    _sandbox_fs,
    sandbox_available,
    sandbox_probe,
)

#: Tight limits keep every escape short; each test that needs a different one says so.
LIMITS = SandboxLimits(cpu_s=2, wall_s=10, memory_bytes=512 << 20, file_bytes=1 << 20, tmp_bytes=4 << 20,
                       output_bytes=64 << 10, pids=16)


@pytest.fixture(autouse=True, scope="module")
def _sandbox_required():
    p = sandbox_probe()
    if p.available:
        return
    why = "; ".join(p.missing)
    if os.geteuid() == 0:
        pytest.fail(f"the python sandbox must work here (root; scripts/test.sh installs bubblewrap): {why}")
    pytest.skip(f"python sandbox unavailable and not root, so it cannot be set up: {why}")


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """A host directory outside every workspace, with a marker file the escapes aim at."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "marker.txt").write_text("host marker")
    return d


@pytest.fixture(params=["zygote", "per-call"])
def sandbox(request: pytest.FixtureRequest, tmp_path: Path, outside: Path):
    """An episode's sandbox, in both modes (a zygote per episode, bwrap per call); closing it leaves no
    process and no cgroup behind."""
    with Sandbox(limits=LIMITS, zygote=request.param == "zygote") as sb:
        yield sb
        z = sb._zygote
        left = ([z.proc.pid], list(z.cgroup.dirs.values())) if z else ([], [])
    assert sb._zygote is None and not any(os.path.exists(d) for d in left[1])
    assert not any(os.path.exists(f"/proc/{pid}") for pid in left[0])
    assert (outside / "marker.txt").read_text() == "host marker"
    assert sorted(p.name for p in outside.iterdir()) == ["marker.txt"]


def _leftover_processes(call_id: str) -> list[int]:
    """Host processes of a call (its id is in the argv of sh, bwrap and the interpreter)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if call_id.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _host_unharmed(sb: Sandbox, r: SandboxResult) -> None:
    """No process of the call left (the episode's zygote aside), no per-call cgroup, and the next call in
    the workspace works."""
    assert r.call_id
    assert sb.processes() == [] and _leftover_processes(r.call_id) == []
    p = sandbox_probe()
    for parent in (p.cgroup_pids, p.cgroup_memory):
        assert parent and not os.path.exists(os.path.join(parent, r.call_id))
    nxt = sb.run("answer = 6 * 7")
    assert nxt.ok and nxt.answer == 42, nxt


def _escape(name: str, stopped_by: str, r: SandboxResult, within_s: float = LIMITS.wall_s) -> None:
    """Print the escape's row; it must have ended within its limit (the wall clock unless said: CPU-time
    limits take longer in wall time on a loaded machine)."""
    print(f"\nESCAPE | {name} | {stopped_by} | {r.duration_s:.2f} s")
    assert r.duration_s < within_s, r


# --- normal behaviour ------------------------------------------------------------------------------------


def test_probe_reports_every_layer():
    p = sandbox_probe()
    assert sandbox_available() and p.available and p.missing == ()
    assert p.bwrap and p.namespaces and p.seccomp and p.cgroup_pids and p.cgroup_memory
    assert p.to_json()["available"] is True


def test_stdout_answer_and_inputs(sandbox: Sandbox):
    resources = {"Observation": [{"resourceType": "Observation", "id": "o1", "valueQuantity": {"value": 7.5}}],
                 "Patient": [{"resourceType": "Patient", "id": "p1"}]}
    r = sandbox.run("print('types', sorted(retrieved_resources))\n"
                    "answer = sum(o['valueQuantity']['value'] for o in retrieved_resources['Observation'])",
                    {"retrieved_resources": resources})
    assert r.ok and r.error is None and r.limit is None
    assert r.stdout == "types ['Observation', 'Patient']\n"
    assert r.answer == 7.5 and not r.answer_repr
    assert r.protections == _sandbox.PROTECTIONS
    assert r.to_json() == {"stdout": r.stdout, "answer": 7.5}


def test_answer_values_json_or_repr(sandbox: Sandbox):
    value = {"s": "naïve \"q\" \n \u2603 \U0001f600", "i": -(10**30), "f": 0.1, "e": 1e-300, "b": [True, False, None],
             "t": (1, [2.5, {"x": []}]), 3: "int key", 1.5: "float key", True: "bool key", None: "none key"}
    r = sandbox.run(f"answer = {value!r}")
    assert r.ok and not r.answer_repr and r.answer == json.loads(json.dumps(value)), r
    r = sandbox.run("answer = [float('nan')]")
    assert r.answer == "[nan]" and r.answer_repr
    r = sandbox.run("a = []\na.append(a)\nanswer = a")
    assert r.ok and r.answer == "[[...]]" and r.answer_repr
    r = sandbox.run("import datetime\nanswer = {'ids': {'b', 'a'}, 'at': datetime.datetime(2024, 1, 2, 3, 4)}")
    assert r.answer == {"ids": ["a", "b"], "at": "2024-01-02T03:04:00"}
    r = sandbox.run("class P:\n    def __repr__(self): return 'P()'\nanswer = P()")
    assert r.ok and r.answer == "P()" and r.answer_repr
    assert sandbox.run("print('no answer')").answer is None


def test_exception_traceback_names_the_code_lines(sandbox: Sandbox):
    r = sandbox.run("print('before')\ndef f(x):\n    return 1 / x\nf(0)")
    assert not r.ok and r.stdout == "before\n"
    assert 'File "<python>", line 4, in <module>' in r.error
    assert 'File "<python>", line 3, in f' in r.error
    assert r.error.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "fhirgym-sandbox-boot" not in r.error and "<fhirgym-boot>" not in r.error
    r = sandbox.run("x = (")
    assert "SyntaxError" in r.error
    assert sandbox.run("import sys\nsys.exit(0)").ok
    assert sandbox.run("import sys\nsys.exit(3)").error == "SystemExit: 3"


def test_workspace_persists_between_calls_but_variables_do_not(sandbox: Sandbox):
    r = sandbox.run("import os\nopen('notes.txt', 'w').write('kept')\ny = 1\nanswer = os.getcwd()")
    assert r.ok and r.answer == _sandbox.WORKSPACE
    assert (sandbox.workspace / "notes.txt").read_text() == "kept"
    r = sandbox.run("answer = open('/workspace/notes.txt').read()")
    assert r.answer == "kept"
    assert "NameError" in sandbox.run("y").error  # a fresh interpreter per call


def test_environment_is_cleared(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FHIRGYM_SECRET_TOKEN", "s3cret")
    r = sandbox.run("import os\nanswer = dict(os.environ)")
    assert r.answer == {"LANG": "C.UTF-8", "HOME": "/workspace", "TMPDIR": "/tmp", "PWD": "/workspace"}


def test_inputs_must_be_json_values(sandbox: Sandbox):
    with pytest.raises(TypeError, match="JSON values"):
        sandbox.run("pass", {"x": object()})


def test_host_file_helpers_never_follow_planted_symlinks(sandbox: Sandbox, outside: Path):
    sandbox.write_file("Observation.json", "[]")
    r = sandbox.run(f"import os\nos.remove('Observation.json')\nos.symlink({str(outside / 'marker.txt')!r}, "
                    "'Observation.json')\nos.mkfifo('fifo')")
    assert r.ok, r
    sandbox.write_file("Observation.json", '[{"id": "o1"}]')  # replaces the symlink, not the marker
    sandbox.write_file("fifo", "x")  # a FIFO would block an ordinary open
    assert (outside / "marker.txt").read_text() == "host marker"
    assert sandbox.read_file("Observation.json") == b'[{"id": "o1"}]'
    sandbox.run(f"import os\nos.symlink({str(outside / 'marker.txt')!r}, 'link')")
    with pytest.raises(OSError):
        sandbox.read_file("link")
    with pytest.raises(ValueError):
        sandbox.write_file("../escape.txt", "x")


def test_unavailable_refuses_unless_unsafe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    missing = SandboxProbe(missing=("bubblewrap (bwrap) not found: install it with `bash scripts/_sandbox.sh`",))
    monkeypatch.setattr(_sandbox, "sandbox_probe", lambda refresh=False: missing)
    with Sandbox(limits=LIMITS) as sb, pytest.raises(SandboxUnavailable, match=r"bwrap.*--unsafe-python"):
        sb.run("answer = 1")
    with Sandbox(limits=LIMITS, unsafe=True) as sb:  # explicit: a plain process with rlimits only
        r = sb.run("import os\nanswer = os.getcwd()")
        assert r.ok and r.answer == str(sb.workspace) and r.protections == ("rlimits",)


def test_workspace_is_private_and_unsafe_mode_kills_forked_children(monkeypatch):
    with Sandbox(limits=LIMITS) as sb:
        st = sb.workspace.parent.stat()  # only the sandbox's uid (and root) may enter
        assert oct(st.st_mode & 0o777) == "0o700" and (st.st_uid, st.st_gid) == _sandbox_fs.sandbox_ids()
    monkeypatch.setattr(Sandbox, "protections", lambda self: ("rlimits",))
    with Sandbox(limits=LIMITS, unsafe=True) as sb:
        r = sb.run("import os, time\nif os.fork() == 0:\n    time.sleep(3600)\nanswer = 1")
        assert r.ok and r.protections == ("rlimits",)
        time.sleep(0.1)
        assert _leftover_processes(r.call_id) == []  # the process group went


def test_a_given_workspace_dir_must_be_reachable_and_private(tmp_path: Path):
    """A caller's directory: refused with the reason where the sandbox's uid cannot reach it (root host) or
    its parent is not private (normal user); else the workspace is there (on a root host, a tmpfs for the
    sandbox's life)."""
    if os.geteuid() == 0:
        with pytest.raises(ValueError, match=r"not reachable by the sandbox's uid \d+.*pytest-of-root is closed"):
            Sandbox(tmp_path / "ws", LIMITS)
        base = Path(tempfile.mkdtemp())
        base.chmod(0o711)  # searchable, not listable
    else:
        open_parent = tmp_path / "open"
        open_parent.mkdir(mode=0o755)
        open_parent.chmod(0o755)
        with pytest.raises(ValueError, match="must be private"):
            Sandbox(open_parent / "ws", LIMITS)
        base = tmp_path
    try:
        with Sandbox(base / "ws", LIMITS) as sb:
            assert sb.run("open('f', 'w').write('x')").ok and (base / "ws" / "f").read_text() == "x"
        assert (base / "ws").is_dir()
        assert list((base / "ws").iterdir()) == ([] if os.geteuid() == 0 else [base / "ws" / "f"])
    finally:
        _sandbox_fs.remove_tree(str(base)) if os.geteuid() == 0 else None


def test_episodes_in_parallel_threads(tmp_path: Path):
    """The runner runs episodes in threads: each sandbox keeps to its own workspace and answers."""
    from concurrent.futures import ThreadPoolExecutor

    def episode(i: int) -> list[object]:
        with Sandbox(limits=LIMITS) as sb:
            return [sb.run(f"import os\nopen('mine', 'a').write('{i}')\nanswer = open('mine').read()").answer
                    for _ in range(3)]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(episode, range(4))) == [[str(i), str(i) * 2, str(i) * 3] for i in range(4)]


def test_own_temporary_workspace_is_removed():
    with Sandbox(limits=LIMITS) as sb:
        assert sb.run("open('f', 'w').write('x')").ok
        ws = sb.workspace
        # a root host's workspace is a tmpfs whose root only root and the sandbox's group may enter
        assert (ws / "f").exists() and oct(ws.stat().st_mode & 0o777) == ("0o770" if os.geteuid() == 0 else "0o700")
    assert not ws.exists() and not ws.parent.exists()


# --- the escape suite ------------------------------------------------------------------------------------

_ATTEMPT = """
import os
def attempt(fn):
    try:
        fn()
        return "DONE"
    except BaseException as exc:
        return type(exc).__name__
"""


def test_escape_write_outside_workspace(sandbox: Sandbox, outside: Path):
    targets = ["/escape.txt", "/usr/lib/escape.txt", "/workspace/../escape.txt", str(outside / "marker.txt"),
               str(outside / "new.txt"), str(Path(fhirgym.__file__).parent / "escape.txt")]
    r = sandbox.run(_ATTEMPT + "answer = {t: attempt(lambda t=t: open(t, 'w').write('x')) for t in targets}\n"
                    f"open({str(outside / 'marker.txt')!r}, 'w').write('pwned')", {"targets": targets})
    assert not r.ok and ("FileNotFoundError" in r.error or "OSError" in r.error)
    # answer is only sent when the code ends; this one ended in an error, so ask again for the table
    r2 = sandbox.run(_ATTEMPT + "answer = {t: attempt(lambda t=t: open(t, 'w').write('x')) for t in targets}",
                     {"targets": targets})
    assert set(r2.answer) == set(targets) and "DONE" not in r2.answer.values(), r2.answer
    _escape("write outside the workspace", "mount namespace: nothing else mounted, root read-only", r)
    _host_unharmed(sandbox, r)


def test_escape_read_another_episodes_workspace(sandbox: Sandbox, tmp_path: Path):
    with Sandbox(limits=LIMITS) as other:
        assert other.run("open('secret.txt', 'w').write('episode b')").ok
        secret = other.workspace / "secret.txt"
        r = sandbox.run(f"import os\nprint(sorted(os.listdir('/')))\nopen({str(secret)!r}).read()")
        assert not r.ok and "FileNotFoundError" in r.error
        exe_top = Path(_sandbox._interpreter()[0]).parts[1]  # e.g. usr, or root for a pyenv interpreter
        allowed = {"dev", "proc", "tmp", "workspace", "usr", "lib", "lib64", "lib32", "fhirgym-boot.pyc", exe_top}
        assert set(ast.literal_eval(r.stdout)) <= allowed, r.stdout
        assert secret.read_text() == "episode b"
    _escape("read another episode's workspace", "mount namespace: other workspaces not mounted", r)
    _host_unharmed(sandbox, r)


def test_escape_read_world_file(sandbox: Sandbox, tmp_path: Path):
    world = tmp_path / "home" / ".cache" / "fhirgym" / "worlds" / "world-seed1.sqlite"
    world.parent.mkdir(parents=True)
    world.write_bytes(b"SQLite format 3\x00 stand-in for a world file")
    paths = [str(world)]
    real = Path.home() / ".cache" / "fhirgym"  # the real cache too, when this machine has one
    if real.is_dir():
        paths += [str(p) for p in sorted(real.rglob("*"))[:50] if p.is_file()]
    r = sandbox.run(_ATTEMPT + "answer = {p: attempt(lambda p=p: open(p, 'rb').read(16)) for p in paths}",
                    {"paths": paths})
    assert r.ok and set(r.answer) == set(paths) and set(r.answer.values()) == {"FileNotFoundError"}, r
    r = sandbox.run(f"open({str(world)!r}, 'rb').read()")
    assert "FileNotFoundError" in r.error
    _escape("read the world file", "mount namespace: ~/.cache/fhirgym not mounted", r)
    _host_unharmed(sandbox, r)


def test_nothing_of_the_project_or_venv_is_mounted():
    root = Path(fhirgym.__file__).resolve().parents[2]
    with Sandbox(limits=LIMITS) as sb:
        argv = sb._argv(_sandbox.PROTECTIONS, 4, [_sandbox.BOOT_PATH, "zygote", "3"])
        staged = {v: k for k, v in _sandbox_fs.STAGE.binds.items()}  # binds of what the sandbox uid cannot reach
        sources = [staged.get(argv[i + 1], argv[i + 1]) for i, a in enumerate(argv) if a in ("--ro-bind", "--bind")]
        assert [s for s in sources if s.startswith(tempfile.gettempdir() + "/")] == [_sandbox._boot_pyc(),
                                                                                     str(sb.workspace)]
    assert not any(s.startswith(str(root) + "/") for s in sources), sources
    if sys.prefix != sys.base_prefix:
        assert not any(s.startswith(sys.prefix + "/") for s in sources), sources
    assert not any(s.startswith(str(Path.home() / ".cache")) for s in sources), sources


def test_escape_read_project_tree(sandbox: Sandbox):
    root = Path(fhirgym.__file__).resolve().parents[2]
    paths = [str(Path(fhirgym.__file__).resolve()), str(root / "pyproject.toml"), sys.executable,
             str(Path(pytest.__file__).resolve()), "/etc/passwd", "/root/.bashrc"]  # pytest: in site-packages
    r = sandbox.run(_ATTEMPT + "answer = {p: attempt(lambda p=p: os.listdir(p) if os.path.isdir(p) else "
                    "open(p, 'rb').read(1)) for p in paths}\nimport fhirgym", {"paths": paths})
    assert "ModuleNotFoundError: No module named 'fhirgym'" in r.error
    r2 = sandbox.run(_ATTEMPT + "answer = {p: attempt(lambda p=p: open(p, 'rb').read(1)) for p in paths}",
                     {"paths": paths})
    assert set(r2.answer.values()) == {"FileNotFoundError"}, r2.answer
    assert "ModuleNotFoundError" in sandbox.run("import orjson").error  # site-packages hidden
    _escape("read the project tree", "mount namespace: only the interpreter and its stdlib mounted", r)
    _host_unharmed(sandbox, r)


@pytest.fixture()
def tcp_server():
    """A loopback server that counts the connections it accepts (it must get none)."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.1)
    accepted: list[object] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                accepted.append(conn)
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join(2)
    srv.close()


_CONNECT = """
import ctypes, errno, socket
def tcp():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(("127.0.0.1", port))
def raw():  # the syscall itself, past the socket module
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(41, 2, 1, 0) < 0:
        raise OSError(ctypes.get_errno(), errno.errorcode[ctypes.get_errno()])
def uring():  # io_uring's ops can open sockets too
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    if libc.syscall(425, 8, params) < 0:
        raise OSError(ctypes.get_errno(), errno.errorcode[ctypes.get_errno()])
def unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(unix_path)
"""


def test_escape_open_socket(sandbox: Sandbox, tcp_server, tmp_path: Path):
    port, accepted = tcp_server
    unix_path = str(tmp_path / "host.sock")
    usrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    usrv.bind(unix_path)
    usrv.listen(1)
    try:
        r = sandbox.run(_ATTEMPT + _CONNECT + "answer = {f.__name__: attempt(f) for f in (raw, uring, unix)}\n"
                        "tcp()", {"port": port, "unix_path": unix_path})
        assert "PermissionError: [Errno 1] Operation not permitted" in r.error
        r2 = sandbox.run(_ATTEMPT + _CONNECT + "answer = {f.__name__: attempt(f) for f in (tcp, raw, uring, unix)}",
                         {"port": port, "unix_path": unix_path})
        assert r2.answer == {"tcp": "PermissionError", "raw": "PermissionError", "uring": "PermissionError",
                             "unix": "PermissionError"}, r2.answer
    finally:
        usrv.close()
    assert accepted == []
    _escape("open a socket (AF_INET to the host's loopback server, AF_UNIX, raw syscall, io_uring)",
            "seccomp (EPERM on socket, io_uring_setup); behind it an empty network namespace", r)
    _host_unharmed(sandbox, r)


def test_network_namespace_alone_blocks_loopback(sandbox: Sandbox, tcp_server, monkeypatch: pytest.MonkeyPatch):
    """Defence in depth: without the seccomp layer, the netns (loopback down, no routes) still stops TCP."""
    port, accepted = tcp_server
    monkeypatch.setattr(Sandbox, "protections", lambda self: tuple(p for p in _sandbox.PROTECTIONS if p != "seccomp"))
    r = sandbox.run(_ATTEMPT + _CONNECT + "answer = attempt(tcp)", {"port": port, "unix_path": ""})
    assert r.ok and r.answer in ("OSError", "ConnectionRefusedError"), r
    assert accepted == []


def test_escape_subprocess_and_fork_bomb(sandbox: Sandbox):
    r = sandbox.run("import subprocess, sys\nanswer = subprocess.run([sys.executable, '-c', 'print(7)'], "
                    "capture_output=True, text=True).stdout")
    assert r.ok and r.answer == "7\n"  # a subprocess is allowed; it is inside the same limits
    assert "FileNotFoundError" in sandbox.run("import subprocess\nsubprocess.run(['sh', '-c', 'id'])").error
    r = sandbox.run("import os\nwhile True:\n    os.fork()")
    assert not r.ok and "BlockingIOError" in r.error and r.limit == "pids", r
    _escape("fork bomb", f"pids cgroup (pids.max={LIMITS.pids})", r)
    _host_unharmed(sandbox, r)


def test_processes_left_behind_die_with_the_call(sandbox: Sandbox):
    r = sandbox.run("import os, time\nif os.fork() == 0:\n    time.sleep(3600)\nanswer = 'parent done'")
    assert r.ok and r.answer == "parent done"
    _host_unharmed(sandbox, r)  # the sleeping child went with the pid namespace


def test_escape_kill_or_inspect_the_zygote(tmp_path: Path):
    """The episode's zygote (the parent of each call) is not dumpable: its memory and fds stay closed to the
    code; killing it ends only this call, and the next call starts a new sandbox."""
    with Sandbox(limits=LIMITS) as sandbox:  # the default mode: a zygote per episode
        r = sandbox.run(_ATTEMPT + "p = os.getppid()\nanswer = {n: attempt(lambda n=n: open(f'/proc/{p}/{n}', 'rb').read(1))"
                        " for n in ('mem', 'environ', 'fd/0')} | {'fds': sorted(os.listdir('/proc/self/fd'))}")
        assert r.ok and r.answer == {"mem": "PermissionError", "environ": "PermissionError", "fd/0": "PermissionError",
                                     "fds": ["0", "1", "2", "3", "4"]}, r.answer  # 4: the listing itself
        r = sandbox.run("import os, signal\nprint('bye', flush=True)\nos.kill(os.getppid(), signal.SIGKILL)\n"
                        "import time\ntime.sleep(60)")
        assert not r.ok and sandbox._zygote is None, r
        _escape("kill the episode's zygote", "the sandbox dies with it; the next call starts a new one", r)
        _host_unharmed(sandbox, r)


def test_tmp_persists_within_the_episode_only(sandbox: Sandbox, tmp_path: Path):
    assert sandbox.run("open('/tmp/scratch', 'w').write('x')").ok
    r = sandbox.run("answer = open('/tmp/scratch').read()")
    assert r.answer == "x" if sandbox.zygote else "FileNotFoundError" in r.error  # per-call: /tmp per call
    with Sandbox(limits=LIMITS) as other:
        assert "FileNotFoundError" in other.run("open('/tmp/scratch')").error


def test_escape_10gb_allocation(sandbox: Sandbox):
    r = sandbox.run("x = bytearray(10 * 2**30)")
    assert not r.ok and r.error.rstrip().endswith("MemoryError") and r.limit == "memory"
    _escape("10 GB allocation", f"RLIMIT_AS ({LIMITS.memory_bytes >> 20} MiB): MemoryError", r)
    _host_unharmed(sandbox, r)


def test_escape_memory_growth_past_the_cgroup(tmp_path: Path):
    """Touched pages past the memory cgroup's limit (RLIMIT_AS set higher) end in an OOM kill of the call."""
    limits = SandboxLimits(cpu_s=5, wall_s=15, memory_bytes=256 << 20, address_space_bytes=2 << 30, pids=16)
    with Sandbox(limits=limits) as sb:
        r = sb.run("chunks = []\nwhile True:\n    chunks.append(b'x' * (16 << 20))")
        assert not r.ok and r.limit == "memory" and "memory limit exceeded" in r.error, r
        assert r.peak_memory_bytes and r.peak_memory_bytes <= (256 << 20) + _sandbox.ZYGOTE_MEMORY
        _escape("memory growth in touched pages", "memory cgroup (256 MiB): OOM kill", r, 10)
        _host_unharmed(sb, r)


def test_escape_infinite_loop(tmp_path: Path):
    """CPU time, not wall time: a generous wall clock, so a loaded machine cannot turn it into a wall kill."""
    with Sandbox(limits=SandboxLimits(cpu_s=1, wall_s=60)) as sb:
        r = sb.run("while True:\n    pass")
        assert not r.ok and r.limit == "cpu" and "CPU time limit of 1 s exceeded" in r.error, r
        _escape("infinite loop", "RLIMIT_CPU (1 s): SIGXCPU", r, 60)
        _host_unharmed(sb, r)
        r = sb.run("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass")
        assert not r.ok and r.limit == "cpu" and "killed" in r.error, r
        _escape("infinite loop ignoring SIGXCPU", "RLIMIT_CPU hard limit (+1 s): SIGKILL", r, 60)
        _host_unharmed(sb, r)


def test_escape_sleep_forever(tmp_path: Path):
    with Sandbox(limits=SandboxLimits(wall_s=1.0)) as sb:
        r = sb.run("import time\ntime.sleep(3600)")
        assert r.timed_out and r.limit == "wall" and "wall-clock limit exceeded" in r.error
        _escape("sleep forever", "wall clock (1 s): SIGKILL to bwrap, pid namespace torn down", r, 3)
        _host_unharmed(sb, r)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_escape_gigabyte_of_output(sandbox: Sandbox, stream: str):
    t0 = time.monotonic()
    r = sandbox.run(f"import sys\nfor _ in range(16384):\n    sys.{stream}.write('x' * 65536)")  # 1 GiB
    assert not r.ok and r.limit == "output" and r.truncated
    assert len(r.stdout) + len(r.stderr) == LIMITS.output_bytes
    assert time.monotonic() - t0 < LIMITS.wall_s
    _escape(f"1 GB of {stream}", f"output cap ({LIMITS.output_bytes >> 10} KiB read, then SIGKILL)", r)
    _host_unharmed(sandbox, r)


def test_escape_huge_answer(sandbox: Sandbox):
    r = sandbox.run("answer = 'x' * (10 << 20)")
    assert not r.ok and r.limit == "output" and "the answer" in r.error and r.answer is None
    _escape("10 MB answer", f"result cap ({LIMITS.output_bytes >> 10} KiB read, then SIGKILL)", r)
    _host_unharmed(sandbox, r)


def test_stale_cgroups_of_dead_hosts_are_swept():
    p = sandbox_probe()
    dead = 2**22 + 12345  # above the default pid_max: no such process
    stale = [os.path.join(parent, f"fhirgym-sandbox-{dead}-1") for parent in (p.cgroup_pids, p.cgroup_memory)]
    for d in stale:
        os.mkdir(d)
    assert sandbox_probe(refresh=True).available
    assert not any(os.path.exists(d) for d in stale)


def test_escape_fill_the_disk(sandbox: Sandbox):
    r = sandbox.run("open('big.bin', 'wb').write(b'x' * (10 << 20))")
    assert "File too large" in r.error  # RLIMIT_FSIZE: EFBIG (Python ignores SIGXFSZ)
    assert (sandbox.workspace / "big.bin").stat().st_size <= LIMITS.file_bytes
    r = sandbox.run("for i in range(16):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (512 << 10))")
    assert "No space left on device" in r.error  # the private /tmp is a small tmpfs
    _escape("fill the disk (workspace file, /tmp)", "RLIMIT_FSIZE; tmpfs size", r)
    _host_unharmed(sandbox, r)
