"""ConvS2S decoder-step kernel: under the interpreter vs. the float64 reference and vs. the model's PyTorch step
path; ahead-of-time compile for sm_80 / sm_90 failing on register spills.

The AOT part reuses tests/kernels/aot_worker.py's compile-and-ptxas helpers in a subprocess (this file run as
a module, TRITON_INTERPRET unset), over this kernel's own grid: its k and channel counts are runtime
arguments, so what varies is the tile shape (decode vs. batch rows), the residual epilogue and the dtype.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.kernels.checks import assert_close
from triton_kernels.convs2s import convs2s_step
from triton_kernels.convs2s import ops as step_ops
from triton_kernels.convs2s.reference import convs2s_step_reference, convs2s_step_reference_grads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _inputs(B, W, C_in, C_out, k, dtype, residual=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    window = torch.randn(B, W, C_in, generator=g).to(dtype)
    weight = (torch.randn(2 * C_out, k * C_in, generator=g) / (k * C_in) ** 0.5).to(dtype)
    bias = (0.1 * torch.randn(2 * C_out, generator=g)).to(dtype)
    res = torch.randn(B, W - k + 1, C_out, generator=g).to(dtype) if residual else None
    return window, weight, bias, res


def _ref(window, weight, bias, res):
    return convs2s_step_reference(window.double(), weight.double(), bias.double(),
                                  None if res is None else res.double())


# --- interpreter: kernel vs. float64 reference ------------------------------------------------------------
@pytest.mark.interpret
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("new_steps", [1, 3])
@pytest.mark.parametrize("residual", [False, True], ids=["glu", "glu+res"])
def test_fp32(k, new_steps, residual):
    """Odd channel counts (5 in, 7 out); several new steps per call (overlapping tap spans)."""
    window, weight, bias, res = _inputs(3, k - 1 + new_steps, 5, 7, k, torch.float32, residual, seed=k)
    y = convs2s_step(window, weight, bias, res)
    assert y.dtype == torch.float32 and y.shape == (3, new_steps, 7)
    assert_close("y", y, _ref(window, weight, bias, res), torch.float32)


@pytest.mark.interpret
@pytest.mark.parametrize("B,C_in,C_out,k,residual", [(2, 5, 7, 3, True), (5, 24, 40, 4, False), (1, 33, 17, 2, True)])
def test_fp16(B, C_in, C_out, k, residual):
    window, weight, bias, res = _inputs(B, k, C_in, C_out, k, torch.float16, residual, seed=B)
    y = convs2s_step(window, weight, bias, res)
    assert y.dtype == torch.float16
    assert_close("y", y, _ref(window, weight, bias, res), torch.float16)


@pytest.mark.interpret
@pytest.mark.parametrize("rows,blocks", [(20, (16, 16, 16)), (3, (16, 16, 32))])
def test_tile_edges(rows, blocks):
    """Small tiles: several row blocks (a partial last one), several channel blocks (40 = 16+16+8), a
    reduction over k·C_in = 99 in partial blocks; and the batch-tile path at the op's own choice."""
    window, weight, bias, res = _inputs(rows, 3, 33, 40, 3, torch.float32, True, seed=rows)
    ref = _ref(window, weight, bias, res)
    assert_close("y", step_ops._launch_forward(window, weight, bias, res, blocks), ref, torch.float32)
    assert_close("y", convs2s_step(window, weight, bias, res), ref, torch.float32)


@pytest.mark.interpret
@pytest.mark.parametrize("residual", [False, True], ids=["glu", "glu+res"])
def test_gradients_match_reference(residual):
    """The backward is PyTorch (decoding needs none); still exact, including overlapping steps."""
    window, weight, bias, res = _inputs(2, 5, 5, 7, 3, torch.float32, residual, seed=4)
    leaves = [t.clone().requires_grad_(True) for t in (window, weight, bias)]
    rg = None if res is None else res.clone().requires_grad_(True)
    y = convs2s_step(*leaves, rg)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_ref, *grads = convs2s_step_reference_grads(window, weight, bias, res, dy)
    assert_close("y", y, y_ref, torch.float32)
    for name, got, want in zip(("dwindow", "dweight", "dbias"), (t.grad for t in leaves), grads):
        assert_close(name, got, want, torch.float32)
    if residual:
        assert_close("dresidual", rg.grad, grads[3], torch.float32)


@pytest.mark.interpret
def test_autocast_runs_in_half_precision():
    window, weight, bias, _ = _inputs(2, 3, 8, 8, 3, torch.float32)
    with torch.autocast("cpu", dtype=torch.float16):
        y = convs2s_step(window, weight, bias)
    assert y.dtype == torch.float16
    assert_close("y", y, _ref(window.half(), weight.half(), bias.half(), None), torch.float16)


@pytest.mark.interpret
def test_torch_compile_traces_through_op():
    window, weight, bias, res = _inputs(2, 3, 8, 8, 3, torch.float32, True)
    out = torch.compile(convs2s_step, backend="aot_eager", fullgraph=True)(window, weight, bias, res)
    assert_close("y", out, _ref(window, weight, bias, res), torch.float32)


@pytest.mark.parametrize(
    "shapes,exc,match",
    [
        (((2, 3), (14, 15), (14,), None), ValueError, "window must have 3 dims"),
        (((2, 3, 5), (14, 16), (14,), None), ValueError, r"\(2·C_out, k·C_in\)"),
        (((2, 3, 5), (13, 15), (13,), None), ValueError, "even"),
        (((2, 2, 5), (14, 15), (14,), None), ValueError, "kernel width is k = 3"),
        (((2, 3, 5), (14, 15), (7,), None), ValueError, "bias must be"),
        (((2, 3, 5), (14, 15), (14,), (2, 2, 7)), ValueError, "residual must be"),
    ],
)
def test_clear_errors(shapes, exc, match):
    w, wt, b, r = shapes
    with pytest.raises(exc, match=match):
        convs2s_step(torch.zeros(w), torch.zeros(wt), torch.zeros(b), None if r is None else torch.zeros(r))


def test_bad_dtype_and_device():
    with pytest.raises(TypeError, match="cast them alike"):
        convs2s_step(torch.zeros(1, 3, 4), torch.zeros(8, 12, dtype=torch.float16), torch.zeros(8))
    with pytest.raises(TypeError, match="dtype"):
        convs2s_step(torch.zeros(1, 3, 4, dtype=torch.float64), torch.zeros(8, 12), torch.zeros(8))
    with pytest.raises(ValueError, match="CUDA"):
        convs2s_step(torch.zeros(1, 3, 4, device="meta"), torch.zeros(8, 12, device="meta"),
                     torch.zeros(8, device="meta"))


# --- interpreter: kernel inside the model vs. the model's PyTorch step path --------------------------------
def _glu_conv(backend, k, causal=True, seed=0):
    from seqmix.models.glu_conv import GLUConv

    torch.manual_seed(seed)
    return GLUConv(5, k, causal=causal, out_dim=7, kernel_backend=backend).eval()


@pytest.mark.interpret
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mixer_step_triton_equals_torch_and_full_pass(k, dtype):
    """Four steps with k up to 6: the first steps see fewer real inputs than the window holds (zeros)."""
    torch_mixer, triton_mixer = _glu_conv("torch", k).to(dtype), _glu_conv("triton", k).to(dtype)
    x = torch.randn(2, 4, 5).to(dtype)
    res = torch.randn(2, 4, 7).to(dtype)
    with torch.no_grad():
        full = copy.deepcopy(torch_mixer).double()(x.double(), residual=res.double())
        s_torch, s_triton = torch_mixer.init_state(), triton_mixer.init_state()
        outs_torch, outs_triton = [], []
        for t in range(4):
            outs_torch.append(torch_mixer(x[:, t: t + 1], state=s_torch, residual=res[:, t: t + 1]))
            outs_triton.append(triton_mixer(x[:, t: t + 1], state=s_triton, residual=res[:, t: t + 1]))
    y_torch, y_triton = torch.cat(outs_torch, 1), torch.cat(outs_triton, 1)
    assert_close("triton step vs full pass", y_triton, full, dtype)
    assert_close("triton step vs torch step", y_triton, y_torch.double(), dtype)
    assert s_triton.weight is not None, "the folded weight is cached in the state while autograd is off"


@pytest.mark.interpret
def test_decoder_steps_triton_equal_torch():
    """A tiny ConvS2S decoded step by step: a block with attention (conv + GLU fused) and blocks without
    (residual fused too, one of them projected from another width), kernel widths 3, 2 and 1."""
    from seqmix.models.convs2s import ConvS2S

    settings = dict(encoder=dict(embed_dim=8, layers=[[8, 3]]), dropout=0.0,
                    decoder=dict(embed_dim=8, out_embed_dim=6, layers=[[8, 3], [12, 2], [12, 1]],
                                 attention=[True, False, False]))
    models = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        models[backend] = ConvS2S(20, 20, 1, kernel_backend=backend, **settings).eval()
    src, prev = torch.randint(4, 20, (2, 6)), torch.randint(4, 20, (2, 5))
    with torch.no_grad():
        full = models["torch"](src, prev)
        outs = {}
        for name, model in models.items():
            enc = model.encode(src)
            state = model.init_decoder_state(enc)
            outs[name] = torch.cat([model.decode(prev[:, t: t + 1], enc, state) for t in range(prev.size(1))], 1)
    assert_close("triton steps vs torch steps", outs["triton"], outs["torch"].double(), torch.float32)
    assert_close("triton steps vs full pass", outs["triton"], full.double(), torch.float32)


def test_cpu_auto_uses_pytorch(monkeypatch):
    """auto on CPU never reaches the kernel (it would raise without the interpreter)."""
    def boom(*_):
        raise AssertionError("kernel called on CPU under auto")

    monkeypatch.setattr(step_ops, "convs2s_step", boom)
    mixer = _glu_conv("auto", 3)
    with torch.no_grad():
        mixer(torch.randn(2, 1, 5), state=mixer.init_state())


# --- ahead-of-time compile for sm_80 / sm_90 ---------------------------------------------------------------
AOT_DTYPES = (torch.float16, torch.bfloat16)
AOT_WIDTHS = (256, 512, 1024)  # C_in = C_out of the presets' blocks; runtime ints, so they only set divisibility
AOT_ARCHS = (80, 90)


def _aot_jobs():
    """(spec, C, dtype, arch, variant): the aligned-tile specs with divisibility at every preset width, fp32
    (the upcast path) at 512 for the residual epilogue (the larger of the two); the "generic" specs, which
    the op launches only on unaligned inputs, with no divisibility assumed (odd width 509)."""
    for spec in step_ops.KERNELS:
        if spec.name.startswith("convs2s_step_generic"):
            grid = [(509, d, a, "generic") for d in (*AOT_DTYPES, torch.float32) for a in AOT_ARCHS]
        else:
            grid = [(C, d, a, "aligned") for C in AOT_WIDTHS for d in AOT_DTYPES for a in AOT_ARCHS]
            if spec.name.endswith("_res"):
                grid += [(512, torch.float32, a, "aligned") for a in AOT_ARCHS]
        for C, dtype, arch, variant in grid:
            yield spec, C, dtype, arch, variant


def _attrs(fn, sig, C, aligned):
    """What the launcher specializes at width C: 16-byte pointers, channel counts divisible by 16."""
    if not aligned:
        return {}
    ints = {"C_IN": C, "C_OUT": C, "KC": 3 * C}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        ty = sig.get(name, "constexpr")
        if ty.startswith("*") or (name in ints and ints[name] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def aot_main() -> int:
    """Subprocess body: compile every distinct job once (the widths only change divisibility, which is the same
    for 256/512/1024, so those rows share one compile), print JSON rows. ~30 compiles, ~1 s CPU each."""
    os.environ.pop("TRITON_INTERPRET", None)
    from tests.kernels.aot_worker import compile_one
    from triton_kernels.common import triton_type

    done: dict = {}
    for spec, C, dtype, arch, variant in _aot_jobs():
        sig, consts, warps = spec.build(3, dtype, C, 1)
        attrs = _attrs(spec.fn, sig, C, variant == "aligned")
        key = (spec.name, str(dtype), arch, variant, str(attrs))
        if key not in done:
            done[key] = compile_one((spec, 3, triton_type(dtype), arch, variant, sig, consts, warps, attrs))
        print(json.dumps({**done[key], "C": C}), flush=True)
    return 0


@pytest.fixture(scope="module")
def aot_rows() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.test_convs2s_kernel", "aot"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"AOT compile failed:\n{proc.stderr[-4000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    print("\nconvs2s_step AOT (ptxas-blackwell -v): kernel dtype arch variant blocks warps registers spills smem")
    for r in rows:
        if r["C"] in (512, 509):
            print(f"{r['kernel']:24} {r['dtype']:5} sm_{r['arch']} {r['variant']:8} {r['blocks']} {r['num_warps']} "
                  f"{r.get('registers')} {r.get('spill_stores')}/{r.get('spill_loads')} {r['shared']}")
    return rows


def test_aot_compiles_every_spec_for_sm80_sm90(aot_rows):
    errors = [r for r in aot_rows if "ptxas_error" in r]
    assert not errors, f"ptxas failed: {errors[0]['ptxas_error']}"
    got = {(r["kernel"], r["C"], r["dtype"], r["arch"]) for r in aot_rows}
    aligned = [s.name for s in step_ops.KERNELS if not s.name.startswith("convs2s_step_generic")]
    want = {(name, C, d, a) for name in aligned for C in AOT_WIDTHS for d in ("fp16", "bf16") for a in AOT_ARCHS}
    want |= {(s.name, 509, d, a) for s in step_ops.KERNELS if s.name not in aligned for d in ("fp16", "bf16")
             for a in AOT_ARCHS}
    assert len(aligned) == 4 and want <= got, f"missing AOT configs: {sorted(want - got)}"


def test_aot_no_register_spills(aot_rows):
    assert aot_rows and all(r.get("registers", -1) > 0 for r in aot_rows), "could not read register counts"
    spilling = [r for r in aot_rows if r["spill_stores"] or r["spill_loads"]]
    assert not spilling, "register spills: " + "; ".join(
        f"{r['kernel']} C={r['C']} {r['dtype']} sm_{r['arch']} {r['variant']}: {r['spill_stores']}/{r['spill_loads']} B"
        for r in spilling)


def trace_main() -> int:
    """Subprocess body: trace the op as torch.compile's AOT stage does on fake CUDA tensors, print the Triton
    kernels in the captured graph (a CPU-only torch stops after capturing it, which is all this needs)."""
    os.environ.pop("TRITON_INTERPRET", None)
    from functorch.compile import aot_function
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    found = []

    def compiler(gm, _):
        found.extend(kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__ for n in gm.graph.nodes
                     if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target))
        return gm

    with FakeTensorMode():
        window = torch.empty(5, 3, 512, device="cuda", dtype=torch.float16)
        weight = torch.empty(1024, 3 * 512, device="cuda", dtype=torch.float16)
        bias = torch.empty(1024, device="cuda", dtype=torch.float16)
        residual = torch.empty(5, 1, 512, device="cuda", dtype=torch.float16)
        try:
            aot_function(torch.ops.seqmix.convs2s_step_forward, fw_compiler=compiler)(window, weight, bias, residual)
        except RuntimeError as e:
            if "not linked with support for cuda" not in str(e):
                raise
    print(json.dumps(found))
    return 0


def test_gpu_op_decomposes_into_the_triton_kernel():
    """Off the interpreter the op is a `triton_op`, so Inductor sees the kernel (and its launch code may not
    read data pointers, which fake tensors lack)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.test_convs2s_kernel", "trace"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["convs2s_step_kernel"]


if __name__ == "__main__" and sys.argv[1:] == ["aot"]:
    sys.exit(aot_main())
if __name__ == "__main__" and sys.argv[1:] == ["trace"]:
    sys.exit(trace_main())
