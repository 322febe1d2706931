"""One error path, one error shape: every failure becomes an OperationOutcome with an HTTP status.

Each exception carries its status and issue code; the server renders all of them the same way, so a
client never sees a bare string or a 500 for bad input.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Issue:
    """One OperationOutcome.issue."""

    severity: str  # fatal | error | warning | information
    code: str  # IssueType: invalid, structure, required, value, processing, not-found, ...
    diagnostics: str
    expression: tuple[str, ...] = ()

    def to_json(self) -> dict:
        out: dict = {"severity": self.severity, "code": self.code, "diagnostics": self.diagnostics}
        if self.expression:
            out["expression"] = list(self.expression)
        return out


def operation_outcome(issues: list[Issue] | tuple[Issue, ...]) -> dict:
    return {"resourceType": "OperationOutcome", "issue": [i.to_json() for i in issues]}


@dataclass
class FhirError(Exception):
    """A request that cannot be honoured; rendered as an OperationOutcome with ``status``."""

    status: int
    diagnostics: str
    code: str = "processing"
    expression: tuple[str, ...] = ()
    issues: list[Issue] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        Exception.__init__(self, self.diagnostics)
        if not self.issues:
            self.issues = [Issue("error", self.code, self.diagnostics, tuple(self.expression))]

    def outcome(self) -> dict:
        return operation_outcome(self.issues)


def bad_request(msg: str, code: str = "invalid", expression: tuple[str, ...] = ()) -> FhirError:
    return FhirError(400, msg, code, expression)


def not_found(msg: str) -> FhirError:
    return FhirError(404, msg, "not-found")


def invalid_resource(issues: list[Issue]) -> FhirError:
    """A resource failed validation (422 Unprocessable Entity, as HAPI and Blaze answer)."""
    first = next((i for i in issues if i.severity in ("error", "fatal")), issues[0])
    return FhirError(422, first.diagnostics, first.code, first.expression, issues=list(issues))
