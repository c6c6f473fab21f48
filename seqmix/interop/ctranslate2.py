"""seqmix Transformers for CTranslate2: ``python -m seqmix.interop.ctranslate2 export best.ckpt --out DIR``.

A seqmix encoder-decoder whose mixers are self-attention on both sides becomes a CTranslate2 model folder, built
with CTranslate2's own model specs (``ctranslate2.specs.TransformerSpec``), not through fairseq: the weights map
1:1 (q/k/v fused as CTranslate2 stores them), the positions are seqmix's own table from the first real position
on, the embeddings keep seqmix's sqrt(d) scale, and the decoder starts from the symbol the model was trained with.
Beside CTranslate2's files the folder holds the checkpoint's tokenizer (``seqmix_tokenizer.json``, what
``seqmix.data.Tokenizer.from_json`` reads), ``seqmix_serving.json`` (special symbols, decoding settings) and a
README saying how to tokenize and detokenize. The folder appears complete or not at all (written beside, renamed).

Decode with ``seqmix.interop.ctranslate2_decoding.CT2Translator`` (seqmix's beam settings and detokenization).
Needs the ``serve`` extra: ``pip install seqmix[serve]``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from seqmix.config.user_errors import CommandParser, command_status
from seqmix.errors import SeqmixError

log = logging.getLogger("seqmix")

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int16", "float16", "bfloat16")
TOKENIZER_FILE = "seqmix_tokenizer.json"
SERVING_FILE = "seqmix_serving.json"
MODEL_FILE = "model.bin"  # what CTranslate2 writes; its presence is how a finished export is recognised
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which seqmix's blocks use
SUPPORTED = ("an encoder-decoder (seqmix.models.EncoderDecoder) with mixer=self_attention on both sides "
             "(e.g. model=transformer or transformer_small)")


def require_ctranslate2():
    """The ``ctranslate2`` module, or one line saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise SeqmixError("CTranslate2 is not installed: pip install seqmix[serve] (or pip install ctranslate2)") \
            from None
    return ctranslate2


# --- what can be exported -----------------------------------------------------------------------------------------
def check_exportable(model) -> None:
    """A Transformer in CTranslate2's shape, else one line naming what is supported: one mixer kind (self-attention)
    in every layer of both stacks, one head count for self- and cross-attention."""
    from seqmix.mixers.self_attention import SelfAttention
    from seqmix.models.encoder_decoder import EncoderDecoder

    if type(model) is not EncoderDecoder:
        raise SeqmixError(f"cannot export a {type(model).__name__} to CTranslate2: it runs {SUPPORTED}")
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        others = sorted({type(layer.mixer).__name__ for layer in stack.layers if type(layer.mixer) is not SelfAttention})
        if others:
            raise SeqmixError(f"cannot export the {side}'s {', '.join(others)} mixer to CTranslate2, which runs only "
                              f"{SUPPORTED}")
    heads = {layer.mixer.attn.num_heads for side in (model.encoder, model.decoder) for layer in side.layers}
    heads |= {layer.cross_attn.num_heads for layer in model.decoder.layers}
    if len(heads) != 1:
        raise SeqmixError(f"cannot export to CTranslate2: its Transformer has one head count for every attention, "
                          f"this model uses {sorted(heads)} (model.<side>.heads, cross_attention_heads)")
    activations = {layer.ffn.activation for side in (model.encoder, model.decoder) for layer in side.layers}
    if len(activations) != 1:
        raise SeqmixError("cannot export to CTranslate2: the encoder and decoder use different activations")
    norms = {layer.ffn_residual.normalize_before for side in (model.encoder, model.decoder) for layer in side.layers}
    if len(norms) != 1:
        raise SeqmixError("cannot export to CTranslate2: pre-norm on one side and post-norm on the other")
    if norms == {True} and (model.encoder.layer_norm is None or model.decoder.layer_norm is None):
        raise SeqmixError("cannot export to CTranslate2: its pre-norm Transformer ends each side in a LayerNorm, "
                          "this model has none (model.<side>.final_norm=false)")


def _activation(ctranslate2, fn):
    import torch.nn.functional as F

    table = {F.relu: ctranslate2.specs.Activation.RELU, F.gelu: ctranslate2.specs.Activation.GELU,
             F.silu: ctranslate2.specs.Activation.SWISH}
    if fn not in table:
        raise SeqmixError(f"cannot export the activation {getattr(fn, '__name__', fn)} to CTranslate2 "
                          "(relu, gelu, swish are supported)")
    return table[fn]


# --- weights --------------------------------------------------------------------------------------------------------
def _np(t: torch.Tensor):
    return t.detach().float().cpu().contiguous().numpy()


def _linear(spec, *linears) -> None:
    """``linears`` stacked along the output dimension (CTranslate2 fuses q/k/v, or k/v, into one matrix)."""
    spec.weight = _np(torch.cat([lin.weight for lin in linears]))
    if linears[0].bias is not None:
        spec.bias = _np(torch.cat([lin.bias for lin in linears]))


def _norm(spec, norm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _positions(stack) -> object:
    """seqmix's positions (sinusoidal table or learned rows) from the first real position on: seqmix numbers the
    first token ``padding_idx + 1``, CTranslate2 indexes its table from 0."""
    pe = stack.embed_positions
    first = pe.padding_idx + 1
    table = pe.weights.weight if pe.kind == "learned" else pe.table
    return _np(table[first: first + pe.max_positions])


def _embeddings(spec_side, stack) -> None:
    embeddings = spec_side.embeddings[0] if isinstance(spec_side.embeddings, list) else spec_side.embeddings
    embeddings.weight = _np(stack.embed_tokens.weight)
    spec_side.scale_embeddings = stack.embed_scale != 1.0
    spec_side.position_encodings.encodings = _positions(stack)
    if stack.layer_norm is not None:
        _norm(spec_side.layer_norm, stack.layer_norm)


def _self_attention(spec, block) -> None:
    attn = block.mixer.attn
    _linear(spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    _linear(spec.linear[1], attn.out_proj)
    _norm(spec.layer_norm, block.mixer_residual.norm)


def _ffn(spec, block) -> None:
    _linear(spec.linear_0, block.ffn.fc1)
    _linear(spec.linear_1, block.ffn.fc2)
    _norm(spec.layer_norm, block.ffn_residual.norm)


def transformer_spec(model):
    """The CTranslate2 ``TransformerSpec`` holding ``model``'s weights (vocabularies not yet registered)."""
    ctranslate2 = require_ctranslate2()
    specs = ctranslate2.specs
    check_exportable(model)
    first = model.encoder.layers[0]
    heads = first.mixer.attn.num_heads
    pre_norm = first.ffn_residual.normalize_before
    activation = _activation(ctranslate2, first.ffn.activation)
    encoder = specs.TransformerEncoderSpec(len(model.encoder.layers), heads, pre_norm=pre_norm, activation=activation)
    decoder = specs.TransformerDecoderSpec(len(model.decoder.layers), heads, pre_norm=pre_norm, activation=activation)
    _embeddings(encoder, model.encoder)
    _embeddings(decoder, model.decoder)
    for spec, block in zip(encoder.layer, model.encoder.layers):
        _self_attention(spec.self_attention, block)
        _ffn(spec.ffn, block)
    for spec, block in zip(decoder.layer, model.decoder.layers):
        _self_attention(spec.self_attention, block)
        cross = block.cross_attn
        _linear(spec.attention.linear[0], cross.q_proj)
        _linear(spec.attention.linear[1], cross.k_proj, cross.v_proj)
        _linear(spec.attention.linear[2], cross.out_proj)
        _norm(spec.attention.layer_norm, block.cross_residual.norm)
        _ffn(spec.ffn, block)
    decoder.projection.weight = _np(model.output_weight())  # the tied target embedding or the own projection
    return specs.TransformerSpec(encoder, decoder)


# --- vocabularies and tokenizer -------------------------------------------------------------------------------------
def vocabulary(tokenizer, side: str) -> list[str]:
    """Every id's piece on ``side`` (source | target), in id order: CTranslate2 speaks tokens, seqmix ids, and this
    list is the bridge both ways (the decoding helper builds it from the same tokenizer)."""
    size = tokenizer.source_vocab_size if side == "source" else tokenizer.target_vocab_size
    pieces = [tokenizer.piece(i, side) for i in range(size)]
    seen: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        if piece in seen and i != tokenizer.unk:
            raise SeqmixError(f"the {side} vocabulary has the piece {piece!r} twice (ids {seen[piece]} and {i}): "
                              "CTranslate2 needs one id per piece")
        seen.setdefault(piece, i)
    return pieces


def serving_info(task, config: dict, checkpoint: str, quantization: str | None) -> dict:
    tok = task.tokenizer
    data = (config.get("task") or {}).get("data") or {}
    return {
        "format": "seqmix-ctranslate2/1",
        "checkpoint": str(checkpoint),
        "model": config.get("model", {}).get("name"),
        "task": (config.get("task") or {}).get("name"),
        "source_lang": data.get("src_lang"), "target_lang": data.get("tgt_lang"),
        "quantization": quantization or "float32",
        "decoder_start": "</s>" if task.decoder_start == tok.eos else "<s>",
        "specials": {"bos": "<s>", "pad": "<pad>", "eos": "</s>", "unk": "<unk>"},
        "source_eos_added_by_ctranslate2": True,
        "max_source_positions": task.model.max_source_positions,
        "max_target_positions": task.model.max_target_positions,
        "generation": {k: getattr(task.generation, k) for k in task.generation.__dataclass_fields__},
        "tokenizer": TOKENIZER_FILE,
    }


README = """# {model} for CTranslate2 (exported by seqmix from {checkpoint})

Quantization: {quantization}. Files: CTranslate2's model.bin, config.json and vocabularies; `{tokenizer}` (the
checkpoint's seqmix tokenizer); `{serving}` (special symbols and the checkpoint's decoding settings).

With seqmix installed (`pip install seqmix[serve]`), tokenization, beam settings and detokenization are done for you:

    from seqmix.interop.ctranslate2_decoding import CT2Translator
    translator = CT2Translator("{folder}", intra_threads=4)
    print(translator.translate(["A man rides a bike."], beam_size=5))

By hand: `tokenizer = seqmix.data.Tokenizer.from_json(open("{tokenizer}").read())`; the source pieces are
`[tokenizer.piece(i, "source") for i in tokenizer.encode(text)]` (no `</s>`: CTranslate2 appends it, as seqmix
does); `translator.translate_batch(batch, beam_size=5, length_penalty=1.0, return_end_token=True,
max_decoding_length=max_len + 1)` gives pieces; map them back to ids
through the target vocabulary and `tokenizer.decode(ids)` detokenizes (it stops at `</s>`). `return_end_token=True`
makes CTranslate2's length-normalized score count the `</s>`, as seqmix's beam search does.
"""


# --- export ---------------------------------------------------------------------------------------------------------
def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, quantization: str | None = None) -> Path:
    """seqmix checkpoint → CTranslate2 model folder ``out_dir`` (refused when it exists), written into a temporary
    folder beside it and renamed only once complete: an interrupted export leaves no folder that looks valid."""
    from seqmix.config.build import task_from_checkpoint
    from seqmix.training.checkpoints import load_checkpoint

    if quantization is not None and quantization not in QUANTIZATIONS:
        raise SeqmixError(f"--quantization {quantization} is unknown; choose one of {list(QUANTIZATIONS)}")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise SeqmixError(f"{out_dir} exists: remove it or choose another --out (an export never overwrites)")
    require_ctranslate2()
    ckpt = load_checkpoint(checkpoint)
    check_model_config(ckpt["seqmix"]["config"])
    task, _ = task_from_checkpoint(ckpt, str(checkpoint))
    spec = transformer_spec(task.model)
    tok = task.tokenizer
    source, target = vocabulary(tok, "source"), vocabulary(tok, "target")
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    spec.config.decoder_start_token = "</s>" if task.decoder_start == tok.eos else "<s>"
    spec.config.add_source_eos = True  # seqmix's sources end in </s>
    spec.config.add_source_bos = False
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.validate()
    spec.optimize(quantization=quantization)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        spec.save(str(tmp))
        (tmp / TOKENIZER_FILE).write_text(ckpt["seqmix"]["tokenizer"], encoding="utf-8")
        info = serving_info(task, ckpt["seqmix"]["config"], str(checkpoint), quantization)
        (tmp / SERVING_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(README.format(model=info["model"], checkpoint=checkpoint, folder=out_dir,
                                                     quantization=info["quantization"], tokenizer=TOKENIZER_FILE,
                                                     serving=SERVING_FILE), encoding="utf-8")
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, out_dir)  # atomic; fails rather than merging when out_dir appeared meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def check_model_config(config: dict) -> None:
    """The config's own view first, so a ConvS2S/NAT checkpoint is refused before it is built."""
    model = config.get("model") or {}
    target = str(model.get("_target_", ""))
    if not target.endswith("EncoderDecoder"):
        raise SeqmixError(f"cannot export model {model.get('name')!r} ({target or 'unknown'}) to CTranslate2: it "
                          f"runs {SUPPORTED}")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- command line ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m seqmix.interop.ctranslate2", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    exp = commands.add_parser("export", help="seqmix checkpoint -> CTranslate2 model folder")
    exp.add_argument("checkpoint")
    exp.add_argument("--out", required=True, help="output folder (must not exist)")
    exp.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                     help="weights stored as int8, int8_float16, float16, ... (default: float32)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def run() -> None:
        out = export_checkpoint(args.checkpoint, args.out, args.quantization)
        print(f"exported -> {out} ({args.quantization or 'float32'}); decode with "
              f"seqmix.interop.ctranslate2_decoding.CT2Translator('{out}')")

    return command_status(run)


if __name__ == "__main__":
    sys.exit(main())
