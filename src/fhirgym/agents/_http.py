"""The HTTP underneath the OpenAI-compatible backend: one pooled POST, cheap enough for a thousand in flight.

An evaluation keeps hundreds of chat requests in flight from one process, so what each request costs the harness decides
how many episodes a machine can drive (bench/bench_scale.py). The ``openai`` SDK spends ~1.5 ms of CPU per call on
transforming and validating the request and response, and httpx's connection pool scans every connection per request;
urllib3's thread-safe pool with JSON bytes from orjson costs ~0.2 ms. This module is that pool and nothing else: no
retries (the backend retries, so attempts are countable), timeouts and the environment's proxy settings honoured.

A transport is anything with ``post(url, body, headers, timeout) -> Reply`` that raises :class:`TimeoutError` when the
endpoint did not answer in time and :class:`ConnectionError` when it could not be reached; tests plug in a scripted one.
"""

from __future__ import annotations

import threading
import urllib.request
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import urllib3


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    data: bytes


class Transport(Protocol):
    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply: ...


class PooledTransport:
    """urllib3 pools, one per endpoint (through a proxy where the environment says so).

    ``max_connections`` idle connections are kept per endpoint for reuse; more may be open at once
    (one per request in flight), the extra ones closed after use.
    """

    def __init__(self, max_connections: int = 1024) -> None:
        self.max_connections = max_connections
        self._managers: dict[str | None, urllib3.PoolManager] = {}
        self._routes: dict[tuple[str, str], urllib3.PoolManager] = {}  # (scheme, host) → its manager
        self._lock = threading.Lock()

    def _manager(self, url: str) -> urllib3.PoolManager:
        parts = urlsplit(url)
        route = (parts.scheme, parts.netloc)
        manager = self._routes.get(route)
        if manager is not None:
            return manager
        with self._lock:
            proxy = None
            if not urllib.request.proxy_bypass(parts.hostname or ""):
                proxy = urllib.request.getproxies().get(parts.scheme)
            manager = self._managers.get(proxy)
            if manager is None:
                kw = {"num_pools": 16, "maxsize": self.max_connections, "block": False, "ca_certs": _ca_certs()}
                manager = urllib3.ProxyManager(proxy, **kw) if proxy else urllib3.PoolManager(**kw)
                self._managers[proxy] = manager
            self._routes[route] = manager
        return manager

    def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> Reply:
        try:
            response = self._manager(url).request(
                "POST", url, body=body, headers=headers, retries=False, redirect=False,
                timeout=urllib3.Timeout(connect=min(timeout, 30.0), read=timeout))
        except urllib3.exceptions.NewConnectionError as exc:  # (a subclass of urllib3's timeout error)
            raise ConnectionError(str(exc)) from exc
        except urllib3.exceptions.TimeoutError as exc:
            raise TimeoutError(str(exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # refused, reset, dropped, TLS, bad proxy
            raise ConnectionError(str(exc)) from exc
        return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.data)

    def close(self) -> None:
        for manager in self._managers.values():
            manager.clear()


def _ca_certs() -> str | None:
    """certifi's CA bundle where it is installed (as with httpx, which fhirgym depends on), else the system's."""
    try:
        import certifi
    except ImportError:
        return None
    return certifi.where()
