"""torch.compile in one place: training updates (``compile``) and decoding steps (``compile_decoding``).

Training compiles only what a task hands to ``SeqmixTask.compiled`` (the stacks up to the logits); the loss stays
eager (its chunk loop is data-dependent). Decoding compiles what a search calls once per step (an incremental
``decode``, a NAT ``predict``) through :class:`CompiledDecoding`, which stands in for the model; the search's
bookkeeping stays eager. The model is never wrapped, so state_dict keys carry no ``_orig_mod.`` prefix.

Token-budget batches change (sentences, length) almost every update, so graphs use symbolic sizes
(``dynamic=True``) without duck sizing: two lengths equal in the first batch must not become one symbol.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import torch
import torch._dynamo.config as dynamo_config
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.exc import TorchDynamoException

from seqmix.errors import SeqmixError

# What ``compile: auto`` means per device type: off where it did not pay (CPU) or was never measured (CUDA);
# see benchmarks/README.md, "Measurements behind the defaults".
AUTO = {"cpu": False, "cuda": False}
# What ``compile_decoding: auto`` means per device type, on the same grounds as ``AUTO``.
AUTO_DECODING = {"cpu": False, "cuda": False}


def check_setting(setting, key: str = "compile") -> bool | str:
    """The config value of ``key`` as given (true | false | auto); anything else is a user error."""
    if setting is None:
        return False
    if isinstance(setting, bool) or setting == "auto":
        return setting
    raise SeqmixError(f"{key} must be true, false or auto, got {setting!r}")


def enabled(setting: bool | str, device_type: str, auto: dict[str, bool] = AUTO) -> bool:
    """Whether ``setting`` is on for ``device_type`` (``auto``: the per-device default, ``AUTO`` for training
    updates, ``AUTO_DECODING`` for decoding)."""
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


REMEDY = "decode with compile_decoding=false"
# graphs per compiled code object: a model's step has a handful (see above), and every model decoded in a process
# (the benchmark's, the tests') shares the same code objects, which dynamo's default of 8 would soon fill
RECOMPILE_LIMIT = 64


def check_decoding_setting(setting) -> bool | str:
    """``compile_decoding`` as given (true | false | auto); anything else is a user error."""
    return check_setting(setting, "compile_decoding")


def decoding_enabled(setting: bool | str, device_type: str) -> bool:
    """Whether decoding on ``device_type`` is compiled (``auto``: the per-device default, ``AUTO_DECODING``)."""
    return enabled(check_decoding_setting(setting), device_type, AUTO_DECODING)


class CompiledDecoding:
    """``model`` as a decoding algorithm sees it, with ``decode`` (incremental step or full pass) and ``predict``
    (NAT pass) compiled; every other attribute is the model's own."""

    def __init__(self, model, backend: str | Callable = "inductor") -> None:
        self._model = weakref.ref(model)  # for_decoding keeps one stand-in per live model, which must not keep it
        self._compiled: dict[str, Callable] = {}
        self.backend = backend

    @property
    def model(self):
        return self._model()

    def __getattr__(self, name: str):
        return getattr(self.__dict__["_model"](), name)

    def _fn(self, name: str) -> Callable:
        if name not in self._compiled:
            fn = getattr(self, name) if name.startswith("_") else getattr(self.model, name)
            self._compiled[name] = compile_dynamic(fn, f"decoding {name.strip('_')}", REMEDY,
                                                   backend=self.backend, recompile_limit=RECOMPILE_LIMIT)
        return self._compiled[name]

    def decode(self, prev_output_tokens: Tensor, encoder_out, state=None) -> Tensor:
        return self._fn("_decode")(prev_output_tokens, encoder_out, state)

    def _decode(self, prev_output_tokens: Tensor, encoder_out, state=None) -> Tensor:
        """The model's ``decode``; for models with ``decode_features`` and ``output_weight``, the projection done
        by F.linear on the current weight (inductor picks its layout), not by the eager path's transposed-weight
        cache, whose staleness check compares data pointers, which dynamo cannot trace."""
        model = self.model
        if hasattr(model, "decode_features") and hasattr(model, "output_weight"):
            return F.linear(model.decode_features(prev_output_tokens, encoder_out, state), model.output_weight())
        return model.decode(prev_output_tokens, encoder_out, state)

    def predict(self, tokens: Tensor, encoder_out, observed: Tensor, **extra) -> Tensor:
        return self._fn("predict")(tokens, encoder_out, observed, **extra)


_STAND_INS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_decoding(model, setting: bool | str, device_type: str | None = None):
    """``model`` itself, or a :class:`CompiledDecoding` of it when ``setting`` is on for its device: the same one
    for every translator of the model, so that its graphs are compiled once (dynamo guards on the stand-in)."""
    if device_type is None:
        device_type = next(model.parameters()).device.type
    if not decoding_enabled(setting, device_type):
        return model
    if model not in _STAND_INS:
        _STAND_INS[model] = CompiledDecoding(model)
    return _STAND_INS[model]
