"""int8 decoding on CPU: every ``nn.Linear`` of a model swapped for PyTorch's dynamically quantized one.

``torch.ao.quantization.quantize_dynamic`` stores each Linear's weight as int8 (per output channel) and quantizes
the activations per call, so no calibration data is needed. The embeddings and the output projection (a matmul
with the tied embedding, ``EncoderDecoder.output_layer``) stay float32: the vocabulary projection keeps full
precision, which protects the beam's ranking. PyTorch runs these kernels on CPU only (fbgemm / x86 / onednn).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from seqmix.errors import SeqmixError

QUANTIZE_CHOICES = ("int8",)


def check_quantize(name: str | None, device: torch.device | str) -> str | None:
    """``quantize=`` as generate.py and the API take it: None (off) or int8, on a CPU device."""
    if name is None:
        return None
    if name not in QUANTIZE_CHOICES:
        raise SeqmixError(f"quantize={name!r} is unknown; choose one of {list(QUANTIZE_CHOICES)} or null")
    if torch.device(device).type != "cpu":
        raise SeqmixError(f"quantize={name} runs on CPU only (PyTorch's dynamic int8 kernels): pass device=cpu, "
                          "or decode in float16 on the GPU")
    return name


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (in eval mode, on CPU) whose Linear layers are dynamically quantized to int8."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise SeqmixError("quantize=int8 runs on CPU only: move the model to the CPU first (device=cpu)")
    model = copy.deepcopy(model).eval().float()
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao on every call
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def quantized_linears(model: nn.Module) -> int:
    """How many Linear layers of ``model`` run in int8 (0: not quantized)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return sum(isinstance(m, DynamicLinear) for m in model.modules())
