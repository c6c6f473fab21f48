"""Word n-gram blocking: the moves it bans are exactly those a text-level reference calls repeats; a word may recur."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from seqmix.data.tokenizer import train_tokenizer
from seqmix.errors import SeqmixError
from seqmix.generation import BeamOptions, BeamSearch, ban_repeated_ngrams
from seqmix.generation.word_ngrams import WordBoundaries, ban_repeated_word_ngrams
from seqmix.mixers import LightConv
from seqmix.models import EncoderDecoder
from seqmix.tasks import SummarizationTask

EOS = 2
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
METASPACE = SPECIALS + ["▁a", "▁b", "▁", "#", "P", "1", "2", "b", "▁ab"]  # "▁" opens a word; "▁ab" = "▁a" "b"
MOSES = SPECIALS + ["a", "b", "a@@", "b@@", "#@@", "P@@", "1", "2", "#", "ab"]  # "@@" continues a word


def words_of(pieces: list[str], scheme: str, ended: bool) -> list[str]:
    """The finished words of a piece sequence, from its text alone (the reference): the last word counts only when
    the text ended (eos) or goes on with a space, or, with "@@" marks, when its last piece has none."""
    if scheme == "metaspace":
        text = "".join(pieces).replace("▁", " ")
        words = text.split()
        last_finished = ended or text.endswith(" ")
    else:
        text = " ".join(pieces).replace("@@ ", "")
        words = text.split()
        last_finished = ended or not pieces or not pieces[-1].endswith("@@")
        if text.endswith("@@"):
            words[-1] = words[-1][:-2]
    return words if last_finished or not words else words[:-1]


def repeats(words: list[str], n: int) -> bool:
    grams = [tuple(words[i: i + n]) for i in range(len(words) - n + 1)]
    return len(grams) != len(set(grams))


def boundaries(vocab: list[str], scheme: str) -> WordBoundaries:
    if scheme == "metaspace":
        return WordBoundaries([i < 4 or p.startswith("▁") for i, p in enumerate(vocab)], [False] * len(vocab),
                              [p.replace("▁", "") for p in vocab])
    return WordBoundaries([False] * len(vocab), [not p.endswith("@@") for p in vocab],
                          [p.removesuffix("@@") for p in vocab])


@pytest.mark.parametrize("scheme,vocab", [("metaspace", METASPACE), ("moses", MOSES)])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_banned_moves_are_exactly_those_that_finish_a_repeated_word_ngram(scheme, vocab, n):
    rng = random.Random(n)
    words = boundaries(vocab, scheme)
    checked = 0
    while checked < 60:
        tokens = [rng.randrange(4, len(vocab)) for _ in range(rng.randrange(1, 14))]
        pieces = [vocab[t] for t in tokens]
        if repeats(words_of(pieces, scheme, ended=False), n):
            continue  # a search never holds a repeat already
        lprobs = torch.zeros(1, len(vocab))
        ban_repeated_word_ngrams(lprobs, torch.tensor([tokens]), n, words, EOS)
        for t in range(4, len(vocab)):
            expected = repeats(words_of(pieces + [vocab[t]], scheme, ended=False), n)
            assert (lprobs[0, t] == float("-inf")) == expected, (pieces, vocab[t])
        assert (lprobs[0, EOS] == float("-inf")) == repeats(words_of(pieces, scheme, ended=True), n), pieces
        checked += 1


def test_a_word_level_vocabulary_blocks_as_token_blocking_does():
    rng = random.Random(0)
    vocab = 12
    words = WordBoundaries([False] * vocab, [True] * vocab, [f"w{i}" for i in range(vocab)])
    for _ in range(50):
        length = rng.randrange(2, 12)
        generated = torch.tensor([[rng.randrange(4, vocab) for _ in range(length)] for _ in range(3)])
        by_token, by_word = torch.zeros(3, vocab), torch.zeros(3, vocab)
        ban_repeated_ngrams(by_token, generated, 2)
        ban_repeated_word_ngrams(by_word, generated, 2, words, EOS)
        assert torch.equal(by_token, by_word)


def test_a_speaker_tag_may_recur_under_word_blocking_and_not_under_token_blocking():
    """BPE writes #Person2# as ▁ # Person 2 #: after #Person1# the pieces ▁ # Person are a held trigram."""
    tok = train_tokenizer(["#Person1# and #Person2# talk.", "#Person2# asks #Person1# why."] * 5, vocab_size=60,
                          min_frequency=1)
    held = tok.encode("#Person1# greets #Person")
    person = held[-1]
    assert tok.piece(person) == "Person" and tok.piece(held[-2]) == "#"
    generated = torch.tensor([held[:-1]])
    by_token, by_word = torch.zeros(1, tok.vocab_size), torch.zeros(1, tok.vocab_size)
    ban_repeated_ngrams(by_token, generated, 3)
    ban_repeated_word_ngrams(by_word, generated, 3, WordBoundaries(*tok.word_pieces()), tok.eos)
    assert by_token[0, person] == float("-inf")
    assert torch.isfinite(by_word[0]).all()
    # a repeated phrase of three words is still blocked: "#Person1# greets #Person1#" then "#Person1# greets"
    phrase = tok.encode("#Person1# greets #Person1# greets #Person1#")
    by_word = torch.zeros(1, tok.vocab_size)
    ban_repeated_word_ngrams(by_word, torch.tensor([phrase]), 3, WordBoundaries(*tok.word_pieces()), tok.eos)
    opens = WordBoundaries(*tok.word_pieces()).opens
    assert all(by_word[0, i] == float("-inf") for i in range(tok.vocab_size) if opens[i]) and by_word[0, tok.eos] < 0
    assert by_word[0, tok.eos] == float("-inf")


def test_rows_at_their_maximum_length_keep_eos():
    words = boundaries(METASPACE, "metaspace")
    a = METASPACE.index("▁a")
    generated = torch.tensor([[a, a], [a, a]])
    lprobs = torch.zeros(2, len(METASPACE))
    ban_repeated_word_ngrams(lprobs, generated, 1, words, EOS, keep_eos=torch.tensor([True, False]))
    assert lprobs[0, EOS] == 0 and lprobs[1, EOS] == float("-inf")


def test_word_blocking_needs_word_marks_and_a_known_unit():
    with pytest.raises(SeqmixError, match="no_repeat_ngram_unit=word needs"):
        BeamSearch(0, 2, 1, BeamOptions(no_repeat_ngram_size=3, no_repeat_ngram_unit="word"))
    with pytest.raises(SeqmixError, match="no_repeat_ngram_unit='words' is unknown"):
        BeamOptions(no_repeat_ngram_unit="words")
    with pytest.raises(SeqmixError, match="both open and close"):
        WordBoundaries([True, False], [True, True], ["a", "b"])


DOCS = ["#Person1#: Hello, how are you?\n#Person2#: Fine, thanks. And you?\n#Person1#: Good. #Person2#: Bye.",
        "The cat sat on the mat. It was warm. Then it slept. The cat woke."]


def test_summaries_under_word_blocking_hold_no_repeated_word_trigram():
    tok = train_tokenizer(DOCS, vocab_size=90, min_frequency=1)
    torch.manual_seed(0)
    mix = functools.partial(LightConv, num_heads=2, kernel_size=3)
    model = EncoderDecoder(tok.vocab_size, tok.vocab_size, tok.pad, 16, encoder=dict(layers=1, ffn_dim=32, mixer=mix),
                           decoder=dict(layers=1, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    task = SummarizationTask(model.eval(), tok, optimizer=torch.optim.Adam, generation=BeamOptions(
        beam_size=3, min_len_b=30, max_len_b=40, no_repeat_ngram_size=3, no_repeat_ngram_unit="word"))
    rows = [torch.tensor(tok.encode(d) + [tok.eos]) for d in DOCS]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad)
    for hyps in task.beam_search().generate(task.model, src):
        for h in hyps:
            words = tok.decode(h.tokens).split()
            assert len(words) >= 3 and not repeats(words, 3), words
    free = task.beam_search(no_repeat_ngram_size=0).generate(task.model, src)
    assert any(repeats(tok.decode(h.tokens).split(), 3) for hs in free for h in hs)  # so the bans did something
