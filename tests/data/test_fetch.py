"""Downloading corpora (seqmix.data.fetch) from a loopback server, never the network: resume, checksums, archives,
the mirror, and the registry's sums against this project's data snapshot."""

from __future__ import annotations

import gzip
import hashlib
import io
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from seqmix.data.fetch import CORPORA, Corpus, RemoteFile, download, fetch, mirrored, mismatch
from seqmix.errors import SeqmixError
from tests.helpers import FileServer

MULTI30K = CORPORA["multi30k"]


def url_path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


@pytest.fixture
def server(multi30k_dir, monkeypatch):
    """The snapshot's Multi30k files under the registry's URL paths, and every download pointed at them."""
    files = {url_path(f.url): (multi30k_dir / f.name).read_bytes() for f in MULTI30K.files
             if (multi30k_dir / f.name).is_file()}
    served = FileServer(files)
    monkeypatch.setenv("SEQMIX_DOWNLOAD_MIRROR", served.url)
    yield served
    served.close()


def entry(name: str) -> RemoteFile:
    return next(f for f in MULTI30K.files if f.name == name)


def visible(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("honour_range", [True, False])
def test_an_interrupted_download_resumes_from_its_part_file(server, tmp_path, honour_range):
    """The first half is already in train.en.gz.part: only the rest is asked for (a server that ignores Range
    sends the whole file, which must not be appended to the half), and the result is the right file."""
    f = entry("train.en.gz")
    whole = server.files[url_path(f.url)]
    (tmp_path / "train.en.gz.part").write_bytes(whole[: len(whole) // 2])
    server.honour_range = honour_range
    download(mirrored(f.url), tmp_path / "train.en.gz", f.size, f.sha256)
    assert server.requests == [(url_path(f.url), f"bytes={len(whole) // 2}-")]
    assert hashlib.sha256((tmp_path / "train.en.gz").read_bytes()).hexdigest() == f.sha256
    assert visible(tmp_path) == ["train.en.gz"]


def test_a_connection_that_drops_midway_is_resumed_in_the_same_run(server, tmp_path):
    f = entry("train.de.gz")
    server.cut_after = 100_000
    download(mirrored(f.url), tmp_path / "train.de.gz", f.size, f.sha256)
    assert server.requests == [(url_path(f.url), None), (url_path(f.url), "bytes=100000-")]
    assert mismatch(tmp_path / "train.de.gz", f.size, f.sha256) is None


def test_a_part_as_long_as_the_file_is_checked_without_fetching(server, tmp_path):
    f = entry("val.en.gz")
    (tmp_path / "val.en.gz.part").write_bytes(server.files[url_path(f.url)])
    download(mirrored(f.url), tmp_path / "val.en.gz", f.size, f.sha256)
    assert server.requests == [] and mismatch(tmp_path / "val.en.gz", f.size, f.sha256) is None


def test_a_folder_holding_every_file_is_checked_and_left_untouched(server, multi30k_dir, tmp_path):
    """A read-only data folder (this project's ../shared/data) must work with download=true: no request, no lock
    file, nothing written."""
    for name in ("val.en.gz", "val.de.gz"):
        (tmp_path / name).write_bytes((multi30k_dir / name).read_bytes())
    lines = []
    fetch(MULTI30K, tmp_path, ["val.en", "val.de"], report=lines.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val.de.gz", "val.en.gz"] and server.requests == []
    assert lines == [f"{tmp_path / name}: present, size and sha256 checked" for name in ("val.en.gz", "val.de.gz")]


def test_altered_bytes_are_refused_in_one_line_and_nothing_is_left(server, tmp_path):
    """Same size, one byte flipped: only the sha256 can tell, and neither the file nor its part may remain."""
    f = entry("val.de.gz")
    altered = bytearray(server.files[url_path(f.url)])
    altered[len(altered) // 2] ^= 0xFF
    server.files[url_path(f.url)] = bytes(altered)
    with pytest.raises(SeqmixError) as err:
        fetch(MULTI30K, tmp_path / "multi30k", ["val.de"], report=lambda line: None)
    message = str(err.value)
    assert "\n" not in message and "sha256" in message and f.sha256 in message and "nothing was written" in message
    assert visible(tmp_path / "multi30k") == []


def test_fetch_takes_only_what_is_asked_and_checks_what_is_there(server, tmp_path):
    """A task reading train/val gets those four files; a second fetch sends no request; a different file under a
    registry name is refused, never overwritten."""
    lines = []
    folder = tmp_path / "multi30k"
    fetch(MULTI30K, folder, ["train.en", "train.de", "val.en", "val.de"], report=lines.append)
    assert visible(folder) == ["train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"]
    asked = len(server.requests)
    fetch(MULTI30K, folder, ["val.en", "val.de"], report=lines.append)
    assert len(server.requests) == asked and any("present, size and sha256 checked" in line for line in lines)
    (folder / "val.en.gz").write_bytes(b"my own version")
    with pytest.raises(SeqmixError, match="already there but is not the file"):
        fetch(MULTI30K, folder, ["val.en"], report=lines.append)
    assert (folder / "val.en.gz").read_bytes() == b"my own version"
    with pytest.raises(SeqmixError, match="has no file dev.en"):
        fetch(MULTI30K, folder, ["dev.en"], report=lines.append)


def test_a_full_disk_is_refused_before_and_during_the_download(server, tmp_path, monkeypatch):
    """Too little room: refused before any request; a disk that fills up anyway: one line, the part kept to resume."""
    import errno
    from types import SimpleNamespace

    import seqmix.data.fetch as fetching

    with monkeypatch.context() as patch:
        patch.setattr(fetching.shutil, "disk_usage", lambda path: SimpleNamespace(free=1000))
        with pytest.raises(SeqmixError, match=r"needs 1\.2 MB in .* but 0\.0 MB are free"):
            fetch(MULTI30K, tmp_path, ["train.en", "train.de"], report=lambda line: None)
    assert server.requests == []

    def full(url, dest, size, sha256):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fetching, "download", full)
    with pytest.raises(SeqmixError, match="No space left on device.*resumes where it stopped"):
        fetch(MULTI30K, tmp_path, ["val.en"], report=lambda line: None)


def test_a_file_inside_a_zip_archive_is_extracted_checked_and_the_archive_removed(tmp_path, monkeypatch):
    """DialogSum's training file comes out of a release archive; a member with another sum is refused."""
    text = b'{"dialogue": "a", "summary": "b"}\n'
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("Data/x.jsonl", text)
    archive = buffer.getvalue()
    served = FileServer({"/repo/Data.zip": archive})
    monkeypatch.setenv("SEQMIX_DOWNLOAD_MIRROR", served.url)
    try:
        def corpus(member_sha: str) -> Corpus:
            return Corpus("c", "C", "https://example.org", "-", (RemoteFile(
                "x.jsonl", "https://example.org/repo/Data.zip", len(archive), hashlib.sha256(archive).hexdigest(),
                member="Data/x.jsonl", member_size=len(text), member_sha256=member_sha),))

        with pytest.raises(SeqmixError, match="sha256"):
            fetch(corpus("0" * 64), tmp_path / "bad", ["x.jsonl"], report=lambda line: None)
        assert not (tmp_path / "bad" / "x.jsonl").exists()
        fetch(corpus(hashlib.sha256(text).hexdigest()), tmp_path / "good", ["x.jsonl"], report=lambda line: None)
        assert visible(tmp_path / "good") == ["x.jsonl"] and (tmp_path / "good" / "x.jsonl").read_bytes() == text
    finally:
        served.close()


def test_the_mirror_replaces_scheme_and_host_only(monkeypatch):
    url = "https://raw.githubusercontent.com/multi30k/dataset/abc/data/task1/raw/train.en.gz?raw=1"
    assert mirrored(url, "") == url
    path = "multi30k/dataset/abc/data/task1/raw/train.en.gz?raw=1"
    assert mirrored(url, "http://127.0.0.1:8/cache/") == f"http://127.0.0.1:8/cache/{path}"
    monkeypatch.setenv("SEQMIX_DOWNLOAD_MIRROR", "file:///srv/mirror")
    assert mirrored(url) == f"file:///srv/mirror/{path}"
    with pytest.raises(SeqmixError, match="SEQMIX_DOWNLOAD_MIRROR='127.0.0.1:8'"):
        mirrored(url, "127.0.0.1:8")


def test_the_registry_sums_match_the_data_snapshot(shared_data):
    """A typo in a sum would refuse every real download: each registry file that ../shared/data holds (there, the
    folder is named after the corpus) must pass its own check; DialogSum's train file is stored gzipped there."""
    checked = 0
    for corpus in CORPORA.values():
        for f in corpus.files:
            plain, packed = shared_data / corpus.name / f.name, shared_data / corpus.name / (f.name + ".gz")
            if plain.is_file():
                assert mismatch(plain, f.final_size, f.member_sha256 if f.member else f.sha256) is None, plain
                checked += 1
            elif f.member and packed.is_file():
                data = gzip.decompress(packed.read_bytes())
                assert (len(data), hashlib.sha256(data).hexdigest()) == (f.member_size, f.member_sha256)
                checked += 1
    assert checked == 10
