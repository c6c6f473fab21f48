"""Decode with a trained seqmix model: `python generate.py ckpt_path=... split=valid` (see README)."""

import hydra
from omegaconf import DictConfig

from seqmix.cli.runner import guarded_job, run_command
from seqmix.config.resolvers import register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="generate")
@guarded_job
def main(cfg: DictConfig):
    from seqmix.cli.generate import generate

    return generate(cfg)


if __name__ == "__main__":
    run_command(main)
