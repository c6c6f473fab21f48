"""DynamicConv Triton kernels (fairseq layout x: (B, T, C), weight: (B, T, H, K), h = c // D, D = C // H).

A program owns one (batch row, time block, head, block of that head's channels), so the per-position
filter w[b, t, h, :] is one [BLOCK_T] vector per tap, broadcast over the channels. Programs are on a
1-D grid ordered with the channel blocks of a head adjacent (they reuse the same filter rows in
cache). K is a constexpr trip count of a runtime loop; everything is accumulated in fp32.
"""

import triton
import triton.language as tl


@triton.jit
def _program_coords(pid, T, H, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Split a flat program id into (b, time offsets, h, in-head channel offsets)."""
    n_dc = tl.cdiv(D, BLOCK_D)
    n_tb = tl.cdiv(T, BLOCK_T)
    dc = pid % n_dc
    rest = pid // n_dc
    h = rest % H
    rest = rest // H
    b = rest // n_tb
    t = (rest % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    cd = dc * BLOCK_D + tl.arange(0, BLOCK_D)
    return b, t, h, cd


@triton.jit
def dynamicconv_fwd_kernel(
    x_ptr, w_ptr, y_ptr,
    T, C, H, D, padding_l,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """y[b, t, c] = sum_k w[b, t, h, k] * x[b, t + k - padding_l, c]."""
    b, t, h, cd = _program_coords(tl.program_id(0), T, H, D, BLOCK_T, BLOCK_D)
    t_ok = t < T
    c_ok = cd < D
    c = h * D + cd
    row = b.to(tl.int64) * T * C
    x_row = x_ptr + row
    w_pos = w_ptr + b.to(tl.int64) * T * H * K + (t * H + h) * K
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for k in range(K):
        wk = tl.load(w_pos + k, mask=t_ok, other=0.0).to(tl.float32)
        ts = t + (k - padding_l)
        m = ((ts >= 0) & (ts < T))[:, None] & c_ok[None, :]
        xv = tl.load(x_row + ts[:, None] * C + c[None, :], mask=m, other=0.0).to(tl.float32)
        acc += xv * wk[:, None]
    out_m = t_ok[:, None] & c_ok[None, :]
    tl.store(y_ptr + row + t[:, None] * C + c[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_m)


@triton.jit
def dynamicconv_bwd_input_kernel(
    dy_ptr, w_ptr, dx_ptr,
    T, C, H, D, padding_l,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dx[b, s, c] = sum_k w[b, s - k + padding_l, h, k] * dy[b, s - k + padding_l, c] (gather form)."""
    b, s, h, cd = _program_coords(tl.program_id(0), T, H, D, BLOCK_T, BLOCK_D)
    c_ok = cd < D
    c = h * D + cd
    row = b.to(tl.int64) * T * C
    dy_row = dy_ptr + row
    w_row = w_ptr + b.to(tl.int64) * T * H * K
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for k in range(K):
        t = s - k + padding_l
        t_ok = (t >= 0) & (t < T)
        wk = tl.load(w_row + (t * H + h) * K + k, mask=t_ok, other=0.0).to(tl.float32)
        m = t_ok[:, None] & c_ok[None, :]
        g = tl.load(dy_row + t[:, None] * C + c[None, :], mask=m, other=0.0).to(tl.float32)
        acc += g * wk[:, None]
    out_m = (s < T)[:, None] & c_ok[None, :]
    tl.store(dx_ptr + row + s[:, None] * C + c[None, :], acc.to(dx_ptr.dtype.element_ty), mask=out_m)


@triton.jit
def dynamicconv_bwd_weight_kernel(
    dy_ptr, x_ptr, dw_ptr,
    T, C, H, D, padding_l,
    K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dw[b, t, h, k] = sum_{c in head h} dy[b, t, c] * x[b, t + k - padding_l, c].

    One program per (b, time block, head) loops over all of the head's channel blocks, so each output
    is written once by one program (deterministic, no atomics).
    """
    pid = tl.program_id(0)
    n_tb = tl.cdiv(T, BLOCK_T)
    h = pid % H
    rest = pid // H
    b = rest // n_tb
    t = (rest % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    row = b.to(tl.int64) * T * C
    dy_row = dy_ptr + row
    x_row = x_ptr + row
    dw_pos = dw_ptr + b.to(tl.int64) * T * H * K + (t * H + h) * K
    for k in range(K):
        ts = t + (k - padding_l)
        s_ok = (ts >= 0) & (ts < T)
        acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            cd = d0 + tl.arange(0, BLOCK_D)
            c_ok = cd < D
            c = h * D + cd
            g = tl.load(dy_row + t[:, None] * C + c[None, :], mask=t_ok[:, None] & c_ok[None, :],
                        other=0.0).to(tl.float32)
            xv = tl.load(x_row + ts[:, None] * C + c[None, :], mask=s_ok[:, None] & c_ok[None, :],
                         other=0.0).to(tl.float32)
            acc += g * xv
        tl.store(dw_pos + k, tl.sum(acc, axis=1).to(dw_ptr.dtype.element_ty), mask=t_ok)
