"""TaLK Triton kernels (x: (B, T, C), offsets: (B, T, H), head h = c // D, D = C // H).

Forward in two passes: a blocked scan writes the fp32 summed-area table S[b, s, c] = Σ_{j<s} x[b, j, c] / K
(S has T + 1 rows), then each output reads S at its window's two boundaries, interpolating linearly at
fractional positions (Lioutas & Guo 2020, Eq. 4–6). The backward passes never scatter (no atomics, so
they are deterministic): the input gradient gathers, for each position j, the dy of every window that
can cover j (at most ``reach_l + reach_r + 1`` of them) weighted by the overlap of [j, j+1) with the
window; the offset gradient is x at the boundary bin (S(ceil) − S(floor)) dotted with dy over the
head's channels. All window arithmetic is fp32; inputs are upcast at load, outputs downcast at store.
"""

import triton
import triton.language as tl


@triton.jit
def _window(t, left_ptr, right_ptr, off, mask, T, l_max, r_max, max_offset, CAUSAL: tl.constexpr):
    """Window [start, end) of the outputs at times t (fp32), offsets clamped to [0, max_offset]."""
    tf = t.to(tl.float32)
    sl = tl.load(left_ptr + off, mask=mask, other=0.0).to(tl.float32)
    sl = tl.minimum(tl.maximum(sl, 0.0), max_offset)
    start = tl.minimum(tl.maximum(tf - sl * l_max, 0.0), (T - 1).to(tl.float32))
    if CAUSAL:
        end = tf + 1.0
    else:
        sr = tl.load(right_ptr + off, mask=mask, other=0.0).to(tl.float32)
        sr = tl.minimum(tl.maximum(sr, 0.0), max_offset)
        end = tl.minimum(tl.maximum(tf + sr * r_max, 0.0), (T - 1).to(tl.float32)) + 1.0
    return start, end, sl


@triton.jit
def _head_tile(T, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's tile: batch row b, times t, head h and its channels d (axis 1 = heads x channel blocks)."""
    n_tb = tl.cdiv(T, BLOCK_T)
    n_db = tl.cdiv(D, BLOCK_D)
    pid_bt = tl.program_id(0)
    pid_hd = tl.program_id(1)
    t = (pid_bt % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = (pid_hd % n_db) * BLOCK_D + tl.arange(0, BLOCK_D)
    return pid_bt // n_tb, t, pid_hd // n_db, d


@triton.jit
def _read_prefix(s_row, u, c, C, mask):
    """S at fractional rows u (BLOCK_T,) for channels c (BLOCK_D,), linearly interpolated."""
    lo = tl.floor(u)
    hi = tl.ceil(u)
    frac = u - lo
    p_lo = tl.load(s_row + lo.to(tl.int32)[:, None] * C + c[None, :], mask=mask, other=0.0)
    p_hi = tl.load(s_row + hi.to(tl.int32)[:, None] * C + c[None, :], mask=mask, other=0.0)
    return p_lo + frac[:, None] * (p_hi - p_lo)


@triton.jit
def talk_prefix_kernel(
    x_ptr, s_ptr,
    T, C, inv_norm,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """S[b, 0, c] = 0, S[b, t + 1, c] = S[b, t, c] + x[b, t, c] / K: one program scans one (row, channel block)."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    x_row = x_ptr + b.to(tl.int64) * T * C
    s_row = s_ptr + b.to(tl.int64) * (T + 1) * C
    carry = tl.zeros([BLOCK_C], dtype=tl.float32)
    tl.store(s_row + c, carry, mask=c_ok)
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        m = (t < T)[:, None] & c_ok[None, :]
        xv = tl.load(x_row + t[:, None] * C + c[None, :], mask=m, other=0.0).to(tl.float32) * inv_norm
        tl.store(s_row + (t + 1)[:, None] * C + c[None, :], tl.cumsum(xv, axis=0) + carry[None, :], mask=m)
        carry += tl.sum(xv, axis=0)


@triton.jit
def talk_fwd_kernel(
    s_ptr, left_ptr, right_ptr, y_ptr,
    T, C, H, D, l_max, r_max, max_offset,
    CAUSAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """y[b, t, c] = S(end) − S(start) for the window of (b, t, head of c). Tile: time block x part of one head."""
    b, t, h, d = _head_tile(T, D, BLOCK_T, BLOCK_D)
    t_ok = t < T
    c = h * D + d
    m = t_ok[:, None] & (d < D)[None, :]
    off_row = b.to(tl.int64) * T * H
    start, end, _ = _window(t, left_ptr + off_row, right_ptr + off_row, t * H + h, t_ok,
                            T, l_max, r_max, max_offset, CAUSAL)
    s_row = s_ptr + b.to(tl.int64) * (T + 1) * C
    y = _read_prefix(s_row, end, c, C, m) - _read_prefix(s_row, start, c, C, m)
    tl.store(y_ptr + b.to(tl.int64) * T * C + t[:, None] * C + c[None, :], y.to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def talk_bwd_input_kernel(
    dy_ptr, left_ptr, right_ptr, dx_ptr,
    T, C, H, D, l_max, r_max, max_offset, inv_norm, reach_l, reach_r,
    CAUSAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dx[b, j, c] = (1/K) Σ_i dy[b, i, c] · |[j, j+1) ∩ [start_i, end_i)| over i ∈ [j − reach_r, j + reach_l]."""
    b, j, h, d = _head_tile(T, D, BLOCK_T, BLOCK_D)
    j_ok = j < T
    d_ok = d < D
    c = h * D + d
    jf = j.to(tl.float32)
    off_row = b.to(tl.int64) * T * H
    dy_row = dy_ptr + b.to(tl.int64) * T * C
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for r in range(0, reach_l + reach_r + 1):
        i = j - reach_r + r
        i_ok = j_ok & (i >= 0) & (i < T)
        start, end, _ = _window(i, left_ptr + off_row, right_ptr + off_row, i * H + h, i_ok,
                                T, l_max, r_max, max_offset, CAUSAL)
        cover = tl.maximum(tl.minimum(jf + 1.0, end) - tl.maximum(jf, start), 0.0)
        cover = tl.where(i_ok, cover, 0.0)
        g = tl.load(dy_row + i[:, None] * C + c[None, :], mask=i_ok[:, None] & d_ok[None, :], other=0.0)
        acc += g.to(tl.float32) * cover[:, None]
    m = j_ok[:, None] & d_ok[None, :]
    tl.store(dx_ptr + b.to(tl.int64) * T * C + j[:, None] * C + c[None, :],
             (acc * inv_norm).to(dx_ptr.dtype.element_ty), mask=m)


@triton.jit
def talk_bwd_offsets_kernel(
    dy_ptr, x_ptr, left_ptr, right_ptr, dleft_ptr, dright_ptr,
    T, C, H, D, l_max, r_max, max_offset, inv_norm,
    CAUSAL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dleft[b, t, h] = l_max/K · Σ_{c∈h} dy[b,t,c] · x[b, ⌊start⌋, c] where start is fractional and the offset
    inside (0, max_offset); likewise dright with r_max and x[⌊end⌋]. 0 at integer or clamped boundaries."""
    pid_bt = tl.program_id(0)
    h = tl.program_id(1)
    n_tb = tl.cdiv(T, BLOCK_T)
    b = pid_bt // n_tb
    t = (pid_bt % n_tb) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    off_row = b.to(tl.int64) * T * H
    start, end, sl = _window(t, left_ptr + off_row, right_ptr + off_row, t * H + h, t_ok,
                             T, l_max, r_max, max_offset, CAUSAL)
    lo_s = tl.floor(start)
    live_s = t_ok & (start > lo_s) & (sl > 0.0) & (sl < max_offset)
    lo_e = tl.floor(end)
    live_e = t_ok
    if not CAUSAL:
        sr = tl.load(right_ptr + off_row + t * H + h, mask=t_ok, other=0.0).to(tl.float32)
        live_e = t_ok & (end > lo_e) & (sr > 0.0) & (sr < max_offset)
    row = b.to(tl.int64) * T * C
    acc_l = tl.zeros([BLOCK_T], dtype=tl.float32)
    acc_r = tl.zeros([BLOCK_T], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        c = h * D + d
        d_ok = (d < D)[None, :]
        g = tl.load(dy_ptr + row + t[:, None] * C + c[None, :], mask=t_ok[:, None] & d_ok, other=0.0).to(tl.float32)
        xs = tl.load(x_ptr + row + lo_s.to(tl.int32)[:, None] * C + c[None, :], mask=live_s[:, None] & d_ok,
                     other=0.0).to(tl.float32)
        acc_l += tl.sum(g * xs, axis=1)
        if not CAUSAL:
            xe = tl.load(x_ptr + row + lo_e.to(tl.int32)[:, None] * C + c[None, :], mask=live_e[:, None] & d_ok,
                         other=0.0).to(tl.float32)
            acc_r += tl.sum(g * xe, axis=1)
    out = off_row + t * H + h
    tl.store(dleft_ptr + out, acc_l * (l_max * inv_norm), mask=t_ok)
    if not CAUSAL:
        tl.store(dright_ptr + out, acc_r * (r_max * inv_norm), mask=t_ok)
