"""Repeated-n-gram blocking over whole words (``no_repeat_ngram_unit=word``) instead of subword pieces.

fairseq's ``no_repeat_ngram_size`` counts n-grams of token ids. With a subword vocabulary that also forbids
repeating the pieces of one long word: seqmix's BPE writes ``#Person2#`` as ``▁ # Person 2 #``, so once
``#Person1#`` has been written the trigram ``▁ # Person`` is taken and every later speaker tag comes out as
``##Person2#``. Counting n-grams of words lets a word recur and still blocks a repeated phrase of n words.

A word is what the tokenizer says (:meth:`seqmix.data.tokenizer.Tokenizer.word_pieces`): a piece either opens a
word (a leading "▁": the word before it is finished only when the next word opens, or at eos) or closes its word (no
"@@" continuation, every token of a word-level vocabulary). So a repeat shows up in one of two ways:

- openers: the unfinished last word would complete a repeated n-gram if it ended now, so no piece that opens a word
  and no eos may follow; the hypothesis must continue the word (or drop out of the beam);
- closers: a candidate piece would finish a word that completes a repeated n-gram, so that piece is banned (exactly
  token blocking when every token is a word).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from seqmix.errors import SeqmixError


class WordBoundaries:
    """Which ids open a word, which close one (a vocabulary uses one kind of mark, not both on one id), and the text
    each id adds to its word without its marks: words are compared as text, so another segmentation of a word is the
    same word, and a bare "▁" before an opener (no text) is no word."""

    def __init__(self, opens: Sequence[bool], closes: Sequence[bool], texts: Sequence[str]) -> None:
        if not len(opens) == len(closes) == len(texts):
            raise SeqmixError(f"word marks for {len(opens)}, {len(closes)} and {len(texts)} ids: one of each per id")
        both = [i for i, (o, c) in enumerate(zip(opens, closes)) if o and c]
        if both:
            raise SeqmixError(f"ids {both[:5]} both open and close a word; a vocabulary marks one or the other")
        self.opens, self.closes, self.texts = [bool(o) for o in opens], [bool(c) for c in closes], list(texts)
        self.opener_ids = torch.tensor([i for i, o in enumerate(self.opens) if o], dtype=torch.long)
        self.closers_by_text: dict[str, list[int]] = {}
        for i, (c, text) in enumerate(zip(self.closes, self.texts)):
            if c:
                self.closers_by_text.setdefault(text, []).append(i)

    def split(self, tokens: list[int]) -> tuple[list[str], str]:
        """(the finished words, the text of the unfinished last word: empty when the last token closed its word)."""
        words, current, started = [], "", False
        for t in tokens:
            if started and self.opens[t]:
                if current:
                    words.append(current)
                current, started = "", False
            current += self.texts[t]
            started = True
            if self.closes[t]:
                words.append(current)
                current, started = "", False
        return words, current


def word_boundaries_for(options, tokenizer) -> WordBoundaries | None:
    """The word marks a search with ``options`` (BeamOptions) needs from ``tokenizer``: None unless it blocks word
    n-grams."""
    if options.no_repeat_ngram_size <= 0 or options.no_repeat_ngram_unit != "word":
        return None
    return WordBoundaries(*tokenizer.word_pieces())


def ban_repeated_word_ngrams(lprobs: Tensor, generated: Tensor, n: int, words: WordBoundaries, eos: int,
                             keep_eos: Tensor | None = None) -> None:
    """Set -inf in ``lprobs`` (rows, V) for every move of a row of ``generated`` that would finish a word making an
    n-gram of words that the row already holds; ``keep_eos`` rows (at their maximum length) keep eos."""
    if n <= 0 or generated.size(1) == 0:
        return
    vocab = lprobs.size(1)
    if len(words.opens) < vocab:
        raise SeqmixError(f"word marks cover {len(words.opens)} ids and the model predicts {vocab}: the tokenizer "
                          "and the model do not belong together")
    stop_rows, banned_rows, banned_ids = [], [], []
    for row, tokens in enumerate(generated.tolist()):
        done, current = words.split(tokens)
        if len(done) < n:
            continue
        grams = {tuple(done[i: i + n]) for i in range(len(done) - n + 1)}
        context = tuple(done[len(done) - n + 1:])  # the last n - 1 finished words
        if current and context + (current,) in grams:
            stop_rows.append(row)
        for gram in grams if words.closers_by_text else ():  # closers: finishing the word with one more piece
            last = gram[-1]
            if gram[:-1] == context and len(last) > len(current) and last.startswith(current):
                for t in words.closers_by_text.get(last[len(current):], ()):
                    banned_rows.append(row)
                    banned_ids.append(t)
    if banned_rows:
        lprobs[banned_rows, banned_ids] = -math.inf
    if stop_rows:
        rows = torch.tensor(stop_rows, dtype=torch.long, device=lprobs.device)
        openers = words.opener_ids[words.opener_ids != eos].to(lprobs.device)  # eos: below, as keep_eos says
        if openers.numel():
            lprobs[rows.unsqueeze(1), openers.unsqueeze(0)] = -math.inf
        if keep_eos is not None:
            rows = rows[~keep_eos.to(rows.device)[rows]]
        lprobs[rows, eos] = -math.inf
