"""Where a ConvS2S decoder step spends its time on CPU: conv + GLU vs. attention vs. output projection.

    python -m benchmarks.convs2s_step [--model convs2s_small] [--rows 5 80] [--steps 25] [--repeats 5]

Builds the preset from conf/model (random weights, eval mode), encodes one batch of sources, then times
``model.decode`` one token at a time the way beam search calls it (``rows`` = sentences x beams), followed by
the log-softmax and top-k beam search applies. Forward hooks time each part. Two step paths, interleaved so
they see the same machine load: "cached" (the decoder state keeps the weight-norm-folded conv weight from the
first step, the current code) and "refold" (a plain window state: the weight is folded again at every step,
as before). Times are this thread's CPU time with one intra-op thread, minimum over ``--repeats`` decodes,
so other load on the machine changes them less than wall time (it still costs cache, so compare columns,
not runs). These numbers decide where a fused step kernel can pay (triton_kernels/convs2s/README.md).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from seqmix.mixers.conv_block import WindowState
from seqmix.models.encoder_decoder import DecoderState

clock = time.thread_time
CONF = Path(__file__).resolve().parents[1] / "conf"
PARTS = ("conv + GLU (mixer step)", "attention", "fc1 + fc2", "output projection + log_softmax + top-k")


def build(model: str, vocab: int) -> torch.nn.Module:
    with initialize_config_dir(str(CONF), version_base=None):
        cfg = compose("train", overrides=[f"model={model}"])
    return instantiate(cfg.model, src_vocab_size=vocab, tgt_vocab_size=vocab, padding_idx=1).eval()


def hook_timers(model: torch.nn.Module, totals: dict) -> None:
    def timed(key: str, module: torch.nn.Module) -> None:
        start = {}
        module.register_forward_pre_hook(lambda *_: start.__setitem__("t", clock()))
        module.register_forward_hook(lambda *_: totals.__setitem__(key, totals[key] + clock() - start["t"]))

    for block in model.decoder.blocks:
        timed(PARTS[0], block.conv)
        if block.attention is not None:
            timed(PARTS[1], block.attention)
    timed(PARTS[2], model.decoder.fc1)
    timed(PARTS[2], model.decoder.fc2)


def one_decode(model, enc, tokens, totals: dict, cached: bool) -> None:
    """``decode`` per step, then the output projection's share timed apart (it runs outside any module)."""
    totals.clear()
    state = model.init_decoder_state(enc)
    if not cached:
        state = DecoderState(blocks=[WindowState() for _ in model.decoder.blocks])
    weight, bias = ((model.decoder.embed_tokens.weight, model.output_bias) if model.output_projection is None
                    else (model.output_projection.weight, model.output_projection.bias))
    for t in range(tokens.size(1)):
        t0 = clock()
        logits = model.decode(tokens[:, t: t + 1], enc, state)
        F.log_softmax(logits.float(), dim=-1).topk(5, dim=-1)
        totals["step"] += clock() - t0
        x = torch.randn(tokens.size(0), 1, weight.size(1))
        t0 = clock()
        F.log_softmax(F.linear(x, weight, bias).float(), dim=-1).topk(5, dim=-1)
        totals[PARTS[3]] += clock() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="convs2s_small")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--rows", type=int, nargs="+", default=[5, 80], help="decoder rows (sentences x beam)")
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build(args.model, args.vocab)
    totals: dict = defaultdict(float)
    hook_timers(model, totals)
    print(f"{args.model}, vocab {args.vocab}, 1 thread, {args.steps} steps, thread CPU time, min of {args.repeats}")
    with torch.inference_mode():
        for rows in args.rows:
            enc = model.encode(torch.randint(4, args.vocab, (rows, args.src_len)))
            tokens = torch.randint(4, args.vocab, (rows, args.steps))
            best: dict = {}
            for _ in range(args.repeats):
                for mode in ("cached", "refold"):
                    one_decode(model, enc, tokens, totals, mode == "cached")
                    if mode not in best or totals["step"] < best[mode]["step"]:
                        best[mode] = dict(totals)
            print(f"\nrows={rows:<4} {'ms/step cached':>15} {'share':>6} {'ms/step refold':>15} {'share':>6}")
            for key in ("step", *PARTS, "rest"):
                vals = []
                for mode in ("cached", "refold"):
                    b = best[mode]
                    v = b["step"] - sum(b[k] for k in PARTS) if key == "rest" else b[key]
                    vals.append(f"{1e3 * v / args.steps:15.3f} {100 * v / b['step']:5.1f}%")
                print(f"  {key if key != 'rest' else 'rest (embedding, residuals, python)':42} {' '.join(vals)}")


if __name__ == "__main__":
    main()
