"""SkyRL 0.4 entrypoint for fhirgym environments (GPU machines; not runnable on CPU).

``python -m fhirgym.rl.skyrl_main key=value ...`` (the launch ``fhirgym rl skyrl`` writes): SkyRL's own
config from the overrides, and ``fhirgym-action``/``fhirgym-qa`` registered with skyrl-gym inside the Ray task, where
SkyRL's generator makes its environments. Runs in SkyRL 0.4's own environment (Python 3.12, CUDA 13;
the launch's header says how to get it), which fhirgym does not install.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    import ray
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.entrypoints.main_base import BasePPOExp, validate_cfg
    from skyrl.train.utils import initialize_ray

    @ray.remote(num_cpus=1)
    def entrypoint(cfg):
        from fhirgym.rl import register_skyrl

        register_skyrl()
        BasePPOExp(cfg).run()

    cfg = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:] if argv is None else argv)
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
