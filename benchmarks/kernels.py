"""The Triton kernels one by one: forward and backward against their float64 references (the error table per dtype),
and their speed against PyTorch on the same inputs. Built for ``benchmarks.gpu_check`` on a CUDA GPU; the correctness
part also runs on CPU under ``TRITON_INTERPRET=1`` with tiny shapes (tests/test_gpu_check.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks import common

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ERROR_FIELDS = ("kernel case dtype triton_rms triton_max torch_rms torch_max rms_limit max_limit worst_output status")
SPEED_FIELDS = ("kernel T batch dtype triton_fwd_ms triton_fwd_bwd_ms torch_fwd_ms torch_fwd_bwd_ms speedup_fwd_bwd "
                "fwd_bytes fwd_gb_per_s bandwidth_fraction status")


@dataclass(frozen=True)
class Case:
    """One kernel call: ``make(dtype, device, generator)`` -> (inputs, grad_out); ``run(*inputs)`` -> output tensor(s),
    ``reference(*inputs)`` the same formula on CPU tensors, in float64 (the truth) or in the inputs' dtype (what plain
    PyTorch rounding in that dtype costs)."""

    kernel: str
    name: str
    make: Callable
    run: Callable
    reference: Callable
    differentiable: tuple[int, ...]  # indices of the inputs that get gradients


def _softmax_taps(g, shape, dtype, device):
    return torch.softmax(torch.randn(shape, generator=g), dim=-1).to(device=device, dtype=dtype)


def _padded(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Zero each row past its length: what a right-padded batch feeds the kernels."""
    for b, n in enumerate(lengths):
        x[b, n:] = 0
    return x


def conv_case(kernel: str, B: int, T: int, C: int, H: int, K: int, padding_l: int, per_position: bool) -> Case:
    from triton_kernels.dynamicconv.reference import dynamicconv_reference
    from triton_kernels.lightconv.reference import lightconv_reference

    def make(dtype, device, g):
        x = _padded(torch.randn(B, T, C, generator=g), [T - 2 * b for b in range(B)]).to(device=device, dtype=dtype)
        w = _softmax_taps(g, (B, T, H, K) if per_position else (H, K), dtype, device)
        return (x, w), torch.randn(B, T, C, generator=g).to(device=device, dtype=dtype)

    def run(x, w):
        from seqmix import kernel_backend as kb

        return (kb.DYNAMICCONV if per_position else kb.LIGHTCONV).load()(x, w, padding_l)

    def reference(x, w):
        return (dynamicconv_reference if per_position else lightconv_reference)(x, w, padding_l)

    side = "causal" if padding_l == K - 1 else "centred"
    return Case(kernel, f"B={B} T={T} C={C} H={H} K={K} {side}", make, run, reference, (0, 1))


def talk_case(B: int, T: int, C: int, H: int, l_max: int, r_max: int) -> Case:
    from triton_kernels.talk.reference import talk_reference

    causal = r_max == 0

    def make(dtype, device, g):
        x = _padded(torch.randn(B, T, C, generator=g), [T - 3 * b for b in range(B)]).to(device=device, dtype=dtype)
        left = torch.rand(B, T, H, generator=g).to(device)
        right = None if causal else torch.rand(B, T, H, generator=g).to(device)
        return (x, left, right), torch.randn(B, T, C, generator=g).to(device=device, dtype=dtype)

    def run(x, left, right):
        from seqmix.kernel_backend import TALK

        return TALK.load()(x, left, right, l_max, r_max)

    def reference(x, left, right):
        return talk_reference(x, left.to(x.dtype) if x.dtype == torch.float64 else left,
                              None if right is None else right.to(x.dtype) if x.dtype == torch.float64 else right,
                              l_max, r_max).to(x.dtype)

    return Case("talk", f"B={B} T={T} C={C} H={H} l_max={l_max} r_max={r_max}", make, run, reference,
                (0, 1) if causal else (0, 1, 2))


def convs2s_case(B: int, steps: int, C: int, k: int, residual: bool) -> Case:
    from triton_kernels.convs2s.reference import convs2s_step_reference

    def make(dtype, device, g):
        window = torch.randn(B, steps + k - 1, C, generator=g)
        weight = torch.randn(2 * C, k * C, generator=g) / math.sqrt(k * C)
        bias = torch.randn(2 * C, generator=g) * 0.1
        res = torch.randn(B, steps, C, generator=g) if residual else None
        inputs = tuple(t if t is None else t.to(device=device, dtype=dtype) for t in (window, weight, bias, res))
        return inputs, torch.randn(B, steps, C, generator=g).to(device=device, dtype=dtype)

    def run(window, weight, bias, res):
        from seqmix.kernel_backend import CONVS2S_STEP

        return CONVS2S_STEP.load()(window, weight, bias, res)

    return Case("convs2s_step", f"rows={B} steps={steps} C={C} k={k}{' +residual' if residual else ''}", make, run,
                convs2s_step_reference, (0, 1, 2, 3) if residual else (0, 1, 2))


def fused_xent_case(N: int, C: int, V: int, epsilon: float = 0.1, pad: int = 1) -> Case:
    from triton_kernels.fused_xent.reference import fused_loss_reference

    def make(dtype, device, g):
        features = torch.randn(N, C, generator=g)
        weight = torch.randn(V, C, generator=g) / math.sqrt(C)
        target = torch.randint(0, V, (N,), generator=g)
        target[::7] = pad  # padding rows are ignored
        return (features.to(device=device, dtype=dtype), weight.to(device=device, dtype=dtype), target.to(device)), None

    def run(features, weight, target):
        from seqmix.kernel_backend import FUSED_LABEL_SMOOTHED_LOSS

        return FUSED_LABEL_SMOOTHED_LOSS.load()(features, weight, target, epsilon, pad)

    def reference(features, weight, target):
        return fused_loss_reference(features, weight, target.cpu() if features.device.type == "cpu" else target,
                                    epsilon, pad)

    return Case("fused_xent", f"N={N} C={C} V={V} eps={epsilon}", make, run, reference, (0, 1))


def cases(tiny: bool = False) -> list[Case]:
    """Odd lengths, padded rows, kernels longer than the sequence, K up to 31; ``tiny``: interpreter-sized."""
    if tiny:
        return [conv_case("lightconv", 2, 7, 8, 2, 5, 4, False), conv_case("dynamicconv", 2, 5, 8, 2, 7, 3, True),
                talk_case(2, 9, 8, 2, 3, 2), convs2s_case(3, 2, 16, 3, True), fused_xent_case(9, 16, 37)]
    out = []
    for per_position, kernel in ((False, "lightconv"), (True, "dynamicconv")):
        for B, T, C, H, K in ((3, 37, 64, 4, 3), (2, 509, 512, 8, 31), (3, 17, 128, 8, 31)):
            for padding_l in (K - 1, K // 2):
                out.append(conv_case(kernel, B, T, C, H, K, padding_l, per_position))
    out += [talk_case(3, 61, 64, 4, 3, 3), talk_case(2, 509, 512, 8, 31, 0), talk_case(2, 257, 512, 8, 15, 15)]
    out += [convs2s_case(5, 1, 512, 3, False), convs2s_case(40, 1, 512, 3, True), convs2s_case(3, 9, 96, 5, True)]
    out += [fused_xent_case(1001, 512, 8000), fused_xent_case(37, 64, 333)]
    return out


def error_ratios(actual: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(rms(error) / rms(ref), max|error| / max|ref|) against the float64 reference."""
    from triton_kernels.common import ABS_FLOOR

    diff = actual.detach().double().cpu() - ref.double().cpu()
    ref = ref.double().cpu()
    rms = diff.pow(2).mean().sqrt().item() / max(ref.pow(2).mean().sqrt().item(), ABS_FLOOR)
    worst = diff.abs().max().item() / max(ref.abs().max().item(), ABS_FLOOR)
    return (math.inf, math.inf) if not torch.isfinite(actual).all() else (rms, worst)


def _outputs_and_grads(fn: Callable, inputs: tuple, grad_out, differentiable: tuple[int, ...]) -> dict:
    leaves = [t.detach().clone().requires_grad_(i in differentiable) if t is not None and t.is_floating_point() else t
              for i, t in enumerate(inputs)]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    objective = sum((o.float() * (1.0 + k)).sum() if grad_out is None else (o.float() * grad_out.float()).sum()
                    for k, o in enumerate(outs))
    grads = torch.autograd.grad(objective, [leaves[i] for i in differentiable])
    return {**{f"y{k}": o for k, o in enumerate(outs)}, **{f"d{i}": g for i, g in zip(differentiable, grads)}}


def check_case(case: Case, dtype_name: str, device: torch.device, seed: int = 0) -> dict:
    """The kernel and the plain PyTorch computation in ``dtype``, each against float64: the worst output's ratios."""
    from triton_kernels.common import MAX_LIMIT, RATIO_LIMIT

    dtype = DTYPES[dtype_name]
    inputs, grad_out = case.make(dtype, device, torch.Generator().manual_seed(seed))
    # the references run on the CPU: float64 there is exact enough and fast at these sizes
    on_cpu = tuple(None if t is None else t.cpu() for t in inputs)
    grad_cpu = None if grad_out is None else grad_out.cpu()
    as64 = tuple(t.double() if t is not None and t.is_floating_point() else t for t in on_cpu)
    truth = _outputs_and_grads(case.reference, as64, None if grad_cpu is None else grad_cpu.double(), case.differentiable)
    row = common.new_row(ERROR_FIELDS, kernel=case.kernel, case=case.name, dtype=dtype_name,
                         rms_limit=RATIO_LIMIT[dtype], max_limit=MAX_LIMIT[dtype])
    for side, fn, args, dy in (("triton", case.run, inputs, grad_out), ("torch", case.reference, on_cpu, grad_cpu)):
        got = _outputs_and_grads(fn, args, dy, case.differentiable)
        ratios = {name: error_ratios(got[name], truth[name]) for name in truth}
        worst = max(ratios, key=lambda n: ratios[n][0] / RATIO_LIMIT[dtype] + ratios[n][1] / MAX_LIMIT[dtype])
        row[f"{side}_rms"], row[f"{side}_max"] = max(r[0] for r in ratios.values()), max(r[1] for r in ratios.values())
        if side == "triton":
            row["worst_output"] = worst
    bad = row["triton_rms"] > row["rms_limit"] or row["triton_max"] > row["max_limit"]
    row["status"] = f"FAILED: {row['worst_output']} over the {dtype_name} limit" if bad else "ok"
    return row


def correctness(device: torch.device, dtypes=tuple(DTYPES), tiny: bool = False, keep_going: Callable = lambda: True,
                log=print, only: tuple[str, ...] = ()) -> list[dict]:
    """Every case (of the kernels in ``only``, default all) in every dtype: a row each."""
    rows = []
    for case in (c for c in cases(tiny) if not only or c.kernel in only):
        for dtype_name in dtypes:
            if not keep_going():
                rows.append(common.new_row(ERROR_FIELDS, kernel=case.kernel, case=case.name, dtype=dtype_name,
                                           status="skipped: time budget"))
                continue
            try:
                rows.append(check_case(case, dtype_name, device))
            except Exception as err:
                rows.append(common.new_row(ERROR_FIELDS, kernel=case.kernel, case=case.name, dtype=dtype_name,
                                           status=common.error_status(err)))
            r = rows[-1]
            log(f"  {r['kernel']:<13} {r['case']:<40} {dtype_name}: triton rms {common.cell(r['triton_rms'], '.1e')} "
                f"max {common.cell(r['triton_max'], '.1e')} | torch rms {common.cell(r['torch_rms'], '.1e')}  {r['status']}")
    return rows


def _ms(fn: Callable, device: torch.device) -> float:
    return statistics.median(common.time_ms(fn, 5, 2, device))


def speed(device: torch.device, bandwidth_gb_s: float | None, lengths=(512, 2048, 8192), tokens: int = 16384,
          C: int = 512, H: int = 8, K: int = 31, dtype_name: str = "bf16", keep_going: Callable = lambda: True,
          log=print) -> list[dict]:
    """Each conv kernel (forward; forward + backward) against the same op in PyTorch (the mixers' own PyTorch path:
    banded matmuls for LightConv/DynamicConv, prefix sums for TaLK), B·T = ``tokens``, d = ``C``."""
    from seqmix.kernel_backend import DYNAMICCONV, LIGHTCONV, TALK
    from seqmix.layers.banded import banded_conv
    from seqmix.mixers.talk import talk_window_sum

    dtype, rows = DTYPES[dtype_name], []
    for T in lengths:
        B = max(1, tokens // T)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(B, T, C, generator=g).to(device=device, dtype=dtype)
        offsets = torch.rand(B, T, H, generator=g).to(device)
        ops = {
            "lightconv": (lambda x, w: LIGHTCONV.load()(x, w, K - 1), lambda x, w: banded_conv(x, w, K - 1), _softmax_taps(g, (H, K), dtype, device)),
            "dynamicconv": (lambda x, w: DYNAMICCONV.load()(x, w, K - 1), lambda x, w: banded_conv(x, w, K - 1),
                            _softmax_taps(g, (B, T, H, K), dtype, device)),
            "talk": (lambda x, w: TALK.load()(x, w, None, K - 1, 0), lambda x, w: talk_window_sum(x, w, None, K - 1, 0),
                     offsets)}
        for name, (triton_op, torch_op, weight) in ops.items():
            row = common.new_row(SPEED_FIELDS, kernel=name, T=T, batch=B, dtype=dtype_name)
            if not keep_going():
                rows.append(row | {"status": "skipped: time budget"})
                continue
            try:
                for side, op in (("triton", triton_op), ("torch", torch_op)):
                    xg = x.detach().clone().requires_grad_(True)
                    wg = weight.detach().clone().requires_grad_(weight.is_floating_point() and name != "talk")
                    dy = torch.randn_like(x)
                    row[f"{side}_fwd_ms"] = _ms(lambda op=op, x=x, wg=wg: op(x, wg), device)
                    row[f"{side}_fwd_bwd_ms"] = _ms(lambda op=op, xg=xg, wg=wg, dy=dy: op(xg, wg).backward(dy), device)
                row["fwd_bytes"] = 2 * x.numel() * x.element_size() + weight.numel() * weight.element_size()
                row["fwd_gb_per_s"] = row["fwd_bytes"] / row["triton_fwd_ms"] / 1e6
                row["bandwidth_fraction"] = row["fwd_gb_per_s"] / bandwidth_gb_s if bandwidth_gb_s else None
                row["speedup_fwd_bwd"] = row["torch_fwd_bwd_ms"] / row["triton_fwd_bwd_ms"]
                row["status"] = "ok"
            except Exception as err:
                row["status"] = common.error_status(err)
            rows.append(row)
            log(f"  {name:<12} T={T:<5} triton {common.cell(row['triton_fwd_bwd_ms'], '.2f')} ms, torch "
                f"{common.cell(row['torch_fwd_bwd_ms'], '.2f')} ms (fwd+bwd), fwd {common.cell(row['fwd_gb_per_s'], '.0f')} "
                f"GB/s  {row['status']}")
        rows.append(sdpa_row(x, H, T, B, dtype_name, device, keep_going))
    return rows


def sdpa_row(x: torch.Tensor, H: int, T: int, B: int, dtype_name: str, device: torch.device, keep_going: Callable) -> dict:
    """Causal self-attention through SDPA (flash attention on CUDA) on the same tokens: the mixer the others replace."""
    row = common.new_row(SPEED_FIELDS, kernel="sdpa (causal attention)", T=T, batch=B, dtype=dtype_name)
    if not keep_going():
        return row | {"status": "skipped: time budget"}
    try:
        q = x.detach().view(B, T, H, -1).transpose(1, 2).contiguous().requires_grad_(True)
        attend = torch.nn.functional.scaled_dot_product_attention
        dy = torch.randn_like(q)
        row["torch_fwd_ms"] = _ms(lambda: attend(q, q, q, is_causal=True), device)
        row["torch_fwd_bwd_ms"] = _ms(lambda: attend(q, q, q, is_causal=True).backward(dy), device)
        row["status"] = "ok"
    except Exception as err:
        row["status"] = common.error_status(err)
    return row
