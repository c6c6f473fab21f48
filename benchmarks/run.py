"""``python -m benchmarks.run [--quick] [--only SECTION ...]`` (``make bench``): benchmarks/results/<timestamp>/ gets
results.json (settings, environment, every row) and a CSV and a PNG per section. Exit status 1, the files written, when
a row failed (a mixer or conv core its check, a recipe to train, a data figure, a serving engine) or a section raised
(listed; the other sections still run). Settings: each section's ``Settings`` (and ``QUICK``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from datetime import datetime
from functools import partial
from pathlib import Path

import torch

from benchmarks import common, conv_cores, data, decoding, mixers, serving, training

SECTIONS = {"mixers": mixers, "conv_cores": conv_cores, "training": training, "decoding": decoding, "nat": decoding, "data": data,
            "serving": serving}


def main(argv: list[str] | None = None, settings: dict | None = None) -> int:
    """``settings``: section name -> its ``Settings`` (default: the defaults, or QUICK's with --quick)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: each section's QUICK settings")
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="SECTION", help=", ".join(SECTIONS))
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's; 1 is steadier on a shared CPU)")
    p.add_argument("--out", type=Path, help="results folder (default: benchmarks/results/<timestamp>)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    out = args.out or common.REPO_ROOT / "benchmarks" / "results" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    started, failed = time.perf_counter(), []
    results: dict = {"argv": sys.argv[1:] if argv is None else argv, "environment": common.environment(device)}
    if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {os.getloadavg()[0]:.1f}: another job is using the CPU; absolute times are "
              "inflated, ratios within this run stay comparable (--threads 1 is steadier)")
    for name in [n for n in SECTIONS if n in (args.only or SECTIONS)]:
        module = SECTIONS[name]
        s = (settings or {}).get(name) or dataclasses.replace(module.Settings(), **(module.QUICK if args.quick else {}))
        section = partial(decoding.section, nat=True) if name == "nat" else module.section
        try:
            results[name], section_failed = section(s, device, out)
        except Exception as err:  # the sections before and after it still run and are written
            why = f"{name}: {type(err).__name__}: {' '.join(str(err).split())}"
            results[name], section_failed = {"error": why}, [why]
        results[name]["settings"], failed = dataclasses.asdict(s), failed + section_failed
    results["seconds"] = time.perf_counter() - started
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {out} ({results['seconds']:.0f}s)", *(f"FAILED {line}" for line in failed), sep="\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
