"""``$validate`` (``POST [type]/$validate``, ``POST [type]/[id]/$validate``): the resource, or
Parameters with ``resource``, ``mode`` (create, update, delete, profile) and ``profile``."""

from __future__ import annotations

from .._core import ServerCore
from .._errors import Issue, bad_request, operation_outcome
from .._http import Request, Response, json_body, operation_params
from .read import current


def validate(server: ServerCore, req: Request, rtype: str, rid: str | None = None) -> Response:
    data = json_body(req, server.config.max_body_bytes) if req.body or rid is None else {"resourceType": "Parameters"}
    options = dict(req.query)
    if data.get("resourceType") == "Parameters":
        params = data.get("parameter", [])
        params = params if isinstance(params, list) else []
        options.update(operation_params([p for p in params if not (isinstance(p, dict)
                                                                    and p.get("name") == "resource")]))
        found = [p.get("resource") for p in params if isinstance(p, dict) and p.get("name") == "resource"]
        if len(found) > 1:
            raise bad_request("$validate Parameters take one 'resource' parameter", "structure")
        data = found[0] if found else None
    mode = options.get("mode", "create")
    if mode not in ("create", "update", "delete", "profile"):
        raise bad_request(f"$validate mode must be create, update, delete or profile; got {mode!r}", "code-invalid",
                          ("mode",))
    if mode == "delete":  # the resource is the stored one: would deleting it succeed?
        if rid is None:
            raise bad_request("$validate mode=delete is an instance operation: Type/id/$validate", "invalid")
        current(server, rtype, rid)  # 404 / 410
        referrers = server.store.referrers(rtype, rid, limit=6) if server.config.referential_integrity else []
        issues = [Issue("error", "conflict", f"{rtype}/{rid} is referenced by {t}/{i}: a delete would be refused "
                                             "(409) unless cascading") for t, i in referrers[:5]]
        return Response(200, operation_outcome(issues or [Issue("information", "informational",
                                                                "Validation successful: the delete would succeed")]))
    if not isinstance(data, dict):
        raise bad_request("$validate Parameters need a 'resource' parameter", "required")
    if data.get("resourceType") != rtype:
        raise bad_request(f"$validate on {rtype} got a {data.get('resourceType')!r}")
    issues = server.validator.validate(data, stop=server.check_time)
    if mode == "update" and data.get("id") is None:
        issues.append(Issue("error", "required", "mode=update: the resource needs an id", (f"{rtype}.id",)))
    elif mode == "update" and rid is not None and data.get("id") != rid:
        issues.append(Issue("error", "invalid", f"mode=update: the resource's id {data.get('id')!r} is not the "
                                                f"id in the URL ({rid!r})", (f"{rtype}.id",)))
    profile = options.get("profile")
    if profile is not None and profile != f"http://hl7.org/fhir/StructureDefinition/{rtype}":
        issues.append(Issue("warning", "not-supported", f"Profile {profile!r} is not known here: validated "
                                                        f"against the core {rtype} definition only"))
    if not issues:
        issues = [Issue("information", "informational", "Validation successful: no issues")]
    return Response(200, operation_outcome(issues))
