"""The tools over MCP (official SDK client): in process, over stdio (the CLI spawned) and streamable HTTP.

An agent behind MCP must see exactly the in-process tools (names, descriptions, schemas), get the same
structured errors (with ``isError``), write into the store the server is bound to, and not see writing
tools in read-only mode; every call is recorded in ``toolbox.calls``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client, StdioServerParameters

from fhirgym.fhir import FhirServer, InProcessClient, Snapshot, Store
from fhirgym.mcp import build_server, serve_http
from fhirgym.tools import FHIR_TOOLS, SPEC_TOOLS, Toolbox, ToolContext

READ_TOOLS = [t.name for t in FHIR_TOOLS if not t.writes]


@pytest.fixture()
def box() -> Toolbox:
    return Toolbox(FHIR_TOOLS, ToolContext(InProcessClient(FhirServer(Store()))))


@pytest.fixture(scope="module", autouse=True)
def cli_http(small_world_path):
    """``fhirgym mcp fhir --transport http --read-only`` on a free port, started with the module so its
    start-up (imports, spec, world) overlaps the other tests; yields the process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["mcp", "fhir", "--transport", "http", "--port", str(port), "--read-only",
            "--world", str(small_world_path)]
    proc = subprocess.Popen([*_cli(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    proc.port = port  # type: ignore[attr-defined]
    yield proc
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def world_patient_id(small_world_path) -> str:
    store = Snapshot(small_world_path).open()
    try:
        resp = InProcessClient(FhirServer(store)).search("Patient", {"_count": "1"})
        return resp.body["entry"][0]["resource"]["id"]
    finally:
        store.close()


def _cli() -> list[str]:
    script = shutil.which("fhirgym", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "fhirgym.cli"]


def _json(result: Any, structured: bool = False) -> dict:
    """The text content, parsed; the structured copy is there exactly when asked for, and equal."""
    data = orjson.loads(result.content[0].text)
    assert result.structured_content == (data if structured else None)
    return data


async def _exercise(client: Client, patient_id: str | None = None, structured: bool = False) -> dict:
    """The calls every transport must get right; returns what the caller checks against its store."""
    listed = (await client.list_tools()).tools
    out: dict[str, Any] = {"names": [t.name for t in listed]}
    if "createResource" in out["names"]:
        created = await client.call_tool("createResource", {"resourceType": "Patient",
                                                            "body": {"name": [{"family": "McpWrite"}]}})
        assert not created.is_error
        out["created"] = _json(created, structured)["id"]
        read = await client.call_tool("getResourceById", {"resourceType": "Patient",
                                                          "resourceId": out["created"]})
        assert _json(read, structured)["name"][0]["family"] == "McpWrite"
    missing = await client.call_tool("getResourceById", {"resourceType": "Patient",
                                                         "resourceId": "no-such-id"})
    assert missing.is_error and _json(missing, structured)["error"]["status"] == 404
    assert _json(missing, structured)["error"]["issues"][0]["code"] == "not-found"
    if patient_id:
        found = await client.call_tool("getResourceById", {"resourceType": "Patient",
                                                           "resourceId": patient_id})
        assert not found.is_error and _json(found, structured)["id"] == patient_id
    return out


# -- in process ------------------------------------------------------------------------------------


def test_listing_is_the_tool_definitions(box):
    async def main() -> None:
        async with Client(build_server(box, "t")) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
        assert list(listed) == [t.name for t in FHIR_TOOLS]
        for tool in FHIR_TOOLS:
            assert listed[tool.name].description == tool.description
            assert listed[tool.name].input_schema == tool.parameters
            assert listed[tool.name].annotations.read_only_hint is (not tool.writes)

    anyio.run(main)


def test_in_process_calls_write_the_bound_store_and_are_recorded(box):
    async def main() -> dict:
        async with Client(build_server(box, "t")) as client:
            return await _exercise(client)

    out = anyio.run(main)
    assert box.context.client.read("Patient", out["created"]).status == 200
    assert [c.name for c in box.calls] == ["createResource", "getResourceById", "getResourceById"]
    assert box.calls[-1].error and all(c.ms > 0 for c in box.calls)


def test_errors_come_back_as_is_error_with_the_outcome(box):
    async def main() -> None:
        async with Client(build_server(box, "t")) as client:
            bad = await client.call_tool("createResource", {"resourceType": "Patient",
                                                            "body": {"gender": "x"}})
            assert bad.is_error
            err = _json(bad)["error"]
            assert err["status"] in (400, 422) and err["issues"][0]["expression"] == ["Patient.gender"]
            unknown = await client.call_tool("searchResources", {"resourceType": "Patient",
                                                                 "params": {"foo": "1"}})
            assert unknown.is_error and _json(unknown)["error"]["status"] == 400
            args = await client.call_tool("getResourceById", {"resourceType": "Patient"})
            assert args.is_error and "missing required argument" in _json(args)["error"]["message"]
            tool = await client.call_tool("dropDatabase", {})
            assert tool.is_error and "unknown tool" in _json(tool)["error"]["message"]

    anyio.run(main)
    assert len(box.calls) == 4 and all(c.error for c in box.calls)


def test_read_only_mode_hides_and_refuses_writing_tools(box):
    async def main() -> None:
        async with Client(build_server(box, "t", read_only=True)) as client:
            assert [t.name for t in (await client.list_tools()).tools] == READ_TOOLS
            refused = await client.call_tool("createResource", {"resourceType": "Patient", "body": {}})
            assert refused.is_error and "unknown tool" in _json(refused)["error"]["message"]

    anyio.run(main)
    assert box.context.client.search("Patient").body["total"] == 0
    assert [c.name for c in box.calls] == ["createResource"] and box.calls[0].error


def test_spec_tools_over_mcp():
    specs = Toolbox(SPEC_TOOLS, ToolContext())

    async def main() -> None:
        async with Client(build_server(specs, "specs")) as client:
            assert [t.name for t in (await client.list_tools()).tools] == [t.name for t in SPEC_TOOLS]
            sd = await client.call_tool("getStructureDefinition", {"resourceType": "Patient",
                                                                   "path": "gender"})
            assert _json(sd)["elements"][0]["binding"]["codes"] == ["female", "male", "other", "unknown"]
            typo = await client.call_tool("getDataTypeDefinition", {"dataType": "Humanname"})
            assert typo.is_error and "HumanName" in _json(typo)["error"]["message"]

    anyio.run(main)


# -- streamable HTTP -------------------------------------------------------------------------------


def test_serve_http_writes_the_bound_store(small_world_path, world_patient_id):
    snapshot = Snapshot(small_world_path)
    store = snapshot.open()
    box = Toolbox(FHIR_TOOLS, ToolContext(InProcessClient(FhirServer(store), snapshot)))

    async def main(url: str) -> dict:
        async with Client(url) as client:
            return await _exercise(client, world_patient_id)

    with serve_http(box) as handle:
        assert handle.url.startswith("http://127.0.0.1:") and handle.url.endswith("/mcp")
        out = anyio.run(main, handle.url)
    assert out["names"] == [t.name for t in FHIR_TOOLS]
    assert box.context.client.read("Patient", out["created"]).status == 200
    assert [c.name for c in box.calls] == ["createResource", *["getResourceById"] * 3]
    store.close()


# -- stdio -----------------------------------------------------------------------------------------


def test_cli_over_stdio(small_world_path, world_patient_id):
    cmd = _cli()
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "mcp", "fhir", "--transport", "stdio",
                                                         "--world", str(small_world_path), "--structured"],
                                   env=dict(os.environ))

    async def main() -> dict:
        async with Client(params) as client:
            out = await _exercise(client, world_patient_id, structured=True)
            page = await client.call_tool("searchResources", {"resourceType": "Observation"})
            data = _json(page, structured=True)
            assert data["omitted"] > 0 and data["next_page_url"]
            nxt = await client.call_tool("searchResources", {"resourceType": "Observation",
                                                             "page_url": data["next_page_url"]})
            assert not nxt.is_error and _json(nxt, structured=True)["resources"]
            return out

    out = anyio.run(main)
    assert out["names"] == [t.name for t in FHIR_TOOLS] and out["created"]
    # the write went to the subprocess's isolated store, never to the world file
    store = Snapshot(small_world_path).open()
    try:
        assert InProcessClient(FhirServer(store)).read("Patient", out["created"]).status == 404
    finally:
        store.close()


def test_cli_over_http_read_only(cli_http, world_patient_id):
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(cli_http.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    url = line[0].strip() if line else ""
    assert url == f"http://127.0.0.1:{cli_http.port}/mcp", (url, cli_http.poll())

    async def main() -> dict:
        async with Client(url) as client:
            return await _exercise(client, world_patient_id)

    assert anyio.run(main)["names"] == READ_TOOLS
