"""benchmarks/conv_cores.py: the fairseq-algorithm baselines compute the same convolution as seqmix (else no timings),
every row gets a ratio over the faster baseline, and the section writes its CSV and plot."""

from __future__ import annotations

import pytest
import torch

from benchmarks import conv_cores
from seqmix.layers.banded import banded_conv


@pytest.mark.parametrize("impl", [conv_cores.fairseq_unfold, conv_cores.fairseq_expanded])
@pytest.mark.parametrize("per_position", [False, True])
def test_baselines_compute_the_seqmix_convolution(impl, per_position):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 11, 8, generator=g, dtype=torch.float64)  # (B, T, C)
    w = torch.softmax(torch.randn(*((11, 3) if per_position else ()), 2, 5, generator=g, dtype=torch.float64), -1)
    for padding_l in (0, 2, 4):
        want = banded_conv(x, w.transpose(0, 1) if per_position else w, padding_l)
        got = impl(x.transpose(0, 1), w, padding_l, 2).transpose(0, 1)
        torch.testing.assert_close(got, want)


def test_section_rows_ratios_and_files(tmp_path):
    s = conv_cores.Settings(lengths=(16,), token_budget=64, embed_dim=16, heads=2, kernel_size=5, repeats=1)
    res, failed = conv_cores.section(s, torch.device("cpu"), tmp_path, log=lambda *a: None)
    rows = res["rows"]
    assert not failed and [(r["core"], r["impl"]) for r in rows] == [
        (c, i) for c in ("lightconv", "dynamicconv") for i in conv_cores.IMPLS]
    for r in rows:
        assert r["status"] == "ok" and r["fwd_bwd_ms"] > 0 and r["speed_ratio"] > 0
    assert (tmp_path / "conv_cores.csv").exists() and (tmp_path / "conv_cores.png").exists()


def test_a_wrong_result_gets_no_timing(tmp_path, monkeypatch):
    monkeypatch.setattr(conv_cores, "fairseq_expanded", lambda x, w, p, h: conv_cores.fairseq_unfold(x, w, p, h) * 1.01)
    s = conv_cores.Settings(lengths=(16,), token_budget=64, embed_dim=16, heads=2, kernel_size=5, repeats=1)
    res, failed = conv_cores.section(s, torch.device("cpu"), tmp_path, log=lambda *a: None)
    bad = [r for r in res["rows"] if r["impl"] == "fairseq_expanded"]
    assert all(r["status"].startswith("failed") and r["fwd_bwd_ms"] is None for r in bad) and len(failed) == 2
