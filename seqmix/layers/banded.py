"""Fast PyTorch path for per-head 1-D convolutions (LightConv, DynamicConv) on any device, in (B, T, C) layout:

    y[b, t, c] = Σ_k w[b, t, h(c), k] · x[b, t + k − padding_l, c],   h(c) = c // (C / H)

Taps shared over batch and time (LightConv, ``w`` of shape (H, K)) run as a depthwise ``conv2d`` on a channels-last
view of ``x`` (oneDNN on CPU, cuDNN on CUDA: no copy of ``x``, no K-times unfolded input); its input gradient is the
same convolution with the taps reversed. Where a GEMM is needed (per-position taps, and every tap gradient) the
sequence is cut into chunks of L steps and each chunk meets its input window (L+K−1 steps, halo included) in one
small matrix product, batched over all chunks of one head at once through strided views of a zero-padded copy of
``x``: cost and memory stay linear in T (unlike fairseq's T×T band) and no autograd ``unfold``/``permute`` copies
are made (such copies, not the arithmetic, dominate an autograd version's time).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK = 32  # L: near the kernel width keeps the band's wasted zeros (≈ L/(L+K)) and the GEMM size balanced


def depthwise_conv(x: Tensor, taps: Tensor, padding_l: int) -> Tensor:
    """(B, T, C) × (C, K) taps → (B, T, C) through conv2d on the channels-last (B, C, 1, T) view of ``x``.

    conv2d pads symmetrically, so an asymmetric padding computes the wider output and keeps its T-step slice.
    """
    bsz, length, channels = x.shape
    k = taps.shape[-1]
    pad = max(padding_l, k - 1 - padding_l)
    y = F.conv2d(x.transpose(1, 2).unsqueeze(2), taps.reshape(channels, 1, 1, k), padding=(0, pad), groups=channels)
    start = pad - padding_l
    return y.squeeze(2).transpose(1, 2)[:, start:start + length]


class _Chunks:
    """The chunk grid of one call: ``x`` zero-padded to Tp = (n + halo chunks)·L steps per sequence, so that chunk
    (b, j) of a (B, Tp, C) tensor is chunk number b·Tp/L + j of the flat buffer, and its window starts at the chunk."""

    def __init__(self, x: Tensor, heads: int, k: int) -> None:
        chunk = CHUNK
        self.bsz, self.length, self.channels = x.shape
        self.heads, self.k, self.chunk = heads, k, chunk
        self.group = self.channels // heads
        self.width = chunk + k - 1
        self.padded_len = (-(-self.length // chunk) + -(-(k - 1) // chunk)) * chunk
        self.count = self.bsz * self.padded_len // chunk
        self.rows = self.bsz * self.padded_len * self.channels  # elements of the (B, Tp, C) part of a flat buffer

    def pad(self, x: Tensor, front: int) -> Tensor:
        """Flat buffer: (B, Tp, C) holding ``x`` from step ``front``, zeros elsewhere, plus K−1 zero rows at the end
        (the last windows' halo)."""
        flat = x.new_empty(self.rows + (self.k - 1) * self.channels)
        padded = flat[:self.rows].view(self.bsz, self.padded_len, self.channels)
        padded[:, :front].zero_()
        padded[:, front + self.length:].zero_()
        flat[self.rows:].zero_()
        padded[:, front:front + self.length].copy_(x)
        return flat

    def steps_from_chunks(self, flat: Tensor, head: int, steps: int) -> Tensor:
        """(N, steps, G) view: ``steps`` steps of one head's channels from the start of each chunk n."""
        c, g = self.channels, self.group
        return flat.as_strided((self.count, steps, g), (self.chunk * c, c, 1), flat.storage_offset() + head * g)

    def chunks(self, flat: Tensor, head: int) -> Tensor:
        """(N, L, G): chunk n's L steps."""
        return self.steps_from_chunks(flat, head, self.chunk)

    def windows(self, flat: Tensor, head: int) -> Tensor:
        """(N, L+K−1, G): chunk n's window (overlapping the next chunk by K−1 steps)."""
        return self.steps_from_chunks(flat, head, self.width)

    def unpad(self, flat: Tensor, front: int) -> Tensor:
        return flat[:self.rows].view(self.bsz, self.padded_len, self.channels)[:, front:front + self.length]

    def tap_products(self, gy_flat: Tensor, x_flat: Tensor, head: int, out: Tensor | None = None) -> Tensor:
        """(N, L, K): Σ_g gy[n, l, g] · x_window[n, l + k, g], the per-position tap gradient of one head."""
        prod = torch.bmm(self.chunks(gy_flat, head), self.windows(x_flat, head).transpose(1, 2), out=out)
        return prod.as_strided((self.count, self.chunk, self.k), (self.chunk * self.width, self.width + 1, 1),
                               prod.storage_offset())


def band_matrices(w: Tensor, width: int) -> Tensor:
    """(..., L, K) taps → (..., L, width) band with ``band[..., i, i+k] = w[..., i, k]`` (width ≥ L+K−1).

    Writing the taps through a view whose row stride is one longer than the row shifts each row one step right.
    """
    *lead, length, k = w.shape
    band = w.new_zeros(*lead, length, width)
    flat = band.view(*lead, length * width)
    flat.as_strided((*flat.shape[:-1], length, k), (*flat.stride()[:-1], width + 1, 1)).copy_(w)
    return band


class SharedTapsConv(torch.autograd.Function):
    """(H, K) taps shared over batch and time. Backward: input gradient = the convolution with reversed taps,
    tap gradient = the per-position products of :meth:`_Chunks.tap_products` summed over all positions."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, padding_l: int) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.padding_l = padding_l
        return depthwise_conv(x, w.repeat_interleave(x.shape[-1] // w.shape[0], 0), padding_l)

    @staticmethod
    def backward(ctx, gy: Tensor):
        with torch.autocast(gy.device.type, enabled=False):  # a backward called under autocast stays fp32 too
            return SharedTapsConv.gradients(ctx, gy)

    @staticmethod
    def gradients(ctx, gy: Tensor):
        x, w = ctx.saved_tensors
        heads, k = w.shape
        gy = gy.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[1]:  # first, so that its padded copies are freed before gx is allocated
            grid = _Chunks(x, heads, k)
            x_flat, gy_flat = grid.pad(x, ctx.padding_l), grid.pad(gy, 0)
            prod = x.new_empty(grid.count, grid.chunk, grid.width)
            gw = torch.stack([grid.tap_products(gy_flat, x_flat, h, out=prod).sum((0, 1)) for h in range(heads)])
            del x_flat, gy_flat, prod
        if ctx.needs_input_grad[0]:
            gx = depthwise_conv(gy, w.flip(-1).repeat_interleave(x.shape[-1] // heads, 0), k - 1 - ctx.padding_l)
        return gx, gw, None


class PositionTapsConv(torch.autograd.Function):
    """(B, T, H, K) taps, one set per position: per head, one batched GEMM of every chunk's band with its window.
    Backward: the band's transpose against the output gradient, overlap-added into the padded input gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, padding_l: int) -> Tensor:
        grid = _Chunks(x, w.shape[-2], w.shape[-1])
        x_flat = grid.pad(x, padding_l)
        bands = _bands(grid, w)  # (H, N, L, L+K-1)
        y = x.new_empty(grid.bsz * grid.padded_len * grid.channels)
        for h in range(grid.heads):
            grid.chunks(y, h).copy_(torch.bmm(bands[h], grid.windows(x_flat, h)))
        ctx.save_for_backward(x_flat, bands)
        ctx.grid, ctx.padding_l = grid, padding_l
        return grid.unpad(y, 0)

    @staticmethod
    def backward(ctx, gy: Tensor):
        with torch.autocast(gy.device.type, enabled=False):
            return PositionTapsConv.gradients(ctx, gy)

    @staticmethod
    def gradients(ctx, gy: Tensor):
        x_flat, bands = ctx.saved_tensors
        grid, front = ctx.grid, ctx.padding_l
        gy_flat = grid.pad(gy, 0)
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx_flat = torch.empty_like(x_flat)
            for h in range(grid.heads):
                windows_grad = torch.bmm(bands[h].transpose(1, 2), grid.chunks(gy_flat, h))
                grid.chunks(gx_flat, h).copy_(_fold_windows(grid, windows_grad))
            gx = grid.unpad(gx_flat, front)
        if ctx.needs_input_grad[1]:
            taps = torch.stack([grid.tap_products(gy_flat, x_flat, h) for h in range(grid.heads)], dim=2)
            gw = taps.reshape(grid.bsz, grid.padded_len, grid.heads, grid.k)[:, :grid.length]
        return gx, gw, None


def _bands(grid: _Chunks, w: Tensor) -> Tensor:
    """(B, T, H, K) taps → (H, N, L, L+K−1) bands in chunk order (positions past T get zero taps)."""
    w = F.pad(w, (0, 0, 0, 0, 0, grid.padded_len - grid.length))  # (B, Tp, H, K)
    w = w.reshape(grid.count, grid.chunk, grid.heads, grid.k).permute(2, 0, 1, 3)
    return band_matrices(w, grid.width)


def _fold_windows(grid: _Chunks, windows_grad: Tensor) -> Tensor:
    """(N, L+K−1, G) window gradients → (N, L, G) chunk gradients: windows of consecutive chunks overlap by K−1
    steps, so each window's rows past L are added into the chunks that follow (one slice per chunk they reach)."""
    folded = windows_grad[:, :grid.chunk].clone()
    for start in range(grid.chunk, grid.width, grid.chunk):
        stop, shift = min(start + grid.chunk, grid.width), start // grid.chunk
        folded[shift:, : stop - start] += windows_grad[:-shift, start:stop]
    return folded


def banded_conv(x: Tensor, weight: Tensor, padding_l: int) -> Tensor:
    """x: (B, T, C); weight: (H, K) shared over batch and time, or (B, T, H, K) per position.

    Computes in fp32 (or float64) whatever the input dtype and autocast say, and returns x's dtype.
    """
    out_dtype = x.dtype
    compute = torch.promote_types(torch.promote_types(x.dtype, weight.dtype), torch.float32)
    x, weight = x.to(compute).contiguous(), weight.to(compute)
    channels, (heads, k) = x.shape[-1], weight.shape[-2:]
    if channels % heads:
        raise ValueError(f"channels {channels} not divisible by heads {heads}")
    if not 0 <= padding_l < k:
        raise ValueError(f"padding_l={padding_l} must be in [0, {k - 1}] for kernel size {k}")
    op = SharedTapsConv if weight.dim() == 2 else PositionTapsConv
    with torch.autocast(x.device.type, enabled=False):  # else conv2d/bmm would run in bf16 under bf16-mixed
        return op.apply(x, weight.contiguous(), padding_l).to(out_dtype)
