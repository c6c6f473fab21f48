"""NonAutoregressiveTranslationTask loss and settings; the distilled training split."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from seqmix.data.distilled import DistilledTrainSource, write_distilled
from seqmix.errors import SeqmixError
from seqmix.generation.options import NATOptions
from seqmix.mixers.self_attention import SelfAttention
from seqmix.models.disco_attention import DisCoAttention
from seqmix.models.nat import CMLMTransformer, DisCoTransformer
from seqmix.tasks.nat_translation import NonAutoregressiveTranslationTask

PAD, EOS, V = 1, 2, 30
TOKENIZER = SimpleNamespace(bos=0, pad=PAD, eos=EOS, unk=3)


def task(cls=DisCoTransformer, mixer=DisCoAttention, **options):
    torch.manual_seed(0)
    settings = dict(layers=1, ffn_dim=16, activation="gelu")
    model = cls(V, V, PAD, embed_dim=8, dropout=0.0, max_source_positions=16, max_target_positions=16,
                encoder={**settings, "mixer": lambda **kw: SelfAttention(num_heads=2, **kw)},
                decoder={**settings, "cross_attention_heads": 2, "mixer": lambda **kw: mixer(num_heads=2, **kw)})
    return NonAutoregressiveTranslationTask(model.double(), TOKENIZER, optimizer=None, **options)


@pytest.mark.parametrize("cls,mixer", [(DisCoTransformer, DisCoAttention), (CMLMTransformer, SelfAttention)])
def test_loss_is_smoothed_nll_of_scored_tokens_plus_summed_length_nll(cls, mixer):
    t = task(cls, mixer, label_smoothing=0.1)
    batch = {"src_tokens": torch.tensor([[5, 6, 7, EOS], [8, 9, EOS, PAD]]),
             "target": torch.tensor([[10, 11, 12, 13, EOS], [14, 15, EOS, PAD, PAD]])}
    torch.manual_seed(7)
    loss, nll, ntokens = t.compute_loss(batch)
    torch.manual_seed(7)  # the same random contexts
    observed, scored = t.model.training_context(batch["target"])
    logits, length_logits = t.model(batch["src_tokens"], batch["target"], observed)
    lprobs = F.log_softmax(logits[scored], dim=-1)
    gold = batch["target"][scored]
    want_nll = -lprobs.gather(1, gold[:, None]).sum()
    eps = 0.1 / (lprobs.size(-1) - 1)
    want = (1 - 0.1 - eps) * want_nll - eps * lprobs.sum() + F.cross_entropy(length_logits, torch.tensor([5, 3]),
                                                                             reduction="sum")
    assert ntokens == int(scored.sum()) and (ntokens == 6 if cls is DisCoTransformer else 2 <= ntokens <= 6)
    torch.testing.assert_close(nll.double(), want_nll, rtol=1e-5, atol=1e-5)  # the loss works in fp32
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-5)


def test_decoding_settings_are_checked():
    t = task()
    assert t.nat == NATOptions("easy_first", 5, 10)  # DisCo decodes with parallel easy-first by default
    d = t.nat_decoder(beam_size=4, max_iterations=3)  # beam_size (generate.py's default) is ignored
    assert d.options == NATOptions("easy_first", 5, 3)
    assert t.nat_options(max_iterations=None) == t.nat  # None keeps the task's setting
    with pytest.raises(SeqmixError, match="do not apply"):
        t.nat_decoder(len_penalty=1.0)
    with pytest.raises(SeqmixError, match="length_beam=0"):
        t.nat_decoder(length_beam=0)
    cmlm = task(CMLMTransformer, SelfAttention)
    assert cmlm.nat.algorithm == "mask_predict"
    with pytest.raises(SeqmixError, match="model=disco"):
        cmlm.nat_decoder(algorithm="easy_first")
    with pytest.raises(SeqmixError, match="model=disco"):
        task(CMLMTransformer, SelfAttention, nat=NATOptions("easy_first"))


def test_evaluate_texts_reports_the_passes_of_the_decoder_it_used():
    """generate.py's path: the iterations line names the settings actually decoded with, not the task's."""
    t = task(CMLMTransformer, SelfAttention).eval()
    t.tokenizer = SimpleNamespace(**vars(TOKENIZER), encode_batch=lambda texts: [[4 + len(x)] for x in texts],
                                  decode=lambda ids: " ".join(map(str, ids.tolist())), normalize_reference=str)
    hyps, report = t.evaluate_texts(["a", "bb", "ccc"], [["5"], ["6"], ["7"]], max_tokens=50, beam_size=5,
                                    max_iterations=2)
    assert len(hyps) == 3 and report.metrics["iterations"] == 2.0  # mask-predict always runs its passes
    assert "mask_predict (max iterations 2, length beam 5): average iterations 2.00" in report.details
    assert report.headline.endswith(", average iterations: 2.00")


def test_distilled_source_replaces_only_the_training_split(tmp_path):
    real = tmp_path / "real"
    write_distilled(real, "train", "en", "de", ["a b", "c"], ["A B", "C"])
    write_distilled(real, "val", "en", "de", ["v"], ["V"])
    files = write_distilled(tmp_path / "kd", "train", "en", "de", ["a b", "c"], ["teacher 1", "teacher 2"])
    assert [f.read_text() for f in files] == ["a b\nc\n", "teacher 1\nteacher 2\n"]
    args = dict(base_target="seqmix.data.LocalParallelSource", src_lang="en", tgt_lang="de", path=str(real))
    source = DistilledTrainSource(distilled_path=str(tmp_path / "kd"), **args)
    assert source.read("train").tgt == ["teacher 1", "teacher 2"] and source.read("val").tgt == ["V"]
    assert source.fingerprint("train") != DistilledTrainSource(**args).fingerprint("train")
    assert DistilledTrainSource(distilled_path=None, **args).read("train").tgt == ["A B", "C"]
    with pytest.raises(SeqmixError, match="distill_dir="):
        DistilledTrainSource(distilled_path=str(tmp_path / "missing"), **args)
    with pytest.raises(SeqmixError, match="nothing written"):
        write_distilled(tmp_path / "bad", "train", "en", "de", ["a"], [])
