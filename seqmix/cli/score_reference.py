"""``generate.py score_reference=true``: instead of decoding, score the references (fairseq's --score-reference):
each one's teacher-forced log-probabilities given its source (a language model: each input line's own, the line
alone), written one line per example as ``score<TAB>per-token log-probs<TAB>text``, and the corpus's mean
log-probability per token and perplexity."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text
from seqmix.generation.options import DecodeRequest
from seqmix.generation.scoring import ScoredCorpus
from seqmix.tasks.language_modeling import LanguageModelingTask


def check_score_reference(cfg: DictConfig, request: DecodeRequest | None = None) -> None:
    """The settings that cannot go with scoring references, refused before anything is loaded."""
    if not cfg.get("score_reference"):
        return
    if request is not None and not request.plain:
        raise SeqmixError("score_reference=true scores the references instead of decoding: drop nbest=, sampling= "
                          "and prefix_size=")
    if cfg.input == "-":
        raise SeqmixError("score_reference=true scores given references: use input=<file> reference=<file> or a "
                          "split, not input=-")
    if cfg.get("distill_dir"):
        raise SeqmixError("score_reference=true decodes nothing, so there is no translation to distill: drop "
                          "distill_dir=")


def score_references(cfg: DictConfig, task, sources: list[str], refs: list[list[str]] | None,
                     overrides: dict) -> float:
    """Score the first reference of each source (a language model: each input text itself), write the per-example
    lines to ``output``, print the corpus summary; returns the perplexity."""
    if isinstance(task, LanguageModelingTask):
        targets, corpus = sources, task.score_texts(sources, None, int(cfg.max_tokens))
        convention = "score = mean log-prob per token, each line alone behind </s>"
    else:
        if refs is None:
            raise SeqmixError("score_reference=true needs references: give reference=<file> with input=<file>, or "
                              "a split of the task's data")
        targets = [r[0] if r else "" for r in refs]
        corpus = task.score_texts(sources, targets, int(cfg.max_tokens), **overrides)
        convention = (f"score = sum of log-probs / length ** len_penalty={task.beam_options(**overrides).len_penalty}"
                      ", length counting </s>, as beam search ranks")
    out_path = Path(cfg.output)
    atomic_write_text(out_path, "".join(score_lines(corpus, targets)))
    print(f"reference scores: {out_path} ({convention})")
    print(f"scored {len(targets)} texts, {corpus.ntokens:,} target tokens incl. </s>: mean log-prob "
          f"{corpus.mean_log_prob:.4f} nats per token, perplexity {corpus.perplexity:.2f}")
    return corpus.perplexity


def score_lines(corpus: ScoredCorpus, targets: list[str]) -> list[str]:
    """``score<TAB>log-probs of each target token, </s> last<TAB>reference`` per example."""
    return [f"{s.score:.6f}\t{' '.join(f'{x:.4f}' for x in s.positional_scores.tolist())}\t{text}\n"
            for s, text in zip(corpus.sentences, targets)]
