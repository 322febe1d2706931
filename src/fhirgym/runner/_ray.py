"""Episodes on a Ray cluster: worker actors run them, the driver alone writes the run directory.

For when one machine is not enough (CodeAct sandboxes cost CPU per call; many models at once). Ray is the
engine; this module only maps a run onto it: one actor per CPU, each running its share of the K episodes
in flight on threads as a local run does; workers open the world from the driver's path or build it from
its seed and check the sha256 (:class:`WorldRef`); the driver derives every seed (a sealed run's secret
never leaves it) and writes every result, so resume and ``--sealed`` are a local run's; a dead worker's
episodes go to the others, each at most :data:`MAX_TRIES` times, and written once. docs/SCALE.md, "On a
Ray cluster". Ray is an optional extra; nothing imports this module without it.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

try:
    import ray
    from ray.exceptions import RayActorError

    #: a worker that is restarting (this Ray's name for it; older ones say ActorDiedError only at the end)
    RESTARTING: tuple[type[BaseException], ...] = tuple(
        getattr(ray.exceptions, name) for name in ("ActorUnavailableError",) if hasattr(ray.exceptions, name))
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("running on Ray needs the ray extra: pip install 'fhirgym[ray]'") from exc

from ..agents import make_agent
from ..env import Config, get_config
from ..tasks import TaskWorld
from ..world import build_world, world_sha256
from ._dispatch import EpisodeRunner, Outcome, Recipe, RunError, Then, ensure_open_files, stream
from ._episode import EpisodeKey

#: Times one episode is handed out before the run gives up on it (its workers kept dying).
MAX_TRIES = 3
#: Times Ray restarts one worker actor.
MAX_RESTARTS = 8


class RayRunError(RunError):
    """The cluster could not run the episodes (a worker that cannot start, an episode that kills them)."""


@dataclass(frozen=True)
class WorldRef:
    """How a worker gets the driver's world: its file, or a build from its seed, sha256-checked."""

    path: str
    sha256: str
    build: dict | None  # seed, patients, anchor: what rebuilds it (None: an imported world)

    @classmethod
    def of(cls, world: TaskWorld) -> WorldRef:
        m = world.manifest
        build = ({"seed": m["seed"], "patients": m["patients"], "anchor": m["anchor"]}
                 if all(m.get(k) is not None for k in ("seed", "patients", "anchor")) else None)
        return cls(str(world.path), world_sha256(world.path), build)

    def open(self) -> TaskWorld:
        path = Path(self.path)
        if path.is_file() and world_sha256(path) == self.sha256:
            return TaskWorld.open(path)
        where = f"{socket.gethostname()}: the world {self.path}"
        if self.build is None:
            raise RayRunError(f"{where} is not here (or differs) and was not built from a seed: put it where "
                              "every node reads it")
        built = build_world(seed=self.build["seed"], patients=self.build["patients"],
                            anchor_date=self.build["anchor"]).path
        digest = world_sha256(built)
        if digest != self.sha256:
            raise RayRunError(f"{where} is not here, and the one built from its seed {self.build} has sha256 "
                              f"{digest}, not {self.sha256}: the nodes run different fhirgym versions?")
        return TaskWorld.open(built)


class EpisodeWorker:
    """A Ray actor: one world, one agent, one configuration; ``run`` is one episode (on its threads)."""

    def __init__(self, world: WorldRef, agent: Any, config: str | Config, options: dict, concurrency: int,
                 driver_version: str) -> None:
        if version("fhirgym") != driver_version:
            raise RayRunError(f"{socket.gethostname()} has fhirgym {version('fhirgym')}, the driver "
                              f"{driver_version}: install the same version on every node")
        ensure_open_files(concurrency)
        if isinstance(agent, tuple):  # (agent, model, base_url, max_iterations[, backend options]): built here
            agent = make_agent(*agent[:4], **(agent[4] if len(agent) > 4 else {}))
        self.runner = EpisodeRunner(world.open(), agent, get_config(config) if isinstance(config, str) else config,
                                    capacity=2 * concurrency + 16, **options)

    def where(self) -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    def run(self, key: EpisodeKey, recipe: Recipe, config: Config | None = None) -> Outcome:
        return self.runner(key, recipe, config)


@dataclass
class _Job:
    key: EpisodeKey
    recipe: Recipe
    config: Config | None
    then: Then | None
    future: Future = field(default_factory=Future)
    tries: int = 0
    avoid: int | None = None  # the worker it last died on


class RayPool:
    """``submit(key, recipe)`` → a Future of (line, transcript), run on the cluster; ``then`` runs on
    the driver (in a writer thread) before the future resolves. Use as a context manager."""

    def __init__(self, world: TaskWorld, agent: Any, config: Config, *, parallel: int, address: str | None = None,
                 options: dict | None = None, log: Callable[[str], None] | None = None) -> None:
        if not ray.is_initialized():
            ray.init(address=address or None, log_to_driver=False)
        self.log = log or (lambda _m: None)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = max(1, min(cpus, parallel))
        self.per = math.ceil(max(1, parallel) / n)
        config_ref: str | Config = config.name if _registered(config) else config
        actor = ray.remote(EpisodeWorker).options(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=0,
                                                  max_concurrency=self.per)
        try:
            self.workers = [actor.remote(WorldRef.of(world), agent, config_ref, options or {}, self.per,
                                         version("fhirgym")) for _ in range(n)]
            where = ray.get([w.where.remote() for w in self.workers])
        except TypeError as exc:  # the agent or the configuration does not pickle
            raise RayRunError(f"the agent or configuration cannot be sent to Ray workers: {exc}") from exc
        except RayActorError as exc:
            raise RayRunError(f"a Ray worker could not start: {exc}") from exc
        nodes = sorted({host for host, _ in where})
        self.log(f"ray: {n} workers, up to {self.per} episodes at once each, on {len(nodes)} node(s): "
                 f"{', '.join(nodes)}")
        self.load = [0] * n
        self.up = [True] * n  # False from a worker's death until it answers again (Ray restarts it)
        self.retried = 0
        self._queue: deque[_Job] = deque()
        self._pending: dict[Any, tuple[int, _Job]] = {}
        self._probes: dict[Any, int] = {}  # a "where" call to a worker that died: it is back when answered
        self._reprobe: dict[int, float] = {}  # worker → when to ask it again (still restarting)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._abandoned = False
        self._writer = ThreadPoolExecutor(8, thread_name_prefix="ray-results")
        self._thread = threading.Thread(target=self._dispatch, name="ray-dispatch", daemon=True)
        self._thread.start()

    def submit(self, key: EpisodeKey, recipe: Recipe, config: Config | None = None,
               then: Then | None = None) -> Future:
        job = _Job(key, recipe, config, then)
        with self._lock:
            self._queue.append(job)
        self._wake.set()
        return job.future

    def stream(self, work, then: Then | None = None):
        """Every episode of ``work``, as they finish (see ``_dispatch.stream``)."""
        return stream(self, work, then)

    # -- the driver's loop ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        while not self._abandoned:
            self._fill()
            now = time.monotonic()
            for i, when in list(self._reprobe.items()):
                if when <= now:
                    del self._reprobe[i]
                    self._probes[self.workers[i].where.remote()] = i
            if not self._pending and not self._probes and not self._reprobe:
                if self._closed and not self._queue:
                    return
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            # a batch: whatever finished within 20 ms (one wait per batch, not one per episode)
            refs = [*self._pending, *self._probes]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0.02)
            for ref in ready:
                if ref in self._probes:
                    self._probed(ref)
                else:
                    self._finished(ref)

    def _fill(self) -> None:
        with self._lock:
            while self._queue:
                free = [i for i in range(len(self.workers)) if self.up[i] and self.load[i] < self.per]
                if not free:
                    return
                job = self._queue.popleft()
                i = min(free, key=lambda w: (w == job.avoid, self.load[w]))
                self.load[i] += 1
                self._pending[self.workers[i].run.remote(job.key, job.recipe, job.config)] = (i, job)

    def _down(self, i: int) -> None:
        """Worker ``i`` died: nothing goes to it until it answers a probe (Ray is restarting it)."""
        if self.up[i]:
            self.up[i] = False
            self._probes[self.workers[i].where.remote()] = i

    def _probed(self, ref: Any) -> None:
        i = self._probes.pop(ref)
        try:
            ray.get(ref)
        except RESTARTING:
            self._reprobe[i] = time.monotonic() + 0.2  # ask again soon
            return
        except RayActorError as exc:
            self.log(f"ray: worker {i} is gone for good ({type(exc).__name__})")
            if not any(self.up) and not self._probes and not self._reprobe:  # no worker left: nothing can run
                with self._lock:
                    jobs, self._queue = list(self._queue), deque()
                for job in jobs:
                    job.future.set_exception(RayRunError(f"every Ray worker died; {job.key.id} did not run"))
            return
        self.up[i] = True
        self.log(f"ray: worker {i} is back")

    def _finished(self, ref: Any) -> None:
        i, job = self._pending.pop(ref)
        self.load[i] -= 1
        try:
            line, transcript = ray.get(ref)
        except RayActorError as exc:  # the worker died (Ray restarts it) with this episode in flight
            self._down(i)
            job.tries += 1
            if job.tries >= MAX_TRIES:
                job.future.set_exception(RayRunError(
                    f"{job.key.id}: its worker died {job.tries} times ({type(exc).__name__}); the run stops here, "
                    "--resume continues it"))
                return
            job.avoid = i
            self.retried += 1
            self.log(f"ray: worker {i} lost {job.key.id} ({type(exc).__name__}); handed to another worker")
            with self._lock:
                self._queue.appendleft(job)
            return
        except Exception as exc:  # the episode's own code raised on the worker: the run fails, as locally
            job.future.set_exception(exc)
            return
        try:
            self._writer.submit(self._deliver, job, line, transcript)
        except RuntimeError:  # closed after an error: this episode is left to --resume
            job.future.cancel()

    @staticmethod
    def _deliver(job: _Job, line: dict, transcript: dict) -> None:
        try:
            if job.then is not None:
                job.then(line, transcript)
        except BaseException as exc:
            job.future.set_exception(exc)
        else:
            job.future.set_result((line, transcript))

    # -- closing ----------------------------------------------------------------------------------------
    def close(self, wait: bool = True) -> None:
        with self._lock:
            if not wait:  # after an error or Ctrl-C: nothing new starts, what is in flight is abandoned
                for job in self._queue:
                    job.future.cancel()
                self._queue.clear()
                self._abandoned = True
            self._closed = True
        self._wake.set()
        if wait:
            self._thread.join()
        self._writer.shutdown(wait=True)
        for w in self.workers:
            ray.kill(w)

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.close(wait=exc_type is None)


def _registered(config: Config) -> bool:
    try:
        return get_config(config.name) is config
    except KeyError:
        return False
