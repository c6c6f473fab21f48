"""CTranslate2 export (``python -m seqmix.interop.ctranslate2 export``) and its decoding helper: on tiny Transformers
trained for a few seconds (so that hypotheses end in eos and scores are distinct), CTranslate2's beam-5 hypotheses are
seqmix's and their scores agree to float32 rounding; every mapped option (pre/post-norm, shared or own embeddings and
output projection, sinusoidal or learned positions, relu/gelu, bos or eos as the decoder's start) is covered; int8
exports load and decode; what cannot be exported, missing and corrupt checkpoints end in one line; a failed export
leaves no folder."""

from __future__ import annotations

import random
import sys

import ctranslate2
import pytest
import torch

from seqmix.config.build import build_task, load_task
from seqmix.data.dataset import collate_pairs
from seqmix.data.tokenizer import train_tokenizer
from seqmix.errors import SeqmixError
from seqmix.interop import ctranslate2 as export_module
from seqmix.interop.ctranslate2 import export_checkpoint, require_ctranslate2
from seqmix.interop.ctranslate2_decoding import CT2Translator
from seqmix.interop.fairseq import save_seqmix_checkpoint
from tests.helpers import describe, run, run_config

TINY = ["model=transformer_small", "model.embed_dim=32", "model.encoder.layers=2", "model.decoder.layers=2",
        "model.encoder.ffn_dim=64", "model.decoder.ffn_dim=64", "model.encoder.heads=4", "model.decoder.heads=4",
        "model.decoder.cross_attention_heads=4", "model.dropout=0.0"]
# every other mapping at once: pre-norm (final layer norms), own embeddings and output projection, learned
# positions, gelu, bos as the decoder's first input
VARIANT = ["model.encoder.normalize_before=true", "model.decoder.normalize_before=true",
           "model.share_all_embeddings=false", "model.share_decoder_input_output_embed=false",
           "model.positions=learned", "model.encoder.activation=gelu", "model.decoder.activation=gelu",
           "model.decoder_start=bos"]
LETTERS = "a b c d e f g h".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 9))) for _ in range(n)]


def trained_checkpoint(path, overrides, steps: int = 150, model: list[str] = TINY):
    """A tiny model (``model``: TINY) trained to reverse letter sequences for ``steps`` Adam updates (seconds)."""
    train = sentences(400, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster, and steadier on a shared CPU
    tok = train_tokenizer(train, vocab_size=40)
    torch.manual_seed(0)
    task = build_task(run_config([*model, *overrides]), tok)
    rng, opt = random.Random(1), torch.optim.Adam(task.model.parameters(), lr=3e-3)
    task.model.train()
    for _ in range(steps):
        samples = [{"id": i, "source": torch.tensor(tok.encode(s) + [tok.eos]),
                    "target": torch.tensor(tok.encode(" ".join(reversed(s.split()))) + [tok.eos])}
                   for i, s in enumerate(rng.sample(train, 32))]
        loss, _, n = task.compute_loss(collate_pairs(samples, tok.pad, tok.bos, tok.eos))
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
    torch.set_num_threads(threads)
    task.model.eval()
    save_seqmix_checkpoint(path, task)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ct2")
    return {"post-norm, shared": trained_checkpoint(folder / "base.ckpt", []),
            "pre-norm, own embeddings": trained_checkpoint(folder / "variant.ckpt", VARIANT)}


@pytest.fixture(scope="module")
def exports(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ct2_out")
    return {name: export_checkpoint(path, folder / name.replace(",", "").replace(" ", "_"))
            for name, path in checkpoints.items()}


def compare(task, translator, texts, **options):
    """(mismatched hypotheses, largest score difference over the matching ones) of seqmix's and CTranslate2's best."""
    search = task.beam_search(**options)
    hyps = translator.translate_hypotheses(texts, **options)
    mismatches, worst = [], 0.0
    for text, h in zip(texts, hyps):
        src = torch.tensor([task.tokenizer.encode(text) + [task.tokenizer.eos]])
        best = search.generate(task.model, src)[0][0]
        if best.tokens[:-1].tolist() != h.tokens:
            mismatches.append((text, best.tokens.tolist(), h.tokens, best.score, h.score))
        else:
            worst = max(worst, abs(best.score - h.score))
    return mismatches, worst


@pytest.mark.parametrize("name", ["post-norm, shared", "pre-norm, own embeddings"])
def test_beam5_hypotheses_and_scores_are_seqmix_s(name, checkpoints, exports):
    task, _ = load_task(checkpoints[name])
    translator = CT2Translator(exports[name], intra_threads=1)
    texts = sentences(40, 7)
    # min_len_b=0: no token banned before the softmax on either side, so the scores are the same numbers
    mismatches, worst = compare(task, translator, texts, beam_size=5, min_len_b=0)
    assert mismatches == [] and worst < 1e-4, (mismatches, worst)
    # the checkpoint's own settings (min_len_b=1, max_len_a=1.2 of the toy task: per-sentence length bounds)
    mismatches, worst = compare(task, translator, texts, beam_size=5)
    assert mismatches == [] and worst < 2e-2, (mismatches, worst)
    mismatches, worst = compare(task, translator, texts, beam_size=5, len_penalty=0.6, max_len_b=5)
    assert len(mismatches) <= 2, mismatches  # only hypotheses that run into the cap may differ (the module says why)
    assert translator.translate(texts) == task.evaluate_texts(texts, None)[0]


def test_the_folder_holds_the_tokenizer_and_says_how_to_use_it(checkpoints, exports):
    folder = exports["pre-norm, own embeddings"]
    names = {p.name for p in folder.iterdir()}
    assert {"model.bin", "config.json", "seqmix_tokenizer.json", "seqmix_serving.json", "README.md"} <= names
    assert "shared_vocabulary.json" in names  # one joint vocabulary (CTranslate2 writes it once)
    translator = CT2Translator(folder)
    assert translator.info["decoder_start"] == "<s>"
    with pytest.raises(SeqmixError, match="max_source_positions"):
        translator.translate(" ".join(["a"] * (translator.info["max_source_positions"] + 1)))
    assert "detokenize" in (folder / "README.md").read_text()


def test_an_int8_export_loads_and_decodes_like_float32(tmp_path):
    # four times wider than TINY: on CPUs other than Intel's, CTranslate2 runs int8 through oneDNN, whose error on a
    # 32-wide toy swamps its scores (benchmarks/README.md, section 5b); at 128 both backends keep to float32's outputs
    wide = [o.replace("embed_dim=32", "embed_dim=128").replace("ffn_dim=64", "ffn_dim=256") for o in TINY]
    checkpoint = trained_checkpoint(tmp_path / "wide.ckpt", [], model=wide)
    out = export_checkpoint(checkpoint, tmp_path / "int8", quantization="int8")
    int8 = CT2Translator(out, intra_threads=1)
    assert int8.info["quantization"] == "int8"
    fp32 = CT2Translator(export_checkpoint(checkpoint, tmp_path / "fp32"), intra_threads=1)
    assert (out / "model.bin").stat().st_size < 0.5 * (tmp_path / "fp32" / "model.bin").stat().st_size
    texts = sentences(40, 7)
    best = fp32.translate_hypotheses(texts, beam_size=5)
    pieces = {i: p for p, i in fp32.target_ids.items()}
    sources = [[fp32.source_pieces[t] for t in fp32.tokenizer.encode(s)] for s in texts]
    targets = [[pieces[t] for t in h.tokens] + ["</s>"] for h in best]

    def log_probs(translator):
        return torch.tensor([p for r in translator.translator.score_batch(sources, targets) for p in r.log_probs])

    # float32's best outputs score about the same under int8 (a wrong scale or a float32 model would not pass)
    gap = (log_probs(int8) - log_probs(fp32)).abs()
    assert gap.mean() < 0.2 and gap.max() > 0, gap
    a, b = int8.translate(texts, beam_size=5), [h.text for h in best]
    assert all(a) and sum(x == y for x, y in zip(a, b)) >= 0.5 * len(texts)


def export_cli(args, tmp_path):
    return run("seqmix.interop.ctranslate2", ["export", *map(str, args)], tmp_path)


def one_line_error(proc) -> str:
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("seqmix: error: "), describe(proc)
    return lines[-1]


@pytest.mark.parametrize("mixer", ["lightconv", "dynamicconv"])
def test_other_mixers_are_refused_naming_what_is_supported(mixer, tmp_path):
    tok = train_tokenizer(sentences(50, 0), vocab_size=40)
    ckpt = tmp_path / "m.ckpt"
    save_seqmix_checkpoint(ckpt, build_task(run_config([*TINY, f"mixer={mixer}"]), tok))
    line = one_line_error(export_cli([ckpt, "--out", tmp_path / "out"], tmp_path))
    assert "self_attention" in line and "Conv" in line
    assert not (tmp_path / "out").exists()


def test_a_convs2s_model_is_refused_before_it_is_built(tmp_path):
    tok = train_tokenizer(sentences(50, 0), vocab_size=40)
    ckpt = tmp_path / "m.ckpt"
    save_seqmix_checkpoint(ckpt, build_task(run_config(["model=convs2s_small"]), tok))
    with pytest.raises(SeqmixError, match="self_attention"):
        export_checkpoint(ckpt, tmp_path / "out")


def test_a_pre_norm_model_without_its_final_norms_is_refused(tmp_path):
    tok = train_tokenizer(sentences(50, 0), vocab_size=40)
    ckpt = tmp_path / "m.ckpt"
    config = run_config([*TINY, "model.encoder.normalize_before=true", "model.decoder.normalize_before=true",
                         "+model.decoder.final_norm=false"])
    save_seqmix_checkpoint(ckpt, build_task(config, tok))
    with pytest.raises(SeqmixError, match="final_norm=false"):
        export_checkpoint(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing", "corrupt", "not a checkpoint"])
def test_missing_and_corrupt_checkpoints_end_in_one_line(case, tmp_path):
    ckpt = tmp_path / "best.ckpt"
    if case == "corrupt":
        ckpt.write_bytes(b"PK\x03\x04 truncated")
    elif case == "not a checkpoint":
        torch.save({"weights": 1}, ckpt)
    line = one_line_error(export_cli([ckpt, "--out", tmp_path / "out"], tmp_path))
    assert str(ckpt) in line
    assert not (tmp_path / "out").exists()


def test_an_existing_folder_is_never_overwritten(checkpoints, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    line = one_line_error(export_cli([checkpoints["post-norm, shared"], "--out", tmp_path / "out"], tmp_path))
    assert "exists" in line and (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_an_interrupted_export_leaves_no_folder(checkpoints, tmp_path, monkeypatch):
    def save_half(self, path):
        (__import__("pathlib").Path(path) / "model.bin").write_bytes(b"half")
        raise OSError("No space left on device")

    monkeypatch.setattr(ctranslate2.specs.TransformerSpec, "save", save_half)
    with pytest.raises(OSError):
        export_checkpoint(checkpoints["post-norm, shared"], tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary twin
    with pytest.raises(SeqmixError, match="not a seqmix CTranslate2 export"):
        CT2Translator(tmp_path / "out")


def test_without_ctranslate2_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(SeqmixError, match=r"pip install seqmix\[serve\]"):
        require_ctranslate2()
    assert export_module.QUANTIZATIONS  # the module itself imports without it
