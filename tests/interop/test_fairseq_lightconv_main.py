"""lightconv checkpoints saved by fairseq's main branch (after v0.12.2, "make lightconv scriptable"): the encoder
layers' norms are ``layer_norm1``/``layer_norm2`` instead of ``layer_norms.0/1``, the output is an nn.Linear
``decoder.output_projection.weight`` instead of the ``decoder.embed_out`` parameter (and, tied, is saved under its own
name too), and the scripted DynamicConv saves a (1, 1, C) ``conv_bias`` it never adds. The renames are written here
from fairseq main's ``lightconv.py`` / ``dynamic_convolution.py``, independently of seqmix's importer, and applied to
an export of seqmix's own (v0.12 names): the renamed checkpoint imports to the same model; mixed or unknown names are
refused with one line."""

from __future__ import annotations

import pytest
import torch

from seqmix.config.build import load_task
from seqmix.errors import SeqmixError
from seqmix.interop.fairseq import export_checkpoint, import_checkpoint
from tests.interop.test_fairseq_roundtrip import TINY, saved_seqmix_checkpoint

NORMS = {"layer_norms.0": "layer_norm1", "layer_norms.1": "layer_norm2"}


def main_branch_names(state: dict, tied: bool) -> dict:
    """A v0.12.2 lightconv state dict as fairseq main saves the same model."""
    out = {}
    for key, value in state.items():
        for old, new in NORMS.items():
            if key.startswith("encoder.layers.") and f".{old}." in key:
                key = key.replace(f".{old}.", f".{new}.")
        if key == "decoder.embed_out":
            key = "decoder.output_projection.weight"
        out[key] = value
        if key.endswith(".conv.weight_linear.weight"):  # DynamicConv_scripatable: conv_bias always there, unused
            channels = value.shape[1]
            out[key.replace("weight_linear.weight", "conv_bias")] = torch.full((1, 1, channels), float("nan"))
    if tied:
        out["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    return out


def exported_pair(tmp_path, model: str, tied: bool):
    overrides = [f"model={model}", *TINY, f"model.share_decoder_input_output_embed={str(tied).lower()}",
                 f"model.share_all_embeddings={str(tied).lower()}"]
    original = saved_seqmix_checkpoint(tmp_path, overrides)
    export_checkpoint(original, tmp_path / "fairseq")
    return original, tmp_path / "fairseq"


def logits(task) -> torch.Tensor:
    model = task.model.double().eval()
    g = torch.Generator().manual_seed(5)
    src = torch.randint(4, task.tokenizer.source_vocab_size, (2, 7), generator=g)
    src[1, 5:] = 1
    prev = torch.randint(4, task.tokenizer.target_vocab_size, (2, 6), generator=g)
    prev[:, 0] = 2
    with torch.no_grad():
        return model(src, prev)


@pytest.mark.parametrize("model,tied", [("dynamicconv_small", True), ("lightconv_small", False),
                                        ("dynamicconv_small", False)])
def test_a_checkpoint_in_fairseq_mains_names_imports_to_the_same_model(tmp_path, model, tied):
    original, folder = exported_pair(tmp_path, model, tied)
    container = torch.load(folder / "checkpoint.pt", weights_only=False)
    old = container["model"]
    assert "encoder.layers.0.layer_norms.0.weight" in old and ("decoder.embed_out" in old) != tied
    container["model"] = main_branch_names(old, tied)
    assert "encoder.layers.0.layer_norm2.bias" in container["model"]
    torch.save(container, folder / "main.pt")
    imported = import_checkpoint(folder / "main.pt", folder, tmp_path / "main.ckpt")
    theirs, ours = load_task(original)[0].model.state_dict(), imported.model.state_dict()
    assert sorted(theirs) == sorted(ours) and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    assert torch.equal(logits(load_task(original)[0]), logits(load_task(tmp_path / "main.ckpt")[0]))


@pytest.mark.parametrize("damage,needle", [
    ("mixed", "mixes fairseq v0.12 names"),
    ("unknown", "unexpected encoder.layers.0.layer_norm3.weight"),
    ("untied_copy", "differs from its embed_tokens"),
])
def test_mixed_or_unknown_names_are_refused_in_one_line(tmp_path, damage, needle):
    _, folder = exported_pair(tmp_path, "dynamicconv_small", tied=True)
    container = torch.load(folder / "checkpoint.pt", weights_only=False)
    state = main_branch_names(container["model"], tied=True)
    if damage == "mixed":  # one layer left in v0.12's names
        for part in ("weight", "bias"):
            state[f"encoder.layers.1.layer_norms.0.{part}"] = state.pop(f"encoder.layers.1.layer_norm1.{part}")
    elif damage == "unknown":
        state["encoder.layers.0.layer_norm3.weight"] = state["encoder.layers.0.layer_norm1.weight"]
    else:
        state["decoder.output_projection.weight"] = state["decoder.output_projection.weight"] + 1
    container["model"] = state
    torch.save(container, folder / "bad.pt")
    with pytest.raises(SeqmixError, match=needle) as err:
        import_checkpoint(folder / "bad.pt", folder, tmp_path / "bad.ckpt")
    assert "\n" not in str(err.value) and not (tmp_path / "bad.ckpt").exists()
