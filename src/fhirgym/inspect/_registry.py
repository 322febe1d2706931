"""inspect-ai's entry point into fhirgym (``[project.entry-points.inspect_ai] fhirgym``): importing this
module registers every task, solver, model provider and sandbox type, as ``fhirgym/<name>``."""

from ._models import FhirgymModel
from ._sandbox import BwrapSandboxEnvironment
from ._solvers import episode, fhirgym_codeact, fhirgym_react
from ._tasks import action, qa, verdict

__all__ = ["BwrapSandboxEnvironment", "FhirgymModel", "action", "episode", "fhirgym_codeact", "fhirgym_react",
           "qa", "verdict"]
