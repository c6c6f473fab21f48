"""LightConv Triton kernels (fairseq layout x: (B, T, C), weight: (H, K), head h = c // (C // H)).

Tiles are (time block x channel block) of one batch row; the K taps are a runtime loop with K a
constexpr trip count, so registers do not grow with K. All arithmetic is fp32; inputs are upcast at
load (also what the interpreter needs for bf16) and results downcast at the store.
The backward-input pass reuses `lightconv_fwd_kernel` with the taps reversed (see ops.py).
"""

import triton
import triton.language as tl


@triton.jit
def lightconv_fwd_kernel(
    x_ptr, w_ptr, y_ptr,
    T, C, D, padding_l,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """y[b, t, c] = sum_k w[c // D, k] * x[b, t + k - padding_l, c] (zero outside [0, T))."""
    pid_bt = tl.program_id(0)
    pid_c = tl.program_id(1)
    n_tb = tl.cdiv(T, BLOCK_T)
    b = pid_bt // n_tb
    t = (pid_bt % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    w_row = (c // D) * K
    row = b.to(tl.int64) * T * C
    x_row = x_ptr + row
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in range(K):
        wk = tl.load(w_ptr + w_row + k, mask=c_ok, other=0.0).to(tl.float32)
        ts = t + (k - padding_l)
        m = ((ts >= 0) & (ts < T))[:, None] & c_ok[None, :]
        xv = tl.load(x_row + ts[:, None] * C + c[None, :], mask=m, other=0.0).to(tl.float32)
        acc += xv * wk[None, :]
    out_m = (t < T)[:, None] & c_ok[None, :]
    tl.store(y_ptr + row + t[:, None] * C + c[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_m)


@triton.jit
def lightconv_bwd_weight_kernel(
    dy_ptr, x_ptr, part_ptr,
    T, C, padding_l, steps,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """part[chunk, k, c] = sum over the chunk's times of dy[b, t, c] * x[b, t + k - padding_l, c].

    A chunk is `steps` time blocks of one batch row. The host sums `part` over chunks and over the
    head's channels, so the weight gradient is deterministic (no atomics).
    """
    pid_bt = tl.program_id(0)
    pid_c = tl.program_id(1)
    n_chunks = tl.cdiv(T, BLOCK_T * steps)
    b = pid_bt // n_chunks
    t0 = (pid_bt % n_chunks) * (BLOCK_T * steps)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    row = b.to(tl.int64) * T * C
    dy_row = dy_ptr + row
    x_row = x_ptr + row
    part_row = part_ptr + pid_bt.to(tl.int64) * K * C
    for k in range(K):
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for i in range(steps):
            t = t0 + i * BLOCK_T + tl.arange(0, BLOCK_T)
            m_t = (t < T)[:, None] & c_ok[None, :]
            g = tl.load(dy_row + t[:, None] * C + c[None, :], mask=m_t, other=0.0).to(tl.float32)
            ts = t + (k - padding_l)
            m_s = ((ts >= 0) & (ts < T))[:, None] & c_ok[None, :]
            xv = tl.load(x_row + ts[:, None] * C + c[None, :], mask=m_s, other=0.0).to(tl.float32)
            acc += g * xv
        tl.store(part_row + k * C + c, tl.sum(acc, axis=0), mask=c_ok)
