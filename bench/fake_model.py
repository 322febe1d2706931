"""A fake OpenAI-compatible chat server on the loopback: scripted tool calls, a set latency, injected faults.

It stands in for a model server (a hosted API, vLLM, SGLang) when what is measured or tested is
fhirgym's side: how many episodes a machine can keep in flight, and what happens under backpressure.
Each chat completion is answered after ``latency`` seconds (± ``jitter``, uniformly) with a script of
``calls`` turns: every turn but the last calls ``searchResources`` for Patients (one search per call),
the last replies with an answer. The turn is the number of assistant messages in the request, so an
episode's script restarts with its conversation, however requests of many episodes interleave.

Faults: with probability ``rate_429`` a request gets HTTP 429 with ``Retry-After: retry_after``, with
probability ``rate_5xx`` an HTTP 503 (drawn from a seeded generator). Usage is a pure function of the
request and reply bytes, so an episode's exact token count can be recomputed from :attr:`log`, which
records every request (the episode's first user message hashed, status, usage, time).

uvicorn serves a bare ASGI callable: no framework, so that the server costs the machine little
beside the harness it measures. Run it in its own process for the bench
(``python bench/fake_model.py --port 0 --latency 0.5``: prints ``port N`` when listening) or in a
thread for tests (:meth:`FakeModel.start`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass, field

import orjson
import uvicorn

SEARCH = {"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {"gender": "female",
                                                                                          "_count": "5"}}}
ANSWER = '<answer>{"patient_id": "not-found"}</answer>'


@dataclass
class Hit:
    """One request as the server saw it."""

    episode: str  # sha256 of the conversation's first user message (its first 12 hex digits)
    turn: int
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    at: float = 0.0


@dataclass
class FakeModel:
    latency: float = 0.5
    jitter: float = 0.1
    calls: int = 3
    rate_429: float = 0.0
    rate_5xx: float = 0.0
    retry_after: float = 1.0
    seed: int = 0
    log: list[Hit] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- the ASGI app ------------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "GET" and scope["path"].endswith("/stats"):
            await _reply(send, 200, self.stats())
            if b"reset" in scope.get("query_string", b""):
                self.log.clear()
                self.peak_in_flight = self.in_flight
            return
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await _reply(send, 404, {"error": {"message": f"no route {scope['method']} {scope['path']}"}})
            return
        request = orjson.loads(body)
        messages = request.get("messages", [])
        first = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        episode = hashlib.sha256(str(first).encode()).hexdigest()[:12]
        turn = sum(m.get("role") == "assistant" for m in messages)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(max(0.0, self.latency + self._rng.uniform(-self.jitter, self.jitter)))
            draw = self._rng.random()
            if draw < self.rate_429:
                self.log.append(Hit(episode, turn, 429, at=time.monotonic()))
                await _reply(send, 429, {"error": {"message": "rate limited (fake)"}},
                             [(b"retry-after", str(self.retry_after).encode())])
                return
            if draw < self.rate_429 + self.rate_5xx:
                self.log.append(Hit(episode, turn, 503, at=time.monotonic()))
                await _reply(send, 503, {"error": {"message": "overloaded (fake)"}})
                return
            payload = self.completion(request, turn, len(body))
            usage = payload["usage"]
            self.log.append(Hit(episode, turn, 200, usage["prompt_tokens"], usage["completion_tokens"],
                                time.monotonic()))
            await _reply(send, 200, payload)
        finally:
            self.in_flight -= 1

    def completion(self, request: dict, turn: int, size: int) -> dict:
        """The scripted reply to turn ``turn``: a Patient search, or (the last turn) the answer."""
        tools = request.get("tools") or []
        if turn < self.calls - 1 and tools:
            call = {"id": f"call_{turn}", "type": "function",
                    "function": {"name": SEARCH["name"], "arguments": orjson.dumps(SEARCH["arguments"]).decode()}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish, out = "tool_calls", len(call["function"]["arguments"])
        else:
            message = {"role": "assistant", "content": ANSWER}
            finish, out = "stop", len(ANSWER)
        return {"id": f"chatcmpl-{turn}", "object": "chat.completion", "created": 0,
                "model": request.get("model", "fake"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": size // 4, "completion_tokens": out // 4 + 1,
                          "total_tokens": size // 4 + out // 4 + 1}}

    # -- serving -------------------------------------------------------------------------------------------
    def config(self) -> uvicorn.Config:
        return uvicorn.Config(self, log_level="warning", lifespan="off", backlog=4096, access_log=False)

    def start(self) -> FakeModel:
        """Serve on 127.0.0.1 (an ephemeral port, :attr:`port`) in a background thread."""
        sock = bound_socket()
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(self.config())
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake model server did not start")
            time.sleep(0.01)
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict:
        """What ``GET /stats`` answers: requests seen, by status, and the most that were in flight at once
        (``GET /stats?reset`` answers, then starts counting afresh)."""
        by: dict[str, int] = {}
        for hit in self.log:
            by[str(hit.status)] = by.get(str(hit.status), 0) + 1
        return {"requests": len(self.log), "by_status": by, "peak_in_flight": self.peak_in_flight,
                "in_flight": self.in_flight}

    def tokens_by_episode(self) -> dict[str, tuple[int, int, int]]:
        """episode → (successful requests, prompt tokens, completion tokens) as served."""
        out: dict[str, tuple[int, int, int]] = {}
        for hit in self.log:
            if hit.status == 200:
                n, p, c = out.get(hit.episode, (0, 0, 0))
                out[hit.episode] = (n + 1, p + hit.prompt_tokens, c + hit.completion_tokens)
        return out


def bound_socket(port: int = 0) -> socket.socket:
    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only for such sockets (else +40 ms a reply)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


async def _reply(send, status: int, payload: dict, headers: list | None = None) -> None:
    data = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.5)
    ap.add_argument("--jitter", type=float, default=0.1)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--rate-429", type=float, default=0.0)
    ap.add_argument("--rate-5xx", type=float, default=0.0)
    ap.add_argument("--retry-after", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    model = FakeModel(args.latency, args.jitter, args.calls, args.rate_429, args.rate_5xx, args.retry_after,
                      args.seed)
    sock = bound_socket(args.port)
    print(f"port {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(model.config())
    try:
        server.run(sockets=[sock])
    finally:
        served = sum(h.status == 200 for h in model.log)
        print(f"served {served} of {len(model.log)} requests, peak in flight {model.peak_in_flight}",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
