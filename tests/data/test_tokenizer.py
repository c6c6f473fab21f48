
import pytest
import torch

from seqmix.data.sources import LocalParallelSource
from seqmix.data.tokenizer import (
    SPECIALS,
    Tokenizer,
    load_or_train_tokenizer,
    tokenizer_cache_key,
    train_tokenizer,
)
from seqmix.errors import SeqmixError

TEXTS = ["The dog runs fast.", "A dog, a cat and 12 birds!", "Der Hund rennt schnell.", "Ein Hund (klein) bellt."] * 5


@pytest.fixture(scope="module")
def multi30k(multi30k_dir):
    source = LocalParallelSource(str(multi30k_dir), "en", "de")
    return source.read("train"), source.read("val")


@pytest.fixture(scope="module")
def bpe(multi30k):
    train, _ = multi30k
    return train_tokenizer(train.src + train.tgt, vocab_size=2000)


def test_specials_have_fairseq_ids(bpe):
    assert SPECIALS == ("<s>", "<pad>", "</s>", "<unk>")
    assert (bpe.bos, bpe.pad, bpe.eos, bpe.unk) == (0, 1, 2, 3)
    assert [bpe._hf.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    assert bpe.vocab_size == 2000


def test_round_trip_on_every_multi30k_val_line(bpe, multi30k):
    _, val = multi30k
    lines = val.src + val.tgt
    encoded = bpe.encode_batch(lines)
    assert all(bpe.unk not in ids for ids in encoded)
    assert all(ids == bpe.encode(line) for ids, line in zip(encoded[:50], lines))
    decoded = [bpe.decode(ids) for ids in encoded]
    assert decoded == [bpe.normalize_reference(line) for line in lines]
    # Multi30k lines are already clean except for NBSP, so the documented normalization barely changes them.
    changed = [line for line in lines if bpe.normalize_reference(line) != line]
    assert changed and all("\u00a0" in line for line in changed)


def test_documented_normalization(bpe):
    assert bpe.normalize_reference("  A\u00a0dog \t runs.  ") == "A dog runs."
    assert bpe.decode(bpe.encode("  A\u00a0dog \t runs.  ")) == "A dog runs."
    assert bpe.decode(bpe.encode("Zwei (2) Hunde, 10 Katzen; \"Hallo\"!")) == "Zwei (2) Hunde, 10 Katzen; \"Hallo\"!"


def test_encode_adds_no_specials_and_specials_in_text_are_text(bpe):
    ids = bpe.encode("a dog")
    assert ids and not set(ids) & {0, 1, 2}
    assert bpe.bos not in bpe.encode("<s> a dog </s>")


def test_decode_stops_at_eos_and_drops_bos_pad(bpe):
    ids = bpe.encode("A dog runs.")
    assert bpe.decode([bpe.bos] + ids + [bpe.eos] + bpe.encode("junk") + [bpe.pad]) == "A dog runs."
    assert bpe.decode(torch.tensor([bpe.bos] + ids + [bpe.eos, bpe.pad, bpe.pad])) == "A dog runs."
    assert bpe.decode(ids[:1] + [bpe.pad] + ids[1:]) == "A dog runs."
    assert bpe.decode([]) == ""


def test_unseen_characters_become_unk():
    tok = train_tokenizer(TEXTS, vocab_size=60, min_frequency=1)
    assert tok.unk in tok.encode("dog ☃")
    assert tok.decode(tok.encode("dog ☃")).endswith("<unk>")


def test_lowercase_flag_and_json_round_trip(tmp_path):
    lower = train_tokenizer(TEXTS, vocab_size=80, lowercase=True, min_frequency=1)
    assert lower.lowercase and lower.encode("THE DOG") == lower.encode("the dog")
    assert lower.normalize_reference("The Dog") == "the dog" == lower.decode(lower.encode("The Dog"))
    cased = train_tokenizer(TEXTS, vocab_size=80, lowercase=False, min_frequency=1)
    assert not cased.lowercase and cased.encode("The") != cased.encode("the")
    again = Tokenizer.from_json(lower.to_json())
    assert again.lowercase and again.encode("THE DOG") == lower.encode("the dog")
    cased.save(tmp_path / "tok.json")
    loaded = Tokenizer.load(tmp_path / "tok.json")
    assert not loaded.lowercase and loaded.vocab_size == cased.vocab_size
    assert loaded.encode("Der Hund") == cased.encode("Der Hund")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SeqmixError, match="retrained"):
        Tokenizer.load(tmp_path / "bad.json")


def test_cache_hit_skips_training(tmp_path):
    calls = []

    def texts():
        calls.append(1)
        return iter(TEXTS)

    parts = {"train": "fingerprint-1"}
    first = load_or_train_tokenizer(texts, 80, False, str(tmp_path), parts)
    key = tokenizer_cache_key(80, False, 2, parts)
    assert (tmp_path / key / "tokenizer.json").is_file() and calls == [1]
    assert [p.name for p in (tmp_path / key).iterdir()] == ["tokenizer.json"]  # no temp files left behind
    second = load_or_train_tokenizer(texts, 80, False, str(tmp_path), parts)
    assert calls == [1] and second.to_json() == first.to_json()
    # Any changed setting or content fingerprint gives a different key, hence a retrain.
    keys = {key, tokenizer_cache_key(81, False, 2, parts), tokenizer_cache_key(80, True, 2, parts),
            tokenizer_cache_key(80, False, 1, parts), tokenizer_cache_key(80, False, 2, {"train": "fingerprint-2"})}
    assert len(keys) == 5
    load_or_train_tokenizer(texts, 80, True, str(tmp_path), parts)
    assert calls == [1, 1]


def test_tiny_vocab_is_a_user_error():
    with pytest.raises(SeqmixError, match="vocab_size"):
        train_tokenizer(TEXTS, vocab_size=4)
