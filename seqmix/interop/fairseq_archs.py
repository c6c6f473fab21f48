"""fairseq's registered translation and language-model architectures and their defaults, so an imported checkpoint's settings are
complete even when its ``args``/``cfg`` only holds what differed from them (old checkpoints, ``--arch`` presets).

Each architecture is a list of settings applied in order, a value only where the checkpoint lacks it: the
architecture's own values first, then its parent's, then the family's base (fairseq's ``base_architecture``
functions read ``getattr(args, name, default)`` the same way). Derived defaults (decoder width = encoder width, conv
width = embedding width, ...) are filled last, from the then complete settings. Values were read from fairseq's
``fairseq/models/transformer_legacy.py``, ``lightconv.py`` and ``fconv.py`` of fairseq v0.12.2; the lightconv conv
types and ``weight_softmax`` come from its argparse defaults, not its architectures.
"""

from __future__ import annotations

import ast
import operator

from seqmix.errors import SeqmixError

TRANSFORMER_BASE = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6, "encoder_attention_heads": 8,
    "encoder_normalize_before": False, "encoder_learned_pos": False, "decoder_layers": 6,
    "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "relu_dropout": 0.0, "activation_fn": "relu", "dropout": 0.1,
    "adaptive_softmax_cutoff": None, "share_decoder_input_output_embed": False, "share_all_embeddings": False,
    "no_token_positional_embeddings": False, "adaptive_input": False, "no_cross_attention": False,
    "cross_self_attention": False, "no_scale_embedding": False, "layernorm_embedding": False,
    "tie_adaptive_weights": False, "no_decoder_final_norm": False, "max_source_positions": 1024,
    "max_target_positions": 1024,
}
_VASWANI_BIG = {"encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096, "encoder_attention_heads": 16,
                "encoder_normalize_before": False, "decoder_embed_dim": 1024, "decoder_ffn_embed_dim": 4096,
                "decoder_attention_heads": 16, "dropout": 0.3}

LIGHTCONV_BASE = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 7, "encoder_attention_heads": 8,
    "encoder_normalize_before": False, "encoder_learned_pos": False, "decoder_layers": 6,
    "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
    "attention_dropout": 0.0, "relu_dropout": 0.0, "dropout": 0.1, "adaptive_softmax_cutoff": None,
    "share_decoder_input_output_embed": False, "share_all_embeddings": False,
    "no_token_positional_embeddings": False, "encoder_kernel_size_list": [3, 7, 15, 31, 31, 31, 31],
    "decoder_kernel_size_list": [3, 7, 15, 31, 31, 31], "encoder_glu": True, "decoder_glu": True,
    "input_dropout": 0.1, "encoder_conv_type": "dynamic", "decoder_conv_type": "dynamic", "weight_softmax": True,
    "max_source_positions": 1024, "max_target_positions": 1024,
}
_LIGHTCONV_BIG = {"attention_dropout": 0.1, "encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096,
                  "encoder_attention_heads": 16, "encoder_normalize_before": False, "decoder_embed_dim": 1024,
                  "decoder_ffn_embed_dim": 4096, "decoder_attention_heads": 16, "dropout": 0.3}

FCONV_BASE = {
    "dropout": 0.1, "encoder_embed_dim": 512, "encoder_layers": "[(512, 3)] * 20", "decoder_embed_dim": 512,
    "decoder_layers": "[(512, 3)] * 20", "decoder_out_embed_dim": 256, "decoder_attention": "True",
    "share_input_output_embed": False, "max_source_positions": 1024, "max_target_positions": 1024,
}

# language models (fairseq's transformer_lm.py and lightconv_lm.py of v0.12.2; both force decoder_normalize_before)
TRANSFORMER_LM_BASE = {
    "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "relu_dropout": 0.0,
    "decoder_embed_dim": 512, "decoder_ffn_embed_dim": 2048, "decoder_layers": 6, "decoder_attention_heads": 8,
    "adaptive_softmax_cutoff": None, "adaptive_softmax_dropout": 0.0, "adaptive_softmax_factor": 4,
    "decoder_learned_pos": False, "activation_fn": "relu", "decoder_layers_to_keep": None,
    "no_token_positional_embeddings": False, "share_decoder_input_output_embed": False,
    "character_embeddings": False, "no_decoder_final_norm": False, "adaptive_input": False,
    "adaptive_input_factor": 4, "adaptive_input_cutoff": None, "tie_adaptive_weights": False,
    "tie_adaptive_proj": False, "no_scale_embedding": False, "layernorm_embedding": False,
}
_LM_BIG = {"decoder_layers": 12, "decoder_embed_dim": 1024, "decoder_ffn_embed_dim": 4096,
           "decoder_attention_heads": 16}
_GPT = {"dropout": 0.1, "attention_dropout": 0.1, "activation_fn": "gelu"}
LIGHTCONV_LM_BASE = {
    "dropout": 0.1, "attention_dropout": 0.0, "relu_dropout": 0.0, "decoder_embed_dim": 512,
    "decoder_ffn_embed_dim": 2048, "decoder_layers": 6, "decoder_attention_heads": 8, "adaptive_softmax_cutoff": None,
    "adaptive_softmax_dropout": 0.0, "adaptive_softmax_factor": 4, "decoder_learned_pos": False,
    "no_token_positional_embeddings": False, "share_decoder_input_output_embed": False,
    "character_embeddings": False, "adaptive_input": False, "adaptive_input_factor": 4, "adaptive_input_cutoff": None,
    "tie_adaptive_weights": False, "tie_adaptive_proj": False, "decoder_kernel_size_list": [3, 7, 15, 31, 31, 31],
    "decoder_glu": True, "input_dropout": 0.1, "decoder_conv_type": "dynamic", "weight_softmax": True,
}
# the official TaLK code's translation models (github.com/lioutasb/TaLKConvolutions, talkconv/talkconv_fairseq/
# talkconv.py): lightconv's layout, kernel lists are the maximum offsets
TALKCONV_BASE = {k: v for k, v in LIGHTCONV_BASE.items() if k not in ("encoder_conv_type", "decoder_conv_type",
                                                                       "weight_softmax")}
TALKCONV_BASE.update(encoder_kernel_size_list=[1, 3, 7, 15, 15, 15, 15], decoder_kernel_size_list=[1, 3, 7, 15, 15, 15])
_TALKCONV_BIG = {"attention_dropout": 0.1, "encoder_layers": 7, "encoder_embed_dim": 1024, "encoder_ffn_embed_dim": 4096,
                 "encoder_attention_heads": 16, "encoder_normalize_before": False, "decoder_layers": 6,
                 "decoder_embed_dim": 1024, "decoder_ffn_embed_dim": 4096, "decoder_attention_heads": 16,
                 "decoder_normalize_before": False, "dropout": 0.3, "encoder_kernel_size_list": [3, 7, 15, 31, 31, 31, 31],
                 "decoder_kernel_size_list": [3, 7, 15, 31, 31, 31]}
_TALKCONV_CNNDM = {"encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_attention_heads": 8,
                   "encoder_layers": 7, "decoder_embed_dim": 512, "decoder_ffn_embed_dim": 2048,
                   "decoder_attention_heads": 6, "decoder_layers": 6, "attention_dropout": 0.1, "dropout": 0.3,
                   "encoder_kernel_size_list": [3, 7, 15, 31, 31, 31, 31],
                   "decoder_kernel_size_list": [3, 7, 15, 31, 31, 31]}

# the official TaLK code's language model (github.com/lioutasb/TaLKConvolutions, talkconv/talkconv_fairseq/
# talkconv_lm.py): lightconv_lm's layout with TaLK layers (conv.offsets) and a Swish FFN
TALKCONV_LM_BASE = {**LIGHTCONV_LM_BASE, "decoder_conv_type": "talk"}
LANGUAGE_MODEL_FAMILIES = ("transformer_lm", "lightconv_lm", "talkconv_lm")

# architecture name -> (family, settings in the order they apply; the family's base comes last)
ARCHITECTURES: dict[str, tuple[str, list[dict]]] = {
    "transformer": ("transformer", []),
    "transformer_wmt_en_de": ("transformer", []),
    "transformer_tiny": ("transformer", [{"encoder_embed_dim": 64, "encoder_ffn_embed_dim": 64, "encoder_layers": 2,
                                          "encoder_attention_heads": 2, "decoder_layers": 2,
                                          "decoder_attention_heads": 2}]),
    "transformer_iwslt_de_en": ("transformer", [{
        "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4, "encoder_layers": 6,
        "decoder_embed_dim": 512, "decoder_ffn_embed_dim": 1024, "decoder_attention_heads": 4, "decoder_layers": 6}]),
    "transformer_vaswani_wmt_en_de_big": ("transformer", [_VASWANI_BIG]),
    "transformer_vaswani_wmt_en_fr_big": ("transformer", [{"dropout": 0.1}, _VASWANI_BIG]),
    "transformer_wmt_en_de_big": ("transformer", [{"attention_dropout": 0.1}, _VASWANI_BIG]),
    "transformer_wmt_en_de_big_t2t": ("transformer", [{
        "encoder_normalize_before": True, "decoder_normalize_before": True, "attention_dropout": 0.1,
        "activation_dropout": 0.1}, _VASWANI_BIG]),
    "lightconv": ("lightconv", []),
    "lightconv_wmt_en_de": ("lightconv", []),
    "lightconv_iwslt_de_en": ("lightconv", [{
        "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4, "encoder_layers": 7,
        "decoder_embed_dim": 512, "decoder_ffn_embed_dim": 1024, "decoder_attention_heads": 4, "decoder_layers": 6,
        "attention_dropout": 0.1, "weight_dropout": 0.1, "encoder_glu": False, "decoder_glu": False,
        "input_dropout": 0.0}]),
    "lightconv_wmt_en_de_big": ("lightconv", [_LIGHTCONV_BIG]),
    "lightconv_wmt_en_fr_big": ("lightconv", [{"dropout": 0.1}, _LIGHTCONV_BIG]),
    "lightconv_wmt_zh_en_big": ("lightconv", [{"dropout": 0.2, "attention_dropout": 0.2, "weight_dropout": 0.2},
                                              _LIGHTCONV_BIG]),
    "fconv": ("fconv", []),
    "fconv_wmt_en_ro": ("fconv", [{"decoder_out_embed_dim": 512}]),
    "fconv_iwslt_de_en": ("fconv", [{"encoder_embed_dim": 256, "encoder_layers": "[(256, 3)] * 4",
                                     "decoder_embed_dim": 256, "decoder_layers": "[(256, 3)] * 3",
                                     "decoder_out_embed_dim": 256}]),
    "fconv_wmt_en_de": ("fconv", [{
        "encoder_embed_dim": 768, "encoder_layers": "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        "decoder_embed_dim": 768, "decoder_layers": "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2",
        "decoder_out_embed_dim": 512}]),
    "fconv_wmt_en_fr": ("fconv", [{
        "encoder_embed_dim": 768,
        "encoder_layers": "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1",
        "decoder_embed_dim": 768,
        "decoder_layers": "[(512, 3)] * 6 + [(768, 3)] * 4 + [(1024, 3)] * 3 + [(2048, 1)] * 1 + [(4096, 1)] * 1",
        "decoder_out_embed_dim": 512}]),
    "transformer_lm": ("transformer_lm", []),
    "transformer_lm_big": ("transformer_lm", [_LM_BIG]),
    **{name: ("transformer_lm", [{
        "decoder_layers": 16, "decoder_attention_heads": 8, "dropout": 0.3, "adaptive_input": True,
        "tie_adaptive_weights": True, "adaptive_input_cutoff": "20000,60000", "adaptive_softmax_cutoff": "20000,60000",
        "adaptive_softmax_dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.1,
        "no_decoder_final_norm": True, "tie_adaptive_proj": True}, _LM_BIG])
       for name in ("transformer_lm_wiki103", "transformer_lm_baevski_wiki103")},
    **{name: ("transformer_lm", [{"decoder_embed_dim": 512, "dropout": 0.1, "attention_dropout": 0.1,
                                  "no_decoder_final_norm": True}, _LM_BIG])
       for name in ("transformer_lm_gbw", "transformer_lm_baevski_gbw")},
    "transformer_lm_gpt": ("transformer_lm", [{"decoder_embed_dim": 768, "decoder_ffn_embed_dim": 3072,
                                               "decoder_layers": 12, "decoder_attention_heads": 12}, _GPT]),
    "transformer_lm_gpt2_small": ("transformer_lm", [{"decoder_embed_dim": 1024, "decoder_ffn_embed_dim": 4096,
                                                      "decoder_layers": 24, "decoder_attention_heads": 16}, _GPT]),
    "transformer_lm_gpt2_medium": ("transformer_lm", [{"decoder_embed_dim": 1280, "decoder_ffn_embed_dim": 5120,
                                                       "decoder_layers": 36, "decoder_attention_heads": 20}, _GPT]),
    "transformer_lm_gpt2_big": ("transformer_lm", [{"decoder_embed_dim": 1600, "decoder_ffn_embed_dim": 6400,
                                                    "decoder_layers": 48, "decoder_attention_heads": 25}, _GPT]),
    "talkconv": ("talkconv", []),
    "talkconv_wmt_en_de_big": ("talkconv", [_TALKCONV_BIG]),
    "talkconv_wmt_en_fr_big": ("talkconv", [{"dropout": 0.1}, _TALKCONV_BIG]),
    "talkconv_iwslt_de_en": ("talkconv", [{
        "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4, "encoder_layers": 7,
        "decoder_embed_dim": 512, "decoder_ffn_embed_dim": 1024, "decoder_attention_heads": 4, "decoder_layers": 6,
        "attention_dropout": 0.1, "weight_dropout": 0.1, "encoder_glu": False, "decoder_glu": False,
        "input_dropout": 0.0}]),
    "talkconv_cnndm_std": ("talkconv", [_TALKCONV_CNNDM]),
    "talkconv_cnndm_deep": ("talkconv", [{
        "encoder_layers": 10, "decoder_layers": 10, "encoder_kernel_size_list": [3, 7, 15] + [31] * 7,
        "decoder_kernel_size_list": [3, 7] + [31] * 8}, _TALKCONV_CNNDM]),
    "talkconv_lm": ("talkconv_lm", []),
    "talkconv_lm_big": ("talkconv_lm", [_LM_BIG]),
    "talkconv_lm_wiki103": ("talkconv_lm", [{
        "decoder_layers": 17, "decoder_attention_heads": 16, "dropout": 0.3, "adaptive_input": True,
        "tie_adaptive_weights": True, "adaptive_input_cutoff": "20000,60000", "adaptive_softmax_cutoff": "20000,60000",
        "adaptive_softmax_dropout": 0.2, "attention_dropout": 0.1, "weight_dropout": 0.2, "activation_dropout": 0.1,
        "relu_dropout": 0.1, "tie_adaptive_proj": True, "decoder_glu": True,
        "decoder_kernel_size_list": [3, 5, 7, 15, 31] + [63] * 12}, _LM_BIG]),
    "lightconv_lm": ("lightconv_lm", []),
    "lightconv_lm_gbw": ("lightconv_lm", [{"decoder_embed_dim": 512, "dropout": 0.1, "attention_dropout": 0.1,
                                           "decoder_ffn_embed_dim": 4096, "decoder_attention_heads": 16}]),
}
BASES = {"transformer": TRANSFORMER_BASE, "lightconv": LIGHTCONV_BASE, "fconv": FCONV_BASE, "talkconv": TALKCONV_BASE,
         "transformer_lm": TRANSFORMER_LM_BASE, "lightconv_lm": LIGHTCONV_LM_BASE, "talkconv_lm": TALKCONV_LM_BASE}


def family_of(arch: str) -> str:
    if arch not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise SeqmixError(f"fairseq architecture {arch!r} is not one seqmix imports (known: {known})")
    return ARCHITECTURES[arch][0]


def complete_settings(arch: str, given: dict) -> dict:
    """``given`` with every setting the architecture defines filled in where it is missing (or None)."""
    family, layers = ARCHITECTURES[arch][0], ARCHITECTURES[arch][1]
    settings = {k: v for k, v in given.items() if v is not None}
    if family in LANGUAGE_MODEL_FAMILIES:
        settings = _language_model_compat(settings)
    for defaults in [*layers, BASES[family]]:
        for key, value in defaults.items():
            settings.setdefault(key, value)
    derived = {"decoder_output_dim": "decoder_embed_dim", "decoder_input_dim": "decoder_embed_dim"}
    if family in LANGUAGE_MODEL_FAMILIES:
        if family in ("lightconv_lm", "talkconv_lm"):
            derived.update(decoder_conv_dim="decoder_embed_dim", weight_dropout="attention_dropout")
    elif family == "fconv":
        derived = {"decoder_embed_dim": "encoder_embed_dim"}
    else:
        derived = {"decoder_embed_dim": "encoder_embed_dim", "decoder_ffn_embed_dim": "encoder_ffn_embed_dim",
                   **derived}
    if family in ("lightconv", "talkconv"):
        derived.update(encoder_conv_dim="encoder_embed_dim", decoder_conv_dim="decoder_embed_dim",
                       weight_dropout="attention_dropout")
    for key, source in derived.items():  # in order: decoder_embed_dim first, the dims derived from it after
        if key not in settings:
            settings[key] = settings[source]
    return settings


def _language_model_compat(settings: dict) -> dict:
    """What fairseq's ``base_lm_architecture`` rewrites before its defaults: pre-norm always ("training is not stable
    without this"); checkpoints with ``no_tie_adaptive_proj`` (older releases) had no final norm; ``decoder_final_norm``
    is the inverse of ``no_decoder_final_norm``."""
    settings = {**settings, "decoder_normalize_before": True}
    if "no_tie_adaptive_proj" in settings:
        settings["no_decoder_final_norm"] = True
        if settings["no_tie_adaptive_proj"] is False:
            settings["tie_adaptive_proj"] = True
    if "decoder_final_norm" in settings:
        settings["no_decoder_final_norm"] = not settings["decoder_final_norm"]
    return settings


_BINARY = {ast.Mult: operator.mul, ast.Add: operator.add}


def eval_spec(text):
    """fairseq's layer specs are Python expressions (``'[(512, 3)] * 9 + [(1024, 3)] * 4'``, ``'True'``): evaluate
    literals, ``*`` and ``+`` only, never arbitrary code from a checkpoint."""
    if not isinstance(text, str):
        return text

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [walk(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        raise SeqmixError(f"cannot read the fairseq setting {text!r} (only literals, * and + are evaluated)")

    try:
        return walk(ast.parse(text.strip(), mode="eval"))
    except SyntaxError:
        raise SeqmixError(f"cannot read the fairseq setting {text!r}: not a Python literal") from None
