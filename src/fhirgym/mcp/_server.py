"""A :class:`~fhirgym.tools.Toolbox` as an MCP server (official ``mcp`` SDK, v2 API).

The tools are not re-declared for MCP: each :class:`~fhirgym.tools.Tool` is listed with its exact name,
description and JSON schema, and every call goes through :meth:`Toolbox.call`, so an agent behind MCP
gets the same bounded outputs and structured errors as one in process, and the episode records its
calls (with timing) in ``toolbox.calls`` either way.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

import orjson
from mcp.server import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from mcp.types import Tool as MCPTool

from .. import __version__
from ..fhir import json_default_str
from ..tools import Toolbox

log = logging.getLogger(__name__)

_INSTRUCTIONS = ("FHIR R4 tools of fhirgym. Outputs are JSON, bounded in size: a cut result says what was "
                 "left out and how to get it (next_page_url, next_offset). Errors carry the HTTP status and "
                 "the OperationOutcome issues; fix the call and retry.")


def visible_toolbox(toolbox: Toolbox, read_only: bool) -> Toolbox:
    """The toolbox an MCP client may use: without writing tools in read-only mode.

    The view shares the context and the call record of ``toolbox``, so calls still land in
    ``toolbox.calls``, and a hidden tool is unknown to it, not merely unlisted.
    """
    if not read_only:
        return toolbox
    view = Toolbox([t for t in toolbox.tools.values() if not t.writes], toolbox.context)
    view.calls = toolbox.calls
    return view


class ToolboxServer(MCPServer):
    """An :class:`MCPServer` whose tools are those of a :class:`Toolbox` (not Python signatures)."""

    def __init__(self, toolbox: Toolbox, name: str, *, read_only: bool = False, structured: bool = False,
                 instructions: str | None = None) -> None:
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        super().__init__(name=name, version=__version__, instructions=instructions or _INSTRUCTIONS,
                         log_level="WARNING")
        root.handlers[:] = handlers  # the SDK calls logging.basicConfig: a library must not, so undo it
        root.setLevel(level)
        self.toolbox = visible_toolbox(toolbox, read_only)
        self.read_only = read_only
        self.structured = structured
        self._listing = [
            MCPTool(name=t.name, description=t.description, input_schema=t.parameters,
                    annotations=ToolAnnotations(read_only_hint=not t.writes))
            for t in self.toolbox.tools.values()
        ]

    async def list_tools(self) -> list[MCPTool]:
        return list(self._listing)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> CallToolResult:
        """Run the tool through the toolbox (never raises) and wrap its output as MCP content.

        The handlers are synchronous and fast (an in-process FHIR call is ~1 ms), so they run on the
        event loop: a thread hop would cost more than it saves for one agent's sequential calls.
        """
        return tool_result(self.toolbox.call(name, arguments), structured=self.structured)


def tool_result(call: Any, structured: bool = False) -> CallToolResult:
    """A :class:`~fhirgym.tools.ToolCall` as an MCP result: JSON text, ``isError`` when the call failed
    and, if ``structured``, the same object again as structured content (when it is an object, as MCP
    requires).

    Structured content is opt-in: our tools declare no output schema, so clients read the JSON text,
    and the SDK validates and dumps a structured copy twice through pydantic — about 1 ms per 8 kB
    search result here, a fifth of a stdio call (``bench/bench_tools.py`` prints both).
    """
    text = orjson.dumps(call.output, default=json_default_str).decode()
    content = [TextContent(type="text", text=text)]
    failed = call.error is not None
    if structured and isinstance(call.output, dict):
        return CallToolResult(content=content, structured_content=call.output, is_error=failed)
    return CallToolResult(content=content, is_error=failed)


def build_server(toolbox: Toolbox, name: str = "fhirgym", *, read_only: bool = False,
                 structured: bool = False) -> ToolboxServer:
    """An MCP server exposing every tool of ``toolbox`` (only the non-writing ones if ``read_only``).

    Connect in process with ``mcp.Client(server)``, run it on stdio with ``server.run()``, or over
    streamable HTTP with :func:`serve_http`.
    """
    return ToolboxServer(toolbox, name, read_only=read_only, structured=structured)


class HttpServerHandle:
    """A streamable-HTTP MCP server running in a background thread; ``url`` ends in ``/mcp``."""

    def __init__(self, server: ToolboxServer, uvicorn_server: Any, thread: threading.Thread,
                 url: str) -> None:
        self.server = server
        self.url = url
        self._uvicorn = uvicorn_server
        self._thread = thread

    @property
    def toolbox(self) -> Toolbox:
        return self.server.toolbox

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving (open sessions are ended) and wait for the thread; safe to call twice."""
        self._uvicorn.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():  # a client holding a stream open: cut it
            self._uvicorn.force_exit = True
            self._thread.join(timeout)

    def __enter__(self) -> HttpServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HttpServerHandle({self.url!r})"


def serve_http(toolbox: Toolbox, host: str = "127.0.0.1", port: int = 0, *, name: str = "fhirgym",
               read_only: bool = False, structured: bool = False, json_response: bool = True,
               startup_timeout: float = 10.0) -> HttpServerHandle:
    """Serve ``toolbox`` over streamable HTTP from a background thread and return once it accepts calls.

    ``port=0`` picks a free port (the socket is bound here, so ``.url`` is known before the thread
    starts and no other process can take it). ``json_response``: answer each POST with one JSON body
    rather than an SSE stream (same protocol; less framing per call).
    """
    import uvicorn

    server = build_server(toolbox, name, read_only=read_only, structured=structured)
    app = server.streamable_http_app(host=host, json_response=json_response)
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then; without it Nagle plus
    # delayed ACKs add ~40 ms to every response
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, host=host, port=bound_port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=2)
    userver = uvicorn.Server(config)
    thread = threading.Thread(target=userver.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"mcp-http-{bound_port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not userver.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            userver.should_exit = True
            sock.close()
            raise RuntimeError(f"MCP HTTP server on {host}:{bound_port} did not start")
        time.sleep(0.005)
    netloc = f"[{host}]" if ":" in host else host
    url = f"http://{netloc}:{bound_port}/mcp"
    log.info("MCP server %s on %s", name, url)
    return HttpServerHandle(server, userver, thread, url)
