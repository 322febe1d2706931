"""Episodes in flight: instances built once, many episodes at a time, every result written once.

An evaluation against a served model spends almost all of its wall time waiting for the model, so it runs K episodes at
once (``--parallel K``). The pieces here serve a run in this process (K threads) and a run on Ray (``_ray.py``), so both
give the same lines: a :class:`Recipe` is what builds an episode's instance (a sealed run derives its seed on the
driver: the secret never leaves it); an :class:`InstanceCache` builds every instance once however many episodes ask for
it at once, and drops it once the run has moved on, so memory follows K, not the size of the run; an
:class:`EpisodeRunner` runs one episode; a :class:`ResultSink` writes the transcript, then the line, once per episode
id; a :class:`ThreadPool` runs K threads, each writing its own results so that their ``fsync`` waits overlap. Threads,
not asyncio: agents are synchronous by protocol, and an episode's harness cost is CPU either way (docs/SCALE.md).
"""

from __future__ import annotations

import contextlib
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._gate import held
from ..env import Config
from ..tasks import Instance, TaskWorld, make_instance
from ._episode import EpisodeKey, run_episode
from ._results import append_result, write_atomic

Outcome = tuple[dict, dict]  # (result line, transcript)


class RunError(RuntimeError):
    """The episodes cannot run as asked (too few open files allowed; a cluster that cannot run them)."""

Then = Callable[[dict, dict], Any]


@dataclass(frozen=True)
class Recipe:
    """How to build an episode's instance anywhere the world is: nothing of a sealed run's secret."""

    task_id: str
    seed: int  # the instance's own seed (in a sealed run, derived from the episode's public seed)
    paraphrase: int = 0
    written: bool = False  # a paraphrase: the phrasing written by us when no LLM one is cached
    question: Any = None  # the QA track: the question (its instance needs nothing else)

    @property
    def key(self) -> tuple[str, int, int]:
        return self.task_id, self.seed, self.paraphrase

    def build(self, world: TaskWorld) -> Instance:
        if self.question is not None:
            from ..tasks.qa import qa_instance

            inst = qa_instance(self.question, world)
        else:
            inst = make_instance(self.task_id, self.seed, world)
        if self.paraphrase:
            from ..tasks import cached_paraphrase, offline_paraphrase

            inst = (offline_paraphrase if self.written else cached_paraphrase)(inst, self.paraphrase)
        inst.reference  # noqa: B018  (its run is computed here, once, not by each of the instance's episodes)
        return inst


class _Slot:
    __slots__ = ("instance", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instance: Instance | None = None


class InstanceCache:
    """Instances by recipe: built once (other askers wait for that build, builds of different instances
    run side by side), the least recently asked dropped past ``capacity``."""

    def __init__(self, world: TaskWorld, capacity: int = 64) -> None:
        self.world = world
        self.capacity = max(1, capacity)
        self._slots: OrderedDict[tuple, _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, recipe: Recipe) -> Instance:
        with self._lock:
            slot = self._slots.get(recipe.key)
            if slot is None:
                slot = self._slots[recipe.key] = _Slot()
                while len(self._slots) > self.capacity:
                    self._slots.popitem(last=False)
            else:
                self._slots.move_to_end(recipe.key)
        with slot.lock:
            if slot.instance is None:
                slot.instance = recipe.build(self.world)
            return slot.instance


class EpisodeRunner:
    """Runs episodes of one evaluation: ``runner(key, recipe)`` → (result line, transcript).

    ``budget``: characters per tool output; None: what the agent's model can afford (a local model:
    less), else the tools' default."""

    def __init__(self, world: TaskWorld, agent, config: Config, *, setting: str = "default",
                 model: str | None = None, budget: int | None = None, max_iterations: int = 15,
                 unsafe_python: bool = False, capacity: int = 64) -> None:
        self.instances = InstanceCache(world, capacity)
        self.agent = agent
        self.config = config
        self.options = {"setting": setting, "model": model, "max_iterations": max_iterations,
                        "unsafe_python": unsafe_python,
                        "budget": budget or getattr(getattr(agent, "backend", None), "tool_budget", None)}

    def __call__(self, key: EpisodeKey, recipe: Recipe, config: Config | None = None,
                 then: Then | None = None) -> Outcome:
        """``then(line, transcript)``: run right after the episode (e.g. writing it), on the same thread."""
        # an agent that waits only for its model: one episode's harness work at a time (fhirgym/_gate.py)
        with held(bool(getattr(self.agent, "cooperative", False))):
            out = run_episode(key, self.instances.get(recipe), self.agent, config or self.config, **self.options)
            if then is not None:
                then(*out)
            return out


class ResultSink:
    """Writes finished episodes into a run directory, each episode id once (a retried episode whose
    first result arrived after all is not written twice)."""

    def __init__(self, out: Path, done: set[str] | None = None) -> None:
        self.out = out
        self._written = set(done or ())
        self._lock = threading.Lock()

    def write(self, line: dict, transcript: dict) -> bool:
        with self._lock:
            if line["episode_id"] in self._written:
                return False
            self._written.add(line["episode_id"])
        write_atomic(self.out / line["transcript"], transcript)
        append_result(self.out, line)
        return True


class ThreadPool:
    """Episodes on ``parallel`` threads of this process; ``then(line, transcript)`` runs on the same thread."""

    def __init__(self, runner: EpisodeRunner, parallel: int) -> None:
        self.runner = runner
        self.parallel = max(1, parallel)
        ensure_open_files(self.parallel)
        self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="episode")  # (threads start on use)

    def submit(self, key: EpisodeKey, recipe: Recipe, config: Config | None = None,
               then: Then | None = None) -> Future:
        return self._pool.submit(self.runner, key, recipe, config, then)

    def stream(self, work: Iterable[tuple[EpisodeKey, Recipe]], then: Then | None = None) -> Iterator[Outcome]:
        """Every episode of ``work``, as they finish; one at a time: in the calling thread, in order."""
        if self.parallel == 1:
            for key, recipe in work:
                yield self.runner(key, recipe, None, then)
            return
        yield from stream(self, work, then)

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self) -> ThreadPool:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        # an error or Ctrl-C: no new episode starts; after an error the running ones finish and are kept
        self.close(wait=exc_type is not KeyboardInterrupt)


def stream(pool, work: Iterable[tuple[EpisodeKey, Recipe]], then: Then | None = None) -> Iterator[Outcome]:
    """Submit every episode of ``work`` to ``pool``; yield their outcomes as they finish."""
    for future in as_completed([pool.submit(key, recipe, then=then) for key, recipe in work]):
        yield future.result()


#: Descriptors a live episode may hold: its forked store's base file, a connection to the model
#: server, the result and transcript files being written; plus what the process holds anyway.
FILES_PER_EPISODE, FILES_BASE = 3, 256


def ensure_open_files(parallel: int) -> None:
    """Raise the soft limit on open files to what ``parallel`` episodes need (up to the hard limit);
    refuse clearly when even the hard limit is too low, rather than fail mid-run with EMFILE."""
    need = FILES_BASE + FILES_PER_EPISODE * parallel
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise RunError(f"{parallel} episodes at once need about {need} open files, and this process may open "
                      f"{hard} (ulimit -Hn): lower --parallel, or raise the limit")
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
