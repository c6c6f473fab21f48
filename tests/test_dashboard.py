"""The dashboard of a real tiny run, read back from wandb's offline run folder (its transaction log and media files),
not from a mock: the composed config and parameter count (also in the CSV logger's hparams.yaml), tags and group, the samples table after each validation,
and the mixer pictures as wandb images and as PNG files in the run folder."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import yaml
from wandb.proto import wandb_internal_pb2

from tests.helpers import TINY, describe, run

BLOCK = 32768  # the transaction log is LevelDB's log format: 32 KiB blocks of (crc32, length, type) framed chunks
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    """Every record of an offline run's ``run-<id>.wandb`` (the 7-byte ':W&B' header, then framed chunks)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a wandb transaction log"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # preallocated, never written
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _put(row: dict, item) -> None:
    """A logged item into ``row``; a nested key (a table's or an image's fields) as nested dicts."""
    keys = [item.key] if item.key else list(item.nested_key)
    for key in keys[:-1]:
        row = row.setdefault(key, {})
    row[keys[-1]] = json.loads(item.value_json)


def offline_run(records: list) -> dict:
    """What the log says: run (tags, group), config, history rows and the summary, decoded from JSON values."""
    out = {"config": {}, "history": [], "summary": {}, "run": None}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            for item in record.run.config.update:
                _put(out["config"], item)
        elif kind == "config":
            for item in record.config.update:
                _put(out["config"], item)
        elif kind == "history":
            row = {}
            for item in record.history.item:
                _put(row, item)
            out["history"].append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _put(out["summary"], item)
    return out


def test_the_offline_wandb_run_holds_config_tags_samples_and_mixer_pictures(tmp_path):
    steps = 30
    proc = run("train.py", [*TINY, "logger=[csv,wandb]", "mixer@model.encoder.mixer=dynamicconv",
                            "mixer@model.decoder.mixer=talk", "model.encoder.mixer.kernel_size=3",
                            "model.decoder.mixer.kernel_size=3", f"trainer.max_steps={steps}",
                            "trainer.max_epochs=-1", "+trainer.val_check_interval=15",
                            "trainer.check_val_every_n_epoch=null", "run_test=false", "tags=[dash_test]",
                            "hydra.run.dir=run"], tmp_path, timeout=900, env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, describe(proc)
    run_dir = tmp_path / "run"
    [folder] = (run_dir / "wandb").glob("offline-run-*")
    logged = offline_run(wandb_records(next(folder.glob("run-*.wandb"))))

    # the composed config, as the run's own .hydra/config.yaml, and its size
    composed = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    config = {k: v.get("value") if isinstance(v, dict) and "value" in v else v for k, v in logged["config"].items()}
    assert config["model"]["encoder"]["mixer"]["_target_"] == "seqmix.mixers.DynamicConv"
    assert config["model"]["decoder"]["mixer"]["_target_"] == "seqmix.mixers.TaLK"
    assert config["task"]["name"] == composed["task"]["name"] and config["optim"]["lr"] == composed["optim"]["lr"]
    record = json.loads((run_dir / "run.json").read_text())
    assert config["parameters"] == record["parameters"] == logged["summary"]["parameters"] > 0
    [hparams] = (run_dir / "csv").glob("version_*/hparams.yaml")  # the CSV logger gets them too
    hparams = yaml.safe_load(hparams.read_text())
    # every composed key but the top-level mixer choice, which the sides' own mixer nodes replace
    assert set(hparams) == set(composed) - {"mixer"} | {"parameters"} and hparams["parameters"] == record["parameters"]
    assert all(hparams[k] == config[k] for k in ("task", "model", "optim", "scheduler", "trainer", "callbacks"))

    # tags and group
    tags = set(logged["run"].tags)
    assert {"task=toy_reverse", "mixer=dynamicconv", "mixer=talk", "dash_test"} <= tags, tags
    assert logged["run"].run_group == "toy_reverse"  # a single run: the task; a multirun's jobs share their sweep's

    # the samples table after each validation (steps 15 and 30), outputs beside references
    tables = [row for row in logged["history"] if "val/samples" in row]
    assert [row["trainer/global_step"] for row in tables] == [15, 30]
    table = json.loads((folder / "files" / tables[-1]["val/samples"]["path"]).read_text())
    assert table["columns"] == ["source", "output", "reference"] and len(table["data"]) == 8
    assert all(isinstance(c, str) for row in table["data"] for c in row) and any(r[2] for r in table["data"])

    # the pictures: wandb images per side at each validation, the same PNGs in the run folder
    for side in ("encoder", "decoder"):
        images = [row for row in logged["history"] if f"mixers/{side}" in row]
        assert [row["trainer/global_step"] for row in images] == [15, 30], side
        media = folder / "files" / images[-1][f"mixers/{side}"]["filenames"][0]
        png = run_dir / "pictures" / f"{side}-step{steps:06d}.png"
        assert png.read_bytes()[:4] == media.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (run_dir / "pictures").iterdir()) == [
        "decoder-step000015.png", "decoder-step000030.png", "encoder-step000015.png", "encoder-step000030.png"]


def test_multirun_jobs_share_a_wandb_group_and_tag_their_sweep(tmp_path):
    proc = run("train.py", ["-m", "seed=1,2", *TINY, "logger=wandb", "trainer.max_steps=2", "trainer.max_epochs=-1",
                            "run_test=false", "trainer.limit_val_batches=0", "callbacks.dashboard.pictures=false"],
               tmp_path, timeout=900, env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, describe(proc)
    sweep = next((tmp_path / "multiruns").iterdir())
    runs = [offline_run(wandb_records(next((sweep / job / "wandb").glob("offline-run-*/run-*.wandb"))))["run"]
            for job in ("0", "1")]
    assert runs[0].run_group == runs[1].run_group == f"toy_reverse-{sweep.name}"
    assert all(f"sweep={sweep.name}" in r.tags for r in runs)
    assert runs[0].run_id != runs[1].run_id
