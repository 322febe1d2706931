"""The default world of every command and of ``world.build_world()``, and the question set QA evaluation
builds on it: one home, importable without loading any layer (the CLI's ``--help`` stays fast). Seed 42,
10 patients: built in about half a minute, then cached; a bigger world is asked for with ``--patients``."""

DEFAULT_SEED = 42
DEFAULT_PATIENTS = 10
#: Questions per template of the set ``eval --track qa`` builds without ``--questions`` (and that
#: ``qa score``/``qa judge-agreement`` rebuild to read a run's results).
QA_PER_TEMPLATE = 10
#: The tracks' names, the first the default (``tasks.TRACKS`` defines them; a test keeps the two equal).
TRACK_NAMES = ("action", "qa")
#: The agent loop and the configuration (tools) a run uses unless told otherwise.
AGENT = "react"
CONFIG = "baseline"
#: The policy RL and behaviour cloning start from, and the GRPO recipe they use, unless told otherwise.
POLICY = "qwen2.5-coder-0.5b"
RECIPE = "clip-higher"
#: Questions per template of the QA set RL rows name by default (``rl`` commands' ``--qa-per-template``).
RL_QA_PER_TEMPLATE = 20
#: Where ``serve`` and ``mcp ... --transport http`` listen by default: this machine only.
HOST = "127.0.0.1"
