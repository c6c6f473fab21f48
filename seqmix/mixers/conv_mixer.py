"""What LightConv, DynamicConv and TaLK share around their core operation (Wu et al. 2019, Fig. 2b/c):

    input dropout → Linear(d, 2d) + GLU (or Linear(d, d)) → zero the pads → core op → Linear(d, d)

plus the decoder's caches (the window of the last K−1 inputs, or a ring of them). Subclasses implement ``core``.
Parameter names follow fairseq (``linear1``, ``linear2``, ``conv``) so its weights map 1:1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.layers.conv_window import encoder_padding, kernel_size_for_layer
from seqmix.layers.dropout import dropout
from seqmix.mixers.base import (
    MixerState,
    TokenMixer,
    WindowState,
    check_incremental_call,
    index_select_batch,
    zero_padding,
)


def xavier_linear(d_in: int, d_out: int, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=bias)
    nn.init.xavier_uniform_(layer.weight)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


class ProjectedConvMixer(TokenMixer):
    """The shared block; ``kernel_size`` is the layer's window parameter (a conv's K, TaLK's max offset)."""

    state_class = WindowState
    language_model_pre_norm = True  # the LightConv/DynamicConv/TaLK LMs diverge with post-norm blocks

    def __init__(self, embed_dim: int, kernel_size: int | Sequence[int], causal: bool = False, layer_idx: int = 0,
                 glu: bool = True, input_dropout: float = 0.0, conv_dim: int | None = None) -> None:
        super().__init__(embed_dim, causal, layer_idx)
        self.kernel_size = kernel_size_for_layer(kernel_size, layer_idx)
        if self.kernel_size < 1:
            raise SeqmixError("kernel_size must be >= 1")
        self.conv_dim = conv_dim or embed_dim
        self.glu = glu
        self.input_dropout = input_dropout
        self.linear1 = xavier_linear(embed_dim, 2 * self.conv_dim if glu else self.conv_dim)
        self.linear2 = xavier_linear(self.conv_dim, embed_dim)

    #: past inputs of the core op a decoder step needs (the default window-cache step)
    history: int = 0

    def core(self, x: Tensor) -> Tensor:  # pragma: no cover - interface
        """The op on the whole (B, T, conv_dim) sequence."""
        raise NotImplementedError

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, state: WindowState | None = None) -> Tensor:
        check_incremental_call(self, x, state)
        x = self.core_input(dropout(x, p=self.input_dropout, training=self.training), key_padding_mask)
        y = self.core(x) if state is None else self.step(x, state)
        return self.linear2(y)

    def core_input(self, x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """Input projection (and GLU), pads zeroed: what the core op mixes."""
        x = self.linear1(x)
        if self.glu:
            x = F.glu(x, dim=-1)
        return zero_padding(x, key_padding_mask)

    def mixing_weights(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor | None:
        return self.core_weights(self.core_input(x, key_padding_mask))

    def core_weights(self, x: Tensor) -> Tensor | None:
        """The core op on ``x`` (B, T, conv_dim) as (B, H, T, T) weights, when it is a weighted sum over steps."""
        return None

    def step(self, x: Tensor, state: WindowState) -> Tensor:
        """New step(s) of a causal layer: run the op over [cache, x] and keep the outputs of x.

        The cache starts as zeros, which is what the causal op sees before the sequence starts.
        """
        n, history = x.size(1), self.history
        if state.window is None:
            state.window = x.new_zeros(x.size(0), history, x.size(2))
        window = torch.cat([state.window, x], dim=1)
        y = self.core(window)[:, -n:]
        state.window = window[:, window.size(1) - history:] if history else window[:, :0]
        return y


@dataclass
class RingState(MixerState):
    """A head conv's last K inputs as a ring (B, H, K, C / H) in the taps' dtype: input i sits in slot i % K
    (zeros before the sequence starts), so a step writes one slot instead of shifting the window."""

    ring: Tensor | None = None
    step: int = 0

    def write(self, slot: int, value: Tensor) -> None:
        """Put ``value`` (B, H, C / H) in ``slot``: in place while autograd is off (decoding, compiled or not);
        with autograd on, into a new ring, as an in-place write would change a tensor that backward needs."""
        if not torch.is_grad_enabled():
            self.ring[:, :, slot] = value
            return
        value = value.to(self.ring.dtype).unsqueeze(2)
        self.ring = torch.cat([self.ring[:, :, :slot], value, self.ring[:, :, slot + 1:]], dim=2)

    def push(self, value: Tensor) -> None:
        """Write the next input ``value`` (B, H, C / H) in slot ``step % K`` and count it. Compiled, the slot is a
        tensor: indexing by the int would specialize the graph on ``step % K``, one graph per step of a cycle."""
        k = self.ring.size(2)
        if torch.compiler.is_compiling():
            hit = (torch.arange(k, device=self.ring.device) == self.step % k).view(k, 1)
            self.ring = torch.where(hit, value.to(self.ring.dtype).unsqueeze(2), self.ring)
        else:
            self.write(self.step % k, value)
        self.step += 1

    def in_ring_order(self, taps: Tensor) -> Tensor:
        """``taps`` (..., K), oldest input's first, laid on the slots of the inputs they weigh (after ``push``): the
        oldest input in the window, ``step - K``, lives in slot ``step % K``."""
        k = taps.size(-1)
        if torch.compiler.is_compiling():
            return taps.index_select(-1, (torch.arange(k, device=taps.device) - self.step) % k)
        return taps.roll(self.step % k, dims=-1)

    def reorder(self, index: Tensor) -> None:
        self.ring = index_select_batch(self.ring, index)


class HeadConvMixer(ProjectedConvMixer):
    """The block's mixer around a :class:`~seqmix.layers.head_conv.HeadConvolution` (``conv_cls``)."""

    conv_cls: type

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: int | Sequence[int], causal: bool = False,
                 layer_idx: int = 0, glu: bool = True, weight_softmax: bool = True, weight_dropout: float = 0.0,
                 input_dropout: float = 0.0, bias: bool = False, conv_dim: int | None = None,
                 kernel_backend: str = "auto") -> None:
        super().__init__(embed_dim, kernel_size, causal, layer_idx, glu, input_dropout, conv_dim)
        self.padding_l = self.kernel_size - 1 if causal else encoder_padding(self.kernel_size)
        self.history = self.kernel_size - 1
        self.conv = self.conv_cls(self.conv_dim, self.kernel_size, num_heads, weight_softmax, weight_dropout,
                                  bias, kernel_backend)

    state_class = RingState

    def core(self, x: Tensor) -> Tensor:
        return self.conv(x, self.padding_l)

    def core_weights(self, x: Tensor) -> Tensor:
        """The taps laid on their band: weight[b, h, t, t + k − padding_l] = tap k of step t."""
        bsz, length, _ = x.shape
        taps = self.conv.taps(x)
        taps = taps.expand(bsz, length, -1, -1) if taps.dim() == 2 else taps  # (B, T, H, K)
        band = taps.new_zeros(bsz, self.conv.num_heads, length, length)
        steps = torch.arange(length, device=x.device)
        for k in range(self.kernel_size):
            source = steps + k - self.padding_l
            inside = (source >= 0) & (source < length)
            band[:, :, steps[inside], source[inside]] = taps[:, inside, :, k].transpose(1, 2)
        return band

    def step(self, x: Tensor, state: RingState) -> Tensor:
        """New step(s), one matrix-vector product per head each: the taps of the new input only (a DynamicConv
        predicts them from that input alone), rotated to the ring's order, against the ring."""
        bsz, n, channels = x.shape
        conv, k = self.conv, self.kernel_size
        taps = conv.taps(x)  # (H, K) or (B, n, H, K)
        if state.ring is None:
            state.ring = taps.new_zeros(bsz, conv.num_heads, k, channels // conv.num_heads)
        outs = []
        for j in range(n):
            state.push(x[:, j].view(bsz, conv.num_heads, -1))
            w = state.in_ring_order(taps if taps.dim() == 2 else taps[:, j]).unsqueeze(-2)  # (H, 1, K) / (B, H, 1, K)
            outs.append(torch.matmul(w, state.ring).view(bsz, 1, channels))
        y = (outs[0] if n == 1 else torch.cat(outs, dim=1)).to(x.dtype)
        bias = conv.output_bias()
        return y if bias is None else y + bias
