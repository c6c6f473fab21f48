"""IWSLT'14 German-English from its raw TED release (``de-en.tgz``) to the text fairseq's
``examples/translation/prepare-iwslt14.sh`` has before its BPE step: seqmix learns its own BPE on these words, and
papers' IWSLT'14 numbers are scored on exactly this tokenized, lowercased text.

What the script does, step by step (each rule below is named after the command it stands for):

- train: ``train.tags.de-en.{de,en}`` without the lines holding ``<url>``, ``<talkid>`` or ``<keywords>`` (grep -v),
  ``<title>``/``<description>`` tags removed but their text kept (sed); each language Moses-tokenized
  (tokenizer.perl's defaults: XML escaping on, no aggressive dash splits); pairs cleaned as clean-corpus-n.perl
  ``-ratio 1.5`` with 1 to 175 tokens; lowercased (lowercase.perl); every 23rd line is valid (awk NR%23), the rest
  train.
- test: the ``<seg id=...>`` lines of the dev2010, TEDX dev2012, tst2010, tst2011 and tst2012 XML files, in that
  order, tags removed, ``’`` turned into ``'``, tokenized and lowercased (not cleaned).
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

from seqmix.errors import SeqmixError

LANGS = ("de", "en")
FOLDER = "de-en"  # the archive's one top folder
TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012")  # the order prepare-iwslt14.sh concatenates them in
DROPPED = ("<url>", "<talkid>", "<keywords>")
STRIPPED = ("<title>", "</title>", "<description>", "</description>")
RATIO, MIN_TOKENS, MAX_TOKENS, MAX_WORD_CHARS = 1.5, 1, 175, 1000  # MAX_WORD_CHARS: clean-corpus-n.perl's default
VALID_EVERY = 23
NAMES = tuple(f"{split}.{lang}" for split in ("train", "valid", "test") for lang in LANGS)

# Perl's \s on Unicode text (tokenizer.perl and clean-corpus-n.perl read UTF-8): Python's \s also takes \x1c-\x1f,
# which tokenizer.perl deletes as control characters instead
_PERL_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_SPACES = re.compile(f"[{_PERL_SPACE}]+")
_BLANK = re.compile(f"[{_PERL_SPACE}]*")
_NOT_PERL_SPACE = re.compile("[\x1c-\x1f]")
_SEG_OPEN = re.compile(r'<seg id="[0-9]*">[ \t\r\f\v]*')  # sed's \s: ASCII white space
_SEG_CLOSE = re.compile(r"[ \t\r\f\v]*</seg>[ \t\r\f\v]*")


def train_member(lang: str) -> str:
    return f"{FOLDER}/train.tags.de-en.{lang}"


def test_member(name: str, lang: str) -> str:
    return f"{FOLDER}/{name}.de-en.{lang}.xml"


MEMBERS = tuple([train_member(lang) for lang in LANGS] + [test_member(t, lang) for t in TEST_SETS for lang in LANGS])


def read_members(archive: Path) -> dict[str, list[str]]:
    """The lines (split on "\\n" only, as perl and sed read them) of the members the preparation needs. The whole
    gzip stream is read to its end, so a truncated or altered archive fails its length or CRC check here."""
    found: dict[str, list[str]] = {}
    try:
        with gzip.open(archive) as gz:
            with tarfile.open(fileobj=gz, mode="r|") as tar:
                for member in tar:
                    name = member.name.removeprefix("./")
                    if name in MEMBERS and member.isfile():
                        found[name] = tar.extractfile(member).read().decode("utf-8").split("\n")
            while gz.read(1 << 20):
                pass
    except (tarfile.TarError, EOFError, OSError, zlib.error, UnicodeDecodeError) as e:
        raise SeqmixError(f"{archive} is not a whole IWSLT'14 de-en.tgz ({type(e).__name__}: {e})") from None
    missing = [name for name in MEMBERS if name not in found]
    if missing:
        raise SeqmixError(f"{archive} holds no {', '.join(missing)}: it is not the IWSLT'14 de-en release")
    return {name: lines[:-1] if lines and lines[-1] == "" else lines for name, lines in found.items()}


def train_text(lines: list[str]) -> list[str]:
    """grep -v of the talk's metadata lines, then sed removing the title and description tags (their text stays)."""
    kept = []
    for line in lines:
        if any(tag in line for tag in DROPPED):
            continue
        for tag in STRIPPED:
            line = line.replace(tag, "")
        kept.append(line)
    return kept


def test_text(lines: list[str]) -> list[str]:
    """grep '<seg id', then sed removing the seg tags with the white space beside them and turning ’ into '."""
    return [_SEG_CLOSE.sub("", _SEG_OPEN.sub("", line)).replace("\u2019", "'") for line in lines if "<seg id" in line]


_LAST_WORD_PERIOD = re.compile(r"(\S+)\.")


def tokenizer(lang: str) -> Callable[[str], str]:
    """tokenizer.perl -l ``lang`` on one line: white-space-only lines pass unchanged, as the script leaves them."""
    from sacremoses import MosesTokenizer  # imported here: only this preparation needs it at import time

    class PerlMosesTokenizer(MosesTokenizer):
        """tokenizer.perl always splits the period off a line's last word ("split last words independently"), before
        looking at the non-breaking prefixes; sacremoses 0.2 looks them up for it too and writes German "Satz 1."
        with "1." whole, as perl does not."""

        def handles_nonbreaking_prefixes(self, text: str) -> str:
            words = text.split()
            if words and _LAST_WORD_PERIOD.fullmatch(words[-1]):
                words[-1] = words[-1][:-1] + " ."
            return super().handles_nonbreaking_prefixes(" ".join(words))

    moses = PerlMosesTokenizer(lang=lang)

    def tokenize(line: str) -> str:
        if _BLANK.fullmatch(line):
            return line
        return moses.tokenize(_NOT_PERL_SPACE.sub("", line), escape=True, aggressive_dash_splits=False,
                              return_str=True)

    return tokenize


def lowercase(line: str) -> str:
    """Perl's lc: Python's lower() would write a word-final capital sigma as ς, perl always as σ."""
    return line.replace("\u03a3", "\u03c3").lower()


def _normalized(line: str) -> str:
    return _SPACES.sub(" ", line).strip(" ")


def keep_pair(de: str, en: str) -> bool:
    """clean-corpus-n.perl's test on white-space-normalized lines: both non-empty, 1 to 175 tokens, neither more
    than 1.5 times as long as the other, no token over 1000 characters. (Its rules for "|" never apply: the
    tokenizer has escaped every "|".)"""
    if not de or not en:
        return False
    dn, en_n = len(de.split(" ")), len(en.split(" "))
    if not (MIN_TOKENS <= dn <= MAX_TOKENS and MIN_TOKENS <= en_n <= MAX_TOKENS):
        return False
    if dn / en_n > RATIO or en_n / dn > RATIO:
        return False
    return all(len(word) <= MAX_WORD_CHARS for word in (*de.split(" "), *en.split(" ")))


def _aligned(what: str, de: list[str], en: list[str]) -> None:
    if len(de) != len(en):
        raise SeqmixError(f"{what} has {len(de):,} German and {len(en):,} English lines: the two languages are not "
                          "aligned, so this is not an intact IWSLT'14 de-en.tgz")


def train_and_valid(members: dict[str, list[str]], tokenize: dict) -> dict[str, list[str]]:
    """Tokenized, cleaned and lowercased training pairs, split into train and every 23rd line for valid."""
    text = {lang: train_text(members[train_member(lang)]) for lang in LANGS}
    _aligned("train.tags.de-en.{de,en} without its tag lines", text["de"], text["en"])
    pairs = [(_normalized(tokenize["de"](de)), _normalized(tokenize["en"](en))) for de, en in zip(*text.values())]
    kept = [(lowercase(de), lowercase(en)) for de, en in pairs if keep_pair(de, en)]
    out = {}
    for i, lang in enumerate(LANGS):
        out[f"valid.{lang}"] = [pair[i] for n, pair in enumerate(kept, 1) if n % VALID_EVERY == 0]
        out[f"train.{lang}"] = [pair[i] for n, pair in enumerate(kept, 1) if n % VALID_EVERY != 0]
    return out


def test(members: dict[str, list[str]], tokenize: dict) -> dict[str, list[str]]:
    """The five test sets one after the other, tokenized and lowercased."""
    out: dict[str, list[str]] = {f"test.{lang}": [] for lang in LANGS}
    for name in TEST_SETS:
        text = {lang: test_text(members[test_member(name, lang)]) for lang in LANGS}
        _aligned(f"the <seg> lines of {name}.de-en.{{de,en}}.xml", text["de"], text["en"])
        for lang in LANGS:
            out[f"test.{lang}"] += [lowercase(tokenize[lang](line)) for line in text[lang]]
    return out


def _write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())


def prepare(archive: Path, out: Path, report: Callable[[str], None]) -> None:
    """Write train/valid/test.{de,en} into the new folder ``out`` from the raw release ``archive``."""
    members = read_members(archive)
    tokenize = {lang: tokenizer(lang) for lang in LANGS}
    report(f"{archive}: tokenizing, cleaning and lowercasing as fairseq's prepare-iwslt14.sh (a few minutes)")
    files = {**train_and_valid(members, tokenize), **test(members, tokenize)}
    out.mkdir(parents=True)
    for name in NAMES:
        _write_lines(out / name, files[name])
    report(", ".join(f"{split}: {len(files[f'{split}.de']):,} pairs" for split in ("train", "valid", "test")))
