"""The fairseq model families seqmix maps: translation (transformer, lightconv, fconv, and the official TaLK code's
talkconv) and language models (transformer_lm, lightconv_lm, talkconv_lm, whose layers are their translation
family's decoder layers without cross-attention): their settings as a seqmix model config and back, and ONE table per
family naming every tensor on both sides with its reshape. Import and export walk the same table in opposite
directions, so a name or a layout fixed once is fixed both ways.

fairseq state dicts come in several generations; ``upgrade`` rewrites older names into the newest layout the table
speaks (packed ``in_proj_weight`` split into q/k/v, transformer ``layer_norms.N`` renamed, a lightweight conv's
(H, K) CUDA-layer weight unsqueezed to (H, 1, K), ``embed_out`` of a transformer renamed ``output_projection``, a
lightconv saved by fairseq main (``layer_norm1/2``, ``output_projection``) renamed as v0.12.2 saves it), and
drops what carries no weights (``version`` and sinusoidal ``_float_tensor`` buffers, stale sinusoidal tables, the
encoder layers' fast-path copies of fairseq 0.12).
``buffers`` gives back what fairseq expects to find (exact values) when exporting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from seqmix.errors import SeqmixError
from seqmix.interop.fairseq_archs import eval_spec

log = logging.getLogger("seqmix")

PADDING_IDX = 1  # fairseq's and seqmix's pad id; positions start at PADDING_IDX + 1


# --- reshapes and the table's rows -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reshape:
    """How one tensor's layout differs between the two toolkits (each function is the other's inverse)."""

    what: str
    to_seqmix: Callable[[Tensor], Tensor]
    to_fairseq: Callable[[Tensor], Tensor]


def _same(t: Tensor) -> Tensor:
    return t


def _swap_kernel_and_out(t: Tensor) -> Tensor:
    return t.permute(2, 1, 0).contiguous()


SAME = Reshape("as is", _same, _same)
# fairseq's own (untied) adaptive-softmax tail projection is an nn.Linear(d, band width): (band width, d); seqmix keeps
# every band projection as the adaptive input's, (d, band width), used transposed on the softmax side
TRANSPOSE = Reshape("nn.Linear(d, w) (w, d) <-> seqmix band projection (d, w)", lambda t: t.t().contiguous(),
                    lambda t: t.t().contiguous())
# ConvTBC stores (kernel, in, out); a Conv1d (out, in, kernel): the same taps, W1d[o, i, k] = Wtbc[k, i, o]
CONV_TBC = Reshape("ConvTBC (kernel, in, out) <-> Conv1d (out, in, kernel)", _swap_kernel_and_out, _swap_kernel_and_out)
# weight norm of a ConvTBC over dims (kernel, in) keeps one gain per output: (1, 1, out) <-> the Conv1d's (out, 1, 1)
CONV_TBC_GAIN = Reshape("weight-norm gain (1, 1, out) <-> (out, 1, 1)",
                        lambda t: t.reshape(-1, 1, 1).contiguous(), lambda t: t.reshape(1, 1, -1).contiguous())


@dataclass(frozen=True)
class Rule:
    """One seqmix tensor and every fairseq name it appears under (tied weights are saved under each of them)."""

    fairseq: tuple[str, ...]
    seqmix: str
    reshape: Reshape = SAME


def _rules(pairs: list[tuple[str, str]], prefix_f: str, prefix_s: str, reshape: Reshape = SAME) -> list[Rule]:
    return [Rule((f"{prefix_f}{f}",), f"{prefix_s}{s}", reshape) for f, s in pairs]


def _linear(f: str, s: str, bias: bool = True) -> list[tuple[str, str]]:
    return [(f"{f}.weight", f"{s}.weight")] + ([(f"{f}.bias", f"{s}.bias")] if bias else [])


def _norm(f: str, s: str) -> list[tuple[str, str]]:
    return _linear(f, s)


def _attention(f: str, s: str) -> list[tuple[str, str]]:
    return [pair for p in ("q_proj", "k_proj", "v_proj", "out_proj") for pair in _linear(f"{f}.{p}", f"{s}.{p}")]


def _weight_normed_linear(f: str, s: str) -> list[tuple[str, str]]:
    return [(f"{f}.weight_g", f"{s}.parametrizations.weight.original0"),
            (f"{f}.weight_v", f"{s}.parametrizations.weight.original1"), (f"{f}.bias", f"{s}.bias")]


# --- settings helpers ----------------------------------------------------------------------------------------------
def _refuse(problem: str) -> None:
    raise SeqmixError(f"cannot map this fairseq model to seqmix: {problem}")


def _check(condition: bool, problem: str) -> None:
    if not condition:
        _refuse(problem)


def kernel_list(value, layers: int, side: str) -> list[int]:
    """fairseq's ``<side>_kernel_size_list``: one size per layer; a single size is repeated (as fairseq does)."""
    sizes = eval_spec(value)
    sizes = [sizes] if isinstance(sizes, int) else [int(k) for k in sizes]
    if len(sizes) == 1:
        sizes = sizes * layers
    _check(len(sizes) == layers, f"{side}_kernel_size_list has {len(sizes)} sizes for {layers} layers")
    return sizes


def _positions(s: dict) -> str:
    _check(not s.get("no_token_positional_embeddings"), "no_token_positional_embeddings (seqmix always has positions)")
    _check(bool(s["encoder_learned_pos"]) == bool(s["decoder_learned_pos"]),
           "learned positions on one side only (seqmix's `positions` covers both sides)")
    return "learned" if s["encoder_learned_pos"] else "sinusoidal"


def _common_encoder_decoder_checks(s: dict) -> None:
    e, d = s["encoder_embed_dim"], s["decoder_embed_dim"]
    _check(e == d, f"encoder_embed_dim {e} != decoder_embed_dim {d} (seqmix's EncoderDecoder has one width)")
    _check(s["decoder_input_dim"] == d and s["decoder_output_dim"] == d,
           "decoder_input_dim/decoder_output_dim differ from decoder_embed_dim (project_in/out_dim)")
    _check(not s.get("adaptive_softmax_cutoff"), "adaptive softmax")
    _check(not s.get("adaptive_input"), "adaptive input")
    for side in ("encoder", "decoder"):
        _check(not s.get(f"{side}_layers_to_keep"), f"{side}_layers_to_keep (pruned layers)")


def _mixer_of(model_side: dict) -> dict:
    if model_side.get("pattern") is not None:
        raise SeqmixError("cannot export to fairseq: a hybrid mixer pattern (fairseq has one layer type per side)")
    mixer = model_side.get("mixer")
    if not mixer:
        raise SeqmixError("cannot export to fairseq: a stack without a mixer")
    return mixer


def _unsupported(what: str) -> None:
    raise SeqmixError(f"cannot export to fairseq: {what}")


def _same_everywhere(values: dict, what: str) -> object:
    """One fairseq setting fed by several seqmix ones: they should agree; dropouts only change training, so a
    disagreement is a warning (the first value is written)."""
    distinct = set(values.values())
    if len(distinct) > 1:
        log.warning("fairseq has one %s; seqmix's differ (%s): writing %s", what, values, next(iter(values.values())))
    return next(iter(values.values()))


# --- the families ------------------------------------------------------------------------------------------------
class Family:
    """What differs between fairseq's transformer, lightconv and fconv mappings."""

    name: str

    def seqmix_config(self, arch: str, s: dict) -> dict:  # pragma: no cover - interface
        """The seqmix ``model`` config node for complete fairseq settings ``s``."""
        raise NotImplementedError

    def fairseq_settings(self, model: dict) -> tuple[str, dict]:  # pragma: no cover - interface
        """(registered architecture, complete flat fairseq settings) of a seqmix model config of this family."""
        raise NotImplementedError

    def rules(self, s: dict) -> list[Rule]:  # pragma: no cover - interface
        raise NotImplementedError

    def upgrade(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        """Older fairseq names → the table's; buffers dropped."""
        return dict(state)

    def buffers(self, s: dict) -> dict[str, Tensor]:
        return {}

    def finish(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        """The exported state in fairseq's layout where one fairseq tensor holds several seqmix ones (``upgrade``
        split it on import)."""
        return state


def _split_in_proj(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """fairseq ≤0.8 packs q, k, v into ``in_proj_weight`` (3C, C) / ``in_proj_bias`` (3C,), in that order."""
    out = {}
    for key, value in state.items():
        for kind in ("weight", "bias"):
            if key.endswith(f".in_proj_{kind}"):
                base = key[: -len(f"in_proj_{kind}")]
                for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                    out[f"{base}{name}.{kind}"] = part.contiguous()
                break
        else:
            out[key] = value
    return out


# fairseq 0.12's transformer encoder layers also save copies of their weights for its "BetterTransformer" fast path
# (``encoder.layers.N.in_proj_weight`` = q/k/v packed, ``fc1_weight``, ...); fairseq rebuilds them from the regular
# weights on every load (``TransformerEncoderLayerBase._load_from_state_dict``), so they carry nothing of their own
_FAST_PATH_COPIES = ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias", "fc1_weight", "fc1_bias",
                     "fc2_weight", "fc2_bias")


def _drop_fast_path_copies(state: dict[str, Tensor]) -> dict[str, Tensor]:
    def copy(key: str) -> bool:
        parts = key.split(".")
        return len(parts) == 4 and parts[:2] == ["encoder", "layers"] and parts[3] in _FAST_PATH_COPIES

    return {k: v for k, v in state.items() if not copy(k)}


def _drop_buffers(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in state.items()
            if not (k in ("encoder.version", "decoder.version") or k.endswith("embed_positions._float_tensor"))}


class _EncoderDecoderFamily(Family):
    """transformer and lightconv: seqmix's EncoderDecoder with a mixer per side."""

    version: float

    def _sinusoidal_leftovers(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        if not s["encoder_learned_pos"]:  # very old checkpoints saved the sinusoidal table itself
            state = {k: v for k, v in state.items() if not k.endswith("embed_positions.weights")}
        return state

    def seqmix_config(self, arch: str, s: dict) -> dict:
        _common_encoder_decoder_checks(s)
        share_all = bool(s["share_all_embeddings"])
        return {
            "_target_": "seqmix.models.EncoderDecoder", "_convert_": "all", "name": f"fairseq_{arch}",
            "embed_dim": int(s["encoder_embed_dim"]), "dropout": float(s["dropout"]), "positions": _positions(s),
            "scale_embedding": not s.get("no_scale_embedding", False),
            "max_source_positions": int(s["max_source_positions"]),
            "max_target_positions": int(s["max_target_positions"]), "share_all_embeddings": share_all,
            "share_decoder_input_output_embed": share_all or bool(s["share_decoder_input_output_embed"]),
            "decoder_start": "eos",
            "encoder": self._side("encoder", s), "decoder": self._side("decoder", s),
        }

    def _side(self, side: str, s: dict) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def _common_settings(self, model: dict) -> dict:
        enc, dec = model["encoder"], model["decoder"]
        share_all = bool(model.get("share_all_embeddings"))
        if share_all and not model.get("share_decoder_input_output_embed", True):
            _unsupported("share_all_embeddings with an untied output projection (fairseq's share_all_embeddings ties "
                         "the output too)")
        learned = model.get("positions", "sinusoidal") == "learned"
        return {
            "encoder_embed_dim": model["embed_dim"], "decoder_embed_dim": model["embed_dim"],
            "decoder_input_dim": model["embed_dim"], "decoder_output_dim": model["embed_dim"],
            "encoder_layers": enc["layers"], "decoder_layers": dec["layers"],
            "encoder_ffn_embed_dim": enc["ffn_dim"], "decoder_ffn_embed_dim": dec["ffn_dim"],
            "encoder_attention_heads": enc["heads"], "decoder_attention_heads": dec["heads"],
            "encoder_normalize_before": bool(enc.get("normalize_before", False)),
            "decoder_normalize_before": bool(dec.get("normalize_before", False)),
            "encoder_learned_pos": learned, "decoder_learned_pos": learned, "no_token_positional_embeddings": False,
            "dropout": float(model.get("dropout", 0.1)), "share_all_embeddings": share_all,
            "share_decoder_input_output_embed": bool(model.get("share_decoder_input_output_embed", True)),
            "max_source_positions": int(model.get("max_source_positions", 1024)),
            "max_target_positions": int(model.get("max_target_positions", 1024)),
            "adaptive_softmax_cutoff": None, "adaptive_softmax_dropout": 0.0, "adaptive_input": False,
        }

    def _check_heads(self, model: dict) -> None:
        dec = model["decoder"]
        cross = dec.get("cross_attention_heads") or dec["heads"]
        if cross != dec["heads"]:
            _unsupported(f"cross_attention_heads {cross} != decoder heads {dec['heads']} (fairseq uses "
                         "decoder_attention_heads for both)")
        for side in ("encoder", "decoder"):
            heads = _mixer_of(model[side]).get("num_heads")
            if heads is not None and heads != model[side]["heads"]:
                _unsupported(f"the {side} mixer's num_heads {heads} != {side} heads {model[side]['heads']}")

    def _embedding_rules(self, s: dict) -> list[Rule]:
        # shared by all: the decoder's table must be the encoder's (checked on import, written twice on export)
        enc_names = ("encoder.embed_tokens.weight",) + (("decoder.embed_tokens.weight",) if s["share_all_embeddings"]
                                                        else ())
        rules = [Rule(enc_names, "encoder.embed_tokens.weight")]
        tied_output = bool(s["share_all_embeddings"] or s["share_decoder_input_output_embed"])
        dec_names = ("decoder.embed_tokens.weight",) + ((self.output_name,) if tied_output and self.tied_output_saved
                                                        else ())
        rules.append(Rule(dec_names, "decoder.embed_tokens.weight"))
        if not tied_output:
            rules.append(Rule((self.output_name,), "output_projection.weight"))
        if s["encoder_learned_pos"]:
            rules += _rules([("embed_positions.weight", "embed_positions.weights.weight")], "encoder.", "encoder.")
            rules += _rules([("embed_positions.weight", "embed_positions.weights.weight")], "decoder.", "decoder.")
        for side in ("encoder", "decoder"):
            if s[f"{side}_normalize_before"] and not (side == "decoder" and s.get("no_decoder_final_norm")):
                rules += _rules(_norm("layer_norm", "layer_norm"), f"{side}.", f"{side}.")
        return rules

    output_name: str
    tied_output_saved: bool  # fairseq main's transformer saves the tied output under its own name too

    def buffers(self, s: dict) -> dict[str, Tensor]:
        out = {"encoder.version": torch.tensor([self.version]), "decoder.version": torch.tensor([self.version])}
        if not s["encoder_learned_pos"]:
            for side in ("encoder", "decoder"):
                out[f"{side}.embed_positions._float_tensor"] = torch.zeros(1)
        return out


class TransformerFamily(_EncoderDecoderFamily):
    name = "transformer"
    version = 3.0
    output_name = "decoder.output_projection.weight"
    tied_output_saved = True
    ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish"}

    def seqmix_config(self, arch: str, s: dict) -> dict:
        _check(not s.get("layernorm_embedding"), "layernorm_embedding")
        _check(not s.get("no_cross_attention") and not s.get("cross_self_attention"),
               "no_cross_attention / cross_self_attention")
        _check(s["activation_fn"] in self.ACTIVATIONS,
               f"activation_fn {s['activation_fn']!r} (seqmix has relu, gelu (exact), swish)")
        return super().seqmix_config(arch, s)

    def _side(self, side: str, s: dict) -> dict:
        out = {"layers": int(s[f"{side}_layers"]), "heads": int(s[f"{side}_attention_heads"]),
               "ffn_dim": int(s[f"{side}_ffn_embed_dim"]), "normalize_before": bool(s[f"{side}_normalize_before"]),
               "activation": self.ACTIVATIONS[s["activation_fn"]],
               "activation_dropout": float(s.get("activation_dropout") or s.get("relu_dropout") or 0.0),
               "mixer": {"_target_": "seqmix.mixers.SelfAttention", "_partial_": True,
                         "attention_dropout": float(s["attention_dropout"])}}
        if side == "decoder":
            out.update(attention_dropout=float(s["attention_dropout"]), cross_attention_heads=out["heads"])
            if s.get("no_decoder_final_norm") and out["normalize_before"]:
                out["final_norm"] = False
        return out

    def fairseq_settings(self, model: dict) -> tuple[str, dict]:
        self._check_heads(model)
        for side in ("encoder", "decoder"):
            self.check_side(side, model[side])
        if not model["encoder"].get("final_norm", True) and model["encoder"].get("normalize_before"):
            _unsupported("a pre-norm encoder without its final LayerNorm (fairseq's transformer always has it)")
        enc, dec = model["encoder"], model["decoder"]
        activation = enc.get("activation", "relu")
        if dec.get("activation", "relu") != activation:
            _unsupported("different FFN activations in encoder and decoder (fairseq has one activation_fn)")
        s = self._common_settings(model)
        s.update(
            activation_fn=activation, no_scale_embedding=not model.get("scale_embedding", True),
            attention_dropout=float(_same_everywhere({
                "encoder mixer": _mixer_of(enc).get("attention_dropout", 0.0),
                "decoder mixer": _mixer_of(dec).get("attention_dropout", 0.0),
                "cross-attention": dec.get("attention_dropout", 0.0)}, "attention_dropout")),
            activation_dropout=float(_same_everywhere({"encoder": enc.get("activation_dropout", 0.0),
                                                       "decoder": dec.get("activation_dropout", 0.0)},
                                                      "activation_dropout")),
            relu_dropout=0.0, layernorm_embedding=False, no_cross_attention=False, cross_self_attention=False,
            no_decoder_final_norm=not dec.get("final_norm", True), tie_adaptive_weights=False,
            encoder_layerdrop=0.0, decoder_layerdrop=0.0,
            encoder_layers_to_keep=None, decoder_layers_to_keep=None, quant_noise_pq=0.0,
            quant_noise_pq_block_size=8, quant_noise_scalar=0.0, checkpoint_activations=False,
            offload_activations=False,
            encoder_embed_path=None, decoder_embed_path=None,
        )
        return "transformer", s

    @staticmethod
    def check_side(side: str, model_side: dict) -> None:
        mixer = _mixer_of(model_side)
        if mixer.get("_target_") != "seqmix.mixers.SelfAttention":
            _unsupported(f"{side} mixer {mixer.get('_target_')} in a transformer (fairseq's transformer is "
                         "self-attention on both sides)")
        if not mixer.get("bias", True):
            _unsupported(f"{side} self-attention without biases")

    def rules(self, s: dict) -> list[Rule]:
        rules = self._embedding_rules(s)
        for side in ("encoder", "decoder"):
            for i in range(int(s[f"{side}_layers"])):
                rules += _rules(self.layer_pairs(side, s, cross=side == "decoder"), f"{side}.layers.{i}.",
                                f"{side}.layers.{i}.")
        return rules

    @staticmethod
    def layer_pairs(side: str, s: dict, cross: bool) -> list[tuple[str, str]]:
        """(fairseq, seqmix) names inside one transformer layer (a language model's: decoder, no cross)."""
        pairs = _attention("self_attn", "mixer.attn") + _norm("self_attn_layer_norm", "mixer_residual.norm")
        if cross:
            pairs += _attention("encoder_attn", "cross_attn") + _norm("encoder_attn_layer_norm", "cross_residual.norm")
        pairs += _linear("fc1", "ffn.fc1") + _linear("fc2", "ffn.fc2")
        return pairs + _norm("final_layer_norm", "ffn_residual.norm")

    def upgrade(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        state = self._sinusoidal_leftovers(_drop_buffers(_split_in_proj(_drop_fast_path_copies(state))), s)
        renames = {"encoder": {"0": "self_attn_layer_norm", "1": "final_layer_norm"},
                   "decoder": {"0": "self_attn_layer_norm", "1": "encoder_attn_layer_norm", "2": "final_layer_norm"}}
        out = {}
        for key, value in state.items():
            parts = key.split(".")
            if len(parts) == 6 and parts[1] == "layers" and parts[3] == "layer_norms":
                new = renames[parts[0]].get(parts[4])
                if new is not None:
                    key = ".".join([*parts[:3], new, parts[5]])
            out[key] = value
        if "decoder.embed_out" in out:
            out[self.output_name] = out.pop("decoder.embed_out")
        tied = bool(s["share_all_embeddings"] or s["share_decoder_input_output_embed"])
        if tied and self.output_name not in out and "decoder.embed_tokens.weight" in out:
            out[self.output_name] = out["decoder.embed_tokens.weight"]
        return out


class LightConvFamily(_EncoderDecoderFamily):
    """fairseq's ``lightconv`` (LightConv and DynamicConv layers, chosen per side by ``<side>_conv_type``)."""

    name = "lightconv"
    version = 2.0
    output_name = "decoder.embed_out"
    tied_output_saved = False
    MIXERS = {"lightweight": "seqmix.mixers.LightConv", "dynamic": "seqmix.mixers.DynamicConv"}

    def _side(self, side: str, s: dict) -> dict:
        layers = int(s[f"{side}_layers"])
        conv_type = s[f"{side}_conv_type"]
        _check(conv_type in self.MIXERS, f"{side}_conv_type {conv_type!r} (seqmix maps lightweight and dynamic)")
        mixer = {"_target_": self.MIXERS[conv_type], "_partial_": True,
                 "kernel_size": kernel_list(s[f"{side}_kernel_size_list"], layers, side),
                 "glu": bool(s[f"{side}_glu"]), "weight_softmax": bool(s["weight_softmax"]),
                 "weight_dropout": float(s["weight_dropout"]), "input_dropout": float(s["input_dropout"]),
                 "bias": False, "conv_dim": int(s[f"{side}_conv_dim"]), "kernel_backend": "auto"}
        out = {"layers": layers, "heads": int(s[f"{side}_attention_heads"]), "ffn_dim": int(s[f"{side}_ffn_embed_dim"]),
               "normalize_before": bool(s[f"{side}_normalize_before"]), "activation": "relu",
               "activation_dropout": float(s["relu_dropout"]), "mixer": mixer}
        if side == "decoder":
            out.update(attention_dropout=float(s["attention_dropout"]), cross_attention_heads=out["heads"])
        return out

    def fairseq_settings(self, model: dict) -> tuple[str, dict]:
        self._check_heads(model)
        if not model.get("scale_embedding", True):
            _unsupported("scale_embedding=false (fairseq's lightconv always scales embeddings by sqrt(d))")
        s = self._common_settings(model)
        mixers = {}
        for side in ("encoder", "decoder"):
            if model[side].get("normalize_before") and not model[side].get("final_norm", True):
                _unsupported(f"a pre-norm {side} without its final LayerNorm (fairseq's lightconv always has it)")
            mixers[side] = _mixer_of(model[side])
            s.update(self.side_settings(side, model[side], model["embed_dim"]))
        s.update(
            weight_softmax=bool(_same_everywhere({k: m.get("weight_softmax", True) for k, m in mixers.items()},
                                                 "weight_softmax")),
            weight_dropout=float(_same_everywhere({k: m.get("weight_dropout", 0.0) for k, m in mixers.items()},
                                                  "weight_dropout")),
            input_dropout=float(_same_everywhere({k: m.get("input_dropout", 0.0) for k, m in mixers.items()},
                                                 "input_dropout")),
            relu_dropout=float(_same_everywhere({k: model[k].get("activation_dropout", 0.0) for k in mixers},
                                                "relu_dropout")),
            attention_dropout=float(model["decoder"].get("attention_dropout", 0.0)),
        )
        if len({m.get("weight_softmax", True) for m in mixers.values()}) > 1:
            _unsupported("weight_softmax differs between encoder and decoder (fairseq has one setting)")
        return "lightconv", s

    @classmethod
    def side_settings(cls, side: str, model_side: dict, embed_dim: int) -> dict:
        """fairseq's ``<side>_conv_type/kernel_size_list/glu/conv_dim`` of one seqmix stack's conv mixer."""
        mixer = _mixer_of(model_side)
        kinds = {v: k for k, v in cls.MIXERS.items()}
        if mixer.get("_target_") not in kinds:
            _unsupported(f"{side} mixer {mixer.get('_target_')} (fairseq's lightconv has LightConv and "
                         "DynamicConv layers only)")
        if model_side.get("activation", "relu") != "relu":
            _unsupported(f"{side} FFN activation {model_side['activation']} (fairseq's lightconv FFN is relu)")
        if mixer.get("bias", False):
            _unsupported(f"{side} conv with a bias (fairseq's lightconv layers have none)")
        layers = int(model_side["layers"])
        kernel = mixer.get("kernel_size")
        sizes = [int(kernel)] * layers if isinstance(kernel, int) else [int(k) for k in kernel][:layers]
        return {f"{side}_conv_type": kinds[mixer["_target_"]], f"{side}_kernel_size_list": sizes,
                f"{side}_glu": bool(mixer.get("glu", True)), f"{side}_conv_dim": int(mixer.get("conv_dim") or embed_dim)}

    def rules(self, s: dict) -> list[Rule]:
        rules = self._embedding_rules(s)
        for side in ("encoder", "decoder"):
            for i in range(int(s[f"{side}_layers"])):
                rules += _rules(self.layer_pairs(side, s, cross=side == "decoder"), f"{side}.layers.{i}.",
                                f"{side}.layers.{i}.")
        return rules

    @staticmethod
    def layer_pairs(side: str, s: dict, cross: bool) -> list[tuple[str, str]]:
        """(fairseq, seqmix) names inside one lightconv layer (a language model's: decoder, no cross)."""
        conv = ("conv.weight",) if s[f"{side}_conv_type"] == "lightweight" else ("conv.weight_linear.weight",)
        norms = [("layer_norms.0", "mixer_residual.norm"), ("layer_norms.1", "ffn_residual.norm")] \
            if side == "encoder" else [("conv_layer_norm", "mixer_residual.norm"), ("final_layer_norm",
                                                                                  "ffn_residual.norm")]
        if cross:
            norms.append(("encoder_attn_layer_norm", "cross_residual.norm"))
        pairs = _linear("linear1", "mixer.linear1") + [(c, f"mixer.{c}") for c in conv]
        pairs += _linear("linear2", "mixer.linear2")
        if cross:
            pairs += _attention("encoder_attn", "cross_attn")
        pairs += _linear("fc1", "ffn.fc1") + _linear("fc2", "ffn.fc2")
        return pairs + [pair for f, q in norms for pair in _norm(f, q)]

    def upgrade(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        state = self._sinusoidal_leftovers(_drop_buffers(_split_in_proj(state)), s)
        state = lightconv_main_names(state, tied=bool(s["share_all_embeddings"]
                                                      or s["share_decoder_input_output_embed"]))
        return {k: (v.unsqueeze(1) if k.endswith(".conv.weight") and v.dim() == 2 else v)  # the CUDA layer's (H, K)
                for k, v in state.items()}


# fairseq main's "make lightconv scriptable" (after v0.12.2) renamed the encoder layers' norms and saves the output
# as an nn.Linear; its scripted DynamicConv always holds a (1, 1, C) ``conv_bias`` that lightconv never adds (its
# layers build DynamicConv without conv_bias, so the tensor is uninitialised memory)
_MAIN_NORMS = {"layer_norm1": "layer_norms.0", "layer_norm2": "layer_norms.1"}


def lightconv_main_names(state: dict[str, Tensor], tied: bool, output: str = "decoder.embed_out",
                         embed: str = "decoder.embed_tokens.weight") -> dict[str, Tensor]:
    """A lightconv state dict in fairseq main's names rewritten in v0.12.2's (what the tables speak); one naming
    scheme per checkpoint: a mix is refused. ``output``/``embed``: the table's output and tied input names."""
    def norm(key: str) -> tuple[str, str | None]:
        parts = key.split(".")
        if parts[:2] != ["encoder", "layers"] or len(parts) < 5:
            return "", None
        if len(parts) == 5 and parts[3] in _MAIN_NORMS:
            return "main", ".".join([*parts[:3], _MAIN_NORMS[parts[3]], parts[4]])
        return ("0.12" if parts[3] == "layer_norms" else ""), None

    schemes = {norm(k)[0] for k in state} - {""}
    if output in state:
        schemes.add("0.12")
    if "decoder.output_projection.weight" in state:
        schemes.add("main")
    if len(schemes) > 1:
        raise SeqmixError("the lightconv checkpoint mixes fairseq v0.12 names (layer_norms.N, embed_out) with fairseq "
                          "main's (layer_norm1/2, output_projection): re-save it from one fairseq version")
    out = {}
    for key, value in state.items():
        renamed = norm(key)[1]
        if renamed is not None:
            key = renamed
        elif key.endswith(".conv.conv_bias"):
            continue
        elif key == "decoder.output_projection.weight":
            if tied:
                if embed in state and not torch.equal(value, state[embed]):
                    raise SeqmixError("the lightconv checkpoint shares its decoder's input and output embeddings but "
                                      "decoder.output_projection.weight differs from its embed_tokens: it is damaged "
                                      "or its settings are not the ones it was trained with")
                continue
            key = output
        out[key] = value
    return out


class FConvFamily(Family):
    """fairseq's ``fconv`` → seqmix's ConvS2S. Learned position tables line up row for row: fairseq's has
    ``max_positions`` rows with the first token at row ``padding_idx + 1``; seqmix's has ``max_positions +
    padding_idx + 1``, so seqmix's max_positions is fairseq's minus 2 (1022 for fairseq's default 1024, the same
    longest input fairseq takes). Longer inputs are refused by seqmix with a message, not clipped."""

    name = "fconv"

    def seqmix_config(self, arch: str, s: dict) -> dict:
        _check(not s.get("adaptive_softmax_cutoff"), "adaptive softmax (an fconv language model?)")
        _check(float(s.get("normalization_constant", 0.5)) == 0.5, "normalization_constant other than 0.5")
        enc_layers, dec_layers = self._layers(s["encoder_layers"]), self._layers(s["decoder_layers"])
        attention = eval_spec(s["decoder_attention"])
        attention = [bool(a) for a in attention] if isinstance(attention, (list, tuple)) \
            else [bool(attention)] * len(dec_layers)
        for side in ("source", "target"):
            _check(int(s[f"max_{side}_positions"]) > PADDING_IDX + 1, f"max_{side}_positions too small")
        return {
            "_target_": "seqmix.models.convs2s.ConvS2S", "_convert_": "all", "name": f"fairseq_{arch}",
            "dropout": float(s["dropout"]),
            "max_source_positions": int(s["max_source_positions"]) - PADDING_IDX - 1,
            "max_target_positions": int(s["max_target_positions"]) - PADDING_IDX - 1,
            "share_all_embeddings": False,
            "share_decoder_input_output_embed": bool(s["share_input_output_embed"]), "kernel_backend": "auto",
            "decoder_start": "eos",
            "encoder": {"embed_dim": int(s["encoder_embed_dim"]), "layers": enc_layers},
            "decoder": {"embed_dim": int(s["decoder_embed_dim"]), "out_embed_dim": int(s["decoder_out_embed_dim"]),
                        "attention": attention, "layers": dec_layers},
        }

    @staticmethod
    def _layers(spec) -> list[list[int]]:
        return [[int(v) for v in entry] for entry in eval_spec(spec)]

    def fairseq_settings(self, model: dict) -> tuple[str, dict]:
        if model.get("share_all_embeddings"):  # the same values in two tables: equal outputs, untied fine-tuning
            log.warning("fairseq's fconv has separate source and target embeddings: the shared table is written to "
                        "both (identical outputs; fairseq would train them apart)")
        dec = model["decoder"]
        attention = dec.get("attention", True)
        layers = dec["layers"]
        flags = [bool(attention)] * len(layers) if isinstance(attention, bool) else [bool(a) for a in attention]
        return "fconv", {
            "dropout": float(model.get("dropout", 0.1)),
            "encoder_embed_dim": model["encoder"]["embed_dim"], "decoder_embed_dim": dec["embed_dim"],
            "encoder_layers": repr([tuple(e) for e in model["encoder"]["layers"]]),
            "decoder_layers": repr([tuple(e) for e in layers]),
            "decoder_out_embed_dim": dec.get("out_embed_dim", dec["embed_dim"]), "decoder_attention": repr(flags),
            "share_input_output_embed": bool(model.get("share_decoder_input_output_embed", False)),
            "max_source_positions": int(model.get("max_source_positions", 1024)) + PADDING_IDX + 1,
            "max_target_positions": int(model.get("max_target_positions", 1024)) + PADDING_IDX + 1,
        }

    def rules(self, s: dict) -> list[Rule]:
        shared = bool(s["share_input_output_embed"])
        rules = [Rule(("encoder.embed_tokens.weight",), "encoder.embed_tokens.weight"),
                 Rule(("decoder.embed_tokens.weight",) + (("decoder.fc3.weight",) if shared else ()),
                      "decoder.embed_tokens.weight")]
        for side in ("encoder", "decoder"):
            specs = self._layers(s[f"{side}_layers"])
            pairs = [("embed_positions.weight", "embed_positions.weights.weight")]
            pairs += _weight_normed_linear("fc1", "fc1") + _weight_normed_linear("fc2", "fc2")
            widths = [specs[0][0]]
            attention = eval_spec(s.get("decoder_attention", "True"))
            for i, spec in enumerate(specs):
                lookback = spec[2] if len(spec) > 2 else 1
                if lookback and widths[-lookback] != spec[0]:
                    pairs += _weight_normed_linear(f"projections.{i}", f"blocks.{i}.projection")
                conv = f"{side}.blocks.{i}.conv.conv.parametrizations.weight"
                rules += [Rule((f"{side}.convolutions.{i}.weight_g",), f"{conv}.original0", CONV_TBC_GAIN),
                          Rule((f"{side}.convolutions.{i}.weight_v",), f"{conv}.original1", CONV_TBC)]
                pairs.append((f"convolutions.{i}.bias", f"blocks.{i}.conv.conv.bias"))
                attends = side == "decoder" and (attention[i] if isinstance(attention, (list, tuple)) else attention)
                if attends:
                    for proj in ("in_projection", "out_projection"):
                        pairs += _weight_normed_linear(f"attention.{i}.{proj}", f"blocks.{i}.attention.{proj}")
                widths.append(spec[0])
            rules += _rules(pairs, f"{side}.", f"{side}.")
        if shared:
            rules.append(Rule(("decoder.fc3.bias",), "output_bias"))
        else:
            rules += _rules(_weight_normed_linear("fc3", "output_projection"), "decoder.", "")
        return rules

    def upgrade(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        version = state.get("decoder.version")
        state = {k: v for k, v in state.items() if k != "decoder.version" and not k.endswith("_linearized_weight")}
        if version is None or float(version.flatten()[0]) < 2:
            state = self._renormalize_old_decoder(state)
        return self._weight_norm_restored(state, bool(s["share_input_output_embed"]))

    @staticmethod
    def _weight_norm_restored(state: dict[str, Tensor], shared_output: bool) -> dict[str, Tensor]:
        """A model saved after ``make_generation_fast_`` holds plain ``weight``s (weight norm removed): gain and
        direction again (gain = the weight's norm, direction = the weight), the same effective weights."""
        out = {}
        for key, value in state.items():
            name = key.rsplit(".", 1)[0]
            tied = shared_output and key == "decoder.fc3.weight"
            plain = key.endswith(".weight") and ".embed_" not in key and not tied
            if not plain or f"{name}.weight_g" in state:
                out[key] = value
                continue
            dims = (0, 1) if value.dim() == 3 else tuple(range(1, value.dim()))  # ConvTBC: per output; Linear: per row
            out[f"{name}.weight_g"] = value.double().norm(dim=dims, keepdim=True).to(value.dtype)
            out[f"{name}.weight_v"] = value
        return out

    @staticmethod
    def _renormalize_old_decoder(state: dict[str, Tensor]) -> dict[str, Tensor]:
        """fconv decoders saved before ``decoder.version`` 2 normalized their convolutions over (in, out) per kernel
        tap (weight norm dim 0: ``weight_g`` (K, 1, 1)); fairseq re-wraps them so on load. seqmix normalizes per
        output channel, so the effective weight is rebuilt (in float64) and re-expressed as gain and direction:
        the same weight up to float32 rounding, not bit for bit."""
        out = dict(state)
        for key in [k for k in state if k.startswith("decoder.convolutions.") and k.endswith(".weight_g")]:
            g, v = state[key].double(), state[key.replace("weight_g", "weight_v")].double()
            if g.dim() != 3 or g.shape[1:] != (1, 1) or g.shape[0] != v.shape[0]:
                continue  # not the old layout: the shape check of the table reports it
            weight = g * v / v.norm(dim=(1, 2), keepdim=True)
            out[key] = weight.norm(dim=(0, 1), keepdim=True).to(state[key].dtype)
            out[key.replace("weight_g", "weight_v")] = weight.to(state[key].dtype)
        return out

    def buffers(self, s: dict) -> dict[str, Tensor]:
        return {"decoder.version": torch.tensor([2.0])}


# --- language models ---------------------------------------------------------------------------------------------
SOFTMAX = "decoder.adaptive_softmax"
# fairseq's untied adaptive-softmax head is one (cutoff0 + clusters, d) matrix: seqmix's band-0 words and its cluster
# vectors; ``upgrade`` splits it under these two names, ``finish`` joins them again
HEAD_WORDS, HEAD_CLUSTERS = f"{SOFTMAX}.head.weight[words]", f"{SOFTMAX}.head.weight[clusters]"


def _cutoff_list(value) -> list[int]:
    """fairseq's cutoffs: ``"20000,60000"`` (a string it evaluates), a list, or None."""
    if value is None:
        return []
    spec = eval_spec(value) if isinstance(value, str) else value
    return [int(spec)] if isinstance(spec, int) else [int(c) for c in spec]


@dataclass(frozen=True)
class LanguageModelLayout:
    """The input and output of a fairseq language model, as seqmix's DecoderOnly builds them."""

    input_cutoffs: tuple[int, ...]  # () = a plain embedding
    softmax_cutoffs: tuple[int, ...]  # () = a plain output projection
    tied: bool  # the output reuses the input's vectors
    tie_projections: bool
    factor: float


class _LanguageModelFamily(Family):
    """fairseq's ``transformer_lm`` / ``lightconv_lm`` <-> seqmix's DecoderOnly: the decoder stack of the encoder-decoder
    family with the same layers (its layer table and mixer settings, shared), without cross-attention; a plain or
    adaptive input; a plain, tied or adaptive (tied or not, projections tied or not) softmax."""

    layers: _EncoderDecoderFamily
    arch: str
    version: float
    output_name: str  # the untied plain output projection as v0.12.2 saves it

    # --- settings ---
    def layout(self, s: dict) -> LanguageModelLayout:
        inputs = tuple(_cutoff_list(s.get("adaptive_input_cutoff"))) if s.get("adaptive_input") else ()
        _check(not s.get("adaptive_input") or inputs, "adaptive_input without adaptive_input_cutoff")
        softmax = tuple(_cutoff_list(s.get("adaptive_softmax_cutoff")))
        tied = bool(s.get("tie_adaptive_weights")) if softmax else bool(s.get("share_decoder_input_output_embed"))
        _check(not (tied and bool(inputs) != bool(softmax)), "a tied output with only one side adaptive")
        if inputs and softmax:
            _check(inputs == softmax, f"adaptive input cutoffs {list(inputs)} != adaptive softmax cutoffs "
                                      f"{list(softmax)} (seqmix's task.adaptive has one list)")
            _check(float(s["adaptive_input_factor"]) == float(s["adaptive_softmax_factor"]),
                   "adaptive_input_factor != adaptive_softmax_factor (seqmix's task.adaptive has one factor)")
        factor = float(s["adaptive_input_factor"] if inputs else s["adaptive_softmax_factor"])
        return LanguageModelLayout(inputs, softmax, tied, bool(s.get("tie_adaptive_proj")) or not (tied and softmax),
                                   factor)

    def settled(self, s: dict, vocab_size: int) -> dict:
        """``s`` with cutoff lists ending below the vocabulary (fairseq also takes a last cutoff equal to it)."""
        s = dict(s)
        for key in ("adaptive_input_cutoff", "adaptive_softmax_cutoff"):
            cuts = _cutoff_list(s.get(key))
            if cuts and cuts[-1] == vocab_size:
                cuts = cuts[:-1]
            s[key] = ",".join(map(str, cuts)) if cuts else None
        return s

    def final_norm(self, s: dict) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def seqmix_config(self, arch: str, s: dict) -> dict:
        d = int(s["decoder_embed_dim"])
        _check(int(s["decoder_input_dim"]) == d and int(s["decoder_output_dim"]) == d,
               "decoder_input_dim/decoder_output_dim differ from decoder_embed_dim (project_in/out_dim)")
        for flag in ("character_embeddings", "layernorm_embedding", "no_token_positional_embeddings",
                     "decoder_layers_to_keep", "scale_attn", "scale_fc", "scale_heads", "scale_resids"):
            _check(not s.get(flag), flag)
        self.layout(s)  # refuses what seqmix's adaptive options cannot express
        decoder = self.layers._side("decoder", s)
        for key in ("attention_dropout", "cross_attention_heads"):
            decoder.pop(key, None)
        decoder["final_norm"] = self.final_norm(s)
        positions = int(s.get("max_target_positions") or 1024)
        return {"_target_": "seqmix.models.EncoderDecoder", "_convert_": "all", "name": f"fairseq_{arch}",
                "embed_dim": d, "dropout": float(s["dropout"]),
                "positions": "learned" if s["decoder_learned_pos"] else "sinusoidal",
                "scale_embedding": not s.get("no_scale_embedding", False), "max_source_positions": positions,
                "max_target_positions": positions, "share_all_embeddings": False,
                "share_decoder_input_output_embed": self.layout(s).tied, "decoder_start": "eos", "decoder": decoder}

    def adaptive_config(self, s: dict) -> dict:
        """seqmix's ``task.adaptive`` for complete fairseq settings ``s`` (fairseq projects every band)."""
        layout = self.layout(s)
        return {"cutoffs": list(layout.input_cutoffs or layout.softmax_cutoffs), "factor": layout.factor,
                "input": bool(layout.input_cutoffs), "softmax": bool(layout.softmax_cutoffs),
                "softmax_dropout": float(s.get("adaptive_softmax_dropout") or 0.0), "project_all_bands": True,
                "tie_projections": layout.tie_projections}

    def fairseq_settings(self, model: dict, adaptive: dict | None = None) -> tuple[str, dict]:
        adaptive = {"cutoffs": [], "factor": 4.0, "input": False, "softmax": False, "softmax_dropout": 0.0,
                    "tie_projections": True, **(adaptive or {})}
        dec, d = model["decoder"], int(model["embed_dim"])
        heads = _mixer_of(dec).get("num_heads")
        if heads is not None and heads != dec["heads"]:
            _unsupported(f"the decoder mixer's num_heads {heads} != decoder heads {dec['heads']}")
        cutoffs = ",".join(str(int(c)) for c in adaptive["cutoffs"]) or None
        inputs, softmax = bool(adaptive["input"] and cutoffs), bool(adaptive["softmax"] and cutoffs)
        tied = bool(model.get("share_decoder_input_output_embed", True))
        positions = int(model.get("max_target_positions", 1024))
        s = {"decoder_embed_dim": d, "decoder_input_dim": d, "decoder_output_dim": d,
             "decoder_layers": int(dec["layers"]), "decoder_attention_heads": int(dec["heads"]),
             "decoder_ffn_embed_dim": int(dec["ffn_dim"]), "decoder_normalize_before": True,
             "decoder_learned_pos": model.get("positions", "sinusoidal") == "learned",
             "no_token_positional_embeddings": False, "dropout": float(model.get("dropout", 0.1)),
             "max_target_positions": positions, "tokens_per_sample": positions, "character_embeddings": False,
             "share_decoder_input_output_embed": tied and not softmax, "adaptive_input": inputs,
             "adaptive_input_cutoff": cutoffs if inputs else None, "adaptive_input_factor": float(adaptive["factor"]),
             "adaptive_softmax_cutoff": cutoffs if softmax else None,
             "adaptive_softmax_factor": float(adaptive["factor"]),
             "adaptive_softmax_dropout": float(adaptive["softmax_dropout"]), "tie_adaptive_weights": tied and softmax,
             "tie_adaptive_proj": bool(adaptive["tie_projections"])}
        s.update(self._layer_settings(model, dec))
        return self.arch, s

    def _layer_settings(self, model: dict, dec: dict) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    # --- tensors ---
    def rules(self, s: dict) -> list[Rule]:
        layout = self.layout(s)
        rules = self._input_rules(layout) + self._output_rules(layout)
        if s["decoder_learned_pos"]:
            rules.append(Rule(("decoder.embed_positions.weight",), "decoder.embed_positions.weights.weight"))
        for i in range(int(s["decoder_layers"])):
            rules += _rules(self.layers.layer_pairs("decoder", s, cross=False), f"decoder.layers.{i}.",
                            f"decoder.layers.{i}.")
        if self.final_norm(s):
            rules += _rules(_norm("layer_norm", "layer_norm"), "decoder.", "decoder.")
        return rules

    def _input_rules(self, layout: LanguageModelLayout) -> list[Rule]:
        """The input's tensors, under the tied softmax's names too (fairseq saves tied weights under each name;
        a tied seqmix model holds the same bands as ``decoder.embed_tokens`` and ``output``)."""
        owners = ["decoder.embed_tokens", *(["output"] if layout.tied else [])]
        if not layout.input_cutoffs:
            names = ("decoder.embed_tokens.weight",) + ((self.output_name,) if layout.tied and
                                                         self.tied_output_saved else ())
            return [Rule(names, f"{owner}.bands.0.embed.weight") for owner in owners]
        rules = []
        for i in range(len(layout.input_cutoffs) + 1):
            embed, proj = (f"decoder.embed_tokens.embeddings.{i}.0.weight",), (f"decoder.embed_tokens.embeddings.{i}.1.weight",)
            if layout.tied:
                embed += (f"{SOFTMAX}.head.word_proj.weight",) if i == 0 else (f"{SOFTMAX}.tail.{i - 1}.2.weight",)
                if i > 0 and layout.tie_projections:
                    proj += (f"{SOFTMAX}.tail.{i - 1}.0.weight",)
            for owner in owners:
                rules += [Rule(embed, f"{owner}.bands.{i}.embed.weight"), Rule(proj, f"{owner}.bands.{i}.proj.weight")]
        return rules

    def _output_rules(self, layout: LanguageModelLayout) -> list[Rule]:
        if not layout.softmax_cutoffs:
            return [] if layout.tied else [Rule((self.output_name,), "output.bands.0.embed.weight")]
        tails = range(1, len(layout.softmax_cutoffs) + 1)
        if layout.tied:
            rules = [Rule((f"{SOFTMAX}.head.class_proj.weight",), "output.cluster.weight")]
            if not layout.tie_projections:
                rules += [Rule((f"{SOFTMAX}.tail.{i - 1}.0.weight",), f"output.tail_proj.{i - 1}.weight", TRANSPOSE)
                          for i in tails]
            return rules
        rules = [Rule((HEAD_WORDS,), "output.bands.0.embed.weight"), Rule((HEAD_CLUSTERS,), "output.cluster.weight")]
        for i in tails:
            rules += [Rule((f"{SOFTMAX}.tail.{i - 1}.0.weight",), f"output.bands.{i}.proj.weight", TRANSPOSE),
                      Rule((f"{SOFTMAX}.tail.{i - 1}.2.weight",), f"output.bands.{i}.embed.weight")]
        return rules

    tied_output_saved: bool

    def upgrade(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        layout = self.layout(s)
        buffers = ("decoder.version", "decoder.embed_tokens._float_tensor", f"{SOFTMAX}.version",
                   f"{SOFTMAX}.head._float_tensor", "decoder.embed_positions._float_tensor")
        state = {k: v for k, v in _split_in_proj(state).items()
                 if k not in buffers and not (k == "decoder.embed_positions.weights" and not s["decoder_learned_pos"])}
        state = self._output_names(state, layout)
        head = state.pop(f"{SOFTMAX}.head.weight", None)
        if head is not None and not layout.tied and head.shape[0] > layout.softmax_cutoffs[0]:
            state[HEAD_WORDS], state[HEAD_CLUSTERS] = head[: layout.softmax_cutoffs[0]], head[layout.softmax_cutoffs[0]:]
        elif head is not None:
            state[f"{SOFTMAX}.head.weight"] = head  # reported as unexpected
        return state

    def _output_names(self, state: dict[str, Tensor], layout: LanguageModelLayout) -> dict[str, Tensor]:
        return state

    def finish(self, state: dict[str, Tensor], s: dict) -> dict[str, Tensor]:
        if HEAD_WORDS in state:
            state = dict(state)
            state[f"{SOFTMAX}.head.weight"] = torch.cat([state.pop(HEAD_WORDS), state.pop(HEAD_CLUSTERS)])
        return state

    def buffers(self, s: dict) -> dict[str, Tensor]:
        layout = self.layout(s)
        out = {"decoder.version": torch.tensor([self.version])}
        if not s["decoder_learned_pos"]:
            out["decoder.embed_positions._float_tensor"] = torch.zeros(1)
        if layout.input_cutoffs:
            out["decoder.embed_tokens._float_tensor"] = torch.zeros(1)
        if layout.softmax_cutoffs:
            out[f"{SOFTMAX}.version"] = torch.tensor([1])
            if layout.tied:
                out[f"{SOFTMAX}.head._float_tensor"] = torch.zeros(1)
        return out


class TransformerLMFamily(_LanguageModelFamily):
    name = arch = "transformer_lm"
    version = 3.0
    output_name = "decoder.output_projection.weight"
    tied_output_saved = True

    def __init__(self) -> None:
        self.layers = TransformerFamily()

    def final_norm(self, s: dict) -> bool:
        return not s.get("no_decoder_final_norm", False)

    def seqmix_config(self, arch: str, s: dict) -> dict:
        _check(s["activation_fn"] in TransformerFamily.ACTIVATIONS,
               f"activation_fn {s['activation_fn']!r} (seqmix has relu, gelu (exact), swish)")
        return super().seqmix_config(arch, s)

    def _layer_settings(self, model: dict, dec: dict) -> dict:
        TransformerFamily.check_side("decoder", dec)
        if not dec.get("normalize_before", False):
            _unsupported("a post-norm language model (fairseq's transformer_lm is always pre-norm)")
        return {"activation_fn": dec.get("activation", "relu"), "no_scale_embedding": not model.get("scale_embedding", True),
                "attention_dropout": float(_mixer_of(dec).get("attention_dropout", 0.0)),
                "activation_dropout": float(dec.get("activation_dropout", 0.0)), "relu_dropout": 0.0,
                "no_decoder_final_norm": not dec.get("final_norm", True), "layernorm_embedding": False,
                "decoder_layers_to_keep": None, "decoder_layerdrop": 0.0, "quant_noise_pq": 0.0}

    def _output_names(self, state: dict[str, Tensor], layout: LanguageModelLayout) -> dict[str, Tensor]:
        if "decoder.embed_out" in state:  # fairseq <= 0.9
            state[self.output_name] = state.pop("decoder.embed_out")
        if layout.tied and not layout.input_cutoffs and self.output_name not in state \
                and "decoder.embed_tokens.weight" in state:
            state[self.output_name] = state["decoder.embed_tokens.weight"]
        return state


class LightConvLMFamily(_LanguageModelFamily):
    """fairseq's lightconv_lm: pre-norm lightconv decoder blocks and never a final LayerNorm."""

    name = arch = "lightconv_lm"
    version = 2.0
    output_name = "decoder.embed_out"
    tied_output_saved = False

    def __init__(self) -> None:
        self.layers = LightConvFamily()

    def final_norm(self, s: dict) -> bool:
        return False

    def _layer_settings(self, model: dict, dec: dict) -> dict:
        if dec.get("final_norm", True):
            _unsupported("a final LayerNorm (fairseq's lightconv_lm has none: train with model.decoder.final_norm=false)")
        if not model.get("scale_embedding", True):
            _unsupported("scale_embedding=false (fairseq's lightconv always scales embeddings by sqrt(d))")
        mixer = _mixer_of(dec)
        return {**LightConvFamily.side_settings("decoder", dec, int(model["embed_dim"])),
                "weight_softmax": bool(mixer.get("weight_softmax", True)),
                "weight_dropout": float(mixer.get("weight_dropout", 0.0)),
                "input_dropout": float(mixer.get("input_dropout", 0.0)),
                "relu_dropout": float(dec.get("activation_dropout", 0.0)), "attention_dropout": 0.0}

    def _output_names(self, state: dict[str, Tensor], layout: LanguageModelLayout) -> dict[str, Tensor]:
        if not layout.softmax_cutoffs:  # fairseq main: output_projection (tied too); v0.12: embed_out
            state = lightconv_main_names(state, tied=layout.tied)
        state = {k: v for k, v in state.items() if not k.endswith(".conv.conv_bias")}
        return {k: (v.unsqueeze(1) if k.endswith(".conv.weight") and v.dim() == 2 else v) for k, v in state.items()}


class TaLKFamily(LightConvFamily):
    """The official TaLK code's ``talkconv`` (its fairseq plug-in, github.com/lioutasb/TaLKConvolutions): lightconv's
    layout with a ``TaLKConv`` whose ``offsets`` Linear predicts the window extents (sigmoid; encoder: H left then H
    right, l_max = r_max = the layer's kernel size; decoder: H left, r_max = 0) and a Swish FFN. Its CUDA kernels
    compute seqmix's TaLK: S = cumsum(x / (l_max + r_max + 1)), y_t = S at a_r minus S at a_l - 1, both read by
    linear interpolation, a_l = clamp(t - sigma_l * l_max, 0, T - 1), a_r = clamp(t + sigma_r * r_max, 0, T - 1)."""

    name = "talkconv"

    def _side(self, side: str, s: dict) -> dict:
        layers = int(s[f"{side}_layers"])
        mixer = {"_target_": "seqmix.mixers.TaLK", "_partial_": True,
                 "kernel_size": kernel_list(s[f"{side}_kernel_size_list"], layers, side),
                 "glu": bool(s[f"{side}_glu"]), "offset_dropout": float(s["weight_dropout"]),
                 "input_dropout": float(s["input_dropout"]), "conv_dim": int(s[f"{side}_conv_dim"]),
                 "kernel_backend": "auto", "output_normalization": True}
        out = {"layers": layers, "heads": int(s[f"{side}_attention_heads"]), "ffn_dim": int(s[f"{side}_ffn_embed_dim"]),
               "normalize_before": bool(s[f"{side}_normalize_before"]), "activation": "swish",
               "activation_dropout": float(s["relu_dropout"]), "mixer": mixer}
        if side == "decoder":
            out.update(attention_dropout=float(s["attention_dropout"]), cross_attention_heads=out["heads"])
        return out

    @classmethod
    def side_settings(cls, side: str, model_side: dict, embed_dim: int) -> dict:
        mixer = _mixer_of(model_side)
        if mixer.get("_target_") != "seqmix.mixers.TaLK":
            _unsupported(f"{side} mixer {mixer.get('_target_')} (the TaLK code's models have TaLK layers only)")
        if model_side.get("activation", "relu") != "swish":
            _unsupported(f"{side} FFN activation {model_side.get('activation', 'relu')} (TaLK's FFN is swish)")
        if not mixer.get("output_normalization", True):
            _unsupported("TaLK without output normalization")
        layers = int(model_side["layers"])
        kernel, right = mixer.get("kernel_size"), mixer.get("right_kernel_size")
        sizes = [int(kernel)] * layers if isinstance(kernel, int) else [int(k) for k in kernel][:layers]
        if right is not None and side == "encoder":
            rights = [int(right)] * layers if isinstance(right, int) else [int(k) for k in right][:layers]
            if rights != sizes:
                _unsupported("right_kernel_size apart from kernel_size (the TaLK code's encoder uses one list)")
        return {f"{side}_kernel_size_list": sizes, f"{side}_glu": bool(mixer.get("glu", True)),
                f"{side}_conv_dim": int(mixer.get("conv_dim") or embed_dim)}

    def fairseq_settings(self, model: dict) -> tuple[str, dict]:
        self._check_heads(model)
        if not model.get("scale_embedding", True):
            _unsupported("scale_embedding=false (the TaLK code always scales embeddings by sqrt(d))")
        s = self._common_settings(model)
        for side in ("encoder", "decoder"):
            if model[side].get("normalize_before") and not model[side].get("final_norm", True):
                _unsupported(f"a pre-norm {side} without its final LayerNorm")
            s.update(self.side_settings(side, model[side], model["embed_dim"]))
        mixers = {side: _mixer_of(model[side]) for side in ("encoder", "decoder")}
        s.update(
            weight_dropout=float(_same_everywhere({k: m.get("offset_dropout", 0.0) for k, m in mixers.items()},
                                                  "weight_dropout")),
            input_dropout=float(_same_everywhere({k: m.get("input_dropout", 0.0) for k, m in mixers.items()},
                                                 "input_dropout")),
            relu_dropout=float(_same_everywhere({k: model[k].get("activation_dropout", 0.0) for k in mixers},
                                                "relu_dropout")),
            attention_dropout=float(model["decoder"].get("attention_dropout", 0.0)),
        )
        return "talkconv", s

    @staticmethod
    def layer_pairs(side: str, s: dict, cross: bool) -> list[tuple[str, str]]:
        """lightconv's layer names with the TaLK layer's ``conv.offsets`` in place of the conv weights."""
        norms = [("layer_norms.0", "mixer_residual.norm"), ("layer_norms.1", "ffn_residual.norm")] \
            if side == "encoder" else [("conv_layer_norm", "mixer_residual.norm"), ("final_layer_norm",
                                                                                  "ffn_residual.norm")]
        if cross:
            norms.append(("encoder_attn_layer_norm", "cross_residual.norm"))
        pairs = _linear("linear1", "mixer.linear1") + _linear("conv.offsets", "mixer.offset_proj")
        pairs += _linear("linear2", "mixer.linear2")
        if cross:
            pairs += _attention("encoder_attn", "cross_attn")
        pairs += _linear("fc1", "ffn.fc1") + _linear("fc2", "ffn.fc2")
        return pairs + [pair for f, q in norms for pair in _norm(f, q)]


class TaLKLMFamily(LightConvLMFamily):
    """The official TaLK code's ``talkconv_lm``: lightconv_lm's input, output and block layout (no final LayerNorm),
    TaLK layers."""

    name = arch = "talkconv_lm"

    def __init__(self) -> None:
        self.layers = TaLKFamily()

    def _layer_settings(self, model: dict, dec: dict) -> dict:
        if dec.get("final_norm", True):
            _unsupported("a final LayerNorm (talkconv_lm has none: train with model.decoder.final_norm=false)")
        if not model.get("scale_embedding", True):
            _unsupported("scale_embedding=false (talkconv_lm always scales embeddings by sqrt(d))")
        mixer = _mixer_of(dec)
        return {**TaLKFamily.side_settings("decoder", dec, int(model["embed_dim"])),
                "weight_dropout": float(mixer.get("offset_dropout", 0.0)),
                "input_dropout": float(mixer.get("input_dropout", 0.0)),
                "relu_dropout": float(dec.get("activation_dropout", 0.0)), "attention_dropout": 0.0}


FAMILIES: dict[str, Family] = {f.name: f for f in (TransformerFamily(), LightConvFamily(), FConvFamily(), TaLKFamily(),
                                                   TransformerLMFamily(), LightConvLMFamily(), TaLKLMFamily())}
LANGUAGE_MODELS = ("transformer_lm", "lightconv_lm", "talkconv_lm")

# seqmix model config target -> the family that exports it
EXPORTERS = {"seqmix.models.convs2s.ConvS2S": "fconv"}


def family_for_seqmix(model: dict) -> Family:
    """The fairseq family a seqmix model config exports to (by its backbone and mixers)."""
    target = model.get("_target_")
    if target in EXPORTERS:
        return FAMILIES[EXPORTERS[target]]
    if target not in ("seqmix.models.EncoderDecoder", "seqmix.models.encoder_decoder.EncoderDecoder"):
        raise SeqmixError(f"cannot export to fairseq: model {model.get('name')} ({target}) has no fairseq counterpart "
                          "(transformer, lightconv/dynamicconv, TaLK and ConvS2S models do)")
    mixer = _mixer_of(model["encoder"])
    return FAMILIES[{"seqmix.mixers.SelfAttention": "transformer",
                     "seqmix.mixers.TaLK": "talkconv"}.get(mixer.get("_target_"), "lightconv")]


# --- walking the table -----------------------------------------------------------------------------------------
def _shown(problems: list[str]) -> str:
    return "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")


def to_seqmix_state(family: Family, settings: dict, fairseq_state: dict[str, Tensor],
                    expected: dict[str, Tensor]) -> dict[str, Tensor]:
    """fairseq tensors (float16/bfloat16 cast to float32) renamed and reshaped for the seqmix model whose
    ``state_dict()`` is ``expected``. Every tensor must be used, every seqmix tensor filled, every shape right."""
    state = {k: (v.float() if v.is_floating_point() and v.dtype in (torch.float16, torch.bfloat16) else v)
             for k, v in family.upgrade(fairseq_state, settings).items()}
    rules = family.rules(settings)
    missing = sorted({n for r in rules for n in r.fairseq if n not in state})
    used = {n for r in rules for n in r.fairseq}
    extra = sorted(k for k in state if k not in used)
    if missing or extra:
        problems = [f"missing {n}" for n in missing] + [f"unexpected {n}" for n in extra]
        raise SeqmixError(f"the fairseq checkpoint does not fit its own {family.name} settings ({_shown(problems)}); "
                          "nothing was imported")
    out, problems = {}, []
    for rule in rules:
        tensor = state[rule.fairseq[0]]
        for alias in rule.fairseq[1:]:
            if not torch.equal(state[alias], tensor):
                problems.append(f"{alias} should be tied to {rule.fairseq[0]} but differs")
        converted = rule.reshape.to_seqmix(tensor) if tensor.dim() == expected_dims(rule, expected) else tensor
        want = expected.get(rule.seqmix)
        if want is None:
            problems.append(f"{rule.fairseq[0]} has no seqmix counterpart {rule.seqmix}")
        elif converted.shape != want.shape:
            problems.append(f"{rule.fairseq[0]}: shape {tuple(tensor.shape)} does not fit seqmix's "
                            f"{rule.seqmix} {tuple(want.shape)} ({rule.reshape.what})")
        out[rule.seqmix] = converted
    problems += [f"nothing fills {k}" for k in expected if k not in out]
    if problems:
        raise SeqmixError(f"cannot import the fairseq checkpoint: {_shown(problems)}; nothing was imported")
    return out


def expected_dims(rule: Rule, expected: dict[str, Tensor]) -> int:
    """The rank a reshape applies to (a tensor of another rank is reported as a shape mismatch, not reshaped)."""
    want = expected.get(rule.seqmix)
    return -1 if want is None else want.dim()


def to_fairseq_state(family: Family, settings: dict, seqmix_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The fairseq state dict (float32, fairseq's names and layouts, its buffers) of a seqmix model's weights."""
    out = {}
    for rule in family.rules(settings):
        if rule.seqmix not in seqmix_state:
            raise SeqmixError(f"cannot export: the seqmix model has no {rule.seqmix} (its config and weights differ)")
        tensor = rule.reshape.to_fairseq(seqmix_state[rule.seqmix].detach().float().cpu())
        for name in rule.fairseq:  # tied: one tensor under every name, as fairseq's own state_dict()
            out[name] = tensor
    unused = sorted(set(seqmix_state) - {r.seqmix for r in family.rules(settings)})
    if unused:
        raise SeqmixError(f"cannot export: fairseq's {family.name} has no place for {_shown(unused)}")
    out = family.finish(out, settings)
    out.update(family.buffers(settings))
    return out
