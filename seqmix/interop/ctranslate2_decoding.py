"""Decoding a seqmix CTranslate2 export (``python -m seqmix.interop.ctranslate2 export``) as seqmix decodes.

:class:`CT2Translator` tokenizes with the checkpoint's own tokenizer, runs ``ctranslate2.Translator.translate_batch``
with seqmix's beam settings and detokenizes. How seqmix's settings map (checked against CTranslate2 4.x's beam
search, ``src/decoding.cc``, and by tests/interop/test_ctranslate2.py):

- score: both divide the summed log-probabilities by ``length ** len_penalty``; seqmix's length counts the eos, and
  CTranslate2's counts the tokens it returns, so ``return_end_token=True`` (the eos is stripped here afterwards);
- candidates: both take the best 2k extensions, end hypotheses only among the best k, stop a sentence once k are
  finished (``patience=1``) and start from one live beam;
- lengths: seqmix allows ``max_len = max_len_a * src_len + max_len_b`` tokens plus the eos (src_len counts the
  source's eos; at most ``max_target_positions - 1``), so ``max_decoding_length = max_len + 1``, grouped per distinct
  bound when ``max_len_a != 0``; ``min_decoding_length = min_len`` (both ban eos before that step, but CTranslate2
  bans it before the log-softmax: while ``min_len`` applies, every other token's log-probability is renormalized,
  which raises a score by ``-log(1 - p(eos))`` of those steps, a few 1e-3 on a small model; with ``min_len_b=0``
  the scores agree to float32 rounding). At the cap
  seqmix forces eos while CTranslate2 ends the hypothesis with whatever token comes: outputs that run into the cap
  may differ (the eos, and its log-probability in the score);
- pad and bos: seqmix sets their log-probabilities to -inf after the log-softmax; CTranslate2's
  ``suppress_sequences`` masks them before it, which renormalizes every other token's log-probability (by up to
  0.1 per sentence on a small model). So they are not suppressed by default (the scores agree): a trained model
  gives them next to no probability, and ``tokenizer.decode`` drops them anyway; ``suppress_specials=True``
  bans them at the price of slightly higher scores;
- ``len_penalty=0``: CTranslate2 stops a sentence once its best hypothesis ends (seqmix waits for k): the best
  hypothesis is the same, the runners-up may differ.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from seqmix.errors import SeqmixError
from seqmix.generation.options import BeamOptions
from seqmix.interop.ctranslate2 import (
    MODEL_FILE,
    SERVING_FILE,
    TOKENIZER_FILE,
    require_ctranslate2,
    vocabulary,
)


@dataclass
class CT2Hypothesis:
    text: str
    tokens: list[int]  # seqmix target ids, without the eos
    score: float | None  # sum(log p) / (len + 1) ** len_penalty, eos counted (None unless return_scores)


class CT2Translator:
    """A CTranslate2 export decoded with seqmix's tokenizer and beam settings (the checkpoint's, unless overridden
    per call). ``intra_threads``: threads per translation (0: CTranslate2's default, 4 or the core count)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", compute_type: str = "default",
                 intra_threads: int = 0, inter_threads: int = 1) -> None:
        from seqmix.data import Tokenizer

        ctranslate2 = require_ctranslate2()
        model_dir = Path(model_dir)
        if not (model_dir / MODEL_FILE).is_file() or not (model_dir / SERVING_FILE).is_file():
            raise SeqmixError(f"{model_dir} is not a seqmix CTranslate2 export (no {MODEL_FILE} and {SERVING_FILE}); "
                              "make one with python -m seqmix.interop.ctranslate2 export <ckpt> --out <dir>")
        self.info = json.loads((model_dir / SERVING_FILE).read_text(encoding="utf-8"))
        self.tokenizer = Tokenizer.from_json((model_dir / TOKENIZER_FILE).read_text(encoding="utf-8"))
        self.source_pieces = vocabulary(self.tokenizer, "source")
        target = vocabulary(self.tokenizer, "target")
        self.target_ids = {piece: i for i, piece in reversed(list(enumerate(target)))}
        self.generation = BeamOptions(**self.info["generation"])
        try:
            self.translator = ctranslate2.Translator(str(model_dir), device=device, compute_type=compute_type,
                                                     intra_threads=intra_threads, inter_threads=inter_threads)
        except (RuntimeError, ValueError) as err:
            raise SeqmixError(f"CTranslate2 cannot load {model_dir} on {device} with compute_type={compute_type} "
                              f"({err})") from None

    def options(self, **overrides) -> BeamOptions:
        from seqmix.generation.options import overridden

        options = overridden(self.generation, overrides, "CTranslate2 decoding")
        if options.stepwise_len_penalty:
            raise SeqmixError("stepwise_len_penalty has no CTranslate2 equivalent: decode with seqmix, or pass "
                              "stepwise_len_penalty=False")
        if options.no_repeat_ngram_size > 0 and options.no_repeat_ngram_unit == "word":
            raise SeqmixError("no_repeat_ngram_unit=word has no CTranslate2 equivalent (it blocks token n-grams): "
                              "decode with seqmix, or pass no_repeat_ngram_unit=token")
        return options

    def length_bounds(self, source_len: int, o: BeamOptions) -> tuple[int, int]:
        """seqmix's (min_len, max_len) for a source of ``source_len`` tokens with its eos (BeamSearch.length_bounds)."""
        max_len = int(o.max_len_a * source_len + o.max_len_b)
        max_len = max(1, min(max_len, int(self.info["max_target_positions"]) - 1))
        min_len = max(0, int(o.min_len_a * source_len + o.min_len_b))
        return min(min_len, max_len), max_len

    def translate_hypotheses(self, texts: list[str], max_batch_size: int = 64, return_scores: bool = True,
                             suppress_specials: bool = False, batch_type: str = "examples",
                             **overrides) -> list[CT2Hypothesis]:
        """The best hypothesis of each text, with its seqmix ids and (``return_scores``) its score. Batches of at most
        ``max_batch_size`` examples, or source tokens with ``batch_type="tokens"`` (CTranslate2 sorts by length)."""
        o = self.options(**overrides)
        ids = self.tokenizer.encode_batch(list(texts))
        longest = int(self.info["max_source_positions"])
        too_long = [i + 1 for i, s in enumerate(ids) if len(s) + 1 > longest]
        if too_long:  # CTranslate2's position table ends there, as seqmix's does (TranslationTask.prepare_source_ids)
            raise SeqmixError(f"{len(too_long)} inputs are longer than the model's max_source_positions={longest} "
                              f"tokens (inputs {too_long[:5]}...); split or shorten them")
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, s in enumerate(ids):
            groups[self.length_bounds(len(s) + 1, o)].append(i)
        out: list[CT2Hypothesis | None] = [None] * len(ids)
        eos = self.tokenizer.eos
        for (min_len, max_len), rows in groups.items():
            results = self.translator.translate_batch(
                [[self.source_pieces[t] for t in ids[i]] for i in rows], max_batch_size=max_batch_size,
                batch_type=batch_type,
                beam_size=o.beam_size, length_penalty=o.len_penalty, patience=1.0, num_hypotheses=1,
                no_repeat_ngram_size=o.no_repeat_ngram_size,
                suppress_sequences=[["<pad>"], ["<s>"]] if suppress_specials else None,
                return_end_token=True, max_decoding_length=max_len + 1, min_decoding_length=min_len,
                max_input_length=0, return_scores=return_scores)
            for i, result in zip(rows, results):
                tokens = [self.target_ids.get(p, self.tokenizer.unk) for p in result.hypotheses[0]]
                if tokens and tokens[-1] == eos:
                    tokens = tokens[:-1]
                score = float(result.scores[0]) if return_scores else None
                out[i] = CT2Hypothesis(self.tokenizer.decode(tokens), tokens, score)
        return out

    def translate(self, texts: list[str] | str, max_batch_size: int = 64, batch_type: str = "examples",
                  **overrides) -> list[str] | str:
        """Detokenized translations (one string for one string), as ``seqmix.load(ckpt).translate`` gives them."""
        single = isinstance(texts, str)
        hyps = self.translate_hypotheses([texts] if single else texts, max_batch_size, return_scores=False,
                                         batch_type=batch_type, **overrides)
        return hyps[0].text if single else [h.text for h in hyps]
