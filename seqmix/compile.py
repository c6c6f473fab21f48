"""torch.compile for training updates (the top-level ``compile`` key): whether it is on for a device, and how a
task's training forward is compiled.

Only what a task hands to ``SeqmixTask.compiled`` is compiled (the translation tasks: the encoder and decoder
stacks up to the decoder features or logits); the loss stays eager (the fused loss's chunk loop and its pad
selection are data-dependent). The model itself is never wrapped, so its state_dict keys carry no
``_orig_mod.`` prefix, and validation, beam search and generate.py run the eager module. Tasks that never call
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
import torch.fx.experimental._config as fx_config
from torch._dynamo.exc import TorchDynamoException

from seqmix.errors import SeqmixError

# What ``compile: auto`` means per device type. CPU: measured not to pay on the 2-core machine (conf/train.yaml);
# CUDA: not measured here (no GPU), so auto stays off there too until someone measures it.
AUTO = {"cpu": False, "cuda": False}


def check_setting(setting) -> bool | str:
    """The config value as given (true | false | auto); anything else is a user error."""
    if setting is None:
        return False
    if isinstance(setting, bool) or setting == "auto":
        return setting
    raise SeqmixError(f"compile must be true, false or auto, got {setting!r}")


def enabled(setting: bool | str, device_type: str) -> bool:
    """Whether training updates on ``device_type`` are compiled (``auto``: the measured choice, ``AUTO``)."""
    return AUTO.get(device_type, False) if setting == "auto" else bool(setting)


def compile_for_training(fn: Callable) -> Callable:
    """``fn`` compiled by inductor (C++ on CPU, Triton on CUDA) with dynamic sizes and no duck sizing."""
    compiled = torch.compile(fn, dynamic=True)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            with fx_config.patch(use_duck_shape=False):
                return compiled(*args, **kwargs)
        except TorchDynamoException as err:
            first = str(err).strip().splitlines()[0][:300]
            raise SeqmixError(f"torch.compile could not compile this model's training forward ({first}); "
                              "train it with compile=false") from err

    return run
