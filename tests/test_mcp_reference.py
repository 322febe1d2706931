"""The reference solutions run through MCP: every family of the default subset solved over a real MCP
client (streamable HTTP to the episode's server) with the same verdict as in process."""

from __future__ import annotations

import time

import orjson
import pytest
from anyio.from_thread import start_blocking_portal
from mcp import Client

from fhirgym.mcp import serve_http
from fhirgym.tasks import TaskWorld, make_instance, select
from fhirgym.tools import Toolbox, ToolCall


class McpToolbox(Toolbox):
    """A toolbox whose calls go over MCP to another toolbox (the reference solution cannot tell)."""

    def __init__(self, inner: Toolbox, portal, client: Client) -> None:
        super().__init__(inner.tools.values(), inner.context)
        self.portal = portal
        self.client = client

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        t0 = time.perf_counter()
        result = self.portal.call(self.client.call_tool, name, arguments or {})
        output = orjson.loads(result.content[0].text)
        error = output["error"].get("message") if result.is_error else None
        call = ToolCall(name, arguments or {}, output, error, (arguments or {}).get("resourceType"),
                        (time.perf_counter() - t0) * 1000)
        self.calls.append(call)
        return call


@pytest.mark.parametrize("family", [f.id for f in select("default")])
def test_reference_solution_over_mcp(family, small_world_path):
    inst = make_instance(family, 1, TaskWorld.open(small_world_path))
    with inst.open() as ep, serve_http(ep.toolbox()) as handle, start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(handle.url)) as client:
            box = McpToolbox(ep.toolbox(), portal, client)
            text = inst.family.solve(box, inst.params, inst.now)
        verdict = ep.finish(text)
    assert verdict.success, verdict.reasons
    served = handle.toolbox.calls
    assert [c.name for c in served] == [c.name for c in box.calls] == [c.name for c in inst.reference.calls]
