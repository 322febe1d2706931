"""Evaluation at scale: can one machine keep a model server busy? ``fhirgym eval`` against a fake endpoint.

The fake OpenAI-compatible server (``fake_model.py``, its own process) answers every chat completion
after ``--latency`` seconds (± ``--jitter``) with a script of ``--calls`` turns: a Patient search per
turn, then an answer. For each K of ``--ks`` the bench runs, as a subprocess,

    fhirgym eval --agent react --model openai-compatible/fake --base-url URL --parallel K --tasks ... --seeds ...

over max(8, 4K) episodes or more (8 seeds a family; every family from K = 128), watches it from outside
(``/proc``: CPU time, RSS, open descriptors; the growing ``results.jsonl``) and prints:

- episodes/s in the steady state (from the K-th finished episode to the (N−K)-th: after the first wave,
  before the drain), and its ratio to the ideal K / (calls × latency);
- the harness's CPU per episode and per model call in that window (process CPU time, not wall);
- peak RSS, and RSS per live episode ((peak RSS − the K=1 run's) / (K − 1));
- open file descriptors (peak), the most requests the server saw in flight, the server's own CPU;
- the load average before and after each run (the machine may be shared: figures move with it).

``--profile`` then runs the same episodes serially in this process against a zero-latency server and
says where an episode's CPU goes, by stage (thread CPU time, so the server thread is not counted).
``--rate-429`` / ``--rate-5xx`` inject backpressure (the runs then also count retries and errors).

    .venv/bin/python bench/bench_scale.py [--ks 1,16,64,256,1024] [--latency 1.0] [--world FILE] [--profile]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson

HERE = Path(__file__).resolve().parent
FHIRGYM = Path(sys.executable).with_name("fhirgym")
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_s(pid: int) -> float:
    """utime + stime of a live process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Lines:
    """Counts the lines of a growing file, reading only what was appended since the last look."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.count = path, 0, 0

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return 0
        self.offset += len(chunk)
        self.count += chunk.count(b"\n")
        return self.count


def selection(families: list[str], episodes: int) -> tuple[str, int]:
    """--tasks and --seeds giving at least ``episodes`` episodes. Every family's first instance in a
    process also warms that family's caches (up to 0.2 s), so each family runs 8 seeds or more: every
    family from 520 episodes (K ≥ 128), below that families spread over the list (another mix: families
    differ tenfold in cost, so CPU per episode is comparable between rows of the same mix only)."""
    if episodes >= 8 * len(families):
        return "all", math.ceil(episodes / len(families))
    n = math.ceil(episodes / 8)
    step = len(families) / n
    return ",".join(families[int(i * step)] for i in range(n)), 8


def start_server(args, latency: float) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(HERE / "fake_model.py"), "--latency", str(latency), "--jitter", str(args.jitter),
           "--calls", str(args.calls), "--rate-429", str(args.rate_429), "--rate-5xx", str(args.rate_5xx),
           "--retry-after", str(args.retry_after)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "port N" once listening
    if not line.startswith("port "):
        proc.kill()
        raise SystemExit(f"the fake model server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


def run_k(k: int, args, world: str, url: str, server: subprocess.Popen, families: list[str]) -> dict:
    episodes = max(8, 4 * k)
    tasks, seeds = selection(families, episodes)
    httpx.get(url + "/stats?reset")
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-k{k}-") as tmp:
        out = Path(tmp) / "run"
        cmd = [str(FHIRGYM), "eval", "--agent", "react", "--model", "openai-compatible/fake", "--base-url", url,
               "--tasks", tasks, "--seeds", str(seeds), "--parallel", str(k), "--out", str(out), "--no-report",
               "--world", world, *args.eval_args]
        before = load()
        server_cpu0 = cpu_s(server.pid)
        t0 = time.perf_counter()
        log = open(Path(tmp) / "stderr", "w+b")  # noqa: SIM115 (read back below)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        lines = Lines(out / "results.jsonl")
        marks: list[tuple[int, float, float]] = []  # (finished episodes, wall, harness cpu)
        peak_rss = peak_fds = 0.0
        last = 0
        while True:
            pid, code, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:  # ended (reaped here, for its rusage)
                proc.returncode = os.waitstatus_to_exitcode(code)
                break
            try:
                cpu = cpu_s(proc.pid)
                peak_rss = max(peak_rss, rss_mib(proc.pid))
                peak_fds = max(peak_fds, fds(proc.pid))
            except OSError:
                continue
            n = lines.poll()
            if n != last:
                marks.append((n, time.perf_counter() - t0, cpu))
                last = n
            time.sleep(args.poll)
        wall = time.perf_counter() - t0
        log.seek(0)
        err = log.read().decode(errors="replace")
        log.close()
        n = lines.poll()
        results = [orjson.loads(x) for x in (out / "results.jsonl").read_bytes().splitlines()] if n else []
    server_cpu = cpu_s(server.pid) - server_cpu0
    stats = httpx.get(url + "/stats").json()
    if not results or len(results) < episodes:
        raise SystemExit(f"K={k}: the run ended with {len(results)} of {episodes} episodes:\n{err[-2000:]}")
    # the steady state: from the K-th finished episode (the first wave is in) to the (N-K)-th (afterwards
    # fewer than K are live): whole cycles of K episodes even when they finish in waves
    first = next(m for m in marks if m[0] >= k)
    end = next((m for m in marks if m[0] >= len(results) - k), marks[-1])
    rate = (end[0] - first[0]) / (end[1] - first[1]) if end[1] > first[1] else float("nan")
    cpu_ep = 1000 * (end[2] - first[2]) / max(1, end[0] - first[0])
    calls = sum(r["iterations"] for r in results) / len(results)
    ideal = k / (args.calls * args.latency)
    status = Counter(r["status"] for r in results)
    return {"k": k, "episodes": len(results), "wall": wall, "rate": rate, "ideal": ideal, "ratio": rate / ideal,
            "cpu_ep": cpu_ep, "cpu_call": cpu_ep / max(calls, 1e-9), "calls": calls, "rss": peak_rss,
            "fds": int(peak_fds), "in_flight": stats["peak_in_flight"], "server_cpu": server_cpu,
            "requests": stats["requests"], "by_status": stats["by_status"], "status": dict(status),
            "load_before": before, "load_after": load(), "total_cpu": usage.ru_utime + usage.ru_stime,
            "max_rss": usage.ru_maxrss / 1024}


def table(rows: list[dict]) -> str:
    base = rows[0]["rss"] if rows and rows[0]["k"] == 1 else None
    head = ("| K | episodes | episodes/s | ideal/s | ratio | harness CPU ms/episode | ms/call | peak RSS MiB "
            "| RSS/live episode MiB | peak fds | peak in flight | server CPU s | load before → after |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        per = f"{(r['rss'] - base) / (r['k'] - 1):.2f}" if base is not None and r["k"] > 1 else "-"
        out.append(f"| {r['k']} | {r['episodes']} | {r['rate']:.1f} | {r['ideal']:.1f} | {r['ratio']:.2f} | "
                   f"{r['cpu_ep']:.1f} | {r['cpu_call']:.2f} | {r['rss']:.0f} | {per} | {r['fds']} | "
                   f"{r['in_flight']} | {r['server_cpu']:.1f} | {r['load_before']} → {r['load_after']} |")
    return "\n".join(out)


# -- where an episode's CPU goes ------------------------------------------------------------------------

STAGES = {  # (module, owner or None, attribute) → stage
    ("fhirgym.runner._dispatch", None, "make_instance"): "instance: sample, setup, gold",
    ("fhirgym.tasks._family", "Instance", "reference"): "instance: reference run (expected_min_calls)",
    ("fhirgym.env._episode", "Episode", "reset"): "episode: fork + tools",
    ("fhirgym.env._episode", "Episode", "step"): "episode: tool calls",
    ("fhirgym.env._episode", "Episode", "submit"): "episode: diff + validation",
    ("fhirgym.env._episode", "Episode", "floor"): "episode: nothing-found floor",
    ("fhirgym.env._episode", "Episode", "close"): "episode: close",
    ("fhirgym.agents._openai", "OpenAIBackend", "_create"): "model calls: HTTP + JSON",
    ("fhirgym.agents._openai", "OpenAIBackend", "_result"): "model calls: reply parsing",
    ("fhirgym.runner._dispatch", None, "write_atomic"): "files: transcript",
    ("fhirgym.runner._dispatch", None, "append_result"): "files: result line + fsync",
    ("fhirgym.runner._dispatch", None, "run_episode"): "(run_episode, inclusive)",
}


def profile(args, world_path: str, families: list[str]) -> None:
    """Serial episodes in this process; thread CPU time per stage (stages nest: the table says which)."""
    import importlib

    sys.path.insert(0, str(HERE))
    from fake_model import FakeModel
    from fhirgym.runner import EvalSpec, run_eval
    from fhirgym.tasks import TaskWorld, make_instance, select

    spent: Counter = Counter()

    def timed(stage, fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                spent[stage] += time.thread_time() - t
        return wrapper

    for (module, owner, attr), stage in STAGES.items():
        target = importlib.import_module(module)
        target = getattr(target, owner) if owner else target
        value = target.__dict__[attr]
        if isinstance(value, functools.cached_property):
            wrapped = functools.cached_property(timed(stage, value.func))
            wrapped.__set_name__(target, attr)
            setattr(target, attr, wrapped)
        else:
            setattr(target, attr, timed(stage, value))
    world = TaskWorld.open(world_path)
    for fam in select("all"):  # the per-world caches, warmed once per process (not an episode's cost)
        make_instance(fam, 10_000, world)
    with FakeModel(latency=0, jitter=0, calls=args.calls) as fake, tempfile.TemporaryDirectory() as tmp:
        spec = EvalSpec(out=Path(tmp) / "run", agent="react", model="openai-compatible/fake", base_url=fake.base_url,
                        tasks="all", seeds=list(range(args.profile_seeds)))
        t = time.thread_time()
        results = run_eval(spec, world)
        total = time.thread_time() - t
    n = len(results)
    calls = sum(r["iterations"] for r in results) / n
    print(f"\nwhere an episode's CPU goes: {n} episodes run one at a time in this process, {calls:.1f} model calls "
          f"each (thread CPU time; load {load()}):")
    print(f"{'stage':50} {'ms/episode':>10}")
    for stage in STAGES.values():
        print(f"{stage:50} {1000 * spent[stage] / n:10.2f}")
    inclusive = spent["(run_episode, inclusive)"]
    print(f"{'agent loop, messages, result line (rest of run_episode)':50} "
          f"{1000 * (inclusive - sum(spent[s] for s in STAGES.values() if s.startswith(('episode', 'model')))) / n:10.2f}")
    print(f"{'total (the whole run_eval)':50} {1000 * total / n:10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ks", default="1,16,64,256,1024")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per model call (the server's)")
    ap.add_argument("--jitter", type=float, default=0.1)
    ap.add_argument("--calls", type=int, default=3, help="model calls per episode")
    ap.add_argument("--rate-429", type=float, default=0.0)
    ap.add_argument("--rate-5xx", type=float, default=0.0)
    ap.add_argument("--retry-after", type=float, default=1.0)
    ap.add_argument("--world", help="world file (default: the 10-patient demo world, built once)")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between looks at the run")
    ap.add_argument("--profile", action="store_true", help="also say where an episode's CPU goes")
    ap.add_argument("--profile-seeds", type=int, default=3)
    ap.add_argument("--eval-args", nargs=argparse.REMAINDER, default=[], help="more `fhirgym eval` options")
    args = ap.parse_args()

    from fhirgym.tasks import select
    from fhirgym.world import build_world

    world = args.world or str(build_world(seed=42, patients=10).path)
    families = [f.id for f in select("all")]
    server, url = start_server(args, args.latency)
    rows = []
    try:
        print(f"fake model server {url}: latency {args.latency} s ± {args.jitter}, {args.calls} calls per episode; "
              f"world {world}; {os.cpu_count()} CPUs; load {load()}", flush=True)
        for k in [int(x) for x in args.ks.split(",")]:
            row = run_k(k, args, world, url, server, families)
            rows.append(row)
            extra = "" if set(row["by_status"]) <= {"200"} else f"; server answered {row['by_status']}"
            print(f"K={k}: {row['episodes']} episodes in {row['wall']:.1f} s ({row['status']}), "
                  f"{row['rate']:.1f}/s = {row['ratio']:.2f} of ideal; {row['cpu_ep']:.1f} ms CPU/episode; "
                  f"run CPU {row['total_cpu']:.1f} s{extra}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    print()
    print(table(rows))
    if args.profile:
        profile(args, world, families)


if __name__ == "__main__":
    main()
