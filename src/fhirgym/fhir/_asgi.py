"""ASGI adapter: HTTP in, :meth:`FhirServer.handle` out. No FHIR logic lives here.

The FHIR API is served under ``/fhir``. Admin operations (snapshot, reset) exist only when the app is built with
``admin=True`` and live under a separate ``/admin`` prefix, never under the FHIR base. Each request is served (and its
response serialised) in a worker thread, not on the event loop: a long request must not stop the server from accepting
and answering others (a GET on a file-backed store runs beside a long write, see :meth:`FhirServer.handle`), nor from
hearing SIGTERM. What that hop costs and buys, measured: docs/SERVER.md, section "Concurrency: no request stops the
others". Its HTTP edges (a body over ``max_body_bytes`` drained before the 413 so a client still sending sees it, a
client that disconnects while sending is one log line): docs/SERVER.md, "Limits" and "HTTP edges".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from urllib.parse import parse_qsl

import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from ._errors import FhirError, Issue, operation_outcome
from ._http import FHIR_JSON, Request, Response
from ._json import dumps
from ._server import FhirServer

log = logging.getLogger("fhirgym.fhir")

#: a body over the limit is still read (and dropped) up to this many times the limit, so that the client
#: sees the 413; a larger one is not worth receiving: the connection is closed after the 413
_DRAIN_FACTOR = 4
#: worker threads for requests other than GET: they take turns on the store anyway, and must not take all of
#: the threads that GETs, which run beside them, need
_WRITE_THREADS = 4
#: seconds uvicorn waits after the grace period before it cancels what still runs (which it answers with
#: a plain-text 500): requests stopped at their next check need that long to send their 503
_SHUTDOWN_MARGIN = 3.0


def _render(resp: Response, pretty: bool = False) -> HttpResponse:
    headers = dict(resp.headers)
    if resp.body is None:
        return HttpResponse(status_code=resp.status, headers=headers)
    option = orjson.OPT_INDENT_2 if pretty else 0
    return HttpResponse(dumps(resp.body, option=option), status_code=resp.status, headers=headers,
                        media_type=FHIR_JSON)


def create_app(server: FhirServer, admin: bool = False) -> Starlette:
    """The ASGI application for ``server`` (FHIR base URL path: ``/fhir``)."""
    limit = server.config.max_body_bytes

    async def read_body(request: HttpRequest) -> bytes:
        declared = request.headers.get("content-length")
        size = int(declared) if declared and declared.isdigit() else None
        if size is not None and size > limit:
            refusal = FhirError(413, f"Body of {declared} bytes exceeds the limit of {limit}", "too-costly")
            if size > _DRAIN_FACTOR * limit or request.headers.get("expect", "").lower() == "100-continue":
                refusal.headers["Connection"] = "close"  # not worth (or not yet) sent: no reading it
            else:
                await _drain(request.stream())
            raise refusal
        chunks, size = [], 0
        stream = request.stream()
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                refusal = FhirError(413, f"Body exceeds the limit of {limit} bytes", "too-costly")
                if not await _drain(stream, _DRAIN_FACTOR * limit - size):
                    refusal.headers["Connection"] = "close"
                raise refusal
            chunks.append(chunk)
        return b"".join(chunks)

    limiters: dict[str, anyio.CapacityLimiter] = {}  # made inside the event loop, on first use

    def serve(req: Request, pretty: bool) -> HttpResponse:
        return _render(server.handle(req), pretty)

    async def in_thread(req: Request, pretty: bool) -> HttpResponse:
        """Serve ``req`` in a worker thread: GETs in one of ``read_workers``, the rest in one of
        :data:`_WRITE_THREADS`. The wait for a thread is bounded (``queue_timeout``, or the shutdown), and a
        thread that cannot be started is a 503 too: the client may come back, and nothing was done."""
        if not limiters:  # the threads are bounded by these two, not by anyio's default limiter of 40
            limiters.update(read=anyio.CapacityLimiter(server.config.read_workers),
                            write=anyio.CapacityLimiter(_WRITE_THREADS), threads=anyio.CapacityLimiter(1_000_000))
        limiter = limiters["read" if req.method == "GET" else "write"]
        wait = server.config.queue_timeout
        start = time.monotonic()
        while True:
            with anyio.move_on_after(0.1 if wait is None else min(0.1, max(0.0, start + wait - time.monotonic()))):
                await limiter.acquire()
                break
            if server.stopping:
                return _render(Response(503, server.timeout_error().outcome()))
            if wait is not None and time.monotonic() - start >= wait:
                err = server.busy_error(f"The request waited {wait} s (queue_timeout) for a worker")
                return _render(Response(err.status, err.outcome(), err.headers))
        try:
            return await anyio.to_thread.run_sync(serve, req, pretty, limiter=limiters["threads"])
        except (RuntimeError, OSError, MemoryError) as exc:  # no thread could be started (memory, limits)
            log.warning("no worker thread for %s %s: %r", req.method, req.path, exc)
            err = server.busy_error(f"No worker could be started for the request ({exc})")
            return _render(Response(err.status, err.outcome(), err.headers))
        finally:
            limiter.release()

    async def fhir(request: HttpRequest) -> HttpResponse:
        query = parse_qsl(request.url.query, keep_blank_values=True)
        pretty = ("_pretty", "true") in query
        try:
            _check_path(request)
            accept = request.headers.get("accept", "")
            if accept and not _accepts_json(accept):
                raise FhirError(406, f"Only FHIR JSON is served (Accept: {accept})", "not-supported")
            body = None
            if request.method in ("POST", "PUT", "PATCH"):
                with anyio.fail_after(server.config.body_timeout):
                    body = await read_body(request)
        except FhirError as err:
            return _render(Response(err.status, err.outcome(), err.headers))
        except ClientDisconnect:  # nobody is left to answer: one line, no traceback
            log.info("client disconnected while sending the body of %s %s", request.method, request.url.path)
            return HttpResponse(status_code=400)
        except TimeoutError:
            timeout = server.config.body_timeout
            return _render(Response(408, operation_outcome([Issue("error", "timeout", f"The body did not arrive "
                                    f"within {timeout} s (body_timeout)")]), {"Connection": "close"}))
        req = Request(
            method="GET" if request.method == "HEAD" else request.method,  # HEAD: GET's headers, no body
            path=request.path_params.get("path", ""),
            query=query,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            raw=not pretty,  # orjson serialises the answer: stored JSON is spliced in, not re-parsed
        )
        return await in_thread(req, pretty)

    async def admin_op(request: HttpRequest) -> HttpResponse:
        op = request.path_params["op"]
        if request.method != "POST":
            return _render(Response(405, operation_outcome([Issue("error", "not-supported", "POST only")])))
        return _render(await anyio.to_thread.run_sync(admin_action, op))

    def admin_action(op: str) -> Response:
        """Between requests (under the server's lock), in a worker thread like them."""
        with server._lock:
            try:
                if op == "reset":
                    server.store.reset(server.admin_snapshot)
                    return Response(200, operation_outcome([Issue("information", "informational", "reset done")]))
                if op == "snapshot":
                    server.admin_snapshot = server.store.snapshot()
                    return Response(200, operation_outcome([Issue("information", "informational", "snapshot taken")]))
            except (ValueError, RuntimeError) as exc:  # e.g. a file-backed store (--db) has no snapshots
                return Response(409, operation_outcome([Issue("error", "not-supported", f"{op}: {exc}")]))
        return Response(404, operation_outcome([Issue("error", "not-found", f"unknown admin operation {op}")]))

    async def not_fhir(request: HttpRequest) -> HttpResponse:
        return _render(
            Response(404, operation_outcome([Issue("error", "not-found", "Not a FHIR endpoint; the base URL is /fhir")]))
        )

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    routes = [
        Route("/fhir", fhir, methods=methods),
        Route("/fhir/{path:path}", fhir, methods=methods),
    ]
    if admin:
        server.admin_snapshot = None
        routes.append(Route("/admin/{op}", admin_op, methods=["GET", "POST"]))
    routes.append(Route("/{rest:path}", not_fhir, methods=methods))

    async def http_error(request: HttpRequest, exc: Exception) -> HttpResponse:
        """Starlette's own refusals (a path no route matches, a method no route has) as OperationOutcomes."""
        try:
            _check_path(request)
        except FhirError as err:
            return _render(Response(err.status, err.outcome()))
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = "not-supported" if status == 405 else "not-found" if status == 404 else "exception"
        return _render(Response(status, operation_outcome([Issue("error", code, f"{request.method} {request.url.path}: "
                                                                  f"{getattr(exc, 'detail', exc)}")])))

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


async def _drain(stream: AsyncIterator[bytes], budget: int | None = None) -> bool:
    """Read and drop the rest of a request's body (at most ``budget`` more bytes); whether it all came."""
    try:
        async for chunk in stream:
            if budget is not None:
                budget -= len(chunk)
                if budget < 0:
                    return False
    except ClientDisconnect:
        return False
    return True


def run_server(server: FhirServer, host: str, port: int, admin: bool = False, grace: float = 2.0) -> None:
    """Serve ``server`` over HTTP until SIGINT/SIGTERM. On the signal, requests still running get
    ``grace`` seconds, then stop at their next check (a transaction rolls back, 503), so the process
    ends within a few seconds however busy it is. Either signal returns here (the caller cleans up:
    a scratch layer is removed)."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: object) -> None:
            stop = threading.Timer(grace, setattr, (server, "stopping", True))
            stop.daemon = True
            stop.start()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                # uvicorn raises the signal again once it has shut down; SIGTERM's default action would
                # then end the process before the caller's cleanup runs (SIGINT's is a KeyboardInterrupt)
                self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]

    config = uvicorn.Config(create_app(server, admin=admin), host=host, port=port, log_level="warning",
                            http=http_protocol(server.config.header_timeout),
                            # after `grace`, requests end at their next check: their 503s have time to go out
                            timeout_graceful_shutdown=grace + _SHUTDOWN_MARGIN)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled, as uvicorn.run does
        _Server(config).run()


def http_protocol(header_timeout: float | None) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing connections that do not send a request's head in time: an idle
    connection, or one that sends its head a byte at a time (slowloris), holds a socket and memory for
    nothing. uvicorn itself closes a connection idle after a response (``timeout_keep_alive``), not one
    idle from the start, nor a slow head. A partial head is answered 408 before the close."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeadTimeout(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _timer: asyncio.TimerHandle | None = None
        _waiting_for: object = None  # the request cycle in place when the timer started
        _partial = False  # bytes of the awaited head have come

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first bytes of the next request on a kept-alive connection
            self._partial = True
            super().data_received(data)
            if self._timer is not None and self.cycle is not self._waiting_for:
                self._disarm()  # its head is complete: the request has begun

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if header_timeout is not None:
                self._waiting_for, self._partial = self.cycle, False
                self._timer = self.loop.call_later(header_timeout, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if self._partial:
                body = dumps(operation_outcome([Issue("error", "timeout", f"The request's head did not arrive "
                                                                         f"within {header_timeout} s (header_timeout)")]))
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/fhir+json\r\n"
                                     b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    return HeadTimeout


def _check_path(request: HttpRequest) -> None:
    """Refuse control characters in the (decoded) path: a route's ``$`` would silently drop a trailing
    newline (``Patient/abc%0A`` read ``Patient/abc``), and one inside matched no route at all."""
    path = request.scope.get("path", "")
    if any(c < " " or c == "\x7f" for c in path):
        raise FhirError(400, f"The URL path {path!r} contains control characters", "invalid")


def _accepts_json(accept: str) -> bool:
    for part in accept.split(","):
        media, *params = (p.strip().lower() for p in part.split(";"))
        if media in ("*/*", "application/*", "application/json", "application/fhir+json", "application/json+fhir"):
            weights = [p.partition("=")[2].strip() for p in params if p.partition("=")[0].strip() == "q"]
            if not weights or weights[0].strip("0.") != "":  # q=0 (0.0, 0.000): "not acceptable" (RFC 9110)
                return True
    return False
