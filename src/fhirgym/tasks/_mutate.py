"""Perturbed reference solutions: proof that strict validators reject near-misses.

Each mutation runs a family's reference solution through a toolbox that corrupts its writes in one
way a careless agent would: the wrong target entity, a required element left out, a wrong value, a
write left out, or an extra unrelated write. A validator that still passes one of them is too loose.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..tools import Toolbox, ToolCall
from ._family import Instance, Verdict

WRITES = ("createResource", "updateResource")
NA = object()  # an edit's answer: "this write offers nothing to mutate", try the next one
_REF = re.compile(r"^([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]{1,64})$")


class _Mutating(Toolbox):
    """A toolbox whose first write call from the ``target``-th on that ``edit`` applies to is rewritten
    (``edit`` returns the new arguments or a (tool, arguments) pair, None to skip the call, or NA to leave
    it alone)."""

    def __init__(self, inner: Toolbox, edit: Callable[[Toolbox, str, dict], dict | None], target: int = 0) -> None:
        super().__init__(inner.tools.values(), inner.context)
        self.edit = edit
        self.target = target
        self.writes = 0
        self.applied = False

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        if name in WRITES:
            index = self.writes
            self.writes += 1
            if index >= self.target and not self.applied:
                new = self.edit(self, name, copy.deepcopy(arguments or {}))
                if new is not NA:
                    self.applied = True
                    if new is None:
                        return ToolCall(name, arguments or {}, {"skipped": True}, None, None, 0.0)
                    name, arguments = new if isinstance(new, tuple) else (name, new)
        return super().call(name, arguments)


def _other_id(box: Toolbox, rtype: str, not_id: str) -> str | None:
    out = box.context.client.search(rtype, {"_count": "5", "_elements": "id"}).body or {}
    ids = [e["resource"]["id"] for e in out.get("entry", []) if e["resource"]["id"] != not_id]
    return ids[0] if ids else None


def _retarget(box: Toolbox, name: str, args: dict) -> dict | None:
    """Point the write at another entity: another patient in its references, or another resource id."""
    body = args.get("body") or {}
    for path, value in _walk(body):
        m = _REF.match(value) if isinstance(value, str) and path.endswith("reference") else None
        if m and m.group(1) == "Patient":
            other = _other_id(box, "Patient", m.group(2))
            if other:
                _set(body, path, f"Patient/{other}")
                return args
    target = args.get("resourceId", "") if name == "updateResource" else ""
    other = _other_id(box, args["resourceType"], target)
    if other:  # an update of another resource; for a create: overwriting an existing record instead
        current = box.context.client.read(args["resourceType"], other).body or {}
        new_body = {**current, **{k: v for k, v in body.items() if k not in ("id", "meta")}, "id": other}
        return "updateResource", {"resourceType": args["resourceType"], "resourceId": other, "body": new_body}
    return NA


def _walk(obj, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, obj


def _set(obj, path: str, value) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    for part in parts[:-1]:
        obj = obj[int(part[1:-1])] if part.startswith("[") else obj[part]
    last = parts[-1]
    if last.startswith("["):
        obj[int(last[1:-1])] = value
    else:
        obj[last] = value


def _checked_keys(inst: Instance, rtype: str) -> list[str]:
    keys: list[str] = []
    for exp in inst.gold.expects:
        if exp.rtype == rtype:
            keys += [c.path.split(".")[0] for c in exp.checks if c.path not in ("id", "resourceType")]
    return list(dict.fromkeys(keys))


def _drop(inst: Instance) -> Callable:
    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        body = args.get("body") or {}
        for key in _checked_keys(inst, args.get("resourceType", "")):
            if key in body:
                del body[key]
                return args
        return NA
    return edit


def _mangle(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if isinstance(value, str):
        if re.match(r"^\d{4}-\d{2}-\d{2}", value):
            return str(int(value[:4]) - 1) + value[4:]
        m = _REF.match(value)
        if m:
            return f"{m.group(1)}/mutated-{m.group(2)}"[:60]
        return value + "-x" if value not in ("booked", "busy", "free", "cancelled") else (
            "proposed" if value in ("booked", "cancelled") else "busy-tentative")
    if isinstance(value, list):
        return [_mangle(v) for v in value]
    if isinstance(value, dict):
        return {k: (_mangle(v) if k not in ("system",) else v) for k, v in value.items()}
    return value


def _wrong_value(inst: Instance) -> Callable:
    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        body = args.get("body") or {}
        for key in _checked_keys(inst, args.get("resourceType", "")):
            if key in body:
                body[key] = _mangle(body[key])
                return args
        return NA
    return edit


def _skip(box: Toolbox, name: str, args: dict) -> dict | None:
    return None


@dataclass
class Outcome:
    mutation: str
    applied: bool
    verdict: Verdict | None

    @property
    def rejected(self) -> bool:
        return self.verdict is not None and not self.verdict.success


MUTATIONS = ("wrong_target", "drop_field", "wrong_value", "skip_write", "extra_write")


def run_mutation(inst: Instance, mutation: str) -> Outcome:
    """Run the reference solution of ``inst`` perturbed by ``mutation`` and validate the result."""
    with inst.open() as ep:
        inner = ep.toolbox()
        if mutation == "extra_write":
            text = inst.family.solve(inner, inst.params, inst.now)
            inner.call("createResource", {"resourceType": "Basic", "body": {
                "resourceType": "Basic", "code": {"text": "unrelated note written by a careless agent"}}})
            return Outcome(mutation, True, ep.finish(text))
        edit = {"wrong_target": _retarget, "drop_field": _drop(inst), "wrong_value": _wrong_value(inst),
                "skip_write": _skip}[mutation]
        box = _Mutating(inner, edit, target=0 if mutation != "skip_write" else _last_write(inst))
        text = inst.family.solve(box, inst.params, inst.now)
        if not box.applied:
            return Outcome(mutation, False, None)
        return Outcome(mutation, True, ep.finish(text))


def _last_write(inst: Instance) -> int:
    return max(0, sum(1 for c in inst.reference.calls if c.name in WRITES) - 1)
