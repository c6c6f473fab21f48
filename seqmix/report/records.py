"""The recipe runs' records: one ``run.json`` per recipe and machine kind in ``benchmarks/results/recipes``
(``<machine kind>/<experiment>.json``), read back as ``Recipe`` rows. ``add_run`` copies a finished run's record in,
keeping the one it replaces in ``earlier/``; ``read_recipes`` reads them all, naming any damaged record or any two
records of one recipe on one kind; a kind is a CPU label, split by CPU generation where two share it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write
from seqmix.report import overrides_by_key
from seqmix.training.run_record import RECORD, read_record

RECORDS = Path("benchmarks/results/recipes")

# overrides that say where a run wrote, not what it trained
_PLACE_KEYS = ("logger", "hydra.", "paths.", "callbacks.dashboard.", "trainer.enable_progress_bar")
_FLAG_NAMES = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
ROUGES = ("rouge1", "rouge2", "rougeL", "rougeLsum")  # a summarization scoring's metrics


@dataclass
class Recipe:
    name: str  # the record's file name (its experiment)
    record: dict
    kind: str = ""  # its machine kind's label (``read_recipes``); by default the machine's
    path: Path | None = None  # the record file it was read from

    def machine_kind(self) -> str:
        return self.kind or machine_label(self.record.get("machine"))

    def overrides(self) -> list[str]:
        """What the run was started with (the recipe first), less where it wrote."""
        kept = [str(o) for o in self.record.get("overrides") or [] if not str(o).lstrip("+~").startswith(_PLACE_KEYS)]
        return sorted(kept, key=lambda o: not o.startswith("experiment="))

    def override(self, key: str) -> str | None:
        """The value the run was started with for ``key``, or None."""
        return overrides_by_key(self.record.get("overrides")).get(key)

    def evaluations(self, split: str = "valid") -> list[dict]:
        return [e for e in self.record.get("evaluations") or [] if isinstance(e, dict) and e.get("split") == split
                and isinstance(e.get("metrics"), dict)]

    def _on_best(self) -> list[dict]:
        best = Path(str(self.record.get("checkpoint") or "")).name
        return sorted((e for e in self.evaluations() if e.get("checkpoint") == best), key=lambda e: e.get("when") or 0)

    def final(self) -> dict | None:
        """The latest scoring of the kept (best) checkpoint with the task's decoding (not greedy): the run's own final
        evaluation, or a later ``generate.py`` run that set no decoding option (records older than ``options_given``
        count every non-greedy scoring)."""
        chosen = [e for e in self._on_best() if beam_size(e) != 1 and not e.get("options_given")]
        return chosen[-1] if chosen else None

    def greedy(self) -> dict | None:
        """``generate.py ... beam_size=1`` on the same checkpoint (translation), no other decoding option set."""
        chosen = [e for e in self._on_best() if beam_size(e) == 1 and set(e.get("options_given") or ()) <= {"beam_size"}]
        return chosen[-1] if chosen else None


def beam_size(evaluation: dict) -> int | None:
    found = re.search(r"\bbeam_size=(\d+)", evaluation.get("decoding") or "")
    return int(found.group(1)) if found else None


def lead_baseline(metrics: dict) -> str | None:
    """The prefix (``lead3``) of the lead-N baseline's ROUGE recorded beside a summary's, or None (older records)."""
    return next((k.removesuffix("_rouge1") for k in metrics if re.fullmatch(r"lead\d+_rouge1", k)), None)


def machine_label(machine: dict | None, generation: bool = False) -> str:
    """``AMD EPYC, 2 threads, AVX512-BF16`` (the fastest instruction set that matters), or the GPU's name: a machine
    kind. With ``generation``, ``AMD EPYC (family 26 model 2), ...`` where the record has it (records before it do
    not): one label is one kind until a second CPU generation shares it (``kind_folder``)."""
    if not isinstance(machine, dict):
        return "unknown"
    if machine.get("gpu"):
        return str(machine["gpu"])
    flags = set(machine.get("cpu_flags") or [])
    best = next((label for flag, label in _FLAG_NAMES if flag in flags), None)
    cpu = str(machine.get("cpu") or "unknown")
    if generation and machine.get("cpu_generation"):
        cpu = f"{cpu} ({machine['cpu_generation']})"
    parts = [cpu, f"{machine.get('threads', '?')} threads", best]
    return ", ".join(p for p in parts if p)


def read_recipes(folder: Path) -> list[Recipe]:
    """Every ``*.json`` record in ``folder`` and its machine-kind folders (not ``earlier/``), by name; a damaged file
    is named, never skipped, and so are two records of one recipe on one machine kind. A folder is one kind; where
    two folders hold one label (two CPU generations), each kind's label names its generation."""
    if not folder.is_dir():
        raise SeqmixError(f"records folder {folder} does not exist: add runs with --add <run dir>")
    folders: dict[tuple[Path, str], list[tuple[Path, dict]]] = {}
    for path in sorted(folder.rglob("*.json")):
        if EARLIER in path.relative_to(folder).parts:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise SeqmixError(f"record {path} is damaged ({type(err).__name__}); add its run again with --add") from None
        if not isinstance(record, dict) or record.get("status") != "finished":
            raise SeqmixError(f"record {path} is not a finished run's; add its run again with --add")
        folders.setdefault((path.parent, machine_label(record.get("machine"))), []).append((path, record))
    labels = {}
    for (_, label), records in folders.items():
        if clash := _generation_clash(records):
            (first, kept), (path, generation) = clash
            raise SeqmixError(f"records {first} ({kept}) and {path} ({generation}) are both on {label} but "
                              "from different CPU generations, whose speeds differ: keep one generation's records "
                              f"in {path.parent} (move the others into {folder / EARLIER})")
        labels.setdefault(label, []).append(records)
    recipes, seen = [], {}
    for label, sets in labels.items():
        for records in sets:
            named = next((record.get("machine") for _, record in records if _generation(record)), None)
            kind = label if len(sets) == 1 or named is None else machine_label(named, generation=True)
            for path, record in records:
                key = (path.stem, kind)
                if key in seen:
                    raise SeqmixError(f"records {seen[key]} and {path} are both {key[0]} on {key[1]}: keep one (move "
                                      f"the other into {folder / EARLIER})")
                seen[key] = path
                recipes.append(Recipe(path.stem, record, kind, path))
    return sorted(recipes, key=lambda r: r.name)


def kind_folder(machine: dict | None, generation: bool = False) -> str:
    """The records folder of a machine kind: its label (with its CPU generation: ``machine_label``) in lower case,
    runs of other characters as one ``-``."""
    label = machine_label(machine, generation=generation)
    return re.sub(r"[^a-z0-9]+", "-", label.lower().replace("(r)", "")).strip("-") or "unknown"


EARLIER = "earlier"


def _generation(record: dict) -> str | None:
    machine = record.get("machine")
    return machine.get("cpu_generation") if isinstance(machine, dict) else None


def _generation_clash(records: list[tuple[Path, dict]]):
    """The first record of ``(path, record)`` pairs that names a CPU generation and the first after it that names
    another, as two ``(path, generation)`` pairs, or None; records without a generation (older ones) never clash."""
    named = [(path, generation) for path, record in records if (generation := _generation(record))]
    return next(((named[0], other) for other in named[1:] if other[1] != named[0][1]), None)


def add_run(run_dir: Path, folder: Path) -> Path:
    """Copy ``run_dir``'s record into ``folder/<machine kind>/<experiment>.json``; that recipe's earlier record on the
    same machine kind, if another run's (not this run's before a new scoring), moves to
    ``folder/earlier/<experiment>.<commit>.<n>.json`` first, so no result is lost by a re-run."""
    record = read_record(run_dir)
    if record is None:
        raise SeqmixError(f"{run_dir} has no readable {RECORD}: give the folder of a train.py run")
    if record.get("status") != "finished":
        raise SeqmixError(f"{run_dir} did not finish (status {record.get('status')!r}): only finished runs make rows")
    experiments = [str(o).split("=", 1)[1] for o in record.get("overrides") or [] if str(o).startswith("experiment=")]
    if len(experiments) != 1:
        raise SeqmixError(f"{run_dir} was not started with one experiment=<recipe>: the tables list recipes")
    target = _kind_folder_of(record, folder) / f"{experiments[0]}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    data = (run_dir / RECORD).read_bytes()
    if target.is_file() and target.read_bytes() != data and not _same_run(target, record):
        _keep_earlier(target, folder / EARLIER)
    atomic_write(target, lambda f: f.write(data))
    return target


def _kind_folder_of(record: dict, folder: Path) -> Path:
    """The label's folder, unless its records name another CPU generation than ``record``'s: then a folder of the
    label with the generation, a kind of its own (its speeds differ), so that neither set is broken up."""
    machine = record.get("machine")
    plain = folder / kind_folder(machine)
    if not _generation(record):
        return plain
    own = folder / kind_folder(machine, generation=True)
    if own.is_dir():
        return own
    kept = [(path, _read_json(path)) for path in sorted(plain.glob("*.json"))]
    return own if _generation_clash([(plain, record), *kept]) else plain


def _read_json(path: Path) -> dict:
    """A record's content, or {} where it cannot be read (``read_recipes`` names damaged records)."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _same_run(target: Path, record: dict) -> bool:
    """Whether ``target`` is an older copy of ``record``'s run (scored again since): it is replaced, not kept."""
    kept = _read_json(target)
    same = ("started", "commit", "checkpoint")
    return kept.get("started") is not None and all(kept.get(k) == record.get(k) for k in same)


def _keep_earlier(target: Path, earlier: Path) -> Path:
    try:
        commit = str(json.loads(target.read_text(encoding="utf-8")).get("commit") or "unknown")[:12]
    except (OSError, ValueError, AttributeError):
        commit = "damaged"
    earlier.mkdir(exist_ok=True)
    n = 1
    while (earlier / f"{target.stem}.{commit}.{n}.json").exists():
        n += 1
    kept = earlier / f"{target.stem}.{commit}.{n}.json"
    target.replace(kept)
    return kept
