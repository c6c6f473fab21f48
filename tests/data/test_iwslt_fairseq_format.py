"""IWSLT'14 as fairseq's prepare-iwslt14.sh leaves it ({train,valid,test}.{de,en}: Moses-tokenized, lowercased,
subword-nmt BPE with "@@ " continuations) is read as words: seqmix's own BPE never sees the markers, references are
the BPE-free tokenized lines, decoding gives that same tokenized form, and no "@@" ever reaches the scorer."""

from __future__ import annotations

import random
from pathlib import Path

import lightning as L
import pytest
from hydra.utils import instantiate

from seqmix.config.build import bleu_options, build_task
from seqmix.data import LocalParallelSource, TranslationDataModule
from seqmix.data.sources import remove_bpe
from seqmix.errors import SeqmixError
from seqmix.tasks import translation
from tests.helpers import describe, run, run_config

# (German, English) phrases, already as Moses' tokenizer.perl writes them (escaped apostrophes and quotes)
SUBJECTS = [("der mann", "the man"), ("die frau", "the woman"), ("das kind", "the child"), ("wir", "we"),
            ("meine schwester", "my sister")]
VERBS = [("sieht", "sees"), ("kauft", "buys"), ("findet", "finds"), ("schreibt", "writes")]
OBJECTS = [("ein buch", "a book"), ("den computer", "the computer"), ("eine e-mail", "an e-mail"),
           ("das fahrrad", "the bicycle"), ("1990 bilder", "1990 pictures")]
EXTRAS = [("", ""), ("&quot; heute &quot;", "&quot; today &quot;"), ("gestern", "yesterday"),
          (", es ist gut", ", it &apos;s good")]
SIZES = {"train": 300, "valid": 12, "test": 12}


def fake_bpe(line: str) -> str:
    """A subword-nmt-like split: words longer than four characters in three-character pieces, "@@ " between."""
    out = []
    for word in line.split():
        pieces = [word[i:i + 3] for i in range(0, len(word), 3)] if len(word) > 4 else [word]
        out.append("@@ ".join(pieces))
    return " ".join(out)


def write_fairseq_iwslt(folder: Path, seed: int = 0) -> dict[str, dict[str, list[str]]]:
    """The corpus in prepare-iwslt14.sh's layout, BPE-split; returns the words (what reading must give back)."""
    rng, words = random.Random(seed), {}
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in SIZES.items():
        pairs = []
        for _ in range(n):
            parts = [rng.choice(group) for group in (SUBJECTS, VERBS, OBJECTS, EXTRAS)]
            mark = rng.choice([".", "?", "!"])
            pairs.append(tuple(" ".join([*(p[side] for p in parts if p[side]), mark]) for side in (0, 1)))
        words[split] = {"de": [p[0] for p in pairs], "en": [p[1] for p in pairs]}
        for lang, lines in words[split].items():
            (folder / f"{split}.{lang}").write_text("".join(fake_bpe(x) + "\n" for x in lines), encoding="utf-8")
    assert "@@ " in (folder / "train.en").read_text()  # the files really are BPE-split
    return words


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("iwslt")
    return root, write_fairseq_iwslt(root / "iwslt14.tokenized.de-en")


def test_remove_bpe_by_hand():
    assert remove_bpe("lau@@ fen gut@@", "@@ ") == "laufen gut"  # a final "@@" (no space after it) goes too
    assert remove_bpe("der mann sieht", "@@ ") == "der mann sieht"
    assert remove_bpe("e@@mail", "@@ ") == "e@@mail"  # a marker without its space is no continuation
    assert remove_bpe(fake_bpe("meine schwester schreibt ."), "@@ ") == "meine schwester schreibt ."
    for bad in ("@@", " ", ""):
        with pytest.raises(SeqmixError, match="remove_bpe"):
            LocalParallelSource("/nowhere", "de", "en", remove_bpe=bad)


def test_source_reads_the_words_and_keys_caches_apart(corpus):
    root, words = corpus
    folder = root / "iwslt14.tokenized.de-en"
    plain = LocalParallelSource(str(folder), "de", "en", remove_bpe="@@ ")
    for split in SIZES:
        read = plain.read(split)
        assert (read.src, read.tgt) == (words[split]["de"], words[split]["en"])
    as_bpe = LocalParallelSource(str(folder), "de", "en")
    assert any("@@" in line for line in as_bpe.read("train").tgt)
    assert as_bpe.fingerprint("train") != plain.fingerprint("train")  # a store of BPE'd text is never reused


def datamodule(folder: Path, cache: Path, marker: str | None) -> TranslationDataModule:
    source = LocalParallelSource(str(folder), "de", "en", remove_bpe=marker)
    dm = TranslationDataModule(source, "de", "en", {"train": "train", "valid": "valid", "test": "test"},
                               {"vocab_size": 300, "lowercase": True, "min_frequency": 2}, cache_dir=str(cache))
    dm.setup("fit")
    return dm


def pieces(tokenizer) -> list[str]:
    return [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]


def test_tokenizer_learns_words_and_decodes_to_the_references(corpus, tmp_path):
    root, words = corpus
    folder = root / "iwslt14.tokenized.de-en"
    dm = datamodule(folder, tmp_path, "@@ ")
    assert dm.tokenizer.vocab_size > 100 and not [p for p in pieces(dm.tokenizer) if "@" in p]
    # without remove_bpe the same files teach seqmix's BPE the markers (BPE on BPE): what the option prevents
    assert [p for p in pieces(datamodule(folder, tmp_path, None).tokenizer) if "@" in p]
    for split in ("valid", "test"):
        refs = dm.references(split)
        assert sorted(refs) == sorted(words[split]["en"])  # BPE-free, tokenized, lowercased lines
        # decoding gives the references' tokenized form back (&apos; s, &quot;, 1990, e-mail, " ." intact)
        assert [dm.tokenizer.decode(dm.tokenizer.encode(r)) for r in refs] == refs


TINY_MODEL = ["model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1", "model.encoder.ffn_dim=32",
              "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
              "model.decoder.cross_attention_heads=2"]


def test_shipped_task_trains_and_scores_without_bpe_markers(corpus, tmp_path, monkeypatch):
    """iwslt14_deen as shipped, on the fabricated fairseq files: a few updates, validation and test; a spy on both
    scorers fails the test if a "@@" reaches them."""
    root, words = corpus
    cfg = run_config(["task=iwslt14_deen", f"paths.data_dir={root}", f"task.data.cache_dir={tmp_path}",
                      "task.vocab_size=300", "task.data.max_tokens=400", "task.generation.beam_size=2", *TINY_MODEL])
    scored = []

    def spy(real):
        def scorer(hypotheses, references, *args, **kwargs):
            scored.append((real.__name__, list(hypotheses), list(references)))
            return real(hypotheses, references, *args, **kwargs)
        return scorer

    monkeypatch.setattr(translation, "corpus_bleu", spy(translation.corpus_bleu))
    monkeypatch.setattr(translation, "paper_bleu", spy(translation.paper_bleu))
    dm = instantiate(cfg.task.data, _convert_="all")
    dm.setup("fit")
    task = build_task(cfg, dm.tokenizer)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=str(tmp_path))
    trainer.fit(task, datamodule=dm)
    metrics = dict(trainer.callback_metrics)
    trainer.test(task, datamodule=dm, verbose=False)
    assert [name for name, _, _ in scored] == ["corpus_bleu", "paper_bleu"] * 2  # validation, then test
    for _, hyps, refs in scored:
        assert not [t for t in hyps + refs if "@@" in t]
    assert sorted(scored[0][2]) == sorted(words["valid"]["en"]) and sorted(scored[2][2]) == sorted(words["test"]["en"])
    # IWSLT's sacreBLEU (tokenize none, lowercase) and its paper BLEU (tokenized as read, lowercase) are one number
    assert float(metrics["val/bleu_paper"]) == pytest.approx(float(metrics["val/bleu"]))


def test_shipped_iwslt_config_wires_the_fairseq_reading():
    for overrides in (["task=iwslt14_deen"], ["experiment=wu2019_iwslt14_deen"]):
        cfg = run_config(overrides)
        assert cfg.task.data.source.remove_bpe == "@@ "
        assert instantiate(cfg.task.data.source).remove_bpe == "@@ "
        assert cfg.task.data.tokenizer.lowercase is True
        options = bleu_options(cfg)
        assert (options.tokenize, options.lowercase, options.pretokenized) == ("none", True, True)
        assert options.paper == ("tokenized_lowercase",)


@pytest.mark.slow
def test_train_and_generate_print_the_papers_bleu_beside_sacrebleu(corpus, tmp_path):
    """The commands: train.py logs val/bleu_paper and prints the paper line at test; generate.py reads the test
    split through the checkpoint's source (BPE removed) and prints the task's paper BLEU, or paper_bleu='s."""
    root, _ = corpus
    train = run("train.py", ["task=iwslt14_deen", f"paths.data_dir={root}", f"task.data.cache_dir={tmp_path / 'c'}",
                             "task.vocab_size=300", "task.data.max_tokens=400", "task.generation.beam_size=2",
                             "logger=csv", "~callbacks.progress_bar", "trainer.max_epochs=1",
                             "trainer.limit_train_batches=2", *TINY_MODEL], tmp_path / "t")
    assert train.returncode == 0, describe(train)
    assert "paper BLEU: BLEU (tokenized as read, lowercase; nrefs:1|case:lc|eff:no|tok:none|" in train.stdout
    logged = next((tmp_path / "t").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert {"val/bleu", "val/bleu_paper"} <= set(logged)
    ckpt = next(p for p in (tmp_path / "t").rglob("best.ckpt"))
    gen = run("generate.py", [f"ckpt_path={ckpt}", "split=test", "beam_size=2",
                              "paper_bleu=[tokenized_lowercase,compound_split]"], tmp_path / "g")
    assert gen.returncode == 0, describe(gen)
    lines = gen.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("sacreBLEU: nrefs:1|case:lc|eff:no|tok:none|"))
    assert lines[at + 1].startswith("paper BLEU: BLEU (tokenized as read, lowercase; ")
    assert lines[at + 2].startswith("paper BLEU: BLEU (tokenized as read, compound-split; ")
    hyps = Path(next(x for x in lines if x.startswith("hypotheses: ")).split(": ", 1)[1]).read_text()
    assert "@@" not in hyps and len(hyps.splitlines()) == SIZES["test"]
