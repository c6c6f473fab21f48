"""Joint BPE subword tokenizer (Hugging Face ``tokenizers``) with lossless decoding, or a word-level vocabulary.

Decoding is exact up to the tokenizer's normalizer, which is what :meth:`Tokenizer.normalize_reference` applies:
NFKC (so e.g. NBSP becomes a space), every whitespace run becomes one space, leading/trailing whitespace is
stripped, and lowercasing when ``lowercase``. So ``decode(encode(s)) == normalize_reference(s)`` for any ``s``
whose characters were seen in training (others decode as ``<unk>``) and that does not contain U+2581 ("▁",
which decodes as a space). Scoring hypotheses against ``normalize_reference(ref)`` is therefore fair.

The word-level kind (``kind="word"``, for pre-tokenized language-modeling data such as WikiText) splits on
whitespace only; its ids after the specials are sorted by training frequency, which adaptive input/softmax
cutoffs rely on. Words outside the vocabulary (and a literal ``<unk>`` in the data) map to the unk id.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as _HFTokenizer

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text

if TYPE_CHECKING:
    from seqmix.data.moses_subword import MosesSubwordTokenizer

SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0,1,2,3 (fairseq order)
_FORMAT = "seqmix-bpe-v1"  # bump when the pipeline below changes, so old caches are not reused
_FORMATS = {"bpe": _FORMAT, "word": "seqmix-word-v1"}
TOKENIZER_KINDS = tuple(_FORMATS)  # what task.data.tokenizer.kind may be
_MOSES_SUBWORD_FORMAT = "seqmix-moses-subword-v1"  # seqmix.data.moses_subword.FORMAT (not imported: no cycle)


class Tokenizer:
    """Text <-> ids, with the special ids a seq2seq model needs."""

    bos, pad, eos, unk = 0, 1, 2, 3
    joint = True  # one vocabulary for source and target (MosesSubwordTokenizer may have two)

    def __init__(self, hf: _HFTokenizer, lowercase: bool, kind: str = "bpe"):
        for i, tok in enumerate(SPECIALS):
            if hf.token_to_id(tok) != i:
                raise SeqmixError(f"tokenizer file maps {tok!r} to id {hf.token_to_id(tok)}, expected {i}; "
                                  "delete the cached tokenizer so it is retrained")
        hf.encode_special_tokens = True  # a literal "<s>" in the data is text, not the bos id
        self._hf, self.lowercase, self.kind = hf, lowercase, kind
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Subword ids, no bos/eos added."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Like :meth:`encode`, parallelized in Rust."""
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def encode_target(self, text: str) -> list[int]:
        """Target-side ids: the same as :meth:`encode` (one joint vocabulary)."""
        return self.encode(text)

    def encode_target_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encode_batch(texts)

    @property
    def source_vocab_size(self) -> int:
        return self.vocab_size

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every id of every text in one int64 array, each text's size): a chunk of a corpus ready for a token
        store, without per-token Python lists outliving the call (ids equal :meth:`encode`'s)."""
        ids = [e.ids for e in self._hf.encode_batch_fast(list(texts), add_special_tokens=False)]
        sizes = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(sizes.sum())), sizes

    def content_hash(self) -> str:
        """sha256 of the serialized tokenizer: token stores record it, so ids from another vocabulary are refused."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def decode(self, ids) -> str:
        """Detokenized text up to the first eos; bos and pad are dropped, unknown pieces show as ``<unk>``."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos:
                break
            if i not in (self.bos, self.pad):
                out.append(i)
        return self._hf.decode(out, skip_special_tokens=False)

    def piece(self, i: int, side: str = "target") -> str:
        """The vocabulary piece of id ``i`` (one vocabulary for both sides)."""
        return self._hf.id_to_token(int(i)) or "<unk>"

    def word_pieces(self) -> tuple[list[bool], list[bool], list[str]]:
        """(opens, closes, texts) per id, for blocking repeated word n-grams: a BPE piece with a leading "▁" opens a
        word (the specials stand alone) and adds its text without the "▁"; in a word-level vocabulary every id is a
        whole word, so it closes one."""
        n = self.vocab_size
        pieces = [self._hf.id_to_token(i) or "" for i in range(n)]
        if self.kind == "word":
            return [False] * n, [True] * n, pieces
        return ([i < len(SPECIALS) or p.startswith("▁") for i, p in enumerate(pieces)], [False] * n,
                [p if i < len(SPECIALS) else p.replace("▁", "") for i, p in enumerate(pieces)])

    def normalize_reference(self, text: str) -> str:
        """The form ``decode`` produces for ``text``: what references must look like for scoring."""
        return self._hf.normalizer.normalize_str(text)

    def to_json(self) -> str:
        return json.dumps({"format": _FORMATS[self.kind], "lowercase": self.lowercase,
                           "hf": json.loads(self._hf.to_str())})

    @classmethod
    def from_json(cls, s: str) -> Tokenizer | MosesSubwordTokenizer:
        """Either kind: the JSON's "format" picks the class (fairseq-style tokenizers live in moses_subword)."""
        data = json.loads(s)
        if isinstance(data, dict) and data.get("format") == _MOSES_SUBWORD_FORMAT:
            # imported here: no import cycle, and sacremoses/subword-nmt load only when this kind is used
            from seqmix.data.moses_subword import MosesSubwordTokenizer

            return MosesSubwordTokenizer.from_json(s)
        kinds = {v: k for k, v in _FORMATS.items()}
        if not isinstance(data, dict) or data.get("format") not in kinds:
            raise SeqmixError(f"not a seqmix tokenizer file ({' or '.join([*kinds, _MOSES_SUBWORD_FORMAT])}); "
                              "delete it so the tokenizer is retrained")
        return cls(_HFTokenizer.from_str(json.dumps(data["hf"])), lowercase=bool(data["lowercase"]),
                   kind=kinds[data["format"]])

    def save(self, path) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path) -> Tokenizer | MosesSubwordTokenizer:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise SeqmixError(f"cannot read tokenizer file {path} ({e}); check the path") from e
        return cls.from_json(text)


def _normalizer(lowercase: bool, unicode: bool = True) -> normalizers.Normalizer:
    """NFKC (BPE only: word-level data is already tokenized, so distinct words stay distinct), one space for
    every whitespace run, stripped, optionally lowercased."""
    steps = [normalizers.NFKC()] if unicode else []
    steps += [normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    return normalizers.Sequence(steps + ([normalizers.Lowercase()] if lowercase else []))


def _build_hf(lowercase: bool) -> _HFTokenizer:
    """Metaspace keeps word boundaries as "▁" so decoding restores spaces exactly; punctuation and digits are
    split off so BPE does not learn "dog." and "dog," as separate words."""
    hf = _HFTokenizer(models.BPE(unk_token="<unk>"))
    hf.normalizer = _normalizer(lowercase)
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        pre_tokenizers.Punctuation("isolated"),
        pre_tokenizers.Digits(individual_digits=True),
    ])
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return hf


def train_word_tokenizer(texts: Iterable[str], vocab_size: int, lowercase: bool = False,
                         min_frequency: int = 1) -> Tokenizer:
    """Whitespace words seen at least ``min_frequency`` times, most frequent first, at most ``vocab_size`` ids
    including the specials. The vocabulary is built here rather than by ``WordLevelTrainer``, which would give a
    literal ``<unk>`` in the data an id of its own."""
    norm = _normalizer(lowercase, unicode=False)
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(norm.normalize_str(text).split())
    for special in SPECIALS:
        counts.pop(special, None)
    words = sorted((w for w, c in counts.items() if c >= min_frequency), key=lambda w: (-counts[w], w))
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update((w, len(SPECIALS) + i) for i, w in enumerate(words[: vocab_size - len(SPECIALS)]))
    if len(vocab) == len(SPECIALS):
        raise SeqmixError("the tokenizer training text is empty; check the train split of the data")
    hf = _HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.normalizer = norm
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return Tokenizer(hf, lowercase, kind="word")


def train_tokenizer(texts: Iterable[str], vocab_size: int, lowercase: bool = False,
                    min_frequency: int = 2, kind: str = "bpe") -> Tokenizer:
    """Train BPE (or a word vocabulary, ``kind="word"``) on ``texts`` (source and target together for a joint
    vocabulary)."""
    if kind not in _FORMATS:
        raise SeqmixError(f"tokenizer kind {kind!r} is unknown; set task.data.tokenizer.kind to one of "
                          f"{sorted(_FORMATS)}")
    if vocab_size <= len(SPECIALS):
        raise SeqmixError(f"tokenizer vocab_size={vocab_size} is too small; set task.data.tokenizer.vocab_size "
                          f"well above {len(SPECIALS)} (e.g. 8000)")
    if kind == "word":
        return train_word_tokenizer(texts, vocab_size, lowercase, min_frequency)
    hf = _build_hf(lowercase)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIALS), show_progress=False)
    hf.train_from_iterator(texts, trainer)
    if hf.get_vocab_size() <= len(SPECIALS):
        raise SeqmixError("the tokenizer training text is empty; check the train split of the data")
    return Tokenizer(hf, lowercase)


def given_tokenizer(path) -> Tokenizer | MosesSubwordTokenizer:
    """``task.data.tokenizer.file``: a tokenizer.json, or a seqmix checkpoint whose vocabulary to reuse (a teacher's
    for its students, as fairseq-preprocess takes ``--srcdict``), instead of one learned from the train split."""
    path = Path(os.path.expanduser(str(path)))
    if not path.is_file():
        raise SeqmixError(f"task.data.tokenizer.file={path} does not exist; give a tokenizer.json or a seqmix "
                          "checkpoint (.ckpt)")
    if path.suffix == ".json":
        return Tokenizer.load(path)
    try:
        text = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["seqmix"]["tokenizer"]
    except Exception as err:  # not a checkpoint, truncated, or one without a tokenizer
        raise SeqmixError(f"task.data.tokenizer.file={path} is neither a tokenizer.json nor a seqmix checkpoint "
                          f"holding its tokenizer ({type(err).__name__}); give one of those") from None
    return Tokenizer.from_json(text)


def tokenizer_cache_key(vocab_size: int, lowercase: bool, min_frequency: int, key_parts: dict,
                        kind: str = "bpe") -> str:
    """sha256 over every setting and the caller's content fingerprint: any change gives a new cache entry."""
    parts = {**key_parts, "vocab_size": vocab_size, "lowercase": lowercase, "min_frequency": min_frequency,
             "format": _FORMATS.get(kind, kind)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load_or_train_tokenizer(texts_fn: Callable[[], Iterable[str]], vocab_size: int, lowercase: bool,
                            cache_dir: str, key_parts: dict, min_frequency: int = 2, kind: str = "bpe") -> Tokenizer:
    """Load ``cache_dir/<key>/tokenizer.json`` or train and store it; ``texts_fn`` is only called on a miss.

    ``key_parts`` must include a fingerprint of the training text, or a changed corpus would hit a stale entry.
    """
    key = tokenizer_cache_key(vocab_size, lowercase, min_frequency, key_parts, kind)
    path = Path(os.path.expanduser(cache_dir)) / key / "tokenizer.json"
    if path.is_file():
        return Tokenizer.load(path)
    tok = train_tokenizer(texts_fn(), vocab_size, lowercase=lowercase, min_frequency=min_frequency, kind=kind)
    try:
        tok.save(path)
    except OSError as e:
        raise SeqmixError(f"cannot write the tokenizer cache {path} ({e}); set task.data.cache_dir to a "
                          "writable directory") from e
    return tok
