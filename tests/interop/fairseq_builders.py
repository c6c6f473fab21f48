"""Hand-built fairseq checkpoints: state-dict names, shapes and ``args``/``cfg`` containers written out here as fairseq
writes them (read from fairseq v0.12.2's models and ``checkpoint_utils.save_state``), with random weights. Deliberately
independent of seqmix.interop's tables, so the tests compare two separate readings of fairseq's layout."""

from __future__ import annotations

from argparse import Namespace

import torch
from omegaconf import OmegaConf

from seqmix.data.fairseq_dictionary import FairseqDictionary


class Weights:
    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g) * 0.3

    def linear(self, sd: dict, name: str, n_out: int, n_in: int, bias: bool = True) -> None:
        sd[f"{name}.weight"] = self(n_out, n_in)
        if bias:
            sd[f"{name}.bias"] = self(n_out)

    def norm(self, sd: dict, name: str, dim: int) -> None:
        sd[f"{name}.weight"] = 1 + self(dim)
        sd[f"{name}.bias"] = self(dim)

    def attention(self, sd: dict, name: str, dim: int) -> None:
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            self.linear(sd, f"{name}.{p}", dim, dim)

    def weight_normed(self, sd: dict, name: str, n_out: int, n_in: int) -> None:
        sd[f"{name}.weight_g"] = self(n_out, 1).abs() + 0.5
        sd[f"{name}.weight_v"] = self(n_out, n_in)
        sd[f"{name}.bias"] = self(n_out)


def embeddings(w: Weights, sd: dict, side: str, embed: torch.Tensor, learned: bool, max_positions: int) -> None:
    """A side's token table and positions: a learned table of max_positions + padding_idx + 1 rows, or the
    sinusoidal module's ``_float_tensor`` placeholder (its table is not stored)."""
    sd[f"{side}.embed_tokens.weight"] = embed
    if learned:
        sd[f"{side}.embed_positions.weight"] = w(max_positions + 2, embed.size(1))
    else:
        sd[f"{side}.embed_positions._float_tensor"] = torch.zeros(1)


def transformer_state(e: int = 16, ffn: int = 32, layers: tuple[int, int] = (2, 2), vocab: tuple[int, int] = (30, 30),
                      share_all: bool = True, share_output: bool = True, learned: bool = False, pre: bool = False,
                      max_positions: int = 64, seed: int = 0) -> dict:
    """fairseq main's TransformerModel.state_dict()."""
    w, sd = Weights(seed), {}
    enc_embed = w(vocab[0], e)
    for side, n in (("encoder", layers[0]), ("decoder", layers[1])):
        embed = enc_embed if side == "encoder" or share_all else w(vocab[1], e)
        embeddings(w, sd, side, embed, learned, max_positions)
        for i in range(n):
            p = f"{side}.layers.{i}."
            w.attention(sd, p + "self_attn", e)
            w.norm(sd, p + "self_attn_layer_norm", e)
            if side == "decoder":
                w.attention(sd, p + "encoder_attn", e)
                w.norm(sd, p + "encoder_attn_layer_norm", e)
            w.linear(sd, p + "fc1", ffn, e)
            w.linear(sd, p + "fc2", e, ffn)
            w.norm(sd, p + "final_layer_norm", e)
        if pre:
            w.norm(sd, f"{side}.layer_norm", e)
        if side == "decoder":
            sd["decoder.output_projection.weight"] = embed if share_all or share_output else w(vocab[1], e)
        sd[f"{side}.version"] = torch.tensor([3.0])
    return sd


def packed(sd: dict, shared_output: bool, rename_norms: bool = True) -> dict:
    """The same weights as fairseq ≤0.8 saved them: packed in_proj, (transformer) layer_norms.N, embed_out,
    version 2."""
    out = {}
    norms = {"encoder": ["self_attn_layer_norm", "final_layer_norm"],
             "decoder": ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]}
    for key, value in sd.items():
        parts = key.split(".")
        if parts[-2] in ("q_proj", "k_proj", "v_proj"):
            if parts[-2] == "q_proj":
                base = ".".join(parts[:-2])
                out[f"{base}.in_proj_{parts[-1]}"] = torch.cat(
                    [sd[f"{base}.{p}.{parts[-1]}"] for p in ("q_proj", "k_proj", "v_proj")])
            continue
        if rename_norms and len(parts) == 5 and parts[1] == "layers" and parts[3] in norms[parts[0]]:
            key = ".".join([*parts[:3], "layer_norms", str(norms[parts[0]].index(parts[3])), parts[4]])
        if key == "decoder.output_projection.weight":
            if shared_output:
                continue
            key = "decoder.embed_out"
        if key.endswith(".version"):
            value = torch.tensor([2.0])
        out[key] = value
    return out


def lightconv_state(e: int = 16, ffn: int = 32, heads: int = 2, kernels: tuple[list, list] = ([3, 5], [3, 5]),
                    conv_type: str = "lightweight", glu: bool = True, vocab: tuple[int, int] = (30, 30),
                    share_all: bool = True, share_output: bool = True, learned: bool = False, pre: bool = False,
                    max_positions: int = 64, seed: int = 0) -> dict:
    """fairseq's LightConvModel.state_dict() (conv width = embedding width)."""
    w, sd = Weights(seed), {}
    enc_embed = w(vocab[0], e)
    for side, ks in (("encoder", kernels[0]), ("decoder", kernels[1])):
        embed = enc_embed if side == "encoder" or share_all else w(vocab[1], e)
        embeddings(w, sd, side, embed, learned, max_positions)
        for i, k in enumerate(ks):
            p = f"{side}.layers.{i}."
            w.linear(sd, p + "linear1", 2 * e if glu else e, e)
            if conv_type == "lightweight":
                sd[p + "conv.weight"] = w(heads, 1, k)
            else:
                sd[p + "conv.weight_linear.weight"] = w(heads * k, e)
            w.linear(sd, p + "linear2", e, e)
            if side == "encoder":
                w.linear(sd, p + "fc1", ffn, e)
                w.linear(sd, p + "fc2", e, ffn)
                w.norm(sd, p + "layer_norms.0", e)
                w.norm(sd, p + "layer_norms.1", e)
            else:
                w.norm(sd, p + "conv_layer_norm", e)
                w.attention(sd, p + "encoder_attn", e)
                w.norm(sd, p + "encoder_attn_layer_norm", e)
                w.linear(sd, p + "fc1", ffn, e)
                w.linear(sd, p + "fc2", e, ffn)
                w.norm(sd, p + "final_layer_norm", e)
        if pre:
            w.norm(sd, f"{side}.layer_norm", e)
        if side == "decoder" and not (share_all or share_output):
            sd["decoder.embed_out"] = w(vocab[1], e)
        sd[f"{side}.version"] = torch.tensor([2.0])
    return sd


def fconv_state(e: int = 16, enc_layers=((16, 3), (24, 3), (24, 2, 2)), dec_layers=((16, 3), (24, 2)),
                attention=(True, False), out_embed: int = 8, vocab: tuple[int, int] = (30, 26),
                max_positions: int = 16, share_output: bool = False, seed: int = 0) -> dict:
    """fairseq's FConvModel.state_dict(): ConvTBC weights (K, in, out) weight-normed over dim 2."""
    w, sd = Weights(seed), {}
    for side, specs, v in (("encoder", enc_layers, vocab[0]), ("decoder", dec_layers, vocab[1])):
        sd[f"{side}.embed_tokens.weight"] = w(v, e)
        sd[f"{side}.embed_positions.weight"] = w(max_positions, e)
        in_channels = specs[0][0]
        w.weight_normed(sd, f"{side}.fc1", in_channels, e)
        layer_in = [in_channels]
        for i, spec in enumerate(specs):
            out, k = spec[0], spec[1]
            residual = spec[2] if len(spec) > 2 else 1
            residual_dim = layer_in[-residual]
            if residual_dim != out:
                w.weight_normed(sd, f"{side}.projections.{i}", out, residual_dim)
            sd[f"{side}.convolutions.{i}.weight_g"] = w(1, 1, 2 * out).abs() + 0.5
            sd[f"{side}.convolutions.{i}.weight_v"] = w(k, in_channels, 2 * out)
            sd[f"{side}.convolutions.{i}.bias"] = w(2 * out)
            if side == "decoder" and attention[i]:
                w.weight_normed(sd, f"decoder.attention.{i}.in_projection", e, out)
                w.weight_normed(sd, f"decoder.attention.{i}.out_projection", out, e)
            in_channels = out
            layer_in.append(out)
        w.weight_normed(sd, f"{side}.fc2", e if side == "encoder" else out_embed, in_channels)
    if share_output:
        sd["decoder.fc3.weight"] = sd["decoder.embed_tokens.weight"]
        sd["decoder.fc3.bias"] = w(vocab[1])
    else:
        w.weight_normed(sd, "decoder.fc3", vocab[1], out_embed)
    sd["decoder.version"] = torch.tensor([2.0])
    return sd


def args_container(settings: dict, state: dict) -> dict:
    """fairseq ≤0.9: ``args`` Namespace."""
    return {"args": Namespace(**settings), "model": state,
            "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                   "lr_scheduler_state": {"best": 1.0}, "num_updates": 10}],
            "extra_state": {"train_iterator": {"epoch": 2}}}


def cfg_container(settings: dict, state: dict, model_as: str = "namespace") -> dict:
    """fairseq main: ``cfg`` dict whose ``model`` is a Namespace (legacy archs), or a v0.10 DictConfig."""
    task = {"_name": "translation", "source_lang": settings.get("source_lang"),
            "target_lang": settings.get("target_lang")}
    model = {k: v for k, v in settings.items() if k not in ("source_lang", "target_lang")}
    if model_as == "namespace":
        cfg = {"model": Namespace(**model, _name=model["arch"]), "task": Namespace(**task)}
    else:
        cfg = OmegaConf.create({"model": {**model, "_name": model["arch"]}, "task": task})
    return {"args": None, "cfg": cfg, "model": state, "optimizer_history": [], "extra_state": {}}


def tiny_transformer_checkpoint(folder) -> dict:
    """A 1+1-layer, 16-wide fairseq transformer de->en container (cfg style) over 30-symbol joined dictionaries
    written in ``folder / "data"``: what the import-and-decode tests start from."""
    data = folder / "data"
    data.mkdir()
    write_dicts(data, (30, 30))
    settings = {"arch": "transformer", "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "encoder_layers": 1,
                "encoder_attention_heads": 2, "decoder_layers": 1, "decoder_attention_heads": 2,
                "share_all_embeddings": True, "source_lang": "de", "target_lang": "en"}
    return cfg_container(settings, transformer_state(layers=(1, 1)))


def write_dicts(folder, vocab: tuple[int, int], langs=("de", "en"), joined: bool | None = None) -> None:
    """dict.<lang>.txt files whose sizes (with the 4 specials) are ``vocab``: one joined dictionary written twice
    (``w<i>`` symbols; what fairseq's share_all_embeddings needs) when the sizes agree unless ``joined=False``, else
    separate ones (``s<i>`` and ``t<i>``)."""
    joined = vocab[0] == vocab[1] if joined is None else joined
    for lang, size, prefix in zip(langs, vocab, ("w", "w") if joined else ("s", "t")):
        FairseqDictionary([f"{prefix}{i}" for i in range(size - 4)], [size - i for i in range(size - 4)]).save(
            folder / f"dict.{lang}.txt")


def talkconv_state(e: int = 16, ffn: int = 32, heads: int = 2, kernels: tuple[list, list] = ([1, 3], [2, 3]),
                   vocab: tuple[int, int] = (30, 30), seed: int = 0) -> dict:
    """The official TaLK code's TaLKConvModel.state_dict() (github.com/lioutasb/TaLKConvolutions): lightconv's layout
    (encoder layer_norms.0/1, embed_out) with ``conv.offsets`` (encoder 2H outputs, decoder H), GLU, shared
    embeddings."""
    w, sd = Weights(seed), {}
    embed = w(vocab[0], e)
    for side, ks in (("encoder", kernels[0]), ("decoder", kernels[1])):
        embeddings(w, sd, side, embed, False, 64)
        for i in range(len(ks)):
            p = f"{side}.layers.{i}."
            w.linear(sd, p + "linear1", 2 * e, e)
            w.linear(sd, p + "conv.offsets", heads * (2 if side == "encoder" else 1), e)
            w.linear(sd, p + "linear2", e, e)
            w.linear(sd, p + "fc1", ffn, e)
            w.linear(sd, p + "fc2", e, ffn)
            if side == "encoder":
                w.norm(sd, p + "layer_norms.0", e)
                w.norm(sd, p + "layer_norms.1", e)
            else:
                w.norm(sd, p + "conv_layer_norm", e)
                w.attention(sd, p + "encoder_attn", e)
                w.norm(sd, p + "encoder_attn_layer_norm", e)
                w.norm(sd, p + "final_layer_norm", e)
        sd[f"{side}.version"] = torch.tensor([2.0])
    return sd
