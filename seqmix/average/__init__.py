"""``python -m seqmix.average <run folder | checkpoints folder | checkpoint files> --last N [--updates] --out avg.ckpt``:
the mean of a run's latest N epoch checkpoints (``--updates``: its latest N interval checkpoints, update<N>.ckpt,
written with save_interval_updates), or of the files given, written once as a checkpoint that generate.py, the fairseq
exporter and ``init_from`` read, as the papers averaged their last checkpoints before scoring."""

from __future__ import annotations

from pathlib import Path

from seqmix.config.user_errors import CommandParser, command_status
from seqmix.errors import SeqmixError
from seqmix.training.checkpoints import latest_checkpoints, write_averaged


def checkpoints_to_average(inputs: list[str], last: int | None, updates: bool = False) -> list[Path]:
    """A folder (a run's, or its checkpoints/) with ``last``: its latest epoch checkpoints (``updates``: interval
    checkpoints); else the files given."""
    paths = [Path(p) for p in inputs]
    if len(paths) == 1 and paths[0].is_dir():
        if not last:
            raise SeqmixError(f"{paths[0]} is a folder: say how many of its latest "
                              f"{'interval' if updates else 'epoch'} checkpoints to average with --last N")
        folder = paths[0] / "checkpoints" if (paths[0] / "checkpoints").is_dir() else paths[0]
        return latest_checkpoints(folder, last, asked="--updates --last {n}" if updates else "--last {n}",
                                  updates=updates)
    if last or updates:
        option = "--last N" if last else "--updates"
        raise SeqmixError(f"{option} picks from one folder; with checkpoint files, list the ones to average instead")
    if len(paths) < 2:
        raise SeqmixError("give at least two checkpoint files, or a run folder and --last N")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m seqmix.average", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="a run folder (or its checkpoints/) with --last, or checkpoint files")
    parser.add_argument("--last", type=int, help="average the N latest epoch checkpoints of the folder")
    parser.add_argument("--updates", action="store_true", help="with --last: the N latest interval checkpoints "
                        "(update<N>.ckpt, saved every save_interval_updates updates) instead of epoch checkpoints")
    parser.add_argument("--out", required=True, help="the averaged checkpoint to write (a new file)")
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        parser.error(f"--last {args.last}: give a number of checkpoints >= 1")

    def run() -> None:
        paths = checkpoints_to_average(args.inputs, args.last, args.updates)
        write_averaged(paths, args.out)
        print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) -> {args.out}; decode with "
              f"python generate.py ckpt_path={args.out}")

    return command_status(run)
