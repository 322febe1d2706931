"""CodeAct tools: fetch a patient's resources into the episode's workspace, then compute over them in Python.

FHIR-AgentBench's tool pair (``get_resources_by_patient_fhir_id`` + ``execute_python_code`` with
``retrieved_resources``), with what went wrong there fixed: a re-fetch merges into the workspace instead of overwriting
what an earlier fetch of the same type brought (the result says what changed), and the code runs in the process sandbox
(``_sandbox.py``) under real limits instead of a bare ``exec`` whose timeout is ignored. Tool arguments get the checks
of the CRUD tools. Inside the sandbox the code also has the FHIR CRUD operations as functions (``search``,
``read_resource``, ``create_resource``, ...): an RPC over two pipes the sandboxed process inherits (it has no network at
all), each request run by the host as the tool call it names through the episode's :meth:`~fhirgym.env.Episode.step`
(the same checks, the same call log, only the granted tools; docs/CODEACT.md).
"""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit

import orjson

from ..fhir import json_default_str
from ._core import Tool, Toolbox, ToolCall, ToolContext, ToolError
from ._fhir import (
    _ID_RE,
    GET_RESOURCE_BY_ID,
    _client,
    _page_link,
    _params,
    _request,
    _resource_types,
    _size,
    _strip,
)
from ._sandbox import Sandbox, SandboxLimits, SandboxUnavailable

#: ``ToolContext.extras`` keys: the episode's :class:`Workspace`, and whether python may run unsandboxed.
WORKSPACE_KEY = "codeact_workspace"
UNSAFE_KEY = "unsafe_python"
#: Bounds of one fetch (pages followed, resources kept) and of one request/response of the in-sandbox RPC.
MAX_PAGES = 200
MAX_RESOURCES = 20_000
MAX_RPC_BYTES = 16 << 20
#: What one python call may ask of the host through the FHIR functions: requests, and reply bytes in all.
MAX_RPC_REQUESTS = 500
MAX_RPC_REPLY_BYTES = 64 << 20
#: The page size asked of the server when fetching everything of a type (its maximum is 1,000).
PAGE_SIZE = 500

Dispatch = Callable[[str, dict], ToolCall]


class Workspace:
    """One episode's CodeAct state: the resources fetched so far (type → id → resource) and the sandbox its
    code runs in (a 0700 directory of its own, removed by :meth:`close`). ``dispatch`` runs a tool call on
    behalf of the code inside (the episode's ``step``, so only granted tools); without one, the code may
    only read (``search``, ``read_resource``): nothing says which writes the caller granted."""

    def __init__(self, *, unsafe: bool = False, limits: SandboxLimits | None = None,
                 dispatch: Dispatch | None = None) -> None:
        self.resources: dict[str, dict[str, dict]] = {}
        self.sandbox = Sandbox(limits=limits, unsafe=unsafe)
        self.dispatch = dispatch
        self.last_fetched: list[dict] | None = None  # what the latest fetch matched (the RPC's search result)
        self._close = weakref.finalize(self, self.sandbox.close)

    @property
    def directory(self) -> str:
        return str(self.sandbox.workspace)

    def add(self, resources: Iterable[dict]) -> dict:
        """Merge fetched resources: new ids are added, a changed resource replaces its older copy (listed
        in ``updated``), an identical one is left as is. Nothing is dropped."""
        added = unchanged = 0
        updated: list[str] = []
        for res in resources:
            rtype, rid = res.get("resourceType"), res.get("id")
            if not isinstance(rtype, str) or not isinstance(rid, str):
                continue
            by_id = self.resources.setdefault(rtype, {})
            old = by_id.get(rid)
            if old is None:
                added += 1
            elif old == res:
                unchanged += 1
                continue
            else:
                updated.append(f"{rtype}/{rid}")
            by_id[rid] = res
        return {"added": added, "updated": updated, "unchanged": unchanged,
                "counts": {t: len(v) for t, v in sorted(self.resources.items())}}

    def retrieved(self) -> dict[str, list[dict]]:
        """``retrieved_resources`` as the code sees it: type → list of resources."""
        return {t: list(v.values()) for t, v in self.resources.items()}

    def close(self) -> None:
        self._close()


def workspace(ctx: ToolContext) -> Workspace:
    """The context's workspace; one is made on first use where nobody made it (a bare toolbox, ``mcp``)."""
    ws = ctx.extras.get(WORKSPACE_KEY)
    if ws is None:
        ws = ctx.extras[WORKSPACE_KEY] = Workspace(unsafe=bool(ctx.extras.get(UNSAFE_KEY)))
    return ws


# --- fetching -------------------------------------------------------------------------------------------

#: The python call an RPC thread is serving (its deadline and whether it is still running), so that a
#: fetch made on its behalf stops between pages when the call is over.
_SERVING = threading.local()


def _check_call_alive(pages: int) -> None:
    rpc = getattr(_SERVING, "rpc", None)
    if rpc is not None and not rpc.alive():
        raise ToolError(f"the python call's time ran out: the search stopped after {pages} page(s)")


def _fetch(ctx: ToolContext, first) -> tuple[list[dict], list[dict], str | None]:
    """Every page of a search (``first`` runs the first request): matches, included resources, and a note
    when a bound stopped it. On behalf of code in the sandbox, it stops between pages once the python call
    is over (its deadline passed, or it ended)."""
    client = _client(ctx)
    resp = _request(ctx, first)
    matches: list[dict] = []
    included: list[dict] = []
    pages = 0
    while True:
        pages += 1
        for entry in (resp.body or {}).get("entry", []):
            if "resource" in entry:
                mode = entry.get("search", {}).get("mode", "match")
                (matches if mode == "match" else included).append(_strip(entry["resource"]))
        next_url = next((lk["url"] for lk in (resp.body or {}).get("link", []) if lk.get("relation") == "next"), None)
        if not next_url:
            return matches, included, None
        if pages >= MAX_PAGES or len(matches) >= MAX_RESOURCES:
            return matches, included, (f"stopped after {pages} pages ({len(matches)} matches); "
                                       "narrow the search to get the rest")
        _check_call_alive(pages)
        resp = _request(ctx, client.follow, next_url)


def _check_type(rtype: str) -> str:
    if rtype not in _resource_types():
        raise ToolError(f"resource_type {rtype!r} is not an R4 resource type (e.g. Patient, Observation)")
    return rtype


def _summary(ctx: ToolContext, ws: Workspace, fetched: list[dict], head: dict, note: str | None) -> dict:
    """Counts and ids per type of what a fetch brought, what it changed in the workspace, within the budget."""
    ids: dict[str, list[str]] = {}
    for res in fetched:
        ids.setdefault(res.get("resourceType", "?"), []).append(str(res.get("id")))
    merged = ws.add(fetched)
    out = {**head, "fetched": {t: len(v) for t, v in ids.items()}, "ids": ids, "workspace": merged,
           "note": "available to python as retrieved_resources[type] (a list of resources)"}
    if note:
        out["warning"] = note
    omitted = 0
    while _size(out) > ctx.budget:  # cut the longest id list in half until the result fits
        lists = [v for v in (*ids.values(), merged["updated"]) if len(v) > 1]
        if not lists:
            break
        longest = max(lists, key=len)
        omitted += len(longest) - len(longest) // 2
        del longest[len(longest) // 2:]
    if omitted:
        out["omitted_ids"] = omitted
        out["note"] += f"; {omitted} ids left out of this result to fit the output budget (all are in the workspace)"
    return out


def fhir_query(ctx: ToolContext, args: dict) -> dict:
    rtype = _check_type(args["resource_type"])
    pid = args["patient_id"].removeprefix("Patient/")
    if not _ID_RE.fullmatch(pid):
        raise ToolError(f"patient_id {pid!r} is not a FHIR id (1-64 of A-Z a-z 0-9 - .)")
    ws = workspace(ctx)
    params = [("_id" if rtype == "Patient" else "patient", pid), ("_count", str(PAGE_SIZE))]
    try:
        matches, included, note = _fetch(ctx, lambda: _client(ctx).search(rtype, params))
    except ToolError as exc:
        if exc.status == 400:
            exc.message += f" ({rtype} may have no patient search parameter: use fhir_get with a search of your own)"
        raise
    if rtype == "MedicationRequest":  # resolve medicationReference → Medication, as FHIR-AgentBench's questions need
        meds = sorted({ref.split("/", 1)[1] for m in matches
                       if (ref := str((m.get("medicationReference") or {}).get("reference", ""))).startswith("Medication/")
                       and _ID_RE.fullmatch(ref.split("/", 1)[1])})
        for i in range(0, len(meds), 100):
            chunk = [("_id", ",".join(meds[i:i + 100])), ("_count", str(PAGE_SIZE))]
            more, _, _ = _fetch(ctx, lambda chunk=chunk: _client(ctx).search("Medication", chunk))
            included += more
    ws.last_fetched = matches
    return _summary(ctx, ws, matches + included, {"resource_type": rtype, "patient_id": pid}, note)


def _parse_query(ctx: ToolContext, query: str):
    """A search (``Type?name=value&...``) or a paging link of this server → the request that runs it."""
    query = query.strip()
    client = _client(ctx)
    if "_getpages" in query:
        url = _page_link(client, query)
        return lambda: client.follow(url)
    parts = urlsplit(query)
    if parts.scheme or parts.netloc:
        raise ToolError("query must be relative to this server: ResourceType?param=value&... "
                        "(or a next link one of its searches returned)")
    rtype = parts.path.strip("/")
    if rtype not in _resource_types():
        raise ToolError(f"query {query!r} is not a search: it must be ResourceType?param=value&..., e.g. "
                        "Observation?patient=123&code=http://loinc.org|8867-4 (no reads by id: use ?_id=; "
                        "no _history, no $operations)")
    raw: dict[str, list[str]] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        raw.setdefault(key, []).append(value)
    params = _params(raw)
    return lambda: client.search(rtype, params)


def fhir_get(ctx: ToolContext, args: dict) -> dict:
    first = _parse_query(ctx, args["query"])
    ws = workspace(ctx)
    matches, included, note = _fetch(ctx, first)
    ws.last_fetched = matches
    return _summary(ctx, ws, matches + included, {"query": args["query"]}, note)


# --- python and the RPC behind the in-sandbox FHIR functions --------------------------------------------

#: Trusted code run before the model's (its frames are left out of tracebacks). The two fds are pipes
#: to the host; ``json`` is imported on the first FHIR call only (start-up time is most of a call's cost).
_PRELUDE = r'''
def _fhirgym_functions(wfd, rfd):
    import _thread, os
    lock = _thread.allocate_lock()

    class FhirError(Exception):
        """A FHIR call the host refused or the server rejected; the message says what to fix."""

    def call(op, **args):
        import json
        data = memoryview((json.dumps({"op": op, "args": args}, default=str) + "\n").encode())
        with lock:
            while data:
                data = data[os.write(wfd, data):]
            chunks = []
            while not chunks or not chunks[-1].endswith(b"\n"):
                chunk = os.read(rfd, 1 << 16)
                if not chunk:
                    raise FhirError("the FHIR connection is closed")
                chunks.append(chunk)
        reply = json.loads(b"".join(chunks))
        if "error" in reply:
            raise FhirError(reply["error"])
        return reply["result"]

    def search(resource_type, params=None):
        """Every resource of resource_type matching params (name -> value, or a list of values: AND)."""
        return call("search", resource_type=resource_type, params=params or {})

    def read_resource(resource_type, resource_id):
        return call("read", resource_type=resource_type, resource_id=resource_id)

    def create_resource(resource_type, body):
        """Create body; returns {status, resourceType, id, versionId, resource}."""
        return call("create", resource_type=resource_type, body=body)

    def update_resource(resource_type, resource_id, body):
        """Replace the resource with body (the complete new version)."""
        return call("update", resource_type=resource_type, resource_id=resource_id, body=body)

    def delete_resource(resource_type, resource_id):
        return call("delete", resource_type=resource_type, resource_id=resource_id)

    return FhirError, search, read_resource, create_resource, update_resource, delete_resource


FhirError, search, read_resource, create_resource, update_resource, delete_resource = _fhirgym_functions(%d, %d)
del _fhirgym_functions
'''


class _Rpc:
    """The host side of the in-sandbox FHIR functions for one python call: a thread that reads requests from
    a pipe, runs each as a tool call through ``dispatch`` and writes the result to the other pipe.

    The code is untrusted, so is every request: any line gets an error reply, never a dead thread; a call
    gets at most ``MAX_RPC_REQUESTS`` requests and ``MAX_RPC_REPLY_BYTES`` of replies; work done for it stops
    at its deadline (between pages of a fetch); :meth:`stop` waits for the thread, so nothing is logged to
    the episode after the python call returns."""

    def __init__(self, ctx: ToolContext, ws: Workspace, deadline: float) -> None:
        self.ctx, self.ws = ctx, ws
        self.deadline = deadline
        self._dispatch: Dispatch = ws.dispatch or Toolbox((FHIR_GET, GET_RESOURCE_BY_ID), ctx).call
        self.req_r, req_w = os.pipe()
        resp_r, self.resp_w = os.pipe()
        os.set_blocking(self.resp_w, False)  # the host's end only: a reply the code never reads never blocks
        self.child_fds = (req_w, resp_r)
        self.log: list[dict] = []
        self.open = True
        self.requests = 0
        self.reply_bytes = 0
        self.thread = threading.Thread(target=self._serve, name="fhirgym-codeact-rpc", daemon=True)

    @property
    def prelude(self) -> str:
        return _PRELUDE % self.child_fds

    def alive(self) -> bool:
        return self.open and time.monotonic() < self.deadline

    def start(self) -> None:
        self.thread.start()

    def abandon(self) -> None:
        """The call never started: close every end (the sandbox closes the child's ends once it started)."""
        for fd in (self.req_r, self.resp_w, *self.child_fds):
            os.close(fd)

    def stop(self) -> None:
        """The call ended: serve nothing more (a process it left behind gets EOF or a closed pipe), and wait
        for work in flight, which stops at its next page."""
        self.open = False
        self.thread.join()

    def _serve(self) -> None:
        """Read request lines, write reply lines, until EOF, a broken pipe, or the call's end (polled, so a
        pipe end left open somewhere or code that never reads its replies cannot hold the thread)."""
        _SERVING.rpc = self
        buf = bytearray()
        try:
            while True:
                nl = buf.find(b"\n", 0, MAX_RPC_BYTES + 1)
                if nl < 0 and len(buf) <= MAX_RPC_BYTES:
                    if not _ready(self.req_r, select.POLLIN):
                        if not self.open:
                            return
                        continue
                    chunk = os.read(self.req_r, 1 << 16)
                    if not chunk:
                        return
                    buf += chunk
                    continue
                line = bytes(buf[: nl + 1]) if nl >= 0 else bytes(buf)  # over the cap: no newline in reach
                del buf[: len(line)]
                try:
                    data = self._reply(line)
                except Exception as exc:  # a fault of ours must not leave the code waiting forever
                    data = orjson.dumps({"error": f"internal error serving the request: {type(exc).__name__}"})
                if not self._send(data + b"\n") or nl < 0:
                    return
        except OSError:  # the code is gone
            return
        finally:
            os.close(self.req_r)
            os.close(self.resp_w)

    def _send(self, data: bytes) -> bool:
        """Write a reply while the call lasts; False once it is over with the reply unread."""
        view = memoryview(data)
        while view:
            if not _ready(self.resp_w, select.POLLOUT):
                if not self.open:
                    return False
                continue
            try:
                view = view[os.write(self.resp_w, view[: 1 << 16]):]
            except BlockingIOError:
                continue
        return True

    def _reply(self, line: bytes) -> bytes:
        """The reply line to one request line, within the call's budgets."""
        if not line.endswith(b"\n"):
            return orjson.dumps({"error": f"request over {MAX_RPC_BYTES} bytes"})
        self.requests += 1
        if self.requests > MAX_RPC_REQUESTS:
            return orjson.dumps({"error": f"this python call used its {MAX_RPC_REQUESTS} FHIR requests: "
                                          "do more per request, or continue in another python call"})
        if self.reply_bytes > MAX_RPC_REPLY_BYTES:
            return orjson.dumps({"error": f"this python call received its {MAX_RPC_REPLY_BYTES >> 20} MiB of "
                                          "FHIR results: narrow the searches, or continue in another call"})
        data = orjson.dumps(self._handle(line), default=json_default_str)
        if len(data) > MAX_RPC_BYTES:
            data = orjson.dumps({"error": f"result over {MAX_RPC_BYTES} bytes: narrow the search"})
        self.reply_bytes += len(data)
        return data

    def _handle(self, line: bytes) -> dict:
        try:
            req = orjson.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str) or not isinstance(req.get("args"), dict):
                raise TypeError('a request is {"op": name, "args": {...}}')
            op, args = req["op"], req["args"]
            name, call_args = self._tool_call(op, args)
        except (ValueError, KeyError, TypeError) as exc:
            return {"error": f"malformed request: {exc}"}
        if not self.alive():
            return {"error": "the python call has ended" if not self.open else "the python call's time ran out"}
        if op == "search":
            self.ws.last_fetched = None
        try:
            call = self._dispatch(name, call_args)
        except Exception as exc:  # e.g. the episode ended meanwhile: nothing more is run or logged for it
            return {"error": f"{type(exc).__name__}: {exc}"}
        self.log.append({"function": op, "tool": name, "error": call.error} if call.error else
                        {"function": op, "tool": name, "ok": True})
        if call.error:
            return {"error": call.error}
        if op == "search":
            if self.ws.last_fetched is None:
                return {"error": "the search returned nothing readable"}
            return {"result": self.ws.last_fetched}
        return {"result": call.output}

    @staticmethod
    def _tool_call(op: str, args: dict) -> tuple[str, dict]:
        """The tool call an in-sandbox function stands for (its arguments are checked by the tool itself)."""
        if op == "search":
            params = args.get("params") or {}
            if not isinstance(params, dict):
                raise TypeError("params must be a dict of search parameter -> value or list of values")
            pairs = [(str(k), str(x)) for k, v in params.items() for x in (v if isinstance(v, list) else [v])]
            query = str(args["resource_type"]) + ("?" + urlencode(pairs) if pairs else "")
            return "fhir_get", {"query": query}
        ids = {"resourceType": args["resource_type"]}
        if "resource_id" in args:
            ids["resourceId"] = args["resource_id"]
        if op == "read":
            return "getResourceById", ids
        if op == "create":
            return "createResource", {**ids, "body": args["body"]}
        if op == "update":
            return "updateResource", {**ids, "body": args["body"]}
        if op == "delete":
            return "deleteResource", ids
        raise KeyError(op)


def _ready(fd: int, event: int, timeout_ms: int = 50) -> bool:
    p = select.poll()
    p.register(fd, event)
    return bool(p.poll(timeout_ms))


def _clip(text: str, limit: int, keep_tail: bool = False) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters (the head, or the tail for a traceback) and how many were cut."""
    if len(text) <= limit:
        return text, 0
    cut = len(text) - max(0, limit)
    return (text[cut:] if keep_tail else text[: max(0, limit)]), cut


def run_python(ctx: ToolContext, args: dict) -> dict:
    ws = workspace(ctx)
    try:
        ws.sandbox.protections()  # refuses here, before any fd is handed over, when it cannot be set up
    except SandboxUnavailable as exc:
        raise ToolError(str(exc)) from None
    rpc = _Rpc(ctx, ws, time.monotonic() + ws.sandbox.limits.wall_s)
    try:
        inputs = {"retrieved_resources": ws.retrieved()}
    except BaseException:
        rpc.abandon()
        raise
    rpc.start()
    try:
        result = ws.sandbox.run(args["code"], inputs, prelude=rpc.prelude, pass_fds=rpc.child_fds)
    finally:
        rpc.stop()
    out = result.to_json()
    if rpc.log:
        out["fhir_calls"] = rpc.log
    if result.limit:
        out["limit"] = result.limit
    return _bound(out, ctx.budget)


def _bound(out: dict, budget: int) -> dict:
    """The python result within ``budget`` characters: the answer and fhir_calls shortened first when huge,
    then stdout (its head) and stderr/error (their tails), with a note of what was cut."""
    if _size(out) <= budget:
        return out
    if "answer" in out and _size(out["answer"]) > budget // 4:
        text, cut = _clip(orjson.dumps(out["answer"], default=json_default_str).decode(), budget // 4)
        out["answer"], out["answer_truncated"] = text, f"{cut} characters of the answer's JSON left out"
    if "fhir_calls" in out and _size(out["fhir_calls"]) > budget // 4:
        calls = out["fhir_calls"]
        out["fhir_calls"] = [*calls[:5], {"omitted": len(calls) - 10}, *calls[-5:]]
    reserve = 200  # room for the note below
    cuts: list[str] = []
    for key, tail in (("stdout", False), ("stderr", True), ("error", True)):
        over = _size(out) + reserve - budget
        if over <= 0 or not out.get(key):
            continue
        # each character cut removes at least one byte of JSON, so one cut of `over` characters suffices
        out[key], cut = _clip(out[key], len(out[key]) - over, keep_tail=tail)
        cuts.append(f"{cut} characters of {key}")
    if cuts:
        out["truncated_output"] = ", ".join(cuts) + " left out to fit the output budget"
    return out


def finish(ctx: ToolContext, args: dict) -> dict:
    return {"final_answer": args["answer"], "note": "final answer recorded; the episode ends"}


def final_answer_of(call: ToolCall) -> str | None:
    """The answer of a successful ``finish`` call (any other call: None): agents end the episode with it."""
    if call.name != FINISH.name or call.error:
        return None
    answer = call.arguments.get("answer")
    return answer if isinstance(answer, str) else orjson.dumps(answer, default=json_default_str).decode()


FHIR_QUERY = Tool(
    "fhir_query",
    "Fetch every resource of one type for one patient (all pages; for MedicationRequest the referenced "
    "Medication resources too) into your workspace, where python code sees them as "
    "retrieved_resources[resource_type]. A re-fetch merges (nothing is dropped). Returns counts and ids.",
    {"type": "object", "properties": {
        "resource_type": {"type": "string", "description": "FHIR resource type, e.g. Observation, Encounter"},
        "patient_id": {"type": "string", "description": "the Patient resource id"}},
     "required": ["resource_type", "patient_id"]}, fhir_query, group="codeact")

FHIR_GET = Tool(
    "fhir_get",
    "Run one FHIR search, e.g. 'Observation?patient=123&code=http://loinc.org|8867-4&date=ge2024-01-01', "
    "following every page; the results go into your workspace (retrieved_resources in python). Searches "
    "only: no reads by id (use ?_id=), no _history, no $operations. Returns counts and ids.",
    {"type": "object", "properties": {
        "query": {"type": "string", "description": "ResourceType?param=value&... (relative to the server)"}},
     "required": ["query"]}, fhir_get, group="codeact")

PYTHON = Tool(
    "python",
    "Run Python code in a sandbox (no network; the standard library only; limits on CPU time, memory and "
    "output). retrieved_resources (dict: resource type -> list of resources) holds what you fetched; "
    "search(type, params), read_resource(type, id), create_resource(type, body), update_resource(type, id, "
    "body) and delete_resource(type, id) call the FHIR server. Set the variable answer to return a value; "
    "print() shows up as stdout.",
    {"type": "object", "properties": {"code": {"type": "string", "description": "Python source to run"}},
     "required": ["code"]}, run_python, group="codeact")

FINISH = Tool(
    "finish", "Give your final answer; this ends the episode.",
    {"type": "object", "properties": {"answer": {"type": "string", "description": "the final answer"}},
     "required": ["answer"]}, finish, group="codeact")

CODEACT_TOOLS: tuple[Tool, ...] = (FHIR_QUERY, FHIR_GET, PYTHON, FINISH)


def needs_workspace(tools: Iterable[Tool]) -> bool:
    """Whether a tool set holds a tool that uses the episode's workspace (so the episode makes one)."""
    return any(t.name in ("fhir_query", "fhir_get", "python") and t.group == "codeact" for t in tools)


def episode_toolbox(tools: Iterable[Tool], client, *, budget: int | None = None, extras: dict | None = None,
                    unsafe_python: bool = False, dispatch: Dispatch | None = None,
                    code_tools: Iterable[Tool] | None = None) -> tuple[Toolbox, Workspace | None]:
    """The toolbox of one episode or served session, and its workspace if a tool needs one: the one
    assembly ``env.Episode`` and ``fhirgym mcp`` share. The sandboxed code's FHIR functions go through
    ``dispatch``, else through a toolbox of ``code_tools`` (default: ``tools``) on the same context."""
    tools = tuple(tools)
    ctx = ToolContext(client) if budget is None else ToolContext(client, budget)
    ctx.extras.update(extras or {})
    ctx.extras[UNSAFE_KEY] = unsafe_python
    workspace = None
    if needs_workspace(tools):
        if dispatch is None:
            dispatch = Toolbox(tuple(code_tools) if code_tools is not None else tools, ctx).call
        workspace = ctx.extras[WORKSPACE_KEY] = Workspace(unsafe=unsafe_python, dispatch=dispatch)
    return Toolbox(tools, ctx), workspace
