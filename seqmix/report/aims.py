"""What the CPU recipes aim for, and whether each machine kind's records meet it: one generated table above the
results tables, so that "met" or "missed" is read from the records, never typed beside them.

The aims are the project's: every CPU recipe run on each kind; DynamicConv at or above the Transformer (the paper's
order); every autoregressive Multi30k recipe at 38.5 beam-5 BLEU or more on an AVX-512 CPU in its 45 minutes; the
non-autoregressive students within 3 BLEU of the teacher they were distilled from; the DialogSum Transformer at or
above the lead-3 baseline on every ROUGE. A cell says the verdict and the numbers behind it: ``met``, ``missed``,
``open`` (what was run agrees, but not all of it was run), ``not run`` or ``n/a``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seqmix.config.paths import conf_dir
from seqmix.report import markdown
from seqmix.report.records import ROUGES, Recipe, beam_size, lead_baseline

AUTOREGRESSIVE = tuple(f"multi30k_{m}_cpu" for m in ("transformer", "lightconv", "dynamicconv", "talk", "convs2s",
                                                     "hybrid"))
BLEU_AIM = 38.5
TEACHER_GAP = 3.0
_ROUGE_NAMES = dict(zip(ROUGES, ("ROUGE-1", "ROUGE-2", "ROUGE-L", "ROUGE-Lsum"), strict=True))


def cpu_recipes(folder: Path | None = None) -> list[str]:
    """The CPU recipes a complete set holds: ``conf/experiment/*_cpu.yaml``."""
    return sorted(p.stem for p in (folder or conf_dir() / "experiment").glob("*_cpu.yaml"))


def _short(name: str) -> str:
    return name.removesuffix("_cpu")


def _model(name: str) -> str:
    return _short(name).removeprefix("multi30k_")


def _bleu(recipe: Recipe | None, beam: int | None = 5) -> float | None:
    """The kept checkpoint's valid BLEU with the task's decoding, which must be beam ``beam`` unless None (a student's
    length beam); rounded as shown, so that a verdict agrees with the numbers in its cell."""
    final = recipe.final() if recipe else None
    if final is None or (beam is not None and beam_size(final) != beam):
        return None
    bleu = final["metrics"].get("bleu")
    return round(bleu, 2) if isinstance(bleu, (int, float)) else None


def teacher_of(student: Recipe, rows: dict[str, Recipe]) -> Recipe | None:
    """The row whose checkpoint the student started from (``init_encoder_from``), trained before it: the teacher
    whose translations it learned. None where the start is not recorded or that run is no longer a row (a re-run
    of the teacher's recipe starts later, so it is never mistaken for the teacher)."""
    start, started = student.override("init_encoder_from"), student.record.get("started")
    if not start or not isinstance(started, (int, float)):
        return None

    def before(row: Recipe) -> bool:
        return isinstance(row.record.get("started"), (int, float)) and row.record["started"] <= started

    return next((r for r in rows.values() if r is not student and r.record.get("checkpoint") == start and before(r)),
                None)


@dataclass(frozen=True)
class Aim:
    text: str
    verdict: Callable[[dict[str, Recipe], list[str]], str]  # (rows by recipe, the CPU recipes) -> cell


def _every_recipe(rows: dict[str, Recipe], expected: list[str]) -> str:
    missing = [_short(n) for n in expected if n not in rows]
    run = len(expected) - len(missing)
    return f"met: all {run}" if not missing else f"open: {run} of {len(expected)}; not run: {', '.join(missing)}"


def _dynamicconv_over_transformer(rows: dict[str, Recipe], _: list[str]) -> str:
    dyn, tr = (_bleu(rows.get(f"multi30k_{m}_cpu")) for m in ("dynamicconv", "transformer"))
    if dyn is None or tr is None:
        return "not run"
    return f"{'met' if dyn >= tr else 'missed'}: {dyn:.2f} against {tr:.2f}"


def _autoregressive_at_aim(rows: dict[str, Recipe], _: list[str]) -> str:
    """A recipe scored with another decoding than beam 5 counts as not run: its number is not the one aimed at."""
    machine = next(iter(rows.values())).record.get("machine") or {}
    if machine.get("gpu") or "avx512f" not in (machine.get("cpu_flags") or []):
        return "n/a: not an AVX-512 CPU"
    scores = {n: s for n in AUTOREGRESSIVE if (s := _bleu(rows.get(n))) is not None}
    if not scores:
        return "not run"
    below = {n: s for n, s in scores.items() if s < BLEU_AIM}
    if below:
        named = ", ".join(f"{_model(n)} {s:.2f}" for n, s in below.items())
        return f"missed: {len(below)} of {len(scores)} below: {named}"
    missing = [_model(n) for n in AUTOREGRESSIVE if n not in scores]
    if missing:
        return f"open: all {len(scores)} run at or above; not run: {', '.join(missing)}"
    lowest = min(scores, key=scores.get)
    return f"met: lowest {_model(lowest)} {scores[lowest]:.2f}"


def _student_near_teacher(student_name: str):
    def verdict(rows: dict[str, Recipe], _: list[str]) -> str:
        student = rows.get(student_name)
        if student is None:
            return "not run"
        teacher = teacher_of(student, rows)
        score, teacher_score = _bleu(student, beam=None), _bleu(teacher)
        if teacher_score is None or score is None:
            return f"open: {score if score is None else f'{score:.2f}'}; its teacher is not a row here"
        gap = round(teacher_score - score, 2)
        state = "met" if gap <= TEACHER_GAP else "missed"
        return f"{state}: {score:.2f}, {gap:.2f} under {_model(teacher.name)}'s {teacher_score:.2f}"
    return verdict


def _summary_over_lead(name: str):
    def verdict(rows: dict[str, Recipe], _: list[str]) -> str:
        final = rows[name].final() if name in rows else None
        if final is None:
            return "not run"
        m = final["metrics"]
        lead = lead_baseline(m)
        if lead is None:
            return "open: no lead baseline in its record"
        model = [round(m.get(k, 0.0), 2) for k in ROUGES]
        baseline = [round(m.get(f"{lead}_{k}", 0.0), 2) for k in ROUGES]
        below = [_ROUGE_NAMES[k] for k, a, b in zip(ROUGES, model, baseline, strict=True) if a < b]
        numbers = " / ".join(f"{v:.2f}" for v in model) + " against " + " / ".join(f"{v:.2f}" for v in baseline)
        return f"met: {numbers}" if not below else f"missed ({', '.join(below)}): {numbers}"
    return verdict


AIMS = (
    Aim("every CPU recipe run on this kind", _every_recipe),
    Aim("Multi30k: DynamicConv at or above the Transformer (beam 5)", _dynamicconv_over_transformer),
    Aim(f"Multi30k: every autoregressive recipe at {BLEU_AIM} or more (beam 5, AVX-512)", _autoregressive_at_aim),
    Aim(f"Multi30k: DisCo within {TEACHER_GAP:g} BLEU of its teacher", _student_near_teacher("multi30k_disco_cpu")),
    Aim(f"Multi30k: CMLM within {TEACHER_GAP:g} BLEU of its teacher", _student_near_teacher("multi30k_cmlm_cpu")),
    Aim("DialogSum: the Transformer at or above lead-3 on every ROUGE (task's decoding)",
        _summary_over_lead("dialogsum_transformer_cpu")),
)


def aims_text(kinds: dict[str, list[Recipe]], expected: list[str]) -> str:
    """The aims table: one row per aim, one column per machine kind (in the order of their tables)."""
    header = ["aim", *kinds]
    rows = []
    by_name = [{r.name: r for r in members} for members in kinds.values()]
    for aim in AIMS:
        rows.append([aim.text, *(aim.verdict(named, expected) for named in by_name)])
    return (f"### Aims\n\n{markdown(header, rows)}\nEach cell is read from the rows below: BLEU is valid sacreBLEU "
            "with the task's decoding; a student's teacher is the row of its kind whose checkpoint it started from "
            "(`init_encoder_from`, the checkpoint that distilled its training data in the recipe's commands), trained "
            "before it; ROUGE-1 / 2 / L / Lsum is the model's against lead-3's.\n")
