"""SummarizationTask: the translation task scored with ROUGE instead of BLEU, next to a lead-N baseline.

Training, decoding and checkpoints are the translation task's. What differs is in the config: the data module
truncates documents (``task.data.truncate_source``), and ``task.generation`` bounds the summary length
(``min_len_b``/``max_len_b``), blocks repeated trigrams (``no_repeat_ngram_size: 3``) and applies the length
penalty stepwise (``stepwise_len_penalty``). ROUGE-1/2/L/Lsum F1 use every reference an example has (see
``seqmix.metrics.rouge``): ``rougeL`` is sentence-level, ``rougeLsum`` summary-level (the ROUGE-L that CNN-DM
papers report). The main score (``task.monitor``'s ``val/rougeL``) stays the sentence-level one; both are logged.
"""

from __future__ import annotations

from seqmix.metrics import RougeOptions, RougeResult, corpus_rouge, lead
from seqmix.tasks.base import Report
from seqmix.tasks.translation import TranslationTask


class SummarizationTask(TranslationTask):
    def __init__(self, *args, rouge: RougeOptions | None = None, truncate_source: int | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rouge = rouge or RougeOptions()
        self.truncate_source = truncate_source  # as the data module truncates training documents
        self._lead_cache: dict[int, RougeResult] = {}

    def score(self, hypotheses: list[str], references: list[list[str]], sources: list[str]) -> Report:
        result = corpus_rouge(hypotheses, references, self.rouge.stemming)
        baseline = self.lead_baseline(sources, references)
        lead_metrics = {f"lead{self.rouge.lead}_{k}": v for k, v in baseline.metrics().items()}
        return Report(result.rougeL, f"{result.LABEL}: {result.scores()}",
                      [f"rouge: {result}", f"lead-{self.rouge.lead} baseline: {baseline}"],
                      metrics=result.metrics() | lead_metrics)

    def lead_baseline(self, sources: list[str], references: list[list[str]]) -> RougeResult:
        """The first sentences (or dialogue turns) of each whole source, normalized and scored exactly like the
        model; cached, since validation scores the same split many times."""
        key = hash((tuple(sources), tuple(map(tuple, references))))
        if key not in self._lead_cache:
            leads = [self.tokenizer.normalize_reference(lead(s, self.rouge.lead)) for s in sources]
            self._lead_cache[key] = corpus_rouge(leads, references, self.rouge.stemming)
        return self._lead_cache[key]

    def prepare_source_ids(self, ids: list[list[int]]) -> list[list[int]]:
        """Documents are truncated as in training (``task.data.truncate_source``), never rejected."""
        limit = self.truncate_source or int(getattr(self.model, "max_source_positions", 1024)) - 1
        return [i[:limit] for i in ids]
