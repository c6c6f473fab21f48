"""fairseq-style text handling: Moses tokenization, subword-nmt BPE and fairseq dictionaries.

fairseq's released translation models (LightConv/DynamicConv, ConvS2S, Transformer) were trained on text that went
through ``tokenizer.perl`` (here: sacremoses, with fairseq's defaults: HTML escaping and aggressive dash splits),
subword-nmt's ``apply_bpe`` (``@@ `` marks a word that continues) and a ``dict.<lang>.txt`` per language. This
tokenizer reproduces that pipeline so such a model gets the ids it was trained on, and undoes it on the target
side so hypotheses are plain text comparable with raw references. The BPE is subword-nmt's own ``BPE`` class on
the codes text, because a ``dict.txt`` lacks the intermediate merge products a rebuilt BPE model would need.

Source and target may have separate dictionaries (and languages): :meth:`encode` is the source side,
:meth:`encode_target` and :meth:`decode` the target side.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from itertools import chain

import numpy as np
from sacremoses import MosesDetokenizer, MosesTokenizer
from subword_nmt.apply_bpe import BPE

from seqmix.data.fairseq_dictionary import FairseqDictionary
from seqmix.errors import SeqmixError

FORMAT = "seqmix-moses-subword-v1"
BPE_SEPARATOR = "@@"


def check_bpe_codes(codes: str) -> None:
    """Refuse codes text that subword-nmt would reject with ``sys.exit`` (or misread), with a message saying
    which line and what to do."""
    if not isinstance(codes, str):
        raise SeqmixError(f"bpe_codes must be the text of a subword-nmt codes file, got {type(codes).__name__}")
    if "\n" not in codes.strip() and os.path.isfile(codes):
        raise SeqmixError(f"bpe_codes is a file name ({codes}); pass the file's text (Path(...).read_text())")
    lines = codes.split("\n")
    offset = 1
    if lines and lines[0].startswith("#version:"):
        declared = (lines[0].split() or [""])[-1]
        try:
            version = tuple(int(x) for x in re.sub(r"(\.0+)*$", "", declared).split("."))
        except ValueError:
            version = None
        if version not in ((0, 1), (0, 2)):
            raise SeqmixError(f"BPE codes declare {lines[0].strip()!r}; subword-nmt reads only '#version: 0.1' "
                              "and '#version: 0.2' codes, so relearn them with subword-nmt learn-bpe")
        lines, offset = lines[1:], 2
    body = "\n".join(lines).rstrip("\n")
    if not body:
        raise SeqmixError("the BPE codes hold no merge lines; pass bpe_codes=None when the text is not BPE-split")
    for i, line in enumerate(body.split("\n")):
        units = line.strip("\r\n ").split(" ")
        if len(units) == 2 and all(units):
            continue
        hint = ("it looks like fastBPE codes (left right count): drop the count column"
                if len(units) == 3 and units[2].isdigit() else "each line must be two subword units separated by "
                "one space")
        raise SeqmixError(f"BPE codes line {i + offset} ({line.strip()!r}) is not a subword-nmt merge; {hint}")


class MosesSubwordTokenizer:
    """Text <-> fairseq ids through Moses tokenization, subword-nmt BPE and fairseq dictionaries.

    ``bpe_codes`` is the text of a subword-nmt codes file (None: the text is already BPE-split, or no BPE);
    ``moses=False`` treats input as already tokenized (whitespace split) and leaves decoded tokens joined by
    spaces. ``escape``/``aggressive_dash_splits`` default to what fairseq's ``moses`` tokenizer passes
    (``tokenizer.perl`` without ``-a``, used for some old fconv data, corresponds to
    ``aggressive_dash_splits=False``).
    """

    bos, pad, eos, unk = 0, 1, 2, 3
    kind = "moses_subword"
    lowercase = False

    def __init__(self, source_dict: FairseqDictionary, target_dict: FairseqDictionary, source_lang: str,
                 target_lang: str, bpe_codes: str | None = None, moses: bool = True, *, escape: bool = True,
                 aggressive_dash_splits: bool = True):
        for side, d in (("source", source_dict), ("target", target_dict)):
            if not isinstance(d, FairseqDictionary):
                raise SeqmixError(f"the {side} dictionary must be a FairseqDictionary (load it with "
                                  f"FairseqDictionary.load('dict.<lang>.txt')), got {type(d).__name__}")
        for side, lang in (("source", source_lang), ("target", target_lang)):
            if not isinstance(lang, str) or not lang:
                raise SeqmixError(f"the {side} language must be a language code such as 'en', got {lang!r}")
        self.source_dict, self.target_dict = source_dict, target_dict
        self.source_lang, self.target_lang = source_lang, target_lang
        self.bpe_codes, self.moses = bpe_codes, bool(moses)
        self.escape, self.aggressive_dash_splits = bool(escape), bool(aggressive_dash_splits)
        self._bpe = None
        if bpe_codes is not None:
            check_bpe_codes(bpe_codes)
            # fairseq's subword_nmt wrapper: all merges, '@@' separator, no vocabulary filter, no glossaries
            self._bpe = BPE(io.StringIO(bpe_codes), -1, BPE_SEPARATOR, None, None)
        self._tok, self._detok = {}, None
        if self.moses:
            self._tok = {lang: MosesTokenizer(lang) for lang in {source_lang, target_lang}}
            self._detok = MosesDetokenizer(target_lang)

    # -- sizes -----------------------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The target dictionary's size: the output layer's rows."""
        return len(self.target_dict)

    @property
    def source_vocab_size(self) -> int:
        return len(self.source_dict)

    @property
    def target_vocab_size(self) -> int:
        return len(self.target_dict)

    @property
    def joint(self) -> bool:
        """One vocabulary for both sides (fairseq's ``--joined-dictionary``), which embedding sharing needs."""
        return self.source_dict == self.target_dict

    # -- encoding --------------------------------------------------------------------------------------------

    def _pieces(self, text: str, lang: str) -> list[str]:
        """Moses tokens, then BPE units; tokens are whitespace-split first: subword-nmt splits on ' ' only."""
        if self.moses:
            text = self._tok[lang].tokenize(text, aggressive_dash_splits=self.aggressive_dash_splits,
                                            return_str=True, escape=self.escape)
        tokens = text.split()
        return self._bpe.segment_tokens(tokens) if self._bpe is not None else tokens

    @staticmethod
    def _ids(pieces: list[str], dictionary: FairseqDictionary) -> list[int]:
        """Dictionary ids; a piece that spells ``<s>``/``<pad>``/``</s>`` is text, so it maps to unk."""
        ids = [dictionary.index(p) for p in pieces]
        return [FairseqDictionary.unk if i < FairseqDictionary.unk else i for i in ids]

    def encode(self, text: str) -> list[int]:
        """Source-side ids, no bos/eos added (seqmix's collate appends eos)."""
        return self._ids(self._pieces(text, self.source_lang), self.source_dict)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_target(self, text: str) -> list[int]:
        """Target-side ids (target language's Moses rules, target dictionary), no bos/eos added."""
        return self._ids(self._pieces(text, self.target_lang), self.target_dict)

    def encode_target_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode_target(t) for t in texts]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(every source id of every text in one int64 array, each text's size), as ``Tokenizer.encode_flat``."""
        ids = self.encode_batch(list(texts))
        sizes = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(sizes.sum())), sizes

    # -- decoding --------------------------------------------------------------------------------------------

    def decode(self, ids) -> str:
        """Target ids -> plain text: up to the first eos, bos/pad dropped, ``<unk>`` kept as ``<unk>``, BPE undone
        as fairseq does (``"@@ "`` removed, a final ``@@`` dropped), then Moses-detokenized."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        n = len(self.target_dict)
        pieces = []
        for i in ids:
            i = int(i)
            if i == self.eos:
                break
            if i in (self.bos, self.pad):
                continue
            if not 0 <= i < n:
                raise SeqmixError(f"id {i} is outside the target dictionary ({n} symbols): the model and "
                                  "dictionary do not belong together; load the dict.<lang>.txt the model was "
                                  "trained with")
            pieces.append(self.target_dict[i])
        text = (" ".join(pieces) + " ").replace(BPE_SEPARATOR + " ", "").rstrip()
        if self.moses:
            return self._detok.detokenize(text.split(), unescape=self.escape)
        return text

    def piece(self, i: int, side: str = "target") -> str:
        """The dictionary symbol of id ``i`` on ``side`` (source | target)."""
        dictionary = self.source_dict if side == "source" else self.target_dict
        return dictionary[int(i)] if 0 <= int(i) < len(dictionary) else "<unk>"

    def word_pieces(self) -> tuple[list[bool], list[bool], list[str]]:
        """(opens, closes, texts) per target id: a piece without the "@@" continuation ends its (Moses) word."""
        pieces = [self.target_dict[i] for i in range(len(self.target_dict))]
        closes = [not p.endswith(BPE_SEPARATOR) for p in pieces]
        return [False] * len(pieces), closes, [p.removesuffix(BPE_SEPARATOR) for p in pieces]

    def normalize_reference(self, text: str) -> str:
        """Raw references are compared with detokenized hypotheses: only whitespace runs are collapsed."""
        return " ".join(text.split())

    # -- serialization ---------------------------------------------------------------------------------------

    def to_json(self) -> str:
        """Self-contained: both dictionaries' lines, languages, the codes text and the Moses settings."""
        source_lines = self.source_dict.to_lines()
        target_lines = self.target_dict.to_lines()
        return json.dumps({
            "format": FORMAT, "source_lang": self.source_lang, "target_lang": self.target_lang,
            "moses": self.moses, "escape": self.escape, "aggressive_dash_splits": self.aggressive_dash_splits,
            "bpe_codes": self.bpe_codes, "source_dict": source_lines,
            "target_dict": None if target_lines == source_lines else target_lines,
        }, ensure_ascii=False)

    @classmethod
    def from_json(cls, s: str) -> MosesSubwordTokenizer:
        try:
            data = json.loads(s)
        except (TypeError, ValueError):
            data = None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SeqmixError(f"not a {FORMAT} tokenizer; rebuild it from the model's dict.<lang>.txt files and "
                              "BPE codes")
        try:
            source = FairseqDictionary.from_lines(data["source_dict"], name="<tokenizer source_dict>")
            target = (source if data["target_dict"] is None
                      else FairseqDictionary.from_lines(data["target_dict"], name="<tokenizer target_dict>"))
            return cls(source, target, data["source_lang"], data["target_lang"], bpe_codes=data["bpe_codes"],
                       moses=data["moses"], escape=data["escape"],
                       aggressive_dash_splits=data["aggressive_dash_splits"])
        except (KeyError, TypeError) as e:
            raise SeqmixError(f"the {FORMAT} tokenizer is incomplete (missing or malformed {e}); rebuild it from "
                              "the model's dict.<lang>.txt files and BPE codes") from None

    def content_hash(self) -> str:
        """sha256 of :meth:`to_json`: token stores record it, so ids from another vocabulary are refused."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def __reduce__(self):
        # DataLoader workers get a fresh instance from the JSON form (no Moses/BPE internals are pickled)
        return (type(self).from_json, (self.to_json(),))
