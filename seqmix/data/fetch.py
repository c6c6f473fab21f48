"""Fetching the corpora that tasks read from local files (``python preprocess.py task=<task> download=true``).

``CORPORA`` names each corpus's files: where each comes from (a URL pinned to a commit, so its bytes cannot change
under the checksum), the name the task reads, its size and sha256. A file is downloaded into ``<name>.part`` beside
its destination (an interrupted download resumes from there with an HTTP Range request), checked against its size and
sha256, and only then renamed to its name: a file under the name a task reads is always whole and verified.

``SEQMIX_DOWNLOAD_MIRROR=<url>`` replaces the scheme and host of every URL (the path is kept), for a mirror, a
proxying cache or a test server; ``HTTPS_PROXY`` is honoured as usual.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import logging
import os
import re
import shutil
import socket
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seqmix.data import iwslt14_prepare
from seqmix.data.token_store import exclusive
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write

log = logging.getLogger("seqmix.data")

MIRROR_VARIABLE = "SEQMIX_DOWNLOAD_MIRROR"
TIMEOUT_S = 60  # per connection attempt and per read
ATTEMPTS = 3  # a connection that drops after bytes arrived is resumed this many times in all
_BLOCK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file a task reads: ``name`` in the corpus folder, fetched from ``url`` (``size`` bytes with ``sha256``;
    None where the source publishes no such number). With ``member`` the download is a zip archive and the file is
    that member of it, checked against ``member_size`` and ``member_sha256``."""

    name: str
    url: str
    size: int | None
    sha256: str | None
    member: str | None = None
    member_size: int | None = None
    member_sha256: str | None = None

    @property
    def final_size(self) -> int | None:
        return self.member_size if self.member else self.size


@dataclass(frozen=True)
class Corpus:
    """A corpus's files. With ``prepare`` the one file is a raw archive and the files a task reads are ``prepared``:
    ``prepare(archive, new_folder, report)`` writes them into a new folder that is then renamed to the task's."""

    name: str
    title: str
    homepage: str
    license: str
    files: tuple[RemoteFile, ...]
    prepare: Callable[[Path, Path, Callable[[str], None]], None] | None = None
    prepared: tuple[str, ...] = ()

    def file_for(self, wanted: str) -> RemoteFile | None:
        """The file a source looking for ``wanted`` reads: the same name, or its gzipped form (for a prepared corpus:
        the archive it is prepared from)."""
        if self.prepare is not None:
            return self.files[0] if wanted in self.prepared else None
        return next((f for f in self.files if f.name in (wanted, wanted + ".gz")), None)

    @property
    def size(self) -> int:
        return sum(f.final_size or 0 for f in self.files)


def _github(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


# Sums and sizes: the READMEs of this project's data snapshot (../shared/data/*/README.md), which verified each file
# against its source; tests/test_download.py checks them against that snapshot wherever it holds the same bytes.
_MULTI30K = ("multi30k/dataset", "a3d2e0d26b56f3846f66a952536ffed4e401d05a")
_WIKITEXT2 = ("pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8")
_SCITLDR = ("allenai/scitldr", "5ccad9c00a60ad75c9e04abf7f27d0f53f983b20")
_DIALOGSUM = ("cylnlp/dialogsum", "514112e9668ef16bc6997545f59c7b86e9ef5994")
_DIALOGSUM_MAY_2021 = ("cylnlp/dialogsum", "9a79c6b7a768020c97b44e955312dd68172c34f4")

CORPORA = {corpus.name: corpus for corpus in (
    Corpus("multi30k", "Multi30k task 1, English-German (Elliott et al. 2016)", "https://github.com/multi30k/dataset",
           "no license file; derived from Flickr30K: non-commercial research and education only", tuple(
               RemoteFile(name, _github(*_MULTI30K, f"data/task1/raw/{name}"), size, sha) for name, size, sha in (
                   ("train.en.gz", 568929, "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f"),
                   ("train.de.gz", 637044, "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6"),
                   ("val.en.gz", 21650, "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28"),
                   ("val.de.gz", 24681, "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a"),
                   ("test_2016_flickr.en.gz", 21077,
                    "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
                   ("test_2016_flickr.de.gz", 22890,
                    "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8")))),
    # pytorch/examples' copies of the official wiki.{train,valid,test}.tokens (the sums are the official files')
    Corpus("wikitext-2", "WikiText-2 v1, word level (Merity et al. 2016)", "https://github.com/pytorch/examples",
           "CC BY-SA (Salesforce Research's WikiText)", tuple(
               RemoteFile(name, _github(*_WIKITEXT2, f"word_language_model/data/wikitext-2/{name}"), size, sha)
               for name, size, sha in (
                   ("train.txt", 10797148, "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"),
                   ("valid.txt", 1121681, "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
                   ("test.txt", 1256449, "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0")))),
    Corpus("scitldr-a", "SciTLDR-A (Cachola et al. 2020)", "https://github.com/allenai/scitldr", "Apache-2.0", tuple(
        RemoteFile(name, _github(*_SCITLDR, f"SciTLDR-Data/SciTLDR-A/{name}"), size, sha) for name, size, sha in (
            ("train.jsonl", 3155015, "b222771d387be585cfdf5ae957b36757138415a352e0a3e3b23f73f87c3b1119"),
            ("dev.jsonl", 1124865, "3191fa98ccc09521332b7a1cd63b1930be4e8df125a235ccd31e40329709525e"),
            ("test.jsonl", 1204107, "fb42dd6cd4f4a1928ae8a01a189456fbfe994a07e938bd49f68653933f6503c9")))),
    # dev/test: the June 2021 JSON files. train: the May 2021 release archive's file (Python dict literals; the
    # repository's later 12 MB JSON version has no published sum), the one this project's results were trained on.
    # The archive's size is not published: its sha256 alone is checked, and the extracted file's size and sha256.
    Corpus("dialogsum", "DialogSum (Chen et al. 2021)", "https://github.com/cylnlp/dialogsum",
           "CC BY-NC-SA 4.0 (non-commercial, share-alike)", (
               RemoteFile("dialogsum.train.jsonl", _github(*_DIALOGSUM_MAY_2021, "DialogSum_Data.zip"), None,
                          "640e43ee9a208f79618de9ce8f3dd2b56fdbb5fe81e619189fbba033254387f4",
                          member="DialogSum_Data/dialogsum.train.jsonl", member_size=12070809,
                          member_sha256="816b335d236908c94d28171b8907e7ad362f3e387774f39f44f3cd630de938bf"),
               RemoteFile("dialogsum.dev.jsonl", _github(*_DIALOGSUM, "DialogSum_Data/dialogsum.dev.jsonl"), 471830,
                          "436721e0a3571eef7072964f80e042fb151d8c6178db1a688ce8f803bbf0a13f"),
               RemoteFile("dialogsum.test.jsonl", _github(*_DIALOGSUM, "DialogSum_Data/dialogsum.test.jsonl"), 639707,
                          "6de36eca7e7b9b10975fd5ea3f47391df172d8b3c15d03d84d763cbaab015fda"))),
    # the raw TED release at the URL fairseq's examples/translation/prepare-iwslt14.sh fetches (the original
    # wit3.fbk.eu/archive/2014-01 one is gone), prepared as that script does before its BPE step
    # (seqmix.data.iwslt14_prepare). Neither size nor sha256 is published: nothing is checked but that the gzip
    # stream is whole (its CRC) and holds the files the script reads.
    Corpus("iwslt14", "IWSLT'14 German-English TED talks (Cettolo et al. 2014), as fairseq's prepare-iwslt14.sh "
           "prepares them", "https://wit3.fbk.eu/2014-01",
           "CC BY-NC-ND (TED talks through WIT3): non-commercial, no derivatives",
           (RemoteFile("de-en.tgz", "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz", None, None),),
           prepare=iwslt14_prepare.prepare, prepared=iwslt14_prepare.NAMES),
)}


def mirrored(url: str, mirror: str | None = None) -> str:
    """``url`` with its scheme and host replaced by ``mirror`` (default: $SEQMIX_DOWNLOAD_MIRROR; unset: unchanged)."""
    mirror = os.environ.get(MIRROR_VARIABLE, "") if mirror is None else mirror
    if not mirror:
        return url
    base = urllib.parse.urlsplit(mirror)
    if base.scheme not in ("http", "https", "file") or not (base.netloc or base.scheme == "file"):
        raise SeqmixError(f"{MIRROR_VARIABLE}={mirror!r} is not an http(s):// or file:// URL; set it to e.g. "
                          "http://mirror.example:8080/ (the host replaces the one of every download URL)")
    parts = urllib.parse.urlsplit(url)
    return mirror.rstrip("/") + parts.path + (f"?{parts.query}" if parts.query else "")


def sha256_of(path: Path, h=None):
    h = hashlib.sha256() if h is None else h
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h


def mismatch(path: Path, size: int | None, sha256: str | None) -> str | None:
    """None when ``path`` has ``size`` bytes and sha256 ``sha256`` (None: not checked), else what differs."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        return f"{actual:,} bytes instead of {size:,}"
    digest = sha256_of(path).hexdigest() if sha256 else None
    return None if digest == sha256 else f"sha256 {digest} instead of {sha256}"


class Unreachable(SeqmixError):
    """The server could not be reached or refused the file: the message names the URL; callers add what to do."""


def _open(url: str, start: int):
    """The server's response to a GET from byte ``start`` on; None when it answers that the range is past the end."""
    headers = {"User-Agent": "seqmix-download", **({"Range": f"bytes={start}-"} if start else {})}
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:
            return None
        raise Unreachable(f"{url} answered HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise Unreachable(f"cannot reach {url} ({getattr(e, 'reason', None) or e})") from None


def _resumed_at(response, start: int) -> int | None:
    """Where the response's bytes begin: ``start`` when the server honoured the Range request, 0 when it sends the
    whole file (a plain 200, or a file:// URL), None when it sent another range."""
    if not start or getattr(response, "status", None) != 206:
        return 0
    found = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return start if found and int(found.group(1)) == start else None


def _transfer(url: str, part: Path, size: int | None) -> int:
    """One attempt: append what the server sends to ``part`` (from its current length when the server takes a Range
    request, else from the start). Returns the bytes received; a connection that drops raises a transient error."""
    start = part.stat().st_size if part.exists() else 0
    response = _open(url, start)
    offset = None if response is None else _resumed_at(response, start)
    if offset is None:  # the part is longer than the file, or the server sent other bytes: start over
        if response is not None:
            response.close()
        part.unlink()
        response, offset = _open(url, 0), 0
    with response:
        received = 0
        with open(part, "r+b" if offset else "wb") as out:
            out.seek(offset)
            out.truncate()
            while block := response.read(_BLOCK):
                out.write(block)
                received += len(block)
                if size is not None and offset + received > size:
                    break  # longer than the file should be: the check refuses it
            out.flush()
            os.fsync(out.fileno())
        return received


_DROPPED = (http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError, urllib.error.URLError)


def download(url: str, dest: Path, size: int | None, sha256: str | None) -> None:
    """Fetch ``url`` into ``dest``: through ``dest.part`` (resumed when present), checked against ``size`` and
    ``sha256``, then renamed. A file that fails the check is deleted (nothing is left at ``dest``); a connection
    that fails keeps the part for the next run."""
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    for attempt in range(1, ATTEMPTS + 1):
        if size is not None and part.exists() and part.stat().st_size >= size:
            break  # nothing left to fetch: check what is there
        try:
            received = _transfer(url, part, size)
        except _DROPPED as e:  # the connection dropped mid-transfer: resume while attempts are left
            if attempt == ATTEMPTS:
                raise Unreachable(f"the connection to {url} kept dropping ({e})") from None
            log.warning("download of %s interrupted (%s); resuming", url, e)
            continue
        if size is None or received == 0:
            break
    if not part.exists():
        raise Unreachable(f"{url} sent nothing")
    problem = mismatch(part, size, sha256)
    if problem is not None:
        part.unlink()
        raise SeqmixError(f"the file downloaded from {url} has {problem}: it was damaged on the way or changed at the "
                          f"source; it was deleted and nothing was written to {dest}; run the command again, or put "
                          f"a copy with that sha256 at {dest} by hand")
    os.replace(part, dest)


def extract(archive: Path, member: str, dest: Path, size: int | None, sha256: str | None) -> None:
    """Write ``member`` of the zip ``archive`` to ``dest`` atomically, refused (nothing written) when it is not
    ``size`` bytes with ``sha256``."""
    def write(out) -> None:
        h, n = hashlib.sha256(), 0
        with zipfile.ZipFile(archive) as z, z.open(member) as f:
            while block := f.read(_BLOCK):
                out.write(block)
                h.update(block)
                n += len(block)
        if (size is not None and n != size) or (sha256 is not None and h.hexdigest() != sha256):
            raise SeqmixError(f"{member} in {archive} is {n:,} bytes with sha256 {h.hexdigest()}, expected "
                              f"{size:,} bytes with {sha256}; delete {archive} and run the command again")

    try:
        atomic_write(dest, write)
    except KeyError:
        raise SeqmixError(f"{archive} holds no {member}; delete it and run the command again") from None
    except zipfile.BadZipFile as e:
        raise SeqmixError(f"{archive} is not a valid zip archive ({e}); delete it and run the command again") from None


def plan(corpus: Corpus, wanted: Iterable[str]) -> list[RemoteFile]:
    """The corpus files behind the file names a source reads (each name once), refused when one is not there."""
    files = []
    for name in dict.fromkeys(wanted):
        found = corpus.file_for(name)
        if found is None:
            raise SeqmixError(f"{corpus.name} has no file {name} (it has {', '.join(f.name for f in corpus.files)}); "
                              "fix the split names in task.data.splits or task.data.source.pattern")
        files.append(found)
    return files


def _present(f: RemoteFile, folder: Path, report: Callable[[str], None]) -> bool:
    """Whether the source already finds ``f`` in ``folder``: the file itself (verified; another file under its name
    is refused, never replaced), or the same name plain or gzipped (the user's own copy, taken as it is)."""
    dest = folder / f.name
    if dest.exists():
        problem = mismatch(dest, f.final_size, f.member_sha256 if f.member else f.sha256)
        if problem is not None:
            raise SeqmixError(f"{dest} is already there but is not the file download=true fetches ({problem}); move "
                              "it away and run the command again, or leave out download=true to use it as it is")
        report(f"{dest}: present, size and sha256 checked")
        return True
    other = folder / (f.name[:-3] if f.name.endswith(".gz") else f.name + ".gz")
    if other.exists():
        report(f"{other}: present (used as it is, not checked)")
        return True
    return False


def _check_room(files: list[RemoteFile], folder: Path) -> None:
    need = sum((f.size or f.final_size or 0) + (f.member_size or 0) for f in files)
    free = shutil.disk_usage(folder).free
    if need > free:
        raise SeqmixError(f"the download needs {need / 1e6:,.1f} MB in {folder} but {free / 1e6:,.1f} MB are free; "
                          "free some space, or set SEQMIX_DATA_DIR (or paths.data_dir) to a disk with room")


def _fetch_file(f: RemoteFile, folder: Path, archives: set[Path]) -> None:
    dest = folder / f.name
    if f.member is None:
        download(mirrored(f.url), dest, f.size, f.sha256)
        return
    archive = folder / Path(urllib.parse.urlsplit(f.url).path).name
    if not archive.exists() or mismatch(archive, f.size, f.sha256) is not None:
        download(mirrored(f.url), archive, f.size, f.sha256)
    archives.add(archive)
    extract(archive, f.member, dest, f.member_size, f.member_sha256)


def fetch(corpus: Corpus, folder: str | Path, wanted: Iterable[str],
          report: Callable[[str], None] = log.info) -> list[Path]:
    """Download the files of ``corpus`` behind the names in ``wanted`` into ``folder``; those already there are
    checked, not fetched again, and when all are there nothing is written. One process at a time per folder.
    Returns the files' paths."""
    folder = Path(os.path.expanduser(str(folder)))
    files = plan(corpus, wanted)
    if corpus.prepare is not None:
        return fetch_prepared(corpus, folder, list(dict.fromkeys(wanted)), report)
    said: list[str] = []
    if folder.is_dir() and all(_present(f, folder, said.append) for f in files):
        for line in said:
            report(line)
        return [folder / f.name for f in files]
    with contextlib.ExitStack() as held:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            held.enter_context(exclusive(folder / ".download.lock", f"the download into {folder}"))
        except OSError as e:
            raise SeqmixError(f"cannot write into {folder} ({e.strerror or e}); set SEQMIX_DATA_DIR (or "
                              "paths.data_dir) to a folder of yours") from None
        _fetch_missing(corpus, files, folder, report)
    return [folder / f.name for f in files]


@contextlib.contextmanager
def _download_errors(f: RemoteFile, folder: Path, by_hand: str) -> Iterator[None]:
    """An unreachable host or a full disk while fetching ``f`` into ``folder``: one line saying what to do
    (``by_hand``: which files to put where instead)."""
    try:
        yield
    except Unreachable as e:
        upstream = "" if mirrored(f.url) == f.url else f" (upstream: {f.url})"
        raise SeqmixError(
            f"{e}{upstream}; check the network (HTTPS_PROXY behind a proxy, {MIRROR_VARIABLE}=<url> for a "
            f"mirror) and run the command again, or download {by_hand}") from None
    except OSError as e:
        if e.errno not in _FULL:
            raise
        raise SeqmixError(f"cannot write into {folder} ({e.strerror}); free some space, or set SEQMIX_DATA_DIR "
                          "(or paths.data_dir) to a disk with room, and run the command again: it resumes "
                          "where it stopped") from None


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _fetch_missing(corpus: Corpus, files: list[RemoteFile], folder: Path, report: Callable[[str], None]) -> None:
    todo = [f for f in files if not _present(f, folder, report)]
    _check_room(todo, folder)
    archives: set[Path] = set()
    by_hand = f"the files by hand ({corpus.homepage}) and put {', '.join(g.name for g in files)} in {folder}"
    for f in todo:
        report(f"{folder / f.name}: downloading {mirrored(f.url)}")
        with _download_errors(f, folder, by_hand):
            _fetch_file(f, folder, archives)
        report(f"{folder / f.name}: {(folder / f.name).stat().st_size:,} bytes, size and sha256 checked")
    for archive in archives:
        archive.unlink(missing_ok=True)


def _prepared_already(folder: Path, wanted: list[str], report: Callable[[str], None]) -> list[Path]:
    """A folder that exists is never written into: it was prepared whole, or it is the user's own."""
    missing = [name for name in wanted if not (folder / name).is_file()]
    if missing:
        raise SeqmixError(f"{folder} is there but holds no {', '.join(missing)}; download=true prepares the whole "
                          "folder and never writes into one that exists: move it away and run the command again")
    report(f"{folder}: present, left as it is")
    return [folder / name for name in wanted]


def _prepare(corpus: Corpus, archive: Path, folder: Path, report: Callable[[str], None]) -> None:
    """Prepare into a new folder beside the archive, then rename it to ``folder``: ``folder`` is whole or absent.
    An archive the preparation refuses is deleted with its folder, so that the next run downloads it anew."""
    work = archive.with_name("prepared")
    shutil.rmtree(work, ignore_errors=True)  # left by a run that was killed
    try:
        corpus.prepare(archive, work, report)
        os.rename(work, folder)
    except SeqmixError as e:
        shutil.rmtree(archive.parent, ignore_errors=True)
        problem = " ".join(str(e).split("\n"))
        raise SeqmixError(f"{problem}; it was deleted and nothing was written to {folder}: run the command again to "
                          "download it anew") from None
    except OSError as e:
        if e.errno not in _FULL:
            raise
        raise SeqmixError(f"cannot write into {work} ({e.strerror}); free some space, or set SEQMIX_DATA_DIR (or "
                          "paths.data_dir) to a disk with room, and run the command again") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch_prepared(corpus: Corpus, folder: Path, wanted: list[str], report: Callable[[str], None]) -> list[Path]:
    """A corpus prepared from an archive: the archive is fetched into ``<folder>.download`` (an interrupted download
    resumes there; a copy put there by hand is used), prepared, and the folder renamed into place; the archive is
    then deleted. One process at a time; a folder already there is left as it is."""
    if folder.exists():
        return _prepared_already(folder, wanted, report)
    f, staging = corpus.files[0], folder.with_name(folder.name + ".download")
    archive = staging / f.name
    with contextlib.ExitStack() as held:
        try:
            staging.mkdir(parents=True, exist_ok=True)
            held.enter_context(exclusive(staging / ".download.lock", f"the download into {folder}"))
        except OSError as e:
            raise SeqmixError(f"cannot write into {staging.parent} ({e.strerror or e}); set SEQMIX_DATA_DIR (or "
                              "paths.data_dir) to a folder of yours") from None
        if folder.exists():  # prepared by another process while this one waited
            return _prepared_already(folder, wanted, report)
        if not archive.exists():
            report(f"{archive}: downloading {mirrored(f.url)}")
            with _download_errors(f, staging, f"{f.name} by hand ({corpus.homepage}) and put it in {staging}"):
                download(mirrored(f.url), archive, f.size, f.sha256)
            checked = "size and sha256 checked" if f.sha256 else "no published size or sha256 to check it against"
            report(f"{archive}: {archive.stat().st_size:,} bytes, {checked}")
        _prepare(corpus, archive, folder, report)
    shutil.rmtree(staging, ignore_errors=True)
    return [folder / name for name in wanted]
