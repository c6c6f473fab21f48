"""Which inputs a LightConv / DynamicConv output sees, read from the gradients (not from the module's own padding):
an encoder layer's window is centred, K//2 on each side for odd K and fairseq's (K-1)//2 left, K//2 right for even
K; a decoder layer's is the K-1 steps before and the step itself. And DropConnect's mask: one per head and tap for
LightConv (shared by every sentence and step), one per position for DynamicConv (PITFALLS.md)."""

from __future__ import annotations

import pytest
import torch

from seqmix.mixers import DynamicConv, LightConv

T, C, H = 12, 8, 2


def seen(mixer, t: int) -> list[int]:
    """The input steps output step ``t`` depends on."""
    x = torch.randn(1, T, C, dtype=torch.float64, requires_grad=True)
    mixer(x)[0, t].sum().backward()
    return [s for s in range(T) if x.grad[0, s].abs().sum() > 0]


@pytest.mark.parametrize("cls", [LightConv, DynamicConv])
@pytest.mark.parametrize("kernel_size,causal,left,right", [(5, False, 2, 2), (4, False, 1, 2), (3, False, 1, 1),
                                                           (5, True, 4, 0), (4, True, 3, 0)])
def test_the_window_is_centred_in_the_encoder_and_causal_in_the_decoder(cls, kernel_size, causal, left, right):
    torch.manual_seed(0)
    mixer = cls(C, num_heads=H, kernel_size=kernel_size, causal=causal, kernel_backend="torch").double().eval()
    for t in (0, 5, T - 1):  # both edges and the middle
        assert seen(mixer, t) == list(range(max(0, t - left), min(T, t + right + 1))), t


def test_a_kernel_longer_than_the_sentence_sees_all_of_it_in_the_encoder():
    torch.manual_seed(0)
    mixer = LightConv(C, num_heads=H, kernel_size=31, kernel_backend="torch").double().eval()
    assert seen(mixer, 0) == seen(mixer, T - 1) == list(range(T))


def test_dropconnect_is_shared_by_lightconv_and_drawn_per_position_by_dynamicconv():
    torch.manual_seed(0)
    x = torch.randn(1, 1, C).expand(3, T, C)  # the same input at every step of every sentence: the same raw taps
    light = LightConv(C, num_heads=H, kernel_size=5, weight_dropout=0.5).train()
    assert light.conv.taps(x).shape == (H, 5)  # one mask for the batch: a step cannot draw its own
    dynamic = DynamicConv(C, num_heads=H, kernel_size=5, weight_dropout=0.5).train()
    taps = dynamic.conv.taps(x)  # (B, T, H, K)
    kept = taps != 0
    assert 0.2 < kept.float().mean() < 0.8
    patterns = {tuple(kept[b, t].flatten().tolist()) for b in range(3) for t in range(T)}
    assert len(patterns) > 3 * T // 2  # masks differ from position to position (36 positions, 2^10 patterns each)
    dynamic.eval()
    torch.testing.assert_close(dynamic.conv.taps(x)[0, 0], dynamic.conv.taps(x)[2, T - 1])  # no mask: the same taps
