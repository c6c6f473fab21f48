"""Encode a task's data into token stores once: `python preprocess.py task=wmt_ende` (see README)."""

import hydra
from omegaconf import DictConfig

from seqmix.cli.runner import guarded_job, run_command
from seqmix.config.resolvers import register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="preprocess")
@guarded_job
def main(cfg: DictConfig):
    from seqmix.cli.preprocess import preprocess

    preprocess(cfg)


if __name__ == "__main__":
    run_command(main)
