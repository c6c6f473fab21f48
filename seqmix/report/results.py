"""The README's results tables, written from the recipe runs' records, never typed:
``python -m seqmix.report results [--add <run dir> ...] [--readme README.md]``.

``--add`` copies a finished run's ``run.json`` (``seqmix.training.run_record``: overrides, machine, commit, updates,
wall time and every scored decode of its checkpoints) into the records folder (``benchmarks/results/recipes``), one
file per recipe and machine kind (``<machine kind>/<experiment>.json``); the record it replaces moves to ``earlier/``
(kept, never tabulated). The tables then come from those files alone: one set per machine kind, since updates and wall
time compare only within one, and in it one table per kind of task (translation: sacreBLEU with its brevity penalty
for the task's own decoding and greedy, and the papers' BLEU; language modeling: perplexity; summarization: ROUGE),
one row per recipe. ``--readme`` rewrites the part of the README between the two ``RESULTS_BEGIN``/``RESULTS_END``
marks; without it the tables are printed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from seqmix.config.user_errors import CommandParser, command_status
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write, atomic_write_text
from seqmix.report import markdown
from seqmix.training.run_record import RECORD, read_record

RECORDS = Path("benchmarks/results/recipes")
RESULTS_BEGIN = "<!-- results: written by `make results` (python -m seqmix.report results) from benchmarks/results/recipes -->"
RESULTS_END = "<!-- results end -->"
# overrides that say where a run wrote, not what it trained
_PLACE_KEYS = ("logger", "hydra.", "paths.", "callbacks.dashboard.", "trainer.enable_progress_bar")
_FLAG_NAMES = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


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


def _num(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "-"


def _bleu(evaluation: dict | None) -> str:
    if evaluation is None:
        return "-"
    m = evaluation["metrics"]
    return f"{_num(m.get('bleu'))} ({_num(m.get('bp'), 3)})"


def _papers_bleu(evaluation: dict | None) -> str:
    if evaluation is None:
        return "-"
    values = [v for k, v in evaluation["metrics"].items() if k.startswith("bleu_paper")]
    return " / ".join(_num(v) for v in values) or "-"


def _common(recipe: Recipe) -> list[str]:
    r = recipe.record
    params = r.get("parameters")
    wall = r.get("wall_seconds")
    size = "" if not params else f" ({params / 1e6:.1f}M)" if params >= 1e6 else f" ({params / 1e3:.0f}K)"
    return [f"`{' '.join(recipe.overrides())}`", f"{r.get('model', '?')}{size}", f"{r.get('updates', 0):,}",
            _num(wall / 60, 1) if wall else "-", str(r.get("precision", "?"))]


COMMON = ["recipe (`python train.py ...`)", "model", "updates", "wall (min)", "precision"]
PROVENANCE = ["machine", "commit"]


def _translation_row(recipe: Recipe) -> list[str]:
    final, greedy = recipe.final(), recipe.greedy()
    beam = beam_size(final) if final else None
    decode = f"beam {beam}" if beam else "task's decoding"
    return [_bleu(final) + ("" if beam == 5 else f" ({decode})"), _papers_bleu(final), _bleu(greedy)]


def _lm_row(recipe: Recipe) -> list[str]:
    final = recipe.final()
    return [_num(final["metrics"].get("perplexity")) if final else "-"]


ROUGES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def _rouges(evaluation: dict | None) -> str:
    return " / ".join(_num(evaluation["metrics"].get(k)) for k in ROUGES) if evaluation else "-"


def _summary_row(recipe: Recipe) -> list[str]:
    """The model's ROUGE with the task's decoding (its beam size said) and greedy, then the lead-N baseline's on the
    same split (recorded beside it; "-" in older records)."""
    final, greedy = recipe.final(), recipe.greedy()
    if final is None:
        return ["-", _rouges(greedy), "-"]
    m = final["metrics"]
    lead = next((k[:-len("_rouge1")] for k in m if re.fullmatch(r"lead\d+_rouge1", k)), None)
    baseline = "-" if lead is None else (" / ".join(_num(m.get(f"{lead}_{k}")) for k in ROUGES)
                                         + f" ({lead[:4]}-{lead[4:]})")
    beam = beam_size(final)
    return [_rouges(final) + (f" (beam {beam})" if beam else ""), _rouges(greedy), baseline]


@dataclass(frozen=True)
class Kind:
    title: str
    metric: str  # a metric only this kind's evaluations have
    columns: tuple[str, ...]
    row: object  # Recipe -> cells
    note: str


KINDS = (
    Kind("Translation", "bleu", ("valid sacreBLEU, beam 5 (BP)", "papers' BLEU, beam 5", "valid sacreBLEU, greedy (BP)"),
         _translation_row, "sacreBLEU of detokenized output against the raw references (signature `{signature}`) "
         "with its brevity penalty; papers' BLEU: {papers}; greedy: `python generate.py "
         "ckpt_path=<run>/checkpoints/best.ckpt split=valid beam_size=1`."),
    Kind("Language modeling", "perplexity", ("valid perplexity",), _lm_row,
         "Perplexity over the whole valid split, best.ckpt."),
    Kind("Summarization", "rougeL", ("valid ROUGE-1/2/L/Lsum F1, task's decoding", "valid ROUGE, greedy",
                                      "lead-N baseline, same split"), _summary_row,
         "rouge-score F1 with stemming, best.ckpt; greedy: `python generate.py ckpt_path=<run>/checkpoints/best.ckpt "
         "split=valid beam_size=1`."),
)


def _details(recipes: list[Recipe], prefix: str) -> list[str]:
    """The distinct signatures in the final evaluations' detail lines that start with ``prefix``."""
    seen: list[str] = []
    for recipe in recipes:
        for line in (recipe.final() or {}).get("details") or []:
            text = line.split(" = ")[0][len(prefix):].strip() if line.startswith(prefix) else None
            if text and text not in seen:
                seen.append(text)
    return seen


def kind_of(recipe: Recipe) -> Kind | None:
    final = recipe.final()
    return next((k for k in KINDS if final and k.metric in final["metrics"]), None)


def by_machine_kind(recipes: list[Recipe]) -> dict[str, list[Recipe]]:
    """The recipes of each machine kind, the kind with the most first."""
    kinds: dict[str, list[Recipe]] = {}
    for recipe in recipes:
        kinds.setdefault(recipe.machine_kind(), []).append(recipe)
    return dict(sorted(kinds.items(), key=lambda item: (-len(item[1]), item[0])))


def _recipes(n: int) -> str:
    return f"{n} recipe" if n == 1 else f"{n} recipes"


def _task_tables(recipes: list[Recipe], level: str) -> list[str]:
    """One section per kind of task that has recipes: the table and how its numbers were measured."""
    sections = []
    for kind in KINDS:
        members = [r for r in recipes if kind_of(r) is kind]
        if not members:
            continue
        header = [*COMMON, *kind.columns, *PROVENANCE]
        rows = [[*_common(r), *kind.row(r), machine_label(r.record.get("machine"), generation=True),
                 f"`{r.record.get('commit', '?')}`"]
                for r in members]
        signature = "; ".join(_details(members, "sacreBLEU:")) or "-"
        papers = "; ".join(f"({i + 1}) {s}" for i, s in enumerate(_details(members, "paper BLEU:"))) or "none"
        note = kind.note.format(signature=signature, papers=papers)
        sections.append(f"{level} {kind.title}\n\n{markdown(header, rows)}\n{note}\n")
    return sections


def results_text(recipes: list[Recipe]) -> str:
    """The tables of each machine kind: a row compares with the rows of its own kind only."""
    unknown = [r.name for r in recipes if kind_of(r) is None]
    if unknown:
        raise SeqmixError(f"records with no scored decode of their best checkpoint on valid: {', '.join(unknown)}; "
                          "score it (python generate.py ckpt_path=<run>/checkpoints/best.ckpt split=valid), then add "
                          "the run again")
    kinds = by_machine_kind(recipes)
    if len(kinds) <= 1:
        lines = [f"Every row below ran on one machine kind: {label}.\n" for label in kinds]
        return "\n".join([*lines, *_task_tables(recipes, "###")])
    listed = "; ".join(f"{label} ({_recipes(len(members))})" for label, members in kinds.items())
    sections = [f"The rows below ran on {len(kinds)} machine kinds, each with its own tables (updates and wall time "
                f"compare only within one): {listed}.\n"]
    for label, members in kinds.items():
        sections += [f"### On {label}\n", *_task_tables(members, "####")]
    return "\n".join(sections)


def write_readme(readme: Path, text: str) -> None:
    """Replace what lies between the marks with ``text`` (written whole, atomically)."""
    try:
        content = readme.read_text(encoding="utf-8")
    except OSError as err:
        raise SeqmixError(f"cannot read {readme} ({err.strerror or err}); give the README with --readme") from None
    begin, end = content.find(RESULTS_BEGIN), content.find(RESULTS_END)
    if begin < 0 or end < begin:
        raise SeqmixError(f"{readme} lacks the marks '{RESULTS_BEGIN}' ... '{RESULTS_END}' around its results: "
                          "put them where the tables go")
    head = content[:begin + len(RESULTS_BEGIN)]
    atomic_write_text(readme, f"{head}\n\n{text}\n{content[end:]}")


def readme_section(readme: Path) -> str:
    """What lies between the marks now (for checking that the README holds what the records say)."""
    content = readme.read_text(encoding="utf-8")
    begin, end = content.find(RESULTS_BEGIN), content.find(RESULTS_END)
    section = content[begin + len(RESULTS_BEGIN):end].strip() if 0 <= begin < end else ""
    return section + "\n" if section else ""


def run(args) -> None:
    folder = Path(args.records)
    added = [add_run(Path(run_dir), folder) for run_dir in args.add or []]
    recipes = read_recipes(folder)
    kinds = by_machine_kind(recipes)
    for target in added:
        label = next(r.machine_kind() for r in recipes if r.path == target)
        print(f"added {target}: a row of the tables on {label} ({_recipes(len(kinds[label]))} there)")
    text = results_text(recipes)
    if args.readme:
        write_readme(Path(args.readme), text)
        print(f"wrote the results of {len(recipes)} recipes into {args.readme}")
    else:
        print(text, end="")


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m seqmix.report results", description=__doc__.split("\n\n")[0])
    parser.add_argument("--add", action="append", metavar="RUN_DIR", help="copy a finished run's record in first")
    parser.add_argument("--records", default=str(RECORDS), help=f"the records folder (default {RECORDS})")
    parser.add_argument("--readme", help="rewrite this README's results section instead of printing the tables")
    args = parser.parse_args(argv)
    return command_status(lambda: run(args))
