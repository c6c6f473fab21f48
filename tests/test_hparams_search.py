"""``hparams_search=optuna``: a real Optuna search of tiny runs; each trial is a multirun job with its record, a
diverging trial fails without ending the search, and the best value and settings Optuna reports are those of the
best finished trial (scored by train.py's return value: here the best validation BLEU, run_test=false)."""

from __future__ import annotations

import json

import yaml

from tests.helpers import TINY, describe, run


def test_an_optuna_search_keeps_going_past_a_diverged_trial_and_reports_the_best(tmp_path):
    trials = 4
    proc = run("train.py", ["hparams_search=optuna", f"hydra.sweeper.n_trials={trials}",
                            "hydra.sweeper.sampler.n_startup_trials=2", "optim.lr=choice(0.003,1e30)",
                            "scheduler=constant", *TINY, "trainer.max_steps=10", "trainer.max_epochs=-1",
                            "run_test=false"], tmp_path, timeout=1200)
    assert proc.returncode == 0, describe(proc)
    sweep = next((tmp_path / "multiruns").iterdir())
    jobs = sorted((p for p in sweep.iterdir() if p.is_dir()), key=lambda p: int(p.name))
    assert [p.name for p in jobs] == [str(i) for i in range(trials)]
    records = [json.loads((p / "run.json").read_text()) for p in jobs]
    overrides = [yaml.safe_load((p / ".hydra" / "overrides.yaml").read_text()) for p in jobs]
    lrs = [next(o for o in ov if o.startswith("optim.lr=")) for ov in overrides]
    assert all(any(o.startswith(f"{k}=") for o in ov) for ov in overrides
               for k in ("model.dropout", "label_smoothing", "scheduler.warmup_updates"))  # the config's space
    assert "optim.lr=1e+30" in lrs and "optim.lr=0.003" in lrs, lrs  # the sampler's seed picks both
    for lr, record in zip(lrs, records):
        assert record["status"] == ("failed" if lr == "optim.lr=1e+30" else "finished"), (lr, record)
    finished = [(r["best_valid"], ov) for r, ov in zip(records, overrides) if r["status"] == "finished"]
    best_value, best_overrides = max(finished, key=lambda f: f[0])
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_value"] == best_value
    chosen = {f"{k}={v}" for k, v in results["best_params"].items()}
    assert chosen <= {o.replace("1e+30", "1e30") for o in best_overrides} | set(best_overrides), (chosen,
                                                                                                 best_overrides)
