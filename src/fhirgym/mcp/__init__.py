"""MCP servers of fhirgym tools (official ``mcp`` SDK, v2 API), in process, on stdio and over HTTP.

    from mcp import Client
    from fhirgym.mcp import build_server, serve_http
    server = build_server(toolbox, "fhir")             # Client(server) connects in process
    with serve_http(toolbox) as handle:                # streamable HTTP in a background thread
        async with Client(handle.url) as client: ...   # every call lands in toolbox.calls

``fhirgym mcp fhir`` / ``fhirgym mcp specs`` run them from the command line.
"""

from ._server import HttpServerHandle, ToolboxServer, build_server, serve_http, tool_result, visible_toolbox

__all__ = ["HttpServerHandle", "ToolboxServer", "build_server", "serve_http", "tool_result",
           "visible_toolbox"]
