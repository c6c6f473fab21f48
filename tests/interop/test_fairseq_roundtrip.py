"""seqmix models through fairseq's format and back: a model built and saved the way training saves it, exported and
re-imported, holds the same weights and decodes to identical hypotheses; what fairseq cannot express is refused;
``python -m seqmix.interop.fairseq import`` + ``generate.py input=`` translate with an imported model."""

from __future__ import annotations

import gzip

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from seqmix.config.build import build_task, load_task
from seqmix.config.mixer_group import settle_mixer_choice
from seqmix.config.resolvers import register_resolvers
from seqmix.data.tokenizer import train_tokenizer
from seqmix.errors import SeqmixError
from seqmix.interop.fairseq import export_checkpoint, import_checkpoint
from seqmix.interop.fairseq_models import family_for_seqmix
from tests.helpers import ROOT, run
from tests.interop.fairseq_builders import tiny_transformer_checkpoint

register_resolvers()

TINY = ["model.embed_dim=16", "model.encoder.layers=2", "model.decoder.layers=2", "model.encoder.ffn_dim=32",
        "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
        "model.decoder.cross_attention_heads=2", "model.dropout=0.0"]
SENTENCES = ["a small dog runs", "two dogs run on the grass", "the cat sleeps", "a man rides a bike",
             "the dog and the cat play", "people walk in the park"]


def composed(overrides: list[str]):
    from hydra.core.hydra_config import HydraConfig

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["logger=csv", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    settle_mixer_choice(cfg)
    with open_dict(cfg):  # what a run's checkpoint stores: the config without Hydra's own node
        del cfg["hydra"]
        cfg.paths.output_dir = "unused"
    return cfg


def saved_seqmix_checkpoint(tmp_path, overrides: list[str]):
    """A seqmix model saved as training saves it (Lightning's state dict + the task's ``on_save_checkpoint``)."""
    cfg = composed(overrides)
    tokenizer = train_tokenizer(SENTENCES * 3, vocab_size=40, min_frequency=1)
    torch.manual_seed(0)
    task = build_task(cfg, tokenizer)
    ckpt = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(ckpt)
    path = tmp_path / "seqmix.ckpt"
    torch.save(ckpt, path)
    return path


@pytest.mark.parametrize("model", ["transformer_small", "dynamicconv_small", "convs2s_small", "talk_small"])
def test_a_seqmix_model_exported_and_reimported_decodes_identically(tmp_path, model):
    extra = ["model.encoder.embed_dim=16", "model.decoder.embed_dim=16", "model.decoder.out_embed_dim=16",
             "model.encoder.layers=[[16,3],[24,3]]", "model.decoder.layers=[[16,3],[16,2]]"] \
        if model == "convs2s" + "_small" else TINY
    path = saved_seqmix_checkpoint(tmp_path, [f"model={model}", *extra])
    export_checkpoint(path, tmp_path / "fairseq")
    assert {p.name for p in (tmp_path / "fairseq").iterdir()} == {
        "checkpoint.pt", "dict.src.txt", "dict.tgt.txt", "seqmix_tokenizer.json"}
    import_checkpoint(tmp_path / "fairseq" / "checkpoint.pt", tmp_path / "fairseq", tmp_path / "back.ckpt")
    (original, _), (back, _) = load_task(path), load_task(tmp_path / "back.ckpt")
    vocab = original.tokenizer._hf  # the dictionary: the tokenizers vocabulary after the 4 specials, in id order
    lines = (tmp_path / "fairseq" / "dict.tgt.txt").read_text(encoding="utf-8").splitlines()
    assert lines == [f"{vocab.id_to_token(i)} 1" for i in range(4, original.tokenizer.vocab_size)]
    container = torch.load(tmp_path / "fairseq" / "checkpoint.pt", weights_only=False)
    assert container["args"].arch == {"transformer_small": "transformer", "dynamicconv_small": "lightconv",
                                      "convs2s_small": "fconv", "talk_small": "talkconv"}[model]
    assert back.tokenizer.to_json() == original.tokenizer.to_json()
    theirs, ours = original.model.state_dict(), back.model.state_dict()
    assert sorted(theirs) == sorted(ours) and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    generation = original.run_config["task"]["generation"]  # travels as fairseq's generation options
    assert {k: back.run_config["task"]["generation"][k] for k in generation} == generation
    options = dict(beam_size=2, len_penalty=1.0, max_len_a=0.0, max_len_b=8)
    hyps = [t.evaluate_texts(SENTENCES, None, **options)[0] for t in (original, back)]
    assert hyps[0] == hyps[1] and any(hyps[0])


def test_a_bos_start_model_is_not_exported(tmp_path):
    path = saved_seqmix_checkpoint(tmp_path, ["model=transformer_small", "model.decoder_start=bos", *TINY])
    with pytest.raises(SeqmixError, match="fairseq-generate starts from eos"):
        export_checkpoint(path, tmp_path / "fairseq")
    assert not (tmp_path / "fairseq" / "checkpoint.pt").exists()


@pytest.mark.parametrize("overrides,needle", [
    (["model=talk_small", "model.encoder.activation=relu"], "activation relu"),
    (["experiment=multi30k_hybrid_cpu"], "hybrid mixer pattern"),
    (["model=lightconv_small", "model.encoder.activation=swish"], "activation swish"),
    (["model=disco"], "no fairseq counterpart"),
])
def test_what_fairseq_cannot_express_is_refused(overrides, needle):
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(composed(overrides).model, resolve=True)
    with pytest.raises(SeqmixError, match=needle):
        family_for_seqmix(model).fairseq_settings(model)


def test_import_command_and_generate_translate_raw_text(tmp_path):
    torch.save(tiny_transformer_checkpoint(tmp_path), tmp_path / "checkpoint.pt")
    data = tmp_path / "data"
    (tmp_path / "bpecodes").write_text("#version: 0.2\nw 1</w>\n")  # only "w1" is one piece; "w11" is w@@ 1@@ 1
    proc = run("seqmix.interop.fairseq", ["import", str(tmp_path / "checkpoint.pt"), "--data-dir", str(data),
                                          "--bpe-codes", str(tmp_path / "bpecodes"), "--out", str(tmp_path / "m.ckpt")],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    tokenizer = load_task(tmp_path / "m.ckpt")[0].tokenizer
    assert [len(tokenizer.encode(w)) for w in ("w1", "w11")] == [1, 3]
    (tmp_path / "in.txt").write_text("w1 w2 w3\nw4 w5\n")
    proc = run("generate.py", [f"ckpt_path={tmp_path / 'm.ckpt'}", f"input={tmp_path / 'in.txt'}",
                               f"output={tmp_path / 'hyp.txt'}", "beam_size=2", f"hydra.run.dir={tmp_path / 'run'}"],
               tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 2
    (data / "valid.de").write_text("w1 w2 w3\nw4 w5\n")  # split= reads the data folder given at import
    (data / "valid.en").write_text("w6 w7\nw8\n")
    proc = run("generate.py", [f"ckpt_path={tmp_path / 'm.ckpt'}", "split=valid", f"output={tmp_path / 'valid.txt'}",
                               "beam_size=2", f"hydra.run.dir={tmp_path / 'run2'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BLEU" in proc.stdout and len((tmp_path / "valid.txt").read_text().splitlines()) == 2
    proc = run("seqmix.interop.fairseq", ["import", str(tmp_path / "in.txt"), "--data-dir", str(data), "--out",
                                          str(tmp_path / "x.ckpt")], tmp_path)
    assert proc.returncode == 2 and "seqmix: error:" in proc.stderr and len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("recipe", ["multi30k_lightconv_cpu", "multi30k_convs2s_cpu"])  # fairseq's lightconv and fconv
def test_a_multi30k_recipe_model_exported_and_reimported_translates_identically(tmp_path, multi30k_dir, recipe):
    """The recipe's own model (full size, its 8K joint BPE), briefly trained by train.py (3 updates of 1,024-token
    batches): export → import → the same beam-5 translations of Multi30k valid sentences, through generate.py as a
    user runs it."""
    proc = run("train.py", [f"experiment={recipe}", "logger=csv", "~callbacks.progress_bar", "trainer.max_steps=3",
                            "task.data.max_tokens=1024", "trainer.max_time=null", "trainer.val_check_interval=3",
                            "trainer.limit_val_batches=1",
                            "run_test=false", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = tmp_path / "run" / "checkpoints" / "best.ckpt"
    for command in (["export", str(trained), "--out", str(tmp_path / "fairseq")],
                    ["import", str(tmp_path / "fairseq" / "checkpoint.pt"), "--data-dir", str(tmp_path / "fairseq"),
                     "--out", str(tmp_path / "back.ckpt")]):
        done = run("seqmix.interop.fairseq", command, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    with gzip.open(multi30k_dir / "val.en.gz", "rt", encoding="utf-8") as f:
        sources = f.read().splitlines()[:24]
    (tmp_path / "val24.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    hypotheses = []
    for name, ckpt in (("original", trained), ("back", tmp_path / "back.ckpt")):
        out = tmp_path / f"{name}.de"
        proc = run("generate.py", [f"ckpt_path={ckpt}", f"input={tmp_path / 'val24.en'}", f"output={out}",
                                   "beam_size=5", "len_penalty=1.0", "max_len_a=1.2", "max_len_b=10",
                                   f"hydra.run.dir={tmp_path / name}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        hypotheses.append(out.read_text(encoding="utf-8").splitlines())
    assert len(hypotheses[0]) == 24 and hypotheses[0] == hypotheses[1] and any(hypotheses[0])
