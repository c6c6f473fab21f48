"""Cross-check seqmix's fairseq interop (``seqmix.interop.fairseq``) against real fairseq 0.12.2, both directions.

No single venv holds both packages, so this file has two halves, each run with its own interpreter:

* ``fairseq-side`` (fairseq's venv, see tools/fairseq_venv.sh; never imports seqmix)
    ``make``: tiny random models built by fairseq's own builders (``options.parse_args_and_arch`` + the registered
    architecture + ``TranslationTask.build_model``), saved as fairseq saves them (``Trainer.save_checkpoint``: the
    ``cfg`` container; one model also in the old ``args`` style), with fairseq's outputs on fixed token batches.
    ``load``: every checkpoint seqmix exported, loaded with ``checkpoint_utils.load_model_ensemble_and_task``, with
    its outputs on the inputs seqmix wrote beside it.
* ``seqmix-side`` (the project venv)
    ``export``: tiny random seqmix models saved as training saves them, exported, with seqmix's outputs.
    ``compare``: imports every fairseq-made checkpoint and computes seqmix's outputs, then compares both directions
    and prints one table.

Outputs of both toolkits: teacher-forced log-probs (full vocabulary, every non-pad target position; decoder input =
eos + target as fairseq trains), beam-5 and greedy best hypotheses with fairseq-generate's settings (lenpen 1,
max_len_a 0, max_len_b 200, min_len 1). fairseq's sources are left-padded, seqmix's right-padded; the same sentences
are fed to both. For reference the fairseq side also computes its teacher-forced log-probs step by step through its
incremental decoder (what SequenceGenerator uses), whose difference from its own full pass is reported.

Everything at once (from /work/main):
    python tools/fairseq_crosscheck.py run --work /tmp/fairseq_crosscheck \
        --fairseq-python /work/fairseq-venv/bin/python --seqmix-python /work/main/.venv/bin/python
which runs, in order: fairseq-side make, seqmix-side export, fairseq-side load, seqmix-side compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

GENERATION = {"beam_size": 5, "len_penalty": 1.0, "max_len_a": 0.0, "max_len_b": 200, "min_len": 1}
SRC_LENGTHS = [1, 2, 3, 5, 6, 7, 9, 12]  # odd and even, one token only: padding everywhere in the batch
TGT_LENGTHS = [4, 1, 6, 3, 8, 2, 7, 5]
NOISE = 0.2  # added to every random weight so no bias is 0 and no norm gain is 1


# --- shared by both halves (torch only) --------------------------------------------------------------------------
def make_inputs(src_vocab: int, tgt_vocab: int, seed: int) -> dict:
    """Source and target sentences as id lists without eos (ids 4.. are ordinary symbols in both toolkits)."""
    g = torch.Generator().manual_seed(seed)
    return {"src": [torch.randint(4, src_vocab, (n,), generator=g).tolist() for n in SRC_LENGTHS],
            "tgt": [torch.randint(4, tgt_vocab, (n,), generator=g).tolist() for n in TGT_LENGTHS]}


def padded(rows: list[list[int]], pad: int, left: bool) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        start = width - len(r) if left else 0
        out[i, start:start + len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def batch(inputs: dict, left_pad_source: bool, pad: int = 1, eos: int = 2) -> dict:
    """Sources with eos appended (left- or right-padded); decoder inputs eos + target, right-padded (both toolkits)."""
    src = padded([s + [eos] for s in inputs["src"]], pad, left_pad_source)
    prev = padded([[eos] + t for t in inputs["tgt"]], pad, left=False)
    return {"src_tokens": src, "src_lengths": torch.tensor([len(s) + 1 for s in inputs["src"]]),
            "prev_output_tokens": prev}


def per_sentence(lprobs: torch.Tensor, inputs: dict) -> list[torch.Tensor]:
    """(B, T, V) log-probs → each sentence's non-pad positions (len(target) + 1 rows: the targets and eos)."""
    return [lprobs[i, : len(t) + 1].float().clone() for i, t in enumerate(inputs["tgt"])]


# --- fairseq side --------------------------------------------------------------------------------------------------
TINY_TRANSFORMER = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
                    "--decoder-ffn-embed-dim", "32", "--encoder-layers", "2", "--decoder-layers", "2",
                    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--dropout", "0.0"]
FAIRSEQ_MODELS = {
    # name: (architecture flags, joined dictionary, saved as)
    "transformer_shared": (["--arch", "transformer", *TINY_TRANSFORMER, "--share-all-embeddings"], True, "cfg"),
    "transformer_separate_learnedpos": (["--arch", "transformer", *TINY_TRANSFORMER, "--encoder-learned-pos",
                                         "--decoder-learned-pos", "--encoder-normalize-before",
                                         "--decoder-normalize-before"], False, "args"),
    "lightconv_lightweight_glu": (["--arch", "lightconv", *TINY_TRANSFORMER, "--encoder-conv-type", "lightweight",
                                   "--decoder-conv-type", "lightweight", "--encoder-glu", "True", "--decoder-glu", "True",
                                   "--encoder-kernel-size-list", "[3,5]", "--decoder-kernel-size-list", "[3,5]",
                                   "--share-decoder-input-output-embed"], False, "cfg"),
    "lightconv_dynamic": (["--arch", "lightconv", *TINY_TRANSFORMER, "--encoder-conv-type", "dynamic",
                           "--decoder-conv-type", "dynamic", "--encoder-glu", "True", "--decoder-glu", "True",
                           "--encoder-kernel-size-list", "[3,7]", "--decoder-kernel-size-list", "[3,7]"], False, "cfg"),
    "fconv": (["--arch", "fconv", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
               "--encoder-layers", "[(16, 3)] * 2 + [(24, 3)]", "--decoder-layers", "[(16, 3), (24, 2)]",
               "--decoder-out-embed-dim", "16", "--dropout", "0.0"], False, "args"),
}
TRAINING = ["--task", "translation", "-s", "src", "-t", "tgt", "--cpu", "--optimizer", "adam", "--lr", "0.0005",
            "--lr-scheduler", "inverse_sqrt", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--seed", "1"]


def fairseq_dictionary(size: int, prefix: str):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - d.nspecial):
        d.add_symbol(f"{prefix}{i}", n=size - i)  # descending counts: the file keeps this order
    return d


def perturbed(model, seed: int) -> None:
    """Noise on every parameter; embedding rows of the padding index stay 0 (as fairseq trains them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g))
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()


@torch.no_grad()
def fairseq_outputs(model, task, inputs: dict) -> dict:
    """Teacher-forced log-probs (full pass and incremental) and beam-5/greedy hypotheses of a fairseq model."""
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    for module in model.modules():
        # fairseq 0.12.2's "BetterTransformer" encoder-layer fast path (taken in eval mode once a state dict was
        # loaded) calls torch._transformer_encoder_layer_fwd with torch 1.12's arguments, which torch 2.13 rejects
        # ("Mask Type should be defined"): use fairseq's regular layer code
        if hasattr(module, "load_to_BT"):
            module.load_to_BT = False
    b = batch(inputs, left_pad_source=True)
    src, lengths, prev = b["src_tokens"], b["src_lengths"], b["prev_output_tokens"]
    full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    encoder_out = model.encoder(src, src_lengths=lengths)
    state: dict = {}
    steps = []
    for t in range(prev.size(1)):
        out = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        steps.append(model.get_normalized_probs(out, log_probs=True)[:, -1:])
    incremental = torch.cat(steps, dim=1)
    result = {"lprobs": per_sentence(full, inputs), "lprobs_incremental": per_sentence(incremental, inputs)}
    # seqmix's beam search never outputs <s>; fairseq's SequenceGenerator only bans pad, and these random models
    # give <s> an ordinary probability (trained ones never do): ban it here too, so the searches follow one rule
    # (without this, fconv's hypotheses differed in 5 of 16 searches; re-scored, every position agreed to 1.9e-6)
    normalized, bos = model.get_normalized_probs, task.target_dictionary.bos()

    def without_bos(net_output, log_probs, sample=None):
        lprobs = normalized(net_output, log_probs, sample)
        lprobs[..., bos] = float("-inf")
        return lprobs

    model.get_normalized_probs = without_bos
    for name, beam in (("beam", GENERATION["beam_size"]), ("greedy", 1)):
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, len_penalty=1.0,
                                      max_len_a=GENERATION["max_len_a"], max_len_b=GENERATION["max_len_b"],
                                      min_len=GENERATION["min_len"])
        hyps = generator.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        result[name] = [h[0]["tokens"].tolist() for h in hyps]
        result[f"{name}_scores"] = [float(h[0]["score"]) for h in hyps]
    model.get_normalized_probs = normalized
    return result


def fairseq_make(work: Path) -> None:
    """Build, save and run every model of FAIRSEQ_MODELS with fairseq's own code."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    for seed, (name, (flags, joined, style)) in enumerate(FAIRSEQ_MODELS.items(), start=1):
        folder = work / "fairseq_made" / name
        folder.mkdir(parents=True, exist_ok=True)
        src_dict = fairseq_dictionary(37, "w")
        tgt_dict = src_dict if joined else fairseq_dictionary(29, "v")
        src_dict.save(str(folder / "dict.src.txt"))
        tgt_dict.save(str(folder / "dict.tgt.txt"))
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, [str(folder), *TRAINING, *flags])
        cfg = convert_namespace_to_omegaconf(args)
        task = tasks.setup_task(cfg.task)
        torch.manual_seed(seed)
        model = task.build_model(cfg.model)
        perturbed(model, seed)
        criterion = task.build_criterion(cfg.criterion)
        trainer = Trainer(cfg, task, model, criterion)
        path = folder / "checkpoint.pt"
        trainer.consolidate_optimizer()  # what checkpoint_utils.save_checkpoint does before saving
        trainer.save_checkpoint(str(path), {"train_iterator": {"epoch": 1}, "val_loss": None})
        if style == "args":  # fairseq <= 0.9's container: the argparse Namespace instead of cfg
            ckpt = torch.load(path, map_location="cpu", weights_only=False)
            ckpt["args"], ckpt["cfg"] = args, None
            ckpt.pop("cfg")
            torch.save(ckpt, path)
        inputs = make_inputs(len(src_dict), len(tgt_dict), seed=100 + seed)
        torch.save(inputs, folder / "inputs.pt")
        torch.save(fairseq_outputs(model, task, inputs), folder / "fairseq_outputs.pt")
        print(f"fairseq made {name} ({style} container) -> {path}")


def fairseq_load(work: Path) -> None:
    """Load every seqmix export with fairseq's loader and compute its outputs on seqmix's inputs."""
    from fairseq import checkpoint_utils

    for folder in sorted((work / "seqmix_made").iterdir()):
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(folder / "fairseq" / "checkpoint.pt")], arg_overrides={"data": str(folder / "fairseq")})
        inputs = torch.load(folder / "inputs.pt")
        torch.save(fairseq_outputs(models[0], task, inputs), folder / "fairseq_outputs.pt")
        print(f"fairseq loaded {folder.name}: {type(models[0]).__name__}")


# --- seqmix side ---------------------------------------------------------------------------------------------------
SEQMIX_TINY = ["model.embed_dim=16", "model.encoder.layers=2", "model.decoder.layers=2", "model.encoder.ffn_dim=32",
               "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
               "model.decoder.cross_attention_heads=2", "model.dropout=0.0"]
SEQMIX_CONVS2S_TINY = ["model.encoder.embed_dim=16", "model.decoder.embed_dim=16", "model.decoder.out_embed_dim=16",
                       "model.encoder.layers=[[16,3],[24,3]]", "model.decoder.layers=[[16,3],[16,2]]",
                       "model.dropout=0.0"]
SEQMIX_MODELS = {"transformer_small": SEQMIX_TINY, "lightconv_small": SEQMIX_TINY, "dynamicconv_small": SEQMIX_TINY,
                 "convs2s_small": SEQMIX_CONVS2S_TINY}
SENTENCES = ["a small dog runs", "two dogs run on the grass", "the cat sleeps", "a man rides a bike",
             "the dog and the cat play", "people walk in the park"]


def seqmix_saved_checkpoint(path: Path, model: str, overrides: list[str], seed: int) -> None:
    """A random seqmix model saved as training saves it (Lightning's state dict + the task's metadata)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from seqmix.config.build import build_task
    from seqmix.config.mixer_group import settle_mixer_choice
    from seqmix.config.resolvers import register_resolvers
    from seqmix.data.tokenizer import train_tokenizer

    register_resolvers()
    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["logger=csv", f"model={model}", "model.decoder_start=eos",
                                                      *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    settle_mixer_choice(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = "unused"
    tokenizer = train_tokenizer(SENTENCES * 3, vocab_size=40, min_frequency=1)
    torch.manual_seed(seed)
    task = build_task(cfg, tokenizer)
    perturbed(task.model, seed)
    ckpt = {"state_dict": task.state_dict()}
    task.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)


@torch.no_grad()
def seqmix_outputs(task, inputs: dict) -> dict:
    """Teacher-forced log-probs and beam-5/greedy hypotheses of a seqmix task's model (fairseq's settings)."""
    from seqmix.interop.fairseq import FAIRSEQ_GENERATION

    model = task.model.eval()
    b = batch(inputs, left_pad_source=False)
    logits = model(b["src_tokens"], b["prev_output_tokens"])
    result = {"lprobs": per_sentence(torch.log_softmax(logits.float(), dim=-1), inputs)}
    for name, beam in (("beam", FAIRSEQ_GENERATION["beam_size"]), ("greedy", 1)):
        search = task.beam_search(**{**FAIRSEQ_GENERATION, "beam_size": beam})
        hyps = search.generate(model, b["src_tokens"])
        result[name] = [h[0].tokens.tolist() for h in hyps]
        result[f"{name}_scores"] = [float(h[0].score) for h in hyps]
    return result


def seqmix_export(work: Path) -> None:
    """Random seqmix models → seqmix checkpoint → fairseq export, with seqmix's outputs on fixed inputs."""
    from seqmix.config.build import load_task
    from seqmix.interop.fairseq import export_checkpoint

    for seed, (name, overrides) in enumerate(SEQMIX_MODELS.items(), start=11):
        folder = work / "seqmix_made" / name
        folder.mkdir(parents=True, exist_ok=True)
        seqmix_saved_checkpoint(folder / "seqmix.ckpt", name, overrides, seed)
        export_checkpoint(folder / "seqmix.ckpt", folder / "fairseq")
        task, _ = load_task(folder / "seqmix.ckpt")
        vocab = task.tokenizer.vocab_size
        inputs = make_inputs(vocab, vocab, seed=200 + seed)
        torch.save(inputs, folder / "inputs.pt")
        torch.save(seqmix_outputs(task, inputs), folder / "seqmix_outputs.pt")
        print(f"seqmix exported {name} -> {folder / 'fairseq'}")


def compared(ours: dict, theirs: dict) -> dict:
    """max |Δ log-prob| over every non-pad position and symbol, and how many best hypotheses are identical."""
    n = len(ours["beam"])
    row = {"max_dlogprob": max(float((a - b).abs().max()) for a, b in zip(ours["lprobs"], theirs["lprobs"]))}
    for name in ("beam", "greedy"):
        row[f"{name}_equal"] = sum(a == b for a, b in zip(ours[name], theirs[name]))
        row[f"{name}_n"] = n
        row[f"{name}_dscore"] = max(abs(a - b) for a, b, x, y in zip(ours[f"{name}_scores"], theirs[f"{name}_scores"],
                                                                       ours[name], theirs[name]) if x == y) \
            if row[f"{name}_equal"] else float("nan")
        row[f"{name}_mean_len"] = sum(len(h) for h in theirs[name]) / n
    row["fairseq_incremental_vs_full"] = max(float((a - b).abs().max())
                                             for a, b in zip(theirs["lprobs"], theirs["lprobs_incremental"]))
    return row


def seqmix_compare(work: Path) -> list[dict]:
    """Import every fairseq-made checkpoint, compute seqmix's outputs, compare both directions, print the table."""
    from seqmix.interop.fairseq import import_checkpoint

    rows = []
    for folder in sorted((work / "fairseq_made").iterdir()):
        task = import_checkpoint(folder / "checkpoint.pt", folder, folder / "imported.ckpt")
        inputs = torch.load(folder / "inputs.pt")
        ours = seqmix_outputs(task, inputs)
        torch.save(ours, folder / "seqmix_outputs.pt")
        rows.append({"model": folder.name, "direction": "fairseq -> seqmix (import)",
                     **compared(ours, torch.load(folder / "fairseq_outputs.pt"))})
    for folder in sorted((work / "seqmix_made").iterdir()):
        rows.append({"model": folder.name, "direction": "seqmix -> fairseq (export)",
                     **compared(torch.load(folder / "seqmix_outputs.pt"), torch.load(folder / "fairseq_outputs.pt"))})
    print_table(rows)
    (work / "results.json").write_text(json.dumps(rows, indent=1))
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':34} {'direction':28} {'max|dlogp|':>10} {'beam5 eq':>9} {'greedy eq':>9} "
            f"{'max|dscore|':>11} {'len':>5} {'fs incr-full':>12}")
    print(head)
    print("-" * len(head))
    for r in rows:
        dscore = max(r["beam_dscore"], r["greedy_dscore"])
        print(f"{r['model']:34} {r['direction']:28} {r['max_dlogprob']:10.2e} "
              f"{r['beam_equal']:>4}/{r['beam_n']:<4} {r['greedy_equal']:>4}/{r['greedy_n']:<4} {dscore:11.2e} "
              f"{r['beam_mean_len']:5.1f} {r['fairseq_incremental_vs_full']:12.2e}")


# --- command line ----------------------------------------------------------------------------------------------------
def run_all(work: Path, fairseq_python: str, seqmix_python: str) -> int:
    """The four steps in order, each under its own interpreter."""
    me = str(Path(__file__).resolve())
    for python, side, step in ((fairseq_python, "fairseq-side", "make"), (seqmix_python, "seqmix-side", "export"),
                               (fairseq_python, "fairseq-side", "load"), (seqmix_python, "seqmix-side", "compare")):
        done = subprocess.run([python, me, side, step, "--work", str(work)])
        if done.returncode:
            print(f"{side} {step} failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=["fairseq-side", "seqmix-side", "run"])
    parser.add_argument("step", nargs="?", choices=["make", "load", "export", "compare"])
    parser.add_argument("--work", default="/tmp/fairseq_crosscheck", type=Path)
    parser.add_argument("--fairseq-python", default="/work/fairseq-venv/bin/python")
    parser.add_argument("--seqmix-python", default=str(Path(__file__).resolve().parents[1] / ".venv/bin/python"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.side == "fairseq-side":
        # fairseq 0.12.2 predates torch 2.6's torch.load(weights_only=True) default, and its own checkpoints pickle an
        # argparse.Namespace (cfg.model of legacy architectures; args of old ones): load as the torch it targets did
        os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    if args.side == "run":
        return run_all(args.work, args.fairseq_python, args.seqmix_python)
    steps = {("fairseq-side", "make"): fairseq_make, ("fairseq-side", "load"): fairseq_load,
             ("seqmix-side", "export"): seqmix_export, ("seqmix-side", "compare"): seqmix_compare}
    if (args.side, args.step) not in steps:
        parser.error(f"{args.side} has the steps {[s for side, s in steps if side == args.side]}")
    steps[(args.side, args.step)](args.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
