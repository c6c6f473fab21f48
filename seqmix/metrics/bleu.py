"""Corpus BLEU through sacreBLEU, always reported with its signature; and the papers' tokenized BLEU beside it.

sacreBLEU (detokenized text, its own tokenizer) is the headline. The papers seqmix reproduces report *tokenized*
BLEU instead (multi-bleu.perl on Moses-tokenized text), a different number, so
:func:`paper_bleu` computes that too, named exactly in its signature:

- ``tokenized``: hypotheses and references Moses-tokenized (sacremoses, the target language, tokenizer.perl's
  defaults: no aggressive dash splitting), then BLEU on their whitespace tokens (sacreBLEU ``tokenize="none"``),
  case-sensitive (Wu et al. 2019 for WMT En-Fr: "case-sensitive tokenized BLEU" with multi-bleu.perl);
- ``tokenized_lowercase``: the same, lowercased (IWSLT'14 De-En; most Multi30k papers, via ``multi-bleu.perl -lc``);
- ``compound_split``: ``tokenized``, then every hyphen between two non-spaces split off as ``##AT##-##AT##``
  (``Konferenz-Zentrum`` -> ``Konferenz ##AT##-##AT## Zentrum``), left to right without overlaps, the way the
  WMT En-De papers (Vaswani et al. 2017 and those after it) scored.

``pretokenized=True`` says the text is Moses-tokenized already (fairseq-prepared data such as IWSLT'14): it is
scored as it is, since tokenizing tokenized text again changes it (``it 's`` -> ``it ' s``). Moses escaping
(``&quot;`` ...) is left out: it rewrites characters inside tokens one for one, so BLEU is the same either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.metadata import version

from sacrebleu.metrics import BLEU

PAPER_BLEU_KINDS = ("tokenized", "tokenized_lowercase", "compound_split")
_COMPOUND = re.compile(r"(\S)-(\S)")


@dataclass
class BleuResult:
    score: float
    signature: str
    text: str  # sacreBLEU's one-line summary (score, n-gram precisions, BP, lengths)
    bp: float = 1.0  # brevity penalty
    length_ratio: float = 1.0  # hypothesis / reference length, in the metric's tokens

    def __str__(self) -> str:
        return f"{self.signature} = {self.text}"


@dataclass(frozen=True)
class BleuOptions:
    """sacreBLEU's settings (``corpus_bleu``) and the papers' BLEU to report beside it (``paper``: one kind of
    ``PAPER_BLEU_KINDS`` or a list of them, the first being the one logged as ``bleu_paper``; ``lang``: the target
    language Moses tokenizes, filled from ``task.tgt_lang``; ``pretokenized``: the text is Moses-tokenized already)."""

    tokenize: str = "13a"
    lowercase: bool = False
    paper: tuple[str, ...] = field(default=())
    pretokenized: bool = False
    lang: str | None = None

    def __post_init__(self):
        kinds = () if self.paper is None else (self.paper,) if isinstance(self.paper, str) else tuple(self.paper)
        unknown = [k for k in kinds if k not in PAPER_BLEU_KINDS]
        if unknown or len(set(kinds)) != len(kinds):
            raise ValueError(f"task.bleu.paper={list(kinds)}: give null, one of {list(PAPER_BLEU_KINDS)} or a list "
                              "of them without repeats")
        object.__setattr__(self, "paper", kinds)

    def paper_metrics(self) -> dict[str, str]:
        """Logged name -> kind: ``bleu_paper`` for the first kind, ``bleu_paper_<kind>`` for the others."""
        return {("bleu_paper" if i == 0 else f"bleu_paper_{kind}"): kind for i, kind in enumerate(self.paper)}


def corpus_bleu(hypotheses: list[str], references: list[str], tokenize: str = "13a",
                lowercase: bool = False, tokenized: bool = False) -> BleuResult:
    """``tokenized``: the text is tokenized on purpose (the papers' BLEU, IWSLT), so sacreBLEU's warning that it
    looks tokenized is not shown at every validation."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase, force=tokenized)
    result = bleu.corpus_score(hypotheses, [references])
    text = str(result).split(" = ", 1)[-1]
    return BleuResult(result.score, str(bleu.get_signature()), text, result.bp,
                      result.sys_len / max(result.ref_len, 1))


def split_compounds(text: str) -> str:
    """``a-b`` -> ``a ##AT##-##AT## b`` for each hyphen between two non-spaces, scanning left to right without
    overlaps (so ``a-b-c`` -> ``a ##AT##-##AT## b-c``, as the papers' one-line Perl substitution does)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def moses_tokenizer(lang: str):
    """sacremoses' tokenizer for ``lang`` (imported here: only the paper metric needs it)."""
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


def paper_tokens(texts: list[str], kind: str, lang: str | None, pretokenized: bool = False) -> list[str]:
    """``texts`` as the papers scored them: Moses tokens (unless ``pretokenized``), compounds split for
    ``compound_split``, joined by single spaces. Lowercasing is BLEU's (``paper_bleu``)."""
    if kind not in PAPER_BLEU_KINDS:
        raise ValueError(f"paper BLEU {kind!r} is unknown; use one of {list(PAPER_BLEU_KINDS)}")
    if pretokenized:
        out = [" ".join(t.split()) for t in texts]
    else:
        if not lang:
            raise ValueError("the papers' tokenized BLEU needs the target language; set task.tgt_lang")
        tok = moses_tokenizer(lang)
        out = [tok.tokenize(t, return_str=True, escape=False, aggressive_dash_splits=False) for t in texts]
    return [split_compounds(t) for t in out] if kind == "compound_split" else out


def paper_bleu_name(kind: str, lang: str | None, pretokenized: bool = False) -> str:
    """What the number is, e.g. ``tokenized, compound-split, sacremoses 0.2.0 de``."""
    parts = ["tokenized as read" if pretokenized else "tokenized"]
    if kind == "compound_split":
        parts.append("compound-split")
    if kind == "tokenized_lowercase":
        parts.append("lowercase")
    if not pretokenized:
        parts.append(f"sacremoses {version('sacremoses')} {lang}")
    return ", ".join(parts)


def paper_bleu(hypotheses: list[str], references: list[str], kind: str, lang: str | None,
               pretokenized: bool = False) -> BleuResult:
    """Corpus BLEU of ``kind`` (``PAPER_BLEU_KINDS``) on whitespace tokens; the signature names the tokenization
    and carries sacreBLEU's own (``tok:none``): ``BLEU (tokenized, lowercase, sacremoses 0.2.0 en; nrefs:1|...)``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    sys_tokens = paper_tokens(hypotheses, kind, lang, pretokenized)
    ref_tokens = paper_tokens(references, kind, lang, pretokenized)
    inner = corpus_bleu(sys_tokens, ref_tokens, tokenize="none", lowercase=kind == "tokenized_lowercase", tokenized=True)
    name = f"BLEU ({paper_bleu_name(kind, lang, pretokenized)}; {inner.signature})"
    return BleuResult(inner.score, name, inner.text, inner.bp, inner.length_ratio)
