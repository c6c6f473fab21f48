"""Ahead-of-time compile every Triton kernel for sm_80 / sm_90 and report registers and spills.

Run as a subprocess by test_aot_compile.py (or by hand: `python -m tests.kernels.aot_worker`). It
must run without TRITON_INTERPRET: under the interpreter @triton.jit yields InterpretedFunction, which
triton.compile cannot take. Prints one JSON object per compiled (kernel, K, dtype, arch, variant).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

# Importable for its constants without side effects: triton / triton_kernels are imported in main(),
# after TRITON_INTERPRET is removed (the kernels' mode is fixed when triton_kernels is first imported).
KERNEL_NAMES = ("lightconv_fwd", "lightconv_bwd_weight", "dynamicconv_fwd", "dynamicconv_bwd_input",
                "dynamicconv_bwd_weight", "talk_prefix", "talk_fwd_enc", "talk_fwd_dec", "talk_bwd_input_enc",
                "talk_bwd_input_dec", "talk_bwd_offsets_enc", "talk_bwd_offsets_dec", "fused_xent_fwd",
                "fused_xent_bwd_features", "fused_xent_bwd_weight")
KS = (3, 7, 15, 31, 63)
DTYPES = ("fp16", "bf16")
WIDTHS = ((512, 4), (512, 8), (512, 16), (1024, 4), (1024, 8), (1024, 16))  # (C, H) of the presets
ARCHS = (80, 90)
VARIANTS = ("aligned", "generic")
# Beyond the preset grid: fp32 inputs, and the largest K the ops accept (MAX_K = 128).
EXTRA = (("fp32", 31), ("fp16", 127))
# Same flags Triton passes when it builds the cubin (see triton/backends/nvidia/compiler.py).
PTXAS_FLAGS = ["-v", "--regAllocOptLevel=2"]


def divisibility_attrs(fn, sig: dict[str, str], C: int, H: int, aligned: bool) -> dict:
    """What Triton's launcher would specialize: 16-byte-aligned pointers, ints divisible by 16.

    `aligned`: the usual case (torch allocations, C and C/H multiples of 16; T is left generic).
    Otherwise nothing is assumed (the worst case: no vector loads).
    """
    if not aligned:
        return {}
    known = {"C": C, "D": C // H}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        ty = sig.get(name)
        if ty is None or ty == "constexpr":
            continue
        if ty.startswith("*") or (name in known and known[name] % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def ptxas_report(ptx: str, arch: int) -> dict:
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas-blackwell")
    gpu = "sm_90a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run(
            [ptxas, *PTXAS_FLAGS, "--gpu-name", gpu, src, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True,
        )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return {"ptxas_error": log[-2000:]}

    def grab(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else -1

    return {
        "registers": grab(r"Used (\d+) registers"),
        "spill_stores": grab(r"(\d+) bytes spill stores"),
        "spill_loads": grab(r"(\d+) bytes spill loads"),
        "stack": grab(r"(\d+) bytes stack frame"),
    }


def all_kernels() -> list:
    from triton_kernels.dynamicconv import KERNELS as DYNAMICCONV_KERNELS
    from triton_kernels.fused_xent import KERNELS as FUSED_XENT_KERNELS
    from triton_kernels.lightconv import KERNELS as LIGHTCONV_KERNELS
    from triton_kernels.talk import KERNELS as TALK_KERNELS

    return LIGHTCONV_KERNELS + DYNAMICCONV_KERNELS + TALK_KERNELS + FUSED_XENT_KERNELS


def jobs(generic_k: int = 31):
    """Unique compile jobs; block sizes come from the ops' own choice for each preset width (C, H).

    "aligned" is compiled at every (dtype, K); "generic" (no divisibility) at K = generic_k only.
    Kernels whose window size is a runtime argument (``k_constexpr=False``) compile once, at K = generic_k.
    """
    import torch

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    seen = set()
    grid = [(d, K) for d in DTYPES for K in KS] + list(EXTRA)
    for spec in all_kernels():
        for (dname, K), (C, H), variant, arch in itertools.product(grid, WIDTHS, VARIANTS, ARCHS):
            if (variant == "generic" or not spec.k_constexpr) and K != generic_k:
                continue
            sig, consts, warps = spec.build(K, dtypes[dname], C, H)
            attrs = divisibility_attrs(spec.fn, sig, C, H, variant == "aligned")
            key = (spec.name, dname, K, arch, variant, json.dumps(consts, sort_keys=True), warps, str(attrs))
            if key not in seen:
                seen.add(key)
                yield spec, K, dname, arch, variant, sig, consts, warps, attrs


def compile_one(job) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    spec, K, dname, arch, variant, sig, consts, warps, attrs = job
    src = triton.compiler.ASTSource(fn=spec.fn, signature=sig, constexprs=consts, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    row = {
        "kernel": spec.name, "K": K, "dtype": dname, "arch": arch, "variant": variant,
        "blocks": {k: v for k, v in consts.items() if k != "K"}, "num_warps": ck.metadata.num_warps,
        "shared": ck.metadata.shared,
    }
    row.update(ptxas_report(ck.asm["ptx"], arch))
    return row


def trace_gpu_ops() -> dict[str, list[str]]:
    """Trace each registered op the way torch.compile's AOT stage does, on fake CUDA tensors.

    Shows that off the interpreter the ops are `triton_op`s that decompose into the Triton kernels
    (what Inductor needs). Running the traced graph needs a CUDA build of torch; here it stops after
    the graph is captured ("not linked with support for cuda"), which is all this checks.
    """
    import torch
    from functorch.compile import aot_function
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    all_kernels()  # registers the ops
    ops = torch.ops.seqmix
    found: dict[str, list[str]] = {}

    def capture(name):
        def compiler(gm, _):
            found[name] = [
                kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
                for n in gm.graph.nodes
                if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target)
            ]
            return gm

        return compiler

    cases = {
        "lightconv_forward": (lambda x, w: ops.lightconv_forward(x, w, 15), (8, 31)),
        "dynamicconv_forward": (lambda x, w: ops.dynamicconv_forward(x, w, 15), (2, 17, 8, 31)),
        "dynamicconv_backward": (lambda x, w: ops.dynamicconv_backward(x, x, w, 15), (2, 17, 8, 31)),
        "talk_forward": (lambda x, s: ops.talk_forward(x, s, s, 15, 15, 1.0), (2, 17, 8)),
        "talk_backward": (lambda x, s: ops.talk_backward(x, x, s, None, 15, 0, 1.0), (2, 17, 8)),
    }
    for name, (fn, wshape) in cases.items():
        with FakeTensorMode():
            x = torch.empty(2, 17, 512, device="cuda", dtype=torch.float16)
            w = torch.empty(*wshape, device="cuda", dtype=torch.float16)
            try:
                aot_function(fn, fw_compiler=capture(name))(x, w)
            except RuntimeError as e:
                if "not linked with support for cuda" not in str(e):
                    raise
    return found


def main(argv: list[str]) -> int:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if argv[:1] == ["trace"]:
        print(json.dumps(trace_gpu_ops()))
        return 0
    work = list(jobs())
    # Sequential by default (compiles are GIL-bound; threads bought little here). AOT_WORKERS=n to try.
    with ThreadPoolExecutor(max_workers=int(os.environ.get("AOT_WORKERS", "1"))) as pool:
        for row in pool.map(compile_one, work):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
