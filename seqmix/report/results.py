"""The README's results tables, written from the recipe runs' records, never typed:
``python -m seqmix.report results [--add <run dir> ...] [--readme README.md]``.

``--add`` copies a finished run's ``run.json`` (``seqmix.training.run_record``: overrides, machine, commit, updates,
wall time and every scored decode of its checkpoints) into the records folder (``benchmarks/results/recipes``), one
file per recipe and machine kind (``<machine kind>/<experiment>.json``); the record it replaces moves to ``earlier/``
(kept, never tabulated). The tables then come from those files alone: one set per machine kind, since updates and wall
time compare only within one, and in it one table per kind of task (translation: sacreBLEU with its brevity penalty
for the task's own decoding and greedy, and the papers' BLEU; language modeling: perplexity; summarization: ROUGE),
one row per recipe, after the aims table (``seqmix.report.aims``: which of the project's aims each kind's rows meet).
The records themselves are ``seqmix.report.records``. ``--readme`` rewrites the part of the README between the two
``RESULTS_BEGIN``/``RESULTS_END`` marks; without it the tables are printed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seqmix.config.user_errors import CommandParser, command_status
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text
from seqmix.report import markdown
from seqmix.report.aims import aims_text, cpu_recipes
from seqmix.report.records import (
    RECORDS,
    ROUGES,
    Recipe,
    add_run,
    beam_size,
    lead_baseline,
    machine_label,
    read_recipes,
)

RESULTS_BEGIN = "<!-- results: written by `make results` (python -m seqmix.report results) from benchmarks/results/recipes -->"
RESULTS_END = "<!-- results end -->"


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



def _rouges(evaluation: dict | None) -> str:
    return " / ".join(_num(evaluation["metrics"].get(k)) for k in ROUGES) if evaluation else "-"


def _summary_row(recipe: Recipe) -> list[str]:
    """The model's ROUGE with the task's decoding (its beam size said) and greedy, then the lead-N baseline's on the
    same split (recorded beside it; "-" in older records)."""
    final, greedy = recipe.final(), recipe.greedy()
    if final is None:
        return ["-", _rouges(greedy), "-"]
    m = final["metrics"]
    lead = lead_baseline(m)
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


def results_text(recipes: list[Recipe], expected: list[str] | None = None) -> str:
    """The tables of each machine kind: a row compares with the rows of its own kind only. With ``expected`` (the CPU
    recipes a complete set holds: ``aims.cpu_recipes``), the aims table comes first."""
    unknown = [r.name for r in recipes if kind_of(r) is None]
    if unknown:
        raise SeqmixError(f"records with no scored decode of their best checkpoint on valid: {', '.join(unknown)}; "
                          "score it (python generate.py ckpt_path=<run>/checkpoints/best.ckpt split=valid), then add "
                          "the run again")
    kinds = by_machine_kind(recipes)
    aims = [aims_text(kinds, expected)] if expected is not None and kinds else []
    if len(kinds) <= 1:
        lines = [f"Every row below ran on one machine kind: {label}.\n" for label in kinds]
        return "\n".join([*lines, *aims, *_task_tables(recipes, "###")])
    listed = "; ".join(f"{label} ({_recipes(len(members))})" for label, members in kinds.items())
    sections = [f"The rows below ran on {len(kinds)} machine kinds, each with its own tables (updates and wall time "
                f"compare only within one): {listed}.\n", *aims]
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
    text = results_text(recipes, expected=cpu_recipes())
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
