"""One parametrized test over every mixer: causality, padding invariance, step == full, reorder,
and agreement with a float64 reference written from the paper's formula."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from seqmix.config.mixer_group import mixer_config, mixer_factory, mixer_names
from seqmix.errors import SeqmixError
from seqmix.mixers import DynamicConv, LightConv, SelfAttention
from seqmix.mixers.base import MixerState
from seqmix.models.stack import build_mixer

C, H, K = 16, 4, 7
TEST_CONF = Path(__file__).resolve().parent / "conf"


def attention_reference(mixer: SelfAttention, x: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V per head, with loops over heads, float64 (Vaswani et al. 2017, Eq. 1)."""
    a = mixer.attn
    x = x.double()
    q = x @ a.q_proj.weight.double().T + a.q_proj.bias.double()
    k = x @ a.k_proj.weight.double().T + a.k_proj.bias.double()
    v = x @ a.v_proj.weight.double().T + a.v_proj.bias.double()
    b, t, _ = x.shape
    d = C // H
    out = torch.zeros(b, t, C, dtype=torch.float64)
    for h in range(H):
        sl = slice(h * d, (h + 1) * d)
        scores = q[:, :, sl] @ k[:, :, sl].transpose(1, 2) / math.sqrt(d)
        if mixer.causal:
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        out[:, :, sl] = torch.softmax(scores, dim=-1) @ v[:, :, sl]
    return out @ a.out_proj.weight.double().T + a.out_proj.bias.double()


def block_input(m, x: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
    """Wu et al. 2019 Fig. 2b: Linear(d, 2d) + GLU (or Linear(d, d)), pads set to zero; float64."""
    h = x.double() @ m.linear1.weight.double().T + m.linear1.bias.double()
    if m.glu:
        a, g = h.chunk(2, dim=-1)
        h = a * torch.sigmoid(g)
    if key_padding_mask is not None:
        h = h * (~key_padding_mask).unsqueeze(-1).double()
    return h


def head_conv_reference(m, x: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
    """Wu et al. 2019: Linear+GLU, zero pads, y_{i,c} = Σ_j softmax(W)_{h(c),j} · x_{i+j−p, c}, Linear.

    Loops over taps in float64; the taps come from the (H, K) weight (LightConv) or from a linear map of
    the conv input at position i (DynamicConv); softmax always runs over all K taps.
    """
    h = block_input(m, x, key_padding_mask)
    b, t, c = h.shape
    conv = m.conv
    normalize = (lambda w: torch.softmax(w, dim=-1)) if conv.weight_softmax else (lambda w: w)
    if isinstance(m, DynamicConv):
        raw = h @ conv.weight_linear.weight.double().T
        taps = normalize(raw.view(b, t, conv.num_heads, conv.kernel_size))
    else:
        taps = normalize(conv.weight.double().squeeze(1)).expand(b, t, -1, -1)
    heads_of_channel = torch.arange(c) // (c // conv.num_heads)
    pad = m.padding_l
    y = torch.zeros_like(h)
    for i in range(t):
        for j in range(conv.kernel_size):
            src = i + j - pad
            if 0 <= src < t:
                y[:, i] += taps[:, i, heads_of_channel, j] * h[:, src]
    return y @ m.linear2.weight.double().T + m.linear2.bias.double()


def talk_reference(m, x: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
    """Lioutas & Guo 2020 §3 in integral form: y_i = (1/K) ∫_{a_l}^{a_r+1} x[⌊t⌋] dt, computed as the overlap
    of each unit bin [j, j+1) with the window (no prefix sums), float64; without output normalization, no 1/K."""
    h = block_input(m, x, key_padding_mask)
    b, t, c = h.shape
    heads = m.num_heads
    sigma = torch.sigmoid(h @ m.offset_proj.weight.double().T + m.offset_proj.bias.double())
    norm = m.l_max + m.r_max + 1 if m.output_normalization else 1
    bins = torch.arange(t, dtype=torch.float64)
    y = torch.zeros_like(h)
    for i in range(t):
        for head in range(heads):
            lo = (i - sigma[:, i, head] * m.l_max).clamp(0, t - 1)  # (B,)
            hi = (i + sigma[:, i, heads + head] * m.r_max).clamp(0, t - 1) + 1 if not m.causal else \
                torch.full_like(lo, i + 1.0)
            overlap = (torch.minimum(bins + 1, hi[:, None]) - torch.maximum(bins, lo[:, None])).clamp(min=0)
            sl = slice(head * (c // heads), (head + 1) * (c // heads))
            y[:, i, sl] = (overlap[:, :, None] * h[:, :, sl]).sum(1) / norm
    return y @ m.linear2.weight.double().T + m.linear2.bias.double()


def ema_reference(m, x: torch.Tensor, key_padding_mask=None) -> torch.Tensor:
    """The test-tree mixer's recursion, step by step in float64 (its module computes it as one product)."""
    a = torch.sigmoid(m.decay_logit.double())
    x = x.double() if key_padding_mask is None else x.double().masked_fill(key_padding_mask.unsqueeze(-1), 0.0)

    def run(seq):
        y, out = torch.zeros_like(seq[:, 0]), []
        for t in range(seq.size(1)):
            y = (1 - a) * seq[:, t] + a * y
            out.append(y)
        return torch.stack(out, 1)

    avg = run(x) if m.causal else (run(x) + run(x.flip(1)).flip(1)) / 2
    return avg @ m.out_proj.weight.double().T + m.out_proj.bias.double()


# The one row a new mixer adds: its float64 reference. The mixers themselves come from the conf/mixer group (plus
# the test tree's conf/, which registers the EMA mixer by config alone).
REFERENCES = {
    "self_attention": attention_reference,
    "lightconv": head_conv_reference,
    "dynamicconv": head_conv_reference,
    "talk": talk_reference,
    "ema": ema_reference,
}
# extra settings of a group mixer worth their own rows: (group name, options, heads)
VARIANTS = {
    # even kernel: fairseq's encoder convention (K−1)//2 taps on the left
    "dynamicconv_even_k": ("dynamicconv", {"kernel_size": 4, "glu": False}, 2),
    "talk_no_glu_k1": ("talk", {"kernel_size": 1, "glu": False}, 2),
    # the ablation rows' settings (conf/ablation): Wu 2019's CNN Depthwise / no-softmax DynamicConv, TaLK unnormalized
    "lightconv_depthwise_raw": ("lightconv", {"glu": False, "weight_softmax": False}, C),
    "dynamicconv_raw": ("dynamicconv", {"weight_softmax": False}, 2),
    "talk_unnormalized": ("talk", {"output_normalization": False}, 1),
}
GROUP = mixer_names([TEST_CONF])
MIXERS = {**{name: (name, {}, H) for name in GROUP}, **VARIANTS}


def test_every_mixer_of_the_group_has_a_reference_row():
    assert {"self_attention", "lightconv", "dynamicconv", "talk", "ema"} <= set(GROUP)
    assert set(GROUP) <= set(REFERENCES), f"add a float64 reference for {sorted(set(GROUP) - set(REFERENCES))}"


@pytest.fixture(params=sorted(MIXERS))
def mixer_name(request):
    return request.param


def make(name, causal, seed=0, **extra):
    """Built as a stack builds it: from the group config (``extra`` overriding it), with the side's causality and the
    stack's heads."""
    base, options, heads = MIXERS[name]
    cfg = mixer_config(base, [TEST_CONF])
    if "kernel_size" in cfg and "kernel_size" not in options:
        options = {**options, "kernel_size": K}
    options = {**options, **extra}
    torch.manual_seed(seed)
    return build_mixer(mixer_factory(base, [TEST_CONF], **options), C, causal, 0, heads).eval()


def reference(name):
    return REFERENCES[MIXERS[name][0]]


def padded_batch(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of length ``t``, the second padded in its last 3 steps (keeping at least one)."""
    mask = torch.zeros(2, t, dtype=torch.bool)
    mask[1, max(1, t - 3):] = True
    return torch.randn(2, t, C), mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 7, 13])
def test_matches_reference(mixer_name, causal, t):
    m = make(mixer_name, causal)
    x, mask = padded_batch(t)
    ref = reference(mixer_name)(m, x, mask if not causal else None)
    out = m(x, key_padding_mask=mask if not causal else None)
    keep = ~mask if not causal else torch.ones_like(mask)
    torch.testing.assert_close(out.double()[keep], ref[keep], atol=1e-5, rtol=1e-5)


def output_from_mixing_weights(m, x: torch.Tensor, mask) -> torch.Tensor | None:
    """The mixer's output rebuilt from its ``mixing_weights`` (what the dashboard pictures): per head, the weights
    times the values (attention's V, a convolution's core input), then the output projection; float64."""
    w = m.mixing_weights(x, mask)
    if w is None:
        return None
    w = w.double()
    b, t, _ = x.shape
    if isinstance(m, SelfAttention):
        values, proj = m.attn.split_heads(m.attn.v_proj(x)).double(), m.attn.out_proj
    else:
        h = m.core_input(x, mask).double()
        values, proj = h.view(b, t, w.size(1), -1).transpose(1, 2), m.linear2
    mixed = (w @ values).transpose(1, 2).reshape(b, t, -1)
    return mixed @ proj.weight.double().T + proj.bias.double()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 6, 13])
def test_mixing_weights_rebuild_the_output(mixer_name, causal, t):
    m = make(mixer_name, causal)
    x, mask = padded_batch(t)
    rebuilt = output_from_mixing_weights(m, x, mask if not causal else None)
    if MIXERS[mixer_name][0] == "ema":
        assert rebuilt is None  # the test tree's mixer declares no weights: pictured as nothing
        return
    keep = ~mask if not causal else torch.ones_like(mask)
    out = m(x, key_padding_mask=mask if not causal else None)
    torch.testing.assert_close(rebuilt[keep], out.double()[keep], atol=1e-5, rtol=1e-5)
    w = m.mixing_weights(x, mask if not causal else None)
    assert w.shape == (2, w.size(1), t, t)
    if causal:
        assert not w.triu(1).any(), "a causal mixer's weights reach the future"


def test_gradients_match_reference(mixer_name):
    m = make(mixer_name, causal=False)
    x = torch.randn(2, 9, C, requires_grad=True)
    m(x).square().sum().backward()
    g = x.grad.clone()
    x64 = x.detach().double().requires_grad_()
    ref = reference(mixer_name)(m, x64)
    ref.square().sum().backward()
    torch.testing.assert_close(g.double(), x64.grad, atol=1e-4, rtol=1e-4)


def test_causal_future_does_not_leak(mixer_name):
    m = make(mixer_name, causal=True)
    x = torch.randn(2, 11, C)
    y = m(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn_like(x2[:, 6:]) * 5
    y2 = m(x2)
    torch.testing.assert_close(y[:, :6], y2[:, :6])
    assert not torch.allclose(y[:, 6:], y2[:, 6:])


def test_padding_content_never_changes_outputs(mixer_name):
    m = make(mixer_name, causal=False)
    x = torch.randn(3, 10, C)
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[0, 7:] = True
    mask[2, 4:] = True
    y = m(x, key_padding_mask=mask)
    x2 = x.masked_fill(mask.unsqueeze(-1), 0.0) + mask.unsqueeze(-1) * torch.randn_like(x) * 10
    y2 = m(x2, key_padding_mask=mask)
    torch.testing.assert_close(y[~mask], y2[~mask])
    # and a padded row equals the same row run alone without padding
    alone = m(x[2:3, :4])
    torch.testing.assert_close(y[2, :4], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t", [1, 5, 12])
def test_step_by_step_equals_full(mixer_name, t):
    m = make(mixer_name, causal=True)
    x = torch.randn(3, t, C)
    full = m(x)
    state = m.init_state()
    steps = torch.cat([m(x[:, i: i + 1], state=state) for i in range(t)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def gradients(m, x: torch.Tensor, run) -> list[torch.Tensor]:
    """d(sum of ``run()``)/d(input and every parameter of ``m``), zeros where one does not contribute."""
    params = list(m.parameters())
    grads = torch.autograd.grad(run().sum(), [x, *params], allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, [x, *params])]


def assert_steps_differentiable_like_full(m, x: torch.Tensor, **kw) -> None:
    """Step-by-step decoding with autograd on (the caches updated out of place) has the full causal pass's
    gradients, w.r.t. the input and every parameter (float64)."""

    def steps():
        state = m.init_state()
        return torch.cat([m(x[:, i: i + 1], state=state, **{k: v[:, i: i + 1] for k, v in kw.items()})
                          for i in range(x.size(1))], dim=1)

    full, stepped = gradients(m, x, lambda: m(x, **kw)), gradients(m, x, steps)
    for g_step, g_full in zip(stepped, full):
        torch.testing.assert_close(g_step, g_full, rtol=0, atol=1e-10)


def test_step_by_step_decoding_is_differentiable_like_the_full_pass(mixer_name):
    torch.manual_seed(1)
    m = make(mixer_name, causal=True).double()
    assert_steps_differentiable_like_full(m, torch.randn(3, 9, C, dtype=torch.float64, requires_grad=True))


def test_convs2s_decoder_conv_steps_are_differentiable_like_the_full_pass():
    from seqmix.models.glu_conv import GLUConv

    torch.manual_seed(1)
    m = GLUConv(C, 3, causal=True).double().eval()
    x = torch.randn(3, 7, C, dtype=torch.float64, requires_grad=True)
    assert_steps_differentiable_like_full(m, x)
    assert_steps_differentiable_like_full(m, x, residual=x.flip(-1))


def test_chunked_decoding_equals_full(mixer_name):
    m = make(mixer_name, causal=True)
    x = torch.randn(2, 9, C)
    full = m(x)
    state = m.init_state()
    parts = [m(x[:, :4], state=state), m(x[:, 4:5], state=state), m(x[:, 5:], state=state)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_reorder_follows_beams(mixer_name):
    m = make(mixer_name, causal=True)
    x = torch.randn(3, 6, C)
    state = m.init_state()
    for i in range(4):
        m(x[:, i: i + 1], state=state)
    index = torch.tensor([2, 0, 0])
    state.reorder(index)
    out = m(x[index, 4:5], state=state)
    full = m(x[index, :5])
    torch.testing.assert_close(out[:, 0], full[:, 4], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_float64_gradcheck(mixer_name, causal):
    """The PyTorch path's gradients are exact (finite differences, float64, tiny shapes)."""
    m = make(mixer_name, causal).double()
    x = torch.randn(2, 5, C, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3:] = True
    assert torch.autograd.gradcheck(lambda inp: m(inp, key_padding_mask=None if causal else mask), (x,))


def test_only_a_causal_mixer_makes_a_decoding_cache(mixer_name):
    cache = make(mixer_name, causal=True).init_state()
    assert type(cache) is type(make(mixer_name, causal=True)).state_class and isinstance(cache, MixerState)
    with pytest.raises(NotImplementedError, match="causal"):
        make(mixer_name, causal=False).init_state()


def test_incremental_state_needs_causal(mixer_name):
    m = make(mixer_name, causal=False)
    with pytest.raises(ValueError, match="causal"):
        m(torch.randn(1, 1, C), state=make(mixer_name, causal=True).init_state())


# the group's mixers with a Triton kernel: those whose config has a kernel_backend
TRITON_MIXERS = sorted(name for name in GROUP if "kernel_backend" in mixer_config(MIXERS[name][0], [TEST_CONF]))


def test_the_triton_mixers_are_read_from_the_group():
    assert {"lightconv", "dynamicconv", "talk"} <= set(TRITON_MIXERS) and "self_attention" not in TRITON_MIXERS


@pytest.mark.interpret
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", TRITON_MIXERS)
def test_triton_path_equals_torch_path(name, causal):
    """kernel_backend=triton (the interpreter on CPU) and the PyTorch path agree, forward and backward."""
    fast = make(name, causal, kernel_backend="torch")
    kern = make(name, causal, kernel_backend="triton")
    kern.load_state_dict(fast.state_dict())
    x = torch.randn(2, 6, C)
    mask = None if causal else torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    outs, grads = [], []
    for m in (fast, kern):
        xi = x.clone().requires_grad_()
        y = m(xi, key_padding_mask=mask)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([xi.grad] + [p.grad.clone() for p in m.parameters()])
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-4)
    for g_kern, g_fast in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_kern, g_fast, atol=1e-5, rtol=1e-4)


def test_without_triton_auto_falls_back_and_triton_is_a_clear_error(monkeypatch):
    """Triton absent (a CPU-only install): ``auto`` takes the PyTorch path, an explicit ``triton`` says so."""
    from seqmix import kernel_backend as backend

    def missing():
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    kernel = backend.Kernel("lightconv", missing)
    x = torch.randn(1, 4, C)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SeqmixError, match="Triton is not installed, so the lightconv kernel"):
        backend.triton_function("triton", x, kernel)
    monkeypatch.setattr(backend, "use_triton", lambda name, x: True)
    assert backend.triton_function("auto", x, kernel) is None


@pytest.fixture
def backend(monkeypatch):
    """``seqmix.kernel_backend`` with an empty memo of built and failed kernels, every call taking the Triton path."""
    from seqmix import kernel_backend

    monkeypatch.setattr(kernel_backend, "_LAUNCHED", set())
    monkeypatch.setattr(kernel_backend, "_UNAVAILABLE", {})
    monkeypatch.setattr(kernel_backend, "use_triton", lambda name, x: True)
    return kernel_backend


def test_auto_falls_back_once_to_the_pytorch_path_when_a_kernel_fails_to_build(backend):
    """A Triton error at a kernel's first launch for a dtype (here: too little shared memory) warns once, and that
    call and every later one run the PyTorch path; explicit ``triton`` keeps the error; other errors are not hidden."""
    from triton.runtime.errors import OutOfResources

    from seqmix.layers.banded import banded_conv

    launches = []

    def failing(x, w, padding_l):
        launches.append(x.dtype)
        raise OutOfResources(232448, 166912, "shared memory")

    kernel = backend.Kernel("lightconv_test", lambda: failing)
    x, w = torch.randn(2, 5, C), torch.softmax(torch.randn(2, 3), -1)
    with pytest.warns(UserWarning, match="lightconv_test Triton kernel failed to build for float32.*PyTorch path"):
        y = backend.triton_function("auto", x, kernel, fallback=banded_conv)(x, w, 2)
    torch.testing.assert_close(y, banded_conv(x, w, 2))
    assert backend.triton_function("auto", x, kernel, fallback=banded_conv) is None  # the caller's PyTorch path
    assert launches == [torch.float32]
    with pytest.raises(OutOfResources):
        backend.triton_function("triton", x, kernel, fallback=banded_conv)(x, w, 2)
    assert backend.triton_function("auto", x.double(), kernel, fallback=banded_conv) is not None  # per dtype

    def broken(x, w, padding_l):
        raise ValueError("not a build failure")

    with pytest.raises(ValueError, match="not a build failure"):
        backend.triton_function("auto", x, backend.Kernel("other", lambda: broken), fallback=banded_conv)(x, w, 2)
    def identity(x, w, padding_l):
        return x

    ok = backend.Kernel("fine", lambda: identity)
    assert backend.triton_function("auto", x, ok, fallback=banded_conv)(x, w, 2) is x
    assert backend.triton_function("auto", x, ok, fallback=banded_conv) is identity  # launched once: no wrapper


def test_a_kernel_size_that_fails_to_build_neither_disables_nor_unguards_the_others(backend):
    """Layers with K=3 and K=7 (per-layer kernel sizes): K=3 built and ran, K=7 needs more shared memory than the GPU
    has. K=7's first launch is still guarded (warns, runs the PyTorch path), and K=3 keeps its kernel."""
    from triton.runtime.errors import OutOfResources

    from seqmix.layers.banded import banded_conv


    def sized(x, w, padding_l):
        if w.size(-1) > 5:
            raise OutOfResources(232448, 166912, "shared memory")
        return banded_conv(x, w, padding_l)

    kernel = backend.Kernel("sized", lambda: sized)
    x, small, large = torch.randn(2, 5, C), torch.softmax(torch.randn(2, 3), -1), torch.softmax(torch.randn(2, 7), -1)
    backend.triton_function("auto", x, kernel, fallback=banded_conv, build=("K=3",))(x, small, 1)
    with pytest.warns(UserWarning, match="failed to build for float32, K=7"):
        y = backend.triton_function("auto", x, kernel, fallback=banded_conv, build=("K=7",))(x, large, 3)
    torch.testing.assert_close(y, banded_conv(x, large, 3))
    assert backend.triton_function("auto", x, kernel, fallback=banded_conv, build=("K=7",)) is None
    assert backend.triton_function("auto", x, kernel, fallback=banded_conv, build=("K=3",)) is sized


def test_each_conv_mixer_names_its_kernel_by_import():
    from seqmix import kernel_backend as backend
    from triton_kernels.dynamicconv import dynamicconv
    from triton_kernels.lightconv import lightconv

    assert LightConv(C, kernel_size=3, num_heads=2).conv.triton_kernel.load() is lightconv
    assert DynamicConv(C, kernel_size=3, num_heads=2).conv.triton_kernel.load() is dynamicconv
    assert backend.TALK.load().__module__ == "triton_kernels.talk.ops"


def test_attention_on_cuda_leaves_out_cudnn_sdpa():
    """cuDNN's SDPA plans every new (batch, length) shape anew; token-budget batches are nearly all new shapes."""
    from torch.nn.attention import SDPBackend

    from seqmix.layers.attention import CUDA_SDPA_BACKENDS

    assert SDPBackend.CUDNN_ATTENTION not in CUDA_SDPA_BACKENDS
    assert {SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH} <= set(CUDA_SDPA_BACKENDS)
