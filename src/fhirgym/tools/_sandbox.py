"""Code sandbox for the agents' ``python`` tool: a fresh process per call, in the episode's workspace.

Why processes inside bubblewrap, not ``exec``: the model's code is untrusted. Each call runs a new
``python -I -S`` under layers that each stop a class of escape: bubblewrap namespaces with an empty root of
read-only binds and the workspace, seccomp (no sockets, ``io_uring``, ``ptrace``), cgroups (pids, memory),
rlimits, and the host's wall clock and output cap (docs/SANDBOX.md: threat model, what blocks what). By
default an episode starts bwrap once with a *zygote* interpreter that forks each call. Hand-written because
no maintained wrapper covers these bwrap options, the PyPI cgroup libraries are v1-only, and
``Popen.communicate`` has no byte cap. A layer that cannot be set up raises :class:`SandboxUnavailable`
unless ``unsafe=True`` (then ``SandboxResult.protections`` lists what ran); never a bare ``exec``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import itertools
import json
import marshal
import os
import py_compile
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import _sandbox_fs as fs

#: Where the workspace appears inside the sandbox (also the working directory and HOME).
WORKSPACE = "/workspace"
#: Where the compiled bootstrap appears inside (read-only).
BOOT_PATH = "/fhirgym-boot.pyc"

#: Syscalls that fail with EPERM inside: the network, and kernel surface no analysis code needs.
DENIED_SYSCALLS = (
    "socket", "socketcall", "io_uring_setup", "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open", "keyctl",
    "add_key", "request_key", "userfaultfd", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "open_by_handle_at", "name_to_handle_at", "reboot", "swapon",
    "swapoff", "syslog",
)

#: Every protection a full sandbox has; ``SandboxResult.protections`` lists those a call ran under.
#: ``unprivileged`` (the code is not root on the host) and ``workspace-quota`` (a size-capped tmpfs) come
#: from a root host's sandbox uid and mounts; a normal user's code is that user, on a plain directory.
PROTECTIONS = ("bwrap", "seccomp", "cgroup-pids", "cgroup-memory", "rlimits", "unprivileged", "workspace-quota")

#: The whole environment bwrap (and everything before it in the chain, started in ``/``) gets: nothing of
#: the host's. Inside, the code gets only LANG, HOME and TMPDIR (``--clearenv`` then ``--setenv``).
_ENV = {"LANG": "C.UTF-8"}

#: The deepest answer the host takes back (orjson, which writes results and logs, stops at 255 levels).
MAX_ANSWER_DEPTH = 100


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. ``memory_bytes`` bounds all processes of the call together (memory cgroup,
    tmpfs pages included); ``address_space_bytes`` each process (RLIMIT_AS, default ``memory_bytes``),
    which turns a big allocation into a ``MemoryError`` the code can see rather than an OOM kill."""

    cpu_s: int = 10
    wall_s: float = 20.0
    memory_bytes: int = 1 << 30
    address_space_bytes: int | None = None
    file_bytes: int = 64 << 20  # RLIMIT_FSIZE: one file, in the workspace or /tmp
    tmp_bytes: int = 64 << 20  # size of the private /tmp (and /dev/shm)
    workspace_bytes: int = 256 << 20  # size of the workspace's tmpfs (root hosts), host-written files included
    workspace_files: int = 16_384  # inodes of the workspace's tmpfs (files and directories)
    output_bytes: int = 1 << 20  # stdout + stderr read before the call is killed; also caps the answer
    pids: int = 32  # processes and threads of the call, bwrap's own 3 included
    open_files: int = 256


@dataclass
class SandboxResult:
    """The outcome of one call. ``error`` is the traceback of an exception, or the limit that ended the
    call (``limit`` names it: wall, cpu, memory, output, pids); ``answer`` is the JSON value of the code's
    ``answer`` variable (``answer_repr`` marks a ``repr`` string for values JSON cannot hold)."""

    stdout: str = ""
    stderr: str = ""
    answer: Any = None
    answer_repr: bool = False
    error: str | None = None
    limit: str | None = None
    timed_out: bool = False
    truncated: bool = False
    exit_code: int | None = None
    duration_s: float = 0.0
    protections: tuple[str, ...] = ()
    call_id: str = ""
    peak_memory_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        """The observation an agent sees: empty fields left out."""
        out: dict[str, Any] = {"stdout": self.stdout}
        if self.stderr:
            out["stderr"] = self.stderr
        if self.answer is not None:
            out["answer"] = self.answer
        if self.error is not None:
            out["error"] = self.error
        if self.truncated:
            out["truncated"] = True
        return out


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be set up here; the message names what is missing and how to get it."""


@dataclass(frozen=True)
class SandboxProbe:
    """What works on this machine (``sandbox_probe()``): each layer, and what is missing for a full sandbox."""

    bwrap: str | None = None
    namespaces: bool = False
    seccomp: bool = False
    cgroup_pids: str | None = None  # parent directory of the per-call cgroups
    cgroup_memory: str | None = None
    setpriv: str | None = None  # root hosts: what drops the sandbox to its uid/gid
    uid: int | None = None  # the host uid/gid the code runs as
    gid: int | None = None
    workspace_quota: bool = False  # each workspace is a size-capped tmpfs (root hosts)
    missing: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        return not self.missing

    def to_json(self) -> dict:
        return {**asdict(self), "available": self.available}


# --- the bootstrap: runs inside, before the user's code -------------------------------------------------

#: Run as a pre-compiled file (``_boot_pyc``; compiling it per call cost ~3 ms). Sets the rlimits, reads {"code", "inputs"} from stdin (marshal: built in, 2x
#: faster than json on 1 MB; written by the host with the same interpreter), runs the code in a fresh
#: namespace holding the inputs, and writes {"error", "answer_repr", "answer"} as JSON to the result fd (the
#: host never unmarshals what the code made). Start-up is most of a call's cost, so it never imports
#: ``json`` nor ``signal`` (``re`` and ``enum`` with them: ~10 ms): a small encoder over ``_json``'s C string
#: escaper writes the answer, ``_signal`` is the C module; ``traceback`` is imported only on an error.
#: Processes the code forks end without a result.
_BOOT = r"""# fhirgym-sandbox-boot
import _signal, marshal, os, resource, sys
from _json import encode_basestring_ascii as _esc
class CPUTimeLimitExceeded(BaseException):
    pass
def _limits(cpu, aspace, fsize, nofile):
    for r, v in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile),
                 (resource.RLIMIT_AS, aspace), (resource.RLIMIT_CPU, cpu)):
        resource.setrlimit(r, (v, v + 1 if r == resource.RLIMIT_CPU else v))
    def _xcpu(signum, frame):
        raise CPUTimeLimitExceeded(f"CPU time limit of {cpu} s exceeded")
    _signal.signal(_signal.SIGXCPU, _xcpu)
def _jsonable(v):
    if isinstance(v, (set, frozenset)):
        try:
            return sorted(v)
        except TypeError:
            return list(v)
    if hasattr(v, "isoformat"):
        return v.isoformat()
    raise TypeError(type(v).__name__)
def _enc(v, out):
    if v is None or v is True or v is False:
        out.append("null" if v is None else "true" if v else "false")
    elif isinstance(v, str):
        out.append(_esc(v))
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    elif isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("NaN or infinity")
        out.append(float.__repr__(v))
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, x in enumerate(v):
            out.append("," if i else "")
            _enc(x, out)
        out.append("]")
    elif isinstance(v, dict):
        out.append("{")
        for i, (k, x) in enumerate(v.items()):
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError("key " + type(k).__name__)
            out.append(("," if i else "") + _esc(k if isinstance(k, str) else "".join(_dump(k))) + ":")
            _enc(x, out)
        out.append("}")
    else:
        _enc(_jsonable(v), out)
def _dump(v):
    out = []
    _enc(v, out)
    return out
def _error(exc):
    import traceback
    te = traceback.TracebackException.from_exception(exc)
    for t in (te, *(c for c in (te.__cause__, te.__context__) if c)):
        t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename != "<fhirgym-boot>"])
    return "".join(te.format())
def _run(rfd):
    payload = marshal.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    ns = {"__name__": "__main__", "__builtins__": __builtins__, "answer": None, **payload["inputs"]}
    main, error = os.getpid(), None
    try:
        if payload.get("prelude"):  # host-given helpers (e.g. the FHIR functions); their frames are hidden
            exec(compile(payload["prelude"], "<fhirgym-boot>", "exec"), ns)
        exec(compile(payload["code"], "<python>", "exec"), ns)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            error = f"SystemExit: {exc.code}"
    except BaseException as exc:
        error = _error(exc)
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            pass
    if os.getpid() != main:
        os._exit(1 if error else 0)
    answer, is_repr = ns.get("answer"), False
    try:
        text = "".join(_dump(answer))
    except BaseException:
        is_repr = True
        try:
            text = _esc(repr(answer))
        except BaseException as exc:
            text = _esc(f"<unrepresentable: {type(exc).__name__}>")
    with os.fdopen(rfd, "w", encoding="ascii") as f:
        f.write(f'{{"error":{"null" if error is None else _esc(error)},"answer_repr":{str(is_repr).lower()},'
                f'"answer":{text}}}')
    os._exit(0)
def _zygote(ctl_fd):
    # One per episode: forks a child per call, so a call skips bwrap's and the interpreter's start-up.
    # Not dumpable: the calls' processes (same uid) cannot open its /proc files (memory, fds).
    import ctypes, socket
    prctl = ctypes.CDLL(None).prctl
    prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    ctl = socket.socket(fileno=ctl_fd)
    ctl.send(b"ready")
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 4096, 4)
        except OSError:
            os._exit(0)
        if not msg or len(fds) != 4:
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            try:
                ctl.close()
                os.setsid()
                for i, f in enumerate(fds):
                    os.dup2(f, 100 + i)
                for f in fds:
                    if not 100 <= f < 104:
                        os.close(f)
                for i in range(4):
                    os.dup2(100 + i, i)
                    os.close(100 + i)
                prctl(4, 1, 0, 0, 0)
                _limits(*marshal.loads(msg)[:4])
                _run(3)
            finally:
                os._exit(70)
        for f in fds:
            os.close(f)
        _, status = os.waitpid(pid, 0)
        ctl.send(marshal.dumps(os.waitstatus_to_exitcode(status)))
if sys.argv[1] == "zygote":
    _zygote(int(sys.argv[2]))
else:
    _limits(*(int(a) for a in sys.argv[2:6]))
    _run(int(sys.argv[6]))
"""


@functools.cache
def _boot_pyc() -> str:
    """The bootstrap compiled once per host process, in a private temp dir removed at exit."""
    d = tempfile.mkdtemp(prefix="fhirgym-boot-")
    atexit.register(shutil.rmtree, d, True)  # host-made: no code ever writes here
    src = os.path.join(d, "boot.py")
    Path(src).write_text(_BOOT)
    out = py_compile.compile(src, os.path.join(d, "boot.pyc"), dfile="<fhirgym-boot>", doraise=True,
                             invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    os.chmod(d, 0o755)
    return out


# --- probing the machine -----------------------------------------------------------------------------------


def _base_paths() -> dict[str, str]:
    """The base interpreter's install paths: in a venv, sysconfig's own ``platstdlib`` and ``purelib``
    point into the venv (the project's packages), which must never be mounted."""
    return sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                     "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix})


@functools.cache
def _interpreter() -> tuple[str, tuple[str, ...]]:
    """The real interpreter (a venv's ``python`` is a symlink to it) and the host paths it needs."""
    exe = os.path.realpath(sys.executable)
    base = _base_paths()
    paths = [exe, base["stdlib"], base["platstdlib"]]
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        lib = os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or "")
        if os.path.exists(lib):
            paths.append(os.path.realpath(lib))
    return exe, tuple(paths)


@functools.cache
def _system_binds() -> tuple[str, ...]:
    """Read-only binds of the shared libraries (symlinks kept as symlinks) and the time-zone database."""
    args: list[str] = []
    for d in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/usr/share/zoneinfo"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += _ro_bind(d)
    return tuple(args)


def _ro_bind(path: str, dest: str | None = None) -> list[str]:
    """A read-only bind of a host path, from where the sandbox's uid can reach it (``fs.STAGE``)."""
    return ["--ro-bind", fs.STAGE.source(path), dest or path]


@functools.cache
def _python_binds() -> tuple[str, ...]:
    """Read-only binds of the interpreter and its stdlib, with an empty tmpfs over site-packages."""
    system = _system_binds()
    covered = [a for i, a in enumerate(system) if i % 3 == 2]  # the destinations
    args: list[str] = []
    _, paths = _interpreter()
    for p in dict.fromkeys(paths):
        if not any(p == c or p.startswith(c.rstrip("/") + "/") for c in covered):
            args += _ro_bind(p)
    base = _base_paths()
    for site in dict.fromkeys((base["purelib"], base["platlib"])):
        if os.path.isdir(site) and site.startswith(base["stdlib"] + "/"):
            args += ["--tmpfs", site, "--remount-ro", site]
    return tuple(args)


def _find_bwrap() -> str | None:
    return os.environ.get("FHIRGYM_BWRAP") or shutil.which("bwrap") or (
        "/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


def _cgroup_parent(controller: str) -> tuple[str | None, str]:
    """A directory where this process may create child cgroups with ``controller``: a child of its own
    cgroup (v1, or v2 where the controller can be delegated), else the v2 root. (None, why) if none."""
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as exc:
        return None, str(exc)
    v1_path = v2_path = None
    for line in own:
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and not ctrls:
            v2_path = path
        elif controller in ctrls.split(","):
            v1_path = path
    for line in mounts:
        left, _, right = line.partition(" - ")
        fstype, _, options = right.split(" ", 2)
        mnt = left.split()[4]
        if v1_path is not None and fstype == "cgroup" and controller in options.split()[-1].split(","):
            parent = os.path.normpath(os.path.join(mnt, v1_path.lstrip("/")))
            return (parent, "") if os.access(parent, os.W_OK) else (None, f"{parent} is not writable")
        if v1_path is None and v2_path is not None and fstype == "cgroup2":
            try:
                if controller not in Path(mnt, "cgroup.controllers").read_text().split():
                    continue
            except OSError:
                continue
            for parent in dict.fromkeys((os.path.normpath(os.path.join(mnt, v2_path.lstrip("/"))), mnt)):
                try:  # a non-root cgroup with processes cannot delegate controllers (EBUSY): try the root
                    Path(parent, "cgroup.subtree_control").write_text(f"+{controller}")
                    return parent, ""
                except OSError:
                    continue
            return None, f"cannot enable the {controller} controller for child cgroups under {mnt}"
    return None, f"no writable cgroup hierarchy with the {controller} controller"


@functools.cache
def _seccomp_program() -> bytes:
    """The compiled BPF filter (x86_64 and friends: the native arch only; other arches' syscalls are killed)."""
    import pyseccomp as seccomp

    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, RuntimeError, ValueError):
            continue  # not a syscall on this architecture (e.g. socketcall on x86_64)
    with tempfile.TemporaryFile() as f:
        flt.export_bpf(f)
        f.seek(0)
        return f.read()


def _find_setpriv() -> str | None:
    return shutil.which("setpriv") or ("/usr/bin/setpriv" if os.access("/usr/bin/setpriv", os.X_OK) else None)


def _drop(setpriv: str | None) -> list[str]:
    """The argv prefix that makes a root host's chain the sandbox's uid/gid (none for a normal user)."""
    if not fs.is_root():
        return []
    uid, gid = fs.sandbox_ids()
    return [setpriv or "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


@functools.cache
def _probe() -> SandboxProbe:
    missing: list[str] = []
    details: dict[str, str] = {}
    bwrap = _find_bwrap()
    namespaces = False
    uid = gid = None
    setpriv = _find_setpriv() if fs.is_root() else None
    quota = False
    try:
        uid, gid = fs.sandbox_ids()
    except fs.SandboxIdError as exc:
        missing.append(str(exc))
    if fs.is_root():
        fs.sweep_stale_mounts()
        if setpriv is None:
            missing.append("setpriv not found (util-linux): a root host needs it to run the sandbox as an "
                           "unprivileged uid")
        why = fs.can_mount()
        quota = why is None
        if why:
            details["workspace-quota"] = why
            missing.append(f"cannot mount a size-capped tmpfs for each workspace ({why})")
    if bwrap is None:
        missing.append("bubblewrap (bwrap) not found: install it with `bash scripts/_sandbox.sh` "
                       "(apt-get install bubblewrap)")
    elif uid is not None and (setpriv or not fs.is_root()):
        exe, _ = _interpreter()
        try:
            run = subprocess.run([*_drop(setpriv), bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                                  "--die-with-parent", *_system_binds(), *_python_binds(), "--", exe, "-I", "-S",
                                  "-c", "pass"], capture_output=True, timeout=30, check=False, env=_ENV)
            namespaces = run.returncode == 0
            if not namespaces:
                details["bwrap"] = run.stderr.decode(errors="replace").strip()[:500]
        except (OSError, subprocess.TimeoutExpired) as exc:
            details["bwrap"] = str(exc)
        if not namespaces:
            who = f" as the sandbox's uid {uid}" if fs.is_root() else ""
            missing.append(f"bubblewrap cannot create namespaces here{who} ({details.get('bwrap', '?')})")
    try:
        seccomp = bool(_seccomp_program())
    except Exception as exc:  # ImportError, or RuntimeError("Unable to find libseccomp")
        seccomp = False
        details["seccomp"] = f"{type(exc).__name__}: {exc}"
        missing.append(f"seccomp filter unavailable ({details['seccomp']}): install pyseccomp and libseccomp2")
    parents: dict[str, str | None] = {}
    for ctrl in ("pids", "memory"):
        parent, why = _cgroup_parent(ctrl)
        if parent is not None:
            try:
                probe_dir = _Cgroup.make_dir(parent, f"fhirgym-probe-{os.getpid()}")
                os.rmdir(probe_dir)
            except OSError as exc:
                parent, why = None, f"cannot create a child cgroup in {parent}: {exc}"
        parents[ctrl] = parent
        if parent is not None:
            _sweep_stale(parent)
        if parent is None:
            details[f"cgroup-{ctrl}"] = why
            missing.append(f"{ctrl} cgroup unavailable ({why}); needs root or a delegated cgroup")
    return SandboxProbe(bwrap=bwrap, namespaces=namespaces, seccomp=seccomp, cgroup_pids=parents["pids"],
                        cgroup_memory=parents["memory"], setpriv=setpriv, uid=uid, gid=gid, workspace_quota=quota,
                        missing=tuple(missing), details=details)


def _sweep_stale(parent: str) -> None:
    """Remove per-call cgroups left by a host process that died mid-call (their processes died with it)."""
    for entry in os.scandir(parent):
        if entry.name.startswith("fhirgym-sandbox-") and entry.is_dir():
            pid = entry.name.split("-")[2]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                try:
                    os.rmdir(entry.path)
                except OSError:
                    continue


def sandbox_probe(refresh: bool = False) -> SandboxProbe:
    """What works on this machine (cached; ``refresh`` probes again)."""
    if refresh:
        _probe.cache_clear()
    return _probe()


def sandbox_available() -> bool:
    """True when every layer of the sandbox works here."""
    return sandbox_probe().available


# --- per-call cgroups ------------------------------------------------------------------------------------


class _Cgroup:
    """A child cgroup per controller for one call: made before, emptied and removed after."""

    def __init__(self, name: str, pids: int, memory_bytes: int, pids_parent: str | None,
                 memory_parent: str | None):
        self.dirs: dict[str, str] = {}
        try:
            if pids_parent:
                self.dirs["pids"] = self.make_dir(pids_parent, name)
                self.set_pids(pids)
            if memory_parent:
                d = self.dirs["memory"] = self.make_dir(memory_parent, name)
                if os.path.exists(os.path.join(d, "memory.max")):  # v2
                    Path(d, "memory.max").write_text(str(memory_bytes))
                    Path(d, "memory.swap.max").write_text("0") if os.path.exists(f"{d}/memory.swap.max") else None
                else:
                    Path(d, "memory.limit_in_bytes").write_text(str(memory_bytes))
                    if os.path.exists(f"{d}/memory.memsw.limit_in_bytes"):
                        Path(d, "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        except OSError:
            self.remove()
            raise

    def set_pids(self, pids: int) -> None:
        Path(self.dirs["pids"], "pids.max").write_text(str(pids))

    def pids(self) -> set[int]:
        """The processes in the cgroup now (the pids hierarchy, else the memory one)."""
        for d in self.dirs.values():
            try:
                return {int(p) for p in Path(d, "cgroup.procs").read_text().split()}
            except OSError:
                continue
        return set()

    def reset_peak(self) -> None:
        with contextlib.suppress(KeyError, OSError):  # v1 only; v2's memory.peak covers the cgroup's life
            Path(self.dirs["memory"], "memory.max_usage_in_bytes").write_text("0")

    @staticmethod
    def make_dir(parent: str, name: str) -> str:
        d = os.path.join(parent, name)
        os.mkdir(d)
        return d

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def _counter(self, ctrl: str, filename: str, key: str) -> int:
        try:
            for line in Path(self.dirs[ctrl], filename).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except (KeyError, OSError, ValueError):
            pass
        return 0

    def stats(self) -> dict[str, int]:
        """pids limit hits, OOM kills, and peak memory (bytes) of the call so far."""
        mem = self.dirs.get("memory", "")
        oom = (self._counter("memory", "memory.events", "oom_kill") if os.path.exists(f"{mem}/memory.events")
               else self._counter("memory", "memory.oom_control", "oom_kill"))
        peak = 0
        for fname in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                peak = int(Path(mem, fname).read_text())
                break
            except (OSError, ValueError):
                continue
        return {"pids_max_hits": self._counter("pids", "pids.events", "max"), "oom_kills": oom, "peak": peak}

    def remove(self, timeout_s: float = 5.0) -> None:
        """SIGKILL whatever is left (normally nothing: the pid namespace died with bwrap), then rmdir."""
        deadline = time.monotonic() + timeout_s
        for d in list(self.dirs.values()):
            while True:
                try:
                    pids = [int(p) for p in Path(d, "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.002)


# --- the sandbox -----------------------------------------------------------------------------------------

_call_ids = itertools.count(1)
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK


class Sandbox:
    """Runs code for one episode in its workspace: ``workspace_dir`` (made or set 0700; the sandbox's uid must
    be able to reach it, and a normal user's must have a private parent), or, when None, a directory of its
    own inside a private 0700 parent, removed by :meth:`close`. On a root host the workspace is a tmpfs of
    ``limits.workspace_bytes`` mounted there for the sandbox's life: its files go when it closes. Calls are
    serialised; files the code writes in the workspace (the current directory, also ``/workspace``) persist
    between calls.

    ``zygote`` (default): the episode's bwrap sandbox is started at the first call and forks a fresh
    process per call (``/tmp`` lives as long as the episode); False starts bwrap and an interpreter for
    every call (~5x slower; nothing of the sandbox outlives a call). Without bwrap or a pids cgroup
    (``unsafe``) every call is its own process anyway."""

    def __init__(self, workspace_dir: str | os.PathLike[str] | None = None, limits: SandboxLimits | None = None,
                 unsafe: bool = False, zygote: bool = True) -> None:
        self.limits = limits or SandboxLimits()
        self.unsafe = unsafe
        self.zygote = zygote
        self._parent: str | None = None  # the private directory the sandbox made for its own workspace
        if workspace_dir is None:
            self._parent = fs.private_parent()
            self.workspace = Path(self._parent, "workspace")
        else:
            self.workspace = Path(workspace_dir).resolve()
            fs.check_workspace_dir(self.workspace)
        self.workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.workspace, 0o700)
        self._mounted = False
        if fs.is_root() and sandbox_probe().workspace_quota:
            fs.mount_workspace(str(self.workspace), self.limits.workspace_bytes, self.limits.workspace_files)
            self._mounted = True
        self._lock = threading.Lock()
        self._zygote: _Zygote | None = None
        self._finalizer: weakref.finalize | None = None
        self._release = weakref.finalize(self, _release_workspace, str(self.workspace), self._mounted, self._parent)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the episode's sandbox process, then unmount its workspace's tmpfs and remove what the sandbox
        made (without recursion: the code may have made a tree of any depth). Raises OSError only if a
        directory will not go; the processes are gone by then."""
        with self._lock:
            try:
                if self._zygote is not None:
                    self._zygote.close()
                    self._zygote = None
            finally:
                if self._finalizer is not None:
                    self._finalizer.detach()
                self._release()

    def write_file(self, name: str, data: bytes | str) -> Path:
        """Write a file into the workspace from the host, never through a symlink the code planted there
        (``Observation.json -> ~/.bashrc`` would otherwise make the host clobber its own file)."""
        parent, leaf = self._open_parent(name, create=True)
        try:
            try:
                fd = os.open(leaf, _WRITE_FLAGS | os.O_TRUNC, 0o600, dir_fd=parent)
            except OSError as exc:  # a symlink (ELOOP) or a FIFO (ENXIO): replace the entry (unlink never follows)
                if exc.errno not in (errno.ELOOP, errno.ENXIO):
                    raise
                os.unlink(leaf, dir_fd=parent)
                fd = os.open(leaf, _WRITE_FLAGS | os.O_EXCL, 0o600, dir_fd=parent)
            fs.chown_to_sandbox(fd)  # the code (the sandbox's uid) reads what the host wrote
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
        finally:
            os.close(parent)
        return self.workspace / name

    def read_file(self, name: str, max_bytes: int = 1 << 20) -> bytes:
        """Read at most ``max_bytes`` of a workspace file from the host, refusing symlinks (OSError ELOOP)."""
        parent, leaf = self._open_parent(name, create=False)
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as f:
            return f.read(max_bytes)

    def _open_parent(self, name: str, create: bool) -> tuple[int, str]:
        """An fd of ``name``'s directory, reached component by component without following symlinks."""
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            raise ValueError(f"not a relative path inside the workspace: {name!r}")
        fd = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                made = False
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                        made = True
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nxt
                if made:
                    fs.chown_to_sandbox(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def protections(self) -> tuple[str, ...]:
        """The layers calls will run under; raises :class:`SandboxUnavailable` when one is missing and the
        sandbox is not ``unsafe``."""
        p = sandbox_probe()
        if p.missing and not self.unsafe:
            raise SandboxUnavailable("python sandbox unavailable: " + "; ".join(p.missing)
                                     + ". Pass --unsafe-python (Sandbox(unsafe=True)) to run code without it.")
        bwrap = bool(p.bwrap and p.namespaces)
        have = {"bwrap": bwrap, "seccomp": p.seccomp and bwrap, "cgroup-pids": p.cgroup_pids is not None,
                "cgroup-memory": p.cgroup_memory is not None, "rlimits": True,
                "unprivileged": bwrap and (not fs.is_root() or p.setpriv is not None),
                "workspace-quota": self._mounted}
        return tuple(k for k in PROTECTIONS if have[k])

    def _argv(self, layers: tuple[str, ...], seccomp_fd: int | None, boot_args: list[str]) -> list[str]:
        """The interpreter running the bootstrap with ``boot_args``, inside bwrap when it is a layer."""
        lim = self.limits
        exe, _ = _interpreter()
        py = [exe, "-I", "-S", "-B", "-X", "utf8", *boot_args]
        if "bwrap" not in layers:
            return py
        p = sandbox_probe()
        # /proc and /dev are remounted read-only: bwrap's own cover of /proc/sys is skipped where its
        # access(W_OK) check fails, and /dev is an unsized tmpfs holding binds of host device nodes.
        argv = [*_drop(p.setpriv), p.bwrap or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
                "--uid", "65534", "--gid", "65534", "--hostname", "sandbox", "--die-with-parent", "--new-session",
                "--clearenv", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", WORKSPACE,
                "--setenv", "TMPDIR", "/tmp", *_system_binds(), *_python_binds(),
                "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev",
                "--size", str(lim.tmp_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
                "--size", str(lim.tmp_bytes), "--tmpfs", "/tmp",
                *_ro_bind(_boot_pyc(), BOOT_PATH),
                "--bind", str(self.workspace), WORKSPACE, "--chdir", WORKSPACE, "--remount-ro", "/"]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        return [*argv, "--", *py]

    def run(self, code: str, inputs: Mapping[str, Any] | None = None, *, prelude: str | None = None,
            pass_fds: Sequence[int] = ()) -> SandboxResult:
        """Run ``code`` with ``inputs`` (JSON values) as variables; never raises for the code's faults.

        ``prelude``: trusted source run first in the same namespace (its frames are left out of tracebacks);
        ``pass_fds``: host fds the code inherits (e.g. the pipes of a host-side RPC); closed here, whatever
        happens.
        """
        try:
            layers = self.protections()
            payload = marshal.dumps({"code": code, "inputs": dict(inputs or {}), "prelude": prelude})
        except ValueError as exc:
            _close_all(pass_fds)
            raise TypeError(f"sandbox inputs must be JSON values: {exc}") from exc
        except BaseException:
            _close_all(pass_fds)
            raise
        with self._lock:
            # inherited fds keep their numbers only in a process of its own (a zygote's fork would get new ones)
            if self.zygote and not pass_fds and "bwrap" in layers and "cgroup-pids" in layers:
                return self._run_in_zygote(layers, payload)
            return self._run_process(layers, payload, tuple(pass_fds))

    def processes(self) -> list[int]:
        """Host pids of processes the calls left running: always empty between calls."""
        z = self._zygote
        return sorted(z.cgroup.pids() - z.infra) if z is not None and z.alive() else []

    def _run_in_zygote(self, layers: tuple[str, ...], payload: bytes) -> SandboxResult:
        """A call forked by the episode's zygote (started at the first call, restarted if it died)."""
        lim = self.limits
        z = self._zygote
        if z is None or not z.alive() or z.layers != layers:
            if z is not None:
                z.close()
            if self._finalizer is not None:
                self._finalizer.detach()
            z = self._zygote = _Zygote(self, layers)
            self._finalizer = weakref.finalize(self, z.close)  # a sandbox dropped without close()
        call_id = f"fhirgym-sandbox-{os.getpid()}-{next(_call_ids)}"
        before = z.cgroup.stats()
        z.cgroup.reset_peak()
        child, host = _pipes()
        header = marshal.dumps((lim.cpu_s, lim.address_space_bytes or lim.memory_bytes, lim.file_bytes,
                                lim.open_files, call_id))
        start = time.monotonic()
        deadline = start + lim.wall_s
        rc: int | str | None = None
        try:
            try:
                socket.send_fds(z.sock, [header], list(child))
            finally:
                for fd in child:
                    os.close(fd)
            out, err, res, reason = _pump(host, payload, deadline, lim.output_bytes, z.reported)
            if reason is None:
                rc = z.status(deadline)
                reason = "wall" if rc is None else None
        except OSError:  # the zygote is gone (the code killed it): the next call starts another
            out, err, res, reason, rc = b"", b"", b"", None, "died"
        finally:
            for fd in host:
                os.close(fd)
            z.kill_calls()
            if rc is None:
                rc = z.status(time.monotonic() + 5)
        after = z.cgroup.stats()
        stats = {k: after[k] - before[k] for k in ("pids_max_hits", "oom_kills")} | {"peak": after["peak"]}
        if rc == "died" or not z.alive():
            z.close()
            self._zygote = None
            rc = None
            if reason is None and not res:
                reason = "died"
        return _result(lim, rc if isinstance(rc, int) else None, out, err, res, reason, stats,
                       time.monotonic() - start, layers, call_id)

    def _run_process(self, layers: tuple[str, ...], payload: bytes, extra_fds: tuple[int, ...] = ()) -> SandboxResult:
        """A call in a process of its own: bwrap (if any) and a fresh interpreter, cgroups made for it."""
        lim = self.limits
        call_id = f"fhirgym-sandbox-{os.getpid()}-{next(_call_ids)}"
        p = sandbox_probe()
        cgroup = _Cgroup(call_id, lim.pids, lim.memory_bytes, p.cgroup_pids if "cgroup-pids" in layers else None,
                         p.cgroup_memory if "cgroup-memory" in layers else None)
        child, host = _pipes()
        seccomp_fd = _seccomp_fd() if "seccomp" in layers else None
        py = [BOOT_PATH if "bwrap" in layers else _boot_pyc(), "call", str(lim.cpu_s),
              str(lim.address_space_bytes or lim.memory_bytes), str(lim.file_bytes), str(lim.open_files),
              str(child[3]), call_id]
        argv = _join_cgroups(cgroup, self._argv(layers, seccomp_fd, py))
        env = _ENV if "bwrap" in layers else {"LANG": "C.UTF-8", "HOME": str(self.workspace),
                                              "TMPDIR": tempfile.gettempdir()}
        start = time.monotonic()
        deadline = start + lim.wall_s
        try:
            proc = subprocess.Popen(argv, stdin=child[0], stdout=child[1], stderr=child[2],
                                    pass_fds=[child[3], *extra_fds] + ([seccomp_fd] if seccomp_fd is not None else []),
                                    cwd="/" if "bwrap" in layers else self.workspace, env=env,
                                    start_new_session=True)
        except BaseException:
            for fd in host:
                os.close(fd)
            cgroup.remove()
            raise
        finally:
            for fd in (*child, *extra_fds, *([seccomp_fd] if seccomp_fd is not None else [])):
                os.close(fd)
        try:
            out, err, res, reason = _pump(host, payload, deadline, lim.output_bytes, lambda: proc.poll() is not None)
            if reason is None:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    reason = "wall"
        finally:
            for fd in host:
                os.close(fd)
            _kill(proc)
            stats = cgroup.stats()
            cgroup.remove()
        return _result(lim, proc.returncode, out, err, res, reason, stats, time.monotonic() - start, layers, call_id)


def _release_workspace(workspace: str, mounted: bool, parent: str | None) -> None:
    """Unmount the workspace's tmpfs (its files go with it), then remove the private parent of a workspace
    the sandbox made; a caller's directory stays (with its files, where it was not a tmpfs)."""
    if mounted:
        fs.unmount(workspace)
    if parent is not None:
        fs.remove_tree(parent)


#: Memory the episode's cgroup allows on top of ``memory_bytes`` for the zygote, bwrap and its init
#: (measured: ~5 MiB).
ZYGOTE_MEMORY = 16 << 20


class _Zygote:
    """The episode's sandbox: one bwrap with an interpreter (the zygote) that forks a child per call.

    Why: starting bwrap and an interpreter is most of a call's cost (~10-20 ms each here, much more on a
    loaded machine). The zygote never runs the code itself; each child gets the call's pipes (passed
    over a socketpair made outside the sandbox), sets the rlimits and runs the bootstrap. The host kills
    every process of the episode's cgroups but the three of the sandbox (bwrap, its init, the zygote)
    after each call, at the deadline and past the output cap, so nothing a call starts outlives it.
    """

    def __init__(self, sandbox: Sandbox, layers: tuple[str, ...]) -> None:
        lim, p = sandbox.limits, sandbox_probe()
        self.layers = layers
        self.closed = False
        self.infra: set[int] = set()
        self.cgroup = _Cgroup(f"fhirgym-sandbox-{os.getpid()}-{next(_call_ids)}", lim.pids + 8,
                              lim.memory_bytes + ZYGOTE_MEMORY, p.cgroup_pids,
                              p.cgroup_memory if "cgroup-memory" in layers else None)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        seccomp_fd = _seccomp_fd() if "seccomp" in layers else None
        argv = _join_cgroups(self.cgroup, sandbox._argv(layers, seccomp_fd, [BOOT_PATH, "zygote", str(theirs.fileno())]))
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, cwd="/", start_new_session=True,
                                         env=_ENV,
                                         pass_fds=[theirs.fileno()] + ([seccomp_fd] if seccomp_fd is not None else []))
        except BaseException:
            self.sock.close()
            self.cgroup.remove()
            raise
        finally:
            theirs.close()
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        assert self.proc.stderr is not None
        ready = _readable(self.sock.fileno(), 30) and self.sock.recv(16) == b"ready"
        if not ready:
            why = self.proc.stderr.read(4000).decode(errors="replace") if self.proc.poll() is not None else "timeout"
            self.close()
            raise SandboxUnavailable(f"python sandbox did not start: {why.strip()}")
        self.proc.stderr.close()
        self.infra = self.cgroup.pids()  # bwrap, its init and the zygote: nothing else runs yet
        self.cgroup.set_pids(lim.pids + len(self.infra))
        for pid in self.infra:  # the OOM killer must pick the call's processes, never the sandbox's own
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def reported(self) -> bool:
        """True once the zygote has reported the call's exit status (or is gone)."""
        return _readable(self.sock.fileno(), 0)

    def status(self, deadline: float) -> int | str | None:
        """The exit code of the call's process, "died" if the zygote is gone, None at the deadline."""
        if not _readable(self.sock.fileno(), max(0.0, deadline - time.monotonic())):
            return None
        try:
            msg = self.sock.recv(64)
        except OSError:
            return "died"
        return marshal.loads(msg) if msg else "died"

    def kill_calls(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process of the cgroup but the sandbox's own, until none is left."""
        end = time.monotonic() + timeout_s
        while (others := self.cgroup.pids() - self.infra) and time.monotonic() < end:
            for pid in others:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def close(self) -> None:
        """Once only: after the reap, ``proc.pid`` may name another process group."""
        if self.closed:
            return
        self.closed = True
        if getattr(self, "proc", None) is not None:
            _kill(self.proc)
        self.sock.close()
        self.cgroup.remove()


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _readable(fd: int, timeout_s: float) -> bool:
    """poll(), not select(): a busy host may hold fds past select's limit of 1024."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(timeout_s * 1000))


def _pipes() -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """The call's pipes: (stdin, stdout, stderr, result) ends for the child, and the host's ends."""
    (a, b), (c, d), (e, f), (g, h) = os.pipe(), os.pipe(), os.pipe(), os.pipe()
    return (a, d, f, h), (b, c, e, g)


def _seccomp_fd() -> int:
    """A pipe holding the compiled filter, for bwrap's ``--seccomp FD``."""
    r, w = os.pipe()
    os.write(w, _seccomp_program())
    os.close(w)
    return r


def _join_cgroups(cgroup: _Cgroup, argv: list[str]) -> list[str]:
    """Prefix ``argv`` with a shell that joins the cgroups, so every process it starts is inside."""
    if not cgroup.dirs:
        return argv
    return ["/bin/sh", "-c", 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"',
            "sh", *cgroup.procs_files(), "--", *argv]


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the call's process group, even after its leader exited (without bwrap, processes the code
    forked are still in it; with bwrap, the pid namespace dies with bwrap), then reap the leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def _pump(host: tuple[int, int, int, int], payload: bytes, deadline: float, cap: int,
          leader_gone: Callable[[], bool]) -> tuple[bytes, bytes, bytes, str | None]:
    """Feed stdin, read stdout/stderr/result until EOF or the leader's exit (processes the code forked
    may hold the pipes open), the deadline ("wall") or a cap ("output", "answer"). The caller closes the
    ``host`` fds."""
    win, out, err, res = host
    bufs: dict[int, bytearray] = {out: bytearray(), err: bytearray(), res: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    os.set_blocking(win, False)
    sel.register(win, selectors.EVENT_WRITE)
    view, sent = memoryview(payload), 0

    def done(reason: str | None) -> tuple[bytes, bytes, bytes, str | None]:
        return bytes(bufs[out]), bytes(bufs[err]), bytes(bufs[res]), reason

    def read(fd: int) -> str | None:
        """Read what is there; unregister at EOF; name the cap that was passed, if one was."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return None
            if not chunk:
                sel.unregister(fd)
                return None
            bufs[fd] += chunk
            if len(bufs[res]) > cap:
                return "answer"
            if len(bufs[out]) + len(bufs[err]) > cap:
                return "output"

    try:
        while any(fd in bufs for fd in sel.get_map()):
            left = deadline - time.monotonic()
            if left <= 0:
                return done("wall")
            events = sel.select(min(left, 0.05))
            for key, _ in events:
                if key.fd == win:
                    try:
                        sent += os.write(win, view[sent:sent + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        sent = len(view)
                    if sent >= len(view):
                        sel.unregister(win)
                        null = os.open(os.devnull, os.O_WRONLY)  # EOF for the child; ``win`` stays open for
                        os.dup2(null, win)  # the caller, who closes every host fd exactly once
                        os.close(null)
                elif reason := read(key.fd):
                    return done(reason)
            if not events and leader_gone():  # take what is left, stop
                for fd in [fd for fd in sel.get_map() if fd in bufs]:
                    if reason := read(fd):
                        return done(reason)
                break
        return done(None)
    finally:
        sel.close()


def _depth_over(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests deeper than ``limit`` (iteratively: any depth is fine)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            if d > limit:
                return True
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def _parse_result(res: bytes) -> dict[str, Any] | str:
    """What the result fd held, checked: ``{error, answer_repr, answer}`` of the right types with an answer
    at most ``MAX_ANSWER_DEPTH`` deep; anything else (the code wrote the fd itself) is an error text."""
    try:
        parsed = json.loads(res)
    except (ValueError, RecursionError):
        return "the call's result was not readable (the code wrote its result channel itself?)"
    if (not isinstance(parsed, dict) or set(parsed) != {"error", "answer_repr", "answer"}
            or not isinstance(parsed["error"], str | None) or not isinstance(parsed["answer_repr"], bool)):
        return "the call's result was malformed (the code wrote its result channel itself?)"
    if _depth_over(parsed["answer"], MAX_ANSWER_DEPTH):
        return f"the answer nests deeper than {MAX_ANSWER_DEPTH} levels: return a flatter value"
    return parsed


def _result(lim: SandboxLimits, rc: int | None, out: bytes, err: bytes, res: bytes, reason: str | None,
            stats: dict[str, int], duration: float, layers: tuple[str, ...], call_id: str) -> SandboxResult:
    """Turn what came back into a result, naming the limit that ended the call if one did."""
    truncated = len(out) + len(err) > lim.output_bytes
    stdout = out[: lim.output_bytes].decode("utf-8", "replace")
    stderr = err[: max(0, lim.output_bytes - len(out))].decode("utf-8", "replace")
    r = SandboxResult(stdout=stdout, stderr=stderr, exit_code=rc, duration_s=round(duration, 4),
                      protections=layers, call_id=call_id, truncated=truncated,
                      peak_memory_bytes=stats["peak"] or None)
    parsed = _parse_result(res) if reason is None and res else None
    if isinstance(parsed, str):
        r.error = parsed
    elif parsed is not None:
        r.answer, r.answer_repr, r.error = parsed["answer"], parsed["answer_repr"], parsed["error"]
        if r.error and "CPUTimeLimitExceeded" in r.error:
            r.limit = "cpu"
        elif r.error and "MemoryError" in r.error:
            r.limit = "memory"
    elif reason == "wall":
        r.timed_out, r.limit = True, "wall"
        r.error = f"wall-clock limit exceeded: killed after {lim.wall_s:g} s"
    elif reason == "output":
        r.limit = "output"
        r.error = f"output limit exceeded: more than {lim.output_bytes} bytes of output; killed"
    elif reason == "answer":
        r.limit = "output"
        r.error = f"output limit exceeded: the answer (or traceback) is over {lim.output_bytes} bytes; killed"
    elif reason == "died":
        r.error = "the sandbox's process died during the call (the next call starts a new one)"
    elif stats["oom_kills"]:
        r.limit = "memory"
        r.error = f"memory limit exceeded: the call's processes passed {lim.memory_bytes} bytes and were killed"
    elif rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL):
        r.limit = "cpu"
        r.error = f"CPU time limit of {lim.cpu_s} s exceeded; killed"
    else:
        r.error = f"the code ended the interpreter without a result (exit code {rc})"
    if r.limit is None and stats["pids_max_hits"]:
        r.limit = "pids"
        if r.error:
            r.error += f"\n(the limit of {lim.pids} processes was hit)"
    return r
