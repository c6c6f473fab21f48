"""Getting a task's data: a task that reads local files names its corpus in ``download:`` (a key of
``seqmix.data.fetch.CORPORA``); ``python preprocess.py task=<task> download=true`` fetches the files the task reads into
its ``task.data.source.path``, and a command that finds them missing says to run exactly that."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seqmix.config import paths
from seqmix.data.fetch import CORPORA, fetch
from seqmix.data.sources import DataNotFound, HFParallelSource
from seqmix.errors import SeqmixError

# overrides that change where a task's files are, or which: the download command needs them too
_WHERE_OVERRIDES = ("paths.data_dir=", "task.data.source.path=", "task.data.source.pattern=", "task.data.splits.")


def fetchable_tasks() -> dict[str, str]:
    """{task name: corpus} of the shipped tasks with a ``download:`` entry."""
    found = {}
    for path in sorted((paths.conf_dir() / "task").glob("*.yaml")):
        node = OmegaConf.load(path)
        node = node.get("task", node) if "name" not in node else node  # a `@package _global_` task nests it
        if node.get("download"):
            found[str(node.name)] = str(node.download)
    return found


def _hub_note(task: str, source: HFParallelSource) -> str:
    if source.load_from_disk:
        return f"task {task} reads {source.load_from_disk} (load_from_disk): nothing to download"
    dataset = f"Hugging Face dataset {source.name!r}" + (f" ({source.config})" if source.config else "")
    return (f"task {task} reads {dataset} through `datasets`, which downloads it into "
            f"{source.cache_dir or 'its cache'} now, while the token stores are built (the network is needed once)")


def download_task_data(cfg: DictConfig, report: Callable[[str], None] = print) -> None:
    """``download=true``: fetch the corpus files that ``cfg.task`` reads (a Hugging Face task: say that `datasets`
    fetches it as the stores are built); a task with nothing to fetch is refused, naming the tasks that have."""
    task = cfg.task
    source = instantiate(task.data.source, _convert_="all")  # builds nothing and reads no file yet
    source = getattr(source, "base", source)  # distilled data wraps the task's own source
    corpus = task.get("download")
    if corpus is None and isinstance(source, HFParallelSource):
        report(_hub_note(task.name, source))
        return
    if corpus is None:
        where = f"; put its files in {source.path} by hand" if hasattr(source, "path") else "; it reads no files"
        tasks = ", ".join(f"task={name}" for name in sorted(fetchable_tasks()))
        raise SeqmixError(f"task {task.name} has no download; download=true fetches the data of {tasks} (the tasks "
                          f"reading Hugging Face datasets download them when first used){where}")
    splits = [split for split in task.data.splits.values() if split is not None]
    report(f"task {task.name}: {CORPORA[corpus].title} ({CORPORA[corpus].homepage}; license: "
           f"{CORPORA[corpus].license}) into {source.path}")
    fetch(CORPORA[corpus], source.path, [name for split in splits for name in source.file_names(split)], report)


@contextlib.contextmanager
def suggest_download(task: DictConfig, overrides: Sequence[str] = ()) -> Iterator[None]:
    """Reading a task's data inside this block: a file that is missing but that ``download=true`` fetches ends in
    one error naming the command (with the ``overrides`` that say where the data is)."""
    try:
        yield
    except DataNotFound as missing:
        corpus = CORPORA.get(str(task.get("download")))
        if corpus is None or corpus.file_for(missing.name) is None:
            raise
        where = [o for o in overrides if o.lstrip("+").startswith(_WHERE_OVERRIDES)]
        command = " ".join(["python preprocess.py", f"task={task.name}", *where, "download=true"])
        raise SeqmixError(f"task {task.name} finds no {missing.name} in {missing.folder}: download {corpus.title} "
                          f"there with `{command}`, or set task.data.source.path to a folder that holds its files"
                          ) from None
