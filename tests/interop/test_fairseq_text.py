"""fairseq's text side: dict.txt files with fairseq's ids, Moses + subword-nmt BPE encoding and its inverse."""

from __future__ import annotations

import gzip
import io
import pickle
from collections import Counter
from itertools import islice

import pytest
from sacremoses import MosesDetokenizer, MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe

from seqmix.data.fairseq_dictionary import FairseqDictionary
from seqmix.data.moses_subword import FORMAT, MosesSubwordTokenizer
from seqmix.data.tokenizer import Tokenizer, train_tokenizer
from seqmix.errors import SeqmixError

# ---------------------------------------------------------------------------------------------------------------
# dictionaries


DICT_TEXT = (
    "der 120\n"
    "Hund 7\n"
    "lauf@@ 5\n"
    "a b 3\n"                       # the token is everything before the LAST space: "a b"
    "Hund 2 #fairseq:overwrite\n"   # a repeat is allowed with the flag and takes a new id
    "<unk> 0 #fairseq:overwrite\n"
    "ü 1\n"
    "madeupword0000 0\n"
    "madeupword0001 0\n"
)


def test_dictionary_ids_are_four_plus_line_number_and_round_trip_byte_identical(tmp_path):
    path = tmp_path / "dict.de.txt"
    path.write_bytes(DICT_TEXT.encode("utf-8"))
    d = FairseqDictionary.load(path)
    lines = DICT_TEXT.splitlines()
    assert len(d) == 4 + len(lines)
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert (d.bos, d.pad, d.eos, d.unk, d.nspecial) == (0, 1, 2, 3, 4)
    assert [d[4 + i] for i in range(len(lines))] == ["der", "Hund", "lauf@@", "a b", "Hund", "<unk>", "ü",
                                                      "madeupword0000", "madeupword0001"]
    assert d.counts[4:] == [120, 7, 5, 3, 2, 0, 1, 0, 0]
    assert d.index("der") == 4 and d.index("a b") == 7 and d.index("ü") == 10
    assert d.index("madeupword0001") == 12  # padding entries are kept: the embedding has a row for them
    assert d.index("Hund") == 8  # the overwrite takes the later id, as in fairseq
    assert d.index("<unk>") == 9
    assert d.index("Katze") == d.unk == 3
    assert d.to_lines() == lines
    out = tmp_path / "saved" / "dict.de.txt"
    d.save(out)
    assert out.read_bytes() == path.read_bytes()
    assert FairseqDictionary.load(out) == d


def test_dictionary_constructor_equality_and_counts():
    d = FairseqDictionary(["x", "y"], [5, 0])
    assert d == FairseqDictionary.from_lines(["x 9", "y 9"])  # equality is by symbols (fairseq: by indices)
    assert d != FairseqDictionary(["y", "x"])
    assert FairseqDictionary(["x"]).counts == [1, 1, 1, 1, 1]  # fairseq's add_symbol default count
    assert "x" in d and "z" not in d
    with pytest.raises(SeqmixError, match="'x' appears twice"):
        FairseqDictionary(["x", "x"])
    with pytest.raises(SeqmixError, match="not a one-line string"):
        FairseqDictionary(["a\nb"])


@pytest.mark.parametrize("lines, lineno, what", [
    (["der 1", "Hund 2", "der 3"], 3, "repeats line 1 without the '#fairseq:overwrite' flag"),
    (["der 1", "</s> 5"], 2, "repeats a built-in special symbol"),
    (["der 1", "Hund"], 2, "is not '<token> <count>'"),
    (["der 1", "Hund zwei"], 2, "is not '<token> <count>'"),
    (["der\t1"], 1, "is not '<token> <count>'"),
    (["der 1", "", "Hund 2"], 2, "is not '<token> <count>'"),
    (["der 1 #fairseq:overwrite", "#fairseq:overwrite"], 2, "is not '<token> <count>'"),
])
def test_dictionary_bad_lines_name_file_and_line(tmp_path, lines, lineno, what):
    path = tmp_path / "dict.en.txt"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(SeqmixError) as err:
        FairseqDictionary.load(path)
    message = str(err.value)
    assert f"fairseq dictionary {path}, line {lineno}" in message
    assert what in message
    assert "remove" in message  # says what to do


def test_dictionary_missing_or_undecodable_file(tmp_path):
    with pytest.raises(SeqmixError, match="dict.fr.txt does not exist; pass the dict"):
        FairseqDictionary.load(tmp_path / "dict.fr.txt")
    bad = tmp_path / "dict.de.txt"
    bad.write_bytes(b"der 1\nHund 2\n\xff\xfe 3\n")
    with pytest.raises(SeqmixError, match="line 3, is not valid UTF-8"):
        FairseqDictionary.load(bad)


# ---------------------------------------------------------------------------------------------------------------
# Moses + subword-nmt on Multi30k

N_TRAIN = 1000  # lines per language: 2,000 lines of BPE training text
N_MERGES = 300
N_VALID = 200
# Measured with sacremoses 0.2.0 / subword-nmt 0.3.8: 3 of the first 200 val.de sentences contain BPE units that
# the 1,000-line German dictionary lacks: "Q@@" (Quad), "2@@" and "0" (120), "dog" (Hotdog: a unit of the joint
# codes seen only in English). 4 unknown units in all.
N_VALID_WITH_UNKNOWNS = 3
N_VALID_UNKNOWN_UNITS = 4


def _moses(text: str, lang: str) -> str:
    """fairseq's moses defaults: escape and aggressive dash splits."""
    return MosesTokenizer(lang).tokenize(text, aggressive_dash_splits=True, return_str=True, escape=True)


def _read(path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in islice(f, n)]


def _fairseq_style_dict(bpe_lines: list[str]) -> FairseqDictionary:
    """What fairseq-preprocess writes: tokens by descending count, padded to a multiple of 8."""
    counts = Counter(tok for line in bpe_lines for tok in line.split())
    symbols = sorted(counts, key=lambda t: (-counts[t], t))
    padding = [f"madeupword{i:04d}" for i in range(-(4 + len(symbols)) % 8)]
    return FairseqDictionary(symbols + padding, [counts[s] for s in symbols] + [0] * len(padding))


@pytest.fixture(scope="module")
def corpus(multi30k_dir, tmp_path_factory):
    """Joint BPE codes learned on Moses-tokenized train.en + train.de (as for fairseq's WMT en-de models),
    separate en/de dictionaries and a joined one, all built from the BPE'd training text."""
    raw = {lang: _read(multi30k_dir / f"train.{lang}.gz", N_TRAIN) for lang in ("en", "de")}
    tokenized = {lang: [_moses(s, lang) for s in lines] for lang, lines in raw.items()}
    codes_path = tmp_path_factory.mktemp("bpe") / "bpecodes"
    with open(codes_path, "w", encoding="utf-8") as out:
        learn_bpe(io.StringIO("\n".join(tokenized["en"] + tokenized["de"]) + "\n"), out, N_MERGES)
    codes = codes_path.read_text(encoding="utf-8")
    bpe = BPE(io.StringIO(codes))
    bpe_lines = {lang: [bpe.process_line(s) for s in lines] for lang, lines in tokenized.items()}
    return {
        "codes": codes,
        "en": _fairseq_style_dict(bpe_lines["en"]),
        "de": _fairseq_style_dict(bpe_lines["de"]),
        "joint": _fairseq_style_dict(bpe_lines["en"] + bpe_lines["de"]),
        "bpe_lines": bpe_lines,
        "train_de": raw["de"],
        "valid_de": _read(multi30k_dir / "val.de.gz", N_VALID),
    }


def test_codes_were_learned_and_dictionary_is_fairseq_shaped(corpus):
    assert corpus["codes"].startswith("#version: 0.2\n")
    assert len(corpus["codes"].splitlines()) == 1 + N_MERGES
    assert len(corpus["de"]) % 8 == 0 and corpus["de"].symbols[-1].startswith("madeupword")
    assert any(s.endswith("@@") for s in corpus["de"].symbols)


def test_encode_matches_subword_nmt_apply_bpe_then_dictionary(corpus):
    de = corpus["de"]
    tok = MosesSubwordTokenizer(de, de, "de", "de", bpe_codes=corpus["codes"])
    for raw, bpe_line in zip(corpus["train_de"][:50], corpus["bpe_lines"]["de"][:50]):
        ids = tok.encode(raw)
        assert ids == [de.index(t) for t in bpe_line.split()]
        assert tok.unk not in ids  # every unit of the training text is in its dictionary


def test_multi30k_round_trip_gives_moses_detokenized_text(corpus):
    de = corpus["de"]
    tok = MosesSubwordTokenizer(de, de, "de", "de", bpe_codes=corpus["codes"])
    detok = MosesDetokenizer("de")
    exact, with_unknowns, unknown_units = 0, 0, 0
    for sentence in corpus["valid_de"]:
        ids = tok.encode(sentence)
        assert ids and 2 not in ids and 0 not in ids  # no eos/bos added
        decoded = tok.decode(ids + [tok.eos, 17, 18])  # everything after the eos is ignored
        expected = detok.detokenize(_moses(sentence, "de").split())
        if tok.unk in ids:
            with_unknowns += 1
            unknown_units += ids.count(tok.unk)
            assert decoded.count("<unk>") == ids.count(tok.unk) and decoded != expected
        else:
            assert decoded == expected, sentence
            exact += 1
    assert (with_unknowns, unknown_units) == (N_VALID_WITH_UNKNOWNS, N_VALID_UNKNOWN_UNITS)
    assert exact == N_VALID - N_VALID_WITH_UNKNOWNS
    # Moses round trip is not the identity, so that is what is compared: e.g. NBSP becomes a space
    nbsp = next(s for s in corpus["valid_de"] if "\u00a0" in s)
    assert "\u00a0" not in tok.decode(tok.encode(nbsp))


def test_separate_source_and_target_dictionaries(corpus):
    en, de = corpus["en"], corpus["de"]
    assert en != de
    tok = MosesSubwordTokenizer(en, de, "en", "de", bpe_codes=corpus["codes"])
    assert not tok.joint
    assert (tok.source_vocab_size, tok.target_vocab_size, tok.vocab_size) == (len(en), len(de), len(de))
    bpe = BPE(io.StringIO(corpus["codes"]))
    english = "A man in a blue shirt is standing on a ladder."
    units = bpe.process_line(_moses(english, "en")).split()
    assert tok.encode(english) == [en.index(u) for u in units]
    german = "Ein Mann in einem blauen Hemd steht auf einer Leiter."
    target_units = bpe.process_line(_moses(german, "de")).split()
    target_ids = tok.encode_target(german)
    assert target_ids == [de.index(u) for u in target_units]
    assert 3 not in target_ids and target_ids != [en.index(u) for u in target_units]
    assert tok.decode(target_ids) == german  # the target dictionary decodes target ids
    assert tok.decode(tok.encode(english)) != english  # source ids mean other words in the target dictionary
    assert tok.encode_target_batch([german, german]) == [target_ids, target_ids]
    joint = MosesSubwordTokenizer(corpus["joint"], corpus["joint"], "en", "de", bpe_codes=corpus["codes"])
    assert joint.joint
    assert joint.decode(joint.encode_target(german)) == german


def test_json_round_trip_and_dispatch(corpus, tmp_path):
    tok = MosesSubwordTokenizer(corpus["en"], corpus["de"], "en", "de", bpe_codes=corpus["codes"])
    again = MosesSubwordTokenizer.from_json(tok.to_json())
    assert again.to_json() == tok.to_json() and again.content_hash() == tok.content_hash()
    texts = ["Two young, White males are outside near many bushes.", "A dog's toy costs $5 & more -- really?"]
    assert again.encode_batch(texts) == tok.encode_batch(texts)
    ids = tok.encode_target("Zwei Hunde spielen im Schnee & im \"Gras\".")
    assert again.decode(ids) == tok.decode(ids) == "Zwei Hunde spielen im Schnee & im \"Gras\"."
    flat, sizes = tok.encode_flat(texts)
    assert sizes.tolist() == [len(x) for x in tok.encode_batch(texts)]
    assert flat.tolist() == [i for x in tok.encode_batch(texts) for i in x]
    # seqmix's generic loader (and so checkpoint.load_task) restores this kind from its JSON
    restored = Tokenizer.from_json(tok.to_json())
    assert isinstance(restored, MosesSubwordTokenizer) and restored.to_json() == tok.to_json()
    path = tmp_path / "tokenizer.json"
    path.write_text(tok.to_json(), encoding="utf-8")
    assert Tokenizer.load(path).content_hash() == tok.content_hash()
    assert pickle.loads(pickle.dumps(tok)).encode_batch(texts) == tok.encode_batch(texts)
    # a joined dictionary is stored once; other settings change the hash
    joint = MosesSubwordTokenizer(corpus["de"], corpus["de"], "de", "de", bpe_codes=corpus["codes"])
    assert '"target_dict": null' in joint.to_json()
    assert MosesSubwordTokenizer.from_json(joint.to_json()).target_dict == corpus["de"]
    other = MosesSubwordTokenizer(corpus["en"], corpus["de"], "en", "de", bpe_codes=corpus["codes"],
                                  aggressive_dash_splits=False)
    assert other.content_hash() != tok.content_hash()
    assert other.encode("A well-known dog.") != tok.encode("A well-known dog.")


# ---------------------------------------------------------------------------------------------------------------
# hand-written cases


def _small(tokens: list[str], lang: str = "de", **kw) -> MosesSubwordTokenizer:
    d = FairseqDictionary(tokens)
    return MosesSubwordTokenizer(d, d, lang, lang, **kw)


def test_decode_joins_bpe_units_and_drops_specials():
    tok = _small(["Zwei@@", "hund@@", "e", "laufen", ".", "lauf@@", "&amp;", "&quot;"])
    ids = {s: i for i, s in enumerate(tok.target_dict.symbols)}
    seq = [ids[s] for s in ["Zwei@@", "hund@@", "e", "laufen"]]
    assert tok.decode(seq) == "Zweihunde laufen"
    assert tok.decode([0] + seq + [ids["."], 2, ids["e"]]) == "Zweihunde laufen."  # bos dropped, stop at eos
    assert tok.decode([ids["laufen"], 1, 1, ids["lauf@@"]]) == "laufen lauf"  # pads dropped, final @@ dropped
    assert tok.decode([ids["e"], ids["&amp;"], ids["&quot;"], ids["e"], ids["&quot;"]]) == 'e & "e"'
    assert tok.decode([]) == ""
    with pytest.raises(SeqmixError, match="id 99 is outside the target dictionary"):
        tok.decode([4, 99])
    plain = _small(["Zwei@@", "hund@@", "e", "laufen", "."], moses=False)
    assert plain.decode([4, 5, 6, 7, 8]) == "Zweihunde laufen ."  # no Moses: tokens stay space-separated


def test_unknown_words_map_to_unk_and_decode_as_unk():
    tok = _small(["Ein", "Hund", "."])
    assert tok.encode("Ein Zebra.") == [4, 3, 6]
    assert tok.decode([4, 3, 6]) == "Ein <unk>."
    # Moses escapes "<" and ">" ("&lt; s &gt; ..."): text never becomes a special id
    assert tok.encode("<s> </s> <pad>") == [3] * 10
    raw = _small(["Ein", "Hund"], moses=False)
    assert raw.encode("Ein </s> Hund <pad>") == [4, 3, 5, 3]  # a literal special is text, not an eos


def test_escape_and_dash_splits_follow_fairseq_defaults():
    tok = _small(["Tom", "&apos;s", "x", "@-@", "ray", "&amp;", "Co", "."], lang="en")
    assert tok.encode("Tom's x-ray & Co.") == [4, 5, 6, 7, 8, 9, 10, 11]
    assert tok.decode([4, 5, 6, 7, 8, 9, 10, 11]) == "Tom's x-ray & Co."
    unescaped = _small(["Tom", "'s", "x-ray", "&", "Co", "."], lang="en", escape=False,
                       aggressive_dash_splits=False)
    assert unescaped.encode("Tom's x-ray & Co.") == [4, 5, 6, 7, 8, 9]
    assert unescaped.decode([4, 5, 6, 7, 8, 9]) == "Tom's x-ray & Co."


def test_bpe_codes_are_applied_as_subword_nmt_does():
    codes = "#version: 0.2\nl a\nla u\nlau f\ne n</w>\nlauf en</w>\n"
    tok = _small(["laufen", "lauf@@", "e", "l@@", "a@@", "u@@", "f@@", "en", "n"], bpe_codes=codes)
    assert tok.encode("laufen") == [4]
    assert tok.encode("lauft") == [5, 3]  # "lauf@@ t": t is unknown
    assert tok.encode("laufe") == [5, 6]
    assert tok.encode("e") == [6]  # single-character words are never split
    assert tok.decode(tok.encode("laufe laufen")) == "laufe laufen"


@pytest.mark.parametrize("codes, message", [
    ("#version: 0.2\nl a 17\n", "fastBPE codes .* drop the count column"),
    ("#version: 0.2\nl a\nlau\n", "line 3 .*'lau'.* is not a subword-nmt merge"),
    ("#version: 0.2\n", "hold no merge lines; pass bpe_codes=None"),
    ("#version: 0.3\nl a\n", "reads only '#version: 0.1' and '#version: 0.2'"),
])
def test_bad_bpe_codes_are_refused_with_a_clear_error(codes, message):
    with pytest.raises(SeqmixError, match=message):
        _small(["a"], bpe_codes=codes)


def test_codes_file_name_instead_of_text(tmp_path):
    path = tmp_path / "bpecodes"
    path.write_text("#version: 0.2\nl a\n", encoding="utf-8")
    with pytest.raises(SeqmixError, match="is a file name .* pass the file's text"):
        _small(["a"], bpe_codes=str(path))


def test_from_json_refuses_other_formats():
    with pytest.raises(SeqmixError, match=f"not a {FORMAT} tokenizer"):
        MosesSubwordTokenizer.from_json('{"format": "seqmix-bpe-v1"}')
    with pytest.raises(SeqmixError, match="incomplete"):
        MosesSubwordTokenizer.from_json(f'{{"format": "{FORMAT}", "source_dict": []}}')
    with pytest.raises(SeqmixError, match="not a seqmix tokenizer file"):
        Tokenizer.from_json('{"format": "something-else"}')


def test_hf_tokenizer_offers_the_two_sided_interface():
    tok = train_tokenizer(["a dog runs", "two dogs run", "a cat sleeps"] * 3, vocab_size=40)
    assert tok.joint is True
    assert tok.source_vocab_size == tok.target_vocab_size == tok.vocab_size
    assert tok.encode_target("a dog") == tok.encode("a dog")
    assert tok.encode_target_batch(["a dog", "cat"]) == tok.encode_batch(["a dog", "cat"])
