"""The sandbox's host side of files and identity: who the code runs as, and what it writes to.

Why this exists: bubblewrap maps the code's uid to the uid that started it. Under a root host that made the code root on
the host (uid_map ``65534 0 1``): no capability, but owner of every root-owned file it could reach (``/proc/sys``,
device nodes, a setuid-root binary planted in the workspace). So a root host starts the sandbox as an unprivileged
**sandbox uid/gid** (``setpriv``, after the cgroups are joined); what that uid cannot reach is bind-mounted read-only
into a *stage* directory, and the workspace is a per-episode size-capped ``nosuid,nodev,noexec`` tmpfs whose root the
code cannot chmod. A normal user's sandbox runs as that user, in a private 0700 parent, with no disk cap beyond
RLIMIT_FSIZE per file (docs/SANDBOX.md, section "Root hosts and normal users"). Hand-written (``mount(2)`` through
ctypes): no maintained Python binding covers bind/tmpfs mounts and detaching unmounts, and the calls are four.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import grp
import os
import pwd
import stat
import tempfile
import threading
from pathlib import Path

#: Where the sandbox's uid/gid search starts under a root host (``FHIRGYM_SANDBOX_UID``/``_GID`` choose
#: one): the first id from here that no account and no group of the host has, within the ids the host's own
#: user namespace maps (a container maps 0-65535). Debian leaves 60000-64999 to packages, on demand only.
SANDBOX_ID_FIRST = 64_100
SANDBOX_ID_LAST = 64_999

#: Name of a workspace tmpfs (the ``source`` field of /proc/self/mountinfo) and prefixes of the private
#: directories, each with the host pid: what a later process sweeps when the pid is dead.
_WS_SOURCE = "fhirgym-ws-{pid}"
_WS_PREFIX = "fhirgym-ws-{pid}-"
_STAGE_PREFIX = "fhirgym-stage-{pid}-"

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MNT_DETACH = 32, 4096, 2


class SandboxIdError(RuntimeError):
    """No safe sandbox uid/gid (a bad ``FHIRGYM_SANDBOX_UID``, or every id of the range taken)."""


def is_root() -> bool:
    return os.geteuid() == 0


def _mapped(ident: int, map_file: str) -> bool:
    """Whether ``ident`` is mapped in this process's user namespace (its uid_map/gid_map)."""
    try:
        for line in Path(map_file).read_text().splitlines():
            inner, _, count = (int(x) for x in line.split())
            if inner <= ident < inner + count:
                return True
    except (OSError, ValueError):
        return True  # no map to read: the initial namespace maps everything
    return False


def _env_id(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) in (0, 65535, 4294967295):
        raise SandboxIdError(f"{name}={raw!r} is not a usable id: a positive integer, not root")
    return int(raw)


@functools.cache
def sandbox_ids() -> tuple[int, int]:
    """The host uid and gid the code runs as: this process's own when it is not root; under root, the
    chosen unprivileged pair (the same for every sandbox of the host; their namespaces keep them apart)."""
    if not is_root():
        return os.geteuid(), os.getegid()
    uid, gid = _env_id("FHIRGYM_SANDBOX_UID"), _env_id("FHIRGYM_SANDBOX_GID")
    if uid is not None:
        return uid, uid if gid is None else gid
    for n in range(SANDBOX_ID_FIRST, SANDBOX_ID_LAST + 1):
        try:
            pwd.getpwuid(n)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(n)
            continue
        except KeyError:
            pass
        if _mapped(n, "/proc/self/uid_map") and _mapped(n, "/proc/self/gid_map"):
            return n, n if gid is None else gid
    raise SandboxIdError(f"no free uid/gid in {SANDBOX_ID_FIRST}-{SANDBOX_ID_LAST} for the sandbox: "
                         "set FHIRGYM_SANDBOX_UID (and FHIRGYM_SANDBOX_GID) to an unused id")


def chown_to_sandbox(fd: int) -> None:
    """Give a host-made workspace entry to the sandbox's uid (a no-op when the host is not root)."""
    if is_root():
        os.fchown(fd, *sandbox_ids())


# --- mounts --------------------------------------------------------------------------------------------

@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc().mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def unmount(target: str) -> None:
    """Detach ``target`` (lazily: a sandbox still holding it keeps its copy until it exits)."""
    if _libc().umount2(target.encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def can_mount() -> str | None:
    """None when this host can give each workspace its own tmpfs (root, allowed to mount); else why not."""
    if not is_root():
        return "not root"
    d = tempfile.mkdtemp(prefix=_WS_PREFIX.format(pid=os.getpid()))
    try:
        _mount(_WS_SOURCE.format(pid=os.getpid()), d, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "size=64k")
        unmount(d)
        return None
    except OSError as exc:
        return str(exc)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(d)


def mount_workspace(path: str, size_bytes: int, inodes: int) -> None:
    """A fresh tmpfs on ``path``: ``size_bytes`` and ``inodes`` at most, no setuid, devices or exec; its
    root is root's with group access for the sandbox (0770), so the code cannot chmod it."""
    _, gid = sandbox_ids()
    _mount(_WS_SOURCE.format(pid=os.getpid()), path, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
           f"size={size_bytes},nr_inodes={inodes},mode=0770,uid=0,gid={gid}")


def private_parent() -> str:
    """A new directory only the sandbox's uid (and root) may enter, in the system's temp dir."""
    d = tempfile.mkdtemp(prefix=_WS_PREFIX.format(pid=os.getpid()))
    if is_root():
        os.chown(d, *sandbox_ids())
    os.chmod(d, 0o700)
    return d


def check_workspace_dir(path: Path) -> None:
    """A caller-given workspace: the sandbox's uid must reach it, and (not root: no tmpfs root that the code
    cannot chmod) its parent must be private."""
    parent = path.parent
    if is_root():
        blocked = unreachable_ancestor(str(parent), read=False)
        if blocked:
            uid, gid = sandbox_ids()
            raise ValueError(f"workspace_dir {path} is not reachable by the sandbox's uid {uid}/gid {gid}: "
                             f"{blocked} is closed to it; use a directory it can traverse, or let the sandbox "
                             "make its own (workspace_dir=None)")
    else:
        st = os.stat(parent)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"workspace_dir {path}: its parent {parent} must be private (yours, mode 0700), so "
                             "nothing the code makes in it can be reached by another user")


def _allows(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Whether ``uid``/``gid`` (no supplementary groups) has ``bits`` (r=4, x=1) on a file."""
    if st.st_uid == uid:
        return (st.st_mode >> 6) & bits == bits
    if st.st_gid == gid:
        return (st.st_mode >> 3) & bits == bits
    return st.st_mode & bits == bits


def unreachable_ancestor(path: str, read: bool = True) -> str | None:
    """The first directory on the way to ``path`` (itself included) that the sandbox's uid cannot use, or
    None: every ancestor searchable, and ``path`` readable (and searchable, for a directory; only searchable
    when not ``read``)."""
    uid, gid = sandbox_ids()
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        p = os.path.join(*parts[:i])
        try:
            st = os.stat(p)
        except OSError:
            return p
        last = i == len(parts)
        need = ((4 if read else 0) | (1 if stat.S_ISDIR(st.st_mode) else 0)) if last else 1
        if not _allows(st, uid, gid, need):
            return p
    return None


class _Stage:
    """Read-only binds, in a directory the sandbox's uid may enter, of host paths it cannot reach (an
    interpreter under ``/root``): bubblewrap resolves its bind sources as that uid. One per host process,
    unmounted at exit (or by a later process's sweep, if this one was killed)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dir: str | None = None
        self.binds: dict[str, str] = {}

    def source(self, path: str) -> str:
        """Where bubblewrap should bind ``path`` from: itself when reachable, else its staged copy."""
        if not is_root() or unreachable_ancestor(path) is None:
            return path
        with self.lock:
            if path in self.binds:
                return self.binds[path]
            if self.dir is None:
                self.dir = tempfile.mkdtemp(prefix=_STAGE_PREFIX.format(pid=os.getpid()))
                os.chown(self.dir, 0, sandbox_ids()[1])
                os.chmod(self.dir, 0o750)
                atexit.register(self.close)
            target = os.path.join(self.dir, str(len(self.binds)))
            if os.path.isdir(path):
                os.mkdir(target)
            else:
                Path(target).touch()
            _mount(path, target, None, _MS_BIND)
            _mount("none", target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
            self.binds[path] = target
            return target

    def close(self) -> None:
        with self.lock:
            for target in self.binds.values():
                with contextlib.suppress(OSError):
                    unmount(target)
            self.binds.clear()
            if self.dir is not None:
                remove_tree(self.dir)
                self.dir = None


STAGE = _Stage()


def sweep_stale_mounts() -> None:
    """Unmount and remove the workspace tmpfs mounts, stage binds and private directories left by host
    processes that died without cleaning up (a kill -9): their pid is in the names."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    tmp = tempfile.gettempdir()
    dead: set[str] = set()
    for line in lines:
        left, _, right = line.partition(" - ")
        target = left.split()[4].replace("\\040", " ")
        fields = right.split()
        source = fields[1] if len(fields) > 1 else ""
        pid = _dead_pid(source, "fhirgym-ws-") if source.startswith("fhirgym-ws-") else None
        name = os.path.relpath(target, tmp).split(os.sep)[0] if target.startswith(tmp + os.sep) else ""
        pid = pid or _dead_pid(name, "fhirgym-stage-") or _dead_pid(name, "fhirgym-ws-")
        if pid:
            with contextlib.suppress(OSError):
                unmount(target)
            if name:
                dead.add(os.path.join(tmp, name))
    with contextlib.suppress(OSError):
        for entry in os.scandir(tmp):
            if _dead_pid(entry.name, "fhirgym-ws-") or _dead_pid(entry.name, "fhirgym-stage-"):
                dead.add(entry.path)
    for d in dead:
        with contextlib.suppress(OSError):
            remove_tree(d)


def _dead_pid(name: str, prefix: str) -> str | None:
    """The pid in ``<prefix><pid>[-...]`` when no such process runs any more, else None."""
    if not name.startswith(prefix):
        return None
    pid = name[len(prefix):].split("-")[0]
    return pid if pid.isdigit() and not os.path.exists(f"/proc/{pid}") else None


# --- removal -------------------------------------------------------------------------------------------

def remove_tree(path: str) -> None:
    """Remove a directory tree the code made: iteratively (a tree 100,000 deep is fine), never following a
    symlink, through directory fds. Run once nothing of the sandbox is left that could change the tree.
    Missing is fine; what cannot be removed raises OSError."""
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        os.unlink(path)
        return
    stack: list[tuple[int, str]] = [(top, path)]  # a directory's fd, and its name in the one below it
    try:
        while stack:
            fd = stack[-1][0]
            sub = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        sub = entry.name
                        break
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.name, dir_fd=fd)
            if sub is None:
                fd, name = stack.pop()
                os.close(fd)
                if stack:
                    os.rmdir(name, dir_fd=stack[-1][0])
                continue
            os.chmod(sub, 0o700, dir_fd=fd)  # a directory the code closed to its owner (not a symlink: checked)
            stack.append((os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), sub))
    finally:
        for fd, _ in stack:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(path)


