"""A real uvicorn server in a background thread, for the HTTP tests (test_http.py, test_client.py).

The listening socket is bound here (port 0 on 127.0.0.1) before uvicorn starts, so there is no race for a
"free" port; ``stop()`` asks uvicorn to exit and joins its thread.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from fhirgym.fhir import FhirServer, ServerConfig, Store, create_app, http_protocol


def bound_socket() -> socket.socket:
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only for such sockets; with
    # proto 0, Nagle plus delayed ACKs cost ~40 ms per response
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LiveServer:
    """``FhirServer`` + ``create_app`` served by uvicorn on 127.0.0.1:<ephemeral port>."""

    def __init__(self, admin: bool = False, store: Store | None = None, **config) -> None:
        self.sock = bound_socket()
        self.port = self.sock.getsockname()[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root}/fhir"
        cfg = ServerConfig(base_url=config.pop("base_url", self.base_url), **config)
        self.server = FhirServer(store or Store(), config=cfg)
        self.app = create_app(self.server, admin=admin)
        self._uvicorn = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off",
                                                      http=http_protocol(cfg.header_timeout)))
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()
        self.server.store.close()
        if self._thread.is_alive():
            raise RuntimeError("uvicorn did not shut down")

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
