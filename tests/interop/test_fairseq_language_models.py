"""fairseq language models (transformer_lm*, lightconv_lm*) <-> seqmix's DecoderOnly, at library level: a tiny seqmix
language model exported to fairseq's layout and imported back gives the same float64 log-probabilities (plain, tied,
adaptive input / softmax, tied or not, projections tied or not, final norm or not, both position kinds); a
hand-built fairseq transformer_lm state dict (names and shapes written here from fairseq v0.12.2's TransformerDecoder,
AdaptiveInput and AdaptiveSoftmax) imports and scores as a float64 reference computed here from the tensors by the
formulas; what seqmix cannot express is refused in one line; the import command refuses a language model in one line."""

from __future__ import annotations

import math
import subprocess
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from seqmix.config.build import build_model
from seqmix.errors import SeqmixError
from seqmix.interop.fairseq import language_model_from_fairseq, language_model_to_fairseq, read_fairseq
from tests.helpers import run
from tests.interop.fairseq_builders import Weights
from tests.interop.test_fairseq_roundtrip import composed

V, D, FFN, HEADS, LAYERS, PAD = 50, 16, 32, 2, 2, 1
LM = [f"model.embed_dim={D}", f"model.decoder.layers={LAYERS}", f"model.decoder.ffn_dim={FFN}",
      f"model.decoder.heads={HEADS}", "model.dropout=0.0", "model.max_target_positions=64", "task=wikitext103"]


def seqmix_lm(overrides: list[str]):
    cfg = composed([*LM, *overrides])
    torch.manual_seed(0)
    model = build_model(cfg, V, PAD)
    for p in model.parameters():  # no zero biases or unit norms: every tensor matters
        p.data.add_(torch.randn_like(p) * 0.1)
    return model, OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.task.adaptive)


def tokens() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    out = torch.randint(4, V, (2, 9), generator=g)
    out[:, 0] = 2  # eos first, as fairseq's language models read a line
    out[0, 3], out[1, 5] = 5, 45  # a word of the first band and one of the last
    return out


def log_probs(model, x: torch.Tensor) -> torch.Tensor:
    model = model.double().eval()
    with torch.no_grad():
        return model.log_probs(model(x))


def through_fairseq(tmp_path, model, model_cfg, adaptive):
    container = language_model_to_fairseq(model_cfg, adaptive, model.state_dict())
    torch.save(container, tmp_path / "lm.pt")
    return container, language_model_from_fairseq(read_fairseq(tmp_path / "lm.pt"))


CASES = {
    "transformer, tied adaptive input and softmax": ["model=transformer_small", "model.decoder.normalize_before=true",
                                                     "task.adaptive.cutoffs=[10,30]"],
    "transformer, untied adaptive, learned positions, no final norm": [
        "model=transformer_small", "model.decoder.normalize_before=true", "+model.decoder.final_norm=false",
        "model.positions=learned", "model.share_decoder_input_output_embed=false", "task.adaptive.cutoffs=[10,30]",
        "task.adaptive.factor=2"],
    "transformer, tied, projections untied, fairseq's band-0 projection": [
        "model=transformer_small", "model.decoder.normalize_before=true", "task.adaptive.cutoffs=[10,30]",
        "+task.adaptive.tie_projections=false", "+task.adaptive.project_all_bands=true"],
    "transformer, adaptive input, plain untied output": [
        "model=transformer_small", "model.decoder.normalize_before=true", "model.share_decoder_input_output_embed=false",
        "task.adaptive.cutoffs=[10,30]", "task.adaptive.softmax=false", "model.decoder.activation=gelu"],
    "dynamicconv, plain tied": ["model=dynamicconv_small", "+model.decoder.final_norm=false",
                                "task.adaptive.input=false", "task.adaptive.softmax=false"],
    "talk, tied adaptive": ["model=talk_small", "+model.decoder.final_norm=false", "task.adaptive.cutoffs=[10,30]"],
    "lightconv, adaptive softmax only": ["model=lightconv_small", "+model.decoder.final_norm=false",
                                         "model.share_decoder_input_output_embed=false", "task.adaptive.input=false",
                                         "task.adaptive.cutoffs=[10,30]"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_seqmix_language_model_through_fairseq_scores_identically(tmp_path, case):
    model, model_cfg, adaptive = seqmix_lm(CASES[case])
    container, (back, back_cfg, back_adaptive) = through_fairseq(tmp_path, model, model_cfg, adaptive)
    assert container["args"].arch == ("transformer_lm" if "transformer" in case else
                                      "talkconv_lm" if "talk" in case else "lightconv_lm")
    assert container["args"].decoder_normalize_before and back_adaptive["project_all_bands"]
    x = tokens()
    assert torch.equal(log_probs(back, x), log_probs(model, x))
    assert back_cfg["share_decoder_input_output_embed"] == model_cfg["share_decoder_input_output_embed"]
    assert back_cfg["decoder"].get("final_norm") is model_cfg["decoder"].get("final_norm", True)
    assert back_cfg["positions"] == model_cfg["positions"]


def test_an_exported_adaptive_model_has_fairseqs_names():
    model, model_cfg, adaptive = seqmix_lm(CASES["transformer, tied adaptive input and softmax"])
    state = language_model_to_fairseq(model_cfg, adaptive, model.state_dict())["model"]
    assert state["decoder.embed_tokens.embeddings.0.1.weight"].shape == (D, D)  # identity: seqmix has none there
    assert torch.equal(state["decoder.embed_tokens.embeddings.0.1.weight"], torch.eye(D))
    assert state["decoder.embed_tokens.embeddings.2.0.weight"].shape == (V - 30, D // 16)
    assert torch.equal(state["decoder.adaptive_softmax.tail.1.2.weight"], state["decoder.embed_tokens.embeddings.2.0.weight"])
    assert torch.equal(state["decoder.adaptive_softmax.tail.0.0.weight"], state["decoder.embed_tokens.embeddings.1.1.weight"])
    assert state["decoder.adaptive_softmax.head.class_proj.weight"].shape == (2, D)
    assert "decoder.layer_norm.weight" in state and "decoder.layers.1.encoder_attn.k_proj.weight" not in state


# --- a hand-built fairseq transformer_lm and its float64 reference -------------------------------------------------
CUTS = [10, 30]


def fairseq_transformer_lm(tied: bool, learned: bool, final_norm: bool, seed: int = 0) -> dict:
    """TransformerLanguageModel.state_dict() of fairseq v0.12.2 with adaptive input and adaptive softmax (factor 4:
    band widths 16, 4, 1)."""
    w, sd = Weights(seed), {}
    edges, dims = [0, *CUTS, V], [D, D // 4, D // 16]
    for i, dim in enumerate(dims):
        sd[f"decoder.embed_tokens.embeddings.{i}.0.weight"] = w(edges[i + 1] - edges[i], dim)
        sd[f"decoder.embed_tokens.embeddings.{i}.1.weight"] = w(D, dim)  # nn.Linear(dim, d)
    sd["decoder.embed_tokens._float_tensor"] = torch.zeros(1)
    if learned:
        sd["decoder.embed_positions.weight"] = w(64 + PAD + 1, D)
    else:
        sd["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    for layer in range(LAYERS):
        p = f"decoder.layers.{layer}."
        w.attention(sd, p + "self_attn", D)
        w.norm(sd, p + "self_attn_layer_norm", D)
        w.linear(sd, p + "fc1", FFN, D)
        w.linear(sd, p + "fc2", D, FFN)
        w.norm(sd, p + "final_layer_norm", D)
    if final_norm:
        w.norm(sd, "decoder.layer_norm", D)
    a = "decoder.adaptive_softmax."
    if tied:  # TiedHeadModule / TiedLinear hold the input's tensors
        sd[a + "head.word_proj.weight"] = sd["decoder.embed_tokens.embeddings.0.0.weight"]
        sd[a + "head.class_proj.weight"] = w(len(CUTS), D)
        sd[a + "head._float_tensor"] = torch.zeros(1)
        for j in range(len(CUTS)):
            sd[a + f"tail.{j}.0.weight"] = sd[f"decoder.embed_tokens.embeddings.{j + 1}.1.weight"]
            sd[a + f"tail.{j}.2.weight"] = sd[f"decoder.embed_tokens.embeddings.{j + 1}.0.weight"]
    else:
        sd[a + "head.weight"] = w(CUTS[0] + len(CUTS), D)
        for j in range(len(CUTS)):
            sd[a + f"tail.{j}.0.weight"] = w(dims[j + 1], D)  # nn.Linear(d, dim)
            sd[a + f"tail.{j}.2.weight"] = w(edges[j + 2] - edges[j + 1], dims[j + 1])
    sd[a + "version"] = torch.tensor([1])
    sd["decoder.version"] = torch.tensor([3.0])
    return sd


def layer_norm(sd, name, x):
    return F.layer_norm(x, (D,), sd[f"{name}.weight"].double(), sd[f"{name}.bias"].double(), 1e-5)


def linear(sd, name, x):
    return x @ sd[f"{name}.weight"].double().t() + sd[f"{name}.bias"].double()


def sinusoidal(positions: torch.Tensor) -> torch.Tensor:
    """fairseq's table, which it computes in float32 (SinusoidalPositionalEmbedding.get_embedding)."""
    half = D // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000) / (half - 1)))
    angles = positions.float().unsqueeze(-1) * freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).double()


def reference_log_probs(sd: dict, x: torch.Tensor, tied: bool, learned: bool, final_norm: bool) -> torch.Tensor:
    """Pre-norm decoder, adaptive input and adaptive softmax from the formulas, in float64."""
    g = {k: v.double() for k, v in sd.items() if v.is_floating_point()}
    edges = [0, *CUTS, V]
    h = torch.zeros(*x.shape, D, dtype=torch.float64)
    for i in range(3):
        band = (x >= edges[i]) & (x < edges[i + 1])
        vectors = g[f"decoder.embed_tokens.embeddings.{i}.0.weight"][x[band] - edges[i]]
        h[band] = vectors @ g[f"decoder.embed_tokens.embeddings.{i}.1.weight"].t()
    positions = torch.arange(x.size(1)) + PAD + 1  # no padding: positions count from padding_idx + 1
    h = math.sqrt(D) * h + (g["decoder.embed_positions.weight"][positions] if learned else sinusoidal(positions))
    T, hd = x.size(1), D // HEADS
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for layer in range(LAYERS):
        p = f"decoder.layers.{layer}."
        y = layer_norm(g, p + "self_attn_layer_norm", h)
        q, k, v = (linear(g, p + f"self_attn.{n}_proj", y).view(*x.shape, HEADS, hd).transpose(1, 2)
                   for n in ("q", "k", "v"))
        scores = (q * hd**-0.5) @ k.transpose(-1, -2)
        attn = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        h = h + linear(g, p + "self_attn.out_proj", attn.transpose(1, 2).reshape(*x.shape, D))
        y = layer_norm(g, p + "final_layer_norm", h)
        h = h + linear(g, p + "fc2", torch.relu(linear(g, p + "fc1", y)))
    if final_norm:
        h = layer_norm(g, "decoder.layer_norm", h)
    a = "decoder.adaptive_softmax."
    if tied:
        head = torch.cat([h @ g[a + "head.word_proj.weight"].t(), h @ g[a + "head.class_proj.weight"].t()], -1)
    else:
        head = h @ g[a + "head.weight"].t()
    head = head.log_softmax(-1)
    parts = [head[..., : CUTS[0]]]
    for j in range(len(CUTS)):
        proj = g[a + f"tail.{j}.0.weight"]  # tied: the input's (d, dim), used transposed; untied: (dim, d)
        z = h @ proj if tied else h @ proj.t()
        tail = (z @ g[a + f"tail.{j}.2.weight"].t()).log_softmax(-1)
        parts.append(head[..., CUTS[0] + j: CUTS[0] + j + 1] + tail)
    return torch.cat(parts, -1)


@pytest.mark.parametrize("tied,learned,final_norm", [(True, False, False), (False, True, True)])
def test_a_hand_built_fairseq_adaptive_transformer_lm_scores_as_the_reference(tmp_path, tied, learned, final_norm):
    sd = fairseq_transformer_lm(tied, learned, final_norm)
    if tied:  # fairseq's wiki103 architecture: tied, projections tied, no final norm (its defaults fill the rest)
        settings = {"arch": "transformer_lm_wiki103", "adaptive_input_cutoff": "10,30",
                    "adaptive_softmax_cutoff": "10,30", "decoder_embed_dim": D, "decoder_ffn_embed_dim": FFN,
                    "decoder_layers": LAYERS, "decoder_attention_heads": HEADS, "tokens_per_sample": 64,
                    "task": "language_modeling"}
        container = {"args": Namespace(**settings), "model": sd}
    else:  # cfg style, as fairseq >= 0.10 saves a dataclass model
        model = {"_name": "transformer_lm", "adaptive_input": True, "adaptive_input_cutoff": "10,30",
                 "adaptive_softmax_cutoff": "10,30", "decoder_embed_dim": D, "decoder_input_dim": D,
                 "decoder_output_dim": D, "decoder_ffn_embed_dim": FFN, "decoder_layers": LAYERS,
                 "decoder_attention_heads": HEADS, "decoder_learned_pos": True, "max_target_positions": 64,
                 "dropout": 0.0}
        container = {"args": None, "cfg": {"model": model, "task": {"_name": "language_modeling"}}, "model": sd}
    torch.save(container, tmp_path / "lm.pt")
    model, model_cfg, adaptive = language_model_from_fairseq(read_fairseq(tmp_path / "lm.pt"))
    assert model_cfg["decoder"]["final_norm"] is final_norm and adaptive["tie_projections"]
    assert model_cfg["share_decoder_input_output_embed"] is tied and adaptive["cutoffs"] == CUTS
    x = tokens()
    ours = log_probs(model, x)
    torch.testing.assert_close(ours, reference_log_probs(sd, x, tied, learned, final_norm), rtol=0, atol=1e-12)
    assert torch.allclose(ours.exp().sum(-1), torch.ones(x.shape, dtype=torch.float64), atol=1e-12)


def container_of(sd: dict, **settings) -> dict:
    base = {"arch": "transformer_lm", "adaptive_input": True, "adaptive_input_cutoff": "10,30",
            "adaptive_softmax_cutoff": "10,30", "tie_adaptive_weights": True, "tie_adaptive_proj": True,
            "no_decoder_final_norm": True, "decoder_embed_dim": D, "decoder_ffn_embed_dim": FFN,
            "decoder_layers": LAYERS, "decoder_attention_heads": HEADS, "max_target_positions": 64}
    return {"args": Namespace(**{**base, **settings}), "model": sd}


@pytest.mark.parametrize("settings,damage,needle", [
    ({"adaptive_softmax_cutoff": "10,20", "tie_adaptive_weights": False}, None, "cutoffs"),
    ({"activation_fn": "gelu_fast"}, None, "activation_fn 'gelu_fast'"),
    ({"decoder_output_dim": 8}, None, "decoder_output_dim"),
    ({}, "untie", "should be tied"),
    ({}, "extra", "unexpected decoder.layers.0.encoder_attn.k_proj.weight"),
])
def test_what_does_not_map_is_refused_in_one_line(tmp_path, settings, damage, needle):
    sd = fairseq_transformer_lm(tied=True, learned=False, final_norm=False)
    if damage == "untie":
        sd["decoder.adaptive_softmax.tail.0.2.weight"] = sd["decoder.adaptive_softmax.tail.0.2.weight"] + 1
    elif damage == "extra":
        sd["decoder.layers.0.encoder_attn.k_proj.weight"] = torch.zeros(D, D)
    torch.save(container_of(sd, **settings), tmp_path / "lm.pt")
    with pytest.raises(SeqmixError, match=needle) as err:
        language_model_from_fairseq(read_fairseq(tmp_path / "lm.pt"))
    assert "\n" not in str(err.value)


def test_a_lightconv_lm_with_a_final_norm_is_not_exported():
    model, model_cfg, adaptive = seqmix_lm(["model=dynamicconv_small", "task.adaptive.input=false",
                                            "task.adaptive.softmax=false"])
    with pytest.raises(SeqmixError, match="final LayerNorm"):
        language_model_to_fairseq(model_cfg, adaptive, model.state_dict())


def command(log_dir, *args: str) -> subprocess.CompletedProcess:
    return run("seqmix.interop.fairseq", list(args), log_dir / "command")


def test_the_commands_export_and_import_a_language_model(tmp_path):
    """export writes checkpoint.pt + dict.txt; import reads them back into a language-modeling checkpoint that scores
    texts as the original."""
    from seqmix.config.build import load_task
    from tests.interop.test_fairseq_roundtrip import SENTENCES, saved_seqmix_checkpoint

    original = saved_seqmix_checkpoint(tmp_path, [*LM, *CASES["transformer, tied adaptive input and softmax"][:2],
                                                  "task.adaptive.cutoffs=[10,30]", "task.data.tokens_per_sample=64"])
    done = command(tmp_path, "export", str(original), "--out", str(tmp_path / "fairseq"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert {p.name for p in (tmp_path / "fairseq").iterdir()} == {"checkpoint.pt", "dict.txt", "seqmix_tokenizer.json"}
    assert torch.load(tmp_path / "fairseq" / "checkpoint.pt", weights_only=False)["args"].arch == "transformer_lm"
    done = command(tmp_path, "import", str(tmp_path / "fairseq" / "checkpoint.pt"),
                   "--data-dir", str(tmp_path / "fairseq"),
                   "--out", str(tmp_path / "back.ckpt"))
    assert done.returncode == 0, done.stderr[-2000:]
    (before, _), (after, _) = load_task(original), load_task(tmp_path / "back.ckpt")
    assert type(after).__name__ == "LanguageModelingTask"
    x = tokens() % before.tokenizer.vocab_size
    assert torch.equal(log_probs(after.model, x), log_probs(before.model, x))
    assert after.evaluate_texts(SENTENCES)[1].score == before.evaluate_texts(SENTENCES)[1].score


def test_a_fairseq_language_model_imports_with_its_dict_txt(tmp_path):
    from seqmix.config.build import load_task
    from seqmix.data.fairseq_dictionary import FairseqDictionary

    torch.save(container_of(fairseq_transformer_lm(True, False, False)), tmp_path / "lm.pt")
    FairseqDictionary([f"w{i}" for i in range(V - 4)]).save(tmp_path / "dict.txt")
    done = command(tmp_path, "import", str(tmp_path / "lm.pt"), "--data-dir", str(tmp_path), "--no-moses",
                   "--out", str(tmp_path / "lm.ckpt"))
    assert done.returncode == 0, done.stderr[-2000:]
    task = load_task(tmp_path / "lm.ckpt")[0]
    assert task.tokenizer.encode("w0 w41") == [4, 45]
    assert math.isfinite(task.evaluate_texts(["w0 w41 w7", "w3"])[1].score)
    FairseqDictionary([f"w{i}" for i in range(V - 5)]).save(tmp_path / "dict.txt")
    done = command(tmp_path, "import", str(tmp_path / "lm.pt"), "--data-dir", str(tmp_path),
                   "--out", str(tmp_path / "x.ckpt"))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "dict.txt it was trained with" in done.stderr


# --- the official TaLK code's talkconv_lm ------------------------------------------------------------------------
KERNELS = [3, 5]


def official_talk_lm(seed: int = 0) -> dict:
    """TaLKConvLanguageModel.state_dict() of github.com/lioutasb/TaLKConvolutions (its TaLKConvDecoder without
    cross-attention and without a final norm): a plain embedding tied to the output, GLU, 2 heads."""
    w, sd = Weights(seed), {}
    sd["decoder.embed_tokens.weight"] = w(V, D)
    sd["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    for layer in range(LAYERS):
        p = f"decoder.layers.{layer}."
        w.linear(sd, p + "linear1", 2 * D, D)
        w.linear(sd, p + "conv.offsets", HEADS, D)  # decoder: one (left) offset per head
        w.linear(sd, p + "linear2", D, D)
        w.norm(sd, p + "conv_layer_norm", D)
        w.linear(sd, p + "fc1", FFN, D)
        w.linear(sd, p + "fc2", D, FFN)
        w.norm(sd, p + "final_layer_norm", D)
    sd["decoder.version"] = torch.tensor([2.0])
    return sd


def talk_window(u: torch.Tensor, sigma: torch.Tensor, l_max: int) -> torch.Tensor:
    """The official CUDA decoder kernel's output for u (T, C) and offsets sigma (T, H): S = cumsum(u / K) with
    K = l_max + 1, a = clamp(t - sigma * l_max, 0, T - 1), y_t = S_t - (alpha S[floor(a) - 1] + (1 - alpha)
    S[ceil(a) - 1]), alpha = ceil(a) - a, S[-1] = 0."""
    T, C = u.shape
    S = torch.cumsum(u / (l_max + 1), 0).view(T, HEADS, C // HEADS)
    out = torch.empty_like(S)
    for t in range(T):
        for h in range(HEADS):
            a = min(max(t - float(sigma[t, h]) * l_max, 0.0), T - 1.0)
            lo, hi = math.floor(a), math.ceil(a)
            alpha = hi - a
            before = (alpha * (S[lo - 1, h] if lo >= 1 else 0) + (1 - alpha) * (S[hi - 1, h] if hi >= 1 else 0))
            out[t, h] = S[t, h] - before
    return out.view(T, C)


def reference_talk_log_probs(sd: dict, x: torch.Tensor) -> torch.Tensor:
    g = {k: v.double() for k, v in sd.items() if v.is_floating_point()}
    rows = []
    for b in range(x.size(0)):
        positions = torch.arange(x.size(1)) + PAD + 1
        h = math.sqrt(D) * g["decoder.embed_tokens.weight"][x[b]] + sinusoidal(positions)
        for layer, l_max in enumerate(KERNELS):
            p = f"decoder.layers.{layer}."
            u = F.glu(linear(g, p + "linear1", layer_norm(g, p + "conv_layer_norm", h)), dim=-1)
            sigma = torch.sigmoid(linear(g, p + "conv.offsets", u))
            h = h + linear(g, p + "linear2", talk_window(u, sigma, l_max))
            y = linear(g, p + "fc1", layer_norm(g, p + "final_layer_norm", h))
            h = h + linear(g, p + "fc2", y * torch.sigmoid(y))
        rows.append((h @ g["decoder.embed_tokens.weight"].t()).log_softmax(-1))
    return torch.stack(rows)


def test_an_official_talk_language_model_scores_as_its_cuda_kernels_formula(tmp_path):
    sd = official_talk_lm()
    settings = {"arch": "talkconv_lm", "decoder_embed_dim": D, "decoder_ffn_embed_dim": FFN, "decoder_layers": LAYERS,
                "decoder_attention_heads": HEADS, "decoder_kernel_size_list": KERNELS,
                "share_decoder_input_output_embed": True, "tokens_per_sample": 64, "dropout": 0.0}
    torch.save({"args": Namespace(**settings), "model": sd}, tmp_path / "talk.pt")
    model, model_cfg, _ = language_model_from_fairseq(read_fairseq(tmp_path / "talk.pt"))
    assert model_cfg["decoder"]["mixer"]["_target_"] == "seqmix.mixers.TaLK"
    assert model_cfg["decoder"]["activation"] == "swish" and model_cfg["decoder"]["final_norm"] is False
    x = tokens()
    torch.testing.assert_close(log_probs(model, x), reference_talk_log_probs(sd, x), rtol=0, atol=1e-12)
