"""Translation models from two vocabulary sizes (fairseq's separate dictionaries) or one joint size as before; the
decoder start symbol as a model setting that old run folders predate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hydra.utils import instantiate

from seqmix.errors import SeqmixError
from seqmix.models import EncoderDecoder
from seqmix.training.checkpoints import check_fits, upgraded_config

MODEL = {"_target_": "seqmix.models.EncoderDecoder", "_convert_": "all", "name": "t", "embed_dim": 16,
         "share_decoder_input_output_embed": False,
         "encoder": {"layers": 1, "heads": 2, "ffn_dim": 32,
                     "mixer": {"_target_": "seqmix.mixers.SelfAttention", "_partial_": True}},
         "decoder": {"layers": 1, "heads": 2, "ffn_dim": 32,
                     "mixer": {"_target_": "seqmix.mixers.SelfAttention", "_partial_": True}}}


@pytest.mark.parametrize("source,sizes", [(None, (40, 40)), (30, (30, 40))])
def test_translation_models_take_a_source_and_a_target_vocabulary(source, sizes):
    model = instantiate(MODEL, src_vocab_size=source or 40, tgt_vocab_size=40, padding_idx=1)
    assert (model.encoder.embed_tokens.num_embeddings, model.output_projection.out_features) == sizes


def test_decoder_start_is_checked():
    with pytest.raises(SeqmixError, match="decoder_start must be one of"):
        EncoderDecoder(30, 30, 1, 16, MODEL["encoder"], MODEL["decoder"], decoder_start="pad")


def test_a_checkpoint_written_before_decoder_start_existed_reads_as_bos():
    old = {"model": {"_target_": "seqmix.models.EncoderDecoder", "name": "t"}}
    assert upgraded_config(old)["model"]["decoder_start"] == "bos"
    eos_run = {"model": {"_target_": "seqmix.models.EncoderDecoder", "name": "t", "decoder_start": "eos"}}
    assert upgraded_config(eos_run) == eos_run
    nat = {"model": {"_target_": "seqmix.models.nat.CMLMTransformer", "name": "c"}}  # takes no such setting
    assert upgraded_config(nat) == nat


def test_a_checkpoint_naming_moved_classes_reads_with_their_new_names():
    old = {"model": {"_target_": "seqmix.models.nat.DisCoTransformer",
                     "decoder": {"mixer": {"_target_": "seqmix.mixers.disco.DisCoAttention"}}},
           "callbacks": {"last": {"_target_": "seqmix.callbacks.LastCheckpoint"}}}
    new = upgraded_config(old)
    assert new["model"]["decoder"]["mixer"]["_target_"] == "seqmix.models.disco_attention.DisCoAttention"
    assert new["callbacks"]["last"]["_target_"] == "seqmix.training.checkpoints.LastCheckpoint"


@pytest.mark.parametrize("trained,ours,refused", [
    ({}, "bos", False),  # a checkpoint written before the setting existed was trained from bos
    ({}, "eos", True),
    ({"decoder_start": "eos"}, "eos", False),
    ({"decoder_start": "eos"}, "bos", True),
])
def test_a_checkpoint_continues_only_with_the_start_symbol_it_was_trained_with(trained, ours, refused):
    model = instantiate({**MODEL, "decoder_start": ours}, src_vocab_size=40, tgt_vocab_size=40, padding_idx=1)
    # what check_fits reads of a task: its model, tokenizer, config and state dict
    task = SimpleNamespace(model=model, tokenizer=SimpleNamespace(to_json=lambda: "{}"), run_config={},
                           state_dict=model.state_dict)
    # as load_checkpoint hands it over
    config = upgraded_config({"model": {"_target_": "seqmix.models.EncoderDecoder", "name": "t", **trained}})
    ckpt = {"seqmix": {"config": config, "tokenizer": "{}"},
            "state_dict": model.state_dict()}
    if refused:
        with pytest.raises(SeqmixError, match=f"pass model.decoder_start={trained.get('decoder_start', 'bos')}"):
            check_fits(task, ckpt, "ckpt_path=x")
    else:
        check_fits(task, ckpt, "ckpt_path=x")
