"""The default world of every command and of ``world.build_world()``: one home, importable without loading
any layer (the CLI's ``--help`` stays fast). Seed 42, 10 patients: built in about half a minute, then
cached; a bigger world is asked for with ``--patients``."""

DEFAULT_SEED = 42
DEFAULT_PATIENTS = 10
