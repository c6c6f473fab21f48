"""fairseq 0.12's transformer encoder layers save copies of their weights for the "BetterTransformer" fast path
(``encoder.layers.N.in_proj_weight``, ``fc1_weight``, ...: zeros in a freshly built model, rebuilt from the regular
weights on every load); found by tools/fairseq_crosscheck.py against real fairseq 0.12.2, whose checkpoints seqmix
refused. They are dropped on import, and never mistaken for a ≤0.8 packed ``self_attn.in_proj_weight``."""

from __future__ import annotations

import torch

from seqmix.interop.fairseq import import_checkpoint
from tests.interop.fairseq_builders import cfg_container, transformer_state, write_dicts

SETTINGS = {"arch": "transformer", "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "encoder_layers": 2,
            "encoder_attention_heads": 2, "decoder_layers": 2, "decoder_attention_heads": 2, "dropout": 0.0,
            "share_all_embeddings": True, "source_lang": "de", "target_lang": "en"}


def test_fast_path_copies_of_fairseq_012_encoder_layers_are_ignored(tmp_path):
    write_dicts(tmp_path, (30, 30))
    state = transformer_state()
    with_copies = dict(state)
    for i in range(2):
        shapes = {"in_proj_weight": (48, 16), "in_proj_bias": (48,), "out_proj_weight": (16, 16),
                  "out_proj_bias": (16,), "fc1_weight": (32, 16), "fc1_bias": (32,), "fc2_weight": (16, 32),
                  "fc2_bias": (16,)}
        with_copies.update({f"encoder.layers.{i}.{name}": torch.zeros(shape) for name, shape in shapes.items()})
    tasks = []
    for name, sd in (("plain", state), ("copies", with_copies)):
        torch.save(cfg_container(SETTINGS, sd), tmp_path / f"{name}.pt")
        tasks.append(import_checkpoint(tmp_path / f"{name}.pt", tmp_path, tmp_path / f"{name}.ckpt", moses=False))
    ours, theirs = (t.model.state_dict() for t in tasks)
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
