"""fhirgym's bubblewrap sandbox as an inspect sandbox type: ``sandbox="fhirgym-bwrap"``.

Written here, not taken from a provider package: inspect's published providers (docker, k8s, podman, cloud VMs) all need
a daemon or a service this sandbox exists to do without. inspect's tools send argv lists, and the public
:class:`~fhirgym.tools.Sandbox` runs Python code, so each ``exec`` runs a small driver in the sample's sandbox that
starts the argv with ``subprocess``: the command and everything it forks live under every layer of the ``python`` tool
(docs/SANDBOX.md), with its limits (``SandboxLimits``). The sandbox mounts no ``/usr/bin``, so the commands a shell
needs (:data:`DEFAULT_COMMANDS`) are sent in as copies of the host's binaries, to :data:`BIN`. A CodeAct sample's
environment is its episode's own sandbox (:meth:`BwrapSandboxEnvironment.attach`). How commands run, what is on the
PATH, limits, user: docs/INSPECT.md, section "The sandbox".
"""

from __future__ import annotations

import base64
import errno
import functools
import os
import posixpath
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import anyio
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict

from ..tools import Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable, sandbox_probe

T = TypeVar("T")

NAME = "fhirgym-bwrap"
WORKSPACE = "/workspace"
#: Where the commands are inside: the sandbox's own ``/tmp`` (the workspace may be ``noexec``).
BIN = "/tmp/.fhirgym-bin"
#: Who commands run as inside (the sandbox's only user); ``user=`` may name it, nobody else.
USERS = ("65534", "nobody")
#: Host commands sent into the sandbox (those missing on the host are left out): about 5 MB.
DEFAULT_COMMANDS = (
    "bash", "sh", "cat", "ls", "head", "tail", "wc", "grep", "sed", "awk", "sort", "uniq", "cut",
    "tr", "paste", "comm", "join", "mkdir", "rmdir", "rm", "cp", "mv", "ln", "touch", "chmod", "find",
    "xargs", "env", "date", "basename", "dirname", "realpath", "readlink", "tee", "diff", "cmp", "id",
    "whoami", "uname", "seq", "sleep", "timeout", "stat", "du", "df", "printf", "echo", "test",
    "true", "false", "pwd", "md5sum", "sha256sum", "base64", "od", "nl", "fold", "expr", "yes", "nproc",
)

#: Runs inside the sandbox for one ``exec``; its inputs are the variables it names (JSON values).
_EXEC = r"""
import base64, os, signal, subprocess, sys
if not os.path.exists(bin_dir + "/.ready"):
    answer = {"install": True}  # a new sandbox (or a restarted one): the host sends the commands first
else:
    env = {"PATH": bin_dir + ":" + os.path.dirname(sys.executable), "HOME": "/workspace", "LANG": "C.UTF-8",
           "TMPDIR": "/tmp", **env}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
    except OSError as exc:
        answer = {"spawn_error": exc.errno, "message": f"{exc.filename or argv[0]}: {exc.strerror}"}
    else:
        try:
            proc.communicate(base64.b64decode(stdin) if stdin is not None else None, timeout=timeout)
            answer = {"rc": proc.returncode}
        except subprocess.TimeoutExpired:
            answer = {"timeout": True}
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what the command left running
            except OSError:
                pass
"""
#: Writes the commands (base64 of each binary) into ``bin_dir``, links python3 to this interpreter.
_INSTALL = r"""
import base64, os, sys
os.makedirs(bin_dir, exist_ok=True)
for name, data in files.items():
    with open(os.path.join(bin_dir, name), "wb") as f:
        f.write(base64.b64decode(data))
    os.chmod(os.path.join(bin_dir, name), 0o755)
for name in ("python3", "python"):
    if not os.path.lexists(os.path.join(bin_dir, name)):
        os.symlink(sys.executable, os.path.join(bin_dir, name))
open(os.path.join(bin_dir, ".ready"), "w").close()
"""
#: File transfer for paths outside the workspace (``/tmp``) or behind a symlink, as the sandbox sees them.
_FILE = r"""
import base64, os
try:
    if op == "write":
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        answer = {"ok": True}
    else:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            answer = {"size": size} if size > limit else {"data": base64.b64encode(f.read(limit + 1)).decode()}
except OSError as exc:
    answer = {"errno": exc.errno, "strerror": exc.strerror}
"""


class BwrapConfig(BaseModel):
    """The sandbox of each sample: its ``limits`` (default: the ``python`` tool's), ``unsafe`` (run with the
    layers that work where one is missing, like ``--unsafe-python``) and the host ``commands`` it gets.
    Pass it as ``SandboxEnvironmentSpec("fhirgym-bwrap", BwrapConfig(limits=SandboxLimits(cpu_s=5)))``, or
    as a YAML/JSON file of these fields (``limits:`` a mapping of ``SandboxLimits`` fields):
    ``("fhirgym-bwrap", "bwrap.yaml")``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limits: SandboxLimits = SandboxLimits()
    unsafe: bool = False
    commands: tuple[str, ...] = DEFAULT_COMMANDS


@functools.cache
def _binaries(commands: tuple[str, ...]) -> dict[str, str]:
    """The host's binaries of ``commands`` (base64, resolved through symlinks: ``awk`` is mawk's file)."""
    out = {}
    for name in commands:
        found = shutil.which(name)
        if found is not None:
            out[name] = base64.b64encode(Path(os.path.realpath(found)).read_bytes()).decode()
    return out


def _config(config: SandboxEnvironmentConfigType | None) -> BwrapConfig:
    if config is None:
        return BwrapConfig()
    if isinstance(config, BwrapConfig):
        return config
    if isinstance(config, str):  # a YAML (or JSON) file of BwrapConfig fields
        import yaml

        try:
            data = yaml.safe_load(Path(config).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{NAME} config {config!r}: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{NAME} config {config!r} must be a mapping of BwrapConfig fields")
        return BwrapConfig(**data)
    if isinstance(config, BaseModel):
        return BwrapConfig(**config.model_dump())
    raise TypeError(f"{NAME} takes a BwrapConfig or the path of a YAML file, not {type(config).__name__}")


def _inside(path: str | None, cwd: str = WORKSPACE) -> str:
    """A path as the sandbox sees it: relative ones under the workspace, normalised (``..`` resolved)."""
    if path is None:
        return cwd
    return posixpath.normpath(path if posixpath.isabs(path) else posixpath.join(cwd, path))


def _in_workspace(path: str) -> str | None:
    """The workspace-relative name of an inside path, or None when it is outside the workspace."""
    if path.startswith(WORKSPACE + "/"):
        return path[len(WORKSPACE) + 1:]
    return None


@sandboxenv(name=NAME)
class BwrapSandboxEnvironment(SandboxEnvironment):
    """One sample's bubblewrap sandbox (made on first use, closed at the sample's end)."""

    def __init__(self, config: BwrapConfig) -> None:
        super().__init__()
        self.config = config
        self._sandbox: Sandbox | None = None
        self._owned = True
        self._lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return BwrapConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        cfg = _config(config)
        probe = await anyio.to_thread.run_sync(sandbox_probe)
        if probe.missing and not cfg.unsafe:
            raise SandboxUnavailable(f"{NAME}: the sandbox cannot be set up here: {'; '.join(probe.missing)}. "
                                     "Install bubblewrap (bash scripts/_sandbox.sh), or pass "
                                     "BwrapConfig(unsafe=True) to run with the layers that work.")

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        return {"default": cls(_config(config))}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            await anyio.to_thread.run_sync(env.as_type(cls).close)

    def attach(self, sandbox: Sandbox) -> bool:
        """Use ``sandbox`` (a CodeAct episode's) instead of one of this environment's own, if nothing ran
        here yet; the episode keeps owning it. False when this environment already has its own."""
        with self._lock:
            if self._sandbox is not None:
                return self._sandbox is sandbox
            self._sandbox, self._owned = sandbox, False
            return True

    @property
    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(limits=self.config.limits, unsafe=self.config.unsafe)
            return self._sandbox

    def close(self) -> None:
        with self._lock:
            if self._sandbox is not None and self._owned:
                self._sandbox.close()
            self._sandbox = None

    # -- exec -------------------------------------------------------------------------------------------
    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        if user is not None and str(user) not in USERS:
            raise SandboxUserUnsupportedError(f"{NAME} runs commands as uid 65534 (nobody) only, not {user!r}")
        if not cmd:
            raise ValueError("exec needs a command")
        return await anyio.to_thread.run_sync(self._exec, [str(a) for a in cmd], input, cwd, env, timeout)

    def _exec(self, cmd: list[str], stdin: str | bytes | None, cwd: str | None, env: dict[str, str] | None,
              timeout: int | None) -> ExecResult[str]:
        sb = self.sandbox
        data = stdin.encode() if isinstance(stdin, str) else stdin
        wall = sb.limits.wall_s
        inputs = {"argv": cmd, "stdin": base64.b64encode(data).decode() if data is not None else None,
                  "cwd": _inside(cwd), "env": dict(env or {}), "bin_dir": BIN,
                  "timeout": timeout if timeout is not None and timeout < wall else None}
        r = self._run(sb, _EXEC, inputs)
        if isinstance(r.answer, dict) and r.answer.get("install"):
            self._install(sb)
            r = self._run(sb, _EXEC, inputs)
        answer = r.answer if isinstance(r.answer, dict) else {}
        if r.limit == "wall" or answer.get("timeout"):
            raise TimeoutError(f"command timed out after {min(timeout or wall, wall)} s")
        if r.limit == "output":
            raise OutputLimitExceededError(f"{sb.limits.output_bytes} bytes", r.stdout + r.stderr)
        if "spawn_error" in answer:
            code = 127 if answer["spawn_error"] == errno.ENOENT else 126
            return ExecResult(False, code, r.stdout, r.stderr + answer["message"] + "\n")
        if "rc" in answer:
            rc = answer["rc"]
            stderr = r.stderr
            if rc < 0:  # killed by a signal: say which, as a shell would
                stderr += f"[{NAME}: killed by {signal.Signals(-rc).name}{_why(-rc)}]\n"
                rc = 128 - rc
            return ExecResult(rc == 0, rc, r.stdout, stderr)
        # the call itself ended in a limit (memory, pids, CPU) before the command returned
        return ExecResult(False, 137, r.stdout, r.stderr + f"[{NAME}: {r.error or 'the command was killed'}]\n")

    @staticmethod
    def _run(sb: Sandbox, code: str, inputs: dict) -> SandboxResult:
        try:
            return sb.run(code, inputs)
        except SandboxUnavailable as exc:
            raise SandboxUnavailableError(str(exc)) from exc

    def _install(self, sb: Sandbox) -> None:
        """Send the configured commands into the sandbox's ``/tmp``."""
        files = _binaries(tuple(self.config.commands))
        r = self._run(sb, _INSTALL, {"bin_dir": BIN, "files": files})
        if not r.ok:
            size = sum(len(v) * 3 // 4 for v in files.values())
            raise SandboxUnavailableError(
                f"{NAME}: could not put the shell's commands ({size >> 20} MiB) into the sandbox's /tmp "
                f"(tmp_bytes {sb.limits.tmp_bytes >> 20} MiB): {_last_line(r.error)}")

    # -- files ------------------------------------------------------------------------------------------
    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        await anyio.to_thread.run_sync(self._write, _inside(file), data)

    def _write(self, path: str, data: bytes) -> None:
        sb = self.sandbox
        if self._on_host(path, lambda name: sb.write_file(name, data)) is None:
            r = self._run(sb, _FILE, {"op": "write", "path": path, "data": base64.b64encode(data).decode()})
            _raise_for(r, path)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        data = await anyio.to_thread.run_sync(self._read, _inside(file), SandboxEnvironmentLimits.MAX_READ_FILE_SIZE)
        return data.decode("utf-8") if text else data

    def _read(self, path: str, limit: int) -> bytes:
        sb = self.sandbox
        data = self._on_host(path, lambda name: sb.read_file(name, max_bytes=limit + 1))
        if data is not None:
            if len(data) > limit:
                raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
            return data
        # outside the workspace: read inside, within what one call may return (the sandbox's output cap)
        cap = min(limit, sb.limits.output_bytes * 3 // 4 - 1024)
        r = self._run(sb, _FILE, {"op": "read", "path": path, "limit": cap})
        answer = _raise_for(r, path)
        if "size" in answer:
            raise OutputLimitExceededError(f"{cap} bytes (files outside {WORKSPACE} are read through the sandbox)",
                                           None)
        return base64.b64decode(answer["data"])

    @staticmethod
    def _on_host(path: str, op: Callable[[str], T]) -> T | None:
        """``op(name)`` on a workspace file from the host, never through a symlink the code planted; None
        where the sandbox must do it itself (a path outside the workspace, or behind a symlink)."""
        if path == WORKSPACE:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        name = _in_workspace(path)
        if name is None:
            return None
        try:
            return op(name)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return None
            raise OSError(exc.errno, exc.strerror, path) from None  # named by its inside path


def _last_line(text: str | None) -> str:
    lines = (text or "no result").strip().splitlines()
    return lines[-1] if lines else "no result"


def _why(sig: int) -> str:
    return {signal.SIGXCPU: " (CPU time limit)", signal.SIGKILL: " (a limit, or the CPU hard limit)",
            signal.SIGXFSZ: " (file size limit)"}.get(signal.Signals(sig), "")


def _raise_for(r: SandboxResult, path: str) -> dict:
    """The answer of a file call, or the OSError it met (FileNotFoundError, PermissionError, ... by errno)."""
    answer = r.answer if isinstance(r.answer, dict) else None
    if answer is None:
        raise OSError(errno.EIO, f"the sandbox call failed: {r.error or 'no result'}", path)
    if "errno" in answer:
        raise OSError(answer["errno"], answer["strerror"], path)
    return answer
