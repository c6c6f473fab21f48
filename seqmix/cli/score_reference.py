"""``generate.py score_reference=true``: instead of decoding, score the references (fairseq's --score-reference):
each one's teacher-forced log-probabilities given its source, written one line per example as
``score<TAB>per-token log-probs<TAB>reference``, and the corpus's mean log-probability per token and perplexity."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text
from seqmix.generation.scoring import ScoredCorpus


def check_score_reference(cfg: DictConfig) -> None:
    """The settings that cannot go with scoring references, refused before anything is loaded."""
    if not cfg.get("score_reference"):
        return
    if cfg.input == "-":
        raise SeqmixError("score_reference=true scores given references: use input=<file> reference=<file> or a "
                          "split, not input=-")
    if cfg.get("distill_dir"):
        raise SeqmixError("score_reference=true decodes nothing, so there is no translation to distill: drop "
                          "distill_dir=")


def score_references(cfg: DictConfig, task, sources: list[str], refs: list[list[str]] | None,
                     overrides: dict) -> float:
    """Score the first reference of each source, write the per-example lines to ``output``, print the corpus
    summary; returns the perplexity."""
    if refs is None:
        raise SeqmixError("score_reference=true needs references: give reference=<file> with input=<file>, or a "
                          "split of the task's data")
    if not hasattr(task, "score_texts"):
        raise SeqmixError(f"score_reference=true scores a translation model's references; {type(task).__name__} "
                          "already reports the perplexity of input=<file> lines without it")
    targets = [r[0] if r else "" for r in refs]
    corpus = task.score_texts(sources, targets, int(cfg.max_tokens), **overrides)
    out_path = Path(cfg.output)
    atomic_write_text(out_path, "".join(score_lines(corpus, targets)))
    len_penalty = task.beam_options(**overrides).len_penalty
    print(f"reference scores: {out_path} (score = sum of log-probs / length ** len_penalty={len_penalty}, "
          "length counting </s>, as beam search ranks)")
    print(f"scored {len(targets)} references, {corpus.ntokens:,} target tokens incl. </s>: mean log-prob "
          f"{corpus.mean_log_prob:.4f} nats per token, perplexity {corpus.perplexity:.2f}")
    return corpus.perplexity


def score_lines(corpus: ScoredCorpus, targets: list[str]) -> list[str]:
    """``score<TAB>log-probs of each target token, </s> last<TAB>reference`` per example."""
    return [f"{s.score:.6f}\t{' '.join(f'{x:.4f}' for x in s.positional_scores.tolist())}\t{text}\n"
            for s, text in zip(corpus.sentences, targets)]
