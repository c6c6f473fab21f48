"""IWSLT'14 de-en fetched from its raw release: a tiny de-en.tgz in the real archive's layout (member paths as
`tar zxvf de-en.tgz` lists them), served from a loopback server, becomes exactly what fairseq's prepare-iwslt14.sh
writes before its BPE step. Every expected line below is written out by hand from the script's rules (tokenizer.perl
-l de/en with its escaping, clean-corpus-n.perl -ratio 1.5 1 175, lowercase.perl, awk NR%23), not computed by the
code under test."""

from __future__ import annotations

import io
import tarfile
import urllib.parse
from pathlib import Path

import pytest

from seqmix.data.fetch import CORPORA, fetch
from seqmix.errors import SeqmixError
from tests.helpers import TINY, FileServer, describe, run

IWSLT = CORPORA["iwslt14"]
URL_PATH = urllib.parse.urlsplit(IWSLT.files[0].url).path
TINY_MODEL = [o for o in TINY if not o.startswith("task.")]
FOLDER = "iwslt14.tokenized.de-en"
NAMES = ["test.de", "test.en", "train.de", "train.en", "valid.de", "valid.en"]
GENERIC = range(1, 45)  # "Das ist Satz {i}." / "This is sentence {i}.": kept lines 7 to 50


def talk_header(talk: int, lang: str) -> list[str]:
    """A talk's metadata lines as train.tags holds them: <url>, <keywords>, <talkid> dropped; title/description
    kept without their tags (their text is training data in fairseq's files too)."""
    title = {"de": "Ein Titel: Über Wissenschaft", "en": "A title: On science"}[lang]
    description = {"de": "TED-Vortrag: Forschung & Lehre.", "en": "TED talk: Research & teaching."}[lang]
    return [f"<url>http://www.ted.com/talks/lang/{lang}/talk{talk}.html</url>",
            "<keywords>talks, science, technology</keywords>", f"<talkid>{talk}</talkid>",
            *([f"<title>{title}</title>", f"<description>{description}</description>"] if talk == 1 else [])]


def train_tags() -> dict[str, list[str]]:
    """(German, English) raw lines in file order; the comments say what cleaning does to each pair."""
    pairs = [("", ""),  # empty: dropped
             ("Wie geht's dir?", "How's it going?"),
             ('Er sagte "Hallo".', 'He said "Hello".'),
             ("Eins zwei", "One two three"),  # 3/2 tokens is exactly the 1.5 ratio: kept
             ("Das ist’s.", "That’s it."),  # no ’ -> ' in train (the script does that for the test sets only)
             (" ".join(["wort"] * 176), " ".join(["word"] * 176))]  # 176 tokens: dropped
    for i in GENERIC:
        pairs.append((f"Das ist Satz {i}.", f"This is sentence {i}."))
        if i == 10:
            pairs.append(("Ja.", "Yes, of course, I will."))  # 2 vs 8 tokens, ratio 4: dropped
        if i == 30:
            pairs.append(("Nur Deutsch.", "   "))  # English side blank: dropped
    lines = {lang: talk_header(1, lang) for lang in ("de", "en")}
    for n, (de, en) in enumerate(pairs):
        if n == 20:  # a second talk's metadata midway: its tag lines are dropped, not counted for valid
            for lang in ("de", "en"):
                lines[lang] += talk_header(2, lang)
        lines["de"].append(de)
        lines["en"].append(en)
    return lines


# (German, English) <seg> texts of each test set, in the files' order
TEST_SEGS = {
    "IWSLT14.TED.dev2010": [("Das ist’s, sagte sie.", "It’s Q&A time."), ("Zweiter Satz.", "Second sentence.")],
    "IWSLT14.TEDX.dev2012": [("TEDx Satz eins.", "TEDx sentence one.")],
    "IWSLT14.TED.tst2010": [("Test zwanzig-zehn.", "Test twenty-ten.")],
    "IWSLT14.TED.tst2011": [("Elf.", "Eleven.")],
    "IWSLT14.TED.tst2012": [("Zwölf Äpfel.", "Twelve apples.")],
}


def xml_file(name: str, lang: str) -> str:
    side = '<srcset setid="{0}" srclang="german">' if lang == "de" else '<refset setid="{0}" trglang="english">'
    segs = [f'<seg id="{i}">  {pair[0 if lang == "de" else 1]} </seg>' for i, pair in enumerate(TEST_SEGS[name], 1)]
    return "\n".join(['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", side.format(name),
                      '<doc docid="535" genre="lectures">', "<url>http://www.ted.com/talks/x.html</url>",
                      "<description>TED Talk Subtitles and Transcript: a talk</description>",
                      "<keywords>talks</keywords>", "<talkid>535</talkid>", "<title>Ein Vortrag</title>", *segs,
                      "</doc>", "</srcset>" if lang == "de" else "</refset>", "</mteval>", ""])


def archive_bytes(members: dict[str, str] | None = None) -> bytes:
    """de-en.tgz as the raw release lays it out: one de-en/ folder, the ten XML files, README, train.en and the two
    train.tags files, in `tar zxvf`'s order."""
    if members is None:
        tags = train_tags()
        members = {f"de-en/{name}.de-en.{lang}.xml": xml_file(name, lang)
                   for name in sorted(TEST_SEGS) for lang in ("de", "en")}
        members |= {"de-en/README": "IWSLT 2014 TED talks\n", "de-en/train.en": "unused\n",
                    **{f"de-en/train.tags.de-en.{lang}": "\n".join(tags[lang]) + "\n" for lang in ("de", "en")}}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        folder = tarfile.TarInfo("de-en")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, text in members.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


KEPT_DE = ["ein titel : über wissenschaft", "ted-vortrag : forschung &amp; lehre .", "wie geht &apos; s dir ?",
           "er sagte &quot; hallo &quot; .", "eins zwei", "das ist ’ s ."] + [f"das ist satz {i} ." for i in GENERIC]
KEPT_EN = ["a title : on science", "ted talk : research &amp; teaching .", "how &apos;s it going ?",
           "he said &quot; hello &quot; .", "one two three", "that ’ s it ."] + [f"this is sentence {i} ."
                                                                               for i in GENERIC]
VALID = {"de": ["das ist satz 17 .", "das ist satz 40 ."], "en": ["this is sentence 17 .", "this is sentence 40 ."]}
TEST = {"de": ["das ist &apos; s , sagte sie .", "zweiter satz .", "tedx satz eins .", "test zwanzig-zehn .",
               "elf .", "zwölf äpfel ."],
        "en": ["it &apos;s q &amp; a time .", "second sentence .", "tedx sentence one .", "test twenty-ten .",
               "eleven .", "twelve apples ."]}


def environment(tmp_path: Path, mirror: str) -> dict:
    return {"SEQMIX_DOWNLOAD_MIRROR": mirror, "SEQMIX_DATA_DIR": str(tmp_path / "data"),
            "SEQMIX_CACHE_DIR": str(tmp_path / "cache")}


def lines(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return text[:-1].split("\n")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """`preprocess.py task=iwslt14_deen download=true` into an empty data folder: (its output, the tmp folder)."""
    tmp = tmp_path_factory.mktemp("iwslt14")
    server = FileServer({URL_PATH: archive_bytes()})
    try:
        proc = run("preprocess.py", ["task=iwslt14_deen", "download=true", "task.vocab_size=200"], tmp / "logs",
                   env=environment(tmp, server.url))
    finally:
        server.close()
    assert proc.returncode == 0, describe(proc)
    return proc, tmp


def test_the_archive_is_prepared_as_prepare_iwslt14_sh_does(prepared):
    proc, tmp = prepared
    data = tmp / "data"
    assert sorted(p.name for p in data.iterdir()) == [FOLDER]  # no archive, staging or temporary folder left
    folder = data / FOLDER
    assert sorted(p.name for p in folder.iterdir()) == NAMES
    for lang, kept in (("de", KEPT_DE), ("en", KEPT_EN)):
        assert len(kept) == 50
        assert lines(folder / f"valid.{lang}") == VALID[lang] == [kept[22], kept[45]]
        assert lines(folder / f"train.{lang}") == [line for n, line in enumerate(kept, 1) if n % 23]
        assert lines(folder / f"test.{lang}") == TEST[lang]
    assert "train: 48 pairs, valid: 2 pairs, test: 6 pairs" in proc.stdout
    assert "no published size or sha256" in proc.stdout and "tokenizer with" in proc.stdout


def test_a_prepared_folder_is_left_alone_and_an_incomplete_one_refused(prepared, tmp_path, monkeypatch):
    _, tmp = prepared
    monkeypatch.setenv("SEQMIX_DOWNLOAD_MIRROR", "http://127.0.0.1:9/")  # nothing may be fetched
    said = []
    fetch(IWSLT, tmp / "data" / FOLDER, NAMES, report=said.append)
    assert said == [f"{tmp / 'data' / FOLDER}: present, left as it is"]
    mine = tmp_path / FOLDER
    mine.mkdir()
    (mine / "train.de").write_text("mein eigenes\n")
    with pytest.raises(SeqmixError, match="is there but holds no train.en, valid.de"):
        fetch(IWSLT, mine, ["train.de", "train.en", "valid.de"], report=said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == [FOLDER] and (mine / "train.de").read_text() == "mein eigenes\n"


@pytest.mark.parametrize("case, served, message", [
    ("not gzip", b"<html>503 Service Unavailable</html>", "is not a whole IWSLT'14 de-en.tgz (BadGzipFile"),
    ("no test sets", archive_bytes({"de-en/train.tags.de-en.de": "a\n", "de-en/train.tags.de-en.en": "b\n"}),
     "holds no de-en/IWSLT14.TED.dev2010.de-en.de.xml"),
    ("misaligned", archive_bytes({**{f"de-en/{n}.de-en.{lang}.xml": "" for n in TEST_SEGS for lang in ("de", "en")},
                                  "de-en/train.tags.de-en.de": "<url>u</url>\nEins.\nZwei.\n",
                                  "de-en/train.tags.de-en.en": "<url>u</url>\nOne.\n"}),
     "train.tags.de-en.{de,en} without its tag lines has 2 German and 1 English lines"),
])
def test_a_bad_archive_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, case, served, message):
    server = FileServer({URL_PATH: served})
    monkeypatch.setenv("SEQMIX_DOWNLOAD_MIRROR", server.url)
    try:
        with pytest.raises(SeqmixError) as err:
            fetch(IWSLT, tmp_path / FOLDER, NAMES, report=lambda line: None)
    finally:
        server.close()
    text = str(err.value)
    assert message in text and "\n" not in text, text
    assert text.endswith(f"it was deleted and nothing was written to {tmp_path / FOLDER}: run the command again to "
                         "download it anew")
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_archive_ends_in_one_error_line(tmp_path):
    whole = archive_bytes()
    server = FileServer({URL_PATH: whole[: len(whole) // 2]})
    try:
        proc = run("preprocess.py", ["task=iwslt14_deen", "download=true"], tmp_path / "logs",
                   env=environment(tmp_path, server.url))
    finally:
        server.close()
    assert proc.returncode == 2, describe(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("seqmix: error: ") and "is not a whole IWSLT'14 de-en.tgz" in last, last
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data" / FOLDER).exists() and list((tmp_path / "data").iterdir()) == []


def test_missing_data_names_the_download_command(tmp_path):
    proc = run("preprocess.py", ["task=iwslt14_deen"], tmp_path / "logs",
               env={"SEQMIX_DATA_DIR": str(tmp_path / "data"), "SEQMIX_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, describe(proc)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"seqmix: error: task iwslt14_deen finds no train.de in {tmp_path / 'data' / FOLDER}: "
                           "download IWSLT'14 German-English TED talks"), last
    assert "with `python preprocess.py task=iwslt14_deen download=true`" in last


@pytest.mark.slow
def test_training_runs_on_the_prepared_files(prepared, tmp_path):
    _, tmp = prepared
    trained = run("train.py", ["task=iwslt14_deen", "task.vocab_size=200", *TINY_MODEL, "trainer.max_steps=3",
                               "trainer.max_epochs=-1", "trainer.val_check_interval=3", "trainer.limit_val_batches=1",
                               "task.data.max_tokens=256", "run_test=false", "trainer.precision=32-true",
                               f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "logs",
                  env={"SEQMIX_DATA_DIR": str(tmp / "data"), "SEQMIX_CACHE_DIR": str(tmp / "cache")})
    assert trained.returncode == 0, describe(trained)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
