"""`python preprocess.py task=<task>`: train or load the tokenizer and write every split's token store, so that
training (on any number of processes) starts by memory-mapping them; with `download=true`, first fetch the files the
task reads (seqmix.config.download)."""

from __future__ import annotations

import logging
import time

from hydra.utils import instantiate
from omegaconf import DictConfig

from seqmix.config.download import download_task_data, suggest_download
from seqmix.config.runtime import job_overrides
from seqmix.config.schema import PREPROCESS, check


def preprocess(cfg: DictConfig) -> None:
    check(cfg, PREPROCESS)
    start = time.perf_counter()
    if cfg.get("download"):
        download_task_data(cfg)
    with suggest_download(cfg.task, job_overrides()):
        datamodule = instantiate(cfg.task.data, _convert_="all")
        logging.getLogger("seqmix.data").setLevel(logging.WARNING)  # the summary below says it once
        datamodule.setup("fit")
    print(f"task {cfg.task.name}: tokenizer with {datamodule.tokenizer.vocab_size:,} ids")
    for line in datamodule.summary():
        print(line)
    print(f"ready in {time.perf_counter() - start:.1f} s")
