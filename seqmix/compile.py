"""torch.compile for training updates (the top-level ``compile`` key): whether it is on for a device, and how a
task's training forward is compiled.

Only what a task hands to ``SeqmixTask.compiled`` is compiled (the translation tasks: the encoder and decoder
stacks up to the decoder features or logits); the loss stays eager (the fused loss's chunk loop and its pad
selection are data-dependent). The model itself is never wrapped, so its state_dict keys carry no
``_orig_mod.`` prefix, and validation, beam search and generate.py run the eager module (``compile_decoding``
compiles decoding's per-step work instead, ``seqmix.generation.compiled``). Tasks that never call
``compiled`` (language modeling, non-autoregressive translation) train eagerly whatever ``compile`` says.

Shapes: token-budget batches have a new (sentences, length) almost every update (Multi30k: 28 source lengths, 31
batch sizes in 119 batches), so the graphs are traced with symbolic sizes from the first batch (``dynamic=True``)
and without duck sizing, which would otherwise tie a source and a target length that happen to be equal in the
first batch to one symbol and recompile when they differ. Padding lengths to buckets was not taken: the batch
size varies anyway, every bucket is one more multi-minute CPU compile, and the pads are extra work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch._dynamo.config as dynamo_config
import torch.fx.experimental._config as fx_config
from torch._dynamo.exc import TorchDynamoException

from seqmix.errors import SeqmixError

# What ``compile: auto`` means per device type. CPU: measured not to pay on the 2-core machine (conf/train.yaml);
# CUDA: not measured here (no GPU), so auto stays off there too until someone measures it.
AUTO = {"cpu": False, "cuda": False}
# What ``compile_decoding: auto`` means per device type (seqmix.generation.compiled). CPU: measured not to pay on the
# 2-core machine (benchmarks/README.md, decoding section); CUDA: not measured here, off until someone does.
AUTO_DECODING = {"cpu": False, "cuda": False}


def check_setting(setting, key: str = "compile") -> bool | str:
    """The config value of ``key`` as given (true | false | auto); anything else is a user error."""
    if setting is None:
        return False
    if isinstance(setting, bool) or setting == "auto":
        return setting
    raise SeqmixError(f"{key} must be true, false or auto, got {setting!r}")


def enabled(setting: bool | str, device_type: str, auto: dict[str, bool] = AUTO) -> bool:
    """Whether ``setting`` is on for ``device_type`` (``auto``: the measured choice, ``AUTO`` for training updates,
    ``AUTO_DECODING`` for decoding)."""
    return auto.get(device_type, False) if setting == "auto" else bool(setting)


def compile_for_training(fn: Callable) -> Callable:
    """``fn`` compiled by inductor (C++ on CPU, Triton on CUDA) with dynamic sizes and no duck sizing."""
    return compile_dynamic(fn, "training forward", "train it with compile=false")


def compile_dynamic(fn: Callable, what: str, remedy: str, backend: str | Callable = "inductor",
                    recompile_limit: int | None = None) -> Callable:
    """``fn`` compiled with dynamic sizes and no duck sizing; a compile error is one SeqmixError naming ``what``
    failed and the ``remedy``. ``recompile_limit``: dynamo's graphs per code object while ``fn`` runs (its default,
    8, counts the graphs of every caller of that code: past it, dynamo silently runs the code eagerly)."""
    compiled = torch.compile(fn, dynamic=True, backend=backend)
    limit = {} if recompile_limit is None else {"recompile_limit": recompile_limit}

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            with fx_config.patch(use_duck_shape=False), dynamo_config.patch(**limit):
                return compiled(*args, **kwargs)
        except TorchDynamoException as err:
            first = str(err).strip().splitlines()[0][:300]
            raise SeqmixError(f"torch.compile could not compile this model's {what} ({first}); {remedy}") from err

    return run
