"""``compile_decoding``: the per-step computation of decoding compiled by torch.compile, the rest eager.

Decoding on CPU is bound by per-operator overhead (a beam step of a small model runs dozens of tiny ops), which
inductor's fusion can cut. What is compiled is what the search calls once per step: ``decode`` of an incremental
decoder (embedding, every block's step with its cache updates, final norm, output projection) for beam search,
and ``predict`` (one full, stateless decoder pass) for the NAT decoders. The search's own bookkeeping (top-k,
finished hypotheses, reorders of the caches) stays eager: it is data-dependent and reads scores back to the host.

The model is not wrapped: :class:`CompiledDecoding` stands in for it in ``BeamSearch.generate`` /
``IterativeDecoder.generate`` and forwards everything else to it, so state_dict keys, training and checkpoints
are unchanged. Dynamo traces the caches' in-place updates (the self-attention buffer, the conv rings) and their
Python counters (``DecoderState.step``, ``KeyValueCache.length``, ``RingState.step``) as symbolic ints, so a new
step, batch size or source length reuses the graphs (``dynamic=True``, no duck sizing); the remaining
recompiles are the few cache situations that change the traced code (the first step allocating a cache, a
doubling of the attention buffer, a reorder having left no spare buffer), bounded per model, not per step.

``padding_or_none`` keeps the mask under compilation instead of reading it back (``seqmix.models.padding``), so a
step is one graph (a mask that masks nothing changes no value).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

from seqmix.compile import AUTO_DECODING, check_setting, compile_dynamic, enabled

REMEDY = "decode with compile_decoding=false"
# graphs per compiled code object: a model's step has a handful (see above), and every model decoded in a process
# (the benchmark's, the tests') shares the same code objects, which dynamo's default of 8 would soon fill
RECOMPILE_LIMIT = 64


def check_decoding_setting(setting) -> bool | str:
    """``compile_decoding`` as given (true | false | auto); anything else is a user error."""
    return check_setting(setting, "compile_decoding")


def decoding_enabled(setting: bool | str, device_type: str) -> bool:
    """Whether decoding on ``device_type`` is compiled (``auto``: the measured choice, ``AUTO_DECODING``)."""
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
