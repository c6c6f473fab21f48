"""fairseq checkpoints in and out (issue 19): hand-built fairseq checkpoints of every family import into seqmix models
whose tensors are the source tensors after the documented reshapes, export back to the same state dict, decode step
by step as in one pass, start decoding from eos; what does not map is refused with one SeqmixError."""

from __future__ import annotations

import math
from argparse import Namespace

import pytest
import torch

from seqmix.errors import SeqmixError
from seqmix.interop.fairseq import export_checkpoint, import_checkpoint, read_fairseq
from tests.interop.fairseq_builders import (
    args_container,
    cfg_container,
    fconv_state,
    lightconv_state,
    packed,
    talkconv_state,
    transformer_state,
    write_dicts,
)

LANGS = {"source_lang": "de", "target_lang": "en"}
TRANSFORMER = {"arch": "transformer", "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "encoder_layers": 2,
               "encoder_attention_heads": 2, "decoder_layers": 2, "decoder_attention_heads": 2, "dropout": 0.0,
               "share_all_embeddings": True, "max_source_positions": 64, "max_target_positions": 64, **LANGS}


def save(tmp_path, container: dict, vocab=(30, 30), name="checkpoint.pt"):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    write_dicts(data, vocab)
    path = tmp_path / name
    torch.save(container, path)
    return path, data


def imported(tmp_path, container: dict, vocab=(30, 30)):
    path, data = save(tmp_path, container, vocab)
    task = import_checkpoint(path, data, tmp_path / "imported.ckpt", moses=False)
    return task, tmp_path / "imported.ckpt"


def seqmix_state(task) -> dict:
    return task.model.state_dict()


def assert_same_state(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        assert ours[k].dtype == torch.float32, k
        assert ours[k].shape == theirs[k].shape, k
        assert torch.equal(ours[k], theirs[k].float()), k


def exported(tmp_path, ckpt) -> dict:
    out = tmp_path / "exported"
    export_checkpoint(ckpt, out)
    return torch.load(out / "checkpoint.pt", weights_only=False)


def step_equals_full(task, start: int, vocab_src: int = 30, vocab_tgt: int = 30) -> None:
    """The decoder fed one token at a time (incremental state) gives the full pass's outputs, in float64."""
    model = task.model.double().eval()
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, vocab_src, (2, 7), generator=g)
    src[1, 5:] = 1  # a padded row
    src[0, -1] = src[1, 4] = 2
    prev = torch.randint(4, vocab_tgt, (2, 6), generator=g)
    prev[:, 0] = start
    with torch.no_grad():
        enc = model.encode(src)
        full = model.decode(prev, enc)
        state = model.init_decoder_state(enc)
        steps = torch.cat([model.decode(prev[:, t: t + 1], enc, state) for t in range(prev.size(1))], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)
    task.model.float()


# --- transformer --------------------------------------------------------------------------------------------
def test_transformer_new_format_imports_exactly_and_exports_back(tmp_path):
    state = transformer_state()
    task, ckpt = imported(tmp_path, cfg_container(TRANSFORMER, state))
    ours = seqmix_state(task)
    for i in range(2):
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            assert torch.equal(ours[f"encoder.layers.{i}.mixer.attn.{p}.weight"],
                               state[f"encoder.layers.{i}.self_attn.{p}.weight"])
            assert torch.equal(ours[f"decoder.layers.{i}.cross_attn.{p}.bias"],
                               state[f"decoder.layers.{i}.encoder_attn.{p}.bias"])
        assert torch.equal(ours[f"decoder.layers.{i}.cross_residual.norm.weight"],
                           state[f"decoder.layers.{i}.encoder_attn_layer_norm.weight"])
        assert torch.equal(ours[f"encoder.layers.{i}.ffn_residual.norm.bias"],
                           state[f"encoder.layers.{i}.final_layer_norm.bias"])
    assert torch.equal(ours["decoder.embed_tokens.weight"], state["decoder.output_projection.weight"])
    assert task.model.decoder_start == "eos" and task.model.encoder.embed_positions.kind == "sinusoidal"
    assert_same_state(exported(tmp_path, ckpt)["model"], state)
    step_equals_full(task, start=2)


def test_old_packed_transformer_with_defaults_imports_as_its_new_format(tmp_path):
    """fairseq ≤0.8: args Namespace naming only the arch (transformer_tiny: 64 wide, 2+2 layers), packed in_proj,
    layer_norms.N, embed_out, learned positions, pre-norm; exported as the new-format equivalent."""
    new = transformer_state(e=64, ffn=64, share_all=False, share_output=False, learned=True, pre=True, max_positions=32)
    settings = {"arch": "transformer_tiny", "encoder_learned_pos": True, "decoder_learned_pos": True,
                "encoder_normalize_before": True, "decoder_normalize_before": True, "max_source_positions": 32,
                "max_target_positions": 32, "dropout": 0.0, **LANGS}
    old = packed(new, shared_output=False)
    assert "encoder.layers.0.self_attn.in_proj_weight" in old and "decoder.embed_out" in old
    task, ckpt = imported(tmp_path, args_container(settings, old))
    ours = seqmix_state(task)
    assert torch.equal(ours["encoder.layers.1.mixer.attn.k_proj.weight"],
                       new["encoder.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(ours["output_projection.weight"], old["decoder.embed_out"])
    assert torch.equal(ours["decoder.embed_positions.weights.weight"], new["decoder.embed_positions.weight"])
    assert torch.equal(ours["decoder.layer_norm.weight"], new["decoder.layer_norm.weight"])
    assert_same_state(exported(tmp_path, ckpt)["model"], new)
    step_equals_full(task, start=2)


def test_fp16_tensors_import_as_fp32(tmp_path):
    state = {k: v.half() for k, v in transformer_state().items()}
    task, _ = imported(tmp_path, cfg_container(TRANSFORMER, state))
    ours = seqmix_state(task)
    assert all(v.dtype == torch.float32 for v in ours.values())
    assert torch.equal(ours["encoder.layers.0.ffn.fc1.weight"], state["encoder.layers.0.fc1.weight"].float())


# --- lightconv / dynamicconv --------------------------------------------------------------------------------
LIGHTCONV = {"arch": "lightconv", "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "encoder_layers": 2,
             "encoder_attention_heads": 2, "decoder_layers": 2, "decoder_attention_heads": 2, "dropout": 0.0,
             "encoder_kernel_size_list": [3, 5], "decoder_kernel_size_list": [3, 5], "max_source_positions": 64,
             "max_target_positions": 64, **LANGS}


def test_lightweight_glu_lightconv_imports_and_exports_back(tmp_path):
    state = lightconv_state(conv_type="lightweight", glu=True)
    settings = {**LIGHTCONV, "encoder_conv_type": "lightweight", "decoder_conv_type": "lightweight",
                "share_all_embeddings": True}
    task, ckpt = imported(tmp_path, args_container(settings, state))
    ours = seqmix_state(task)
    assert torch.equal(ours["encoder.layers.1.mixer.conv.weight"], state["encoder.layers.1.conv.weight"])
    assert torch.equal(ours["encoder.layers.0.mixer_residual.norm.weight"],
                       state["encoder.layers.0.layer_norms.0.weight"])
    assert torch.equal(ours["encoder.layers.0.ffn_residual.norm.bias"], state["encoder.layers.0.layer_norms.1.bias"])
    assert torch.equal(ours["decoder.layers.1.mixer_residual.norm.weight"],
                       state["decoder.layers.1.conv_layer_norm.weight"])
    assert task.model.decoder.layers[1].mixer.kernel_size == 5 and task.model.decoder.layers[0].mixer.glu
    assert_same_state(exported(tmp_path, ckpt)["model"], state)
    step_equals_full(task, start=2)


def test_cuda_layer_weights_and_packed_attention_import(tmp_path):
    """Older lightconv checkpoints: (H, K) lightweight weights of the CUDA layer, packed encoder_attn."""
    new = lightconv_state(conv_type="lightweight", glu=True)
    old = packed(new, shared_output=True, rename_norms=False)
    old = {k: (v.squeeze(1) if k.endswith("conv.weight") else v) for k, v in old.items()}
    assert old["encoder.layers.0.conv.weight"].dim() == 2 and "decoder.layers.0.encoder_attn.in_proj_weight" in old
    settings = {**LIGHTCONV, "encoder_conv_type": "lightweight", "decoder_conv_type": "lightweight",
                "share_all_embeddings": True}
    task, ckpt = imported(tmp_path, args_container(settings, old))
    assert torch.equal(seqmix_state(task)["decoder.layers.0.mixer.conv.weight"], new["decoder.layers.0.conv.weight"])
    assert_same_state(exported(tmp_path, ckpt)["model"], new)


def test_dynamicconv_without_glu_with_separate_dictionaries(tmp_path):
    vocab = (30, 26)
    state = lightconv_state(conv_type="dynamic", glu=False, vocab=vocab, share_all=False, share_output=False)
    settings = {**LIGHTCONV, "encoder_glu": False, "decoder_glu": False}  # conv types: fairseq's default, dynamic
    task, ckpt = imported(tmp_path, cfg_container(settings, state, model_as="dictconfig"), vocab)
    ours = seqmix_state(task)
    assert ours["encoder.embed_tokens.weight"].shape == (30, 16)
    assert ours["decoder.embed_tokens.weight"].shape == (26, 16)
    assert torch.equal(ours["decoder.layers.1.mixer.conv.weight_linear.weight"],
                       state["decoder.layers.1.conv.weight_linear.weight"])
    assert torch.equal(ours["output_projection.weight"], state["decoder.embed_out"])
    assert type(task.model.encoder.layers[0].mixer).__name__ == "DynamicConv"
    assert not task.model.encoder.layers[0].mixer.glu
    assert (task.tokenizer.source_vocab_size, task.tokenizer.target_vocab_size) == vocab
    assert_same_state(exported(tmp_path, ckpt)["model"], state)
    step_equals_full(task, start=2, vocab_tgt=26)


# --- fconv --------------------------------------------------------------------------------------------------
FCONV = {"arch": "fconv", "encoder_embed_dim": 16, "encoder_layers": "[(16, 3), (24, 3), (24, 2, 2)]",
         "decoder_embed_dim": 16, "decoder_layers": "[(16, 3)] + [(24, 2)]", "decoder_out_embed_dim": 8,
         "decoder_attention": "[True, False]", "dropout": 0.0, "max_source_positions": 16,
         "max_target_positions": 16, **LANGS}


def test_fconv_weight_norm_and_positions_map_exactly(tmp_path):
    vocab = (30, 26)
    state = fconv_state(vocab=vocab)
    task, ckpt = imported(tmp_path, args_container(FCONV, state), vocab)
    ours = seqmix_state(task)
    conv = "decoder.blocks.1.conv.conv.parametrizations.weight."
    assert torch.equal(ours[conv + "original1"], state["decoder.convolutions.1.weight_v"].permute(2, 1, 0))
    assert torch.equal(ours[conv + "original0"], state["decoder.convolutions.1.weight_g"].reshape(-1, 1, 1))
    assert torch.equal(ours["encoder.blocks.2.projection.parametrizations.weight.original1"],
                       state["encoder.projections.2.weight_v"])
    assert "encoder.blocks.0.projection.bias" not in ours  # same width: no projection, as in fairseq
    assert torch.equal(ours["output_projection.parametrizations.weight.original0"], state["decoder.fc3.weight_g"])
    # position tables line up row for row: fairseq's 16 rows (first token at row 2) = seqmix's 14 + pad + 1
    assert torch.equal(ours["encoder.embed_positions.weights.weight"], state["encoder.embed_positions.weight"])
    assert task.model.max_source_positions == 14
    # the effective conv weight is fairseq's ConvTBC weight (K, in, out) as a Conv1d (out, in, K)
    v, g = state["encoder.convolutions.0.weight_v"], state["encoder.convolutions.0.weight_g"]
    tbc = g * v / v.norm(dim=(0, 1), keepdim=True)
    torch.testing.assert_close(task.model.encoder.blocks[0].conv.conv.weight, tbc.permute(2, 1, 0))
    with pytest.raises(SeqmixError, match="exceeds max positions 14"):  # fairseq's table has no row for a 15th token
        task.model.encode(torch.randint(4, 30, (1, 15)))
    assert_same_state(exported(tmp_path, ckpt)["model"], state)
    step_equals_full(task, start=2, vocab_tgt=26)


def test_fconv_with_tied_output(tmp_path):
    state = fconv_state(vocab=(30, 30), out_embed=16, share_output=True)
    settings = {**FCONV, "decoder_out_embed_dim": 16, "share_input_output_embed": True}
    task, ckpt = imported(tmp_path, args_container(settings, state))
    assert torch.equal(seqmix_state(task)["output_bias"], state["decoder.fc3.bias"])
    assert_same_state(exported(tmp_path, ckpt)["model"], state)


# --- the start symbol ---------------------------------------------------------------------------------------
def test_greedy_decoding_starts_from_eos(tmp_path):
    """A checkpoint whose first output token depends on the start symbol: the imported model's greedy decoding
    follows the eos-start computation (fairseq's), not the bos-start one."""
    task, _ = imported(tmp_path, cfg_container(TRANSFORMER, transformer_state(seed=5)))
    model = task.model
    g = torch.Generator().manual_seed(0)

    def first_token(src, start):
        with torch.no_grad():
            logits = model.decode(torch.tensor([[start]]), model.encode(src))[0, -1]
        logits[[0, 1, 2]] = -float("inf")  # pad, bos and (min length 1) eos cannot come first
        return int(logits.argmax())

    for _ in range(50):
        src = torch.cat([torch.randint(4, 30, (1, 5), generator=g), torch.tensor([[2]])], dim=1)
        eos_first, bos_first = first_token(src, 2), first_token(src, 0)
        if eos_first != bos_first:
            break
    assert eos_first != bos_first
    hyp = task.beam_search(beam_size=1).generate(model, src)[0][0]
    assert int(hyp.tokens[0]) == eos_first


def test_an_eos_start_model_trains_on_eos_started_decoder_inputs(tmp_path):
    task, _ = imported(tmp_path, cfg_container(TRANSFORMER, transformer_state()))
    batch = {"src_tokens": torch.tensor([[5, 6, 2], [7, 2, 1]]), "target": torch.tensor([[5, 6, 2], [7, 2, 1]]),
             "prev_output_tokens": torch.tensor([[0, 5, 6], [0, 7, 1]]), "ntokens": 5}
    assert task.decoder_inputs(batch).tolist() == [[2, 5, 6], [2, 7, 1]]
    seen = []
    decode_features = task.model.decode_features
    task.model.decode_features = lambda prev, enc, state=None: seen.append(prev.tolist()) or decode_features(prev, enc)
    task.compute_loss(batch)  # the loss the model trains on reads the eos-started inputs
    assert seen == [[[2, 5, 6], [2, 7, 1]]]
    assert batch["prev_output_tokens"][0, 0] == 0  # the batch itself is left alone


# --- refusals -----------------------------------------------------------------------------------------------
def _refused(tmp_path, container, needle, vocab=(30, 30)):
    path, data = save(tmp_path, container, vocab)
    with pytest.raises(SeqmixError, match=needle):
        import_checkpoint(path, data, tmp_path / "out.ckpt", moses=False)
    assert not (tmp_path / "out.ckpt").exists()


def test_an_unknown_architecture_is_refused(tmp_path):
    _refused(tmp_path, args_container({**TRANSFORMER, "arch": "bart_base"}, transformer_state()),
             "architecture 'bart_base' is not one seqmix imports")


def test_a_missing_tensor_is_refused(tmp_path):
    state = transformer_state()
    del state["encoder.layers.1.fc1.bias"]
    _refused(tmp_path, args_container(TRANSFORMER, state), "missing encoder.layers.1.fc1.bias")


def test_an_extra_tensor_is_refused(tmp_path):
    state = {**transformer_state(), "decoder.layers.0.self_attn.rotary.weight": torch.zeros(3)}
    _refused(tmp_path, args_container(TRANSFORMER, state), "unexpected decoder.layers.0.self_attn.rotary.weight")


def test_a_shape_mismatch_is_refused(tmp_path):
    state = transformer_state()
    state["decoder.layers.0.fc2.weight"] = torch.zeros(16, 31)
    _refused(tmp_path, args_container(TRANSFORMER, state), r"decoder.layers.0.fc2.weight: shape \(16, 31\)")


def test_untied_tables_of_a_shared_model_are_refused(tmp_path):
    state = transformer_state()
    state["decoder.embed_tokens.weight"] = state["decoder.embed_tokens.weight"] + 1
    _refused(tmp_path, args_container(TRANSFORMER, state), "decoder.embed_tokens.weight should be tied")


def test_a_setting_seqmix_cannot_express_is_refused(tmp_path):
    _refused(tmp_path, args_container({**TRANSFORMER, "layernorm_embedding": True}, transformer_state()),
             "layernorm_embedding")


def test_a_shared_embedding_model_with_two_different_dictionaries_is_refused(tmp_path):
    path, data = save(tmp_path, args_container(TRANSFORMER, transformer_state()))
    write_dicts(data, (30, 30), joined=False)
    with pytest.raises(SeqmixError, match=r"one joined dictionary, but dict.de.txt and dict.en.txt differ"):
        import_checkpoint(path, data, tmp_path / "imported.ckpt", moses=False)
    assert not (tmp_path / "imported.ckpt").exists()


def test_dictionaries_of_another_size_are_refused(tmp_path):
    _refused(tmp_path, args_container(TRANSFORMER, transformer_state()), r"dict.de.txt\) has 28 symbols", (28, 28))


def test_an_old_fconv_decoder_normalized_per_tap_imports_its_effective_weights(tmp_path):
    """Before decoder.version 2, fconv decoder convolutions were weight-normalized per kernel tap (weight_g (K, 1, 1));
    the effective weights survive the import (up to float32 rounding)."""
    vocab = (30, 26)
    state = fconv_state(vocab=vocab)
    del state["decoder.version"]
    effective = {}
    for i in range(2):
        g, v = state[f"decoder.convolutions.{i}.weight_g"], state[f"decoder.convolutions.{i}.weight_v"]
        effective[i] = g * v / v.norm(dim=(0, 1), keepdim=True)
        state[f"decoder.convolutions.{i}.weight_g"] = effective[i].norm(dim=(1, 2), keepdim=True)  # (K, 1, 1)
        state[f"decoder.convolutions.{i}.weight_v"] = effective[i] * 2.0  # a direction of another length
    task, _ = imported(tmp_path, args_container(FCONV, state), vocab)
    for i in range(2):
        torch.testing.assert_close(task.model.decoder.blocks[i].conv.conv.weight, effective[i].permute(2, 1, 0))


def test_an_fconv_without_weight_norm_imports_its_weights(tmp_path):
    """``make_generation_fast_`` removes weight norm: plain ``weight`` keys import as the same effective weights."""
    vocab = (30, 26)
    state = fconv_state(vocab=vocab)
    effective = {}
    for key in [k for k in state if k.endswith(".weight_g")]:
        name = key[: -len(".weight_g")]
        g, v = state.pop(key), state.pop(f"{name}.weight_v")
        dims = (0, 1) if v.dim() == 3 else (1,)
        state[f"{name}.weight"] = effective[name] = g * v / v.norm(dim=dims, keepdim=True)
    task, _ = imported(tmp_path, args_container(FCONV, state), vocab)
    torch.testing.assert_close(task.model.decoder.blocks[0].conv.conv.weight,
                               effective["decoder.convolutions.0"].permute(2, 1, 0))
    torch.testing.assert_close(task.model.output_projection.weight, effective["decoder.fc3"])


def test_a_checkpoint_pickling_fairseq_classes_reads_without_fairseq(tmp_path, monkeypatch):
    """v0.10 containers pickle fairseq's enums and config classes; fairseq is not installed here."""
    import enum
    import sys
    import types

    module = types.ModuleType("fairseq.dataclass.constants")
    module.ChoiceEnum = enum.Enum("ChoiceEnum", {"relu": "relu", "gelu": "gelu"})
    module.ChoiceEnum.__module__ = "fairseq.dataclass.constants"
    for name in ("fairseq", "fairseq.dataclass"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fairseq.dataclass.constants", module)
    container = cfg_container({**TRANSFORMER, "activation_fn": module.ChoiceEnum("gelu")}, transformer_state())
    torch.save(container, tmp_path / "v010.pt")
    for name in ("fairseq", "fairseq.dataclass", "fairseq.dataclass.constants"):
        monkeypatch.delitem(sys.modules, name)
    fs = read_fairseq(tmp_path / "v010.pt")
    assert fs.settings["activation_fn"] == "gelu"


def test_settings_come_from_args_or_cfg_alike(tmp_path):
    state = transformer_state()
    paths = []
    for name, container in (("a.pt", args_container(TRANSFORMER, state)), ("c.pt", cfg_container(TRANSFORMER, state))):
        torch.save(container, tmp_path / name)
        paths.append(read_fairseq(tmp_path / name))
    drop = {"_name", "source_lang", "target_lang"}
    assert {k: v for k, v in paths[0].settings.items() if k not in drop} == \
        {k: v for k, v in paths[1].settings.items() if k not in drop}
    assert paths[0].source_lang == paths[1].source_lang == "de"


def test_decoding_settings_come_from_the_checkpoints_generation_options(tmp_path):
    container = cfg_container(TRANSFORMER, transformer_state())
    container["cfg"]["generation"] = Namespace(beam=4, lenpen=0.6, max_len_a=1.1, max_len_b=50, min_len=3,
                                               no_repeat_ngram_size=0, sampling=False)
    task, _ = imported(tmp_path, container)
    assert task.run_config["task"]["generation"] == {
        "beam_size": 4, "len_penalty": 0.6, "max_len_a": 1.1, "max_len_b": 50, "min_len_a": 0.0, "min_len_b": 3,
        "no_repeat_ngram_size": 0}
    (tmp_path / "data").rename(tmp_path / "first")
    task, _ = imported(tmp_path, args_container(TRANSFORMER, transformer_state()))  # none stored: fairseq's defaults
    assert task.run_config["task"]["generation"] == {
        "beam_size": 5, "len_penalty": 1.0, "max_len_a": 0.0, "max_len_b": 200, "min_len_a": 0.0, "min_len_b": 1,
        "no_repeat_ngram_size": 0}


def test_a_pre_norm_transformer_without_the_decoders_final_norm_imports_and_exports_back(tmp_path):
    """no_decoder_final_norm (fairseq's transformer option) is model.decoder.final_norm=false."""
    state = transformer_state(pre=True)
    del state["decoder.layer_norm.weight"], state["decoder.layer_norm.bias"]
    settings = {**TRANSFORMER, "encoder_normalize_before": True, "decoder_normalize_before": True,
                "no_decoder_final_norm": True}
    task, ckpt = imported(tmp_path, cfg_container(settings, state))
    assert task.model.decoder.layer_norm is None and task.model.encoder.layer_norm is not None
    assert task.run_config["model"]["decoder"]["final_norm"] is False
    back = exported(tmp_path, ckpt)
    assert_same_state(back["model"], state)
    assert back["args"].no_decoder_final_norm is True
    step_equals_full(task, start=2)


# --- the official TaLK code's talkconv -----------------------------------------------------------------------
def official_talk_encoder_window(u: torch.Tensor, left: torch.Tensor, right: torch.Tensor, k: int,
                                 heads: int) -> torch.Tensor:
    """The TaLK code's CUDA encoder kernel for u (T, C), offsets (T, H), l_max = r_max = k: S = cumsum(u / (2k + 1)),
    y_t = S read at a_r minus S read at a_l - 1 (linear interpolation, S[-1] = 0)."""
    T, C = u.shape
    S = torch.cumsum(u / (2 * k + 1), 0).view(T, heads, C // heads)

    def at(i: int, h: int):
        return S[i, h] if i >= 0 else torch.zeros_like(S[0, h])

    out = torch.empty_like(S)
    for t in range(T):
        for h in range(heads):
            a_l = min(max(t - float(left[t, h]) * k, 0.0), T - 1.0)
            a_r = min(max(t + float(right[t, h]) * k, 0.0), T - 1.0)
            alpha_l, alpha_r = math.ceil(a_l) - a_l, a_r - math.floor(a_r)
            upper = (1 - alpha_r) * at(math.floor(a_r), h) + alpha_r * at(math.ceil(a_r), h)
            lower = alpha_l * at(math.floor(a_l) - 1, h) + (1 - alpha_l) * at(math.ceil(a_l) - 1, h)
            out[t, h] = upper - lower
    return out.view(T, C)


def test_an_official_talkconv_translation_model_imports_exports_and_decodes(tmp_path):
    state = talkconv_state()
    settings = {"arch": "talkconv", "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "encoder_layers": 2,
                "encoder_attention_heads": 2, "decoder_layers": 2, "decoder_attention_heads": 2, "dropout": 0.0,
                "encoder_kernel_size_list": [1, 3], "decoder_kernel_size_list": [2, 3], "share_all_embeddings": True,
                "max_source_positions": 64, "max_target_positions": 64, **LANGS}
    task, ckpt = imported(tmp_path, args_container(settings, state))
    ours = seqmix_state(task)
    assert torch.equal(ours["encoder.layers.1.mixer.offset_proj.bias"], state["encoder.layers.1.conv.offsets.bias"])
    assert torch.equal(ours["decoder.layers.0.mixer.offset_proj.weight"],
                       state["decoder.layers.0.conv.offsets.weight"])
    layer = task.model.encoder.layers[1]
    assert layer.mixer.l_max == layer.mixer.r_max == 3 and task.model.decoder.layers[0].mixer.l_max == 2
    assert_same_state(exported(tmp_path, ckpt)["model"], state)
    step_equals_full(task, start=2)
    # the encoder's TaLK layer computes the official kernel's window (float64)
    mixer = layer.mixer.double().eval()
    x = torch.randn(1, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    g = {k: v.double() for k, v in state.items() if k.startswith("encoder.layers.1.")}
    p = "encoder.layers.1."
    u = torch.nn.functional.glu(x[0] @ g[p + "linear1.weight"].t() + g[p + "linear1.bias"], dim=-1)
    sigma = torch.sigmoid(u @ g[p + "conv.offsets.weight"].t() + g[p + "conv.offsets.bias"])
    window = official_talk_encoder_window(u, sigma[:, :2], sigma[:, 2:], 3, 2)
    expect = window @ g[p + "linear2.weight"].t() + g[p + "linear2.bias"]
    with torch.no_grad():
        torch.testing.assert_close(mixer(x)[0], expect, rtol=0, atol=1e-12)
