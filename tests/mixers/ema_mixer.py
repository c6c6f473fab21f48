"""A mixer that lives only in the test tree and is registered by config alone (``conf/mixer/ema.yaml`` here):
an exponential moving average per channel, y_t = (1 - a) x_t + a y_{t-1} with a learned decay a = sigmoid(w).
Causal: the average of the past. Non-causal: the mean of the forward and the backward average.
It proves that a new mixer needs its module, its config file and one reference row in the tests, nothing else."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seqmix.mixers.base import (
    MixerState,
    TokenMixer,
    check_incremental_call,
    index_select_batch,
    zero_padding,
)


@dataclass
class EMAState(MixerState):
    last: Tensor | None = None  # (B, C): the average after the last decoded step

    def reorder(self, index: Tensor) -> None:
        self.last = index_select_batch(self.last, index)


def decay_matrix(decay: Tensor, length: int) -> Tensor:
    """W[c, t, s] = (1 - a_c) a_c^(t - s) for s <= t, else 0: the whole causal average as one product."""
    t = torch.arange(length, device=decay.device)
    gap = (t[:, None] - t[None, :]).to(decay.dtype)
    powers = decay[:, None, None] ** gap.clamp(min=0)
    return ((1 - decay)[:, None, None] * powers).masked_fill(gap < 0, 0.0)


class EMAMixer(TokenMixer):
    state_class = EMAState

    def __init__(self, embed_dim: int, causal: bool = False, layer_idx: int = 0, init_decay: float = 0.5) -> None:
        super().__init__(embed_dim, causal, layer_idx)
        self.decay_logit = nn.Parameter(torch.full((embed_dim,), float(torch.logit(torch.tensor(init_decay)))))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, state: EMAState | None = None) -> Tensor:
        check_incremental_call(self, x, state)
        decay = torch.sigmoid(self.decay_logit).to(x.dtype)
        x = zero_padding(x, key_padding_mask)
        w = decay_matrix(decay, x.size(1))
        forward_avg = torch.einsum("cts,bsc->btc", w, x)
        if state is not None:
            if state.last is not None:  # carry the previous average into this chunk
                steps = torch.arange(1, x.size(1) + 1, device=x.device, dtype=x.dtype)
                forward_avg = forward_avg + decay ** steps[:, None] * state.last[:, None, :]
            state.last = forward_avg[:, -1]
        if self.causal:
            return self.out_proj(forward_avg)
        backward_avg = torch.einsum("cts,bsc->btc", w, x.flip(1)).flip(1)
        return self.out_proj((forward_avg + backward_avg) / 2)
