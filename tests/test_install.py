"""``make install`` picks torch's build from what ``nvidia-smi -L`` lists (checked with ``make -n``: what it would run)."""

from __future__ import annotations

import os
import subprocess

import pytest

GPU_LISTING = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5f1c)"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def planned_torch_install(repo_root, tmp_path, nvidia_smi: tuple[str, int] | None, *args: str) -> str:
    """The torch line(s) ``make -n install`` prints with a fake ``nvidia-smi`` (output, exit status) on PATH, or none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho '{nvidia_smi[0]}'\nexit {nvidia_smi[1]}\n")
        fake.chmod(0o755)
    path = os.pathsep.join([str(bin_dir)] + [p for p in os.environ["PATH"].split(os.pathsep)
                                             if not os.path.exists(os.path.join(p, "nvidia-smi"))])
    proc = subprocess.run(["make", "-n", "install", *args], cwd=repo_root, capture_output=True, text=True,
                          env=os.environ | {"PATH": path}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return "\n".join(line for line in proc.stdout.splitlines() if '"torch==' in line)


@pytest.mark.parametrize("nvidia_smi", [None, (NO_DRIVER, 9), ("No devices were found", 6)])
def test_without_a_gpu_the_cpu_build(repo_root, tmp_path, nvidia_smi):
    line = planned_torch_install(repo_root, tmp_path, nvidia_smi)
    assert '"torch==2.13.0+cpu"' in line and "whl/cpu" in line and "cu1" not in line


def test_a_gpu_listed_by_nvidia_smi_selects_the_cuda_index(repo_root, tmp_path):
    line = planned_torch_install(repo_root, tmp_path, (GPU_LISTING, 0))
    assert '"torch==2.13.0" --index-url https://download.pytorch.org/whl/cu130' in line and "+cpu" not in line


def test_either_build_can_be_forced(repo_root, tmp_path):
    assert "+cpu" in planned_torch_install(repo_root, tmp_path, (GPU_LISTING, 0), "TORCH_BUILD=cpu")
    (tmp_path / "bin").rename(tmp_path / "first")
    assert "whl/cu130" in planned_torch_install(repo_root, tmp_path, None, "TORCH_BUILD=cuda")


def test_a_wrong_build_name_stops_make_install(repo_root):
    proc = subprocess.run(["make", "-n", "install", "TORCH_BUILD=gpu"], cwd=repo_root, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "TORCH_BUILD must be cpu or cuda, got 'gpu'" in proc.stderr
