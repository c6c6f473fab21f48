"""Getting the data as a user without ../shared/data does: `python preprocess.py task=<task> download=true` fetches a
corpus (from a loopback server standing in for its host, through SEQMIX_DOWNLOAD_MIRROR) into the folder the task
reads, training then runs on it; missing data, an unreachable host and a task with nothing to fetch each end in one
line saying what to run. Also the default data folder (seqmix.config.resolvers.data_dir)."""

from __future__ import annotations

import socket
import urllib.parse
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from seqmix.config.download import download_task_data, suggest_download
from seqmix.config.resolvers import data_dir
from seqmix.config.schema import PREPROCESS, TRAIN, check, untyped_keys
from seqmix.data.fetch import CORPORA
from seqmix.data.sources import DataNotFound
from seqmix.errors import SeqmixError
from tests.helpers import ROOT, TINY, FileServer, describe, run, run_config

MULTI30K = CORPORA["multi30k"]
TINY_MODEL = [o for o in TINY if not o.startswith("task.")]  # TINY's task keys are the toy task's


@pytest.fixture(scope="module")
def server(multi30k_dir):
    served = FileServer({urllib.parse.urlsplit(f.url).path: (multi30k_dir / f.name).read_bytes()
                         for f in MULTI30K.files if (multi30k_dir / f.name).is_file()})
    yield served
    served.close()


def environment(tmp_path: Path, mirror: str) -> dict:
    return {"SEQMIX_DOWNLOAD_MIRROR": mirror, "SEQMIX_DATA_DIR": str(tmp_path / "data"),
            "SEQMIX_CACHE_DIR": str(tmp_path / "cache")}


def last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_download_then_train_on_the_fetched_files(server, tmp_path, multi30k_dir):
    """The files the task reads arrive whole under <data_dir>/multi30k (the test split is not read, so not
    fetched), preprocess builds the stores, and training runs on them."""
    env = environment(tmp_path, server.url)
    data = ["task.vocab_size=300"]
    fetched = run("preprocess.py", ["task=multi30k_ende", "download=true", *data], tmp_path / "logs", env=env)
    assert fetched.returncode == 0, describe(fetched)
    folder = tmp_path / "data" / "multi30k"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"]
    for f in folder.glob("*.gz"):
        assert f.read_bytes() == (multi30k_dir / f.name).read_bytes()
    assert "tokenizer with" in fetched.stdout and len(server.requests) == 4
    trained = run("train.py", ["experiment=multi30k_transformer_cpu", *data, *TINY_MODEL, "trainer.max_steps=5",
                               "trainer.max_epochs=-1", "trainer.val_check_interval=5", "trainer.limit_val_batches=1",
                               "task.data.max_tokens=1024", "run_test=false", "trainer.precision=32-true",
                               f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "logs", env=env)
    assert trained.returncode == 0, describe(trained)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


def test_an_unreachable_host_is_one_line_naming_the_url_and_the_folder(tmp_path):
    """Nothing listens on the port: exit 2, one line with the URL tried and where to put the files by hand, and no
    file under a name the task reads."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    proc = run("preprocess.py", ["task=multi30k_ende", "download=true"], tmp_path / "logs",
               env=environment(tmp_path, f"http://127.0.0.1:{port}/"))
    assert proc.returncode == 2, describe(proc)
    line = last_line(proc)
    folder = tmp_path / "data" / "multi30k"
    assert line.startswith("seqmix: error: cannot reach ") and "Traceback" not in proc.stderr
    assert f"http://127.0.0.1:{port}/multi30k/dataset/" in line and f"in {folder}" in line
    assert "train.en.gz, train.de.gz, val.en.gz, val.de.gz" in line
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".")] == []


def test_missing_data_names_the_download_command_and_the_folder(tmp_path):
    proc = run("preprocess.py", ["task=wikitext2", f"paths.data_dir={tmp_path / 'mine'}"], tmp_path / "logs",
               env={"SEQMIX_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, describe(proc)
    assert last_line(proc) == (
        f"seqmix: error: task wikitext2 finds no train.txt in {tmp_path / 'mine' / 'wikitext-2'}: download WikiText-2 "
        f"v1, word level (Merity et al. 2016) there with `python preprocess.py task=wikitext2 "
        f"paths.data_dir={tmp_path / 'mine'} download=true`, or set task.data.source.path to a folder that holds its "
        f"files")


def test_a_task_without_a_download_names_those_with_one(tmp_path):
    """Every shipped task reading local files has a download now: the generated toy task stands for one without."""
    proc = run("preprocess.py", ["task=toy_reverse", "download=true"], tmp_path / "logs",
               env={"SEQMIX_DATA_DIR": str(tmp_path / "data"), "SEQMIX_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, describe(proc)
    line = last_line(proc)
    assert line.startswith("seqmix: error: task toy_reverse has no download; download=true fetches the data of ")
    assert all(f"task={t}" in line for t in ("dialogsum", "iwslt14_deen", "multi30k_ende", "scitldr", "wikitext2"))
    assert line.endswith("; it reads no files")


def test_a_hub_task_says_datasets_fetches_it(tmp_path):
    """Hugging Face tasks have no registry entry: download=true says the dataset arrives with the stores."""
    said = []
    download_task_data(run_config(["task=wmt16_enro", f"paths.cache_dir={tmp_path}"]), report=said.append)
    assert said == [f"task wmt16_enro reads Hugging Face dataset 'wmt16' (ro-en) through `datasets`, which downloads "
                    f"it into {tmp_path}/hf now, while the token stores are built (the network is needed once)"]


def test_the_data_folder_is_the_shared_one_when_present_else_per_user(tmp_path, monkeypatch):
    project, shared = tmp_path / "project", tmp_path / "shared" / "data"
    project.mkdir()
    monkeypatch.setenv("SEQMIX_ROOT", str(project))
    monkeypatch.delenv("SEQMIX_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_dir() == str(tmp_path / "xdg" / "seqmix" / "data")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    assert data_dir() == str(Path.home() / ".cache" / "seqmix" / "data")
    shared.mkdir(parents=True)
    assert Path(data_dir()).resolve() == shared
    assert Path(run_config(["task=multi30k_ende"]).task.data.source.path).resolve() == shared / "multi30k"
    monkeypatch.setenv("SEQMIX_DATA_DIR", str(tmp_path / "mine"))
    assert data_dir() == str(tmp_path / "mine")


def test_a_missing_file_download_would_not_fetch_keeps_its_own_message(tmp_path):
    """A split name the corpus lacks is a naming mistake, not missing data: no download command is suggested."""
    task = run_config(["task=multi30k_ende"]).task
    with pytest.raises(DataNotFound, match="^fix the split name$"):
        with suggest_download(task):
            raise DataNotFound("fix the split name", tmp_path, "dev2.en")
    with pytest.raises(SeqmixError, match="download=true"):
        with suggest_download(task):
            raise DataNotFound("no folder", tmp_path, "val.de")


def test_the_download_keys_are_typed():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="preprocess", overrides=["task=dialogsum"])
        assert untyped_keys(cfg, {**TRAIN, **PREPROCESS}) == []
        check(cfg, PREPROCESS)
        for override, message in (("download=maybe", "download='maybe': must be true or false"),
                                   ("task.download=wmt14", "task.download='wmt14': must be one of ['multi30k'")):
            with pytest.raises(SeqmixError) as err:
                check(compose(config_name="preprocess", overrides=["task=multi30k_ende", override]), PREPROCESS)
            assert str(err.value).startswith(message), str(err.value)
