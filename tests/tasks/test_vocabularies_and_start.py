"""Translation models from two vocabulary sizes (fairseq's separate dictionaries) or one joint size as before; the
decoder start symbol as a model setting that old run folders predate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from seqmix.checkpoint import check_fits
from seqmix.cli.train import _with_added_settings
from seqmix.errors import SeqmixError
from seqmix.models import EncoderDecoder
from seqmix.tasks.translation import TranslationTask

MODEL = {"_target_": "seqmix.models.EncoderDecoder", "_convert_": "all", "name": "t", "embed_dim": 16,
         "share_decoder_input_output_embed": False,
         "encoder": {"layers": 1, "heads": 2, "ffn_dim": 32,
                     "mixer": {"_target_": "seqmix.mixers.SelfAttention", "_partial_": True}},
         "decoder": {"layers": 1, "heads": 2, "ffn_dim": 32,
                     "mixer": {"_target_": "seqmix.mixers.SelfAttention", "_partial_": True}}}


@pytest.mark.parametrize("source,sizes", [(None, (40, 40)), (30, (30, 40))])
def test_translation_models_take_a_source_and_a_target_vocabulary(source, sizes):
    model = TranslationTask.build_model(OmegaConf.create({"model": MODEL}), 40, 1, source_vocab_size=source)
    assert (model.encoder.embed_tokens.num_embeddings, model.output_projection.out_features) == sizes


def test_decoder_start_is_checked():
    with pytest.raises(SeqmixError, match="decoder_start must be one of"):
        EncoderDecoder(30, 30, 1, 16, MODEL["encoder"], MODEL["decoder"], decoder_start="pad")


def test_a_run_written_before_decoder_start_existed_still_matches():
    ours = {"model": {"name": "t", "decoder_start": "bos"}}
    assert _with_added_settings({"model": {"name": "t"}}, ours) == ours
    eos_run = {"model": {"name": "t", "decoder_start": "eos"}}
    assert _with_added_settings(eos_run, ours) == eos_run


@pytest.mark.parametrize("trained,ours,refused", [
    ({}, "bos", False),  # a checkpoint written before the setting existed was trained from bos
    ({}, "eos", True),
    ({"decoder_start": "eos"}, "eos", False),
    ({"decoder_start": "eos"}, "bos", True),
])
def test_a_checkpoint_continues_only_with_the_start_symbol_it_was_trained_with(trained, ours, refused):
    model = TranslationTask.build_model(OmegaConf.create({"model": {**MODEL, "decoder_start": ours}}), 40, 1)
    # what check_fits reads of a task: its model, tokenizer, config and state dict
    task = SimpleNamespace(model=model, tokenizer=SimpleNamespace(to_json=lambda: "{}"), run_config={},
                           state_dict=model.state_dict)
    ckpt = {"seqmix": {"config": {"model": {"name": "t", **trained}}, "tokenizer": "{}"},
            "state_dict": model.state_dict()}
    if refused:
        with pytest.raises(SeqmixError, match=f"pass model.decoder_start={trained.get('decoder_start', 'bos')}"):
            check_fits(task, ckpt, "ckpt_path=x")
    else:
        check_fits(task, ckpt, "ckpt_path=x")
