"""``make gpu-check`` without a GPU, and the parts of the GPU check that run on CPU: the kernel error table under the
Triton interpreter, the random WMT batches, the section budget and the report."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch

from benchmarks import gpu_check, kernels, wmt_scale


def test_make_gpu_check_without_cuda_says_so_in_one_line_and_claims_nothing(repo_root, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(["make", "-s", "gpu-check", f"GPU_CHECK_OUT={out}"], cwd=repo_root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == gpu_check.NO_CUDA
    assert not out.exists()


@pytest.mark.interpret
def test_kernel_error_table_passes_the_kernels_and_fails_a_wrong_one():
    rows = kernels.correctness(torch.device("cpu"), dtypes=("fp32", "bf16"), tiny=True, log=lambda *a: None)
    assert {r["kernel"] for r in rows} == {"lightconv", "dynamicconv", "talk", "convs2s_step", "fused_xent"}
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    assert all(0 < r["triton_rms"] <= r["rms_limit"] and r["torch_rms"] > 0 for r in rows)
    # a kernel that is off by 1e-4 relative: well inside bf16 rounding, far outside fp32's limit
    case = kernels.cases(tiny=True)[0]
    wrong = kernels.Case(case.kernel, case.name, case.make, lambda *a: case.reference(*a) * (1 + 1e-4), case.reference,
                         case.differentiable)
    fp32 = kernels.check_case(wrong, "fp32", torch.device("cpu"))
    assert fp32["status"].startswith("FAILED") and fp32["triton_rms"] == pytest.approx(1e-4, rel=0.01)
    assert kernels.check_case(wrong, "bf16", torch.device("cpu"))["status"] == "ok"


def test_error_ratios_flag_non_finite_output():
    ref = torch.ones(4, dtype=torch.float64)
    assert kernels.error_ratios(torch.tensor([1.0, float("nan"), 1.0, 1.0]), ref) == (float("inf"), float("inf"))
    rms, worst = kernels.error_ratios(torch.tensor([1.0, 1.0, 1.0, 1.5]), ref)
    assert rms == pytest.approx(0.25) and worst == pytest.approx(0.5)


def test_random_wmt_batches_are_laid_out_as_the_collate_function_does():
    tok = wmt_scale.synthetic_tokenizer(300)
    assert tok.vocab_size == 300
    for batch in wmt_scale.random_batches(tok, 1024, 3, torch.device("cpu"), seed=1):
        src, prev, tgt = batch["src_tokens"], batch["prev_output_tokens"], batch["target"]
        assert src.numel() <= 1024 and tgt.numel() <= 1024 and prev.shape == tgt.shape
        lengths = (tgt != tok.pad).sum(1)
        assert int(lengths.sum()) == batch["ntokens"] and len(lengths) == batch["nsentences"] > 1
        for row, n in enumerate(lengths.tolist()):
            assert tgt[row, n - 1] == tok.eos and (tgt[row, n:] == tok.pad).all()
            assert prev[row, 0] == tok.bos and torch.equal(prev[row, 1:n], tgt[row, :n - 1])
        assert ((src != tok.pad).sum(1) >= 2).all() and (src[src != tok.pad] >= 4).all()


def test_card_spec_and_mfu():
    assert gpu_check.card_spec("NVIDIA H100 80GB HBM3") == (989.4, 3350.0)
    assert gpu_check.card_spec("NVIDIA H100 PCIe")[0] == 756.0
    assert gpu_check.card_spec("NVIDIA H200")[1] == 4800.0
    assert gpu_check.card_spec("Some Card") == (None, None)
    ctx = gpu_check.Context(torch.device("cpu"), None, None, environment={"spec_tflops_bf16": 1000.0,
                                                                          "matmul_tflops_bf16": 800.0})
    rows = gpu_check.add_mfu([{"tflops_per_s": 200.0}, {"tflops_per_s": None}], ctx)
    assert rows[0]["mfu"] == pytest.approx(0.2) and rows[0]["of_matmul"] == pytest.approx(0.25)
    assert rows[1]["mfu"] is None


def test_sections_share_the_budget_and_an_exception_is_one_error_row():
    seen = {}

    def fast(ctx):
        seen["fast"] = ctx.deadline - time.perf_counter()
        return [{"kernel": "x", "status": "ok"}]

    def boom(ctx):
        raise RuntimeError("kernel failed to compile")

    sections = (gpu_check.Section("a", "A", fast, 10, ("kernel", "status")),
                gpu_check.Section("b", "B", boom, 30, ("status",)))
    ctx = gpu_check.Context(torch.device("cpu"), None, None, log=lambda *a: None)
    results = gpu_check.run_sections(ctx, sections, budget=40.0)
    assert 9.0 < seen["fast"] <= 10.0
    assert results["a"]["rows"] == [{"kernel": "x", "status": "ok"}]
    assert results["b"]["rows"][0]["status"] == "ERROR: RuntimeError: kernel failed to compile"
    assert "kernel failed to compile" in results["b"]["rows"][0]["traceback"]
    # nothing left: a later section is reported as skipped, not run
    results = gpu_check.run_sections(ctx, (gpu_check.Section("c", "C", boom, 1, ("status",)),), budget=0.0)
    assert results["c"]["rows"] == [{"status": "skipped: time budget"}]


def test_report_is_markdown_tables_and_json_with_every_failure_listed(tmp_path):
    results = {
        "kernel_errors": {"title": "Kernels", "seconds": 3.2, "rows": [
            {"kernel": "lightconv", "case": "B=2 | T=7", "dtype": "bf16", "triton_rms": 0.0031234, "status": "ok"},
            {"kernel": "talk", "case": "T=9", "dtype": "fp32", "triton_rms": 2e-4, "status": "FAILED: y0 over"}]},
        "training": {"title": "Recipes", "seconds": 1.0, "rows": [{"model": "lightconv_small", "tokens_per_s": None,
                                                                   "status": "skipped: time budget"}]},
        "ddp": {"title": "DDP", "seconds": 0.5, "rows": [{"status": "ERROR: RuntimeError: NCCL"}]}}
    env = {"device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"}
    gpu_check.write_report(tmp_path, results, env, ["--budget", "400"])
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# seqmix GPU check: NVIDIA H100 80GB HBM3")
    assert "**2 failed or errored rows**:" in md
    assert "- kernel_errors: FAILED: y0 over" in md and "- ddp: ERROR: RuntimeError: NCCL" in md
    assert "| kernel | case | dtype | triton_rms | status |" in md  # the section's columns that the rows have
    assert "| lightconv | B=2 / T=7 | bf16 | 0.00312 | ok |" in md  # numbers to 3 digits, pipes kept out of cells
    assert "| lightconv_small | - | skipped: time budget |" in md
    assert json.loads((tmp_path / "report.json").read_text())["sections"] == results
